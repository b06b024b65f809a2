"""``admin expire``: records past ``retention.expires_at`` stop being current now, journalled.

A server expires a scope's due records lazily, on the scope's next read; this runs the same
step (Lifecycle.expire_due, then the projections purge) for every scope or one, at once. On a
PostgreSQL store it runs against the live store (``expire_with`` on an admin engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engram_memory.models.settings import EngineSettings


def expire(data_dir: Path, scope_ref: str | None, now: int) -> dict[str, list[str]]:
    """scope_ref -> the record ids expired (scopes with none are listed with an empty list)."""
    from engram_memory.store.core.engine import Engine

    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        return expire_with(engine, scope_ref, now)
    finally:
        engine.close()


def expire_with(engine: Any, scope_ref: str | None, now: int) -> dict[str, list[str]]:
    """The expiry on an open engine: the data dir's own (DuckDB, its projections purged here), or an
    admin node of a shared store (store/core/admin_node.py), whose serving nodes purge theirs when
    they catch up from the journal (each expire event moves the scope's projection cursor)."""
    out: dict[str, list[str]] = {}
    with engine._rw.write():  # the engine's write lock: one writer, as every mutation
        engine._settle_locked(scope_ref)  # admissions waiting for their projections go in first
        for scope in [scope_ref] if scope_ref else engine.scopes():
            # On PostgreSQL each scope's expiry is one transaction under the scope's lock: a node
            # expiring the same records at once journals them once (Lifecycle.expire_due re-reads).
            expired = engine.lifecycle.expire_due(scope, now)
            if expired and not engine.db.shared:
                engine.projections.remove(scope, expired, engine.db.projection_cursor(scope))
            out[scope] = expired
    return out
