"""The PostgreSQL kind of store (store/backend.py ``SharedBackend``): a store named by URL that
several serving nodes share, as an operator's command, a restore and the benchmarks reach it.
``store/opening.py`` hands out ``POSTGRES``; nothing outside the backends imports this module.

psycopg is the ``postgres`` extra: this module imports none of it, and each method imports the
module it needs when called, so ``check_url`` (store/postgres/url.py) can tell a DuckDB-only
install in one line what to add, and ``redact_url`` works without the driver."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engram_memory.store.backend import MigrateReport
from engram_memory.store.postgres import url as url_rules

if TYPE_CHECKING:
    from engram_memory.store.postgres.inspect import PostgresInspector


class PostgresKind:
    name = "PostgreSQL"

    def check_url(self, text: str) -> str:
        return url_rules.check_store_url(text)

    def redact_url(self, text: str) -> str:
        return url_rules.redact_url(text)

    def inspector(self, url: str, master_key: bytes | None = None,
                  key_file: Path | None = None) -> PostgresInspector:
        from engram_memory.store.postgres.inspect import PostgresInspector

        return PostgresInspector(url, master_key, key_file)

    def init_store(self, url: str, master_key: bytes) -> str:
        from engram_memory.store.postgres.backend import init_store

        return init_store(url, master_key)

    def migrate_counts(self, data_dir: Path) -> dict[str, int]:
        from engram_memory.store.postgres.migrate import counts

        return counts(data_dir)

    def migrate_store(self, data_dir: Path, url: str, master_key: bytes,
                      advance: Callable[[str, int], None] | None = None) -> MigrateReport:
        from engram_memory.store.postgres.migrate import migrate_store

        return migrate_store(data_dir, url, master_key, advance)

    def export_store(self, url: str, master_key: bytes, key_file: Path, data_dir: Path) -> dict[str, int]:
        from engram_memory.store.postgres.export import export_store

        return export_store(url, master_key, key_file, data_dir)

    def store_heads(self, url: str, store_id: str) -> dict[str, tuple[int, str]] | None:
        from engram_memory.store.postgres.inspect import store_heads

        return store_heads(url, store_id)

    def rotate_master_key(self, url: str, old_key: bytes, old_key_file: Path, new_key: bytes) -> int:
        from engram_memory.store.postgres.keys import rotate_master_key

        return rotate_master_key(url, old_key, old_key_file, new_key)

    def reachable(self, url: str, timeout_s: int = 10) -> bool:
        from engram_memory.store.postgres.databases import reachable

        return reachable(url, timeout_s)

    def create_database(self, admin_url: str, prefix: str) -> str:
        from engram_memory.store.postgres.databases import create_database

        return create_database(admin_url, prefix)

    def drop_database(self, admin_url: str, url: str) -> None:
        from engram_memory.store.postgres.databases import drop_database

        drop_database(admin_url, url)

    def backend_pids(self, url: str) -> list[int]:
        from engram_memory.store.postgres.databases import backend_pids

        return backend_pids(url)


POSTGRES = PostgresKind()
