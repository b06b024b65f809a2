"""Which store a process opens, and which kind of store a command works on: DuckDB in the data
dir (the default), or a shared PostgreSQL named by URL.

The one place outside store/duckdb/ and store/postgres/ that names a backend
(tests/test_store_boundary.py enforces it). Everything else asks here:

* ``open_store(settings)``: the ``Store`` a process serves;
* ``embedded()``: the ``EmbeddedBackend`` of a data dir's store (verify, history, rebuild, backup);
* ``shared(url)``: the ``SharedBackend`` of a store named by URL (admin commands with ``--store``,
  a backup or restore of one, the benchmarks' throwaway databases);
* ``check_store_options(url, master_key_file)``: a command's ``--store`` / ``--master-key-file`` pair.

psycopg is the ``postgres`` extra: the PostgreSQL backend is imported only when a URL is named,
and even then its driver only when a method needs it, so a DuckDB-only install never imports it.
"""

from __future__ import annotations

from pathlib import Path

from engram_memory.models.settings import EngineSettings, store_pair_problem
from engram_memory.store.backend import EmbeddedBackend, SharedBackend, Store, StoreRefused

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


def embedded() -> EmbeddedBackend:
    """The kind of store a data dir holds (DuckDB)."""
    from engram_memory.store.duckdb.kind import DUCKDB

    return DUCKDB


def shared(url: str | None = None) -> SharedBackend:
    """The kind of store a ``--store`` URL names. PostgreSQL is the one shared kind: any URL is
    its (``check_url`` says what is wrong with one that is not a PostgreSQL URL)."""
    from engram_memory.store.postgres.kind import POSTGRES

    return POSTGRES


def check_store_options(url: str | None, master_key_file: object) -> None:
    """A command's ``--store`` / ``--master-key-file`` pair: ValueError with the one line to print
    (the pair's rule: models/settings.py; the URL's: its backend's ``check_url``)."""
    problem = store_pair_problem(url, master_key_file)
    if problem:
        raise ValueError(problem)
    if url is not None:
        shared(url).check_url(url)
