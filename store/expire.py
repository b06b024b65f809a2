"""``admin expire``: records past ``retention.expires_at`` stop being current now, journalled.

A server expires a scope's due records lazily, on the scope's next read; this runs the same
step (Lifecycle.expire_due, then the projections purge) for every scope or one, at once."""

from __future__ import annotations

from pathlib import Path

from engram_memory.models.settings import EngineSettings


def expire(data_dir: Path, scope_ref: str | None, now: int) -> dict[str, list[str]]:
    """scope_ref -> the record ids expired (scopes with none are listed with an empty list)."""
    from engram_memory.store.engine import Engine

    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        out: dict[str, list[str]] = {}
        with engine._rw.write():  # the engine's write lock: one writer, as every mutation
            for scope in [scope_ref] if scope_ref else engine.scopes():
                expired = engine.lifecycle.expire_due(scope, now)
                if expired:
                    engine.projections.remove(scope, expired, engine.db.projection_cursor(scope))
                out[scope] = expired
        return out
    finally:
        engine.close()
