"""The DuckDB handle: single-owner open, transactions, per-scope dense cursors and hash chain."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from engram_memory.models.canonical import canonical_text
from engram_memory.models.digests import ZERO_DIGEST, receipt_digest
from engram_memory.store.schema import migrate


@contextmanager
def held_if_present(data_dir: Path, busy: Callable[[], Exception]) -> Iterator[None]:
    """Hold the data dir's advisory lock (the one a server takes) for a maintenance read or swap,
    never creating it: without a lock file no server holds the directory, and a refusal must
    change nothing. Raises ``busy()`` when a server holds it."""
    try:
        fd = os.open(data_dir / ".lock", os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy() from None
        yield
    finally:
        os.close(fd)


class StoreBusyError(RuntimeError):
    """Another process owns the data directory (DuckDB allows one writer)."""


class Database:
    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(data_dir, 0o700)
        # An advisory lock first, so a second server fails with a clear message before
        # DuckDB's own (less readable) lock error.
        self._lock_fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise StoreBusyError(f"data directory {data_dir} is in use by another engram-memory process") from exc
        try:
            self.con = duckdb.connect(str(data_dir / "engram.duckdb"))
        except duckdb.IOException as exc:
            os.close(self._lock_fd)
            raise StoreBusyError(f"data directory {data_dir} is in use by another process") from exc
        # DuckDB creates its files with the process umask: memory is the owner's alone.
        for name in ("engram.duckdb", "engram.duckdb.wal"):
            if (data_dir / name).exists():
                os.chmod(data_dir / name, 0o600)
        migrate(self.con)
        row = self.con.execute("SELECT value FROM meta WHERE key = 'storage_epoch'").fetchone()
        epoch = int(row[0]) + 1 if row else 1
        self.con.execute(
            "INSERT INTO meta VALUES ('storage_epoch', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [str(epoch)],
        )
        self.storage_epoch = str(epoch)
        # Each scope's (high_water, last_event_hash). This process is the only writer (flock),
        # so the cache is exact; an aborted transaction drops it, the next use re-reads it.
        self._heads: dict[str, tuple[int, str]] = {}
        self._readers = threading.local()
        self._reader_cons: list[duckdb.DuckDBPyConnection] = []  # closed with the database
        self._reader_lock = threading.Lock()

    def close(self) -> None:
        # Forgetting needs no checkpoint: DuckDB (file and WAL) only ever holds sealed content,
        # and destroying the data key makes every copy, free blocks included, unreadable
        # (tests/test_forensic_forget.py scans a running store's WAL too).
        try:
            self.con.execute("CHECKPOINT")
        finally:
            # Every cursor keeps the database (and its file lock) open: close them all first,
            # or a server started right after this close finds the directory in use.
            with self._reader_lock:
                for reader in self._reader_cons:
                    reader.close()
                self._reader_cons.clear()
            self.con.close()
            os.close(self._lock_fd)

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        self.con.begin()
        try:
            yield self.con
        except BaseException:
            self._heads.clear()
            self.con.rollback()
            raise
        try:
            self.con.commit()
        except BaseException:
            self._heads.clear()
            raise

    def one(self, sql: str, params: list[Any] | None = None) -> tuple[Any, ...] | None:
        return self.con.execute(sql, params or []).fetchone()

    def all(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, params or []).fetchall()

    # -- journal -------------------------------------------------------------------------

    def _head(self, scope_ref: str) -> tuple[int, str] | None:
        head = self._heads.get(scope_ref)
        if head is None:
            row = self.one("SELECT high_water, last_event_hash FROM scopes WHERE scope_ref = ?", [scope_ref])
            if row is None:
                return None
            head = self._heads[scope_ref] = (int(row[0]), row[1])
        return head

    def projection_cursor(self, scope_ref: str) -> int:
        """The journal cursor the scope's projections must reflect (0 for an unknown scope)."""
        row = self.one("SELECT projection_cursor FROM scopes WHERE scope_ref = ?", [scope_ref])
        return int(row[0]) if row else 0

    def high_water(self, scope_ref: str) -> int:
        head = self._head(scope_ref)
        return head[0] if head else 0

    def append_event(self, con: duckdb.DuckDBPyConnection, scope_ref: str, event: dict[str, Any],
                     advance_projection: bool = False) -> dict[str, Any]:
        """Append one event at the scope's next cursor (inside the caller's transaction).

        The journal is dense and hash-chained per scope: a scope's cursors and counts
        never reveal another scope's activity. ``advance_projection`` also moves the scope's
        projection cursor to the new event (in the same statement).
        """
        head = self._head(scope_ref)
        if head is None:
            con.execute("INSERT INTO scopes VALUES (?, 0, ?, 0)", [scope_ref, ZERO_DIGEST])
            head = (0, ZERO_DIGEST)
        cursor = head[0] + 1
        body = {"schema_version": 1, **event, "cursor": str(cursor), "previous_event_hash": head[1]}
        body["event_hash"] = receipt_digest("memory-journal-event", body, "event_hash")
        con.execute(
            "INSERT INTO journal VALUES (?, ?, ?, ?, ?, ?)",
            [scope_ref, cursor, body["event_id"], body["operation"], canonical_text(body), body["event_hash"]],
        )
        if advance_projection:
            con.execute(
                "UPDATE scopes SET high_water = ?, last_event_hash = ?, projection_cursor = ? WHERE scope_ref = ?",
                [cursor, body["event_hash"], cursor, scope_ref],
            )
        else:
            con.execute(
                "UPDATE scopes SET high_water = ?, last_event_hash = ? WHERE scope_ref = ?",
                [cursor, body["event_hash"], scope_ref],
            )
        self._heads[scope_ref] = (cursor, body["event_hash"])  # dropped if the transaction aborts
        return body

    def verify_journal(self, scope_ref: str) -> bool:
        """Re-walk a scope's hash chain and cursor density (JOURNAL_CORRUPT / CURSOR_GAP checks)."""
        import json

        previous, expected = ZERO_DIGEST, 1
        for cursor, body, event_hash in self.all(
            "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = ? ORDER BY cursor", [scope_ref]
        ):
            event = json.loads(body)
            if int(cursor) != expected or event["previous_event_hash"] != previous:
                return False
            if receipt_digest("memory-journal-event", event, "event_hash") != event_hash:
                return False
            previous, expected = event_hash, expected + 1
        return True

    # -- concurrent reads ----------------------------------------------------------------

    def reader(self) -> duckdb.DuckDBPyConnection:
        """This thread's read connection (a DuckDB cursor on the same database).

        One DuckDB connection must not be used by two threads at once; reads run concurrently
        under the engine's read lock, each on its own cursor, and see only committed state."""
        local = self._readers
        con = getattr(local, "con", None)
        if con is None:
            with self._reader_lock:
                con = local.con = self.con.cursor()
                self._reader_cons.append(con)
        return con
