"""The eval pipeline: load -> ingest (cached) -> one run per channel set -> ranx -> files.

Per-channel runs go through the unmodified search path: the engine is reopened with
``EngineSettings.channels`` restricted to ``("lexical",)``, ``("semantic",)`` or both, and each
run's rank receipt is checked to name exactly the channels that were asked for, so a hybrid
run that silently fell back to lexical (model not ready) fails instead of being scored.
"""

from __future__ import annotations

import logging
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from engram_memory.eval import baseline, metrics, options, report
from engram_memory.eval.beir import Collection, load_collection, truncate_utf8
from engram_memory.eval.ingest import (
    CHANNEL_SETS,
    IngestResult,
    admission_policy_ref,
    doc_text,
    host_context,
    load_or_ingest,
    open_engine,
    set_torch_threads,
)
from engram_memory.eval.runner import DEPTH, RunResult, run_queries, search_depth

log = logging.getLogger("engram.eval")
CHANNELS = options.CHANNEL_NAMES  # the baseline (bm25s) and the engine's three runs
LATENCY_LIMIT = 10  # the tool's default page size: what an agent's typical search costs


def _say(message: str) -> None:
    print(f"eval: {message}", file=sys.stderr, flush=True)


def fusion_overrides(fusion: str | None = None, rrf_k: int | None = None,
                     weights: Sequence[float] | None = None) -> dict[str, Any]:
    """EngineSettings overrides; None keeps the engine's shipped default."""
    out: dict[str, Any] = {}
    if fusion is not None:
        out["fusion"] = fusion
    if rrf_k is not None:
        out["rrf_k"] = int(rrf_k)
    if weights is not None:
        wl, ws = (float(w) for w in weights)
        out["fusion_weights"] = (wl, ws)
    return out


def run_channel(store_dir: Path, col: Collection, ing: IngestResult, channels: str, progress: bool = True,
                **overrides: Any) -> RunResult:
    with open_engine(store_dir, channels, **overrides) as engine:
        result = run_queries(engine, col.name, col.queries, ing.record_to_doc, channels, progress=progress)
    check_receipt(result, channels)
    return result


def check_receipt(result: RunResult, channels: str) -> None:
    if not result.receipt:
        return  # no query ran (empty query set)
    got = tuple(c["channel"] for c in result.receipt["channels"] if c["contributed"])
    if got != CHANNEL_SETS[channels]:
        raise RuntimeError(f"{channels} run: receipts name channels {got}, expected {CHANNEL_SETS[channels]}")
    if result.unknown_records:
        raise RuntimeError(f"{channels} run ranked {result.unknown_records} records outside the doc map")


def _pcts(samples_s: Sequence[float]) -> dict[str, float]:
    if not samples_s:
        return {}
    ms = np.asarray(samples_s, dtype=float) * 1e3
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)),
            "p99": float(np.percentile(ms, 99)), "mean": float(ms.mean()), "n": int(ms.size)}


def model_info(store_dir: Path) -> dict[str, str]:
    with open_engine(store_dir, "hybrid") as engine:
        return {"model_id": engine.embedder.model_id, "model_digest": engine.embedder.model_digest}


def latency_pass(store_dir: Path, col: Collection, channels: str, **overrides: Any) -> list[float]:
    """One search per query at the default page size (limit 10), including the query encode."""
    ctx = host_context(col.name)
    with open_engine(store_dir, channels, **overrides) as engine:
        out = []
        for text in col.queries.values():
            q = truncate_utf8(text)
            if not q.strip():
                continue
            t = time.perf_counter()
            search_depth(engine, ctx, q, depth=LATENCY_LIMIT)
            out.append(time.perf_counter() - t)
    return out


def peer_eval(store_dir: Path, col: Collection, ing: IngestResult, work_dir: Path,
              progress: bool = True) -> dict[str, Any]:
    """LanceDB over the same documents and the same stored vectors (see eval.peer_lancedb)."""
    from engram_memory.eval import peer_lancedb

    reason = peer_lancedb.unavailable()
    if reason:
        print(f"peer lancedb skipped: {reason}", file=sys.stderr)
        return {"name": "lancedb", "skipped": reason}
    docs = {d.doc_id: d for d in col.docs}
    with open_engine(store_dir, "hybrid") as engine:
        scope = host_context(col.name).scope_ref
        # The store's own decrypted vectors (what our semantic channel searches), not a re-encode:
        # the peer must see the SAME vectors.
        rids, mat = engine.stored_vectors(scope)
        qids = [q for q in col.queries if truncate_utf8(col.queries[q]).strip()]
        qtexts = [truncate_utf8(col.queries[q]) for q in qids]
        encode_s = []
        qvecs = []
        for q in qtexts:  # one at a time: the per-query encode cost is part of the latency
            t = time.perf_counter()
            qvecs.append(np.asarray(engine.embedder.encode([q], kind="query")[0], np.float32))
            encode_s.append(time.perf_counter() - t)
    rec_to_doc = ing.record_to_doc
    ids = [rec_to_doc[r] for r in rids]
    t = time.perf_counter()
    peer = peer_lancedb.LancePeer(work_dir / "lancedb", ids, [doc_text(docs[i]) for i in ids], mat)
    build_s = time.perf_counter() - t
    runs: dict[str, dict[str, list[tuple[str, float]]]] = {"lexical": {}, "semantic": {}, "hybrid": {}}
    lat: dict[str, list[float]] = {"lexical": [], "hybrid": [], "hybrid_no_encode": []}
    for qid, q, qv, enc in tqdm(list(zip(qids, qtexts, qvecs, encode_s, strict=True)), desc=f"  lancedb {col.name}",
                                unit="q", file=sys.stderr, disable=not progress, dynamic_ncols=True):
        runs["lexical"][qid] = peer.fts(q, DEPTH)
        runs["semantic"][qid] = peer.vector(qv, DEPTH)
        runs["hybrid"][qid] = peer.hybrid(q, qv, DEPTH)
        t = time.perf_counter()
        peer.fts(q, LATENCY_LIMIT)
        lat["lexical"].append(time.perf_counter() - t)
        t = time.perf_counter()
        peer.hybrid(q, qv, LATENCY_LIMIT)
        dt = time.perf_counter() - t
        lat["hybrid_no_encode"].append(dt)
        lat["hybrid"].append(dt + enc)
    peer.close()
    return {
        "name": "lancedb",
        "version": peer_lancedb.peer_version(),
        "config": {"fts": "lance native FTS, create_fts_index defaults", "vector": "flat cosine (no ANN index)",
                   "hybrid": "RRFReranker(K=60)", "vectors": "the engine's stored vectors"},
        "index_build_s": build_s,
        "runs_raw": runs,
        "latency_s": lat,
    }


def run_eval(
    dataset: Path | Collection,
    out: Path,
    channels: Sequence[str] = CHANNELS,
    fusion: str | None = None,
    rrf_k: int | None = None,
    weights: Sequence[float] | None = None,
    limit_docs: int | None = None,
    peer: str | None = None,
    cache_dir: Path | None = None,
    mapping: str = "single",
    progress: bool = True,
    latency: bool = True,
    threads: int | None = None,
    max_queries: int | None = None,
) -> dict[str, Any]:
    """``dataset`` is a collection folder or a :class:`Collection` already loaded (and subset)."""
    t_start = time.perf_counter()
    # Every option first (eval/options.py): a bad value costs a second, not an ingest.
    channels = options.channels(channels)
    fusion = options.fusion(fusion)
    weights = options.weights(weights)
    rrf_k = options.integer("--rrf-k", rrf_k)
    options.fusion_settings(channels, fusion, rrf_k, weights)
    options.integer("--limit-docs", limit_docs)
    options.integer("--max-queries", max_queries)
    options.integer("--threads", threads)
    options.choice("--mapping", mapping, options.MAPPINGS)
    options.choice("--peer", peer, options.PEERS)
    options.baseline_available(channels)
    col = dataset if isinstance(dataset, Collection) else load_collection(dataset, limit_docs)
    if max_queries is not None:
        col.queries = dict(list(col.queries.items())[:max_queries])
        col.qrels = {q: col.qrels[q] for q in col.queries}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    engine_channels = [ch for ch in channels if ch in CHANNEL_SETS]
    needs_model = any(ch != "lexical" for ch in engine_channels) or peer is not None
    torch_threads = set_torch_threads(threads) if needs_model else None
    overrides = fusion_overrides(fusion, rrf_k, weights)
    if not needs_model:
        # A lexical-only run never loads the model: no ingest embeddings (a later semantic run
        # embeds them when it opens the store, see eval.ingest.open_engine), no loader thread.
        overrides["semantic"] = False
    cache_root = Path(cache_dir) if cache_dir else out / "store"
    _say(f"{col.name}: {len(col.docs):,} docs, {len(col.queries):,} judged queries; runs {', '.join(channels)}"
         + (f"; store cache {cache_root}" if engine_channels or peer else ""))
    scores: dict[str, dict[str, float]] = {}
    all_runs: dict[str, Mapping[str, Sequence[tuple[str, float]]]] = {}
    if "baseline" in channels:
        t = time.perf_counter()
        all_runs["baseline"] = baseline.run_collection(col)
        baseline_s = time.perf_counter() - t
    ing: IngestResult | None = None
    results_runs: dict[str, RunResult] = {}
    if engine_channels or peer:
        ing = load_or_ingest(col, cache_root, mapping, progress=progress, announce=_say,
                             **({} if needs_model else {"semantic": False}))
        for ch in engine_channels:
            results_runs[ch] = run_channel(ing.store_dir, col, ing, ch, progress=progress, **overrides)
            all_runs[ch] = results_runs[ch].run
    ordered = [ch for ch in channels if ch in all_runs]
    scores = {ch: metrics.score(all_runs[ch], col.qrels) for ch in ordered}
    for ch in ordered:
        metrics.write_trec(out / "runs" / f"{col.name}.{ch}.trec", all_runs[ch],
                           "bm25s-baseline" if ch == "baseline" else f"engram-{ch}")
    hybrid_receipt = results_runs.get("hybrid", next(iter(results_runs.values()), None))
    results: dict[str, Any] = {
        "dataset": col.name,
        "docs": len(col.docs),
        "queries": len(col.queries),
        "runs": scores,
        "fusion": (hybrid_receipt.receipt.get("fusion") if "hybrid" in results_runs and hybrid_receipt
                   else {"method": "none"}),
        "model": model_info(ing.store_dir) if ing is not None and needs_model else {"model_id": None,
                                                                                   "model_digest": None},
        "mapping": mapping,
        "limit_docs": limit_docs,
        "max_queries": max_queries,
        "admitted": len(ing.doc_to_record) if ing is not None else None,
        "rejected": ing.rejected if ing is not None else [],
        "judged_pairs": sum(1 for q in col.qrels.values() for g in q.values() if g > 0),
        "receipts": {ch: r.receipt for ch, r in results_runs.items()},
        "restarted_queries": {ch: r.restarted_queries for ch, r in results_runs.items()},
        "admission_policy": admission_policy_ref(),
        "truncated_queries": max((r.truncated_queries for r in results_runs.values()), default=0),
        "torch_threads": torch_threads,
        "ranx_version": version("ranx"),
        "python": platform.python_version(),
    }
    if "baseline" in all_runs:
        results["baseline"] = {**baseline.describe(), "seconds": baseline_s}
    if ing is not None:
        results["store"] = {"dir": str(ing.store_dir), "reused": ing.reused, "ingest_s": ing.seconds,
                            "fingerprint": col.fingerprint}
        if not ing.reused and ing.capture_s:
            results["ingest"] = {"capture_ms": _pcts(ing.capture_s), "admission_ms": _pcts(ing.admit_s),
                                 "docs_per_s": len(col.docs) / ing.seconds}
    sig = _significance(all_runs, col.qrels)
    if sig:
        results["significance"] = sig
    if latency and engine_channels and ing is not None:
        _say(f"timing one limit-{LATENCY_LIMIT} search per query ({', '.join(engine_channels)})")
        lat = {}
        for ch in engine_channels:
            lat[ch] = _pcts(latency_pass(ing.store_dir, col, ch, **overrides))
        results["latency_ms"] = lat
    if peer == "lancedb" and ing is not None:
        results["peer"] = _peer_section(peer_eval(ing.store_dir, col, ing, out, progress), col, scores,
                                        results.get("latency_ms", {}), out)
    results["elapsed_s"] = time.perf_counter() - t_start
    report.write_results(out, results)
    report.write_report(out, results)
    return results


# Which pairs get a paired t-test on nDCG@10: the fused run against each channel and the baseline,
# and the lexical channel against the baseline (issue 12: lexical must not lose to standard BM25).
SIGNIFICANCE_PAIRS = (("hybrid", "lexical"), ("hybrid", "semantic"), ("hybrid", "baseline"),
                      ("lexical", "baseline"))


def _significance(runs: Mapping[str, Mapping[str, Sequence[tuple[str, float]]]],
                  qrels: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, float]]:
    pairs = [(a, b) for a, b in SIGNIFICANCE_PAIRS if a in runs and b in runs]
    if not pairs:
        return {}
    names = sorted({n for pair in pairs for n in pair})
    p = metrics.significance({n: runs[n] for n in names}, qrels)
    out: dict[str, dict[str, float]] = {}
    for a, b in pairs:
        out.setdefault(a, {})[b] = p[a][b]
    return out


def _peer_section(p: dict[str, Any], col: Collection, ours: Mapping[str, Mapping[str, float]],
                  our_lat: Mapping[str, Mapping[str, float]], out: Path) -> dict[str, Any]:
    if "skipped" in p:
        return p
    runs = p.pop("runs_raw")
    lat = p.pop("latency_s")
    p["runs"] = {ch: metrics.score(r, col.qrels) for ch, r in runs.items()}
    for ch, r in runs.items():
        metrics.write_trec(out / "runs" / f"{col.name}.lancedb-{ch}.trec", r, f"lancedb-{ch}")
    p["latency_ms"] = {k: _pcts(v) for k, v in lat.items()}
    ratios: dict[str, float] = {}
    for ch in ours:
        for m in metrics.METRICS:
            theirs = p["runs"].get(ch, {}).get(m)
            if theirs:
                ratios[f"{ch} {m}"] = ours[ch][m] / theirs
    for ch in ("lexical", "hybrid"):
        if ch in our_lat and our_lat[ch] and p["latency_ms"].get(ch):
            for q in ("p50", "p95"):
                ratios[f"{ch} latency {q} (limit 10)"] = our_lat[ch][q] / p["latency_ms"][ch][q]
    p["ratios"] = ratios
    return p
