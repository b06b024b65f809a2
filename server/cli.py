"""The ``engram-memory`` command line.

stdout belongs to the MCP channel: everything this process says goes to stderr.
"""

from __future__ import annotations

import os

# Everything runs offline (ARCHITECTURE): set before any Hugging Face library can be imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# The model's "Loading weights" bar is noise in a server's log (the load is logged once instead).
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import atexit  # noqa: E402
import contextlib  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from importlib.metadata import entry_points  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Any, NoReturn  # noqa: E402

import typer  # noqa: E402

from engram_memory.server.admin.app import admin_app  # noqa: E402
from engram_memory.server.admin.rebuild import rebuild_index_cmd  # noqa: E402
from engram_memory.server.config import ENV_PREFIX, ConfigError, ServeSettings, load_config  # noqa: E402
from engram_memory.server.console.command import console_cmd  # noqa: E402
from engram_memory.server.host_cli import host_app  # noqa: E402
from engram_memory.server.logs import setup_stderr_logging  # noqa: E402

EXIT_USAGE = 2  # config errors and a busy data dir: the host must fix its launch, not retry blindly

app = typer.Typer(
    name="engram-memory",
    help="Governed long-term memory for agents, over MCP.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # plain tracebacks on stderr
)


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        sys.stdout.write(f"engram-memory {version('engram-memory')}\n")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                               help="Print the installed version and exit.")] = False,
) -> None:
    """Governed long-term memory for agents, over MCP."""
    # A callback keeps `serve` a named subcommand even while it is the only one.


def _fail(message: str) -> typer.Exit:
    sys.stderr.write(f"engram-memory: error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(code=EXIT_USAGE)


# Libraries whose INFO lines describe our own plumbing (the owner socket's uvicorn, the SDK's
# session manager, each relayed HTTP request, the model's load): nothing an operator acts on.
# Their warnings and errors still show; --log-level DEBUG shows everything.
_CHATTY = ("uvicorn", "mcp", "httpx", "httpx2", "httpcore", "sentence_transformers", "transformers")


def _setup_logging(level: str) -> None:
    chosen = getattr(logging, level.upper(), logging.INFO)
    setup_stderr_logging(chosen)  # request-borne header values are logged escaped (server/logs.py)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(max(chosen, logging.WARNING))


def _opt(key: str, *decls: str) -> Any:
    """A ``serve`` flag for settings key ``key``: its help text and shown default come from the model."""
    spec = ServeSettings.model_fields[key]
    default = spec.get_default(call_default_factory=True)
    if isinstance(default, tuple):
        shown: str | bool = ",".join(str(item) for item in default) if default else False
    elif isinstance(default, bool):
        shown = ("--" if default else "--no-") + key.replace("_", "-")
    else:
        shown = False if default is None else str(default)
    return typer.Option(*decls, help=spec.description, show_default=shown)


# Flag names are the settings keys with dashes; every flag defaults to None (= not given), so the
# environment, the TOML file and finally the model's default apply (server/config.py).
def serve(
    data_dir: Annotated[Path | None, _opt("data_dir", "--data-dir")] = None,
    store: Annotated[str | None, _opt("store")] = None,
    master_key_file: Annotated[Path | None, _opt("master_key_file", "--master-key-file")] = None,
    tenant: Annotated[str | None, _opt("tenant")] = None,
    workspace: Annotated[str | None, _opt("workspace")] = None,
    principal: Annotated[str | None, _opt("principal")] = None,
    agent_id: Annotated[str | None, _opt("agent_id", "--agent-id")] = None,
    purpose_ref: Annotated[str | None, _opt("purpose_ref", "--purpose-ref")] = None,
    tools: Annotated[str | None, _opt("tools")] = None,
    confirm: Annotated[str | None, _opt("confirm")] = None,
    config: Annotated[
        Path | None,
        typer.Option(help=f"TOML file with the same keys; {ENV_PREFIX}<KEY> variables override it, flags both."),
    ] = None,
    model: Annotated[str | None, _opt("model")] = None,
    model_path: Annotated[Path | None, _opt("model_path", "--model-path")] = None,
    semantic: Annotated[bool | None, _opt("semantic", "--semantic/--no-semantic")] = None,
    fusion: Annotated[str | None, _opt("fusion")] = None,
    rrf_k: Annotated[int | None, _opt("rrf_k", "--rrf-k")] = None,
    semantic_floor: Annotated[float | None, _opt("semantic_floor", "--semantic-floor")] = None,
    rerank: Annotated[bool | None, _opt("rerank", "--rerank/--no-rerank")] = None,
    projection_memory: Annotated[str | None, _opt("projection_memory", "--projection-memory")] = None,
    retention_ceiling_days: Annotated[int | None, _opt("retention_ceiling_days", "--retention-ceiling-days")] = None,
    allow_retain: Annotated[bool | None, _opt("allow_retain", "--allow-retain/--no-allow-retain")] = None,
    consented_families: Annotated[str | None, _opt("consented_families", "--consented-families")] = None,
    redacted_fields: Annotated[str | None, _opt("redacted_fields", "--redacted-fields")] = None,
    confirm_ttl_seconds: Annotated[float | None, _opt("confirm_ttl_seconds", "--confirm-ttl-seconds")] = None,
    confirm_fallback: Annotated[str | None, _opt("confirm_fallback", "--confirm-fallback")] = None,
    http: Annotated[str | None, _opt("http")] = None,
    host_keys: Annotated[Path | None, _opt("host_keys", "--host-keys")] = None,
    allow_remote: Annotated[bool | None, _opt("allow_remote", "--allow-remote/--no-allow-remote")] = None,
    rate_limit: Annotated[float | None, _opt("rate_limit", "--rate-limit")] = None,
    rate_burst: Annotated[int | None, _opt("rate_burst", "--rate-burst")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="stderr log level.")] = "INFO",
) -> None:
    """Serve the memory tools: over stdio to one launch-bound context, or over HTTP to signing hosts."""
    _setup_logging(log_level)
    flags = {k: v for k, v in locals().items() if k not in ("config", "log_level")}
    listener = None
    try:
        cfg = load_config(flags, config)
        if cfg.http:
            from engram_memory.server.http import http_url, listen_socket

            address = cfg.http_address
            try:  # before the data dir is created: a busy port changes nothing
                listener = listen_socket(*address)
            except OSError as exc:
                raise ConfigError(f"cannot listen on {http_url(*address)}: {exc.strerror or exc}") from None
        cfg.preflight()
    except ConfigError as exc:
        if listener is not None:
            listener.close()
        raise _fail(str(exc)) from None
    reason = None if cfg.http else cfg.disabled_reason()
    if reason:
        logging.getLogger("engram_memory.server").warning("memory disabled: %s", reason)
    cfg.prestart_model()

    # Imported here so `--help` and config errors stay fast (the store pulls in DuckDB).
    import anyio

    from engram_memory.server.app import finish, serve_http, serve_stdio
    from engram_memory.server.relay import OwnerUnavailable
    from engram_memory.store.backend import StoreRefused
    from engram_memory.store.core.engine import StoreBusyError

    try:
        if listener is not None:
            serve_http(cfg, listener)
        else:
            anyio.run(serve_stdio, cfg)
        finish()
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        # Raised inside the transport's task group, it may arrive wrapped in an ExceptionGroup.
        if _contains(exc, StoreBusyError):
            raise _fail(f"data dir {cfg.data_dir} is in use by another engram-memory process") from None
        if (refused := _find(exc, StoreRefused)) is not None:
            raise _fail(str(refused)) from None
        if _contains(exc, OwnerUnavailable):
            raise _fail(f"data dir {cfg.data_dir} is owned by a process that does not answer") from None
        raise


def daemon(
    data_dir: Annotated[Path | None, _opt("data_dir", "--data-dir")] = None,
    store: Annotated[str | None, _opt("store")] = None,
    master_key_file: Annotated[Path | None, _opt("master_key_file", "--master-key-file")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML file with the serve keys (engine options apply).")] = None,
    model: Annotated[str | None, _opt("model")] = None,
    model_path: Annotated[Path | None, _opt("model_path", "--model-path")] = None,
    semantic: Annotated[bool | None, _opt("semantic", "--semantic/--no-semantic")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="stderr log level.")] = "INFO",
) -> None:
    """Own the data dir for local stdio hosts (each `serve` on it relays here) until stopped."""
    _setup_logging(log_level)
    flags = {"data_dir": data_dir, "store": store, "master_key_file": master_key_file, "model": model,
             "model_path": model_path, "semantic": semantic}
    try:
        cfg = load_config(flags, config)
        cfg.preflight()
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    import anyio

    from engram_memory.server.app import finish, serve_daemon
    from engram_memory.store.backend import StoreRefused
    from engram_memory.store.core.engine import StoreBusyError

    try:
        anyio.run(serve_daemon, cfg)
        finish()
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        if _contains(exc, StoreBusyError):
            raise _fail(f"data dir {cfg.data_dir} is in use by another engram-memory process") from None
        if (refused := _find(exc, StoreRefused)) is not None:
            raise _fail(str(refused)) from None
        raise


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next((found for e in exc.exceptions if (found := _find(e, kind)) is not None), None)
    return None


def _contains(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, kind):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_contains(e, kind) for e in exc.exceptions)
    return False


# Commands live in their owners' modules (keep their heavy imports inside the function).
app.command("serve")(serve)
app.command("daemon")(daemon)
app.command("rebuild-index")(rebuild_index_cmd)
app.command("console")(console_cmd)
app.add_typer(host_app)
app.add_typer(admin_app)
# Other parts of the distribution (the evaluation harness, the checks) plug their commands in
# through the "engram_memory.commands" entry point group. Loading one imports its whole stack
# (ranx, the BEIR readers, numpy, PostgreSQL's driver): a process loads only the plug-in it runs,
# none for a built-in command (a server would hold 13 MiB for nothing, an admin command would start
# ~0.25 s later), and all of them only to list them (help, no command, a mistyped one).
BUILT_IN = frozenset({c.name for c in app.registered_commands}
                     | {g.typer_instance.info.name for g in app.registered_groups if g.typer_instance})


def _invoked_command(argv: list[str]) -> str | None:
    return next((arg for arg in argv[1:] if not arg.startswith("-")), None)


def _plug_in(invoked: str | None) -> None:
    if invoked in BUILT_IN:
        return
    plugins = sorted(entry_points(group="engram_memory.commands"), key=lambda ep: ep.name)
    for command in [ep for ep in plugins if ep.name == invoked] or plugins:
        app.command(command.name)(command.load())


_plug_in(_invoked_command(sys.argv))


def main() -> None:
    """The console entry point: a usage mistake is one line and exit 2, never a box or a traceback."""
    # typer vendors click; its exception classes live here (pinned typer version).
    from typer._click import exceptions as cx

    # Everything this process creates (store, WAL, projections, keys, socket) is owner-only.
    os.umask(0o077)
    try:
        # Not standalone, click returns a typer.Exit's code instead of exiting with it.
        code = app(standalone_mode=False)
    except cx.NoArgsIsHelpError as exc:
        if exc.ctx is not None:
            sys.stdout.write(exc.ctx.get_help() + "\n")
        code = 0
    except cx.UsageError as exc:
        where = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
        sys.stderr.write(f"engram-memory: error: {exc.format_message()}{where}\n")
        code = EXIT_USAGE
    except cx.ClickException as exc:
        sys.stderr.write(f"engram-memory: error: {exc.format_message()}\n")
        code = exc.exit_code
    except typer.Abort:
        code = 130
    except typer.Exit as exc:
        code = exc.exit_code
    _leave(code if isinstance(code, int) else 0)


def _leave(code: int) -> NoReturn:
    """Exit as the interpreter would -- its non-daemon threads joined, the atexit handlers run,
    output flushed -- without then tearing down every module: clearing the MCP SDK's and pydantic's
    objects took 0.4-0.8 s after each command and each served session (strace: not one system call
    in that time), and the suite starts a thousand of them. What must last is closed before this
    (each command closes its engine)."""
    threading._shutdown()  # type: ignore[attr-defined]  # the first step of Py_FinalizeEx
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, or the stream closed
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
