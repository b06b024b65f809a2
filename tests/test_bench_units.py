"""Units of the bench's ratio, percentile and report code (no model, no store)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from engram_memory.eval.bench_parts import (
    TARGETS,
    breakdown_markdown,
    compute_ratios,
    concurrency,
    pcts,
    ratio_entry,
    ratio_lines,
    ratios_markdown,
    search_args,
)


def _row(**over: object) -> dict:
    row = {
        "search": {"lexical": {"p50": 4.2, "p95": 5.0}, "hybrid": {"p50": 10.0, "p95": 12.0},
                   "hybrid_without_rerank": {"p50": 9.5, "p95": 11.0}},
        "peer": {"lexical": {"p50": 5.0}, "hybrid": {"p50": 25.0}},
        "parts": {"depth": 1000, "encode": {"p50": 5.0, "p95": 6.0}, "lexical": {"p50": 1.0, "p95": 1.2},
                  "vectors": {"p50": 2.0, "p95": 2.5}, "sum_p50": 8.0},
        "concurrency": {"searchers": 4, "single": {"searches_per_s": 100.0, "latency": {"p50": 10.0, "p95": 11.0}},
                        "threads": {"searches_per_s": 150.0, "latency": {"p50": 26.0, "p95": 30.0}}},
        "mcp": {"hybrid": {"p50": 13.0, "p95": 15.0}, "cheapest": {"call": "get_not_found", "p50": 1.0},
                "get_not_found": {"p50": 1.0, "p95": 1.5}, "ping": {"p50": 0.3, "p95": 0.4}},
    }
    row.update(over)
    return row


def test_pcts_in_milliseconds() -> None:
    p = pcts([0.001, 0.002, 0.003, 0.004, 0.005])
    assert p["p50"] == pytest.approx(3.0) and p["mean"] == pytest.approx(3.0) and p["n"] == 5
    assert p["p95"] == pytest.approx(4.8) and p["p99"] == pytest.approx(4.96)
    assert pcts([]) == {}


def test_ratio_entry_pass_fail_and_unmeasured() -> None:
    ok = ratio_entry("x", 0.84, 1.0, "<=", 1.0)
    assert ok["value"] == pytest.approx(0.84) and ok["passed"] is True and ok["measured"] is True
    assert ratio_entry("x", 1.01, 1.0, "<=", 1.0)["passed"] is False
    assert ratio_entry("x", 1.0, 1.0, "<=", 1.0)["passed"] is True  # the target itself passes
    assert ratio_entry("x", 1.6, 1.0, ">=", 1.6)["passed"] is True
    assert ratio_entry("x", 1.5, 1.0, ">=", 1.6)["passed"] is False
    for num, den in ((None, 1.0), (1.0, None), (1.0, 0.0)):
        e = ratio_entry("x", num, den, "<=", 1.0, reason="why")
        assert e["measured"] is False and e["passed"] is None and e["value"] is None and e["reason"] == "why"


def test_compute_ratios_full_row() -> None:
    r = compute_ratios(_row())
    assert list(r) == [key for key, *_ in TARGETS]
    assert r["lexical_vs_lancedb_fts"]["value"] == pytest.approx(4.2 / 5.0) and r["lexical_vs_lancedb_fts"]["passed"]
    assert r["hybrid_vs_lancedb_hybrid"]["value"] == pytest.approx(0.4) and r["hybrid_vs_lancedb_hybrid"]["passed"]
    assert r["hybrid_vs_parts"]["value"] == pytest.approx(1.25) and r["hybrid_vs_parts"]["passed"]
    assert r["rerank_overhead"]["value"] == pytest.approx(10.0 / 9.5) and r["rerank_overhead"]["passed"]
    assert r["concurrency"]["value"] == pytest.approx(1.5) and r["concurrency"]["passed"] is False
    assert r["mcp_vs_in_process"]["value"] == pytest.approx(13.0 / 11.0) and r["mcp_vs_in_process"]["passed"]
    json.dumps(r)  # bench.json material


def test_compute_ratios_without_peer_or_mcp_never_raises() -> None:
    r = compute_ratios(_row(peer=None, mcp={"skipped": "--no-mcp"}, concurrency=None))
    for key in ("lexical_vs_lancedb_fts", "hybrid_vs_lancedb_hybrid"):
        assert r[key]["measured"] is False and "--peer lancedb" in r[key]["reason"]
    assert r["mcp_vs_in_process"]["measured"] is False and "--no-mcp" in r["mcp_vs_in_process"]["reason"]
    assert r["concurrency"]["measured"] is False
    assert r["hybrid_vs_parts"]["measured"] is True
    r = compute_ratios(_row(mcp={"error": "RuntimeError: boom"}))
    assert r["mcp_vs_in_process"]["reason"] == "RuntimeError: boom"
    assert compute_ratios({})["hybrid_vs_parts"]["measured"] is False


def test_ratio_lines_format() -> None:
    lines = ratio_lines(10000, compute_ratios(_row(peer=None)))
    assert len(lines) == len(TARGETS)
    lex = next(line for line in lines if "lexical/LanceDB FTS p50" in line)
    assert lex.startswith("  10000  lexical/LanceDB FTS p50") and "not measured (no peer run" in lex
    parts = next(line for line in lines if "sum of parts" in line)
    assert "1.25 (target <= 1.3) ok" in parts and "[10.00 / 8.00 ms]" in parts
    conc = next(line for line in lines if "throughput" in line)
    assert "1.50 (target >= 1.6) MISS" in conc


def test_markdown_tables() -> None:
    sizes = {"1000": {**_row(), "ratios": compute_ratios(_row())}}
    table = "\n".join(ratios_markdown(sizes))
    assert "## Targets" in table and "| 1,000 | hybrid/sum of parts p50 | 1.25 | <= 1.3 | ok |" in table
    assert "| 1,000 | 4 searchers/1 throughput | 1.50 | >= 1.6 | MISS |" in table
    assert ratios_markdown({"1000": {}}) == []
    parts = "\n".join(breakdown_markdown(sizes))
    assert "part: query encode (depth 1000) | 5.00 | 6.00 |" in parts
    assert "hybrid minus parts (bookkeeping) | 2.00 |" in parts and "MCP ping (no tool) | 0.30 |" in parts


def test_search_args() -> None:
    assert "capability_policy" not in search_args("q", "purpose:eval", 10, hybrid=False)
    assert search_args("q", "purpose:eval", 10, hybrid=True)["capability_policy"] == {
        "minimum_channels": "lexical_and_semantic", "network": "forbid"}


def test_concurrency_counts_and_parallelism() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    def search(q: str) -> None:
        time.sleep(0.002)  # sleeps release the GIL: four searchers overlap
        with lock:
            seen.append(q)

    res = concurrency(search, [f"q{i}" for i in range(8)], searchers=4, per_searcher=6)
    assert res["single"]["searches"] == 6 and res["threads"]["searches"] == 24
    assert len(seen) == 5 + 6 + 24  # warm-up + one searcher + four searchers
    assert res["threads"]["searches_per_s"] > 1.6 * res["single"]["searches_per_s"]
    ratio = compute_ratios({"concurrency": res})["concurrency"]
    assert ratio["measured"] and ratio["passed"]


def test_concurrency_reraises_a_searcher_error() -> None:
    def search(q: str) -> None:
        if q == "bad":
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        concurrency(search, ["ok"] * 6 + ["bad"], searchers=2, per_searcher=7)
