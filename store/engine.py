"""The engine facade: the six operations over DuckDB and the projections (no MCP here).

INTERFACE STUB — being implemented; the signatures below are the contract with server/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.context import HostContext, HostPolicy


class StoreBusyError(RuntimeError):
    """Another process owns the data directory (DuckDB allows one writer)."""


@dataclass(frozen=True)
class EngineConfig:
    data_dir: Path
    policy: HostPolicy = field(default_factory=HostPolicy)
    model_path: Path | None = None  # None: the packaged model
    semantic: bool = True  # load the embedding model in the background
    fusion: str = "rrf"  # rrf | dbsf | convex
    rrf_k: int = 60
    clock: Callable[[], int] | None = None  # epoch milliseconds; None: wall clock


@dataclass(frozen=True)
class AuditEvent:
    audit_id: str
    tool: str
    ok: bool
    code: str | None  # error code, or None on success
    idempotency_key: str | None  # stored only as "idk_" + 12 hex of its SHA-256


class Engine:
    @classmethod
    def open(cls, config: EngineConfig) -> Engine:  # raises StoreBusyError
        raise NotImplementedError

    # Each takes the validated input model from models.tools and returns the plain `value`
    # dict of the tool's output (models.outputs); refusals raise models.errors.EngramError.
    def search(self, ctx: HostContext, args: Any) -> dict[str, Any]: ...
    def get(self, ctx: HostContext, args: Any) -> dict[str, Any]: ...
    def capture(self, ctx: HostContext, args: Any) -> dict[str, Any]: ...
    def request_admission(self, ctx: HostContext, args: Any) -> dict[str, Any]: ...
    def withdraw(self, ctx: HostContext, args: Any) -> dict[str, Any]: ...
    def forget(self, ctx: HostContext, args: Any) -> dict[str, Any]: ...
    def record_audit(self, ctx: HostContext, event: AuditEvent) -> None: ...
    def close(self) -> None: ...
