"""The MCP server: a low-level ``Server`` wired to the dispatcher, over stdio or streamable HTTP."""

from __future__ import annotations

import logging
import signal
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from engram_memory.server.config import ServeConfig
from engram_memory.server.dispatch import Dispatcher
from engram_memory.server.gate import ConfirmationGate
from engram_memory.server.tools import INSTRUCTIONS, ToolRegistry
from engram_memory.store.engine import Engine

log = logging.getLogger("engram_memory.server")

SERVER_NAME = "engram-memory"
DISABLED_INSTRUCTIONS = "Engram memory is disabled for this agent: the host granted no memory tool."


def server_version() -> str:
    try:
        return version("engram-memory")
    except PackageNotFoundError:  # running from a bare checkout
        return "0.0.0"


def open_engine(cfg: ServeConfig) -> Engine:
    """Open the store; raises StoreBusyError when another process holds the data dir."""
    Path(cfg.data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    return Engine.open(cfg.engine_settings())  # the engine sees its own options, not the serve context


def build_server(cfg: ServeConfig, engine: Engine | None) -> Server:
    """The server for one launch-bound context. ``engine`` is None exactly when memory is off."""
    enabled = cfg.memory_enabled and engine is not None
    registry = ToolRegistry(cfg.tools if enabled else (), frozenset(cfg.confirm))
    dispatcher = Dispatcher(
        engine if enabled else None,
        cfg.host_context() if enabled else None,
        registry,
        ConfirmationGate(frozenset(cfg.confirm), ttl_s=cfg.confirm_ttl_seconds),
    )
    return Server(
        SERVER_NAME,
        version=server_version(),
        title="Engram memory",
        instructions=INSTRUCTIONS if enabled else DISABLED_INSTRUCTIONS,
        on_list_tools=dispatcher.list_tools,
        on_call_tool=dispatcher.call_tool,
    )


async def serve_stdio(cfg: ServeConfig) -> None:
    # Enter the transport first: the SDK then diverts fd 1 to stderr, so nothing the store
    # or its libraries print while opening can corrupt the MCP channel.
    async with stdio_server() as (read_stream, write_stream):
        engine = open_engine(cfg) if cfg.memory_enabled else None
        try:
            server = build_server(cfg, engine)
            log.info("serving over stdio (%s)", _summary(cfg))
            async with anyio.create_task_group() as tg:
                # A host stopping us with SIGTERM/SIGINT still gets a clean engine close.
                tg.start_soon(_cancel_on_signal, tg.cancel_scope)
                await server.run(read_stream, write_stream, server.create_initialization_options())
                tg.cancel_scope.cancel()
        finally:
            if engine is not None:
                engine.close()


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: shutting down", signum)
            scope.cancel()
            return


def serve_http(cfg: ServeConfig) -> None:
    """Streamable HTTP on loopback with the same launch-bound context (config refuses other hosts)."""
    import uvicorn

    engine = open_engine(cfg) if cfg.memory_enabled else None
    try:
        server = build_server(cfg, engine)
        # json_response False: handshake-era elicitation rides the call's SSE stream.
        app = server.streamable_http_app(streamable_http_path="/mcp", host=cfg.host)
        log.info("serving streamable HTTP on http://%s:%d/mcp (%s)", cfg.host, cfg.port, _summary(cfg))
        # log_config None: keep the process's stderr logging; no access log on stdout.
        uvicorn.Server(
            uvicorn.Config(app, host=cfg.host, port=cfg.port, log_config=None, access_log=False)
        ).run()
    finally:
        if engine is not None:
            engine.close()


def _summary(cfg: ServeConfig) -> str:
    reason = cfg.disabled_reason()
    if reason:
        return "memory disabled: " + reason
    return f"tools={','.join(cfg.tools)} confirm={','.join(cfg.confirm) or '-'} scope={cfg.host_context().scope_ref}"
