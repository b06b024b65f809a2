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
from engram_memory.store.engine import Engine
from engram_memory.store.keyfile import new_key_file
from engram_memory.store.postgres.backend import init_store
from tests.store_fixtures import T0, admission_args, call, capture_args, ctx, forget_args, withdraw_args

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
