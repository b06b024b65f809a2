"""Forget and withdraw on a PostgreSQL store, forensically (issue 22 §6, SECURITY.md).

A deleted row stays in its table's file as a dead tuple, and a plain VACUUM leaves its bytes
there until the space is reused. The node rewrites ``data_keys`` (VACUUM FULL) shortly after it
destroys a key, so the wrapped data key of a forgotten record or a withdrawn candidate is absent
from every data file of the database once that ran -- checked on the real cluster's files,
after a CHECKPOINT, with the same scan shown to find the key first. Content is sealed before it
reaches PostgreSQL: its words are in no data file at any time. (WAL segments keep the key's
insert until they are recycled: SECURITY.md says so; the test does not claim otherwise.)
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.keyfile import new_key_file
from engram_memory.store.postgres.backend import init_store
from tests.store_fixtures import (
    AGENT_FIELDS,
    PURPOSE,
    T0,
    admission_args,
    call,
    capture_args,
    ctx,
    forget_args,
    unique_capture,
    withdraw_args,
)

FORGET_TEXT = "Decision: the zorblaxquint velmarith rollout stays frozen until spring."
WITHDRAW_TEXT = "Draft: move the plimbrathor gexwundle budget review to the second week."
TOKENS = (b"zorblaxquint", b"velmarith", b"plimbrathor", b"gexwundle")
VACUUM_WAIT_S = 20.0


def _database_files(conn: psycopg.Connection) -> list[Path]:
    data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
    oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]  # type: ignore[index]
    base = Path(data_dir) / "base" / str(oid)
    try:
        return [p for p in base.iterdir() if p.is_file()]
    except PermissionError:
        pytest.skip("the cluster's data files are not readable by this user (CI runs as root)")


def _files_holding(conn: psycopg.Connection, needle: bytes) -> list[str]:
    conn.execute("CHECKPOINT")  # dirty pages reach the files
    return sorted(p.name for p in _database_files(conn) if needle in p.read_bytes())


def test_a_forgotten_records_key_leaves_the_databases_files(pg_database: str, tmp_path: Path) -> None:
    with new_key_file(tmp_path / "master.key") as key:
        init_store(pg_database, key)
    settings = EngineSettings(data_dir=tmp_path / "node", store=pg_database,
                              master_key_file=tmp_path / "master.key", semantic=False)
    engine = Engine.open(settings, clock=lambda: T0)
    c = ctx()
    try:
        kept = call(engine, "capture", c, capture_args(FORGET_TEXT, key="cap-forget-000001"))
        record_id = call(engine, "request_admission", c,
                         admission_args(kept["candidate_id"], key="adm-forget-000001"))["outcome"]["record_id"]
        draft = call(engine, "capture", c, capture_args(WITHDRAW_TEXT, key="cap-withdraw-0001"))
        with psycopg.connect(pg_database, autocommit=True) as conn:
            wrapped = dict(conn.execute(
                "SELECT k.key_ref, k.wrapped FROM data_keys k WHERE k.key_ref IN"
                " (SELECT key_ref FROM records WHERE record_id = %s"
                "  UNION SELECT key_ref FROM candidates WHERE candidate_id = %s)",
                [record_id, draft["candidate_id"]]).fetchall())
            assert len(wrapped) == 2
            for blob in wrapped.values():  # the scan finds a live key: it cannot pass vacuously
                assert _files_holding(conn, bytes(blob)), "a live wrapped key is in no data file"
            for token in TOKENS:  # content is sealed before it reaches PostgreSQL
                assert _files_holding(conn, token) == []
            before = conn.execute("SELECT pg_relation_filenode('data_keys')").fetchone()

            forgot = call(engine, "forget", c, forget_args(record_id, key="forget-key-00001"))
            withdrew = call(engine, "withdraw", c, withdraw_args(draft["candidate_id"], key="withdraw-key-001"))
            assert forgot["projection_invalidation"] == "complete"
            assert withdrew["key_destruction"] == "complete"
            assert conn.execute("SELECT count(*) FROM data_keys WHERE key_ref = ANY(%s)",
                                [list(wrapped)]).fetchone() == (0,)

            # The node's own vacuum (its heartbeat thread), not one run by the test.
            deadline = time.monotonic() + VACUUM_WAIT_S
            while conn.execute("SELECT pg_relation_filenode('data_keys')").fetchone() == before:
                assert time.monotonic() < deadline, "the node did not rewrite data_keys after destroying keys"
                time.sleep(0.2)
            for blob in wrapped.values():
                assert _files_holding(conn, bytes(blob)) == []
            for token in TOKENS:
                assert _files_holding(conn, token) == []
    finally:
        engine.close()


def _node(pg_database: str, tmp_path: Path) -> Engine:
    settings = EngineSettings(data_dir=tmp_path / "node", store=pg_database,
                              master_key_file=tmp_path / "master.key", semantic=False)
    return Engine.open(settings, clock=lambda: T0)


def test_no_agent_written_field_reaches_the_databases_files(pg_database: str, tmp_path: Path) -> None:
    """Issue 33 §1 on PostgreSQL: records.event_type held the agent's event type in the clear (and a
    forget's dead tuple kept it). Now no agent-written value of a capture, its admission or its
    forget is in any data file of the database, before or after the forget (the keyed digest
    that replaces the type is, which shows the scan reads the records table's file)."""
    with new_key_file(tmp_path / "master.key") as key:
        init_store(pg_database, key)
    engine = _node(pg_database, tmp_path)
    c = ctx()
    needles = {name: value.encode("utf-8") for name, value in AGENT_FIELDS.items()}
    try:
        cap = call(engine, "capture", c, unique_capture())
        out = call(engine, "request_admission", c, admission_args(cap["candidate_id"],
                                                                  key=AGENT_FIELDS["admission_key"]))
        record_id = out["outcome"]["record_id"]
        with psycopg.connect(pg_database, autocommit=True) as conn:
            assert {name: _files_holding(conn, needle) for name, needle in needles.items()
                    if _files_holding(conn, needle)} == {}
            (kind,) = conn.execute("SELECT event_kind FROM records WHERE record_id = %s", [record_id]).fetchone()
            assert kind.startswith("hmac-sha256:") and _files_holding(conn, kind.encode())
            forgot = call(engine, "forget", c, forget_args(record_id, key=AGENT_FIELDS["forget_key"]))
            assert forgot["projection_invalidation"] == "complete"
            assert {name: _files_holding(conn, needle) for name, needle in needles.items()
                    if _files_holding(conn, needle)} == {}
    finally:
        engine.close()


def test_migrating_a_store_from_before_the_digest_rewrites_its_records(pg_database: str, tmp_path: Path) -> None:
    """A store written before migration 6 kept event types in records.event_type: the node that
    migrates clears and drops the column and rewrites the table (VACUUM FULL), so after a
    CHECKPOINT no data file of the database holds a type (the WAL still may: SECURITY.md)."""
    old_type = b"event:OLDPGPLAINEVT"
    with new_key_file(tmp_path / "master.key") as key:
        init_store(pg_database, key)
    engine = _node(pg_database, tmp_path)
    try:
        cap = call(engine, "capture", ctx(), capture_args(FORGET_TEXT, key="cap-old-store-01"))
        record_id = call(engine, "request_admission", ctx(),
                         admission_args(cap["candidate_id"], key="adm-old-store-01"))["outcome"]["record_id"]
    finally:
        engine.close()
    with psycopg.connect(pg_database, autocommit=True) as conn:
        # The store as the previous version left it.
        conn.execute("ALTER TABLE records ADD COLUMN event_type TEXT")
        conn.execute("UPDATE records SET event_type = %s, event_kind = NULL WHERE record_id = %s",
                     [old_type.decode(), record_id])
        conn.execute("DELETE FROM schema_migrations WHERE version = 6")
        assert _files_holding(conn, old_type), "the scan finds the old plaintext type first"
        engine = _node(pg_database, tmp_path)
        try:
            assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (6,)
            assert _files_holding(conn, old_type) == []
            found = call(engine, "search", ctx(), {"query": "zorblaxquint", "purpose_ref": PURPOSE})
            assert [p["record"]["record_id"] for p in found["records"]] == [record_id]
        finally:
            engine.close()
