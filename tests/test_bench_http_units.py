"""The pure parts of eval/bench_http.py: client-count parsing, percentiles, summaries, ratios, outcomes.

No server and no timing here; the command's usage errors run through the real CLI (one line, exit 2).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from engram_memory.eval.bench_http import (
    TOOLS,
    ClientStats,
    Texts,
    UsageError,
    capture_arguments,
    classify,
    compare_configs,
    compute_ratios,
    finish,
    markdown,
    parse_clients,
    parse_nodes,
    percentile,
    run_summary,
    summarize,
)


def test_parse_clients() -> None:
    assert parse_clients("1,4,16") == [1, 4, 16]
    assert parse_clients(" 16, 4,4 ,1,") == [1, 4, 16]
    assert parse_clients("8") == [8]
    for bad in ("", ",", "0", "-1", "two", "1,x", "1.5", "100000"):
        with pytest.raises(UsageError):
            parse_clients(bad)


def test_percentile_matches_numpy_linear() -> None:
    rng = random.Random(1)
    for n in (1, 2, 3, 10, 101, 1000):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([10.0, 20.0, 30.0, 40.0], 99) == pytest.approx(39.7)
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize_in_milliseconds() -> None:
    assert summarize([]) == {"count": 0}
    s = summarize([0.001, 0.002, 0.003, 0.004])
    assert s["count"] == 4
    assert s["p50"] == pytest.approx(2.5) and s["mean"] == pytest.approx(2.5)
    assert s["p99"] == pytest.approx(3.97)


def _stats(samples: dict[str, list[float]], errors: dict[str, int] | None = None, rate_limited: int = 0,
           exceptions: dict[str, int] | None = None) -> ClientStats:
    st = ClientStats()
    for tool, values in samples.items():
        st.samples[tool].extend(values)
    for tool, n in (errors or {}).items():
        st.errors[tool] += n
        st.error_codes[f"{tool}:INTERNAL"] += n
    st.rate_limited = rate_limited
    st.exceptions.update(exceptions or {})
    return st


def test_run_summary_totals() -> None:
    a = _stats({"search": [0.010, 0.020], "get": [0.001]}, errors={"get": 1})
    b = _stats({"search": [0.030], "capture": [0.005]}, rate_limited=2, exceptions={"search:ReadTimeout": 1})
    row = run_summary(2, 2.0, [a, b], client_cpu_s=0.5, server_cpu_s=1.0)
    assert row["clients"] == 2 and row["calls"] == 5 and row["calls_per_s"] == 2.5
    assert set(row["tools"]) == set(TOOLS)
    assert row["tools"]["search"]["count"] == 3 and row["tools"]["search"]["p50"] == pytest.approx(20.0)
    assert row["tools"]["search"]["errors"] == 1  # the exception
    assert row["tools"]["get"]["errors"] == 1
    assert row["tools"]["forget"] == {"count": 0, "errors": 0}
    assert row["errors"] == 2 and row["rate_limited"] == 2
    assert row["error_codes"] == {"get:INTERNAL": 1} and row["exceptions"] == {"search:ReadTimeout": 1}
    assert row["client_cpu_ms_per_call"] == pytest.approx(100.0)
    assert row["server_cpu_ms_per_call"] == pytest.approx(200.0)
    assert row["store_cpu_ms_per_call"] is None  # DuckDB: inside the server process
    assert run_summary(2, 2.0, [a, b], store_cpu_s=0.25)["store_cpu_ms_per_call"] == pytest.approx(50.0)
    empty = run_summary(1, 0.0, [ClientStats()])
    assert empty["calls_per_s"] == 0.0 and empty["client_cpu_ms_per_call"] is None


def test_ratios_against_the_floor_and_the_first_count() -> None:
    runs = [run_summary(n, 1.0, [_stats({"search": [0.010 * n] * k, "get": [0.002]})])
            for n, k in ((1, 10), (4, 30), (16, 40))]
    floor = {"search": {"p50": 5.0}, "get": {"p50": 0.5}}
    ratios = {r["label"]: r for r in compute_ratios(runs, floor)}
    assert ratios["calls/s at 4 clients / at 1"]["value"] == pytest.approx(31 / 11)
    assert ratios["calls/s at 16 clients / at 1"]["value"] == pytest.approx(41 / 11)
    assert ratios["search p50 over HTTP at 1 clients / in-process"]["value"] == pytest.approx(2.0)
    assert ratios["search p50 over HTTP at 16 clients / in-process"]["value"] == pytest.approx(32.0)
    assert ratios["get p50 over HTTP at 4 clients / in-process"]["value"] == pytest.approx(4.0)
    missing = compute_ratios(runs[:1], {})
    assert [r["value"] for r in missing] == [None, None]  # no floor measured: reported, not raised
    assert compute_ratios([], floor) == []
    text = markdown({"runs": runs, "ratios": compute_ratios(runs, floor), "floor": {"channels": "lexical",
                                                                                   "records": 8, **floor}})
    assert "| 16 | 41 | 41.0 | 3.73× |" in text and "search p50 over HTTP at 1 clients / in-process | 2.00 |" in text


def test_classify_outcomes() -> None:
    ok = {"ok": True, "output": {"value": {}}}
    assert classify("search", ok) == "ok"
    assert classify("get", {"ok": False, "error": {"code": "NOT_FOUND"}}) == "NOT_FOUND"
    assert classify("search", {"ok": False, "error": {"code": "RATE_LIMITED"}}) == "rate_limited"
    assert classify("capture", {"ok": True, "output": {"value": {"status": "committed_pending"}}}) == "ok"
    assert classify("capture", {"ok": True, "output": {"value": {"status": "duplicate_exact"}}}) == \
        "status:duplicate_exact"
    accepted = {"ok": True, "output": {"value": {"outcome": {"status": "accepted"}}}}
    assert classify("request_admission", accepted) == "ok"
    rejected = {"ok": True, "output": {"value": {"outcome": {"status": "rejected"}}}}
    assert classify("request_admission", rejected) == "status:rejected"


def test_workload_arguments_are_valid_tool_inputs() -> None:
    from engram_memory.models.tools import parse_input

    texts = Texts()
    rng = random.Random(2)
    text = texts.text("seed 1", rng)
    assert text != texts.text("seed 2", rng)
    args = capture_arguments(text, "bh-test-cap-0000001")
    parse_input("capture", args)  # raises on anything the server would refuse
    query = texts.query(text, rng)
    assert 1 <= len(query.split()) <= 3 and all(w in text for w in query.split())


def test_parse_nodes() -> None:
    assert parse_nodes("1,2") == [1, 2]
    assert parse_nodes(" 2,1,2 ") == [1, 2]
    assert parse_nodes("3") == [3]
    for bad in ("", ",", "0", "9", "x", "1,two"):
        with pytest.raises(UsageError):
            parse_nodes(bad)


def _config(label: str, nodes: int, rows: list[tuple[int, float, float, float]]) -> dict:
    """A configuration's runs: per client count, calls in 1 s and search / get latencies (s)."""
    runs = [run_summary(n, 1.0, [_stats({"search": [search] * calls, "get": [get] * calls})])
            for n, calls, search, get in rows]
    return {"label": label, "backend": label.split("-")[0], "nodes": nodes, "runs": runs}


def test_configurations_compare_with_one_node_on_duckdb() -> None:
    duck = _config("duckdb-1", 1, [(1, 10, 0.010, 0.002), (4, 20, 0.040, 0.004)])
    pg1 = _config("postgresql-1", 1, [(1, 5, 0.020, 0.002), (4, 10, 0.080, 0.002)])
    pg2 = _config("postgresql-2", 2, [(1, 5, 0.015, 0.001), (4, 30, 0.020, 0.008)])
    rows = {(r["config"], r["clients"]): r for r in compare_configs([duck, pg1, pg2])}
    assert len(rows) == 6
    base = rows[("duckdb-1", 4)]
    assert base["calls_per_s_ratio"] == pytest.approx(1.0) and base["tools"]["search"]["p50_ratio"] == 1.0
    assert rows[("postgresql-1", 1)]["calls_per_s"] == 10 and rows[("postgresql-1", 1)]["calls_per_s_ratio"] == 0.5
    assert rows[("postgresql-1", 4)]["tools"]["search"]["p50"] == pytest.approx(80.0)
    assert rows[("postgresql-1", 4)]["tools"]["search"]["p50_ratio"] == pytest.approx(2.0)
    assert rows[("postgresql-2", 4)]["calls_per_s_ratio"] == pytest.approx(1.5)
    assert rows[("postgresql-2", 4)]["tools"]["get"]["p99_ratio"] == pytest.approx(2.0)
    assert rows[("postgresql-2", 1)]["nodes"] == 2 and rows[("postgresql-2", 1)]["backend"] == "postgresql"
    # A tool no configuration called, and a client count the baseline lacks: None, never a raise.
    assert rows[("postgresql-2", 1)]["tools"]["forget"]["p50_ratio"] is None
    odd = compare_configs([duck, _config("postgresql-2", 2, [(16, 5, 0.1, 0.1)])])
    assert odd[-1]["clients"] == 16 and odd[-1]["calls_per_s_ratio"] is None
    assert compare_configs([]) == []

    result = {"configs": [duck, pg1, pg2], "floor": {"search": {"p50": 5.0}, "get": {"p50": 1.0}}}
    finish(result)
    assert result["runs"] is duck["runs"]  # the baseline's rows stay where they always were
    assert result["ratios"][0]["label"] == "calls/s at 4 clients / at 1"
    text = markdown(result)
    assert "Side by side" in text and "| postgresql-2 | 4 | 60.0 (1.50×) |" in text
    pg2["runs"][0].update(server_cpu_ms_per_call=7.0, store_cpu_ms_per_call=2.5)
    assert "| 7.0 + 2.5 |" in markdown({**result, "comparison": compare_configs([duck, pg1, pg2])})
    assert text.index("| duckdb-1 | 1 |") < text.index("| postgresql-1 | 1 |") < text.index("| duckdb-1 | 4 |")
    alone = {"configs": [duck], "floor": {}}
    finish(alone)
    assert "comparison" not in alone and "Side by side" not in markdown(alone)


@pytest.mark.parametrize("argv, message", [
    (["--clients", "0"], "--clients: 0 is out of range"),
    (["--clients", "a,b"], "--clients takes positive integers"),
    (["--url", "http://127.0.0.1:1/mcp"], "go together"),
    (["--nodes", "2"], "--nodes needs --store"),
    (["--nodes", "0", "--store", "postgresql://u@127.0.0.1:1/db"], "--nodes: 0 is out of range"),
    (["--store", "postgresql://u:secret@127.0.0.1:1/db"], "password"),
    (["--store", "postgresql://u@127.0.0.1:1/db", "--url", "http://127.0.0.1:1/mcp", "--host-keys", "h",
      "--key", "k", "--token-file", "t"], "exclude each other"),
])
def test_usage_errors_are_one_line_exit_2(argv: list[str], message: str, tmp_path: Path) -> None:
    from engram_memory.server.cli import app

    result = CliRunner().invoke(app, ["bench-http", "--out", str(tmp_path / "out"), *argv])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("engram-memory: error: ") and message in lines[0]
    assert "secret" not in result.output
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
