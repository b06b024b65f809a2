"""Where the store is opened: the DuckDB backend (store/duckdb/), under its historical name."""

from engram_memory.store.backend import StoreBusyError
from engram_memory.store.duckdb.backend import Database, held_if_present, inspect_stopped

__all__ = ["Database", "StoreBusyError", "held_if_present", "inspect_stopped"]
