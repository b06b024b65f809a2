"""The bench's target ratios and the in-process measurements behind them.

Targets (issue 9, point 6), all measured in the same run on the same machine, per store size:

* ``lexical / LanceDB FTS p50`` <= 1.0 -- engram lexical-only search against LanceDB's native FTS;
* ``hybrid / LanceDB hybrid p50`` <= 0.5 -- both with the query encoded inside the timed call;
* ``hybrid / sum of parts p50`` <= 1.3 -- the parts are timed separately on the same queries:
  query encode (``embedder.encode([q])``) + BM25 (``projections.lexical(scope).search``) + vector
  search (``projections.vectors(scope).search``), each at the engine's channel depth; the sum of
  the three p50s is the floor a search could reach with zero bookkeeping;
* ``4 searchers / 1 searcher throughput`` >= 1.6 -- threads, each running a fixed count of hybrid
  searches (encoded in the call) over the query list;
* ``MCP hybrid / (in-process hybrid + cheapest call) p50`` <= 1.3 -- a real stdio server driven by
  the MCP SDK client (``eval/bench_mcp.py``).

The pure parts (percentiles, ratio entries, report lines) need no model; tests/test_bench_units.py
covers them.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.models.limits import CHANNEL_DEPTH

HYBRID_POLICY = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
SEARCHERS = 4  # concurrent searchers of the concurrency target
ADMISSION_P50_MS = 30.0  # issue 23 §4: at 10k records
SERVE_PEAK_MIB = 600  # issue 23 §5: serve with 10k records, after the bench's searches
SERVE_IDLE_MIB = 350  # ... and idle with the model loaded

# (key, label, op, target): the order is the report order.
TARGETS: tuple[tuple[str, str, str, float], ...] = (
    ("lexical_vs_lancedb_fts", "lexical/LanceDB FTS p50", "<=", 1.0),
    ("hybrid_vs_lancedb_hybrid", "hybrid/LanceDB hybrid p50", "<=", 0.5),
    ("hybrid_vs_parts", "hybrid/sum of parts p50", "<=", 1.3),
    ("rerank_overhead", "hybrid/hybrid without the rerank stage p50", "<=", 1.1),
    ("concurrency", f"{SEARCHERS} searchers/1 throughput", ">=", 1.6),
    ("mcp_vs_in_process", "MCP hybrid/(in-process hybrid + cheapest call) p50", "<=", 1.3),
    ("ingest_vs_floor", "MCP ingest until searchable/bulk floor", "<=", 1.25),
    ("admission_p50", f"admission p50/{ADMISSION_P50_MS:.0f} ms", "<=", 1.0),
    ("serve_peak_rss", f"serve peak RSS after searches/{SERVE_PEAK_MIB} MiB", "<=", 1.0),
    ("serve_idle_rss", f"serve idle RSS (model loaded)/{SERVE_IDLE_MIB} MiB", "<=", 1.0),
)


# -- small helpers ---------------------------------------------------------------------------


def pcts(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean in milliseconds (and the sample count) of durations in seconds."""
    ms = np.asarray(samples_s, dtype=float) * 1e3
    if ms.size == 0:
        return {}
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)),
            "p99": float(np.percentile(ms, 99)), "mean": float(ms.mean()), "n": int(ms.size)}


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    for key in path:
        if not isinstance(d, Mapping):
            return None
        d = d.get(key)
    return d


# -- ratios ----------------------------------------------------------------------------------


def ratio_entry(label: str, numerator: float | None, denominator: float | None, op: str, target: float,
                unit: str = "ms", reason: str | None = None) -> dict[str, Any]:
    """One target: the ratio, its parts, the target and pass/fail (None when not measured)."""
    entry: dict[str, Any] = {"label": label, "op": op, "target": target, "unit": unit,
                             "numerator": numerator, "denominator": denominator}
    if numerator is None or denominator is None or not denominator > 0:
        entry.update(value=None, passed=None, measured=False, reason=reason or "not measured")
        return entry
    value = float(numerator) / float(denominator)
    passed = value <= target if op == "<=" else value >= target
    entry.update(value=value, passed=bool(passed), measured=True)
    return entry


def compute_ratios(row: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every target ratio of one size's bench row (missing measurements are reported, never raised)."""
    spec = {key: (label, op, target) for key, label, op, target in TARGETS}
    peer = row.get("peer")
    no_peer = "no peer run (--peer lancedb)" if not peer else None
    hybrid = _get(row, "search", "hybrid", "p50")
    out: dict[str, dict[str, Any]] = {}

    label, op, target = spec["lexical_vs_lancedb_fts"]
    out["lexical_vs_lancedb_fts"] = ratio_entry(label, _get(row, "search", "lexical", "p50"),
                                                _get(peer, "lexical", "p50"), op, target, reason=no_peer)
    label, op, target = spec["hybrid_vs_lancedb_hybrid"]
    out["hybrid_vs_lancedb_hybrid"] = ratio_entry(label, hybrid, _get(peer, "hybrid", "p50"), op, target,
                                                  reason=no_peer)
    label, op, target = spec["hybrid_vs_parts"]
    out["hybrid_vs_parts"] = ratio_entry(label, hybrid, _get(row, "parts", "sum_p50"), op, target,
                                         reason=_get(row, "parts", "error"))
    label, op, target = spec["rerank_overhead"]
    out["rerank_overhead"] = ratio_entry(label, hybrid, _get(row, "search", "hybrid_without_rerank", "p50"), op,
                                         target, reason="no run without the rerank stage")
    label, op, target = spec["concurrency"]
    conc = row.get("concurrency") or {}
    out["concurrency"] = ratio_entry(label, _get(conc, "threads", "searches_per_s"),
                                     _get(conc, "single", "searches_per_s"), op, target, unit="searches/s",
                                     reason=conc.get("error"))
    label, op, target = spec["mcp_vs_in_process"]
    mcp = row.get("mcp") or {}
    cheapest = _get(mcp, "cheapest", "p50")
    floor = hybrid + cheapest if hybrid is not None and cheapest is not None else None
    reason = mcp.get("error") or (mcp.get("skipped") and f"skipped: {mcp['skipped']}") or "no MCP run"
    out["mcp_vs_in_process"] = ratio_entry(label, _get(mcp, "hybrid", "p50"), floor, op, target, reason=reason)
    label, op, target = spec["ingest_vs_floor"]
    out["ingest_vs_floor"] = ratio_entry(label, _get(mcp, "ingest", "seconds"), _get(row, "ingest_floor", "seconds"),
                                         op, target, unit="s", reason=_get(mcp, "ingest", "error") or reason)
    label, op, target = spec["admission_p50"]
    out["admission_p50"] = ratio_entry(label, _get(row, "admission", "p50"), ADMISSION_P50_MS, op, target)
    label, op, target = spec["serve_peak_rss"]
    out["serve_peak_rss"] = ratio_entry(label, _get(mcp, "server_after_searches", "peak_rss_mib"), SERVE_PEAK_MIB,
                                        op, target, unit="MiB", reason=reason)
    label, op, target = spec["serve_idle_rss"]
    out["serve_idle_rss"] = ratio_entry(label, _get(mcp, "server_idle", "rss_mib"), SERVE_IDLE_MIB, op, target,
                                        unit="MiB", reason=reason)
    return out


def _verdict(entry: Mapping[str, Any]) -> str:
    return "ok" if entry.get("passed") else "MISS"


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:,.2f}"


def ratio_lines(size: int | str, ratios: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One stderr line per ratio, e.g. ``10000  lexical/LanceDB FTS p50  0.84 (target <= 1.0) ok``."""
    width = max((len(e["label"]) for e in ratios.values()), default=0)
    lines = []
    for entry in ratios.values():
        head = f"{int(size):>7}  {entry['label']:<{width}}  "
        if not entry.get("measured"):
            lines.append(head + f"not measured ({entry.get('reason') or 'not measured'})")
            continue
        lines.append(head + f"{entry['value']:.2f} (target {entry['op']} {entry['target']:.1f}) {_verdict(entry)}"
                     f"  [{_num(entry['numerator'])} / {_num(entry['denominator'])} {entry['unit']}]")
    return lines


def ratios_markdown(sizes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The targets table of bench.md (empty when no size has ratios)."""
    rows = []
    for size, row in sizes.items():
        for entry in (row.get("ratios") or {}).values():
            if entry.get("measured"):
                value, verdict = f"{entry['value']:.2f}", _verdict(entry)
            else:
                value, verdict = "—", f"not measured: {entry.get('reason') or 'not measured'}"
            rows.append(f"| {int(size):,} | {entry['label']} | {value} | {entry['op']} {entry['target']:.1f} "
                        f"| {verdict} | {_num(entry['numerator'])} / {_num(entry['denominator'])} {entry['unit']} |")
    if not rows:
        return []
    return ["", "## Targets (same run, same machine)", "",
            "| records | ratio | value | target | result | numerator / denominator |",
            "|---:|---|---:|---:|---|---|", *rows]


def breakdown_markdown(sizes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Parts, concurrency and MCP figures behind the ratios."""
    lines: list[str] = []
    for size, row in sizes.items():
        parts, conc, mcp = row.get("parts") or {}, row.get("concurrency") or {}, row.get("mcp") or {}
        cells = []
        for name, label in (("encode", "query encode"), ("lexical", "BM25 channel"),
                            ("vectors", "vector channel")):
            if parts.get(name):
                cells.append(f"| {int(size):,} | part: {label} (depth {parts.get('depth')}) "
                             f"| {_num(parts[name]['p50'])} | {_num(parts[name]['p95'])} |")
        if parts.get("sum_p50") is not None:
            cells.append(f"| {int(size):,} | parts: sum of p50s | {_num(parts['sum_p50'])} | |")
            hyb = _get(row, "search", "hybrid", "p50")
            if hyb is not None:
                cells.append(f"| {int(size):,} | hybrid minus parts (bookkeeping) | {_num(hyb - parts['sum_p50'])} | |")
        stages = row.get("stages") or {}
        if stages.get("stages"):
            n = stages["searches"]
            cells.append(f"| {int(size):,} | hybrid search, {n} queries not asked before, whole "
                         f"| {_num(stages['whole_p50'])} | |")
            cells += [f"| {int(size):,} | stage: {label} | {_num(ms)} | |" for label, ms in stages["stages"].items()]
            cells.append(f"| {int(size):,} | stage: other (validation, locks, packets) "
                         f"| {_num(stages['other_p50'])} | |")
        for key, label in (("single", "1 searcher"), ("threads", f"{conc.get('searchers', SEARCHERS)} searchers")):
            if _get(conc, key, "latency"):
                lat = conc[key]["latency"]
                cells.append(f"| {int(size):,} | {label}: {_num(conc[key]['searches_per_s'])} searches/s, latency "
                             f"| {_num(lat['p50'])} | {_num(lat['p95'])} |")
        for key, label in (("hybrid", "MCP hybrid search"), ("get_not_found", "MCP get (NOT_FOUND)"),
                           ("get_invalid", "MCP get (validation refusal)"), ("ping", "MCP ping (no tool)")):
            if mcp.get(key):
                cells.append(f"| {int(size):,} | {label} | {_num(mcp[key]['p50'])} | {_num(mcp[key]['p95'])} |")
        if mcp.get("client_cpu_ms_per_search") is not None:
            cells.append(f"| {int(size):,} | MCP client CPU per search (mean, bench process) "
                         f"| {_num(mcp['client_cpu_ms_per_search'])} | |")
        ingest, floor = mcp.get("ingest") or {}, row.get("ingest_floor") or {}
        if ingest.get("seconds") is not None:
            n = ingest["documents"]
            cells.append(f"| {int(size):,} | MCP ingest: {n} x (capture + request_admission), then a search: "
                         f"{_num(ingest['seconds'] * 1e3)} ms in all | {_num(ingest['seconds'] * 1e3 / n)} per doc | |")
            for key, label in (("capture", "MCP capture"), ("admission", "MCP request_admission")):
                if ingest.get(key):
                    cells.append(f"| {int(size):,} | {label} | {_num(ingest[key]['p50'])} "
                                 f"| {_num(ingest[key]['p95'])} |")
            if ingest.get("final_search_ms") is not None:
                cells.append(f"| {int(size):,} | MCP search after the ingest (projects what still waits) "
                             f"| {_num(ingest['final_search_ms'])} | |")
        if floor.get("seconds") is not None:
            cells.append(f"| {int(size):,} | ingest floor, {floor['documents']} docs: batch encode "
                         f"{_num(floor['encode_s'] * 1e3)} + one Tantivy commit {_num(floor['commit_s'] * 1e3)} ms "
                         f"| {_num(floor['seconds'] * 1e3 / floor['documents'])} per doc | |")
        for key, label in (("server_idle", "serve RSS, idle with the model (MiB)"),
                           ("server_after_searches", "serve RSS after the searches: now / peak (MiB)"),
                           ("server_after_ingest", "serve RSS after the ingest: now / peak (MiB)")):
            if mcp.get(key):
                mem = mcp[key]
                cells.append(f"| {int(size):,} | {label} | {_num(mem.get('rss_mib'))} "
                             f"| {_num(mem.get('peak_rss_mib'))} |")
        if mcp.get("error"):
            cells.append(f"| {int(size):,} | MCP run failed: {mcp['error']} | | |")
        lines += cells
    if not lines:
        return []
    return ["", "## Where the time goes (ms)", "", "| records | measure | p50 | p95 |", "|---:|---|---:|---:|",
            *lines]


# -- in-process measurements -----------------------------------------------------------------


def search_args(query: str, purpose_ref: str, limit: int, hybrid: bool) -> dict[str, Any]:
    """The search arguments of every timed search, in process and over MCP alike."""
    args: dict[str, Any] = {"query": query, "purpose_ref": purpose_ref, "limit": limit}
    if hybrid:
        args["capability_policy"] = dict(HYBRID_POLICY)  # refuses, never silently ranks lexical-only
    return args


def timed(fn: Callable[[str], Any], queries: Sequence[str], warmup: int = 5) -> list[float]:
    for q in queries[:warmup]:
        fn(q)
    out = []
    for q in queries:
        t = time.perf_counter()
        fn(q)
        out.append(time.perf_counter() - t)
    return out


def time_parts(engine: Any, scope_ref: str, queries: Sequence[str], normalise: Callable[[str], str],
               warmup: int = 5) -> dict[str, Any]:
    """The three parts of a hybrid search, each timed on its own for every query."""
    depth = CHANNEL_DEPTH
    embedder = engine.embedder
    lexical = engine.projections.lexical(scope_ref)
    vectors = engine.projections.vectors(scope_ref)
    texts = [normalise(q) for q in queries]  # what search() hands to its channels (NFC)
    for q in texts[:warmup]:
        vectors.search(embedder.encode([q], kind="query")[0], depth)
        lexical.search(q, depth)
    enc, lex, vec = [], [], []
    for q in texts:
        t = time.perf_counter()
        qvec = embedder.encode([q], kind="query")[0]
        t1 = time.perf_counter()
        lexical.search(q, depth)
        t2 = time.perf_counter()
        vectors.search(qvec, depth)
        t3 = time.perf_counter()
        enc.append(t1 - t)
        lex.append(t2 - t1)
        vec.append(t3 - t2)
    res: dict[str, Any] = {"depth": depth, "encode": pcts(enc), "lexical": pcts(lex), "vectors": pcts(vec)}
    res["sum_p50"] = res["encode"]["p50"] + res["lexical"]["p50"] + res["vectors"]["p50"]
    return res


# Where a search's time goes, stage by stage: the engine's own functions, timed where the search
# calls them (wrapped for the measurement, restored after). "other" is the rest: argument and
# output validation, locks, the packets' assembly, Python between the stages.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("query encode (a worker, beside BM25)", "embedder", "encode"),
    ("BM25 channel", "lexical_index", "search_analyzed"),
    ("vector channel", "vector_index", "search"),
    ("eligibility (scope view)", "scope_view", "eligible"),
    ("fusion", "reads", "rank"),
    ("rerank stage", "read_path", "_rerank"),
    ("page load + decrypt", "read_path_page", "load_page"),
    ("receipt digests", "reads", "receipt_digest"),
    ("response body", "reads", "response_body"),
)


def time_stages(engine: Any, search: Callable[[str], Any], queries: Sequence[str]) -> dict[str, Any]:
    """Per stage, the p50 over ``queries`` of the time one search spent in it; and of the whole."""
    from engram_memory.retrieval.lexical import LexicalIndex
    from engram_memory.retrieval.vectors import VectorIndex
    from engram_memory.store.core import reads
    from engram_memory.store.core.live import ScopeView

    owners = {"embedder": engine.embedder, "lexical_index": LexicalIndex, "vector_index": VectorIndex,
              "scope_view": ScopeView, "reads": reads, "read_path": reads.ReadPath,
              "read_path_page": engine._reads}
    spent: dict[str, list[float]] = {label: [] for label, _owner, _name in STAGES}
    current: dict[str, float] = {}
    lock = threading.Lock()
    restore: list[tuple[Any, str, Any, bool]] = []

    def wrap(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with lock:
                    current[label] = current.get(label, 0.0) + time.perf_counter() - t
        return timed_call

    whole, other = [], []
    try:
        for label, owner_key, name in STAGES:
            owner = owners[owner_key]
            restore.append((owner, name, vars(owner).get(name), name in vars(owner)))
            setattr(owner, name, wrap(label, getattr(owner, name)))
        encode, bm25 = STAGES[0][0], STAGES[1][0]
        for q in queries:
            current.clear()
            t = time.perf_counter()
            search(q)
            whole.append(time.perf_counter() - t)
            for label in spent:
                spent[label].append(current.get(label, 0.0))
            # The encode runs beside BM25: together they cost the longer of the two.
            serial = sum(v for k, v in current.items() if k not in (encode, bm25))
            other.append(whole[-1] - serial - max(current.get(encode, 0.0), current.get(bm25, 0.0)))
    finally:
        for owner, name, before, own in reversed(restore):
            if own:
                setattr(owner, name, before)
            else:
                delattr(owner, name)
    return {"searches": len(queries), "whole_p50": pcts(whole)["p50"], "other_p50": pcts(other)["p50"],
            "stages": {label: pcts(samples)["p50"] for label, samples in spent.items()}}


def concurrency(search: Callable[[str], Any], queries: Sequence[str], searchers: int = SEARCHERS,
                per_searcher: int | None = None) -> dict[str, Any]:
    """Throughput of ``searchers`` threads vs one, each running ``per_searcher`` searches over the queries.

    Searcher i starts at query ``i * len / searchers`` so concurrent searches differ. The engine
    decides how much runs in parallel (one lock serialises everything: a ratio near 1.0).
    """
    n = per_searcher or len(queries)

    def run(count: int) -> dict[str, Any]:
        barrier = threading.Barrier(count + 1)
        lat: list[list[float]] = [[] for _ in range(count)]
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            start = (i * len(queries)) // count
            barrier.wait()
            try:
                for k in range(n):
                    q = queries[(start + k) % len(queries)]
                    t = time.perf_counter()
                    search(q)
                    lat[i].append(time.perf_counter() - t)
            except BaseException as exc:  # re-raised in the caller
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,), name=f"bench-searcher-{i}", daemon=True)
                   for i in range(count)]
        for th in threads:
            th.start()
        barrier.wait()
        t0 = time.perf_counter()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        if errors:
            raise errors[0]
        total = count * n
        return {"searchers": count, "searches": total, "seconds": wall,
                "searches_per_s": total / wall if wall > 0 else None,
                "latency": pcts([x for xs in lat for x in xs])}

    for q in queries[:5]:
        search(q)  # warm
    single = run(1)
    multi = run(searchers)
    return {"searchers": searchers, "per_searcher": n, "single": single, "threads": multi}


def profile_searches(search: Callable[[str], Any], queries: Sequence[str], count: int, path: Path,
                     header: str = "", top: int = 40) -> dict[str, Any]:
    """cProfile over ``count`` searches; the top cumulative and own-time entries go to ``path``."""
    picked = [queries[i % len(queries)] for i in range(count)]
    for q in picked[:3]:
        search(q)
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    for q in picked:
        search(q)
    prof.disable()
    wall = time.perf_counter() - t
    buf = io.StringIO()
    buf.write(f"{header}\n{count} searches in {wall:.3f} s under cProfile ({wall / count * 1e3:.2f} ms each, "
              "profiler overhead included)\n\n== top by cumulative time ==\n")
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("cumulative").print_stats(top)
    buf.write("\n== top by own time ==\n")
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(top // 2)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return {"searches": count, "seconds": wall, "file": path.name}
