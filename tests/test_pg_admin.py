"""`engram-memory admin ...` on a PostgreSQL store (issue 22 §3): migrate, verify, history, candidates,
expire, adjudicate and rotate-master-key, through the real CLI (subprocesses) and a real PostgreSQL.

Stores are written by real engines at a frozen instant (searches are comparable byte for byte);
nodes of the PostgreSQL store are real engines in this process (or a real `serve` subprocess, for
the launch refusal). Every refusal is checked as one line and its exit code, next to a control
that passes.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engram_memory.models.canonical import canonical_text
from engram_memory.models.errors import EngramError
from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.crypto import key_files
from engram_memory.store.core.engine import Engine
from tests.conftest import ALL, CONTEXT, REPO, fresh_database
from tests.store_fixtures import T0, call, capture_args, ctx, forget_args
from tests.test_admin_cli import MARKER, QUERIES, SCOPE, TEXTS, admin, fill_engine, ok_json, refused

SCOPE_REF = "tenant:acme/workspace:main"
PURPOSE = {"purpose_ref": "purpose:test"}


def duck_engine(data_dir: Path, *, semantic: bool = False) -> Engine:
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=semantic), clock=lambda: T0)
    if semantic:
        assert engine.wait_semantic(120)
    return engine


def pg_engine(node_dir: Path, url: str, key_file: Path, *, semantic: bool = False) -> Engine:
    """A node of the PostgreSQL store (its own data dir: its projections and node id)."""
    engine = Engine.open(EngineSettings(data_dir=node_dir, store=url, master_key_file=key_file, semantic=semantic),
                         clock=lambda: T0)
    if semantic:
        assert engine.wait_semantic(120)
    return engine


def fill(engine: Engine, *, held: int = 1, expiring: bool = False) -> dict[str, Any]:
    """tests/test_admin_cli.py's store on any engine, plus which records are live and forgotten."""
    out = fill_engine(engine, held=held, expiring=expiring)
    out["live"] = out["records"][: len(out["records"]) - held]
    out["forgotten"] = out["records"][len(out["records"]) - held:]
    return out


def answers(engine: Engine, seeded: dict[str, Any]) -> list[Any]:
    """Every probe search's value, every live record's get, and what a get of a forgotten one says."""
    values: list[Any] = [call(engine, "search", ctx(), {"query": q, **PURPOSE}) for q in QUERIES]
    values += [call(engine, "get", ctx(), {"record_id": rid, **PURPOSE}) for rid in seeded["live"]]
    for rid in seeded["forgotten"]:
        with pytest.raises(EngramError) as err:
            call(engine, "get", ctx(), {"record_id": rid, **PURPOSE})
        values.append(err.value.code)
    return values


def ranked(values: list[Any]) -> list[list[tuple[str, float]]]:
    return [[(hit["record"]["record_id"], hit["score"]) for hit in v["records"]] for v in values[:len(QUERIES)]]


def migrate(data_dir: Path, url: str, key_out: Path) -> Any:
    return ok_json(["migrate", "--from", str(data_dir), "--to", url, "--master-key-out", str(key_out)])


def with_password(url: str) -> str:
    return url.replace("://", "://engram:hunter2hunter2@", 1) if "@" not in url else \
        url.replace("@", ":hunter2hunter2@", 1)


def pg(url: str, key_file: Path | None) -> list[str]:
    return ["--store", url] + (["--master-key-file", str(key_file)] if key_file is not None else [])


def sql(url: str, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params or [])
        return cur.fetchall() if cur.description else []


@pytest.fixture
def migrated(tmp_path: Path, pg_database: str) -> dict[str, Any]:
    """A DuckDB store (two candidates held for adjudication, a record expiring at T0+1h) migrated
    into the test's PostgreSQL database."""
    engine = duck_engine(tmp_path / "duck")
    try:
        seeded = fill(engine, held=2, expiring=True)
    finally:
        engine.close()
    key = tmp_path / "master.key"
    migrate(tmp_path / "duck", pg_database, key)
    return {**seeded, "url": pg_database, "key": key, "duck": tmp_path / "duck"}


# ---- migrate ------------------------------------------------------------------------------------


def test_migrate_answers_the_same_searches_with_the_same_scores(tmp_path: Path, pg_database: str) -> None:
    duck, key = tmp_path / "duck", tmp_path / "keys" / "master.key"
    key.parent.mkdir()
    engine = duck_engine(duck, semantic=True)  # embeddings stored at admission: they must travel too
    try:
        seeded = fill(engine)
        before = answers(engine, seeded)
        embeddings = engine.embedding_count()
        # refused while a server holds the directory: one line, no key file, nothing in PostgreSQL
        refused(admin(["migrate", "--from", str(duck), "--to", pg_database, "--master-key-out", str(key)]), 1,
                "STORE_BUSY: ")
    finally:
        engine.close()
    assert embeddings == len(seeded["live"])  # the forgotten record's embedding went with it
    assert any(ch["channel"] == "semantic" and ch["contributed"] for v in before[:len(QUERIES)]
               for ch in v["rank_receipt"]["channels"])  # the comparison below covers the vectors
    refused(admin(["migrate", "--from", str(duck), "--to", with_password(pg_database), "--master-key-out",
                   str(key)]), 2, "the store URL carries a password")
    refused(admin(["migrate", "--from", str(tmp_path / "nowhere"), "--to", pg_database, "--master-key-out",
                   str(key)]), 2, "no engram-memory store at")
    assert not key.exists() and list(key.parent.iterdir()) == []
    assert sql(pg_database, "SELECT to_regclass('store_identity') IS NOT NULL") == [(False,)]
    duck_history = ok_json(["history", "--data-dir", str(duck), "--scope", SCOPE])
    duck_candidates = ok_json(["candidates", "--data-dir", str(duck), "--scope", SCOPE])

    report = migrate(duck, pg_database, key)
    assert report["rows"]["journal"] == len(duck_history["events"]) == 11
    assert report["rows"]["embeddings"] == embeddings and report["rows"]["tombstoned_payloads"] == 1
    # keys of the 3 live records and of the 2 pending candidates; the forgotten record's is gone
    assert report["data_keys"] == 5 and report["unreferenced_key_files"] == 0
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    assert key.read_bytes() != (duck / "master.key").read_bytes()  # a new master key, not the DuckDB one
    wrapped = {ref: bytes(blob) for ref, blob in sql(pg_database, "SELECT key_ref, wrapped FROM data_keys")}
    on_disk = {"local:key-" + p.name: p.read_bytes() for p in key_files(duck / "keys")}
    assert set(wrapped) == set(on_disk) and all(wrapped[r] != on_disk[r] for r in wrapped)  # re-wrapped
    # refused into a store that is initialised now: exit 1, one line, no second key file
    refused(admin(["migrate", "--from", str(duck), "--to", pg_database, "--master-key-out",
                   str(tmp_path / "second.key")]), 1, "STORE_REFUSED: the PostgreSQL store is already initialised")
    assert not (tmp_path / "second.key").exists()

    checked = ok_json(["verify", *pg(pg_database, key)])
    assert checked["ok"] is True and checked["scopes_checked"] == [SCOPE] and checked["key_files"] == 5
    assert ok_json(["history", *pg(pg_database, None), "--scope", SCOPE]) == duck_history
    assert ok_json(["candidates", *pg(pg_database, key), "--scope", SCOPE]) == duck_candidates
    # the store's embedding model goes with it (store/core/embedding_model.py)
    recorded = sql(pg_database, "SELECT value FROM meta WHERE key = 'embedding_model'")
    assert recorded and json.loads(recorded[0][0])["model"] == "all-MiniLM-L6-v2"

    node = pg_engine(tmp_path / "node", pg_database, key, semantic=True)
    try:
        after = answers(node, seeded)
        assert node.embedding_count() == embeddings  # nothing re-embedded: the stored vectors were copied
    finally:
        node.close()
    assert ranked(after) == ranked(before) and any(ranked(before))
    assert canonical_text(after) == canonical_text(before)  # every value, receipts included, byte for byte
    assert after[-1] == "NOT_FOUND"  # the forgotten record stays forgotten


def test_migrate_refuses_a_target_that_is_not_empty(tmp_path: Path, pg_database: str) -> None:
    engine = duck_engine(tmp_path / "duck")
    try:
        fill(engine, held=0)
    finally:
        engine.close()
    from engram_memory.store.postgres.backend import connect_pool
    from engram_memory.store.postgres.schema import migrate as schema

    pool = connect_pool(pg_database, 1)
    try:
        with pool.connection() as conn:
            schema(conn)  # the schema alone is empty: a row anywhere is not
            conn.execute("INSERT INTO replay VALUES ('kid', 'jti', 1)")
    finally:
        pool.close()
    proc = admin(["migrate", "--from", str(tmp_path / "duck"), "--to", pg_database, "--master-key-out",
                  str(tmp_path / "k")])
    refused(proc, 1, "STORE_REFUSED: the PostgreSQL store is not empty (table replay has rows)")
    assert not (tmp_path / "k").exists() and sql(pg_database, "SELECT count(*) FROM journal") == [(0,)]
    sql(pg_database, "DELETE FROM replay")
    # the audit trail travels too (a served store has one; the engine alone writes none)
    import duckdb

    audit = [("aud_1", "2026-05-28T20:26:40.000Z", SCOPE_REF, "alice", "agent-1", "s-1", "search", True, None,
              None, "jti-1"),
             ("aud_2", "2026-05-28T20:26:41.000Z", SCOPE_REF, "alice", "agent-1", "s-1", "get", False, "NOT_FOUND",
              "idk-1", None)]
    con = duckdb.connect(str(tmp_path / "duck" / "engram.duckdb"))
    con.executemany("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [list(row) for row in audit])
    con.close()
    report = migrate(tmp_path / "duck", pg_database, tmp_path / "k")  # the control
    assert report["rows"]["journal"] == 9 and report["rows"]["audit"] == 2
    assert sql(pg_database, "SELECT audit_id, called_at, scope_ref, principal, agent_id, session, tool, ok, code,"
                            " idk, context_jti FROM audit ORDER BY audit_id") == audit


# ---- verify, history, candidates ------------------------------------------------------------------


def test_verify_on_postgres_passes_then_reports_what_was_broken(migrated: dict[str, Any]) -> None:
    url, key = migrated["url"], migrated["key"]
    assert ok_json(["verify", *pg(url, key)])["ok"] is True
    table = admin(["verify", *pg(url, key), "--scope", SCOPE])
    assert table.returncode == 0 and "ok" in table.stdout, table.stderr
    # launch mistakes: exit 2, one line each
    wrong = key.with_name("wrong.key")
    wrong.write_bytes(secrets.token_bytes(32))
    refused(admin(["verify", *pg(url, wrong)]), 2, f"the master key file {wrong} is not this store's master key")
    refused(admin(["verify", *pg(url, None)]), 2, "--store needs --master-key-file")
    refused(admin(["verify", *pg(url, key), "--data-dir", str(migrated["duck"])]), 2, "give --data-dir")
    refused(admin(["verify", *pg(url, key), "--scope", "acme/other"]), 2, "no scope acme/other")
    refused(admin(["verify", *pg(with_password(url), key)]), 2, "the store URL carries a password")

    # a live record's data key gone: the rows no longer hold what they say
    live = migrated["live"][0]
    (ref, blob), = sql(url, "SELECT d.key_ref, d.wrapped FROM data_keys d JOIN records r USING (key_ref)"
                            " WHERE r.record_id = %s", [live])
    sql(url, "DELETE FROM data_keys WHERE key_ref = %s", [ref])
    proc = admin(["verify", *pg(url, key), "--json"])
    assert proc.returncode == 1 and proc.stderr.startswith("engram-memory: error: STORE_INCONSISTENT: ")
    report = json.loads(proc.stdout)
    assert report["code"] is None and any(live in p and "without their key" in p for p in report["problems"])
    sql(url, "INSERT INTO data_keys (key_ref, wrapped) VALUES (%s, %s)", [ref, blob])
    assert ok_json(["verify", *pg(url, key)])["ok"] is True  # the control: put back, it verifies

    # a journal body edited: the chain no longer verifies
    sql(url, "UPDATE journal SET body = replace(body, '\"operation\":\"accept\"', '\"operation\":\"reject\"')"
             " WHERE cursor = 2")
    proc = admin(["verify", *pg(url, key)])
    assert proc.returncode == 1 and "JOURNAL_CORRUPT" in proc.stdout and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("engram-memory: error: JOURNAL_CORRUPT: ") and proc.stderr.count("\n") == 1


def test_verify_refuses_a_database_that_is_not_a_store(pg_database: str, tmp_path: Path) -> None:
    key = tmp_path / "k"
    key.write_bytes(secrets.token_bytes(32))
    refused(admin(["verify", *pg(pg_database, key)]), 2, "the PostgreSQL store is not initialised")
    refused(admin(["history", *pg(pg_database, None), "--scope", SCOPE]), 2, "the PostgreSQL store is not initialised")


def test_history_and_candidates_on_postgres_never_show_content(migrated: dict[str, Any]) -> None:
    url = migrated["url"]
    env = {**os.environ, "ENGRAM_STORE": url, "HF_HUB_OFFLINE": "1"}  # the store named by the environment
    for command in ("history", "candidates"):
        for extra in ([], ["--json"]):
            proc = admin([command, "--scope", SCOPE, *extra], env)
            assert proc.returncode == 0, proc.stderr
            assert MARKER not in proc.stdout and "DuckDB for the lifecycle" not in proc.stdout
    listed = ok_json(["candidates", "--scope", SCOPE], env)["candidates"]
    assert {c["candidate_id"]: c["held_for_adjudication"] for c in listed} == {
        **{cid: True for cid in migrated["held"]}, migrated["pending"]: False}
    events = ok_json(["history", "--scope", SCOPE, "--limit", "3"], env)["events"]
    assert [e["cursor"] for e in events] == [13, 14, 15] and events[1]["previous_event_hash"] == events[0]["event_hash"]
    assert MARKER.encode() in b"".join(  # the check can fail: the marker is there, one decryption away
        open_bodies(url, migrated["key"]))
    refused(admin(["history", "--scope", "acme/other"], env), 2, "no scope acme/other")


def open_bodies(url: str, key_file: Path) -> list[bytes]:
    node = pg_engine(key_file.parent / "reader", url, key_file)
    try:
        return [json.dumps(r).encode() for r in node.live_records(SCOPE_REF)]
    finally:
        node.close()


# ---- expire, adjudicate: against the live store, nodes running ------------------------------------


def test_expire_and_adjudicate_on_the_live_store_reach_a_running_node(migrated: dict[str, Any],
                                                                      tmp_path: Path) -> None:
    url, key = migrated["url"], migrated["key"]
    keep, drop = migrated["held"]
    node = pg_engine(tmp_path / "node", url, key)  # a serving node, running throughout
    try:
        assert call(node, "get", ctx(), {"record_id": migrated["expiring"], **PURPOSE})  # current at T0
        early = {**os.environ, "ENGRAM_CLOCK_MS": str(T0 + 60_000)}
        assert ok_json(["expire", *pg(url, key)], early)["total"] == 0  # not due yet
        late = {**os.environ, "ENGRAM_CLOCK_MS": str(T0 + 7_200_000)}
        done = ok_json(["expire", *pg(url, key), "--scope", SCOPE], late)
        assert done == {"expired": {SCOPE: [migrated["expiring"]]}, "total": 1}
        assert ok_json(["expire", *pg(url, key)], late)["total"] == 0  # done once
        # the node reads at T0, before expires_at: only the journalled expiry hides the record
        with pytest.raises(EngramError) as err:
            call(node, "get", ctx(), {"record_id": migrated["expiring"], **PURPOSE})
        assert err.value.code == "NOT_FOUND"

        head = sql(url, "SELECT high_water FROM scopes")
        refused(admin(["adjudicate", *pg(url, key), "--candidate", migrated["pending"], "--accept",
                       "--reason", "the policy decides this one"]), 1, "NOT_ADJUDICABLE: ")
        refused(admin(["adjudicate", *pg(url, key), "--candidate", "candidate_" + "0" * 64, "--accept",
                       "--reason", "why"]), 2, "no candidate")
        refused(admin(["adjudicate", *pg(url, key), "--candidate", keep, "--accept",
                       "--reason", "password=hunter2hunter2"]), 2, "--reason looks like it carries a secret")
        assert sql(url, "SELECT high_water FROM scopes") == head  # nothing journalled by a refusal
        accepted = ok_json(["adjudicate", *pg(url, key), "--candidate", keep, "--accept",
                            "--reason", "The user asked to keep it after all"])
        rejected = ok_json(["adjudicate", *pg(url, key), "--candidate", drop, "--reject",
                            "--reason", "Forgotten on purpose; stays forgotten"])
        assert accepted["status"] == "accepted" and rejected["status"] == "rejected"
        refused(admin(["adjudicate", *pg(url, key), "--candidate", keep, "--reject", "--reason", "changed my mind"]),
                1, "NOT_ADJUDICABLE: ")  # decided once
        # the running node serves the accepted record at once (it catches up from the journal)
        got = call(node, "get", ctx(), {"record_id": accepted["record_id"], **PURPOSE})
        hits = call(node, "search", ctx(), {"query": TEXTS[-1], **PURPOSE})
        assert got["record"]["components"][0]["text"] == TEXTS[-1]
        assert hits["records"][0]["record"]["record_id"] == accepted["record_id"]
    finally:
        node.close()
    events = ok_json(["history", *pg(url, key), "--scope", SCOPE, "--limit", "2"])["events"]
    assert [(e["operation"], e["candidate_id"], e["reason"]) for e in events] == [
        ("accept", keep, "The user asked to keep it after all"),
        ("reject", drop, "Forgotten on purpose; stays forgotten")]
    assert ok_json(["verify", *pg(url, key)])["ok"] is True
    assert sql(url, "SELECT count(*) FROM nodes") == [(0,)]  # the admin nodes left with their commands


# ---- rotate-master-key --------------------------------------------------------------------------


def test_rotate_master_key_on_postgres_and_how_the_nodes_get_the_new_key(migrated: dict[str, Any],
                                                                         tmp_path: Path, offline_env) -> None:
    url, old = migrated["url"], migrated["key"]
    new = tmp_path / "new.key"
    node, other = pg_engine(tmp_path / "node", url, old), pg_engine(tmp_path / "other", url, old)
    try:
        before = answers(node, migrated)
        assert canonical_text(answers(other, migrated)) == canonical_text(before)
        # running nodes hold the old key: refused, nothing changed, no key file written
        proc = admin(["rotate-master-key", *pg(url, old), "--master-key-out", str(new)])
        refused(proc, 1, "STORE_BUSY: 2 node(s) of this store are running")
        assert not new.exists()
    finally:
        other.close()
    try:
        refused(admin(["rotate-master-key", *pg(url, old), "--master-key-out", str(new)]), 1,
                "STORE_BUSY: 1 node(s) of this store are running")
        assert not new.exists()
    finally:
        node.close()
    wrapped = dict(sql(url, "SELECT key_ref, wrapped FROM data_keys"))
    refused(admin(["rotate-master-key", *pg(url, old)]), 2, "--store needs --master-key-out")
    refused(admin(["rotate-master-key", *pg(url, old), "--master-key-out", str(old)]), 2,
            f"--master-key-out {old} already exists")

    done = ok_json(["rotate-master-key", *pg(url, old), "--master-key-out", str(new)])
    assert done["rewrapped"] == len(wrapped) > 0
    assert new.stat().st_mode & 0o777 == 0o600 and new.read_bytes() != old.read_bytes()
    after = dict(sql(url, "SELECT key_ref, wrapped FROM data_keys"))
    assert set(after) == set(wrapped) and all(bytes(after[r]) != bytes(wrapped[r]) for r in wrapped)

    # a node started with the old key file is refused at launch: exit 2, one line naming the file
    argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--data-dir", str(tmp_path / "node"),
            "--store", url, "--master-key-file", str(old), "--no-semantic", "--tools", ALL]
    for name, value in CONTEXT.items():
        argv += ["--" + name.replace("_", "-"), value]
    launch = subprocess.run(argv, env=offline_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=120, cwd=str(REPO))
    assert launch.returncode == 2, (launch.returncode, launch.stderr)
    last = launch.stderr.strip().splitlines()[-1]
    assert last == f"engram-memory: error: the master key file {old} is not this store's master key", launch.stderr
    assert "Traceback" not in launch.stderr
    refused(admin(["verify", *pg(url, old)]), 2, f"the master key file {old} is not this store's master key")
    # the documented way: the new key file in place of the old on each node, and the nodes restart
    old.write_bytes(new.read_bytes())
    node, other = pg_engine(tmp_path / "node", url, old), pg_engine(tmp_path / "other", url, old)
    try:
        assert canonical_text(answers(node, migrated)) == canonical_text(before)
        assert canonical_text(answers(other, migrated)) == canonical_text(before)
    finally:
        node.close()
        other.close()
    env = {**os.environ, "ENGRAM_STORE": url, "ENGRAM_MASTER_KEY_FILE": str(new)}
    assert ok_json(["verify"], env)["ok"] is True


# ---- backup / restore -----------------------------------------------------------------------------


@pytest.fixture
def second_database(pg_database: str) -> Any:
    """Another empty database on the same PostgreSQL (dropped afterwards)."""
    with fresh_database(pg_database, "restore") as url:
        yield url


def test_backup_of_the_live_store_restores_into_postgres_and_into_duckdb(
        migrated: dict[str, Any], second_database: str, tmp_path: Path) -> None:
    import tarfile

    url, key = migrated["url"], migrated["key"]
    backup = tmp_path / "b.tar"
    node = pg_engine(tmp_path / "node", url, key)
    try:
        before = answers(node, migrated)
        report = ok_json(["backup", *pg(url, key), "--out", str(backup)])  # while the node serves
    finally:
        node.close()
    assert report["online"] is True and report["heads"][SCOPE_REF]["cursor"] == "15"
    assert backup.stat().st_mode & 0o077 == 0 and Path(report["key"]).stat().st_mode & 0o077 == 0
    raw = backup.read_bytes()
    # ciphertext and metadata only: no record text, no master key (the store's or the copy's)
    assert MARKER.encode() not in raw and key.read_bytes() not in raw
    with tarfile.open(backup) as tar:
        names = tar.getnames()
    assert "master.key" not in names and "server.key" not in names and any(n.startswith("keys/") for n in names)

    # into an empty PostgreSQL store, under a new master key
    restored_key = tmp_path / "restored.key"
    refused(admin(["restore", "--from", str(backup), "--store", url, "--master-key-out", str(restored_key)]), 1,
            "RESTORE_REFUSED: the PostgreSQL store is already initialised")
    assert not restored_key.exists()
    done = ok_json(["restore", "--from", str(backup), "--store", second_database, "--master-key-out",
                    str(restored_key)])
    assert done["store_id"] == report["store_id"] and restored_key.stat().st_mode & 0o777 == 0o600
    assert ok_json(["verify", *pg(second_database, restored_key)])["ok"] is True
    node = pg_engine(tmp_path / "node2", second_database, restored_key)
    try:
        assert canonical_text(answers(node, migrated)) == canonical_text(before)
    finally:
        node.close()

    # the same archive restores into a DuckDB data dir too
    assert ok_json(["restore", "--from", str(backup), "--data-dir", str(tmp_path / "duck2")])["replaced"] is False
    assert ok_json(["verify", "--data-dir", str(tmp_path / "duck2")])["ok"] is True
    engine = duck_engine(tmp_path / "duck2")
    try:
        assert canonical_text(answers(engine, migrated)) == canonical_text(before)
    finally:
        engine.close()


def test_restore_over_a_postgres_store_ahead_of_the_backup_names_how_far_ahead(
        migrated: dict[str, Any], tmp_path: Path) -> None:
    """Issue 40 §1 on PostgreSQL: the live store went on after the backup; a restore over it is
    refused naming how far ahead it is (a PostgreSQL store is never replaced: --force is a usage error)."""
    url, key = migrated["url"], migrated["key"]
    backup = tmp_path / "b.tar"
    ok_json(["backup", *pg(url, key), "--out", str(backup)])
    node = pg_engine(tmp_path / "node", url, key)
    try:
        cap = call(node, "capture", ctx(), capture_args(f"After the backup {MARKER}", key="after-capture-000001"))
        call(node, "request_admission", ctx(),
             {"candidate_id": cap["candidate_id"], "idempotency_key": "after-admit-0000001"})
    finally:
        node.close()
    before = sql(url, "SELECT count(*), max(cursor) FROM journal")
    restored_key = tmp_path / "restored.key"
    proc = admin(["restore", "--from", str(backup), "--store", url, "--master-key-out", str(restored_key)])
    refused(proc, 1, "RESTORE_REFUSED: the PostgreSQL store is ahead of this backup (acme/main: 2 event(s)"
            " newer than the backup, cursor 17 > 15)")
    refused(admin(["restore", "--from", str(backup), "--store", url, "--master-key-out", str(restored_key),
                   "--force"]), 2, "--force applies to a data dir only")
    assert not restored_key.exists() and sql(url, "SELECT count(*), max(cursor) FROM journal") == before


def test_verify_and_backup_see_one_consistent_snapshot_while_a_node_writes(tmp_path: Path, pg_database: str) -> None:
    """A node keeps capturing, admitting and forgetting while verify and backup run: each reads one
    snapshot, so neither reports (nor archives) a half of any mutation."""
    import threading

    key = tmp_path / "master.key"
    ok_json(["init-store", "--store", pg_database, "--master-key-out", str(key)])
    node = pg_engine(tmp_path / "node", pg_database, key)
    stop, done, errors = threading.Event(), [0], []

    def write() -> None:
        try:
            i = 0
            while not stop.is_set():
                cap = call(node, "capture", ctx(), capture_args(f"load note {i} {MARKER}", key=f"capture-key-{i:08d}"))
                adm = call(node, "request_admission", ctx(), {"candidate_id": cap["candidate_id"],
                                                              "idempotency_key": f"admit-key-{i:08d}"})
                if i % 3 == 0:
                    call(node, "forget", ctx(), forget_args(adm["outcome"]["record_id"], key=f"forget-key-{i:08d}"))
                if i % 5 == 0:
                    call(node, "capture", ctx(), capture_args(f"pending {i}", key=f"pending-key-{i:08d}"))
                i += 1
                done[0] = i
        except Exception as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        checks = []
        for _ in range(2):
            checks.append(ok_json(["verify", *pg(pg_database, key)]))
        ok_json(["backup", *pg(pg_database, key), "--out", str(tmp_path / "b.tar")])
        at_backup = done[0]
        checks.append(ok_json(["verify", *pg(pg_database, key)]))
    finally:
        stop.set()
        writer.join()
        node.close()
    assert not errors and at_backup > 0 and done[0] > at_backup  # it did write throughout
    assert all(c["ok"] for c in checks) and checks[-1]["scopes"][0]["events"] > 0
    ok_json(["restore", "--from", str(tmp_path / "b.tar"), "--data-dir", str(tmp_path / "restored")])
    assert ok_json(["verify", "--data-dir", str(tmp_path / "restored")])["ok"] is True
