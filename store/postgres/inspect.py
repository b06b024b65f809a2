"""What the admin commands read of a PostgreSQL store: one read-only snapshot, named queries.

The store is live (nodes keep writing), so every read of one command happens in one
``REPEATABLE READ READ ONLY`` transaction: ``admin verify`` sees the journal, the rows and the
wrapped keys as of one instant, and each mutation is one transaction, so a snapshot never holds
half of one. The same method names as store/duckdb/inspect.py's ``StoreInspector``, so
store/maintenance/verify.py keeps the rules for both backends; the data keys live in rows here, so the key
questions (does one exist, does it open, which are orphans) are answered here too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.models.digests import ZERO_DIGEST, receipt_digest
from engram_memory.store.backend import SCOPED_TABLES, StoreRefused
from engram_memory.store.core.crypto import unwrap
from engram_memory.store.postgres.backend import CONNECT_TIMEOUT_S, ORPHAN_KEY_GRACE, SECRET_REF, fingerprint

TABLES = SCOPED_TABLES


def connect(url: str) -> psycopg.Connection:
    """One autocommit connection; StoreRefused (one line, URL not echoed) when it cannot be had."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT_S))
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise StoreRefused(f"cannot connect to the PostgreSQL store ({reason})") from None


def store_heads(url: str, store_id: str) -> dict[str, tuple[int, str]] | None:
    """Each scope's journal head (high water, last event hash) of the PostgreSQL store at ``url``
    when it is the store ``store_id``; None for another store, no store, or one that cannot be read."""
    try:
        con = connect(url)
    except StoreRefused:
        return None
    try:
        if con.execute("SELECT to_regclass('scopes') IS NOT NULL AND to_regclass('meta') IS NOT NULL"
                       ).fetchone() != (True,):
            return None
        row = con.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
        if row is None or row[0] != store_id:
            return None
        return {str(s): (int(hw), str(h)) for s, hw, h in con.execute(
            "SELECT scope_ref, high_water, last_event_hash FROM scopes").fetchall()}
    except psycopg.Error:
        return None
    finally:
        con.close()


def check_identity(conn: psycopg.Connection, master_key: bytes | None, key_file: Path | None) -> None:
    """Refuse a database that is not an initialised store, or a key that is not its master key."""
    present = conn.execute("SELECT to_regclass('store_identity') IS NOT NULL").fetchone()
    row = conn.execute("SELECT master_key_fingerprint FROM store_identity").fetchone() if present == (True,) \
        else None
    if row is None:
        raise StoreRefused("the PostgreSQL store is not initialised (run: engram-memory admin init-store,"
                           " or admin migrate)")
    if master_key is not None and row[0] != fingerprint(master_key):
        raise StoreRefused(f"the master key file {key_file} is not this store's master key")


class PostgresInspector:
    """A read-only snapshot of a PostgreSQL store (close it when done)."""

    def __init__(self, url: str, master_key: bytes | None = None, key_file: Path | None = None) -> None:
        self.con = connect(url)
        try:
            check_identity(self.con, master_key, key_file)
            self.con.autocommit = False
            self.con.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            self.con.read_only = True
        except BaseException:
            self.con.close()
            raise
        self._master = AESGCM(master_key) if master_key is not None else None

    def close(self) -> None:
        try:
            self.con.rollback()  # read only: nothing to keep
        finally:
            self.con.close()

    def all(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, params or []).fetchall()

    def data_keys(self) -> RowKeys:
        return RowKeys(self)

    def verify_journal(self, scope_ref: str) -> bool:
        """The hash chain and dense cursors (the same walk as the backends' verify_journal)."""
        previous, expected = ZERO_DIGEST, 1
        for cursor, body, event_hash in self.all(
                "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = %s ORDER BY cursor", [scope_ref]):
            try:
                event = json.loads(body)
            except ValueError:
                return False
            if int(cursor) != expected or event.get("previous_event_hash") != previous:
                return False
            if receipt_digest("memory-journal-event", event, "event_hash") != event_hash:
                return False
            previous, expected = event_hash, expected + 1
        return True

    # -- store-wide ----------------------------------------------------------------------

    def referenced_keys(self) -> set[str]:
        sql = ("SELECT key_ref FROM candidates WHERE key_ref IS NOT NULL"
               " UNION SELECT key_ref FROM records WHERE key_ref IS NOT NULL")
        if self._has_approvals():  # a store written before the approvals table has none
            sql += " UNION SELECT key_ref FROM approvals WHERE key_ref IS NOT NULL"
        return {r[0] for r in self.all(sql)}

    def _has_approvals(self) -> bool:
        return bool(self.all("SELECT 1 FROM information_schema.tables WHERE table_name = 'approvals'"))

    def listed_scopes(self) -> set[str]:
        return {r[0] for r in self.all("SELECT scope_ref FROM scopes")}

    def scopes(self) -> list[str]:
        return [r[0] for r in self.all("SELECT scope_ref FROM scopes ORDER BY scope_ref")]

    def scopes_in(self, table: str) -> list[str]:
        assert table in TABLES
        return [r[0] for r in self.all(f"SELECT DISTINCT scope_ref FROM {table}")]

    # -- keys (rows wrapped by the master key) -------------------------------------------

    def key_count(self) -> int:
        return int(self.all("SELECT count(*) FROM data_keys")[0][0])

    def key_exists(self, key_ref: str) -> bool:
        return bool(self.all("SELECT 1 FROM data_keys WHERE key_ref = %s", [key_ref]))

    def load_key(self, key_ref: str) -> bytes | None:
        """The data key, or None when it is absent or does not open under the master key."""
        rows = self.all("SELECT wrapped FROM data_keys WHERE key_ref = %s", [key_ref])
        if not rows or self._master is None:
            return None
        try:
            return unwrap(self._master, key_ref, bytes(rows[0][0]))
        except (InvalidTag, ValueError):
            return None

    def orphan_keys(self) -> list[str]:
        """Keys no row references, older than the grace a node's open mutation may take (a younger
        one may be another node's capture about to commit); the next node start sweeps them."""
        return [r[0] for r in self.all(
            "SELECT key_ref FROM data_keys d WHERE d.created_at < now() - %s::interval"
            " AND NOT EXISTS (SELECT 1 FROM candidates c WHERE c.key_ref = d.key_ref)"
            " AND NOT EXISTS (SELECT 1 FROM records r WHERE r.key_ref = d.key_ref) ORDER BY key_ref",
            [ORPHAN_KEY_GRACE])]

    def page_cursor_key_opens(self) -> bool:
        rows = self.all("SELECT value FROM meta WHERE key = 'page_cursor_key'")
        if not rows or self._master is None:
            return False
        try:
            unwrap(self._master, SECRET_REF, bytes.fromhex(rows[0][0]))
        except (InvalidTag, ValueError):
            return False
        return True

    def page_cursor_key(self) -> bytes:
        rows = self.all("SELECT value FROM meta WHERE key = 'page_cursor_key'")
        if not rows or self._master is None:
            raise StoreRefused("the PostgreSQL store has no page-cursor key, or no master key was given")
        try:
            return unwrap(self._master, SECRET_REF, bytes.fromhex(rows[0][0]))
        except (InvalidTag, ValueError):
            raise StoreRefused("the page-cursor key does not open under the master key") from None

    def meta(self, key: str) -> str | None:
        rows = self.all("SELECT value FROM meta WHERE key = %s", [key])
        return str(rows[0][0]) if rows else None

    def rows(self, table: str, columns: tuple[str, ...], batch: int) -> Iterator[list[tuple[Any, ...]]]:
        """Every row of a table (the columns named), in batches, from this snapshot (a server-side
        cursor: a large table is never held in memory whole). Blobs come as bytes."""
        with self.con.cursor(name="engram_export") as cur:
            cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
            while rows := cur.fetchmany(batch):
                yield [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows]

    # -- one scope -----------------------------------------------------------------------

    def journal_rows(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(cursor, event_id, operation, body, event_hash) in cursor order."""
        return self.all("SELECT cursor, event_id, operation, body, event_hash FROM journal WHERE scope_ref = %s"
                        " ORDER BY cursor", [scope_ref])

    def head(self, scope_ref: str) -> tuple[Any, ...]:
        """(high_water, last_event_hash, projection_cursor)."""
        return self.all("SELECT high_water, last_event_hash, projection_cursor FROM scopes WHERE scope_ref = %s",
                        [scope_ref])[0]

    def journal_operations(self, scope_ref: str) -> list[tuple[Any, ...]]:
        return self.all("SELECT event_id, operation FROM journal WHERE scope_ref = %s", [scope_ref])

    def candidate_states(self, scope_ref: str) -> list[tuple[Any, ...]]:
        return self.all("SELECT candidate_id, state FROM candidates WHERE scope_ref = %s", [scope_ref])

    def record_links(self, scope_ref: str) -> list[tuple[Any, ...]]:
        return self.all("SELECT record_id, candidate_id, state FROM records WHERE scope_ref = %s", [scope_ref])

    def tombstoned_records(self, scope_ref: str) -> set[str]:
        return {r[0] for r in self.all("SELECT record_id FROM tombstoned_payloads WHERE scope_ref = %s",
                                       [scope_ref])}

    def candidates(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(candidate_id, state, created_cursor, payload_digest, record_digest, key_ref, envelope, outcome)."""
        return [(*row[:6], _bytes(row[6]), row[7]) for row in self.all(
            "SELECT candidate_id, state, created_cursor, payload_digest, record_digest, key_ref, envelope, outcome"
            " FROM candidates WHERE scope_ref = %s", [scope_ref])]

    def records(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(record_id, state, record_digest, payload_digest, key_ref, body, its candidate's record_digest)."""
        return [(*row[:5], _bytes(row[5]), row[6]) for row in self.all(
            "SELECT r.record_id, r.state, r.record_digest, r.payload_digest, r.key_ref, r.body, c.record_digest"
            " FROM records r LEFT JOIN candidates c USING (candidate_id) WHERE r.scope_ref = %s", [scope_ref])]

    def embedded_records(self, scope_ref: str) -> list[str]:
        return [r[0] for r in self.all("SELECT DISTINCT record_id FROM embeddings WHERE scope_ref = %s",
                                       [scope_ref])]

    def projection_cursor(self, scope_ref: str) -> int:
        return int(self.all("SELECT projection_cursor FROM scopes WHERE scope_ref = %s", [scope_ref])[0][0])

    def current_bodies(self, scope_ref: str, state: str) -> list[tuple[Any, ...]]:
        return [(rid, key_ref, bytes(body)) for rid, key_ref, body in self.all(
            "SELECT record_id, key_ref, body FROM records WHERE scope_ref = %s AND state = %s"
            " AND body IS NOT NULL ORDER BY record_id", [scope_ref, state])]

    def embedding_models(self, scope_ref: str, state: str) -> list[str]:
        return [r[0] for r in self.all(
            "SELECT DISTINCT e.model_digest FROM embeddings e JOIN records r USING (record_id)"
            " WHERE e.scope_ref = %s AND r.state = %s", [scope_ref, state])]

    def embeddings(self, scope_ref: str, state: str, model_digest: str) -> list[tuple[Any, ...]]:
        return [(rid, key_ref, bytes(blob)) for rid, key_ref, blob in self.all(
            "SELECT e.record_id, r.key_ref, e.vector FROM embeddings e JOIN records r USING (record_id)"
            " WHERE e.scope_ref = %s AND e.model_digest = %s AND r.state = %s ORDER BY e.record_id",
            [scope_ref, model_digest, state])]

    # -- what history and candidates list (store/host/history.py) ------------------------------

    def journal_tail(self, scope_ref: str, limit: int | None = None) -> list[tuple[int, str, str]]:
        """(cursor, body, event_hash), newest first (the last ``limit``)."""
        sql = "SELECT cursor, body, event_hash FROM journal WHERE scope_ref = %s ORDER BY cursor DESC"
        params: list[Any] = [scope_ref]
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        return [(int(c), b, h) for c, b, h in self.all(sql, params)]

    def pending_candidates(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """As store/duckdb/inspect.py's: metadata of the scope's pending candidates, cursor order."""
        return self.all(
            "SELECT c.candidate_id, c.principal, c.state, c.created_cursor, c.recorded_at, c.payload_digest,"
            " c.record_digest, EXISTS (SELECT 1 FROM tombstoned_payloads t WHERE t.scope_ref = c.scope_ref"
            " AND t.payload_digest = c.payload_digest) FROM candidates c"
            " WHERE c.scope_ref = %s AND c.state = 'pending' ORDER BY c.created_cursor", [scope_ref])


class RowKeys:
    """A PostgreSQL store's data keys as ``admin verify`` checks them: ``data_keys`` rows, wrapped by
    the master key file given (store/backend.py ``DataKeys``)."""

    def __init__(self, store: PostgresInspector) -> None:
        self.store = store

    def problem(self) -> str | None:
        if not self.store.page_cursor_key_opens():
            return "the page-cursor key is missing or does not open under the master key"
        return None

    def exists(self, key_ref: str) -> bool:
        return self.store.key_exists(key_ref)

    def load(self, key_ref: str) -> bytes | None:
        return self.store.load_key(key_ref)

    def census(self, referenced: set[str]) -> tuple[list[str], int]:
        return self.store.orphan_keys(), self.store.key_count()


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)
