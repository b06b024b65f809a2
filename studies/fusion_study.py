"""Choose the fusion honestly (issue 12 items 2 and 4): rotation over the development collections.

    python -m studies.fusion_study [--data ../shared/data] [--cache-dir out/cache] [--out studies]

For every development collection (scifact, cranfield, medline and each LoCoMo conversation) it
ingests the store (or reuses ``engram-memory eval``'s cache), reads every judged query's lexical
and semantic hit lists exactly as ``search()`` gets them (depth ``CHANNEL_DEPTH``, from the
store's own projections and model), and scores fusion candidates on them offline with
retrieval/fusion.py's functions. No candidate looks at a relevance label at run time.

Rotation: the collections form four groups (scifact, cranfield, medline, LoCoMo). For each group
held out, the candidate is chosen on the other three -- among those that beat both channels on
*every* training collection, the best mean over the training groups (LoCoMo counts as the mean of
its conversations); if none does, the best worst-case margin -- and then scored on the held-out
group. The in-sample choice uses all four. Output: ``OUT/fusion-study.md`` and ``.json``.

It also measures the semantic floor (item 4): for records only the semantic channel found, how
many judged-relevant hits in the hybrid top 10 a cosine floor would drop, and how many unjudged
ones, and what the fused nDCG@10 becomes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

from engram_memory.eval import metrics  # noqa: E402
from engram_memory.eval.beir import Collection, collection_folders, load_collection, truncate_utf8  # noqa: E402

Ranked = list[tuple[str, float]]
Lists = dict[str, dict[str, Ranked]]  # qid -> channel -> ranked doc ids
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
METRICS = ("ndcg@10", "recall@10", "recall@100")
TIE = 0.001  # mean nDCG@10 differences below this are noise (RESULTS.md §2: ingests differ by up to 0.005)
FLOORS = (0.0, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4)
# Queries that ask for nothing any development collection holds: with the right floor each is
# answered [] wherever no record shares a word with it.
PROBES = ("?!*:()", "!!!", "the of and", "aaaaaaaaaa", "asdf qwerty zxcv", "lorem ipsum dolor sit amet",
          "xyzzy plugh", "zebra xylophone quantum", "purple monkey dishwasher", "12345 67890",
          "kubernetes helm chart rollback", "what is the capital of france")
PROBE_PREFIX = "probe:"


def group_of(name: str) -> str:
    return "locomo" if name.startswith("locomo") else name


def dev_folders(data: Path) -> list[Path]:
    """The collections under ``data``, one level of folders of collections (locomo/) included."""
    out: list[Path] = []
    for folder in sorted(p for p in data.iterdir() if p.is_dir() and not p.name.startswith(".")):
        out.extend([folder] if (folder / "corpus.jsonl").exists() else collection_folders(folder))
    return out


def channel_lists(folder: Path, cache: Path, work: Path) -> tuple[Collection, Lists]:
    """The judged queries' channel lists as ``search()`` gets them; cached in ``work``."""
    col = load_collection(folder)
    saved = work / f"{col.name}-{col.fingerprint[:16]}-v2.json.gz"
    if saved.exists():
        return col, json.loads(gzip.decompress(saved.read_bytes()))
    from engram_memory.eval.ingest import host_context, load_or_ingest, open_engine
    from engram_memory.models.limits import CHANNEL_DEPTH

    ing = load_or_ingest(col, cache)
    r2d = ing.record_to_doc
    lists: Lists = {}
    with open_engine(ing.store_dir, "hybrid") as engine:
        scope = host_context(col.name).scope_ref
        lexical, vectors = engine.projections.lexical(scope), engine.projections.vectors(scope)
        queries = {**col.queries, **{f"{PROBE_PREFIX}{p}": p for p in PROBES}}
        for qid, text in queries.items():
            q = truncate_utf8(text)
            lists[qid] = {
                "lexical": [(r2d[r], s) for r, s in lexical.search(q, CHANNEL_DEPTH)],
                "semantic": [(r2d[r], s) for r, s in vectors.search(engine.embedder.encode([q])[0], CHANNEL_DEPTH)],
            }
    work.mkdir(parents=True, exist_ok=True)
    saved.write_bytes(gzip.compress(json.dumps(lists).encode()))
    return col, lists


def candidates() -> dict[str, Callable[[Mapping[str, Ranked]], Ranked]]:
    from engram_memory.retrieval import fusion

    out: dict[str, Callable[[Mapping[str, Ranked]], Ranked]] = {}
    for k in (10, 60):
        out[f"rrf k={k}"] = lambda ch, k=k: fusion.rrf(ch, k=k, checked=False)
    for wl in (0.5, 0.6):
        w = {"lexical": wl, "semantic": round(1 - wl, 2)}
        out[f"dbsf {wl:.1f}/{1 - wl:.1f}"] = lambda ch, w=w: fusion.dbsf(ch, w, checked=False)
    for wl in (0.3, 0.4, 0.5, 0.6, 0.7):
        w = {"lexical": wl, "semantic": round(1 - wl, 2)}
        out[f"convex {wl:.1f}/{1 - wl:.1f}"] = lambda ch, w=w: fusion.convex(ch, w, checked=False)
    out["max-norm 0.5/0.5"] = max_norm
    out["dbsf, query-adaptive weights"] = adaptive_dbsf
    return out


def max_norm(ch: Mapping[str, Ranked]) -> Ranked:
    """Study-only: each channel's score over its top score (cosine keeps its zero), equal weights."""
    fused: dict[str, float] = {}
    for name in sorted(ch):
        top = ch[name][0][1]
        for rid, s in ch[name]:
            fused[rid] = fused.get(rid, 0.0) + 0.5 * (s / top if top > 0 else 0.0)
    return sorted(fused.items(), key=lambda x: (-x[1], x[0]))


def adaptive_dbsf(ch: Mapping[str, Ranked]) -> Ranked:
    """Study-only: DBSF whose per-query channel weights follow how far each channel's top hit stands
    above its own distribution (z of the top score over the top 100): a peaked channel counts more."""
    from engram_memory.retrieval import fusion

    weights = {}
    for name, hits in ch.items():
        head = np.array([s for _, s in hits[:100]])
        sd = float(head.std(ddof=1)) if len(head) > 1 else 0.0
        weights[name] = (hits[0][1] - float(head.mean())) / sd if sd > 0 else 1.0
    total = sum(weights.values()) or 1.0
    return fusion.dbsf(ch, {k: max(v, 0.0) / total for k, v in weights.items()}, checked=False)


def fuse(fn: Callable[[Mapping[str, Ranked]], Ranked], ch: Mapping[str, Ranked]) -> Ranked:
    live = {k: v for k, v in ch.items() if v}
    if len(live) == 1:
        return list(next(iter(live.values())))
    return fn(live) if live else []


def score_all(cols: dict[str, tuple[Collection, Lists]]) -> dict[str, dict[str, dict[str, float]]]:
    """``{run: {collection: {metric: value}}}`` for both channels and every candidate."""
    runs: dict[str, Callable[[Mapping[str, Ranked]], Ranked]] = {
        "lexical": lambda ch: list(ch["lexical"]), "semantic": lambda ch: list(ch["semantic"]),
        **{name: (lambda ch, f=f: fuse(f, ch)) for name, f in candidates().items()},
    }
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, fn in runs.items():
        for cname, (col, lists) in cols.items():
            run = {q: fn(ch)[:100] for q, ch in lists.items() if not q.startswith(PROBE_PREFIX)}
            out.setdefault(name, {})[cname] = metrics.score(run, col.qrels, METRICS)
    return out


def _group_means(row: Mapping[str, Mapping[str, float]], names: list[str], metric: str = "ndcg@10") -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for n in names:
        groups.setdefault(group_of(n), []).append(row[n][metric])
    return {g: float(np.mean(v)) for g, v in groups.items()}


def choose(scores: Mapping[str, Mapping[str, Mapping[str, float]]], names: list[str]) -> dict[str, Any]:
    """The candidate chosen on ``names``: robust (above both channels on every one of them), then
    the best mean over groups -- except that means within ``TIE`` of the best are a tie (the
    candidates differ by less than the noise between two ingests), broken by the larger
    worst-case margin over the better channel. With no robust candidate: the best worst case."""
    rows = []
    for cand, row in scores.items():
        if cand in ("lexical", "semantic"):
            continue
        worst = min(row[n]["ndcg@10"] - max(scores["lexical"][n]["ndcg@10"], scores["semantic"][n]["ndcg@10"])
                    for n in names)
        rows.append({"candidate": cand, "robust": worst > 0, "worst_margin": worst,
                     "train_mean": float(np.mean(list(_group_means(row, names).values())))})
    robust = [r for r in rows if r["robust"]]
    if not robust:
        return max(rows, key=lambda r: (r["worst_margin"], r["candidate"]))
    best = max(r["train_mean"] for r in robust)
    return max((r for r in robust if r["train_mean"] >= best - TIE), key=lambda r: (r["worst_margin"], r["candidate"]))


def rotation(scores: Mapping[str, Mapping[str, Mapping[str, float]]], names: list[str]) -> list[dict[str, Any]]:
    folds = []
    for held in sorted({group_of(n) for n in names}):
        train = [n for n in names if group_of(n) != held]
        test = [n for n in names if group_of(n) == held]
        pick = choose(scores, train)
        row = scores[pick["candidate"]]
        test_mean = float(np.mean([row[n]["ndcg@10"] for n in test]))
        best = {ch: float(np.mean([scores[ch][n]["ndcg@10"] for n in test])) for ch in ("lexical", "semantic")}
        wins = all(row[n]["ndcg@10"] > max(scores["lexical"][n]["ndcg@10"], scores["semantic"][n]["ndcg@10"])
                   for n in test)
        folds.append({"held_out": held, **pick, "test_ndcg@10": test_mean, "test_lexical": best["lexical"],
                      "test_semantic": best["semantic"], "beats_both_on_every_test_collection": wins})
    return folds


def floor_study(cols: dict[str, tuple[Collection, Lists]], fusion_fn: Callable[[Mapping[str, Ranked]], Ranked],
                ) -> dict[str, Any]:
    """Per floor, over every collection: semantic-only hits it drops from the fused top 100
    (judged relevant, judged non-relevant, unjudged), the scores after it, and how many probe
    queries it answers with an empty list."""
    out: dict[str, Any] = {}
    for floor in FLOORS:
        per: dict[str, Any] = {}
        for cname, (col, lists) in cols.items():
            counts = dict.fromkeys(("relevant_kept", "relevant_dropped", "judged_irrelevant_dropped",
                                    "unjudged_dropped", "probes_empty"), 0)
            run = {}
            for q, ch in lists.items():
                lex = {d for d, _ in ch["lexical"]}
                cos = dict(ch["semantic"])
                fused = fuse(fusion_fn, ch)
                shown = [(d, s) for d, s in fused if d in lex or cos.get(d, 1.0) >= floor]
                if q.startswith(PROBE_PREFIX):
                    counts["probes_empty"] += not shown
                    continue
                run[q] = shown[:100]
                judged = col.qrels.get(q, {})
                for d, _s in fused[:100]:
                    if d in lex:
                        continue
                    rel = judged.get(d, 0) > 0
                    if cos[d] >= floor:
                        counts["relevant_kept"] += rel
                    else:
                        kind = "judged_irrelevant" if d in judged else "unjudged"
                        counts["relevant_dropped" if rel else f"{kind}_dropped"] += 1
            per[cname] = {**counts, **metrics.score(run, col.qrels, ("ndcg@10", "recall@100"))}
        out[f"{floor:.2f}"] = per
    return out


def markdown(names: list[str], scores: Mapping[str, Any], folds: list[dict[str, Any]], in_sample: dict[str, Any],
             floors: Mapping[str, Any]) -> str:
    lines = ["## Candidates, nDCG@10 (every collection; LoCoMo mean last)", "",
             "| run | " + " | ".join(names) + " | LoCoMo mean |", "|---|" + "---:|" * (len(names) + 1)]
    loco = [n for n in names if group_of(n) == "locomo"]
    for run, row in scores.items():
        best_ch = {n: max(scores["lexical"][n]["ndcg@10"], scores["semantic"][n]["ndcg@10"]) for n in names}
        cells = [f"{row[n]['ndcg@10']:.4f}" + ("" if run in ("lexical", "semantic") or row[n]["ndcg@10"] > best_ch[n]
                                                else " ✗") for n in names]
        lines.append(f"| {run} | {' | '.join(cells)} | {np.mean([row[n]['ndcg@10'] for n in loco]):.4f} |")
    lines += ["", "✗ = not above the better channel on that collection.", "",
              "## Rotation (choose on three groups, test on the fourth)", "",
              "| held out | chosen on the rest | robust in training | test nDCG@10 | test lexical | test semantic |"
              " beats both on every test collection |",
              "|---|---|---|---:|---:|---:|---|"]
    for f in folds:
        lines.append(f"| {f['held_out']} | {f['candidate']} | {'yes' if f['robust'] else 'no'} | "
                     f"{f['test_ndcg@10']:.4f} | {f['test_lexical']:.4f} | {f['test_semantic']:.4f} | "
                     f"{'yes' if f['beats_both_on_every_test_collection'] else 'no'} |")
    lines += ["", f"In-sample choice (all four groups): **{in_sample['candidate']}** "
              f"(robust: {'yes' if in_sample['robust'] else 'no'}, worst margin {in_sample['worst_margin']:+.4f}).", "",
              "## Semantic floor (records only the semantic channel found, fused top 100, all collections)", "",
              "| floor | relevant kept | relevant dropped | judged non-relevant dropped | unjudged dropped |"
              f" nDCG@10 (mean of groups) | Recall@100 | probes answered [] (of {len(PROBES) * len(names)}) |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for floor, per in floors.items():
        keys = ("relevant_kept", "relevant_dropped", "judged_irrelevant_dropped", "unjudged_dropped", "probes_empty")
        tot = {k: sum(p[k] for p in per.values()) for k in keys}
        nd = np.mean(list(_group_means(per, list(per)).values()))
        r100 = np.mean(list(_group_means(per, list(per), "recall@100").values()))
        lines.append(f"| {floor} | " + " | ".join(str(tot[k]) for k in keys[:4]) +
                     f" | {nd:.4f} | {r100:.4f} | {tot['probes_empty']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--cache-dir", type=Path, default=Path("out/cache"), help="eval's store cache")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cols: dict[str, tuple[Collection, Lists]] = {}
    for folder in dev_folders(args.data):
        col, lists = channel_lists(folder, args.cache_dir, args.cache_dir / "fusion-lists")
        cols[col.name] = (col, lists)
        print(f"fusion_study: {col.name} lists ready ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    names = list(cols)
    scores = score_all(cols)
    folds = rotation(scores, names)
    in_sample = choose(scores, names)
    floors = floor_study(cols, candidates()[in_sample["candidate"]])
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"scores": scores, "rotation": folds, "in_sample": in_sample, "floors": floors}
    (args.out / "fusion-study.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    text = markdown(names, scores, folds, in_sample, floors)
    (args.out / "fusion-study.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
