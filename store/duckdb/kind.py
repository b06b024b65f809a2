"""The DuckDB kind of store (store/backend.py ``EmbeddedBackend``): a store in a data dir that one
process serves, as the maintenance commands reach it while no server holds the directory.
``store/opening.py`` hands out ``DUCKDB``; nothing outside the backends imports this module."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from engram_memory.store.backend import StoppedStore
from engram_memory.store.duckdb import backend
from engram_memory.store.duckdb.inspect import StoreInspector


class DuckDBKind:
    store_file = backend.STORE_FILE

    def held(self, data_dir: Path, busy: Callable[[], Exception]) -> AbstractContextManager[None]:
        return backend.held_if_present(data_dir, busy)

    def inspector(self, data_dir: Path) -> StoreInspector:
        return StoreInspector(data_dir)

    def stopped(self, data_dir: Path) -> StoppedStore:
        return backend.inspect_stopped(data_dir)

    def journal_hashes(self, data_dir: Path, at: dict[str, int]) -> dict[str, str]:
        return backend.journal_hashes(data_dir, at)


DUCKDB = DuckDBKind()
