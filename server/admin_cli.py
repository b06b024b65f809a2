"""``engram-memory admin ...``: host-only maintenance (never agent tools, never over MCP).

verify, backup, restore, expire, adjudicate, history, candidates and rotate-master-key; init-store
and migrate (DuckDB -> PostgreSQL); export and import (server/admin_transfer.py). Each
prints a table (stdout) or, with ``--json``, one JSON document. A mistake of the operator is
one ``engram-memory: error:`` line and exit 2; a refusal is one line naming its code
(store/core/refusals.py: BACKUP_INVALID, RESTORE_REFUSED, JOURNAL_CORRUPT, STORE_BUSY, STORE_INCONSISTENT,
NOT_ADJUDICABLE) and exit 1. Only ``backup`` runs alongside a server (the owner makes the copy
over its socket); every other command refuses while another process holds the data dir.
On a PostgreSQL store (``--store URL --master-key-file FILE``, or ENGRAM_STORE and
ENGRAM_MASTER_KEY_FILE) verify, expire, adjudicate, history and candidates run against the live
store: it is shared and transactional. rotate-master-key refuses while nodes run.
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

from engram_memory.models.context import HOST_ID_PATTERN
from engram_memory.store.core.refusals import STORE_INCONSISTENT

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # SIGINT (128 + 2), as a shell reports it
# What verify says when every problem is of the kind an interrupted write leaves (store/maintenance/verify.py).
RECOVERABLE = ("all of the recoverable kind an interrupted write (a crash, a kill) leaves, nothing lost: the next"
               " open repairs it (start the server on the store, or run the interrupted command again)")

admin_app = typer.Typer(
    name="admin",
    help="Host-only maintenance: verify, backup/restore, expire, adjudicate, history, key rotation, lifecycle"
    " operations (dispute, resolve, supersede, revoke-trust, rewind).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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
    from engram_memory.store.maintenance.rebuild import scope_names

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
        from engram_memory.store.postgres.keys import LiveNodesError

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
    from engram_memory.store.postgres.inspect import PostgresInspector

    with _pg_outcomes():
        inspector = PostgresInspector(pg.url, pg.key, pg.key_file)
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


# -- verify ----------------------------------------------------------------------------------


@admin_app.command("verify")
def verify_cmd(data_dir: DataDir = None, scope: Scope = None, store: PgStore = None,
               master_key_file: PgKeyFile = None, json_out: JsonOut = False) -> None:
    """Verify journal chains and heads, rows against the journal, sealed digests, orphans and projections.

    With --store: the PostgreSQL store, live, on one consistent snapshot, with its master key (every
    data key and the page-cursor key must open under it); projections are each node's own caches,
    rebuilt from the store, and are not checked. Exit 1 with JOURNAL_CORRUPT when a chain or head
    fails, STORE_INCONSISTENT for anything else."""
    scope_ref = _scope_ref(scope)
    pg = _postgres(store, master_key_file, data_dir)
    from engram_memory.store.maintenance.verify import verify_postgres, verify_store

    if pg is not None:
        assert pg.key is not None and pg.key_file is not None
        _pg_scope(pg, scope_ref)
        with _pg_outcomes(), _busy("verifying the store"):
            report = verify_postgres(pg.url, pg.key, pg.key_file, deep=True)
        where = "the PostgreSQL store"
        scopes = [s.scope_ref for s in report.scopes]
    else:
        target = _target(data_dir)
        scopes = _closed_store(target, scope_ref)
        where = f"the store at {target}"
        try:
            with _busy("verifying the store"):
                report = verify_store(target, deep=True)
        except Exception as exc:  # noqa: BLE001 - a store too damaged to walk is a failed verification
            raise _refuse("JOURNAL_CORRUPT", f"{where} cannot be read ({type(exc).__name__})") from None
    problems = [p for p in report.problems if scope_ref is None or p.startswith(scope_ref)]
    data = {**report.as_dict(), "scopes_checked": [_pair(s) for s in scopes if scope_ref in (None, s)]}
    if pg is None:
        data["data_dir"] = str(_target(data_dir))
    else:
        data["store"] = data.pop("data_dir")
    if scope_ref is not None:
        data["problems"] = problems
    recoverable = bool(problems) and all(p in report.recoverable for p in problems)
    data["recoverable"] = recoverable
    stale = [[f"stale projection {_pair(s.scope_ref)}", "behind the journal: the next open rebuilds it before use"]
             for s in report.scopes if s.projection == "stale" and scope_ref in (None, s.scope_ref)]
    _emit(json_out, data, lambda: _table(
        f"verify {report.data_dir}", ["result", "detail"],
        [["ok", "journal chains and heads, rows, digests, keys" + (" and projections" if pg is None else "")
          + " verify"], *stale] if not problems
        else [*[[report.code or STORE_INCONSISTENT, p] for p in problems], *stale]))
    if problems:
        raise _refuse(report.code or STORE_INCONSISTENT, f"{where} does not verify ({len(problems)} problem(s))"
                      + (f"; {RECOVERABLE}" if recoverable else ""))


# -- backup / restore --------------------------------------------------------------------------


def _regular_file(flag: str, path: Path, what: str) -> None:
    """An input path must name a regular file: a directory, a device or a FIFO is one line, exit 2."""
    if path.is_dir():
        raise _fail(f"{flag} {path} is a directory, not {what}")
    if not path.exists():
        raise _fail(f"{flag} {path}: no such file ({what})")
    if not path.is_file():
        raise _fail(f"{flag} {path} is not a regular file (expected {what})")


@admin_app.command("backup")
def backup_cmd(
    out: Annotated[Path, typer.Option("--out", help="The backup file to write (a tar).")],
    data_dir: DataDir = None,
    key_out: Annotated[Path | None, typer.Option("--key-out", help="Where to write the backup key"
                                                 " (default: OUT.key). Keep it apart from the backup.")] = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Back up the store to one file, also while a server runs; its key goes to a separate file.

    With --store: the live PostgreSQL store, as of one consistent snapshot, in the same archive
    format as a DuckDB store's (restorable into either backend); it carries no projections (each
    node rebuilds its own). PostgreSQL's own tools (pg_dump, base backups) also work, but a dump
    holds keys wrapped by the master key: keep the two apart."""
    from engram_memory.store.maintenance import backup as bk

    pg = _postgres(store, master_key_file, data_dir)
    target = _target(data_dir)
    key_path = key_out or out.with_name(out.name + ".key")
    for path, flag in ((out, "--out"), (key_path, "--key-out")):
        if path.exists():
            raise _fail(f"{flag} {path} already exists; choose a new file")
        if not path.parent.is_dir():
            raise _fail(f"{flag} {path}: no such directory {path.parent}")
    if out.resolve() == key_path.resolve():
        raise _fail("--out and --key-out must be different files")
    if pg is not None:
        _backup_postgres(pg, out, key_path, json_out)
        return
    online = bk.held_by_another(target) if target.is_dir() else False
    if not online:
        _closed_store(target)
    key = bk.new_backup_key()
    tmp = out.with_name(f".{out.name}.partial")
    with _outcomes():
        try:
            with _busy("backing up" + (" (through the running server)" if online else "")):
                if online:
                    from engram_memory.server.admin_socket import OwnerUnreachable, request_backup

                    try:
                        request_backup(target, key, tmp)
                    except OwnerUnreachable as exc:
                        raise _refuse("STORE_BUSY", f"data dir {target} is held by a process that does not"
                                      f" answer a backup request: {exc}") from None
                else:
                    bk.backup_offline(target, tmp, key)
            manifest = bk.read_manifest(tmp)
            bk.write_key_file(key_path, key)
            tmp.rename(out)
        finally:
            tmp.unlink(missing_ok=True)
    _emit_backup(json_out, bk.BackupReport(out, key_path, manifest, out.stat().st_size), online,
                 f"backup of {target}" + (" (online)" if online else ""))


def _emit_backup(json_out: bool, report: Any, online: bool, title: str) -> None:
    """A backup's report, from either backend: the archive, its key file, identity and journal heads."""
    manifest = report.manifest
    _emit(json_out, {**report.as_dict(), "online": online}, lambda: _table(
        title, ["field", "value"],
        [["backup", report.path], ["key", report.key_path], ["store_id", manifest["store_id"]],
         ["created_at", manifest["created_at"]], ["files", len(manifest["files"])], ["bytes", report.size],
         *[[f"head {_pair(s)}", f"cursor {h['cursor']} {h['event_hash']}"] for s, h in manifest["heads"].items()]]))


def _backup_postgres(pg: _Pg, out: Path, key_path: Path, json_out: bool) -> None:
    from engram_memory.store.maintenance import backup as bk

    assert pg.key is not None and pg.key_file is not None
    key = bk.new_backup_key()
    tmp = out.with_name(f".{out.name}.partial")
    with _pg_outcomes():
        try:
            with _busy("backing up the PostgreSQL store"):
                bk.backup_postgres(pg.url, pg.key, pg.key_file, tmp, key)
            manifest = bk.read_manifest(tmp)
            bk.write_key_file(key_path, key)
            tmp.rename(out)
        finally:
            tmp.unlink(missing_ok=True)
    _emit_backup(json_out, bk.BackupReport(out, key_path, manifest, out.stat().st_size), True,
                 "backup of the PostgreSQL store")


@admin_app.command("restore")
def restore_cmd(
    from_: Annotated[Path, typer.Option("--from", help="The backup file.")],
    data_dir: DataDir = None,
    key: Annotated[Path | None, typer.Option("--key", help="The backup key file (default: FROM.key).")] = None,
    store: PgStore = None,
    master_key_out: Annotated[Path | None, typer.Option(
        "--master-key-out", help="With --store: where to write the restored store's new master key (0600,"
        " never overwritten).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Restore even over a copy of the store whose journal is ahead of the backup (its newer"
        " events are lost from the restored store); the replaced directory is kept aside, whole, and named.")]
    = False,
    json_out: JsonOut = False,
) -> None:
    """Restore a backup into an empty directory, or over an older copy of the same store.

    A store whose journal is ahead of the backup in any scope is refused (RESTORE_REFUSED, naming
    how far ahead) unless --force; then the replaced data dir is renamed aside, never destroyed.

    With --store URL --master-key-out FILE: into an empty PostgreSQL store (a backup of either
    backend), its keys re-wrapped under a new master key written to FILE (only if the restore
    commits); a store that is initialised or holds any row is refused (RESTORE_REFUSED)."""
    from engram_memory.store.maintenance import backup as bk

    target = _target(data_dir)
    key_path = key or from_.with_name(from_.name + ".key")
    _regular_file("--from", from_, "a backup file")
    _regular_file("--key", key_path, "a backup key file (a backup's key is written beside it as FILE.key)")
    if store is not None:
        if data_dir is not None:
            raise _fail("give --data-dir (a DuckDB store) or --store (a PostgreSQL store), not both")
        if force:
            raise _fail("--force applies to a data dir only: a PostgreSQL store is restored into an empty"
                        " database, never over a store")
        _restore_postgres(_store_url(store), from_, key_path, master_key_out, json_out)
        return
    if master_key_out is not None:
        raise _fail("--master-key-out applies to a PostgreSQL store only (--store URL)")
    if not target.absolute().parent.is_dir():
        raise _fail(f"--data-dir {target}: no such directory {target.absolute().parent}")
    with _outcomes():
        backup_key = bk.read_key_file(key_path)
        if target.is_dir() and bk.held_by_another(target):
            raise _refuse("RESTORE_REFUSED", f"data dir {target} is in use by a running server; stop it first")
        with _busy("restoring"):
            report = bk.restore(from_, backup_key, target, force=force)
    m = report.manifest
    if report.kept_aside is not None:
        sys.stderr.write(f"engram-memory: the replaced store (ahead of the backup) is kept at {report.kept_aside}\n")
    _emit(json_out, report.as_dict(), lambda: _table(
        f"restored {from_} into {target}", ["field", "value"],
        [["store_id", m["store_id"]], ["backup created_at", m["created_at"]], ["files", len(m["files"])],
         ["replaced an older copy", "yes" if report.replaced else "no"],
         *([["replaced store kept at", str(report.kept_aside)]] if report.kept_aside is not None else []),
         *[[f"head {_pair(s)}", f"cursor {h['cursor']}"] for s, h in m["heads"].items()]]))


def _restore_postgres(url: str, from_: Path, key_path: Path, master_key_out: Path | None, json_out: bool) -> None:
    from engram_memory.store.core.keyfile import new_key_file
    from engram_memory.store.maintenance import backup as bk

    if master_key_out is None:
        raise _fail("--store needs --master-key-out FILE: where the restored store's master key is written")
    if master_key_out.exists():
        raise _fail(f"--master-key-out {master_key_out} already exists; a master key is never overwritten")
    if not master_key_out.absolute().parent.is_dir():
        raise _fail(f"--master-key-out {master_key_out}: no such directory {master_key_out.absolute().parent}")
    with _pg_outcomes():
        backup_key = bk.read_key_file(key_path)
        try:
            with _busy("restoring into the PostgreSQL store"), new_key_file(master_key_out) as master:
                report = bk.restore_postgres(from_, backup_key, url, master)
        except FileExistsError:
            raise _fail(f"--master-key-out {master_key_out} already exists; a master key is never overwritten") \
                from None
    m = report.manifest
    _emit(json_out, {**report.as_dict(), "store": url, "master_key_file": str(master_key_out)}, lambda: _table(
        f"restored {from_} into the PostgreSQL store", ["field", "value"],
        [["store_id", m["store_id"]], ["backup created_at", m["created_at"]],
         ["master key", f"{master_key_out} (start every node with --master-key-file pointing at a copy)"],
         *[[f"head {_pair(s)}", f"cursor {h['cursor']}"] for s, h in m["heads"].items()]]))


# -- lifecycle maintenance -----------------------------------------------------------------------


@admin_app.command("expire")
def expire_cmd(data_dir: DataDir = None, scope: Scope = None, store: PgStore = None,
               master_key_file: PgKeyFile = None, json_out: JsonOut = False) -> None:
    """Expire every record past its retention.expires_at now (journalled), in one scope or all.

    With --store: on the live PostgreSQL store; each serving node drops the expired records from
    its projections when it catches up from the journal (at once, or before its next read)."""
    scope_ref = _scope_ref(scope)
    pg = _postgres(store, master_key_file, data_dir)
    from engram_memory.store.host.expire import expire, expire_with

    if pg is not None:
        assert pg.key_file is not None
        _pg_scope(pg, scope_ref)
        from engram_memory.store.core.admin_node import admin_engine

        with _pg_outcomes(), _busy("expiring due records"), admin_engine(pg.url, pg.key_file) as engine:
            done = expire_with(engine, scope_ref, _now())
    else:
        target = _target(data_dir)
        _closed_store(target, scope_ref)
        with _busy("expiring due records"):
            done = expire(target, scope_ref, _now())
    data = {"expired": {_pair(s): ids for s, ids in done.items()}, "total": sum(len(v) for v in done.values())}
    _emit(json_out, data, lambda: _table(
        f"expired {data['total']} record(s)", ["scope", "expired", "record ids"],
        [[_pair(s), len(ids), " ".join(ids)] for s, ids in done.items()]))


@admin_app.command("adjudicate")
def adjudicate_cmd(
    candidate: Annotated[str, typer.Option("--candidate", help="The candidate id held for adjudication.")],
    reason: Annotated[str, typer.Option("--reason", help="Why (journalled; screened for secrets).")],
    accept: Annotated[bool | None, typer.Option("--accept/--reject", help="The decision.",
                                                show_default=False)] = None,
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Accept or reject a candidate whose admission answered pending_adjudication.

    With --store: on the live PostgreSQL store; each serving node indexes an accepted record when it
    catches up from the journal (and embeds it once, for every node, if the admin node did not)."""
    if accept is None:
        raise _fail("say --accept or --reject")
    pg = _postgres(store, master_key_file, data_dir)
    from engram_memory.store.host.adjudicate import adjudicate, adjudicate_with, check_reason

    with _outcomes():
        check_reason(reason)  # before the store is touched
    if pg is not None:
        assert pg.key_file is not None
        from engram_memory.store.core.admin_node import admin_engine

        with _pg_outcomes(), admin_engine(pg.url, pg.key_file) as engine:
            result = adjudicate_with(engine, "the PostgreSQL store", candidate, accept, reason, _now())
    else:
        target = _target(data_dir)
        with _outcomes():
            _closed_store(target)
            result = adjudicate(target, candidate, accept, reason, _now())
    _emit(json_out, {**result, "scope": _pair(result["scope_ref"])}, lambda: _table(
        f"candidate {candidate}: {result['status']}", ["field", "value"],
        [[k, v] for k, v in result.items() if k != "scope_ref"] + [["scope", _pair(result["scope_ref"])]]))


# -- reading ------------------------------------------------------------------------------------


def _one_scope(scope: str, data_dir: Path | None) -> tuple[str, Path]:
    """The scope a per-scope listing reads, and its store (closed: no server holds it)."""
    scope_ref = _scope_ref(scope)
    assert scope_ref is not None
    target = _target(data_dir)
    _closed_store(target, scope_ref)
    return scope_ref, target


def _listing(scope: str, data_dir: Path | None, store: str | None, key_file: Path | None,
             read: Callable[[Any, str], list[dict[str, Any]]],
             read_dir: Callable[[Path, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A per-scope listing, of the DuckDB store of the data dir or of a PostgreSQL store (its
    master key is optional here: nothing is decrypted; when given, it is checked)."""
    pg = _postgres(store, key_file, data_dir, need_key=False)
    if pg is None:
        ref, target = _one_scope(scope, data_dir)
        return read_dir(target, ref)
    scope_ref = _scope_ref(scope)
    assert scope_ref is not None
    _pg_scope(pg, scope_ref)
    from engram_memory.store.postgres.inspect import PostgresInspector

    with _pg_outcomes():
        inspector = PostgresInspector(pg.url, pg.key, pg.key_file)
        try:
            return read(inspector, scope_ref)
        finally:
            inspector.close()


@admin_app.command("history")
def history_cmd(
    scope: Annotated[str, typer.Option("--scope", help="The scope, as TENANT/WORKSPACE.")],
    data_dir: DataDir = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the last N events.")] = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """A scope's journal: cursors, operations, ids, hashes and each event's own instant (never content).

    With --store: the PostgreSQL store's journal, live (--master-key-file optional: nothing is decrypted)."""
    from engram_memory.store.host.history import journal, journal_listing

    events = _listing(scope, data_dir, store, master_key_file,
                      lambda inspector, ref: journal_listing(inspector.journal_tail(ref, limit)),
                      lambda target, ref: journal(target, ref, limit))
    _emit(json_out, {"scope": scope, "events": events}, lambda: _table(
        f"journal of {scope} ({len(events)} event(s))",
        ["cursor", "operation", "event_id", "at", "to_state", "reason", "event_hash"],
        [[e["cursor"], e["operation"], _short(e["event_id"], 28), e["at"], e["to_state"], e["reason"],
          _short(e["event_hash"])] for e in events]))


@admin_app.command("candidates")
def candidates_cmd(
    scope: Annotated[str, typer.Option("--scope", help="The scope, as TENANT/WORKSPACE.")],
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """A scope's pending candidates: ids, principals, cursors, times, digests (never content).

    With --store: the PostgreSQL store's, live (--master-key-file optional: nothing is decrypted)."""
    from engram_memory.store.host.history import candidate_listing, pending_candidates

    rows = _listing(scope, data_dir, store, master_key_file,
                    lambda inspector, ref: candidate_listing(inspector.pending_candidates(ref)), pending_candidates)
    _emit(json_out, {"scope": scope, "candidates": rows}, lambda: _table(
        f"pending candidates of {scope} ({len(rows)})",
        ["candidate_id", "principal", "state", "created_cursor", "recorded_at", "held", "payload_digest"],
        [[r["candidate_id"], r["principal"], r["state"], r["created_cursor"], r["recorded_at"],
          "adjudication" if r["held_for_adjudication"] else "", _short(r["payload_digest"])] for r in rows]))


# -- keys ---------------------------------------------------------------------------------------


@admin_app.command("rotate-master-key")
def rotate_cmd(
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    master_key_out: Annotated[Path | None, typer.Option(
        "--master-key-out", help="With --store: where to write the new master key (0600, never overwritten).")] = None,
    json_out: JsonOut = False,
) -> None:
    """Re-wrap every data key under a new master key.

    DuckDB (--data-dir): the new key replaces master.key in the data dir; the old one is destroyed.

    PostgreSQL (--store URL --master-key-file OLD --master-key-out NEW): every data key and the
    page-cursor key are re-wrapped and the store's fingerprint changed, in one transaction; the new
    key is written to NEW only if it commits. Nodes hold the key from their start, so it refuses
    (STORE_BUSY) while any node is running. How the new key reaches the nodes: stop every node,
    rotate, copy NEW over each node's --master-key-file (0600), restart each node. A node started
    with the old key file is refused at launch (exit 2: not this store's master key). Then destroy
    every copy of the old key file: it opens nothing of the store any more, but a database backup
    taken before the rotation still opens with it."""
    pg = _postgres(store, master_key_file, data_dir)
    if pg is None:
        if master_key_out is not None:
            raise _fail("--master-key-out applies to a PostgreSQL store only (--store URL); a DuckDB store"
                        " keeps its master key in its data dir")
        target = _target(data_dir)
        _closed_store(target)
        from engram_memory.store.maintenance.rotation import rotate_master_key

        with _outcomes(), _busy("re-wrapping data keys"):
            count = rotate_master_key(target)
        _emit(json_out, {"data_dir": str(target), "rewrapped": count, "old_master_key": "destroyed"},
              lambda: f"rotated the master key of {target}: {count} data key(s) re-wrapped; the old master key"
                      " is destroyed")
        return
    if master_key_out is None:
        raise _fail("--store needs --master-key-out FILE: where the new master key is written")
    if master_key_out.exists():
        raise _fail(f"--master-key-out {master_key_out} already exists; a master key is never overwritten")
    if not master_key_out.absolute().parent.is_dir():
        raise _fail(f"--master-key-out {master_key_out}: no such directory {master_key_out.absolute().parent}")
    assert pg.key is not None and pg.key_file is not None
    from engram_memory.store.maintenance.rotation import rotate_postgres

    with _pg_outcomes(), _busy("re-wrapping data keys"):
        try:
            count = rotate_postgres(pg.url, pg.key_file, pg.key, master_key_out)
        except FileExistsError:
            raise _fail(f"--master-key-out {master_key_out} already exists; a master key is never overwritten") \
                from None
    _emit(json_out, {"store": pg.url, "rewrapped": count, "master_key_file": str(master_key_out),
                     "old_master_key": "no longer opens the store"},
          lambda: f"rotated the master key of the PostgreSQL store: {count} data key(s) re-wrapped; the new key"
                  f" is in {master_key_out}. Copy it over each node's --master-key-file and restart the nodes;"
                  f" then destroy every copy of {pg.key_file}")


# -- a PostgreSQL store -------------------------------------------------------------------------

StoreUrl = Annotated[str, typer.Option(
    "--store", envvar="ENGRAM_STORE", show_envvar=False,
    help="PostgreSQL store URL: postgresql://USER@HOST:PORT/DB (password from PGPASSWORD or ~/.pgpass).")]


def _store_url(text: str) -> str:
    from engram_memory.store.postgres.url import check_store_url

    try:
        return check_store_url(text)
    except ValueError as exc:
        raise _fail(str(exc)) from None


@admin_app.command("init-store")
def init_store_cmd(
    store: StoreUrl,
    master_key_out: Annotated[Path, typer.Option(
        "--master-key-out", help="Where to write the new master key (0600); every node is started with it.")],
    json_out: JsonOut = False,
) -> None:
    """Create the schema of an empty PostgreSQL store and a new master key file for it."""
    url = _store_url(store)
    from engram_memory.store.backend import StoreRefused
    from engram_memory.store.core.keyfile import new_key_file

    try:
        with new_key_file(master_key_out) as key:
            from engram_memory.store.postgres.backend import init_store

            store_id = init_store(url, key)
    except FileExistsError:
        raise _fail(f"{master_key_out} already exists; a master key is never overwritten") from None
    except OSError as exc:
        raise _fail(f"cannot write {master_key_out}: {exc.strerror or exc}") from None
    except StoreRefused as exc:
        raise _refuse("STORE_REFUSED", str(exc)) from None
    _emit(json_out, {"store_id": store_id, "master_key_file": str(master_key_out)},
          lambda: f"initialised PostgreSQL store {store_id}; its master key is in {master_key_out}"
                  " (start every node with --master-key-file pointing at a copy of it)")


# -- DuckDB -> PostgreSQL ---------------------------------------------------------------------


@admin_app.command("migrate")
def migrate_cmd(
    from_: Annotated[Path, typer.Option("--from", help="The DuckDB store's data dir (no server may hold it).")],
    to: Annotated[str, typer.Option("--to", help="The empty PostgreSQL store: postgresql://USER@HOST:PORT/DB"
                                    " (password from PGPASSWORD or ~/.pgpass, never in the URL).")],
    master_key_out: Annotated[Path, typer.Option(
        "--master-key-out", help="Where to write the PostgreSQL store's new master key (0600, never"
        " overwritten); every node is started with --master-key-file pointing at a copy of it.")],
    json_out: JsonOut = False,
) -> None:
    """Copy a stopped DuckDB store into an empty PostgreSQL store, in one transaction.

    Copies the journal (byte-exact: every hash verifies), scopes, candidates, records, tombstones,
    the idempotency ledger, the audit trail and the stored embeddings, keeps the store id, and
    re-wraps every data key (and the page-cursor key) under a new master key written to
    --master-key-out. The DuckDB directory is only read (a key rotation a crash interrupted is
    finished first, as any open does), and held so no server starts on it meanwhile. Then run
    `admin verify --store URL --master-key-file FILE` and start the nodes.

    Exit 1: STORE_BUSY (a server holds --from), STORE_REFUSED (the PostgreSQL store is initialised,
    not empty, or unreachable); no key file is written then. Exit 2: a usage mistake."""
    url = _store_url(to)
    if master_key_out.exists():
        raise _fail(f"--master-key-out {master_key_out} already exists; a master key is never overwritten")
    if not master_key_out.absolute().parent.is_dir():
        raise _fail(f"--master-key-out {master_key_out}: no such directory {master_key_out.absolute().parent}")
    _closed_store(from_)
    from rich.progress import Progress

    from engram_memory.store.backend import StoreBusyError, StoreRefused, is_store_error
    from engram_memory.store.core.keyfile import new_key_file
    from engram_memory.store.core.refusals import STORE_BUSY
    from engram_memory.store.postgres.migrate import MigrateUsageError, counts, migrate_store

    try:
        total = sum(counts(from_).values())
        console = Console(stderr=True)  # stdout carries the report; a pipe gets no bar (not even a blank line)
        with Progress(console=console, transient=True, disable=not console.is_terminal) as progress, \
                new_key_file(master_key_out) as key:
            task = progress.add_task("copying rows", total=total)
            report = migrate_store(from_, url, key, lambda _table, rows: progress.advance(task, rows))
    except FileExistsError:
        raise _fail(f"--master-key-out {master_key_out} already exists; a master key is never overwritten") from None
    except StoreBusyError:
        raise _refuse(STORE_BUSY, f"data dir {from_} is in use by a running server; stop it first") from None
    except MigrateUsageError as exc:
        raise _fail(str(exc)) from None
    except StoreRefused as exc:
        raise _refuse("STORE_REFUSED", str(exc)) from None
    except Exception as exc:
        if is_store_error(exc):  # the copy failed in PostgreSQL: rolled back, no key file written
            raise _refuse("STORE_REFUSED", f"the copy failed ({type(exc).__name__}); nothing was migrated") from None
        if isinstance(exc, OSError):
            raise _fail(f"cannot write {master_key_out}: {exc.strerror or exc}") from None
        raise
    data = {**report.as_dict(), "from": str(from_), "master_key_file": str(master_key_out)}
    _emit(json_out, data, lambda: _table(
        f"migrated {from_} into PostgreSQL store {report.store_id}", ["field", "value"],
        [["store_id", report.store_id], ["storage_epoch", report.storage_epoch],
         *[[f"rows {t}", n] for t, n in report.rows.items()], ["data keys re-wrapped", report.data_keys],
         ["unreferenced key files (not copied)", report.unreferenced_keys],
         ["master key", f"{master_key_out} (start every node with --master-key-file pointing at a copy)"]]))

# Commands in their own modules register on admin_app when imported (after everything above):
# admin explain, check-receipt; export, import; dispute, resolve, supersede, revoke-trust, rewind.
from engram_memory.server import admin_approvals, admin_explain, admin_lifecycle, admin_transfer  # noqa: E402,F401
