"""``engram-memory admin export`` and ``admin import``: a scope's current records to a JSON Lines
file, and such a file (or the MCP memory server's knowledge graph) back through capture and
admission. The logic is store/host/transfer.py's; this module parses options and prints reports.

A DuckDB data dir must not be held by a running server (STORE_BUSY, as every admin command but
``backup``): the engine opens the store itself, without the embedding model (a server embeds
the imported records at its next start). On a PostgreSQL store both run against the live store.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engram_memory.server.admin.options import (
    EXIT_INTERRUPTED,
    DataDir,
    JsonOut,
    PgKeyFile,
    PgStore,
    _busy,
    _closed_store,
    _emit,
    _fail,
    _now,
    _outcomes,
    _pg_outcomes,
    _pg_scope,
    _postgres,
    _refuse,
    _scope_ref,
    _short,
    _table,
    _target,
)

commands = typer.Typer()  # registered on admin_app by server/admin/app.py

PROGRESS_EVERY_S = 2.0  # a plain progress line (stderr not a terminal) at most this often
ScopeOpt = Annotated[str, typer.Option("--scope", help="The scope, as TENANT/WORKSPACE.")]


@contextmanager
def _engine(data_dir: Path | None, store: str | None, key_file: Path | None, *,
            scope_ref: str | None = None, create: bool = False) -> Iterator[Any]:
    """An engine on the command's store, without the embedding model: the DuckDB store of the data
    dir (no server may hold it; ``create``: an absent or empty dir gets a new store), or an admin
    node of the PostgreSQL store. ``scope_ref``, when given, must exist."""
    pg = _postgres(store, key_file, data_dir)
    if pg is not None:
        assert pg.key_file is not None
        _pg_scope(pg, scope_ref)
        from engram_memory.store.core.admin_node import admin_engine

        with _pg_outcomes(), admin_engine(pg.url, pg.key_file) as engine:
            yield engine
        return
    from engram_memory.models.settings import EngineSettings
    from engram_memory.store.backend import StoreBusyError
    from engram_memory.store.core.engine import Engine
    from engram_memory.store.core.refusals import STORE_BUSY

    target = _target(data_dir)
    if not (create and (not target.exists() or (target.is_dir() and not any(target.iterdir())))):
        _closed_store(target, scope_ref)
    try:
        engine = Engine.open(EngineSettings(data_dir=target, semantic=False))
    except StoreBusyError:
        raise _refuse(STORE_BUSY, f"data dir {target} is in use by a running server; stop it first") from None
    try:
        with _outcomes():
            yield engine
    finally:
        engine.close()


@commands.command("export")
def export_cmd(
    scope: ScopeOpt,
    out: Annotated[Path, typer.Option("--out", help="The JSON Lines file to write (new; 0600).")],
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Write a scope's current records to a JSON Lines file: a header line, then one record per line
    (id, state, digests, payload with its citations). Never a key. Forgotten, expired and withdrawn
    items are not written. The file holds memory content in the clear: it is created 0600."""
    scope_ref = _scope_ref(scope)
    assert scope_ref is not None
    if out.exists():
        raise _fail(f"--out {out} already exists; choose a new file")
    if not out.absolute().parent.is_dir():
        raise _fail(f"--out {out}: no such directory {out.absolute().parent}")
    from engram_memory.store.core.timeutil import to_instant
    from engram_memory.store.host.transfer import export_lines, write_lines

    with _engine(data_dir, store, master_key_file, scope_ref=scope_ref) as engine, _busy("exporting"):
        lines = export_lines(engine, scope_ref, scope, to_instant(_now()))
    try:
        size = write_lines(out, lines)
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc.strerror or exc}") from None
    records = len(lines) - 1
    _emit(json_out, {"scope": scope, "out": str(out), "records": records, "bytes": size,
                     "format": lines[0]["format"], "version": lines[0]["version"]},
          lambda: f"exported {records} current record(s) of {scope} to {out} ({size} bytes)")


@commands.command("import")
def import_cmd(
    scope: ScopeOpt,
    from_: Annotated[Path, typer.Option("--from", help="An engram-memory export, or an MCP memory server"
                                        " knowledge graph (memory.json / memory.jsonl).")],
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    allow_partial: Annotated[bool, typer.Option(
        "--allow-partial", help="Import an export even when lines do not match their payload_digest (they are"
        " reported invalid) or the file holds fewer records than its header says.")] = False,
    json_out: JsonOut = False,
) -> None:
    """Import a file into a scope through capture and admission: the admission policy decides each
    item (secrets are rejected and reported, never shown). The format is detected from the content.
    Idempotency keys come from each item's content: importing the same file again changes nothing.
    An export is checked whole first (its header's record count, every line's payload_digest): a
    mismatch is refused, nothing imported, unless --allow-partial.
    A DuckDB data dir that does not exist (or is empty) gets a new store."""
    scope_ref = _scope_ref(scope)
    assert scope_ref is not None
    from engram_memory.store.host.transfer import import_items, read_items

    progress = _Progress()
    with _outcomes():  # the whole file, before the store is opened (a refusal stays one line)
        source = read_items(from_, allow_partial=allow_partial,
                            reading=lambda lines: progress.line(f"reading {from_}: {lines} line(s)"))
    notes = list(source.notes)
    if source.scope is not None and source.scope != scope:
        notes.append(f"{from_} was exported from scope {source.scope}; its records are imported into {scope}")
    for note in notes:
        sys.stderr.write(f"engram-memory: note: {note}\n")
    # SIGINT only sets a flag that the next finished item acts on: a KeyboardInterrupt raised inside a
    # DuckDB call is turned into the driver's own error and could be taken for an item's failure.
    previous = signal.signal(signal.SIGINT, progress.interrupt)
    try:
        with _engine(data_dir, store, master_key_file, create=True) as engine, \
                progress.bar(len(source.items), f"read {len(source.items)} item(s) ({source.format})"):
            report = import_items(engine, scope_ref, source.format, source.items, progress.advance,
                                  progress.line)
    except KeyboardInterrupt:
        # Each item is its own transactions and its keys come from its content: nothing is half
        # imported, and the same command skips what is done.
        sys.stderr.write(f"\nengram-memory: interrupted after {progress.done} item(s) of {len(source.items)};"
                         " run the same command again to finish\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    progress.line("done")
    report.notes = notes
    _emit(json_out, {"scope": scope, "from": str(from_), **report.as_dict()}, lambda: _summary(scope, from_, report))


class _Progress:
    """Progress on stderr for every phase: a bar on a terminal while importing, otherwise plain
    lines (``engram-memory: importing: 1200/50000 item(s)``) at most every PROGRESS_EVERY_S."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.done, self.total, self.last = 0, 0, 0.0
        self.interrupted = False
        self._bar: Progress | None = None
        self._task: Any = None

    def line(self, message: str) -> None:
        if self._bar is not None:
            self._bar.console.print(f"engram-memory: {message}", highlight=False)
        else:
            sys.stderr.write(f"engram-memory: {message}\n")
            sys.stderr.flush()

    @contextmanager
    def bar(self, total: int, read: str) -> Iterator[None]:
        """The importing phase (the store is open: a refusal before it stays one line)."""
        self.line(read)
        self.total, self.last = total, time.monotonic()
        if not self.console.is_terminal:
            self.line(f"importing: 0/{total} item(s)")
            yield
            return
        with Progress(TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=self.console, transient=True) as bar:
            self._bar, self._task = bar, bar.add_task("importing", total=total)
            try:
                yield
            finally:
                self._bar = None

    def interrupt(self, _signum: int, _frame: Any) -> None:
        self.interrupted = True

    def advance(self) -> None:
        self.done += 1
        if self.interrupted:
            raise KeyboardInterrupt
        if self._bar is not None:
            self._bar.advance(self._task)
            return
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S or self.done == self.total:
            self.last = now
            self.line(f"importing: {self.done}/{self.total} item(s)")


def _summary(scope: str, source: Path, report: Any) -> str:
    counts = report.counts()
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(f"import of {source} into {scope} ({report.format})", highlight=False, soft_wrap=True)
    console.print(_table("", ["outcome", "items"], [
        ["imported", counts["imported"]], ["already present", counts["already_present"]],
        ["rejected by policy", counts["rejected"]], ["pending adjudication", counts["pending_adjudication"]],
        ["invalid", counts["invalid"]], ["total", counts["items"]]]))
    details = [["rejected", r["item"], r["reason"]] for r in report.rejected] + \
        [["pending adjudication", p["item"], _short(p["candidate_id"], 28)] for p in report.pending] + \
        [["invalid", i["item"], i["reason"]] for i in report.invalid]
    if details:
        console.print(_table("items not imported", ["outcome", "item", "reason"], details))
    if report.changed:
        return f"{counts['imported']} record(s) imported into {scope}"
    return "store unchanged: nothing new to import"
