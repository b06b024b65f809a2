"""What the operator's tools read of a stopped DuckDB store (``admin verify``, ``history``,
``candidates``, ``rebuild-index``): one read-only connection, named queries, the ``Inspector``
protocol of store/backend.py.

Table-level checks (rows under unlisted scopes, columns against hashed bodies) are about how this
backend lays the data out, so the queries stay here and store/maintenance/verify.py keeps the rules.
Nothing here takes the writer's handle or loads a data key unless ``data_keys()`` is asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import duckdb

from engram_memory.store.backend import SCOPED_TABLES, NotAStoreError, StoreBusyError
from engram_memory.store.core.crypto import KEY_PREFIX, KEYS_DIR, KeyStore, find_key_file, key_files
from engram_memory.store.duckdb.backend import STORE_FILE, Database

TABLES = SCOPED_TABLES


def connect(data_dir: Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the stopped store. Raises StoreBusyError (a process holds the
    file) and NotAStoreError (not a DuckDB database)."""
    try:
        return duckdb.connect(str(data_dir / STORE_FILE), read_only=True)
    except duckdb.IOException as exc:
        if "could not set lock" in str(exc).lower():  # (the path is in the message: match the phrase)
            raise StoreBusyError(f"data directory {data_dir} is in use by another process") from None
        raise NotAStoreError(f"{STORE_FILE} is not a DuckDB database") from None


class FileKeys:
    """A DuckDB store's data keys: one file each under ``keys/``, wrapped by ``master.key``."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / KEYS_DIR
        self.key_store: KeyStore | None = None
        if (data_dir / "master.key").is_file() and self.dir.is_dir():
            # (both exist: it creates nothing; a flat keys/ from before the fan-out is read as it is)
            self.key_store = KeyStore(data_dir, migrate=False)

    def problem(self) -> str | None:
        return "the store has no master key or no keys directory" if self.key_store is None else None

    def exists(self, key_ref: str) -> bool:
        return find_key_file(self.dir, key_ref) is not None

    def load(self, key_ref: str) -> bytes | None:
        if self.key_store is None:
            return None
        try:
            return self.key_store.load(key_ref)
        except Exception:  # noqa: BLE001 - a key the master key cannot unwrap is reported as such
            return None

    def census(self, referenced: set[str]) -> tuple[list[str], int]:
        """(orphans: key files no row references, how many key files there are)."""
        files = sorted(p.name for p in [*key_files(self.dir), *key_files(self.dir, temporary=True)])
        return [name for name in files if KEY_PREFIX + name not in referenced], len(files)


class StoreInspector:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.con = connect(data_dir)

    def close(self) -> None:
        self.con.close()

    def all(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, params or []).fetchall()

    def data_keys(self) -> FileKeys:
        return FileKeys(self.data_dir)

    def verify_journal(self, scope_ref: str) -> bool:
        return Database.verify_journal(cast(Database, self), scope_ref)

    def scopes(self) -> list[str]:
        """Raises NotAStoreError when the database is not an engram-memory one."""
        try:
            rows = self.all("SELECT scope_ref FROM scopes ORDER BY scope_ref")
        except duckdb.CatalogException:
            raise NotAStoreError(f"{STORE_FILE} is not an engram-memory database") from None
        return [str(row[0]) for row in rows]

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

    def scopes_in(self, table: str) -> list[str]:
        assert table in TABLES
        return [r[0] for r in self.all(f"SELECT DISTINCT scope_ref FROM {table}")]

    # -- one scope -----------------------------------------------------------------------

    def journal_rows(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(cursor, event_id, operation, body, event_hash) in cursor order."""
        return self.all("SELECT cursor, event_id, operation, body, event_hash FROM journal WHERE scope_ref = ?"
                        " ORDER BY cursor", [scope_ref])

    def head(self, scope_ref: str) -> tuple[Any, ...]:
        """(high_water, last_event_hash, projection_cursor)."""
        return self.all("SELECT high_water, last_event_hash, projection_cursor FROM scopes WHERE scope_ref = ?",
                        [scope_ref])[0]

    def journal_tail(self, scope_ref: str, limit: int | None = None) -> list[tuple[int, str, str]]:
        """(cursor, body, event_hash), newest first (the last ``limit``)."""
        rows = self.all("SELECT cursor, body, event_hash FROM journal WHERE scope_ref = ? ORDER BY cursor DESC"
                        + (" LIMIT ?" if limit is not None else ""),
                        [scope_ref, limit] if limit is not None else [scope_ref])
        return [(int(c), b, h) for c, b, h in rows]

    def pending_candidates(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """Metadata of the scope's pending candidates, in cursor order (store/backend.py Inspector)."""
        return self.all(
            "SELECT c.candidate_id, c.principal, c.state, c.created_cursor, c.recorded_at, c.payload_digest,"
            " c.record_digest, EXISTS (SELECT 1 FROM tombstoned_payloads t WHERE t.scope_ref = c.scope_ref"
            " AND t.payload_digest = c.payload_digest) FROM candidates c"
            " WHERE c.scope_ref = ? AND c.state = 'pending' ORDER BY c.created_cursor", [scope_ref])

    def journal_operations(self, scope_ref: str) -> list[tuple[Any, ...]]:
        return self.all("SELECT event_id, operation FROM journal WHERE scope_ref = ?", [scope_ref])

    def candidate_states(self, scope_ref: str) -> list[tuple[Any, ...]]:
        return self.all("SELECT candidate_id, state FROM candidates WHERE scope_ref = ?", [scope_ref])

    def record_links(self, scope_ref: str) -> list[tuple[Any, ...]]:
        return self.all("SELECT record_id, candidate_id, state FROM records WHERE scope_ref = ?", [scope_ref])

    def tombstoned_records(self, scope_ref: str) -> set[str]:
        return {r[0] for r in self.all("SELECT record_id FROM tombstoned_payloads WHERE scope_ref = ?",
                                       [scope_ref])}

    def candidates(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(candidate_id, state, created_cursor, payload_digest, record_digest, key_ref, envelope, outcome)."""
        return self.all("SELECT candidate_id, state, created_cursor, payload_digest, record_digest, key_ref,"
                        " envelope, outcome FROM candidates WHERE scope_ref = ?", [scope_ref])

    def records(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(record_id, state, record_digest, payload_digest, key_ref, body, its candidate's record_digest)."""
        return self.all("SELECT r.record_id, r.state, r.record_digest, r.payload_digest, r.key_ref, r.body,"
                        " c.record_digest FROM records r LEFT JOIN candidates c USING (candidate_id)"
                        " WHERE r.scope_ref = ?", [scope_ref])

    def embedded_records(self, scope_ref: str) -> list[str]:
        return [r[0] for r in self.all("SELECT DISTINCT record_id FROM embeddings WHERE scope_ref = ?",
                                       [scope_ref])]

    def projection_cursor(self, scope_ref: str) -> int:
        return int(self.all("SELECT projection_cursor FROM scopes WHERE scope_ref = ?", [scope_ref])[0][0])

    def current_bodies(self, scope_ref: str, state: str) -> list[tuple[Any, ...]]:
        """(record_id, key_ref, body) of the scope's records in ``state`` with a body, by record_id."""
        return self.all(f"SELECT record_id, key_ref, body FROM records WHERE scope_ref = ? AND state = "
                        f"'{state}' AND body IS NOT NULL ORDER BY record_id", [scope_ref])

    def embedding_models(self, scope_ref: str, state: str) -> list[str]:
        return [r[0] for r in self.all(
            "SELECT DISTINCT e.model_digest FROM embeddings e JOIN records r USING (record_id)"
            f" WHERE e.scope_ref = ? AND r.state = '{state}'", [scope_ref])]

    def embeddings(self, scope_ref: str, state: str, model_digest: str) -> list[tuple[Any, ...]]:
        """(record_id, key_ref, vector) by record_id."""
        return self.all(
            "SELECT e.record_id, r.key_ref, e.vector FROM embeddings e JOIN records r USING (record_id)"
            f" WHERE e.scope_ref = ? AND e.model_digest = ? AND r.state = '{state}' ORDER BY e.record_id",
            [scope_ref, model_digest])
