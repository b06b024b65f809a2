"""Diagnostic: fuse the engine's own channel lists offline, to explain a fusion result.

``python -m studies.fusion_probe --store STORE_DIR --dataset DIR`` reads, for every judged query,
the lexical and semantic hit lists exactly as ``search()`` gets them (depth ``CHANNEL_DEPTH``
from the store's projections; every record of an eval store is eligible), then scores
``retrieval.fusion`` functions on them at several depths, plus two DBSF variants that are not
in the engine (normalised scores clipped to [0, 1]; statistics over the top 100). This is *not*
the eval path -- ``eval``/``tune`` score the real search path -- it only isolates the fusion
function.

Found with it: DBSF that clips normalised scores at 1.0 (the engine's first version) fails over
1000-deep lists: mean and sigma are dominated by the tail, the head of both channels clips, so
about half of the fused top 10 ties at the maximum and is ordered by record id. The engine now
leaves the scores unclipped, as Qdrant does.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import typer  # noqa: E402

from engram_memory.eval import metrics  # noqa: E402
from engram_memory.eval.beir import load_collection, truncate_utf8  # noqa: E402
from engram_memory.eval.ingest import host_context, open_engine, set_torch_threads  # noqa: E402

Ranked = list[tuple[str, float]]


def clipped_dbsf(channels: dict[str, Ranked], stat_depth: int) -> Ranked:
    """The engine's first DBSF: mean/sigma over the top ``stat_depth`` hits, clipped to [0, 1]."""
    fused: dict[str, float] = {}
    for name in sorted(channels):
        hits = channels[name]
        if not hits:
            continue
        sc = [s for _, s in hits[:stat_depth]]
        mu = math.fsum(sc) / len(sc)
        sd = math.sqrt(math.fsum((s - mu) ** 2 for s in sc) / len(sc))
        for rid, s in hits:
            n = 0.5 if sd == 0 else min(1.0, max(0.0, (s - (mu - 3 * sd)) / (6 * sd)))
            fused[rid] = fused.get(rid, 0.0) + n
    return sorted(fused.items(), key=lambda x: (-x[1], x[0]))


def main(
    store: Annotated[Path, typer.Option("--store", help="An eval store dir (with manifest.json).")],
    dataset: Annotated[Path, typer.Option("--dataset", help="The BEIR collection it was built from.")],
    threads: Annotated[int | None, typer.Option("--threads", min=1)] = 1,
) -> None:
    from engram_memory.models.limits import CHANNEL_DEPTH
    from engram_memory.retrieval import fusion

    set_torch_threads(threads)
    manifest = json.loads((store / "manifest.json").read_text())
    col = load_collection(dataset, manifest.get("limit_docs"))
    r2d = {r: d for d, r in manifest["doc_to_record"].items()}
    with open_engine(store, "hybrid") as engine:
        scope = host_context(col.name).scope_ref
        lists = {}
        for qid, text in col.queries.items():
            q = truncate_utf8(text)
            lists[qid] = {"lexical": engine.projections.lexical(scope).search(q, CHANNEL_DEPTH),
                          "semantic": engine.projections.vectors(scope).search(engine.embedder.encode([q])[0],
                                                                               CHANNEL_DEPTH)}
    variants = {
        "rrf k=60": lambda ch: fusion.rrf(ch, k=60),
        "dbsf (engine)": lambda ch: fusion.dbsf(ch),
        "convex 0.5/0.5": lambda ch: fusion.convex(ch, {"lexical": 0.5, "semantic": 0.5}),
        "dbsf clipped [0, 1]": lambda ch: clipped_dbsf(ch, CHANNEL_DEPTH),
        "dbsf clipped, stats@100": lambda ch: clipped_dbsf(ch, 100),
    }
    print(f"| variant | {' | '.join(f'depth {d}' for d in (CHANNEL_DEPTH, 200, 100))} |")
    print("|---|---:|---:|---:|")
    for label, fn in variants.items():
        cells = []
        for depth in (CHANNEL_DEPTH, 200, 100):
            run = {q: [(r2d[r], s) for r, s in fn({n: h[:depth] for n, h in ch.items()})[:100]]
                   for q, ch in lists.items()}
            cells.append(f"{metrics.score(run, col.qrels)['ndcg@10']:.4f}")
        print(f"| {label} | {' | '.join(cells)} |")


if __name__ == "__main__":
    typer.run(main)
