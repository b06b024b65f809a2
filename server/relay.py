"""A stdio launch's front: the engine in this process, or a relay to the directory's owner.

Each stdio launch binds one context (its host's flags). The first launch on a data
directory owns it: it serves its host from the engine and opens the owner socket for the
others (:mod:`engram_memory.server.local`). A launch that finds the directory owned relays:
it lists its own granted tools, asks its own human to confirm (elicitation stays with the
host that made the call), and forwards each call to the owner with a freshly signed context
and, once approved, a signed confirmation. When the owner goes away, the relay takes the
directory over (or finds the new owner) and re-sends the call in flight: same arguments,
same idempotency key, so a mutation is applied once and the answer is the truth.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any, cast

import anyio
import mcp_types as types
from anyio.abc import TaskGroup, TaskStatus
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from engram_memory.models.envelope import failure
from engram_memory.models.errors import (
    PROTOCOL_CONTEXT_CODE,
    PROTOCOL_CONTEXT_MESSAGE,
    PROTOCOL_UNKNOWN_TOOL_CODE,
    PROTOCOL_UNKNOWN_TOOL_MESSAGE,
    EngramError,
    ErrorCode,
    ProtocolError,
    unknown_tool,
)
from engram_memory.models.hostauth import CONFIRMATION_META_KEY, CONTEXT_META_KEY, OPERATOR_APPROVAL_META_KEY
from engram_memory.models.tools import parse_input
from engram_memory.server.binding import registry_for, wording
from engram_memory.server.config import ServeConfig
from engram_memory.server.dispatch import (
    Dispatcher,
    check_purpose,
    envelope_result,
    new_audit_id,
    to_mcp_error,
)
from engram_memory.server.gate import Approval, GateFailed, OperatorApproval, confirmation_gate
from engram_memory.server.launch import launch_dispatcher, open_engine
from engram_memory.server.local import LocalKey, connect_owner, read_local_key
from engram_memory.server.tools import MUTATING
from engram_memory.store.backend import StoreBusyError
from engram_memory.store.core.engine import Engine

log = logging.getLogger("engram_memory.server")

TAKEOVER_S = 60.0  # how long a relayed call keeps trying to own or reach the directory
START_S = 10.0  # how long a launch tries before it answers STORE_UNAVAILABLE (and keeps trying)
UNAVAILABLE_INSTRUCTIONS = (
    " Memory is unavailable right now: another engram-memory process owns its data directory and"
    " does not answer. Every call answers STORE_UNAVAILABLE (retriable) until it does."
)
RETRY_PAUSE_S = 0.2
CONTEXT_TTL_S = 120
# The owner's own answers; any other failure means the owner did not answer definitively.
_DEFINITIVE = {
    (PROTOCOL_CONTEXT_CODE, PROTOCOL_CONTEXT_MESSAGE),
    (PROTOCOL_UNKNOWN_TOOL_CODE, PROTOCOL_UNKNOWN_TOOL_MESSAGE),
}


class OwnerUnavailable(RuntimeError):
    """Neither the directory nor its owner could be reached in time."""


class StdioFront:
    """The handlers a stdio launch's MCP server calls, in owner or relay mode."""

    def __init__(self, cfg: ServeConfig, tg: TaskGroup, owner_services: Any) -> None:
        self.cfg = cfg
        self.tg = tg
        self.owner_services = owner_services  # async (engine, task_status) -> serves the owner socket
        self.host = replace(cfg.host_context(), session=relay_session())
        self.gate = confirmation_gate(cfg)
        self.confirm = frozenset(self.gate.gated)
        self.registry = registry_for(frozenset(cfg.tools), self.confirm, wording(cfg))
        self.engine: Engine | None = None
        self.local: Dispatcher | None = None
        self.client: Any = None
        self.key: LocalKey | None = None
        self._generation = 0
        self._close_connection: anyio.Event | None = None
        self._lock = anyio.Lock()
        self.unavailable = False  # True from a failed start until the directory is reached

    # -- owning or reaching the directory -------------------------------------------------

    async def start(self) -> bool:
        """Own or reach the directory; False: not yet (calls answer STORE_UNAVAILABLE meanwhile)."""
        try:
            await self._acquire(START_S)
        except OwnerUnavailable:
            self.unavailable = True
            log.error("data dir %s is owned by a process that does not answer; retrying in the background",
                      self.cfg.data_dir)
            self.tg.start_soon(self._keep_trying)
            return False
        return True

    async def _keep_trying(self) -> None:
        while True:
            try:
                async with self._lock:
                    await self._acquire(TAKEOVER_S)
                return
            except OwnerUnavailable:
                await anyio.sleep(1.0)

    async def _acquire(self, patience: float = TAKEOVER_S) -> None:
        deadline = time.monotonic() + patience
        while True:
            try:
                engine = await anyio.to_thread.run_sync(open_engine, self.cfg)
            except StoreBusyError:
                if await self._connect():
                    self.unavailable = False
                    return
            else:
                self.engine = engine
                self.local = launch_dispatcher(self.cfg, engine, self.gate)
                await self.tg.start(self.owner_services, engine)
                self.unavailable = False
                log.info("this launch owns %s", self.cfg.data_dir)
                return
            if time.monotonic() > deadline:
                raise OwnerUnavailable(f"data dir {self.cfg.data_dir} is owned but its owner does not answer")
            await anyio.sleep(RETRY_PAUSE_S)

    async def _connect(self) -> bool:
        try:
            key = read_local_key(self.cfg.data_dir)
            self._close_connection = anyio.Event()
            self.client = await self.tg.start(self._hold, key, self._close_connection)
        except Exception as exc:  # the owner is starting, or just died: try again
            log.debug("owner socket not reachable yet: %s", exc)
            return False
        self.key = key
        self._generation += 1
        log.info("data dir %s is owned by another process: relaying this host's calls to it",
                 self.cfg.data_dir)
        return True

    async def _hold(self, key: LocalKey, closed: anyio.Event, *, task_status: TaskStatus[Any]) -> None:
        """Keep one owner connection open in its own task (SDK contexts end where they began)."""
        started = False
        try:
            async with connect_owner(self.cfg.data_dir, key) as client:
                # A signed listing first: the SDK client then knows every tool's output schema
                # and never lists again, unsigned (the owner would log a refused context and the
                # SDK warn that it cannot validate the result).
                await client.list_tools(meta=cast(types.RequestParamsMeta, self._meta(key, "", {}, None)))
                task_status.started(client)
                started = True
                await closed.wait()
        except Exception:
            if not started:
                raise
            log.debug("owner connection ended", exc_info=True)

    async def _failover(self, generation: int) -> None:
        async with self._lock:
            if generation != self._generation or self.local is not None:
                return  # another call already moved on
            if self._close_connection is not None:
                self._close_connection.set()
            self.client = None
            log.warning("the owner of %s went away: taking over or finding the new owner", self.cfg.data_dir)
            await self._acquire()

    def close(self) -> None:
        if self._close_connection is not None:
            self._close_connection.set()
        if self.engine is not None:
            self.engine.close()

    # -- the MCP handlers -------------------------------------------------------------------

    async def list_tools(
        self, rctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if self.local is not None:
            return await self.local.list_tools(rctx, params)
        return types.ListToolsResult(tools=self.registry.definitions())

    async def call_tool(
        self, rctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if self.local is not None:
            return await self.local.call_tool(rctx, params)
        entry = self.registry.resolve(params.name)
        if entry is None:
            raise to_mcp_error(unknown_tool())
        if self.unavailable:  # neither owner nor relay yet: a clear, retriable answer
            return envelope_result(failure(ErrorCode.STORE_UNAVAILABLE, new_audit_id()))
        tool = entry.tool
        arguments: dict[str, Any] = dict(params.arguments or {})
        try:
            check_purpose(tool, arguments, self.host.purpose_ref)
        except ProtocolError as exc:
            raise to_mcp_error(exc) from None
        approval: Approval | None = None
        queued = False
        if tool in self.confirm and _valid(tool, arguments):
            # The human behind THIS host approves; an invalid call goes on unconfirmed and the
            # owner answers INVALID_SCHEMA (schema precedes the gate).
            try:
                decision = await self.gate.confirm(rctx, params, tool, arguments, self.host)
            except GateFailed as exc:
                log.info("%s: gate_failed (%s)", params.name, exc)
                return envelope_result(failure(ErrorCode.GATE_FAILED, new_audit_id()))
            except ProtocolError as exc:
                raise to_mcp_error(exc) from None
            except OperatorApproval:
                decision, queued = None, True  # the owner parks it in the operator's queue
            if isinstance(decision, types.InputRequiredResult):
                return decision
            approval = decision
        return await self._forward(rctx, params, tool, arguments, approval, queued)

    async def _forward(
        self,
        rctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        tool: str,
        arguments: dict[str, Any],
        approval: Approval | None,
        queued: bool = False,
    ) -> types.CallToolResult:
        deadline = time.monotonic() + TAKEOVER_S
        while True:
            if self.local is not None:  # we took the directory over: run it here
                # The approval this host's human gave still stands; the window is checked again.
                result = await self.local.call_tool(rctx, params, preapproved=approval)
                assert isinstance(result, types.CallToolResult)
                return result
            generation, client, key = self._generation, self.client, self.key
            if client is not None and key is not None:
                try:
                    if approval is not None:
                        approval.ensure_fresh(self.gate.clock())
                    meta = self._meta(key, tool, arguments, approval, queued)
                    with anyio.fail_after(TAKEOVER_S):
                        result = await client.call_tool(params.name, arguments, meta=meta)
                    if isinstance(result, types.CallToolResult):
                        return result
                except GateFailed as exc:
                    log.info("%s: gate_failed (%s)", params.name, exc)
                    return envelope_result(failure(ErrorCode.GATE_FAILED, new_audit_id()))
                except MCPError as exc:
                    if (exc.code, exc.message) in _DEFINITIVE:
                        raise
                    log.warning("relay of %s failed without an answer: %s", params.name, exc.message)
                except Exception as exc:
                    log.warning("relay of %s failed without an answer: %s", params.name, type(exc).__name__)
            if time.monotonic() > deadline:
                code = ErrorCode.MUTATION_OUTCOME_UNKNOWN if tool in MUTATING else ErrorCode.STORE_UNAVAILABLE
                return envelope_result(failure(code, new_audit_id()))
            try:
                await self._failover(generation)
            except OwnerUnavailable:
                continue

    def _meta(self, key: LocalKey, tool: str, arguments: dict[str, Any], approval: Approval | None,
              queued: bool = False) -> dict[str, Any]:
        confirm = sorted(self.confirm - {"withdraw", "forget"})
        meta: dict[str, Any] = {
            CONTEXT_META_KEY: key.signer.context(self.host, list(self.cfg.tools), confirm, ttl_s=CONTEXT_TTL_S)
        }
        if approval is not None:
            meta[CONFIRMATION_META_KEY] = key.signer.confirmation(tool, self.host, arguments)
        elif queued:
            meta[OPERATOR_APPROVAL_META_KEY] = self.gate.ttl_s
        return meta


def _valid(tool: str, arguments: dict[str, Any]) -> bool:
    try:
        parse_input(tool, arguments)
    except (EngramError, ValidationError, ValueError):
        return False
    return True


def relay_session(pid: int | None = None) -> str:
    return f"stdio:{pid or os.getpid()}"
