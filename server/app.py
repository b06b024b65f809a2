"""The MCP server: a low-level ``Server`` wired to the dispatcher, over stdio or streamable HTTP."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
from collections.abc import Iterator
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from engram_memory.models.context import ALL_TOOLS, TOOL_PREFIX
from engram_memory.models.schema import input_schema
from engram_memory.server.admin.socket_routes import admin_routes
from engram_memory.server.binding import KeyRing
from engram_memory.server.config import LOOPBACK_HOSTS, ServeConfig
from engram_memory.server.dispatch import Dispatcher
from engram_memory.server.http import http_url, signed_http_app
from engram_memory.server.launch import launch_dispatcher, open_engine, signed_dispatcher
from engram_memory.server.local import bind_socket, ensure_local_key, local_ring, serve_socket, socket_path
from engram_memory.server.relay import UNAVAILABLE_INSTRUCTIONS, StdioFront
from engram_memory.server.stdio import stdio_server
from engram_memory.server.tools import instructions
from engram_memory.store.core.engine import Engine

log = logging.getLogger("engram_memory.server")

SERVER_NAME = "engram-memory"
DISABLED_INSTRUCTIONS = (
    "Engram memory is disabled for this agent: the host granted no memory tool ({reason})."
    " The host operator enables it with --tenant, --workspace, --principal, --agent-id, --purpose-ref"
    " and --tools (see engram-memory serve --help)."
)


def server_version() -> str:
    try:
        return version("engram-memory")
    except PackageNotFoundError:  # running from a bare checkout
        return "0.0.0"


class NoEcho:
    """JSON-RPC errors carry their code and constant message only: the SDK puts the request's
    method name in ``data`` of -32601 ("Method not found"), which echoes input."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        try:
            return await call_next(ctx)
        except MCPError as exc:
            if exc.error.data is None:
                raise
            raise MCPError(exc.code, exc.message) from None


def build_server(handlers: Dispatcher | StdioFront, text: str) -> Server[Any]:
    """The MCP server over a dispatcher, or over a stdio launch's front (owner or relay)."""
    server = Server(
        SERVER_NAME,
        version=server_version(),
        title="Engram memory",
        instructions=text,
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
        get_tool_input_schema=tool_input_schema,
    )
    server.middleware.append(NoEcho())
    return server


def tool_input_schema(name: str) -> dict[str, Any] | None:
    """For the SDK's Mcp-Param header check over HTTP: without it the SDK runs an (unsigned)
    tools/list of its own before every call. Schemas do not depend on the grant."""
    tool = name.removeprefix(TOOL_PREFIX)
    return input_schema(tool) if name.startswith(TOOL_PREFIX) and tool in ALL_TOOLS else None


def signed_server(cfg: ServeConfig, engine: Engine, ring: KeyRing) -> Server[Any]:
    """The MCP server of the TCP listener and of the owner socket alike."""
    return build_server(signed_dispatcher(cfg, engine, ring), instructions(cfg.semantic))


async def serve_stdio(cfg: ServeConfig) -> None:
    front: StdioFront | None = None
    signalled: list[int] = []
    # Enter the transport first: the SDK then diverts fd 1 to stderr, so nothing the store
    # or its libraries print while opening can corrupt the MCP channel.
    async with stdio_server() as (read_stream, write_stream):
        try:
            async with anyio.create_task_group() as tg:
                # A host (or a terminal's Ctrl-C) stopping us still gets a clean engine close.
                tg.start_soon(_cancel_on_signal, tg.cancel_scope, signalled)
                if cfg.memory_enabled:
                    # Own the data dir, or relay to the process that does (server/relay.py).
                    front = StdioFront(cfg, tg, partial(owner_socket, cfg))
                    ready = await front.start()
                    text = instructions(cfg.semantic) + ("" if ready else UNAVAILABLE_INSTRUCTIONS)
                    server = build_server(front, text)
                else:
                    reason = cfg.disabled_reason() or "memory disabled"
                    server = build_server(launch_dispatcher(cfg, None), DISABLED_INSTRUCTIONS.format(reason=reason))
                log.info("serving over stdio (%s)", _summary(cfg))
                log.info("waiting for an MCP client on stdin (Ctrl-D or Ctrl-C stops the server)")
                await server.run(read_stream, write_stream, server.create_initialization_options())
                tg.cancel_scope.cancel()
        finally:
            # After the task group: no handler or socket request is still using the engine.
            if front is not None:
                front.close()
        if signalled:
            # The SDK's stdin reader is a thread blocked in read(); it ends only at EOF, which
            # a terminal never sends on Ctrl-C. Everything is closed: leave now.
            leave_now()


def leave_now() -> None:
    """Exit at once, the engine already closed: no interpreter teardown racing a daemon thread
    (a blocked stdin reader, or the model still importing torch, which then fails noisily)."""
    log.info("stopped")
    logging.shutdown()
    os._exit(0)


def finish() -> None:
    """After serving returned: leave at once if the model is still loading in the background."""
    from engram_memory.retrieval.embedder import loading_in_progress

    if loading_in_progress():
        leave_now()


async def owner_socket(cfg: ServeConfig, engine: Engine, *, task_status: TaskStatus[None]) -> None:
    """The owner's Unix socket: other local launches' calls, each under its signed context."""
    key = ensure_local_key(Path(cfg.data_dir))
    ring = local_ring(key)
    app = signed_http_app(signed_server(cfg, engine, ring), ring, bind_host="127.0.0.1",
                          remote=False, extra_routes=admin_routes(engine))  # host-only: never on TCP
    path = socket_path(Path(cfg.data_dir))
    try:
        sock = bind_socket(path)
    except OSError as exc:  # e.g. a path too long for a socket: this host still works alone
        log.warning("local hosts cannot share this memory: %s", exc)
        task_status.started()
        return
    task_status.started()
    await serve_socket(app, path, sock)


async def _cancel_on_signal(scope: anyio.CancelScope, signalled: list[int] | None = None) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: shutting down", signum)
            if signalled is not None:
                signalled.append(signum)
            scope.cancel()
            return


def serve_http(cfg: ServeConfig, listener: socket.socket) -> None:
    """Streamable HTTP at /mcp for hosts that sign every call (server/http.py), on the listening
    socket the launch bound first (server/http.py listen_socket)."""
    anyio.run(_serve_http, cfg, listener)


async def _serve_http(cfg: ServeConfig, listener: socket.socket) -> None:
    import uvicorn

    assert cfg.host_keys is not None  # the config refuses --http without it
    ring = KeyRing.load(cfg.host_keys)
    bind_host, port = cfg.http_address
    engine = await anyio.to_thread.run_sync(open_engine, cfg)
    try:
        app = signed_http_app(signed_server(cfg, engine, ring), ring,
                              bind_host=bind_host, remote=cfg.allow_remote)
        if cfg.allow_remote and bind_host not in LOOPBACK_HOSTS:
            log.warning("binding %s beyond loopback: TLS must terminate in front of this server", bind_host)
        log.info(
            "serving streamable HTTP on %s for %d host(s), audience %s",
            http_url(bind_host, port), len(ring.keys.hosts), ring.keys.server_id,
        )
        # log_config None: keep the process's stderr logging; no access log on stdout.
        # uvicorn handles SIGINT/SIGTERM (a graceful stop); SIGHUP re-reads the host keys.
        server = _closing_server(uvicorn.Config(app, host=bind_host, port=port, log_config=None, access_log=False))
        async with anyio.create_task_group() as tg:
            tg.start_soon(_reload_on_hangup, ring)
            await tg.start(owner_socket, cfg, engine)  # local stdio hosts share this memory too
            await server.serve(sockets=[listener])
            tg.cancel_scope.cancel()
    finally:
        engine.close()


def _closing_server(config: Any) -> Any:
    """A uvicorn server that, after its graceful stop on SIGTERM/SIGINT, does not re-raise the
    signal: re-raised, it ended the process before ``_serve_http`` closed the engine (no DuckDB
    checkpoint, queued audit rows and unsaved vectors lost, the socket left behind; found by
    ``engram-memory crash``). ``_captured_signals`` is uvicorn's own list (pinned version)."""
    import uvicorn

    class ClosingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

    return ClosingServer(config)


async def _reload_on_hangup(ring: KeyRing) -> None:
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            ring.reload()


async def serve_daemon(cfg: ServeConfig) -> None:
    """Own the data dir for local stdio hosts only (no host of its own) until SIGTERM/SIGINT."""
    engine = await anyio.to_thread.run_sync(open_engine, cfg)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_signal, tg.cancel_scope)
            await tg.start(owner_socket, cfg, engine)
            log.info("daemon owns %s", cfg.data_dir)
    finally:
        engine.close()


def _summary(cfg: ServeConfig) -> str:
    reason = cfg.disabled_reason()
    if reason:
        return "memory disabled: " + reason
    return f"tools={','.join(cfg.tools)} confirm={','.join(cfg.confirm) or '-'} scope={cfg.host_context().scope_ref}"
