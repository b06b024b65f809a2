"""Issue 34: the semantic channel alone on the XQuAD development collections, per model.

    python -m studies.xquad_semantic --model multilingual-e5-small --out studies/xquad-semantic-e5.json

What the engine's semantic channel computes, without the store around it: every paragraph encoded
as the engine encodes a record (``title`` and text joined as the eval's ``single`` mapping does, as a
document: e5's ``passage: ``), every question as a query (e5's ``query: ``), ranked by cosine (exact:
240 vectors are far below the HNSW threshold; ties by record order do not occur at float precision)
and scored nDCG@10 against the one relevant paragraph. Queries are encoded 32 per forward pass (the
engine encodes one at a time: the same vectors up to float rounding of padded batches). A corpus
shared by several folders (the English paragraphs of en, de2en, ru2en, ar2en) is encoded once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _qrels(path: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        qid, did, score = line.split("\t")[:3]
        if int(score) > 0:
            out.setdefault(qid, set()).add(did)
    return out


def ndcg10(ranked: list[str], relevant: set[str]) -> float:
    dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(ranked[:10]) if d in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(10, len(relevant))))
    return dcg / ideal if ideal else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/xquad"))
    parser.add_argument("--model", default="multilingual-e5-small")
    parser.add_argument("--only", default="", help="comma-separated folder names (default: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from engram_memory.retrieval.embedder import Embedder, model_directory

    embedder = Embedder(model_directory(args.model), threads=2).start()
    assert embedder.wait(1800), embedder.error
    folders = sorted(p for p in args.data.iterdir() if p.is_dir() and (p / "corpus.jsonl").is_file())
    if args.only:
        folders = [p for p in folders if p.name in args.only.split(",")]
    corpora: dict[str, tuple[list[str], np.ndarray]] = {}
    out: dict[str, Any] = {"model": embedder.describe(), "collections": {}}
    for folder in folders:
        t0 = time.perf_counter()
        raw = (folder / "corpus.jsonl").read_bytes()
        key = hashlib.sha256(raw).hexdigest()
        if key not in corpora:
            docs = _jsonl(folder / "corpus.jsonl")
            texts = [" ".join(p for p in (d.get("title", ""), d.get("text", "")) if p) for d in docs]
            corpora[key] = ([d["_id"] for d in docs], embedder.encode(texts))
        ids, mat = corpora[key]
        qrels = _qrels(folder / "qrels" / "test.tsv")
        queries = [q for q in _jsonl(folder / "queries.jsonl") if q["_id"] in qrels]
        qvecs = embedder.encode([q["text"] for q in queries], batch_size=32, kind="query")
        scores = qvecs @ mat.T
        values = []
        for row, q in zip(scores, queries, strict=True):
            order = np.argsort(-row, kind="stable")[:10]
            values.append(ndcg10([ids[i] for i in order], qrels[q["_id"]]))
        out["collections"][folder.name] = {"ndcg@10": round(float(np.mean(values)), 4), "queries": len(queries),
                                           "docs": len(ids), "seconds": round(time.perf_counter() - t0, 1)}
        print(folder.name, out["collections"][folder.name], flush=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
