"""CI smoke of ``engram-memory eval`` and ``bench`` through a tiny local typer app.

The default run: a 60-document SciFact subset (the judged-first subset keeps only fully judged
queries) and its first 20 queries, run twice (the second reuses the store and must score the same),
and a bench at one small size. Marked ``slow`` (``python -m pytest -m slow tests/test_eval_smoke.py``):
the 300-document, 100-query run with the LanceDB peer and the bench at 150 records. Torch is pinned to
one thread so a busy 2-core runner does not make every query encode spin. Full runs are documented
commands (eval/RESULTS.md), not CI.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from engram_memory.eval.cli import bench_cmd, eval_cmd  # noqa: E402

# CI lays shared/ beside the clone: <root>/../shared/data; ENGRAM_EVAL_DATA overrides.
DATA = Path(os.environ.get("ENGRAM_EVAL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
SCIFACT = DATA / "scifact"
TOLERANCE = 0.02  # hybrid may trail a channel by this much on a small subset
SMALL_FLOOR = 0.8  # the 60-document slice: nDCG@10 measured lexical 0.925, semantic 0.982, hybrid 0.950

pytestmark = pytest.mark.skipif(not (SCIFACT / "corpus.jsonl").exists(), reason="BEIR dev collections not present")


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("eval")(eval_cmd)
    app.command("bench")(bench_cmd)
    return app


def _peer_available() -> bool:
    from engram_memory.eval.peer_lancedb import unavailable

    return unavailable() is None


def checked_results(out: Path, docs: int, queries: int) -> dict:
    """An eval run's files and results.json, checked for shape; the results."""
    for name in ("results.json", "report.md", "report.png"):
        assert (out / name).stat().st_size > 0, name
    for ch in ("lexical", "semantic", "hybrid"):
        trec = (out / "runs" / f"scifact.{ch}.trec").read_text().splitlines()
        assert trec and len(trec[0].split()) == 6
    r = json.loads((out / "results.json").read_text())
    assert r["dataset"] == "scifact" and r["docs"] == docs and r["queries"] == queries
    assert r["admitted"] + len(r["rejected"]) == docs
    assert r["model"]["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert set(r["runs"]) == {"baseline", "lexical", "semantic", "hybrid"}
    for ch, scores in r["runs"].items():
        assert set(scores) == {"ndcg@10", "recall@10", "recall@100", "mrr@10", "map@100"}
        assert all(0.0 <= v <= 1.0 for v in scores.values()), (ch, scores)
    return r


def test_eval_small_slice_is_sane_and_deterministic(tmp_path: Path) -> None:
    """The default run's eval: every channel on 60 documents, then again from the reused store."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["eval", "--dataset", str(SCIFACT), "--out", str(out), "--limit-docs", "60", "--max-queries", "20",
            "--cache-dir", str(cache), "--threads", "1", "--no-latency", "--no-progress"]
    result = CliRunner().invoke(_app(), args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    r = checked_results(out, docs=60, queries=20)
    # a floor well under the measured figures: on 60 documents every channel finds most answers
    for ch in ("lexical", "semantic", "hybrid"):
        assert r["runs"][ch]["ndcg@10"] > SMALL_FLOOR, (ch, r["runs"])
    contributed = {ch: [c["channel"] for c in rec["channels"] if c["contributed"]]
                   for ch, rec in r["receipts"].items()}
    assert contributed == {"lexical": ["lexical"], "semantic": ["semantic"], "hybrid": ["lexical", "semantic"]}

    # Again from the same cache: the store is reused (no ingest) and every channel scores the same.
    out2 = tmp_path / "out2"
    again = CliRunner().invoke(_app(), [*args[:4], str(out2), *args[5:]], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    r2 = json.loads((out2 / "results.json").read_text())
    assert r2["store"]["reused"] is True and r2["store"]["dir"] == r["store"]["dir"]
    assert r2["runs"] == r["runs"]
    for ch in ("lexical", "semantic", "hybrid"):
        assert (out2 / "runs" / f"scifact.{ch}.trec").read_text() == (out / "runs" / f"scifact.{ch}.trec").read_text()


@pytest.mark.slow
def test_eval_smoke(tmp_path: Path) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["eval", "--dataset", str(SCIFACT), "--out", str(out), "--limit-docs", "300", "--max-queries", "100",
            "--cache-dir", str(cache), "--threads", "1", "--no-latency", "--no-progress"]
    if _peer_available():
        args += ["--peer", "lancedb"]
    t0 = time.perf_counter()
    result = CliRunner().invoke(_app(), args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    first_s = time.perf_counter() - t0

    r = checked_results(out, docs=300, queries=100)
    # sane, not just bounded: the subset is easy, every channel must find most answers
    assert r["runs"]["lexical"]["ndcg@10"] > 0.6 and r["runs"]["semantic"]["ndcg@10"] > 0.6
    for ch in ("lexical", "semantic"):
        for m in ("ndcg@10", "recall@100"):
            assert r["runs"]["hybrid"][m] >= r["runs"][ch][m] - TOLERANCE, (ch, m, r["runs"])
    # receipts say which channels ranked
    contributed = {ch: [c["channel"] for c in rec["channels"] if c["contributed"]]
                   for ch, rec in r["receipts"].items()}
    assert contributed == {"lexical": ["lexical"], "semantic": ["semantic"], "hybrid": ["lexical", "semantic"]}
    assert r["receipts"]["hybrid"]["fusion"]["method"] in ("rrf", "dbsf", "convex")
    if "peer" in r:
        assert set(r["peer"]["runs"]) == {"lexical", "semantic", "hybrid"}
        # same vectors, exact search on both sides: the dense runs must agree closely
        assert abs(r["peer"]["runs"]["semantic"]["ndcg@10"] - r["runs"]["semantic"]["ndcg@10"]) < 0.01
        assert r["peer"]["ratios"]

    # Second run: the store is reused (no ingest, no re-embedding) and only lexical is scored.
    out2 = tmp_path / "out2"
    t0 = time.perf_counter()
    again = CliRunner().invoke(_app(), ["eval", "--dataset", str(SCIFACT), "--out", str(out2), "--limit-docs", "300",
                                        "--max-queries", "20", "--channels", "lexical", "--cache-dir", str(cache),
                                        "--no-latency", "--no-progress"], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    r2 = json.loads((out2 / "results.json").read_text())
    assert r2["store"]["reused"] is True and r2["store"]["dir"] == r["store"]["dir"]
    assert time.perf_counter() - t0 < first_s


@pytest.mark.parametrize(("size", "grown", "queries", "ops", "ingest"), [
    (40, 50, 5, 2, 3),  # the default run's bench
    pytest.param(150, 170, 15, 5, 10, marks=pytest.mark.slow),
])
def test_bench(tmp_path: Path, size: int, grown: int, queries: int, ops: int, ingest: int) -> None:
    """One size through every part of the bench (the MCP ratios through a real stdio server and SDK
    client), then --resume grows the same store on without capturing any text twice."""
    out = tmp_path / "bench"
    result = CliRunner().invoke(_app(), ["bench", "--out", str(out), "--sizes", str(size), "--queries", str(queries),
                                         "--ops-sample", str(ops), "--threads", "1", "--no-progress",
                                         "--ingest-docs", str(ingest)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    b = json.loads((out / "bench.json").read_text())
    row = b["sizes"][str(size)]
    assert row["records"] == size + ops  # the ops sample's captures stay
    for run in ("lexical", "hybrid", "hybrid_precomputed_vector", "query_encode"):
        assert row["search"][run]["p50"] > 0, run
    assert row["capture"]["ops_per_s"] > 0 and row["admission"]["ops_per_s"] > 0
    assert row["rebuild"]["seconds_per_10k"] > 0 and row["peak_rss_mib"] > 0
    assert b["machine"]["cores"] and b["machine"]["python"]
    assert f"| {size} |" in (out / "bench.md").read_text()
    ratios = row["ratios"]
    assert all("target" in entry for entry in ratios.values()), ratios
    mcp = [e for e in ratios.values() if "MCP" in e.get("label", "") or "serve" in e.get("label", "")]
    assert len(mcp) == 4 and all(e["measured"] for e in mcp), ratios  # searches, ingest, memory
    assert row["mcp"]["ingest"]["documents"] == ingest and row["ingest_floor"]["documents"] == ingest
    # where a search's time goes, stage by stage: every stage ran inside the searches it timed
    stages = row["stages"]
    assert stages["searches"] == queries and stages["whole_p50"] > 0
    assert all(ms > 0 for label, ms in stages["stages"].items() if label != "rerank stage"), stages
    assert "stage: fusion" in (out / "bench.md").read_text()
    # --resume: the records and those the host ingested stay, one more ops sample, then the larger size
    result = CliRunner().invoke(_app(), ["bench", "--out", str(out), "--sizes", f"{size},{grown}", "--queries",
                                         str(max(queries // 3, 1)), "--ops-sample", str(ops // 2), "--threads", "1",
                                         "--no-progress", "--resume", "--no-mcp"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    b = json.loads((out / "bench.json").read_text())
    resumed = size + ops + ingest + ops // 2
    assert b["sizes"][str(size)]["bulk_ingest"]["records"] == 0 and b["sizes"][str(size)]["records"] == resumed
    assert b["sizes"][str(grown)]["bulk_ingest"]["records"] == grown - resumed
    assert b["sizes"][str(grown)]["records"] == grown + ops // 2
    assert b["sizes"][str(grown)]["rebuild"]["records"] == grown + ops // 2
