"""Fusion across languages on XQuAD: the lexical, semantic and hybrid channels per collection, with
the lexical weight scaled by the query's coverage (the shipped rule) and without it, and the
semantic weight scaled when the query is in a language the model was not trained for (``--foreign``:
the scales tried; 1 = the rule off).

The channels are the engine's own components (retrieval.lexical, retrieval.vectors, the packaged
embedder, retrieval.ranking.rank), run directly over each collection's paragraphs: no capture or
admission, so a collection takes seconds, not minutes. The official figures come from
``engram-memory eval`` (eval/RESULTS.md); this study only chooses ``LEXICAL_COVERAGE_FULL`` and
``SEMANTIC_FOREIGN_SCALE``.
XQuAD has one relevant paragraph per question, so nDCG@10 = 1 / log2(rank + 1) at rank <= 10.

    python -m studies.xquad_fusion --data ../shared/data/xquad [--full 0,0.25,0.5,0.75,1] [--foreign 1,0.5,0.25,0]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from engram_memory.models.limits import CHANNEL_DEPTH, HNSW_THRESHOLD
from engram_memory.retrieval.embedder import Embedder, foreign_language
from engram_memory.retrieval.lexical import LexicalDoc, LexicalIndex
from engram_memory.retrieval.ranking import FusionConfig, rank
from engram_memory.retrieval.vectors import VectorIndex


def ndcg10(ranked: list[str], relevant: set[str]) -> float:
    for i, rid in enumerate(ranked[:10]):
        if rid in relevant:
            return 1.0 / math.log2(i + 2)
    return 0.0


def run(folder: Path, embedder: Embedder, fulls: list[float], foreigns: list[float]) -> dict[str, float]:
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").open(encoding="utf-8")]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (folder / "queries.jsonl").open(encoding="utf-8"))}
    qrels: dict[str, set[str]] = {}
    for line in (folder / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, did, score = line.split("\t")
        if int(score) > 0:
            qrels.setdefault(qid, set()).add(did)
    texts = {d["_id"]: (d.get("title", "") + " " + d["text"]).strip() for d in corpus}
    with tempfile.TemporaryDirectory() as tmp:
        lexical = LexicalIndex.open(Path(tmp) / "lexical")
        lexical.rebuild(LexicalDoc(did, {"primary": text}) for did, text in texts.items())
        vectors = VectorIndex.open(Path(tmp) / "vectors", embedder.dim or 384, hnsw_threshold=HNSW_THRESHOLD)
        ids = sorted(texts)
        vectors.upsert(ids, embedder.encode([texts[i] for i in ids]))
        qids = sorted(q for q in qrels if q in queries)
        qvecs = embedder.encode([queries[q] for q in qids])
        sums: dict[str, float] = {"lexical": 0.0, "semantic": 0.0}
        coverages, foreign_queries = [], 0
        base = FusionConfig()
        for qid, qvec in zip(qids, qvecs, strict=True):
            found = lexical.search_analyzed(queries[qid], CHANNEL_DEPTH)
            sem = vectors.search(qvec, CHANNEL_DEPTH)
            coverages.append(found.coverage)
            sums["lexical"] += ndcg10([r for r, _ in found.hits], qrels[qid])
            sums["semantic"] += ndcg10([r for r, _ in sem], qrels[qid])
            channels = {"lexical": found.hits, "semantic": sem} if found.hits else {"semantic": sem}
            foreign = len(channels) > 1 and foreign_language(embedder.model_id, queries[qid]) is not None
            foreign_queries += foreign
            for full in fulls:
                for scale in foreigns:
                    config = replace(base, coverage_full=full, foreign_scale=scale)
                    fused = rank(channels, config, found.coverage if full > 0 else 1.0, foreign).ids
                    key = f"hybrid full={full}" + (f" foreign={scale}" if scale != 1.0 else "")
                    sums[key] = sums.get(key, 0.0) + ndcg10(fused, qrels[qid])
        lexical.close()
    out = {k: round(v / len(qids), 4) for k, v in sums.items()}
    out["mean coverage"] = round(sum(coverages) / len(coverages), 3)
    out["foreign queries"] = foreign_queries
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/xquad"))
    parser.add_argument("--full", default="0,0.25,0.5,0.75,1")
    parser.add_argument("--foreign", default="1")
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    fulls = [float(x) for x in args.full.split(",")]
    foreigns = [float(x) for x in args.foreign.split(",")]
    embedder = Embedder().start()
    assert embedder.wait(600), embedder.error
    for folder in sorted(p for p in args.data.iterdir() if (p / "corpus.jsonl").exists()):
        if args.only and folder.name not in args.only.split(","):
            continue
        t0 = time.perf_counter()
        row = run(folder, embedder, fulls, foreigns)
        print(folder.name, json.dumps(row), f"{time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
