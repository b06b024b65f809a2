"""The MCP server: a low-level ``Server`` wired to the dispatcher, over stdio or streamable HTTP."""

from __future__ import annotations

import logging
import signal
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from engram_memory.server.binding import KeyRing, LaunchBinder, SignedBinder
from engram_memory.server.config import LOOPBACK_HOSTS, ServeConfig
from engram_memory.server.dispatch import Dispatcher
from engram_memory.server.gate import ConfirmationGate
from engram_memory.server.http import http_url, signed_http_app
from engram_memory.server.ratelimit import RateLimiter
from engram_memory.server.tools import INSTRUCTIONS
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


def build_server(dispatcher: Dispatcher, instructions: str = INSTRUCTIONS) -> Server[Any]:
    return Server(
        SERVER_NAME,
        version=server_version(),
        title="Engram memory",
        instructions=instructions,
        on_list_tools=dispatcher.list_tools,
        on_call_tool=dispatcher.call_tool,
    )


def launch_dispatcher(cfg: ServeConfig, engine: Engine | None) -> Dispatcher:
    """stdio: the context the host bound at launch. ``engine`` is None exactly when memory is off."""
    enabled = cfg.memory_enabled and engine is not None
    gate = ConfirmationGate(frozenset(cfg.confirm), ttl_s=cfg.confirm_ttl_seconds)
    binder = LaunchBinder(cfg.host_context() if enabled else None, cfg.tools, gate)
    return Dispatcher(engine if enabled else None, binder, limiter_for(cfg))


def signed_dispatcher(cfg: ServeConfig, engine: Engine, ring: KeyRing) -> Dispatcher:
    """HTTP and the local socket: each call carries a context signed by a host in ``ring``."""
    return Dispatcher(engine, SignedBinder(ring), limiter_for(cfg))


def limiter_for(cfg: ServeConfig) -> RateLimiter:
    return RateLimiter(cfg.rate_limit, cfg.rate_burst)


async def serve_stdio(cfg: ServeConfig) -> None:
    # Enter the transport first: the SDK then diverts fd 1 to stderr, so nothing the store
    # or its libraries print while opening can corrupt the MCP channel.
    async with stdio_server() as (read_stream, write_stream):
        engine = open_engine(cfg) if cfg.memory_enabled else None
        try:
            enabled = cfg.memory_enabled and engine is not None
            server = build_server(launch_dispatcher(cfg, engine), INSTRUCTIONS if enabled else DISABLED_INSTRUCTIONS)
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
    """Streamable HTTP at /mcp for hosts that sign every call (server/http.py)."""
    import uvicorn

    assert cfg.host_keys is not None  # the config refuses --http without it
    ring = KeyRing.load(cfg.host_keys)
    bind_host, port = cfg.http_address
    engine = open_engine(cfg)
    try:
        server = build_server(signed_dispatcher(cfg, engine, ring))
        app = signed_http_app(server, ring, bind_host=bind_host, remote=cfg.allow_remote)
        # SIGHUP re-reads the host keys (rotation without restart); uvicorn leaves SIGHUP alone.
        signal.signal(signal.SIGHUP, lambda signum, frame: ring.reload())
        if cfg.allow_remote and bind_host not in LOOPBACK_HOSTS:
            log.warning("binding %s beyond loopback: TLS must terminate in front of this server", bind_host)
        log.info(
            "serving streamable HTTP on %s for %d host(s), audience %s",
            http_url(bind_host, port), len(ring.keys.hosts), ring.keys.server_id,
        )
        # log_config None: keep the process's stderr logging; no access log on stdout.
        uvicorn.Server(
            uvicorn.Config(app, host=bind_host, port=port, log_config=None, access_log=False)
        ).run()
    finally:
        engine.close()


def _summary(cfg: ServeConfig) -> str:
    reason = cfg.disabled_reason()
    if reason:
        return "memory disabled: " + reason
    return f"tools={','.join(cfg.tools)} confirm={','.join(cfg.confirm) or '-'} scope={cfg.host_context().scope_ref}"
