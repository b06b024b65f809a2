"""Which store a process opens: DuckDB in the data dir (the default), or a shared PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from engram_memory.models.settings import EngineSettings
from engram_memory.store.backend import Store, StoreRefused

MASTER_KEY_BYTES = 32


class MasterKeyError(StoreRefused):
    """The master key file is missing or is not a key (one line for the operator)."""


def read_master_key(path: Path) -> bytes:
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise MasterKeyError(f"cannot read the master key file {path}: {exc.strerror or exc}") from None
    if len(key) != MASTER_KEY_BYTES:
        raise MasterKeyError(f"the master key file {path} does not hold a {MASTER_KEY_BYTES}-byte key")
    return key


def open_store(settings: EngineSettings) -> Store:
    """Open the configured store; raises StoreBusyError when another process owns the data dir."""
    if settings.store is None:
        from engram_memory.store.duckdb.backend import Database

        return Database(settings.data_dir)
    from engram_memory.store.postgres.backend import PostgresStore

    if settings.master_key_file is None:
        raise MasterKeyError("a PostgreSQL store needs --master-key-file FILE")
    key = read_master_key(settings.master_key_file)
    return PostgresStore(settings.store, key, settings.data_dir, key_file=settings.master_key_file)
