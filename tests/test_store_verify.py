"""store/maintenance/verify.py over a real store (DuckDB, key files, Tantivy): clean passes, each fault fails."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import duckdb
import pytest

from engram_memory.models.settings import EngineSettings
from engram_memory.retrieval.lexical import LexicalIndex
from engram_memory.retrieval.projections import scope_dirname
from engram_memory.store.backend import StoreBusyError
from engram_memory.store.core.crypto import key_file
from engram_memory.store.core.engine import Engine
from engram_memory.store.maintenance.rebuild import NoStoreError
from engram_memory.store.maintenance.verify import JOURNAL_CORRUPT, verify_store
from tests.store_fixtures import T0, admission_args, call, capture_args, ctx, forget_args, withdraw_args

TEXTS = ["We adopted DuckDB as the single source of truth.", "Tantivy ranks the lexical channel with BM25.",
         "Staging deploys happen at noon.", "Every ADR cites its incident.", "Webhooks retry three times."]


def open_engine(path: Path) -> Engine:
    return Engine.open(EngineSettings(data_dir=path, semantic=False), clock=lambda: T0)


def build(path: Path) -> dict[str, list[str]]:
    """Two scopes; accepted, forgotten, withdrawn and pending candidates; then a clean stop."""
    engine = open_engine(path)
    out: dict[str, list[str]] = {"records": [], "pending": []}
    try:
        for scope, c in enumerate((ctx(), ctx(tenant="other"))):
            for i, text in enumerate(TEXTS):
                n = scope * 100 + i
                cap = call(engine, "capture", c, capture_args(text, key=f"capture-key-{n:06d}"))
                cid = cap["candidate_id"]
                if i == 4:
                    out["pending"].append(cid)
                    continue
                if i == 3:
                    call(engine, "withdraw", c, withdraw_args(cid, key=f"withdraw-key-{n:06d}"))
                    continue
                adm = call(engine, "request_admission", c, admission_args(cid, key=f"admit-key-{n:08d}"))
                rid = adm["outcome"]["record_id"]
                if i == 2:
                    call(engine, "forget", c, forget_args(rid, key=f"forget-key-{n:07d}"))
                else:
                    out["records"].append(rid)
    finally:
        engine.close()
    return out


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    data = tmp_path / "data"
    return data, build(data)


def copy(store: tuple[Path, dict[str, list[str]]], tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(store[0], dst)
    return dst


def test_clean_store_verifies_and_nothing_changes(store: tuple[Path, dict[str, list[str]]]) -> None:
    data, _ = store
    before = {p: p.stat().st_mtime_ns for p in data.rglob("*")}
    report = verify_store(data)
    assert report.ok and report.code is None and report.problems == [], report.problems
    assert [s.projection for s in report.scopes] == ["equal", "equal"]
    assert sum(s.records for s in report.scopes) == 4 and all(s.chain_ok for s in report.scopes)
    assert json.loads(json.dumps(report.as_dict()))["ok"] is True
    assert {p: p.stat().st_mtime_ns for p in data.rglob("*")} == before  # read-only, files and projections


def test_tampered_journal_body_is_journal_corrupt(store, tmp_path: Path) -> None:
    data = copy(store, tmp_path)
    con = duckdb.connect(str(data / "engram.duckdb"))
    body = con.execute("SELECT body FROM journal WHERE cursor = 2 LIMIT 1").fetchone()[0]
    event = json.loads(body)
    event["recorded_at"] = "2020-01-01T00:00:00.000Z"  # backdated: the columns still agree, the hash does not
    con.execute("UPDATE journal SET body = ? WHERE cursor = 2 AND body = ?", [json.dumps(event), body])
    con.close()
    report = verify_store(data, deep=False)
    assert not report.ok and report.code == JOURNAL_CORRUPT
    assert any("hash chain" in p for p in report.problems)


def test_head_behind_the_journal_is_journal_corrupt(store, tmp_path: Path) -> None:
    data = copy(store, tmp_path)
    con = duckdb.connect(str(data / "engram.duckdb"))
    con.execute("UPDATE scopes SET high_water = high_water - 1 WHERE scope_ref = (SELECT min(scope_ref) FROM scopes)")
    con.close()
    report = verify_store(data)
    assert report.code == JOURNAL_CORRUPT and any("head" in p for p in report.problems)


def test_deleted_key_file_is_an_orphan(store, tmp_path: Path) -> None:
    data = copy(store, tmp_path)
    con = duckdb.connect(str(data / "engram.duckdb"), read_only=True)
    key_ref = con.execute("SELECT key_ref FROM records WHERE key_ref IS NOT NULL LIMIT 1").fetchone()[0]
    con.close()
    os.unlink(key_file(data / "keys", key_ref))
    report = verify_store(data)
    assert not report.ok and report.code is None
    assert any("without their key file" in p for p in report.problems)


def test_unreferenced_key_file_and_stray_rows_are_reported(store, tmp_path: Path) -> None:
    data = copy(store, tmp_path)
    path = key_file(data / "keys", "ab" * 12)
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"\0" * 60)
    con = duckdb.connect(str(data / "engram.duckdb"))
    # A record whose candidate is gone, and an embedding of a forgotten record.
    con.execute("DELETE FROM candidates WHERE state = 'accepted' AND candidate_id = "
                "(SELECT min(candidate_id) FROM candidates WHERE state = 'accepted')")
    rid = con.execute("SELECT record_id, scope_ref FROM records WHERE state = 'tombstoned' LIMIT 1").fetchone()
    con.execute("INSERT INTO embeddings VALUES (?, 'sha256:m', ?, '\\x00'::BLOB)", [rid[0], rid[1]])
    con.close()
    problems = verify_store(data).problems
    assert any("referenced by no candidate or record" in p for p in problems)
    assert any("records without an accepted candidate" in p for p in problems)
    assert any("embedding rows for records that are forgotten" in p for p in problems)


def test_duplicated_operation_and_state_disagreement(store, tmp_path: Path) -> None:
    data = copy(store, tmp_path)
    con = duckdb.connect(str(data / "engram.duckdb"))
    # An admission applied in the state rows but absent from the journal: a lost or doubled operation.
    con.execute("UPDATE candidates SET state = 'rejected', key_ref = NULL, envelope = NULL, outcome = '{}'"
                " WHERE state = 'pending' AND candidate_id = (SELECT min(candidate_id) FROM candidates"
                " WHERE state = 'pending')")
    con.close()
    problems = verify_store(data, deep=False).problems
    assert any("state disagrees with their journal events" in p for p in problems)


def test_tampered_record_body_digest(store, tmp_path: Path) -> None:
    data = copy(store, tmp_path)
    con = duckdb.connect(str(data / "engram.duckdb"))
    # Another record's sealed body: it fails authentication under this record's key and id.
    a, b = con.execute("SELECT record_id, body FROM records WHERE body IS NOT NULL"
                       " ORDER BY record_id LIMIT 2").fetchall()
    con.execute("UPDATE records SET body = ? WHERE record_id = ?", [b[1], a[0]])
    con.close()
    assert any("do not yield" in p or "does not yield" in p for p in verify_store(data).problems)
    assert verify_store(data, deep=False).ok  # the shallow pass does not decrypt


def test_projection_differs_from_rebuild(store, tmp_path: Path) -> None:
    data = copy(store, tmp_path)
    rid = store[1]["records"][0]
    # The live projection silently loses a document, its cursor unchanged.
    index = LexicalIndex.open(data / "projections" / scope_dirname(ctx().scope_ref) / "lexical")
    index.delete([rid])
    index.close()
    report = verify_store(data)
    assert [s.projection for s in report.scopes].count("differs") == 1
    assert any("lexical document count" in p for p in report.problems)
    index = LexicalIndex.open(data / "projections" / scope_dirname(ctx().scope_ref) / "lexical")
    index.set_cursor("1")
    index.close()
    report = verify_store(data)  # a lagging cursor: stale (rebuilt before next use), not a difference
    assert "stale" in [s.projection for s in report.scopes] and report.ok


def test_refusals(tmp_path: Path, store) -> None:
    with pytest.raises(NoStoreError):
        verify_store(tmp_path / "absent")
    engine = open_engine(store[0])
    try:
        with pytest.raises(StoreBusyError):
            verify_store(store[0])
    finally:
        engine.close()
