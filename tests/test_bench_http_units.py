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
    compute_ratios,
    markdown,
    parse_clients,
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


@pytest.mark.parametrize("argv, message", [
    (["--clients", "0"], "--clients: 0 is out of range"),
    (["--clients", "a,b"], "--clients takes positive integers"),
    (["--url", "http://127.0.0.1:1/mcp"], "go together"),
])
def test_usage_errors_are_one_line_exit_2(argv: list[str], message: str, tmp_path: Path) -> None:
    from engram_memory.server.cli import app

    result = CliRunner().invoke(app, ["bench-http", "--out", str(tmp_path / "out"), *argv])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("engram-memory: error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()  # nothing started, nothing written
