"""The crash harness: a few real kill-and-recover trials, and each check failing on a planted fault.

The documented full run is ``engram-memory crash --trials 100 --seed 1 --clients 4 --out out/crash``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from engram_memory.checks.crash import Attempt, Op, check_answers, check_store, ledger_id, run_crash, run_trial
from engram_memory.eval.bench_http import make_keys
from engram_memory.store.maintenance.verify import JOURNAL_CORRUPT, verify_store


def test_trials_survive_and_are_written(tmp_path: Path) -> None:
    result = run_crash(2, seed=11, clients=3, out=tmp_path / "out", max_kill_s=1.0, progress=False)
    totals = result["totals"]
    assert totals["trials"] == 2 and totals["survived"] == 2, [r.failures for r in result["results"]]
    assert totals["operations"] > 0 and totals["calls"] >= totals["operations"]
    doc = json.loads((tmp_path / "out" / "crash.json").read_text())
    assert doc["totals"]["survived"] == 2 and len(doc["trials"]) == 2
    assert all(t["verify"]["ok"] for t in doc["trials"])
    assert not (tmp_path / "out" / "trials").exists()  # passing trials leave nothing behind


@pytest.fixture(scope="module")
def kept_trial(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Op], set[tuple[str, str, str]]]:
    root = tmp_path_factory.mktemp("crash")
    make_keys(root / "keys")
    result, ops, before = run_trial(0, 5, 3, root / "keys", root, max_kill_s=1.0, keep=True)
    assert result.ok, result.failures
    return root / "trial-0000", ops, before


def planted_copy(kept: tuple[Path, list[Op], set[tuple[str, str, str]]], tmp_path: Path) -> Path:
    dst = tmp_path / "data"
    shutil.copytree(kept[0], dst, ignore=shutil.ignore_patterns("engram.sock"))
    return dst


def test_kept_trial_is_clean(kept_trial) -> None:
    data, ops, before = kept_trial
    assert check_answers(ops, before) == [] and check_store(data, ops) == [] and verify_store(data).ok


def test_store_check_fails_on_a_duplicated_or_lost_operation(kept_trial, tmp_path: Path) -> None:
    data = planted_copy(kept_trial, tmp_path)
    con = duckdb.connect(str(data / "engram.duckdb"))
    # A second candidate for one capture: applied twice.
    con.execute("INSERT INTO candidates SELECT 'candidate_dup' || candidate_id, scope_ref, principal, state,"
                " created_cursor, recorded_at, payload_digest, record_digest, NULL, NULL, outcome"
                " FROM candidates LIMIT 1")
    con.close()
    failures = check_store(data, kept_trial[1])
    assert any("1 extra" in f for f in failures)
    assert not verify_store(data).ok  # the verifier agrees: a candidate without its capture event

    data2 = tmp_path / "lost"
    shutil.copytree(kept_trial[0], data2, ignore=shutil.ignore_patterns("engram.sock"))
    con = duckdb.connect(str(data2 / "engram.duckdb"))
    con.execute("DELETE FROM idempotency WHERE rowid = (SELECT min(rowid) FROM idempotency)")
    con.close()
    assert any("ledger rows" in f for f in check_store(data2, kept_trial[1]))


def test_verify_fails_on_a_tampered_journal(kept_trial, tmp_path: Path) -> None:
    data = planted_copy(kept_trial, tmp_path)
    con = duckdb.connect(str(data / "engram.duckdb"))
    body = con.execute("SELECT body FROM journal ORDER BY scope_ref, cursor LIMIT 1").fetchone()[0]
    event = json.loads(body)
    event["recorded_at"] = "2000-01-01T00:00:00.000Z"
    con.execute("UPDATE journal SET body = ? WHERE body = ?", [json.dumps(event), body])
    con.close()
    report = verify_store(data)
    assert report.code == JOURNAL_CORRUPT


def _op(tool: str = "capture", *attempts: Attempt) -> Op:
    op = Op("p:1", 0, "crash-t0", "p", tool, {"idempotency_key": "crash-key-0000001"}, list(attempts))
    return op


FIRST = {"status": "committed_pending", "candidate_id": "candidate_a", "record_digest": "sha256:r", "cursor": "3",
         "transaction_receipt_digest": "sha256:t"}
REPLAY = {**FIRST, "status": "duplicate_exact"}


def test_answer_checks_fail_on_planted_lies() -> None:
    ok = _op("capture", Attempt("load", "ok", value=FIRST))
    applied = {ledger_id(ok)}
    assert check_answers([ok], applied) == []
    # Answered before the kill, yet the dead server's ledger does not hold it: lost.
    assert any("lost" in f for f in check_answers([ok], set()))
    # Unanswered at the kill, committed before it, yet the retry applied it afresh: a lie.
    lie = _op("capture", Attempt("load", "indefinite", "CancelledError"), Attempt("recovery", "ok", value=FIRST))
    assert any("lie" in f for f in check_answers([lie], applied))
    assert check_answers([lie], set()) == []  # (not committed before: the fresh answer is the truth)
    # Unanswered, the retry says "already applied", but nothing had committed: a lie the other way.
    ghost = _op("capture", Attempt("load", "indefinite", "ConnectError"), Attempt("recovery", "ok", value=REPLAY))
    assert any("every answer is a replay" in f for f in check_answers([ghost], set()))
    assert check_answers([ghost], applied) == []
    twice = _op("capture", Attempt("load", "ok", value=FIRST), Attempt("recovery", "ok", value=FIRST))
    assert any("applied 2 times" in f for f in check_answers([twice], applied))
    differ = _op("capture", Attempt("load", "ok", value=FIRST),
                 Attempt("recovery", "ok", value={**REPLAY, "cursor": "4"}))
    assert any("disagree" in f for f in check_answers([differ], applied))
    hung = _op("capture", Attempt("load", "indefinite", "CancelledError"),
               Attempt("recovery", "indefinite", "STORE_UNAVAILABLE"))
    assert any("no definitive answer" in f for f in check_answers([hung], applied))
    wrong = _op("withdraw", Attempt("load", "error", "ALREADY_TERMINAL"))
    assert any("unexpected answer" in f for f in check_answers([wrong], applied))


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "crash", "--out", str(tmp_path / "o"),
                           "--transport", "carrier-pigeon"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "only http" in done.stderr


# ---- on PostgreSQL, with the operations spread over two nodes ---------------------------------


def test_two_nodes_on_postgres_survive_and_clean_up(pg_url: str, tmp_path: Path) -> None:
    import psycopg

    result = run_crash(2, seed=11, clients=4, out=tmp_path / "out", max_kill_s=1.0, progress=False, store=pg_url,
                       nodes=2)
    totals = result["totals"]
    assert totals["trials"] == 2 and totals["survived"] == 2, [r.failures for r in result["results"]]
    assert totals["operations"] > 0 and totals["calls"] >= totals["operations"]
    doc = json.loads((tmp_path / "out" / "crash.json").read_text())
    assert doc["backend"] == "postgresql" and doc["nodes"] == 2
    for trial in doc["trials"]:
        assert trial["nodes"] == 2 and trial["killed_node"] in (0, 1)
        # Two scopes, each checked on both nodes against a fresh rebuild.
        assert trial["verify"]["ok"] and trial["verify"]["projections"] == ["equal"] * 4
    with psycopg.connect(pg_url, autocommit=True) as conn:  # passing trials drop their databases
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'engram_crash_s11_%'").fetchall()
    assert left == []
    assert not (tmp_path / "out" / "trials").exists()


@pytest.fixture(scope="module")
def kept_pg_trial(pg_url: str, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("crash-pg")
    make_keys(root / "keys")
    # Seed 7 kills at 2.7 s: time enough to admit records (the projection fault needs one).
    from engram_memory.store.postgres.databases import drop_database

    result, ops, before = run_trial(0, 7, 3, root / "keys", root, max_kill_s=3.0, keep=True, store=pg_url, nodes=2)
    trial = root / "trial-0000"
    url = (trial / "store.url").read_text().strip()
    try:
        assert result.ok, result.failures
        assert result.by_tool.get("request_admission"), "the planted projection fault needs an admitted record"
        yield trial, url, ops, before
    finally:
        drop_database(pg_url, url)


def test_three_nodes_under_faults_survive_and_drain(pg_url: str, tmp_path: Path) -> None:
    """A short fault run (issue 38): three nodes, one SIGKILLed, another frozen by SIGSTOP, a
    REPEATABLE READ reader holding data_keys through the load; then every check of a trial, and
    with every node up no answer pending and no owed data key left within DRAIN_BOUND_S.
    The long run's command: docs/postgresql.md."""
    result = run_crash(1, seed=5, clients=4, out=tmp_path / "out", max_kill_s=3.0, progress=False, store=pg_url,
                       nodes=3, faults=("stop", "reader"))
    totals = result["totals"]
    assert totals["survived"] == 1, [r.failures for r in result["results"]]
    trial = json.loads((tmp_path / "out" / "crash.json").read_text())["trials"][0]
    assert trial["faults"] == ["stop", "reader"] and trial["nodes"] == 3
    assert trial["stopped_node"] not in (None, trial["killed_node"]) and trial["stopped_s"] >= 0.5
    assert trial["drained_s"] is not None and trial["verify"]["ok"]
    assert trial["verify"]["projections"] == ["equal"] * 6  # two scopes on each of the three nodes


def _pg_copy(pg_url: str, url: str) -> str:
    """A copy of the kept trial's database (CREATE DATABASE ... TEMPLATE), to plant a fault in."""
    from urllib.parse import urlsplit

    import psycopg

    name = urlsplit(url).path.lstrip("/")
    copy = f"{name}_planted"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{copy}"'.encode())
        conn.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{name}"'.encode())
    return urlsplit(url)._replace(path="/" + copy).geturl()


def test_postgres_checks_fail_on_planted_faults(kept_pg_trial, pg_url: str, tmp_path: Path) -> None:
    import psycopg

    from engram_memory.checks.pg_verify import verify_pg_store
    from engram_memory.store.postgres.databases import drop_database

    trial, url, ops, before = kept_pg_trial
    nodes = [trial / "node-0", trial / "node-1"]
    assert check_answers(ops, before) == [] and check_store(url, ops) == []
    clean = verify_pg_store(url, trial / "master.key", nodes, tmp_path / "v0")
    assert clean.ok and clean.projections == ["equal"] * 4, clean.problems

    copy = _pg_copy(pg_url, url)
    try:
        with psycopg.connect(copy, autocommit=True) as conn:
            # A second candidate for one capture (applied twice), a lost ledger row, a tampered event.
            conn.execute("INSERT INTO candidates SELECT 'candidate_dup' || candidate_id, scope_ref, principal, state,"
                         " created_cursor, recorded_at, payload_digest, record_digest, NULL, NULL, outcome"
                         " FROM candidates LIMIT 1")
            conn.execute("DELETE FROM idempotency WHERE ctid = (SELECT min(ctid) FROM idempotency)")
            conn.execute("UPDATE journal SET body = replace(body, '\"recorded_at\":\"', '\"recorded_at\":\"1')"
                         " WHERE cursor = 1")
        failures = check_store(copy, ops)
        assert any("1 extra" in f for f in failures) and any("ledger rows" in f for f in failures)
        # Node 1's projections lost: not caught up where a record was admitted; node 0's still compare equal.
        shutil.rmtree(nodes[1] / "projections")
        planted = verify_pg_store(copy, trial / "master.key", nodes, tmp_path / "v1")
        problems = " | ".join(planted.problems)
        assert "does not hash to its event_hash" in problems, problems
        assert "capture events" in problems  # the duplicated candidate has none of its own
        assert "node 1:" in problems and "not caught up" in problems
        assert planted.projections[::2] == ["equal", "equal"]  # (scope by scope: node 0, node 1)
        assert "stale" in planted.projections
    finally:
        drop_database(pg_url, copy)


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "2"], "needs --store"),
    (["--store", "postgresql://u:secret@127.0.0.1:1/db"], "password"),
    (["--store", "mysql://u@h/db"], "not a PostgreSQL URL"),
    (["--faults", "stop"], "--faults needs --nodes 2"),
    (["--faults", "stop,partition", "--nodes", "3", "--store", "postgresql://u@127.0.0.1:1/db"],
     "--faults partition: choose among stop, reader"),
])
def test_store_usage_errors_are_one_line(argv: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "crash", "--out", str(tmp_path / "o"),
                           *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert "secret" not in done.stderr
