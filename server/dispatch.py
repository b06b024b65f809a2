"""The tools/call pipeline, in the contract's order (REFERENCE §4.4):

bound context (-32603; signed per call over HTTP) -> unknown or ungranted tool (-32602)
-> bound purpose (-32603) -> rate limit (RATE_LIMITED) -> deadline (DEADLINE_EXCEEDED)
-> schema (INVALID_SCHEMA) -> confirmation (gate_failed / -32603; a client that cannot elicit:
the operator's queue, store/host/approvals.py) -> engine, in a worker
thread -> envelope.

Cancellation: a read is abandoned at once; a mutation that reached the engine runs to its
commit or rollback first (a worker thread is never interrupted mid-transaction), so a retry
with the same idempotency key reports the truth. MCP sends no answer to a cancelled request;
the audit row records CANCELLED.

Every answer that is not a protocol error is an envelope with a fresh auditId, recorded
through the engine's audit trail. No exception escapes a handler: an unexpected one becomes
a catalog code and its traceback goes to stderr only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from engram_memory.models.canonical import CanonicalizationError, nfc
from engram_memory.models.envelope import failure, new_audit_id, success
from engram_memory.models.errors import EngramError, ErrorCode, ProtocolError, context_unavailable, unknown_tool
from engram_memory.models.tools import parse_input, to_plain
from engram_memory.server.binding import Binding, LaunchBinder, SignedBinder
from engram_memory.server.gate import Approval, GateFailed, OperatorApproval
from engram_memory.server.ratelimit import RateLimiter
from engram_memory.server.tools import MUTATING
from engram_memory.store.backend import is_store_error
from engram_memory.store.core.engine import AuditEvent, Engine
from engram_memory.store.host.approvals import admit_or_park

log = logging.getLogger("engram_memory.server")


# Where each tool's purpose_ref sits in the raw arguments (TOOL_CONTRACT §0, REFERENCE §5.4).
_PURPOSE_PATH: dict[str, tuple[str, ...]] = {
    "search": ("purpose_ref",),
    "get": ("purpose_ref",),
    "capture": ("payload", "purpose_ref"),
}


def envelope_result(envelope: dict[str, Any]) -> types.CallToolResult:
    # The text copy is the same JSON, so a client without structuredContent reads the same bytes.
    text = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=envelope,
        is_error=not envelope["ok"],
    )


def to_mcp_error(exc: ProtocolError) -> MCPError:
    return MCPError(code=exc.code, message=exc.message)


def check_purpose(tool: str, arguments: Mapping[str, Any], bound_purpose: str) -> None:
    """A purpose_ref that is a string and differs from the bound one is a protocol rejection.

    A missing or non-string purpose_ref is left to the schema step (INVALID_SCHEMA).
    """
    path = _PURPOSE_PATH.get(tool)
    if path is None:
        return
    node: Any = arguments
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return
        node = node[key]
    if not isinstance(node, str):
        return
    try:
        matches = nfc(node) == bound_purpose
    except CanonicalizationError:  # a lone surrogate can never equal a valid purpose
        matches = False
    if not matches:
        raise context_unavailable()


def classify_unexpected(exc: BaseException, tool: str, engine_started: bool) -> str:
    """The catalog code for an exception nobody mapped (never a stack trace to the caller)."""
    if engine_started and tool in MUTATING:
        return "MUTATION_OUTCOME_UNKNOWN"  # it may have committed: the caller retries with the same key
    if is_store_error(exc) or isinstance(exc, OSError):  # the store, not the request, failed
        return "STORE_UNAVAILABLE"
    return "CAPABILITY_UNAVAILABLE"


class Dispatcher:
    def __init__(
        self,
        engine: Engine | None,
        binder: LaunchBinder | SignedBinder,
        limiter: RateLimiter | None = None,
        wall_ms: Any = None,
    ) -> None:
        # engine is None exactly when memory is disabled: nothing is listed, every call is -32602.
        self.engine = engine
        self.binder = binder
        self.limiter = limiter or RateLimiter(0, 1)
        self.wall_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)

    async def list_tools(
        self, rctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        binding = self.binder.bind(rctx, params.meta if params is not None else None, listing=True)
        if binding is None or self.engine is None:
            return types.ListToolsResult(tools=[])  # no valid context: nothing exists
        return types.ListToolsResult(tools=binding.registry.definitions())

    async def call_tool(
        self,
        rctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        preapproved: Approval | None = None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """``preapproved``: a relay that took the directory over carries its human's approval."""
        binding = self.binder.bind(rctx, params.meta)
        if binding is None:
            if isinstance(self.binder, LaunchBinder):
                raise to_mcp_error(unknown_tool())  # memory disabled: no tool exists
            raise to_mcp_error(context_unavailable())
        entry = binding.registry.resolve(params.name)
        if entry is None or self.engine is None:
            raise to_mcp_error(unknown_tool())
        tool, engine, host = entry.tool, self.engine, binding.host
        arguments: dict[str, Any] = dict(params.arguments or {})
        try:
            check_purpose(tool, arguments, host.purpose_ref)
        except ProtocolError as exc:
            log.warning("%s refused: purpose_ref differs from the bound purpose", params.name)
            raise to_mcp_error(exc) from None

        audit_id = new_audit_id()
        model: Any = None
        engine_started = False
        try:
            if not self.limiter.allow(host.tenant, host.principal):
                raise EngramError(ErrorCode.RATE_LIMITED, "per-principal rate limit")
            self._check_deadline(binding)
            model = parse_input(tool, arguments)
            if tool in binding.confirm and preapproved is not None:
                approval: Approval | None = preapproved
            elif tool in binding.confirm:
                try:
                    decision = await self.binder.confirm(rctx, params, tool, arguments, binding)
                except OperatorApproval as queued:
                    # No human to ask here: the operator's queue answers (gate_failed until approved;
                    # once approved, the engine below replays the answer the approval produced).
                    await anyio.to_thread.run_sync(admit_or_park, engine, host, tool, model, queued.ttl_s)
                    decision = None
                if isinstance(decision, types.InputRequiredResult):
                    return decision  # the 2026-era client retries with the human's answer
                approval = decision
            else:
                approval = None

            def run() -> dict[str, Any]:
                nonlocal engine_started
                if approval is not None:
                    approval.ensure_fresh(time.monotonic())
                self._check_deadline(binding)
                engine_started = True
                # The engine returns the tool's output value model (validated on the way out);
                # the wire carries its plain JSON form.
                return to_plain(getattr(engine, tool)(host, model))

            value = await self._run(tool, run, binding)
            envelope = success(value, audit_id)
        except ProtocolError as exc:
            raise to_mcp_error(exc) from None
        except MCPError:
            raise
        except GateFailed as exc:
            log.info("%s %s: gate_failed (%s)", params.name, audit_id, exc)
            envelope = failure("gate_failed", audit_id)
        except EngramError as exc:
            log.info("%s %s: %s %s", params.name, audit_id, exc.code, exc.detail)
            envelope = failure(exc.code, audit_id)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._audit(binding, audit_id, tool, failure(ErrorCode.CANCELLED, audit_id), model)
            raise
        except Exception as exc:  # the adapter's last line: never a handler exception on the wire
            code = classify_unexpected(exc, tool, engine_started)
            log.exception("%s %s: unexpected failure mapped to %s", params.name, audit_id, code)
            envelope = failure(code, audit_id)

        await self._audit(binding, audit_id, tool, envelope, model)
        return envelope_result(envelope)

    def _check_deadline(self, binding: Binding) -> None:
        if binding.deadline_ms is not None and self.wall_ms() >= binding.deadline_ms:
            raise EngramError(ErrorCode.DEADLINE_EXCEEDED, "deadline passed")

    async def _run(self, tool: str, run: Any, binding: Binding) -> dict[str, Any]:
        """The engine call in a worker thread, under the context's deadline.

        A read past its deadline is abandoned (its thread finishes unseen); a mutation that
        started is awaited to its end, and its true outcome is the answer.
        """
        if tool in MUTATING or binding.deadline_ms is None:
            return await anyio.to_thread.run_sync(run)
        remaining = (binding.deadline_ms - self.wall_ms()) / 1000
        with anyio.move_on_after(max(0.0, remaining)):
            return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        raise EngramError(ErrorCode.DEADLINE_EXCEEDED, "deadline passed during the read")

    async def _audit(
        self, binding: Binding, audit_id: str, tool: str, envelope: dict[str, Any], model: Any
    ) -> None:
        """Record the call; a failing audit write is logged, never turned into the call's answer.

        By now the operation's outcome is decided (possibly committed): reporting it as failed
        because the audit row did not land would make the caller believe nothing happened.
        """
        engine = self.engine
        if engine is None:
            return
        event = AuditEvent(
            audit_id=audit_id,
            tool=tool,
            ok=bool(envelope["ok"]),
            code=None if envelope["ok"] else envelope["error"]["code"],
            idempotency_key=getattr(model, "idempotency_key", None),
            context_jti=binding.jti,
        )
        try:
            await anyio.to_thread.run_sync(engine.record_audit, binding.host, event)
        except Exception:
            log.exception("audit record %s could not be written", audit_id)
