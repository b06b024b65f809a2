"""Read-only reads of a stopped DuckDB store (operator tools: history, rebuild-index, restore).

Nothing here takes the writer's handle: each call opens ``engram.duckdb`` read-only and closes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from engram_memory.store.backend import StoreBusyError, StoreError
from engram_memory.store.duckdb.backend import STORE_FILE


class NotAStoreError(StoreError):
    """The file is not a DuckDB database, or not an engram-memory one (``reason`` says which)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _connect(data_dir: Path) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(data_dir / STORE_FILE), read_only=True)


def scopes(data_dir: Path) -> list[str]:
    """The scope_refs of the stopped store. Raises StoreBusyError (a process holds the file) and
    NotAStoreError."""
    try:
        con = _connect(data_dir)
    except duckdb.IOException as exc:
        if "could not set lock" in str(exc).lower():  # (the path is in the message: match the phrase)
            raise StoreBusyError(f"data directory {data_dir} is in use by another process") from None
        raise NotAStoreError(f"{STORE_FILE} is not a DuckDB database") from None
    try:
        rows = con.execute("SELECT scope_ref FROM scopes ORDER BY scope_ref").fetchall()
    except duckdb.CatalogException:
        raise NotAStoreError(f"{STORE_FILE} is not an engram-memory database") from None
    finally:
        con.close()
    return [str(row[0]) for row in rows]


def journal_rows(data_dir: Path, scope_ref: str, limit: int | None = None) -> list[tuple[int, str, str]]:
    """(cursor, body, event_hash) of the scope's journal, newest first (the last ``limit``)."""
    con = _connect(data_dir)
    try:
        rows = con.execute(
            "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = ? ORDER BY cursor DESC"
            + (" LIMIT ?" if limit is not None else ""),
            [scope_ref, limit] if limit is not None else [scope_ref],
        ).fetchall()
    finally:
        con.close()
    return [(int(c), b, h) for c, b, h in rows]


def pending_candidates(data_dir: Path, scope_ref: str) -> list[tuple[Any, ...]]:
    """(candidate_id, principal, state, created_cursor, recorded_at, payload_digest, record_digest,
    held) of the scope's pending candidates, in cursor order; ``held``: its payload was forgotten."""
    con = _connect(data_dir)
    try:
        return con.execute(
            "SELECT c.candidate_id, c.principal, c.state, c.created_cursor, c.recorded_at, c.payload_digest,"
            " c.record_digest, EXISTS (SELECT 1 FROM tombstoned_payloads t WHERE t.scope_ref = c.scope_ref"
            " AND t.payload_digest = c.payload_digest) FROM candidates c"
            " WHERE c.scope_ref = ? AND c.state = 'pending' ORDER BY c.created_cursor",
            [scope_ref],
        ).fetchall()
    finally:
        con.close()
