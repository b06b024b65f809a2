"""``engram-memory console``: the operator console on loopback, behind a one-time login link.

It owns the store while it runs: a DuckDB data dir is held as a server holds it (its lock; a
server already holding it is STORE_BUSY, exit 1), a PostgreSQL store is joined as an admin node
(store/core/admin_node.py). Mistakes are one line and exit 2, as the admin commands'."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from engram_memory.server.admin.options import DataDir, PgKeyFile, PgStore, _fail, _postgres, _refuse, _scope_ref

DEFAULT_BIND = "127.0.0.1:8766"


def console_cmd(
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    scope: Annotated[str | None, typer.Option(
        "--scope", help="Show this scope alone (TENANT/WORKSPACE); without it, every scope of the store.")] = None,
    bind: Annotated[str, typer.Option(
        "--bind", help="HOST:PORT to listen on; loopback only unless --allow-remote.")] = DEFAULT_BIND,
    allow_remote: Annotated[bool, typer.Option(
        "--allow-remote", help="Let --bind take a non-loopback address (terminate TLS in front).")] = False,
    semantic: Annotated[bool, typer.Option(
        "--semantic/--no-semantic", help="Load the embedding model so the console's search ranks as a server"
        " does (DuckDB store).")] = True,
    log_level: Annotated[str, typer.Option("--log-level", help="stderr log level.")] = "WARNING",
) -> None:
    """Serve the operator console: scopes, pending candidates, records, journal, audit, search."""
    import logging

    from engram_memory.server.config import check_bind
    from engram_memory.server.logs import setup_stderr_logging

    setup_stderr_logging(getattr(logging, log_level.upper(), logging.WARNING))
    try:
        host, port = check_bind(bind, "--bind", allow_remote)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    scope_ref = _scope_ref(scope)
    pg = _postgres(store, master_key_file, data_dir)
    from engram_memory.server.http import listen_socket

    try:  # before the store is opened: a busy port changes nothing
        listener = listen_socket(host, port)
    except OSError as exc:
        raise _fail(f"cannot listen on {bind}: {exc.strerror or exc}") from None
    try:
        if pg is None:
            _serve_duckdb(data_dir, scope_ref, semantic, listener, host, port, allow_remote)
        else:
            assert pg.key_file is not None
            from engram_memory.server.admin.options import _pg_outcomes
            from engram_memory.store.core.admin_node import admin_engine

            with _pg_outcomes(), admin_engine(pg.url, pg.key_file) as engine:
                _serve(engine, "the PostgreSQL store", scope_ref, listener, host, port, allow_remote)
    finally:
        listener.close()


def _serve_duckdb(data_dir: Path | None, scope_ref: str | None, semantic: bool, listener: Any, host: str,
                  port: int, allow_remote: bool) -> None:
    from engram_memory.server.admin.options import _closed_store, _target
    from engram_memory.server.config import ConfigError, load_config
    from engram_memory.store.backend import StoreBusyError
    from engram_memory.store.core.engine import Engine
    from engram_memory.store.core.refusals import STORE_BUSY

    target = _target(data_dir)
    _closed_store(target)  # an existing store no server holds (one line otherwise), nothing created
    try:
        settings = load_config({"data_dir": target, "semantic": semantic}, None).engine_settings()
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    try:
        engine = Engine.open(settings)
    except StoreBusyError:
        raise _refuse(STORE_BUSY, f"data dir {target} is in use by a running server; stop it first") from None
    try:
        _serve(engine, str(target), scope_ref, listener, host, port, allow_remote)
    finally:
        engine.close()


def _serve(engine: Any, where: str, scope_ref: str | None, listener: Any, host: str, port: int,
           allow_remote: bool) -> None:
    import uvicorn

    from engram_memory.server.app import _closing_server
    from engram_memory.server.console.app import ConsoleState, create_app, loopback_hosts
    from engram_memory.store.console.console_reads import scope_pair

    if scope_ref is not None and scope_ref not in engine.scopes():
        listed = ", ".join(scope_pair(s) for s in engine.scopes()[:20]) or "none"
        raise _fail(f"no scope {scope_pair(scope_ref)} in {where} (known scopes: {listed})")
    state = ConsoleState(engine, where, (scope_ref,) if scope_ref is not None else None,
                         hosts=None if allow_remote else loopback_hosts(host, port))
    shown = f"[{host}]" if ":" in host else host
    # The one line on stdout: the login link (its token works once; the session it opens lasts
    # as long as this process).
    sys.stdout.write(f"http://{shown}:{port}/login?token={state.login_token}\n")
    sys.stdout.flush()
    server = _closing_server(uvicorn.Config(create_app(state), log_config=None, access_log=False))
    server.run(sockets=[listener])
