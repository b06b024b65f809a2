"""Issue 23 §1: fp32 or int8 for the embedder's ONNX graph, decided on nDCG@10 (not on cosine).

No engine default changes. The study builds a dynamically quantised copy of the fp32 graph the
engine exports (``onnxruntime.quantization.quantize_dynamic``), puts it in a model cache of its own
(``<work>/model-cache-int8/<digest>/model.onnx`` with a manifest naming its SHA-256, which is all
``retrieval/onnx_runtime.ensure_onnx`` checks), points ``ENGRAM_MODEL_CACHE`` at that cache and runs
the evaluation harness in-process (``eval.cli.eval_cmd``, what ``engram-memory eval`` calls), so
the int8 graph does every encode: documents at ingest and queries at search. Each collection gets
a fresh store cache. The fp32 side is the plain CLI run (same options) on a fresh store cache.

    python -m studies.int8_study build  --work /tmp/rel              # the int8 graph
    python -m studies.int8_study eval   --work /tmp/rel --dataset /work/shared/data/scifact --name scifact
    python -m studies.int8_study timing --work /tmp/rel --dataset /work/shared/data/scifact   # p50, RSS
    python -m studies.int8_study report --work /tmp/rel                # studies/int8-study.json

Nothing here was tuned: the quantisation settings are the main variant the issue names
(per-channel weights, QInt8), chosen before any result was seen.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COLLECTIONS = ("scifact", "cranfield", "medline", "locomo")


def _digest_folder() -> tuple[Path, str, str]:
    from engram_memory.retrieval.embedder import compute_model_digest, packaged_model_path

    model_dir = packaged_model_path()
    assert model_dir is not None, "no packaged model"
    digest = compute_model_digest(model_dir)
    assert digest is not None
    return model_dir, digest, digest.removeprefix("sha256:")[:32]


def _fp32_graph() -> Path:
    """The engine's own fp32 export (exported now if the default cache lacks it)."""
    from engram_memory.retrieval.onnx_runtime import ensure_onnx

    model_dir, digest, _ = _digest_folder()
    return ensure_onnx(model_dir, digest)


def int8_cache(work: Path) -> Path:
    return work / "model-cache-int8"


def build(work: Path, per_channel: bool, weight_type: str) -> dict:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from engram_memory.retrieval.onnx_runtime import MANIFEST, ONNX_FILE, _sha256

    _, digest, folder_name = _digest_folder()
    src = _fp32_graph()
    folder = int8_cache(work) / folder_name
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / ONNX_FILE
    t0 = time.perf_counter()
    quantize_dynamic(str(src), str(out), per_channel=per_channel, weight_type=getattr(QuantType, weight_type))
    info = {"source": str(src), "source_sha256": _sha256(src), "source_bytes": src.stat().st_size,
            "int8": str(out), "int8_sha256": _sha256(out), "int8_bytes": out.stat().st_size,
            "per_channel": per_channel, "weight_type": weight_type, "build_s": round(time.perf_counter() - t0, 1)}
    manifest = {"model_digest": digest, "onnx_sha256": info["int8_sha256"], "precision": "int8",
                "quantize_dynamic": {"per_channel": per_channel, "weight_type": weight_type}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    (work / "int8-build.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    print(json.dumps(info, indent=1))
    return info


def run_eval(work: Path, dataset: Path, name: str, channels: str) -> None:
    """The harness in-process with the int8 graph; the store cache is fresh (refuses a used one)."""
    cache = int8_cache(work)
    if not (cache / _digest_folder()[2] / "model.onnx").is_file():
        raise SystemExit("build the int8 graph first")
    os.environ["ENGRAM_MODEL_CACHE"] = str(cache)
    from engram_memory.retrieval import onnx_runtime

    onnx_runtime.PRECISION = "int8"  # only the runtime label (onnxruntime-X/int8) this process reports
    store_cache = work / "cache-int8" / name
    if store_cache.exists() and any(store_cache.iterdir()):
        raise SystemExit(f"{store_cache} is not empty: every run gets a fresh store cache")
    store_cache.mkdir(parents=True, exist_ok=True)
    from engram_memory.eval.cli import eval_cmd

    eval_cmd(dataset=dataset, out=work / "out-int8" / name, channels=channels, cache_dir=store_cache,
             progress=False, threads="1", latency=False)
    # Proof the int8 graph did the encoding: the shared embedder's runtime and its session's file.
    from engram_memory.retrieval.embedder import _SHARED

    used = [{"runtime": e.runtime, "model_path": str(e.model_path)} for e in _SHARED.values()]
    (work / "out-int8" / name / "int8-runtime.json").write_text(json.dumps(used, indent=1), encoding="utf-8")
    assert used and all(u["runtime"] and u["runtime"].endswith("/int8") for u in used), used
    sys.stderr.write(f"embedder: {used}\n")


def _vmrss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timing_child(onnx_file: Path, dataset: Path, n: int, out: Path) -> None:
    """In a fresh process: RSS before and after loading one graph, then n queries one at a time."""
    before = _vmrss_mib()
    from engram_memory.retrieval.onnx_runtime import OnnxEncoder, Pipeline

    model_dir, _, _ = _digest_folder()
    imported = _vmrss_mib()
    enc = OnnxEncoder(model_dir, onnx_file, Pipeline.read(model_dir), threads=1)
    enc.encode(["warm-up"], 1)
    loaded = _vmrss_mib()
    queries = [json.loads(line)["text"] for line in (dataset / "queries.jsonl").open(encoding="utf-8")][:n]
    for q in queries[:10]:
        enc.encode([q], 1)
    times, vecs = [], []
    for q in queries:
        t0 = time.perf_counter()
        v = enc.encode([q], 1)
        times.append((time.perf_counter() - t0) * 1000)
        vecs.append(v[0])
    np.save(out.with_suffix(".npy"), np.vstack(vecs))
    result = {"graph": str(onnx_file), "queries": len(queries), "threads": 1,
              "encode_ms": {"p50": statistics.median(times), "p95": float(np.percentile(times, 95)),
                            "mean": statistics.fmean(times)},
              "rss_mib": {"before_imports": before, "after_imports": imported, "after_load_and_warmup": loaded,
                          "model_share": loaded - imported, "after_queries": _vmrss_mib()}}
    out.write_text(json.dumps(result, indent=1), encoding="utf-8")


def timing(work: Path, dataset: Path, n: int, rounds: int) -> dict:
    graphs = {"fp32": _fp32_graph(), "int8": int8_cache(work) / _digest_folder()[2] / "model.onnx"}
    results: dict[str, list[dict]] = {"fp32": [], "int8": []}
    for r in range(rounds):  # alternate, so a busy moment on the shared cores hits both
        for name, graph in graphs.items():
            out = work / f"timing-{name}-{r}.json"
            subprocess.run([sys.executable, "-m", "studies.int8_study", "_timing_child",
                            "--graph", str(graph), "--dataset", str(dataset), "--n", str(n), "--out", str(out)],
                           check=True, cwd=HERE.parent)
            results[name].append(json.loads(out.read_text(encoding="utf-8")))
    a = np.load(work / "timing-fp32-0.npy")
    b = np.load(work / "timing-int8-0.npy")
    cos = (a * b).sum(axis=1)
    summary = {name: {"encode_p50_ms_per_round": [x["encode_ms"]["p50"] for x in rs],
                      "encode_p50_ms": statistics.median(x["encode_ms"]["p50"] for x in rs),
                      "rss_after_load_mib": statistics.median(x["rss_mib"]["after_load_and_warmup"] for x in rs),
                      "rss_after_imports_mib": statistics.median(x["rss_mib"]["after_imports"] for x in rs),
                      "rss_model_share_mib": statistics.median(x["rss_mib"]["model_share"] for x in rs),
                      "runs": rs}
               for name, rs in results.items()}
    summary["query_cosine_fp32_int8"] = {"mean": float(cos.mean()), "min": float(cos.min()),
                                         "p50": float(np.median(cos)), "n": int(len(cos))}
    (work / "timing.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(json.dumps({k: (v if k == "query_cosine_fp32_int8" else {kk: vv for kk, vv in v.items() if kk != "runs"})
                      for k, v in summary.items()}, indent=1))
    return summary


def _rows(results: Path) -> dict:
    d = json.loads(results.read_text(encoding="utf-8"))
    runs = d["mean"] if "mean" in d else d["runs"]
    out = {run: {"ndcg@10": s["ndcg@10"], "recall@10": s["recall@10"], "recall@100": s["recall@100"]}
           for run, s in runs.items()}
    if "per_collection" in d:
        per = d["per_collection"].items()
        out["per_collection_hybrid_ndcg@10"] = {n: r["runs"]["hybrid"]["ndcg@10"] for n, r in per
                                               if "hybrid" in r["runs"]}
        out["per_collection_semantic_ndcg@10"] = {n: r["runs"]["semantic"]["ndcg@10"] for n, r in per
                                                 if "semantic" in r["runs"]}
    return out


def report(work: Path, tolerance: float) -> dict:
    table = {}
    for name in COLLECTIONS:
        fp32 = _rows(work / "out-fp32" / name / "results.json")
        int8 = _rows(work / "out-int8" / name / "results.json")
        row = {"fp32": fp32, "int8": int8, "diff": {}}
        for run in ("semantic", "hybrid"):
            row["diff"][run] = {m: int8[run][m] - fp32[run][m] for m in ("ndcg@10", "recall@10", "recall@100")}
        table[name] = row
    qualifies = {run: all(table[n]["diff"][run]["ndcg@10"] >= -tolerance for n in COLLECTIONS)
                 for run in ("semantic", "hybrid")}
    timing_all = json.loads((work / "timing.json").read_text(encoding="utf-8"))
    out = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tolerance_ndcg@10": tolerance,
           "rule": "int8 only if hybrid nDCG@10 stays within 0.005 of fp32 on every development collection and the "
                   "LoCoMo mean", "collections": table,
           "int8_qualifies": {"hybrid (the rule)": qualifies["hybrid"], "semantic (reported)": qualifies["semantic"]},
           "build": json.loads((work / "int8-build.json").read_text(encoding="utf-8")),
           "timing": {k: ({kk: vv for kk, vv in v.items() if kk != "runs"} if "runs" in v else v)
                      for k, v in timing_all.items()}}
    (HERE / "int8-study.json").write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({n: r["diff"] for n, r in table.items()}, indent=1))
    print(out["int8_qualifies"])
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m studies.int8_study")
    p.add_argument("step", choices=["build", "eval", "timing", "report", "_timing_child"])
    p.add_argument("--work", type=Path, default=Path("/tmp/rel"))
    p.add_argument("--dataset", type=Path)
    p.add_argument("--name")
    p.add_argument("--channels", default="semantic,hybrid")
    p.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--weight-type", default="QInt8", choices=["QInt8", "QUInt8"])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--graph", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--tolerance", type=float, default=0.005)
    a = p.parse_args()
    if a.step == "build":
        build(a.work, a.per_channel, a.weight_type)
    elif a.step == "eval":
        run_eval(a.work, a.dataset, a.name or a.dataset.name, a.channels)
    elif a.step == "timing":
        timing(a.work, a.dataset, a.n, a.rounds)
    elif a.step == "_timing_child":
        timing_child(a.graph, a.dataset, a.n, a.out)
    else:
        report(a.work, a.tolerance)


if __name__ == "__main__":
    main()
