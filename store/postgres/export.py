"""A PostgreSQL store copied into a new DuckDB data dir (what ``admin backup --store`` archives).

The inverse of store/postgres/migrate.py: every row of one read-only snapshot of the live store
(store/postgres/inspect.py) goes into a fresh DuckDB store with the same schema, and every data
key a row references is unwrapped with the PostgreSQL store's master key and written as a key
file under a new master key of the copy's own (``master.key``), as a DuckDB store keeps them; the
page-cursor key becomes ``server.key``. So the backup of a PostgreSQL store is the backup of an
ordinary DuckDB store (store/maintenance/backup.py): one archive format, restorable into either backend.
A key no row references in the snapshot (an open mutation's, or one being destroyed) is left out.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import duckdb
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.store.backend import EMBEDDING_MODEL_KEY
from engram_memory.store.core import crypto
from engram_memory.store.core.crypto import KEYS_DIR, wrap
from engram_memory.store.core.refusals import STORE_INCONSISTENT, AdminRefusal
from engram_memory.store.duckdb.backend import STORE_FILE
from engram_memory.store.duckdb.schema import REWRITE_PENDING
from engram_memory.store.duckdb.schema import migrate as duckdb_schema
from engram_memory.store.postgres.inspect import PostgresInspector
from engram_memory.store.postgres.migrate import TABLES

CHUNK = 200  # rows per multi-row INSERT (DuckDB pays its per-statement cost per statement, not per row)


def _private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def export_store(url: str, master_key: bytes, key_file: Path, data_dir: Path) -> dict[str, int]:
    """Write the PostgreSQL store at ``url`` as a new DuckDB store in ``data_dir`` (which must not
    exist); returns the rows copied per table. Raises StoreRefused (not a store, another master
    key) and AdminRefusal(STORE_INCONSISTENT) (a referenced data key missing or not opening)."""
    store = PostgresInspector(url, master_key, key_file)
    try:
        deks = {}
        for key_ref in sorted(store.referenced_keys()):
            dek = store.load_key(key_ref)
            if dek is None:
                raise AdminRefusal(STORE_INCONSISTENT, f"the data key {key_ref} is missing or does not open;"
                                   " nothing was backed up (run: engram-memory admin verify --store)")
            deks[key_ref] = dek
        page_cursor_key = store.page_cursor_key()
        data_dir.mkdir(mode=0o700)
        master = secrets.token_bytes(32)
        _private(data_dir / "master.key", master)
        _private(data_dir / "server.key", page_cursor_key)
        (data_dir / KEYS_DIR).mkdir(mode=0o700)
        wrapper = AESGCM(master)
        for key_ref, dek in deks.items():
            path = crypto.key_file(data_dir / KEYS_DIR, key_ref)
            path.parent.mkdir(mode=0o700, exist_ok=True)
            _private(path, wrap(wrapper, key_ref, dek))
        con = duckdb.connect(str(data_dir / STORE_FILE))
        try:
            duckdb_schema(con)
            con.execute("DELETE FROM meta WHERE key = ?", [REWRITE_PENDING])  # a fresh file: nothing freed
            copied: dict[str, int] = {}
            con.begin()
            for table, columns in TABLES:
                copied[table] = 0
                row_sql = "(" + ", ".join("?" * len(columns)) + ")"
                for batch in store.rows(table, columns, CHUNK):
                    con.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                                + ", ".join([row_sql] * len(batch)), [value for row in batch for value in row])
                    copied[table] += len(batch)
            meta = [("store_id", store.meta("store_id")), ("storage_epoch", store.meta("storage_epoch") or "0"),
                    (EMBEDDING_MODEL_KEY, store.meta(EMBEDDING_MODEL_KEY))]  # the store's model goes with it
            con.executemany("INSERT INTO meta VALUES (?, ?)", [[k, v] for k, v in meta if v is not None])
            con.commit()
            con.execute("CHECKPOINT")
        finally:
            con.close()
        os.chmod(data_dir / STORE_FILE, 0o600)
        return copied
    finally:
        store.close()
