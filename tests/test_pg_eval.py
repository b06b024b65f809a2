"""`engram-memory eval` on a PostgreSQL store scores exactly as on DuckDB (issue 22 §2: every mode
runs on either backend). The lexical channel of the sample collection, through the real engine on
both backends: the same metrics. (To 1e-3, not the last digit: documents with equal scores are
ordered by record id, and a record id carries its ingest instant, so two ingests -- on one
backend too -- may order a tie apart.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _eval(out: Path, *extra: str | Path) -> dict[str, float]:
    done = subprocess.run(
        ["engram-memory", "eval", "--dataset", str(REPO / "eval" / "sample"), "--out", str(out),
         "--channels", "lexical", "--no-latency", "--no-progress", *map(str, extra)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "results.json").read_text())["runs"]["lexical"]


def test_eval_on_postgres_scores_as_on_duckdb(pg_database: str, tmp_path: Path) -> None:
    key = tmp_path / "master.key"
    init = subprocess.run(["engram-memory", "admin", "init-store", "--store", pg_database, "--master-key-out",
                           str(key)], capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    on_pg = _eval(tmp_path / "pg", "--store", pg_database, "--master-key-file", key)
    on_duckdb = _eval(tmp_path / "duckdb")
    assert on_pg.keys() == on_duckdb.keys()
    assert all(abs(on_pg[m] - on_duckdb[m]) < 1e-3 for m in on_pg), (on_pg, on_duckdb)
    assert on_pg["ndcg@10"] > 0.5  # a real ranking, not two empty ones
    # The store dir of a PostgreSQL run holds the node's projections, not a DuckDB file.
    assert not list((tmp_path / "pg" / "store").rglob("engram.duckdb"))
    assert list((tmp_path / "duckdb" / "store").rglob("engram.duckdb"))
