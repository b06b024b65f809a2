"""The confirmation gate: a human approval through MCP elicitation (REFERENCE §5.5, §12.2).

withdraw and forget are always gated; capture and request_admission when the host's
--confirm names them. Two wire forms, one rule:

* handshake-era connections: the server sends ``elicitation/create`` (form mode, one
  required boolean ``confirm``) on the calling request's back-channel and waits;
* 2026-07-28 connections forbid server-initiated requests: the call answers an
  ``InputRequiredResult`` carrying the same elicitation plus a signed ``request_state``;
  the client retries with the human's answer, and the state binds that answer to this
  tool, these exact arguments and this scope (one use, TTL-bound).

Only ``accept`` with ``{"confirm": true}`` releases the gate. Decline, cancel,
``confirm`` false, an error answer or no answer within the TTL is ``gate_failed``. A
client that did not declare form elicitation cannot confirm here: its call waits in the
operator's queue (store/host/approvals.py; the agent is answered gate_failed and retries with the same
idempotency key), or, with ``confirm_fallback = "off"``, it is a missing confirmation reference,
the protocol error -32603. An approval must be used within 30 s.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.context import ALWAYS_CONFIRMED, TOOL_PREFIX, HostContext
from engram_memory.models.digests import receipt_digest
from engram_memory.models.errors import context_unavailable
from engram_memory.models.limits import CONFIRM_TTL_S, EXECUTION_WINDOW_S, SECOND_MS
from engram_memory.server.config import ServeSettings

# The engine call must start within EXECUTION_WINDOW_S of the approval (models/limits.py).
INPUT_KEY = "confirm"

CONFIRM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "confirm": {
            "type": "boolean",
            "title": "Approve",
            "description": "Approve this memory operation.",
            "default": False,  # fail safe: a form submitted untouched does not approve
        }
    },
    "required": ["confirm"],
}

# What each gated tool does, in words for the human. Never the memory text: the target id only.
_ACTIONS: dict[str, str] = {
    "capture": "store a new pending memory candidate (unsearchable until admitted)",
    "request_admission": "ask the admission policy to admit candidate {target} as a memory record",
    "withdraw": "withdraw pending candidate {target}; its encrypted content becomes unreadable",
    "forget": "permanently forget record {target}; it leaves search and get and cannot be restored",
}


class GateFailed(Exception):
    """The confirmation gate was not satisfied (envelope code gate_failed). Text: audit only."""


class OperatorApproval(Exception):  # noqa: N818 - an outcome of the gate, not an error
    """The client cannot ask its human: the call goes to the operator's queue (store/host/approvals.py),
    whose answer (approved, or gate_failed) the dispatcher gives. ``ttl_s``: how long it waits."""

    def __init__(self, ttl_s: float) -> None:
        super().__init__("no elicitation: the operator decides")
        self.ttl_s = ttl_s


@dataclass(frozen=True)
class Approval:
    approved_at: float  # the gate clock (monotonic seconds) when the human approved

    def ensure_fresh(self, now: float) -> None:
        if now - self.approved_at > EXECUTION_WINDOW_S:
            raise GateFailed(f"execution window of {EXECUTION_WINDOW_S} s after approval elapsed")


def _target(arguments: Mapping[str, Any]) -> str | None:
    for key in ("record_id", "candidate_id"):
        value = arguments.get(key)
        if isinstance(value, str):
            return value
    return None


def confirmation_message(tool: str, arguments: Mapping[str, Any], host: HostContext) -> str:
    action = _ACTIONS[tool].format(target=_target(arguments) or "")
    return (
        f"Agent {host.agent_id} asks to {action}. Tool: {TOOL_PREFIX}{tool}. "
        f"Scope: {host.scope_ref}. Approve?"
    )


def binding_digest(tool: str, arguments: Mapping[str, Any], host: HostContext) -> str:
    """Binds an approval to capability, target, exact arguments, scope and principal."""
    return receipt_digest(
        "confirmation-binding",
        {
            "capability": TOOL_PREFIX + tool,
            "target": _target(arguments) or "",
            "arguments_digest": "sha256:" + hashlib.sha256(canonical_bytes(dict(arguments))).hexdigest(),
            "scope_ref": host.scope_ref,
            "principal": host.principal,
            "agent_id": host.agent_id,
        },
    )


def is_approval(result: Any) -> bool:
    if isinstance(result, types.ElicitResult):
        answer = result
    else:
        try:
            answer = types.ElicitResult.model_validate(
                result.model_dump(by_alias=True, mode="json") if hasattr(result, "model_dump") else result,
                by_name=False,
            )
        except (ValidationError, TypeError):
            return False
    content = answer.content
    # `is True`: a 1 or "true" is not a boolean approval.
    return answer.action == "accept" and isinstance(content, dict) and content.get("confirm") is True


def can_form_elicit(capabilities: types.ClientCapabilities | None) -> bool:
    if capabilities is None or capabilities.elicitation is None:
        return False
    e = capabilities.elicitation
    # An empty elicitation object is the pre-2025-11-25 spelling of form support.
    return e.form is not None or e.url is None


class ConfirmationGate:
    def __init__(
        self,
        confirm: frozenset[str],
        ttl_s: float = CONFIRM_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        queue: bool = False,
    ) -> None:
        self.gated = ALWAYS_CONFIRMED | confirm
        # A client without elicitation: its calls go to the operator's queue (True), or -32603.
        self.queue = queue
        self.ttl_s = float(min(ttl_s, CONFIRM_TTL_S))
        self.clock = clock
        self._wall_ms = wall_ms
        # Per process: a restart invalidates outstanding request_state, which fails closed.
        self._secret = secrets.token_bytes(32)
        self._used: dict[str, int] = {}  # nonce -> issued_at ms, kept for one TTL

    def required(self, tool: str) -> bool:
        return tool in self.gated

    async def confirm(
        self,
        rctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        tool: str,
        arguments: Mapping[str, Any],
        host: HostContext,
    ) -> Approval | types.InputRequiredResult:
        """Approval, or an InputRequiredResult to hand back (2026 era). Raises GateFailed / ProtocolError,
        or OperatorApproval for a client that cannot elicit when the host queues its calls."""
        if not can_form_elicit(rctx.session.client_capabilities):
            if self.queue:
                raise OperatorApproval(self.ttl_s)
            raise context_unavailable()
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message=confirmation_message(tool, arguments, host), requested_schema=CONFIRM_SCHEMA
            )
        )
        if rctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self._round_trip(params, tool, arguments, host, request)
        if not rctx.session.can_send_request:  # e.g. stateless HTTP: no way to reach the human
            raise context_unavailable()
        return await self._elicit(rctx, request)

    async def _elicit(self, rctx: ServerRequestContext[Any, Any], request: types.ElicitRequest) -> Approval:
        result: types.ElicitResult | None = None
        with anyio.move_on_after(self.ttl_s):
            try:
                result = await rctx.session.send_request(
                    request,
                    types.ElicitResult,
                    request_read_timeout_seconds=self.ttl_s,
                    metadata=ServerMessageMetadata(related_request_id=rctx.request_id),
                )
            except (MCPError, ValidationError, TimeoutError) as exc:
                raise GateFailed(f"elicitation failed: {type(exc).__name__}") from None
        if result is None:
            raise GateFailed("no answer within the confirmation TTL")
        if not is_approval(result):
            raise GateFailed(f"not approved: {result.action}")
        return Approval(self.clock())

    # --- 2026-07-28 multi-round-trip form -------------------------------------------------

    def _round_trip(
        self,
        params: types.CallToolRequestParams,
        tool: str,
        arguments: Mapping[str, Any],
        host: HostContext,
        request: types.ElicitRequest,
    ) -> Approval | types.InputRequiredResult:
        binding = binding_digest(tool, arguments, host)
        if params.request_state is None:
            # Answers without our state were not asked for: ask (again) instead of trusting them.
            return types.InputRequiredResult(
                input_requests={INPUT_KEY: request}, request_state=self._issue(binding)
            )
        now = self._wall_ms()
        claims = self._verify(params.request_state)
        if claims.get("binding") != binding:
            raise GateFailed("request_state bound to another operation")
        issued = claims.get("iat")
        if not isinstance(issued, int) or not 0 <= now - issued <= self.ttl_s * SECOND_MS:
            raise GateFailed("confirmation expired")
        nonce = str(claims.get("nonce"))
        self._used = {n: t for n, t in self._used.items() if now - t <= self.ttl_s * SECOND_MS}
        if nonce in self._used:
            raise GateFailed("confirmation already used")
        self._used[nonce] = issued
        answer = (params.input_responses or {}).get(INPUT_KEY)
        if answer is None or not is_approval(answer):
            raise GateFailed("not approved")
        return Approval(self.clock())

    def _issue(self, binding: str) -> str:
        claims = {"v": 1, "binding": binding, "iat": self._wall_ms(), "nonce": secrets.token_hex(16)}
        body = base64.urlsafe_b64encode(canonical_bytes(claims)).decode("ascii")
        return body + "." + self._sign(body)

    def _sign(self, body: str) -> str:
        mac = hmac.new(self._secret, body.encode("ascii"), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode("ascii")

    def _verify(self, state: str) -> dict[str, Any]:
        body, _, sig = state.partition(".")
        if not state.isascii() or not sig or not hmac.compare_digest(sig, self._sign(body)):
            raise GateFailed("request_state signature invalid")
        try:
            claims = json.loads(base64.urlsafe_b64decode(body.encode("ascii")))
        except (ValueError, UnicodeError):
            raise GateFailed("request_state undecodable") from None
        if not isinstance(claims, dict) or claims.get("v") != 1:
            raise GateFailed("request_state version")
        return claims


def confirmation_gate(cfg: ServeSettings) -> ConfirmationGate:
    """A stdio launch's gate: its confirm set, its TTL, and what a client without elicitation gets."""
    return ConfirmationGate(frozenset(cfg.confirm), ttl_s=cfg.confirm_ttl_seconds,
                            queue=cfg.confirm_fallback == "queue")
