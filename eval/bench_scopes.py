"""``engram-memory bench --scopes N``: one node's memory over a store of many scopes (issue 39 §3).

The store grows to N scopes holding R records in all: one large scope (20,000 records, or a
quarter of R when that is less), one small scope (200), the rest shared evenly by the others. Then
a fresh process -- so its RSS is the node's, not the growth's -- opens the store with
``projection_memory`` set, the model loaded, and measures:

* RSS idle (the model loaded, no scope resident), and once the model has run one search (its
  arenas allocated; one scope resident): the "model" of the target budget + model;
* the first search of a cold small scope and of the cold large scope (loaded from this node's
  projection files);
* a random search workload over all scopes (uniform scope, random query): its latencies, and RSS
  after it, against the target budget + model;
* warm searches (a resident scope searched again): p50/p99;
* what a resident scope costs (the engine's estimate for the small, a typical and the large scope).

Everything goes to OUT/bench-scopes.json; the targets and their ratios are printed on stderr.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from engram_memory.eval.beir import Doc
from engram_memory.eval.bench_parts import pcts, search_args
from engram_memory.eval.ingest import (
    PURPOSE,
    capture_args,
    open_engine,
    set_store,
    store_options,
    validated,
)
from engram_memory.models.context import HostContext
from engram_memory.models.tools import to_plain
from engram_memory.store.core.lifecycle import BatchItem

LARGE, SMALL = 20_000, 200  # the cold scopes
WARM_SCOPES, WARM_SEARCHES = 10, 20
GROW_BATCH = 500
LIMIT = 10
MANIFEST = "scopes.json"


def scope_sizes(n_scopes: int, n_records: int) -> list[int]:
    """Records per scope: [large, small, the others evenly]."""
    large = min(LARGE, n_records // 4)
    small = min(SMALL, max(1, n_records // n_scopes))
    rest, others = n_records - large - small, n_scopes - 2
    base, extra = divmod(rest, others)
    return [large, small] + [base + (1 if i < extra else 0) for i in range(others)]


def scope_context(i: int) -> HostContext:
    return HostContext(tenant="bench-scopes", workspace=f"scope-{i:05d}", principal="harness",
                       agent_id="eval-harness", purpose_ref=PURPOSE)


def _rss_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def grow(store_dir: Path, sizes: list[int], texts: Any, budget: int, progress: bool) -> float:
    """Capture and admit every scope's records (one engine.batch() per chunk); seconds taken."""
    t0 = time.perf_counter()
    bar = tqdm(total=sum(sizes), desc=f"grow {len(sizes)} scopes", unit="rec", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    with open_engine(store_dir, "hybrid", projection_memory=budget) as engine:
        for i, size in enumerate(sizes):
            ctx = scope_context(i)
            # As an import sends them: capture + admission in one transaction per batch of records.
            with engine.batch():
                for start in range(0, size, GROW_BATCH):
                    items = []
                    for j in range(start, min(size, start + GROW_BATCH)):
                        doc = Doc(f"s{i:05d}-{j:06d}", "", next(texts))
                        plain = to_plain(validated("capture", capture_args("bench", doc)))
                        items.append(BatchItem(plain, f"admit-key-{i:05d}-{j:07d}"))
                    refused = [o for o in engine.capture_and_admit(ctx, items) if o.admitted is None]
                    if refused:
                        raise RuntimeError(f"{len(refused)} bench record(s) not admitted")
                    bar.update(len(items))
    bar.close()
    return time.perf_counter() - t0


def measure(store_dir: Path, sizes: list[int], budget: int, queries: list[str], searches: int,
            seed: int = 5) -> dict[str, Any]:
    """The node's figures (run in a fresh process: see run_scope_bench)."""
    from engram_memory.retrieval.heap import release_heap

    out: dict[str, Any] = {}
    rng = random.Random(seed)
    with open_engine(store_dir, "hybrid", projection_memory=budget) as engine:
        def search(i: int, q: str) -> float:
            t = time.perf_counter()
            engine.search(scope_context(i), validated("search", search_args(q, PURPOSE, LIMIT, True)))
            return time.perf_counter() - t

        release_heap()
        out["rss_idle_mib"] = _rss_mib()
        typical = len(sizes) // 2
        search(typical, queries[0])  # the process's first search (ONNX warm-up) on neither cold scope
        release_heap()
        # The model's cost once it has run (its arenas), with one scope resident (inside the budget).
        out["rss_model_warm_mib"] = _rss_mib()
        out["first_search_cold_small_ms"] = search(1, queries[1]) * 1e3
        out["first_search_cold_large_ms"] = search(0, queries[2]) * 1e3
        costs = {name: engine.projections.resident_bytes(scope_context(i).scope_ref)
                 for name, i in (("large", 0), ("small", 1))}
        search(typical, queries[3])
        costs["typical"] = engine.projections.resident_bytes(scope_context(typical).scope_ref)
        out["resident_estimate_bytes"] = {name: costs[name] for name in ("small", "typical", "large")}
        out["scope_records"] = {"small": sizes[1], "typical": sizes[typical], "large": sizes[0]}
        workload = [search(rng.randrange(len(sizes)), rng.choice(queries)) for _ in range(searches)]
        out["workload"] = {"searches": searches, "scopes": len(sizes), **pcts(workload)}
        release_heap()
        out["rss_after_workload_mib"] = _rss_mib()
        out["rss_peak_mib"] = _rss_mib("VmHWM")
        warm: list[float] = []
        for i in rng.sample(range(len(sizes)), min(WARM_SCOPES, len(sizes))):
            search(i, rng.choice(queries))  # loads it
            warm += [search(i, rng.choice(queries)) for _ in range(WARM_SEARCHES)]
        out["warm"] = pcts(warm)
        out["resident_scopes"] = len(engine.projections.resident_scopes())
        out["resident_estimate_total_bytes"] = engine.projections.resident_bytes()
        out["evictions"] = engine.projections.evictions
    return out


def run_scope_bench(out_dir: Path, n_scopes: int, n_records: int, budget: int, searches: int,
                    progress: bool = True) -> dict[str, Any]:
    from engram_memory.eval.bench import bench_queries, machine, record_texts

    store_dir = out_dir / "bench-scopes-store"
    sizes = scope_sizes(n_scopes, n_records)
    texts = record_texts(None)
    manifest = store_dir / MANIFEST
    stored = json.loads(manifest.read_text()) if manifest.exists() else None
    if stored != {"sizes": sizes, "store": str(store_options().get("store", ""))}:
        if store_dir.exists() and not store_options():
            import shutil

            shutil.rmtree(store_dir)
        store_dir.mkdir(parents=True, exist_ok=True)
        _say(f"growing {n_scopes:,} scopes, {n_records:,} records (large {sizes[0]:,}, small {sizes[1]:,})")
        grow_s = grow(store_dir, sizes, texts, budget, progress)
        manifest.write_text(json.dumps({"sizes": sizes, "store": str(store_options().get("store", ""))}))
        texts = record_texts(None)
    else:
        grow_s = None
        _say(f"reusing the grown store in {store_dir}")
    corpus = [next(texts) for _ in range(2000)]
    queries = bench_queries(None, corpus, 200)
    _say(f"measuring in a fresh process: budget {budget / 2**20:.0f} MiB, {searches:,} searches over all scopes")
    args = {"store_dir": str(store_dir), "sizes": sizes, "budget": budget, "queries": queries,
            "searches": searches, "store": {k: str(v) for k, v in store_options().items()}}
    done = subprocess.run([sys.executable, "-m", "engram_memory.eval.bench_scopes"], input=json.dumps(args),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("the measuring process failed: " + (done.stderr.strip().splitlines() or ["?"])[-1])
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    target_mib = budget / 2**20 + figures["rss_model_warm_mib"]
    result = {
        "machine": machine(),
        "store": "postgresql" if store_options() else "duckdb",
        "scopes": n_scopes, "records": n_records, "projection_memory_bytes": budget, "grow_s": grow_s,
        **figures,
        "ratios": {"rss_after_workload_vs_budget_plus_model": {
            "value": figures["rss_after_workload_mib"] / target_mib, "target": 1.0,
            "pass": figures["rss_after_workload_mib"] <= target_mib}},
    }
    (out_dir / "bench-scopes.json").write_text(json.dumps(result, indent=2) + "\n")
    for line in summary(result):
        _say(line)
    return result


def summary(r: dict[str, Any]) -> list[str]:
    budget = r["projection_memory_bytes"] / 2**20
    ratio = r["ratios"]["rss_after_workload_vs_budget_plus_model"]
    est = r["resident_estimate_bytes"]
    recs = r["scope_records"]
    return [
        f"{r['scopes']:,} scopes, {r['records']:,} records on {r['store']}, projection_memory {budget:.0f} MiB",
        f"RSS idle {r['rss_idle_mib']:.0f} MiB (model loaded, no scope resident); after "
        f"{r['workload']['searches']:,} random searches {r['rss_after_workload_mib']:.0f} MiB = "
        f"{ratio['value']:.2f} x (budget + model {r['rss_model_warm_mib']:.0f} MiB, the RSS after one search)"
        f" [target <= 1.00: {'pass' if ratio['pass'] else 'FAIL'}]; peak {r['rss_peak_mib']:.0f} MiB",
        f"first search, cold scope of {recs['small']:,} records {r['first_search_cold_small_ms']:.1f} ms,"
        f" of {recs['large']:,} records {r['first_search_cold_large_ms']:.1f} ms",
        f"warm search p50 {r['warm']['p50']:.1f} ms, p99 {r['warm']['p99']:.1f} ms; random workload p50"
        f" {r['workload']['p50']:.1f} ms, p99 {r['workload']['p99']:.1f} ms ({r['evictions']:,} evictions)",
        "resident scope estimate: " + ", ".join(
            f"{recs[k]:,} records {est[k] / 2**20:.1f} MiB" for k in ("small", "typical", "large")),
    ]


def _say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _child() -> None:
    args = json.loads(sys.stdin.read())
    if args["store"]:
        set_store(args["store"]["store"], Path(args["store"]["master_key_file"]))
    figures = measure(Path(args["store_dir"]), args["sizes"], args["budget"], args["queries"], args["searches"])
    print(json.dumps(figures))


if __name__ == "__main__":
    _child()
