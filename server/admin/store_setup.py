"""``engram-memory admin rotate-master-key|init-store|migrate``: a store's master key, a new
PostgreSQL store, and a DuckDB store copied into one. rotate-master-key refuses while nodes run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from engram_memory.server.admin.options import (
    DataDir,
    JsonOut,
    PgKeyFile,
    PgStore,
    StoreUrl,
    _busy,
    _closed_store,
    _emit,
    _fail,
    _outcomes,
    _pg_outcomes,
    _postgres,
    _refuse,
    _store_url,
    _table,
    _target,
)

commands = typer.Typer()  # registered on admin_app by server/admin/app.py


# -- keys ---------------------------------------------------------------------------------------


@commands.command("rotate-master-key")
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


@commands.command("init-store")
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
            from engram_memory.store.opening import shared

            store_id = shared(url).init_store(url, key)
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


@commands.command("migrate")
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

    from engram_memory.store.backend import MigrateUsageError, StoreBusyError, StoreRefused, is_store_error
    from engram_memory.store.core.keyfile import new_key_file
    from engram_memory.store.core.refusals import STORE_BUSY
    from engram_memory.store.opening import shared

    target = shared(url)
    try:
        total = sum(target.migrate_counts(from_).values())
        console = Console(stderr=True)  # stdout carries the report; a pipe gets no bar (not even a blank line)
        with Progress(console=console, transient=True, disable=not console.is_terminal) as progress, \
                new_key_file(master_key_out) as key:
            task = progress.add_task("copying rows", total=total)
            report = target.migrate_store(from_, url, key, lambda _table, rows: progress.advance(task, rows))
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
