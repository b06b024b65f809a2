"""Shared options and helpers of the ``engram-memory admin`` commands (and ``console``,
``rebuild-index``): the option types, the exit codes, one-line mistakes and refusals, where the
store is (a data dir or a PostgreSQL store), and how a report is printed (a table, or ``--json``).

A mistake of the operator is one ``engram-memory: error:`` line and exit 2; a refusal is one line
naming its code (store/core/refusals.py) and exit 1. Imports no other module of server/admin/.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from engram_memory.models.context import HOST_ID_PATTERN, scope_names

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # SIGINT (128 + 2), as a shell reports it

DataDir = Annotated[Path | None, typer.Option("--data-dir", help="Store directory (default: the serve default).")]
Scope = Annotated[str | None, typer.Option("--scope", help="One scope, as TENANT/WORKSPACE.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
PgStore = Annotated[str | None, typer.Option(
    "--store", envvar="ENGRAM_STORE", show_envvar=False,
    help="A PostgreSQL store instead of --data-dir: postgresql://USER@HOST:PORT/DB (password from"
    " PGPASSWORD or ~/.pgpass, never in the URL); also ENGRAM_STORE. It runs against the live store.")]
PgKeyFile = Annotated[Path | None, typer.Option(
    "--master-key-file", envvar="ENGRAM_MASTER_KEY_FILE", show_envvar=False,
    help="With --store: the store's master key file (from init-store or migrate); also ENGRAM_MASTER_KEY_FILE.")]

def _fail(message: str) -> typer.Exit:
    sys.stderr.write(f"engram-memory: error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(EXIT_USAGE)


def _refuse(code: str, message: str) -> typer.Exit:
    sys.stderr.write(f"engram-memory: error: {code}: {message}\n")
    sys.stderr.flush()
    return typer.Exit(EXIT_REFUSED)


@contextmanager
def _outcomes() -> Iterator[None]:
    """Store refusals and usage errors as one line each (no traceback)."""
    from engram_memory.store.core.refusals import AdminRefusal, AdminUsageError

    try:
        yield
    except AdminRefusal as exc:
        raise _refuse(exc.code, str(exc)) from None
    except AdminUsageError as exc:
        raise _fail(str(exc)) from None


def _target(data_dir: Path | None) -> Path:
    from engram_memory.server.config import default_data_dir

    return data_dir or default_data_dir()


def _scope_ref(scope: str | None) -> str | None:
    if scope is None:
        return None
    tenant, sep, workspace = scope.partition("/")
    if not sep or not HOST_ID_PATTERN.match(tenant) or not HOST_ID_PATTERN.match(workspace):
        raise _fail(f"--scope {scope!r} is not TENANT/WORKSPACE (each: letters, digits and . _ : @ -,"
                    " starting with a letter or digit, at most 128 characters)")
    return f"tenant:{tenant}/workspace:{workspace}"


def _pair(scope_ref: str) -> str:
    names = scope_names(scope_ref)
    return f"{names[0]}/{names[1]}" if names else scope_ref


@dataclass(frozen=True)
class _Pg:
    """A PostgreSQL store named by --store (and its master key, when one was given)."""

    url: str
    key: bytes | None
    key_file: Path | None


def _postgres(store: str | None, key_file: Path | None, data_dir: Path | None, *, need_key: bool = True) -> _Pg | None:
    """The PostgreSQL store the command runs on, or None for the DuckDB store of the data dir."""
    if store is None:
        if key_file is not None:
            raise _fail("--master-key-file applies to a PostgreSQL store only (--store URL)")
        return None
    if data_dir is not None:
        raise _fail("give --data-dir (a DuckDB store) or --store (a PostgreSQL store), not both")
    url = _store_url(store)
    if key_file is None:
        if need_key:
            raise _fail("--store needs --master-key-file FILE (written by: engram-memory admin init-store)")
        return _Pg(url, None, None)
    from engram_memory.store.opening import MasterKeyError, read_master_key

    try:
        return _Pg(url, read_master_key(key_file), key_file)
    except MasterKeyError as exc:
        raise _fail(str(exc)) from None


@contextmanager
def _pg_outcomes() -> Iterator[None]:
    """A PostgreSQL store that cannot be used as named (unreachable, not initialised, another master
    key) is a launch mistake: one line, exit 2, as a node's launch; a lost connection mid-command
    is STORE_UNAVAILABLE (exit 1). Admin refusals as everywhere (``_outcomes``)."""
    from engram_memory.store.backend import StoreRefused, is_store_error
    from engram_memory.store.core.refusals import STORE_BUSY

    try:
        with _outcomes():
            yield
    except StoreRefused as exc:
        from engram_memory.store.backend import LiveNodesError

        if isinstance(exc, LiveNodesError):
            raise _refuse(STORE_BUSY, str(exc)) from None
        raise _fail(str(exc)) from None
    except Exception as exc:
        if is_store_error(exc):
            raise _refuse("STORE_UNAVAILABLE", f"the PostgreSQL store failed mid-command ({type(exc).__name__});"
                          " a command that writes changed nothing or completed whole") from None
        raise


def _pg_scope(pg: _Pg, scope_ref: str | None) -> None:
    """Refuse a scope the PostgreSQL store does not have (before anything is written)."""
    if scope_ref is None:
        return
    from engram_memory.store.opening import shared

    with _pg_outcomes():
        inspector = shared(pg.url).inspector(pg.url, pg.key, pg.key_file)
        try:
            scopes = inspector.scopes()
        finally:
            inspector.close()
    if scope_ref not in scopes:
        listed = ", ".join(_pair(s) for s in scopes[:20]) or "none"
        raise _fail(f"no scope {_pair(scope_ref)} in the PostgreSQL store (known scopes: {listed})")


def _closed_store(data_dir: Path, scope_ref: str | None = None) -> list[str]:
    """Check that ``data_dir`` holds a store no other process holds (and the scope, if given);
    read-only, nothing created. Returns the store's scopes."""
    from engram_memory.store.backend import StoreBusyError
    from engram_memory.store.core.refusals import STORE_BUSY
    from engram_memory.store.maintenance.rebuild import NoStoreError, existing_scopes

    try:
        scopes = existing_scopes(data_dir)
    except NoStoreError as exc:
        raise _fail(str(exc)) from None
    except StoreBusyError:
        raise _refuse(STORE_BUSY, f"data dir {data_dir} is in use by a running server; stop it first") from None
    if scope_ref is not None and scope_ref not in scopes:
        listed = ", ".join(_pair(s) for s in scopes[:20]) or "none"
        raise _fail(f"no scope {_pair(scope_ref)} in the store at {data_dir} (known scopes: {listed})")
    return scopes


def _emit(json_out: bool, data: Any, table: Callable[[], Table | str]) -> None:
    if json_out:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    shown = table()
    if isinstance(shown, str):
        print(shown)
    else:
        # A pipe gets wide lines (ids and digests unbroken); a terminal gets its own width.
        Console(width=None if sys.stdout.isatty() else 200).print(shown)


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    return table


def _short(value: str | None, keep: int = 18) -> str:
    """An id or digest cut for a table (``--json`` prints them whole)."""
    if value is None:
        return ""
    return value if len(value) <= keep + 1 else value[:keep] + "…"


def _busy(message: str) -> Any:
    """A spinner on stderr while a long step runs (stdout carries the report)."""
    return Console(stderr=True).status(message)


def _now() -> int:
    from engram_memory.store.core.timeutil import default_clock

    return default_clock()()


StoreUrl = Annotated[str, typer.Option(
    "--store", envvar="ENGRAM_STORE", show_envvar=False,
    help="PostgreSQL store URL: postgresql://USER@HOST:PORT/DB (password from PGPASSWORD or ~/.pgpass).")]


def _store_url(text: str) -> str:
    from engram_memory.store.opening import shared

    try:
        return shared(text).check_url(text)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _check_model_path(model_path: Path) -> str | None:
    """Why ``--model-path`` cannot be used (the same checks as ``serve``), or None."""
    from engram_memory.retrieval.embedder import model_dir_problem

    problem = model_dir_problem(model_path)
    return None if problem is None else f"--model-path {problem}"
