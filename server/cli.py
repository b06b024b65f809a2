"""The ``engram-memory`` command line.

stdout belongs to the MCP channel: everything this process says goes to stderr.
"""

from __future__ import annotations

import os

# Everything runs offline (ARCHITECTURE): set before any Hugging Face library can be imported.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import logging  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated  # noqa: E402

import typer  # noqa: E402

from eval.cli import bench_cmd, eval_cmd  # noqa: E402
from server.config import ConfigError, load_config  # noqa: E402
from server.maintenance import rebuild_index_cmd  # noqa: E402

EXIT_USAGE = 2  # config errors and a busy data dir: the host must fix its launch, not retry blindly

app = typer.Typer(
    name="engram-memory",
    help="Governed long-term memory for agents, over MCP.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,  # plain tracebacks on stderr
)


@app.callback()
def _main() -> None:
    """Governed long-term memory for agents, over MCP."""
    # A callback keeps `serve` a named subcommand even while it is the only one.


def _fail(message: str) -> typer.Exit:
    sys.stderr.write(f"engram-memory: error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(code=EXIT_USAGE)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


Opt = typer.Option


def serve(
    data_dir: Annotated[Path | None, Opt("--data-dir", help="Store directory (one server at a time).")] = None,
    tenant: Annotated[str | None, Opt(help="Bound tenant.")] = None,
    workspace: Annotated[str | None, Opt(help="Bound workspace.")] = None,
    principal: Annotated[str | None, Opt(help="Bound principal (the human or service acting).")] = None,
    agent_id: Annotated[str | None, Opt("--agent-id", help="Bound agent id.")] = None,
    purpose_ref: Annotated[str | None, Opt("--purpose-ref", help="Bound purpose the agent must cite.")] = None,
    tools: Annotated[
        str | None, Opt(help="Granted tools, comma-separated: search,get,capture,request_admission,withdraw,forget.")
    ] = None,
    confirm: Annotated[
        str | None, Opt(help="Also confirm these through the human: capture,request_admission.")
    ] = None,
    config: Annotated[Path | None, Opt(help="TOML file with the same keys; flags override it.")] = None,
    model_path: Annotated[Path | None, Opt("--model-path", help="Local embedding model directory.")] = None,
    semantic: Annotated[
        bool | None, Opt("--semantic/--no-semantic", help="Load the embedding model (semantic channel).")
    ] = None,
    fusion: Annotated[str | None, Opt(help="Rank fusion: rrf, dbsf or convex.")] = None,
    rrf_k: Annotated[int | None, Opt("--rrf-k", help="RRF constant k.")] = None,
    retention_ceiling_days: Annotated[
        int | None, Opt("--retention-ceiling-days", help="Latest allowed expires_at, in days from capture.")
    ] = None,
    allow_retain: Annotated[
        bool | None, Opt("--allow-retain/--no-allow-retain", help="Allow derivative_rule retain.")
    ] = None,
    consented_families: Annotated[
        str | None, Opt("--consented-families", help="Reconciliation families the host consents to.")
    ] = None,
    redacted_fields: Annotated[
        str | None, Opt("--redacted-fields", help="Top-level record fields withheld from the agent.")
    ] = None,
    confirm_ttl_seconds: Annotated[
        float | None, Opt("--confirm-ttl-seconds", help="How long a confirmation may wait (<= 300).")
    ] = None,
    transport: Annotated[str | None, Opt(help="stdio (default) or http.")] = None,
    host: Annotated[str | None, Opt(help="HTTP bind address (loopback only).")] = None,
    port: Annotated[int | None, Opt(help="HTTP port.")] = None,
    log_level: Annotated[str, Opt("--log-level", help="stderr log level.")] = "INFO",
) -> None:
    """Serve the memory tools to one host-bound agent context."""
    _setup_logging(log_level)
    flags = {k: v for k, v in locals().items() if k not in ("config", "log_level")}
    try:
        cfg = load_config(flags, config)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    reason = cfg.disabled_reason()
    if reason:
        logging.getLogger("engram_memory.server").warning("memory disabled: %s", reason)

    # Imported here so `--help` and config errors stay fast (the store pulls in DuckDB).
    import anyio

    from server.app import serve_http, serve_stdio
    from store.engine import StoreBusyError

    try:
        if cfg.transport == "http":
            serve_http(cfg)
        else:
            anyio.run(serve_stdio, cfg)
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        # Raised inside the transport's task group, it may arrive wrapped in an ExceptionGroup.
        if _contains(exc, StoreBusyError):
            raise _fail(f"data dir {cfg.data_dir} is in use by another engram-memory process") from None
        raise


def _contains(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, kind):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_contains(e, kind) for e in exc.exceptions)
    return False


# Commands live in their owners' modules (keep their heavy imports inside the function);
# registering one is one import and one line, e.g. `app.command("eval")(eval_cmd)`.
app.command("serve")(serve)
app.command("rebuild-index")(rebuild_index_cmd)
app.command("eval")(eval_cmd)
app.command("bench")(bench_cmd)


if __name__ == "__main__":
    app()
