"""The engine a launch opens and the dispatchers it serves: stdio's, over the context its host bound
at launch, and HTTP's and the owner socket's, over a context signed per call. server/app.py (the
listeners) and server/relay.py (a stdio launch taking its data dir over) both build on it.
"""

from __future__ import annotations

from pathlib import Path

from engram_memory.server.binding import KeyRing, LaunchBinder, SignedBinder, wording
from engram_memory.server.config import ServeConfig
from engram_memory.server.dispatch import Dispatcher
from engram_memory.server.gate import ConfirmationGate, confirmation_gate
from engram_memory.server.ratelimit import RateLimiter
from engram_memory.store.core.engine import Engine
from engram_memory.store.screen import lazy as screen


def open_engine(cfg: ServeConfig) -> Engine:
    """Open the store; raises StoreBusyError when another process holds the data dir."""
    Path(cfg.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    engine = Engine.open(cfg.engine_settings())  # the engine sees its own options, not the serve context
    screen.warm()
    return engine


def launch_dispatcher(cfg: ServeConfig, engine: Engine | None, gate: ConfirmationGate | None = None) -> Dispatcher:
    """stdio: the context the host bound at launch. ``engine`` is None exactly when memory is off."""
    enabled = cfg.memory_enabled and engine is not None
    gate = gate or confirmation_gate(cfg)
    binder = LaunchBinder(cfg.host_context() if enabled else None, cfg.tools, gate, wording(cfg))
    return Dispatcher(engine if enabled else None, binder, limiter_for(cfg))


def signed_dispatcher(cfg: ServeConfig, engine: Engine, ring: KeyRing) -> Dispatcher:
    """HTTP and the local socket: each call carries a context signed by a host in ``ring``."""
    return Dispatcher(engine, SignedBinder(ring, wording=wording(cfg), replay=engine.db.replay_guard()),
                      limiter_for(cfg))


def limiter_for(cfg: ServeConfig) -> RateLimiter:
    return RateLimiter(cfg.rate_limit, cfg.rate_burst)
