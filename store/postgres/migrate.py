"""``admin migrate``: copy a stopped DuckDB store into an empty PostgreSQL store, in one transaction.

What is copied, row for row: the scopes (heads and projection cursors), the journal (bodies
byte-exact, so every hash still verifies), candidates, records, tombstoned payloads, the
idempotency ledger (first answers byte-exact: a retry after the move answers as before), the
audit trail and the stored embeddings (sealed blobs as they are: they are sealed with the
records' own data keys, which do not change). The store id (kept when the DuckDB store has one)
and its storage epoch go to ``meta``.

Keys: every data key a row references is unwrapped with the DuckDB store's ``master.key`` and
re-wrapped under the new master key into ``data_keys`` (the same key_ref, so the sealed blobs
open unchanged); a key file no row references (an interrupted write, or a destroy that failed)
is not copied, which completes its destruction. The page-cursor key is carried over, wrapped
under the new master key, so page cursors handed out before the move stay valid. The new
master key is never stored in PostgreSQL: the store records its fingerprint only.

The DuckDB directory is held (its advisory lock) and read read-only throughout: no server can
start on it meanwhile and nothing in it changes. A PostgreSQL store that is initialised or holds
any row is refused, and the refusal changes nothing there.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.store.backend import (
    EMBEDDING_MODEL_KEY,
    RECORD_COLUMNS,
    MigrateReport,
    MigrateUsageError,
    StoreBusyError,
    StoreRefused,
)
from engram_memory.store.core.crypto import KEYS_DIR, find_key_file, finish_rotation, key_files, key_name, unwrap, wrap
from engram_memory.store.core.timeutil import to_instant, wall_clock
from engram_memory.store.duckdb.backend import STORE_FILE, held_if_present
from engram_memory.store.duckdb.schema import MIGRATIONS as DUCKDB_MIGRATIONS
from engram_memory.store.postgres.backend import SECRET_REF, connect_pool, fingerprint
from engram_memory.store.postgres.schema import migrate as migrate_schema

# MigrateUsageError, MigrateReport: store/backend.py's (server/ still imports MigrateUsageError here).
__all__ = ["MigrateReport", "MigrateUsageError", "counts", "migrate_store"]

BATCH = 2000  # rows fetched from DuckDB at a time

# (table, columns) in copy order; the same column names on both backends (store/*/schema.py).
TABLES: list[tuple[str, tuple[str, ...]]] = [
    ("scopes", ("scope_ref", "high_water", "last_event_hash", "projection_cursor")),
    ("journal", ("scope_ref", "cursor", "event_id", "operation", "body", "event_hash")),
    ("candidates", ("candidate_id", "scope_ref", "principal", "state", "created_cursor", "recorded_at",
                    "payload_digest", "record_digest", "key_ref", "envelope", "outcome")),
    ("records", RECORD_COLUMNS),  # the DuckDB table's always-NULL event_type is not copied
    ("tombstoned_payloads", ("scope_ref", "payload_digest", "record_id", "cursor")),
    ("idempotency", ("scope_ref", "principal", "key_digest", "tool", "intent_hash", "value", "created_at")),
    ("audit", ("audit_id", "called_at", "scope_ref", "principal", "agent_id", "session", "tool", "ok", "code",
               "idk", "context_jti")),
    ("embeddings", ("record_id", "model_digest", "scope_ref", "vector")),
]
# Tables of the target that must hold no row (besides the schema's own ledger).
TARGET_TABLES = ("store_identity", "meta", "data_keys", "nodes", "node_cursors", "replay",
                 *(t for t, _ in TABLES))


def _source(data_dir: Path) -> duckdb.DuckDBPyConnection:
    try:
        con = duckdb.connect(str(data_dir / STORE_FILE), read_only=True)
    except duckdb.IOException as exc:
        if "could not set lock" in str(exc).lower():
            raise StoreBusyError(f"data dir {data_dir} is in use by another process") from None
        raise MigrateUsageError(f"{data_dir / STORE_FILE} is not a DuckDB database") from None
    try:
        versions = {int(v) for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
    except duckdb.Error:
        con.close()
        raise MigrateUsageError(f"{data_dir} holds no engram-memory store") from None
    if versions != {v for v, _, _ in DUCKDB_MIGRATIONS}:
        con.close()
        raise MigrateUsageError(f"the store at {data_dir} was written by another version of engram-memory;"
                                " start this version's server on it once, stop it, then migrate")
    return con


def _rows(con: duckdb.DuckDBPyConnection, table: str, columns: tuple[str, ...]) -> Iterator[list[tuple[Any, ...]]]:
    cur = con.execute(f"SELECT {', '.join(columns)} FROM {table}")
    while batch := cur.fetchmany(BATCH):
        yield batch


def _meta(con: duckdb.DuckDBPyConnection, key: str) -> str | None:
    row = con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return str(row[0]) if row else None


def _check_empty(conn: psycopg.Connection) -> None:
    for table in TARGET_TABLES:
        if conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone() != (False,):
            if table == "store_identity":
                raise StoreRefused("the PostgreSQL store is already initialised; migrate into an empty database")
            raise StoreRefused(f"the PostgreSQL store is not empty (table {table} has rows);"
                               " migrate into an empty database")


def counts(data_dir: Path) -> dict[str, int]:
    """Rows per table of the stopped DuckDB store (for a progress bar's total)."""
    con = _source(data_dir)
    try:
        out = {}
        for table, _ in TABLES:
            row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
            out[table] = int(row[0]) if row else 0
        return out
    finally:
        con.close()


def migrate_store(data_dir: Path, url: str, master_key: bytes,
                  advance: Callable[[str, int], None] | None = None) -> MigrateReport:
    """Copy the stopped DuckDB store at ``data_dir`` into the empty PostgreSQL store at ``url``,
    its data keys re-wrapped under ``master_key``. ``advance(table, rows)`` reports progress.

    Raises StoreBusyError (a server holds ``data_dir``), MigrateUsageError (no store there, or one
    of another version, or a referenced key that does not open) and StoreRefused (the target is
    initialised or not empty, or unreachable); nothing is written to the target then."""
    busy = StoreBusyError(f"data dir {data_dir} is in use by a running server; stop it first")
    with held_if_present(data_dir, lambda: busy):
        source = _source(data_dir)
        try:
            return _copy(data_dir, source, url, master_key, advance or (lambda _t, _n: None))
        finally:
            source.close()


def _copy(data_dir: Path, source: duckdb.DuckDBPyConnection, url: str, master_key: bytes,
          advance: Callable[[str, int], None]) -> MigrateReport:
    # A rotation a crash interrupted is finished first (what any open of the store does), so the
    # key files below are all wrapped under the one master.key.
    finish_rotation(data_dir)
    try:
        old_master = AESGCM((data_dir / "master.key").read_bytes())
        page_cursor_key = (data_dir / "server.key").read_bytes()
    except (OSError, ValueError):
        raise MigrateUsageError(f"the store at {data_dir} has no readable master.key or server.key") from None
    new_master = AESGCM(master_key)
    referenced = sorted({r[0] for r in source.execute(
        "SELECT key_ref FROM candidates WHERE key_ref IS NOT NULL"
        " UNION SELECT key_ref FROM records WHERE key_ref IS NOT NULL").fetchall()})
    keys_dir = data_dir / KEYS_DIR
    rewrapped = []
    for key_ref in referenced:
        try:
            path = find_key_file(keys_dir, key_ref)
            if path is None:
                raise FileNotFoundError(key_ref)
            dek = unwrap(old_master, key_ref, path.read_bytes())
        except (OSError, InvalidTag):
            raise MigrateUsageError(f"the data key {key_ref} of the store at {data_dir} is missing or does not"
                                    " open (run: engram-memory admin verify)") from None
        rewrapped.append((key_ref, wrap(new_master, key_ref, dek)))
    on_disk = {p.name for p in key_files(keys_dir)}
    unreferenced = len(on_disk - {key_name(r) for r in referenced})
    store_id = _meta(source, "store_id") or "store_" + secrets.token_hex(16)
    epoch = _meta(source, "storage_epoch") or "0"
    report = MigrateReport(store_id, epoch, data_keys=len(rewrapped), unreferenced_keys=unreferenced)

    pool = connect_pool(url, 1)
    try:
        with pool.connection() as conn:
            migrate_schema(conn)
            with conn.transaction():
                # init-store takes the same lock: of two racing on one database, one wins.
                conn.execute("LOCK TABLE store_identity IN EXCLUSIVE MODE")
                _check_empty(conn)
                with conn.cursor() as cur:
                    for table, columns in TABLES:
                        copied = 0
                        with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                            for batch in _rows(source, table, columns):
                                for row in batch:
                                    copy.write_row(row)
                                copied += len(batch)
                                advance(table, len(batch))
                        report.rows[table] = copied
                    with cur.copy("COPY data_keys (key_ref, wrapped) FROM STDIN") as copy:
                        for row in rewrapped:
                            copy.write_row(row)
                    secret = wrap(new_master, SECRET_REF, page_cursor_key).hex()
                    model = _meta(source, EMBEDDING_MODEL_KEY)  # the store's model goes with it
                    cur.executemany("INSERT INTO meta VALUES (%s, %s)",
                                    [("store_id", store_id), ("storage_epoch", epoch), ("page_cursor_key", secret)]
                                    + ([(EMBEDDING_MODEL_KEY, model)] if model is not None else []))
                    # Last: the store is initialised only once everything above is in (one commit).
                    cur.execute("INSERT INTO store_identity VALUES (TRUE, %s, %s)",
                                [fingerprint(master_key), to_instant(wall_clock())])
                for table, copied in report.rows.items():  # what went in is what was read
                    found = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                    if found is None or int(found[0]) != copied:
                        raise StoreRefused(f"the copy of {table} is incomplete; nothing was migrated")
        return report
    finally:
        pool.close()
