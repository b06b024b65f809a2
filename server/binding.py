"""Who is calling: the invocation context bound to each call, and its confirmation.

Two sources, one shape (:class:`Binding`):

* :class:`LaunchBinder` - stdio: the context the host fixed at launch; confirmations go to
  the human through MCP elicitation (:mod:`engram_memory.server.gate`).
* :class:`SignedBinder` - HTTP and the local socket: the host signs a context per call
  (``_meta["io.sentropic.engram/context"]``) and, for a confirmed tool, a confirmation bound
  to the exact operation (``_meta["io.sentropic.engram/confirmation"]``).

Every refusal of the context is the same protocol error (-32603); why is logged only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext

from engram_memory.models.context import ALWAYS_CONFIRMED, HostContext
from engram_memory.models.errors import context_unavailable
from engram_memory.models.hostauth import (
    CONFIRMATION_META_KEY,
    CONTEXT_META_KEY,
    OPERATOR_APPROVAL_META_KEY,
    ConfirmationClaims,
    ContextClaims,
    ReplayCache,
    TokenRefused,
    confirmation_fresh,
    confirmation_target,
    operation_digest,
    read_token,
    verify,
)
from engram_memory.models.limits import CONFIRM_TTL_S, TURN_TYPES
from engram_memory.models.settings import EngineSettings
from engram_memory.server.config import ConfigError
from engram_memory.server.gate import Approval, ConfirmationGate, GateFailed, OperatorApproval
from engram_memory.server.hostkeys import HostKeys, load_host_keys
from engram_memory.server.tools import ToolRegistry
from engram_memory.store.backend import ReplayGuard

log = logging.getLogger("engram_memory.server")

# Where the HTTP layer leaves the host it authenticated by bearer token (server/http.py).
BEARER_KID_SCOPE_KEY = "engram.bearer_kid"


@dataclass(frozen=True)
class Binding:
    host: HostContext
    registry: ToolRegistry  # exactly the granted tools, described for this confirm set
    confirm: frozenset[str]
    jti: str | None = None  # the signed context's id, for the audit trail
    deadline_ms: int | None = None
    kid: str | None = None


@dataclass(frozen=True)
class Wording:
    """What the server's settings change in its tool descriptions."""

    semantic: bool = True  # False: search says this server has no semantic channel
    turn_types: tuple[str, ...] = TURN_TYPES  # capture names the host's conversation-turn types


def wording(cfg: EngineSettings) -> Wording:
    """The tool descriptions' settings-dependent parts, from the launch settings."""
    return Wording(semantic=cfg.semantic, turn_types=tuple(cfg.turn_types))


@lru_cache(maxsize=256)
def registry_for(tools: frozenset[str], confirm: frozenset[str], wording: Wording = Wording()) -> ToolRegistry:
    """Registries are pure functions of the grant and the wording: build each combination once."""
    return ToolRegistry(tools, confirm, wording.semantic, wording.turn_types)


class LaunchBinder:
    """The launch-bound context (stdio); ``host`` None: memory disabled, nothing listed."""

    def __init__(self, host: HostContext | None, tools: tuple[str, ...], gate: ConfirmationGate,
                 wording: Wording = Wording()) -> None:
        self.gate = gate
        confirm = frozenset(gate.gated)
        self._binding = (
            None if host is None else Binding(host, registry_for(frozenset(tools), confirm, wording), confirm)
        )

    def bind(self, rctx: ServerRequestContext[Any, Any], meta: Mapping[str, Any] | None,
             listing: bool = False) -> Binding | None:
        return self._binding

    async def confirm(
        self,
        rctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        tool: str,
        arguments: Mapping[str, Any],
        binding: Binding,
    ) -> Approval | types.InputRequiredResult:
        return await self.gate.confirm(rctx, params, tool, arguments, binding.host)


class KeyRing:
    """The host keys, swapped whole on reload (SIGHUP): a call sees the old or the new set."""

    def __init__(self, path: Path | None, keys: HostKeys) -> None:
        self.path = path
        self.keys = keys

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        return cls(path, load_host_keys(path))

    def reload(self) -> bool:
        if self.path is None:
            return False
        try:
            keys = load_host_keys(self.path)
        except ConfigError as exc:
            log.error("host keys not reloaded, keeping %d host(s): %s", len(self.keys.hosts), exc)
            return False
        self.keys = keys
        log.info("host keys reloaded: %d host(s)", len(keys.hosts))
        return True


class SignedBinder:
    """Per-call contexts and confirmations signed by a host in the key ring."""

    def __init__(self, ring: KeyRing, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, wording: Wording = Wording(),
                 replay: ReplayGuard | None = None) -> None:
        self.ring = ring
        self.wording = wording
        self.clock = clock
        self.monotonic = monotonic
        # Contexts: the store's guard (shared by every node of a PostgreSQL store). Confirmations
        # answer a challenge only the issuing node holds, so its memory is enough.
        self._contexts: ReplayGuard = replay if replay is not None else ReplayCache()
        self._confirmations = ReplayCache()
        self._lock = threading.Lock()

    def bind(self, rctx: ServerRequestContext[Any, Any], meta: Mapping[str, Any] | None,
             listing: bool = False) -> Binding | None:
        """The verified context, or None (the caller answers -32603 or an empty listing).

        ``listing``: a tools/list. The SDK's client lists tools unsigned when it connects, so an
        unsigned listing is expected traffic, logged at DEBUG; every other refusal is a WARNING."""
        raw = (meta or {}).get(CONTEXT_META_KEY)
        try:
            token, kid = read_token(raw)
            keys = self.ring.keys
            host_key = keys.hosts.get(kid)
            if host_key is None:
                raise TokenRefused("unknown kid")
            bearer_kid = _bearer_kid(rctx)
            if bearer_kid is not None and bearer_kid != kid:
                raise TokenRefused("signed by another host than the bearer's")
            now = self.clock()
            claims: ContextClaims = verify(token, host_key.public_key, keys.server_id, now, ContextClaims)
            if not host_key.binds(claims.tenant, claims.workspace):
                raise TokenRefused(f"scope outside host {kid}'s scopes")
            if not self._contexts.claim(kid, claims.jti, claims.exp, now):
                raise TokenRefused("context replayed")
            host = claims.host()
        except (TokenRefused, ValueError) as exc:
            expected = listing and raw is None
            log.log(logging.DEBUG if expected else logging.WARNING, "invocation context refused: %s", exc)
            return None
        confirm = frozenset(claims.confirm) | ALWAYS_CONFIRMED
        return Binding(
            host=host,
            registry=registry_for(frozenset(claims.tools), confirm, self.wording),
            confirm=confirm,
            jti=claims.jti,
            deadline_ms=claims.deadline_ms(),
            kid=kid,
        )

    async def confirm(
        self,
        rctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        tool: str,
        arguments: Mapping[str, Any],
        binding: Binding,
    ) -> Approval | types.InputRequiredResult:
        raw = (params.meta or {}).get(CONFIRMATION_META_KEY)
        if raw is None:
            queued = (params.meta or {}).get(OPERATOR_APPROVAL_META_KEY)
            if isinstance(queued, int | float) and not isinstance(queued, bool) and queued > 0:
                # The host (e.g. a stdio relay whose client cannot elicit) asks the operator's queue.
                raise OperatorApproval(min(float(queued), float(CONFIRM_TTL_S)))
            raise context_unavailable()  # a confirmation reference is missing: protocol error
        try:
            token, kid = read_token(raw)
            keys = self.ring.keys
            host_key = keys.hosts.get(kid)
            if host_key is None or kid != binding.kid:
                raise TokenRefused("confirmation not signed by the context's host")
            if not host_key.binds(binding.host.tenant, binding.host.workspace):
                raise TokenRefused(f"scope outside host {kid}'s scopes")  # narrowed since the context
            now = self.clock()
            claims: ConfirmationClaims = verify(token, host_key.public_key, keys.server_id, now, ConfirmationClaims)
        except TokenRefused as exc:
            raise GateFailed(f"confirmation refused: {exc}") from None
        if claims.capability != tool:
            raise GateFailed("confirmation bound to another capability")
        if claims.target != confirmation_target(arguments):
            raise GateFailed("confirmation bound to another target")
        if claims.operation_digest != operation_digest(tool, binding.host, arguments):
            raise GateFailed("confirmation bound to another operation")
        if not confirmation_fresh(claims, now):
            raise GateFailed("confirmation arrived after the execution window")
        if not self._confirmations.claim(kid, claims.jti, claims.exp, now):
            raise GateFailed("confirmation already used")
        # The execution window runs from the approval's signature, not from its arrival.
        return Approval(self.monotonic() - max(0.0, now - claims.iat))


def _bearer_kid(rctx: ServerRequestContext[Any, Any]) -> str | None:
    request = getattr(rctx, "request", None)
    scope = getattr(request, "scope", None)
    if isinstance(scope, Mapping):
        kid = scope.get(BEARER_KID_SCOPE_KEY)
        return kid if isinstance(kid, str) else None
    return None
