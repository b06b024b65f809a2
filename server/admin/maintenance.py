"""``engram-memory admin verify|backup|restore``: check a store, copy it to one file, restore it.

Only ``backup`` runs alongside a server (the owner makes the copy over its socket,
server/admin/socket_routes.py); verify and restore refuse while another process holds the data
dir. On a PostgreSQL store (``--store URL --master-key-file FILE``) verify and backup run against
the live store; restore fills an empty one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from engram_memory.server.admin.options import (
    DataDir,
    JsonOut,
    PgKeyFile,
    PgStore,
    Scope,
    _busy,
    _closed_store,
    _emit,
    _fail,
    _outcomes,
    _pair,
    _Pg,
    _pg_outcomes,
    _pg_scope,
    _postgres,
    _refuse,
    _scope_ref,
    _store_url,
    _table,
    _target,
)
from engram_memory.store.core.refusals import STORE_INCONSISTENT

# What verify says when every problem is of the kind an interrupted write leaves (store/maintenance/verify.py).
RECOVERABLE = ("all of the recoverable kind an interrupted write (a crash, a kill) leaves, nothing lost: the next"
               " open repairs it (start the server on the store, or run the interrupted command again)")

commands = typer.Typer()  # registered on admin_app by server/admin/app.py


# -- verify ----------------------------------------------------------------------------------


@commands.command("verify")
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


@commands.command("backup")
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
                    from engram_memory.server.admin.socket_routes import OwnerUnreachable, request_backup

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


@commands.command("restore")
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
