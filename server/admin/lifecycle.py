"""``engram-memory admin dispute|resolve|supersede|revoke-trust|rewind``: host lifecycle operations.

Each is one journalled transition with the operator's reason (store/host/hostops.py). On a data dir a
server holds (a stdio owner, a daemon, ``serve --http``), the command goes through the owner's
local socket route (server/admin/socket_routes.py), the way ``admin backup`` does, and the running
server applies it in process; on a data dir no server holds, the command opens the store itself;
with ``--store URL --master-key-file F`` it runs on the live PostgreSQL store as an admin node,
and every serving node follows from the journal. Never an MCP tool, method or argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from engram_memory.server.admin.options import (
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
    _pair,
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

Reason = Annotated[str, typer.Option("--reason", help="Why (journalled for good; screened for secrets).")]
Record = Annotated[str, typer.Option("--record", help="The record id (mem_...).")]


def _run(operation: dict[str, Any], data_dir: Path | None, store: str | None, key_file: Path | None,
         json_out: bool, scope_ref: str | None = None) -> None:
    """Apply one operation request where the store is, and print its answer."""
    from engram_memory.store.host.adjudicate import check_reason
    from engram_memory.store.host.hostops import apply_operation, operation_digest

    pg = _postgres(store, key_file, data_dir)
    with _outcomes():
        check_reason(operation["reason"])  # before the store is touched
    digest = operation_digest(operation)
    online = False
    if pg is not None:
        assert pg.key_file is not None
        _pg_scope(pg, scope_ref)
        from engram_memory.store.core.admin_node import admin_engine

        with _pg_outcomes(), _busy(f"{operation['operation']} on the PostgreSQL store"), \
                admin_engine(pg.url, pg.key_file) as engine:
            result = apply_operation(engine, operation, _now())
    else:
        from engram_memory.store.maintenance.backup import held_by_another

        target = _target(data_dir)
        online = held_by_another(target) if target.is_dir() else False
        with _outcomes():
            if online:
                from engram_memory.server.admin.socket_routes import OwnerUnreachable, request_hostop

                try:
                    with _busy(f"{operation['operation']} (through the running server)"):
                        result = request_hostop(target, operation)
                except OwnerUnreachable as exc:
                    raise _refuse("STORE_BUSY", f"data dir {target} is held by a process that does not answer"
                                  f" a host operation: {exc}") from None
            else:
                _closed_store(target, scope_ref)
                result = _offline(target, operation)
    data = {**result, "scope": _pair(result["scope_ref"]), "operation_digest": digest, "online": online}
    rows = [["operation", f"{result['operation']} ({result['command']})"], ["scope", data["scope"]],
            ["records", " ".join(result["record_ids"])], ["count", len(result["record_ids"])],
            ["from_state", result["from_state"]], ["to_state", result["to_state"]]]
    rows += [[k, result[k]] for k in ("related_record_id", "related_to_state", "family_ref", "to_cursor")
             if k in result]
    rows += [["cursor", result["cursor"]], ["event_id", result["event_id"]],
             ["event_hash", _short(result["event_hash"])], ["reason", result["reason"]],
             ["operation_digest", _short(digest)]]
    _emit(json_out, data, lambda: _table(f"{result['command']}: {len(result['record_ids'])} record(s)"
                                         f" now {result['to_state']}", ["field", "value"], rows))


def _offline(data_dir: Path, operation: dict[str, Any]) -> dict[str, Any]:
    """The data dir's own engine, without the embedding model (a record back to current keeps its
    stored vector: a server indexes it again when it opens the store)."""
    from engram_memory.models.settings import EngineSettings
    from engram_memory.store.core.engine import Engine
    from engram_memory.store.host.hostops import apply_operation

    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        return apply_operation(engine, operation, _now())
    finally:
        engine.close()


@commands.command("dispute")
def dispute_cmd(record: Record, reason: Reason, data_dir: DataDir = None, store: PgStore = None,
                master_key_file: PgKeyFile = None, json_out: JsonOut = False) -> None:
    """Dispute a current record: accepted_disputed, out of search and get until resolved."""
    _run({"operation": "dispute", "record_id": record, "reason": reason}, data_dir, store, master_key_file, json_out)


@commands.command("resolve")
def resolve_cmd(
    record: Record,
    reason: Reason,
    current: Annotated[bool | None, typer.Option("--current/--historical", show_default=False,
                                                 help="Back to current (search and get), or historical.")] = None,
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Resolve a disputed record: back to accepted_current, or historical."""
    if current is None:
        raise _fail("say --current or --historical")
    _run({"operation": "resolve", "record_id": record, "current": current, "reason": reason},
         data_dir, store, master_key_file, json_out)


@commands.command("supersede")
def supersede_cmd(
    by: Annotated[str, typer.Option("--by", help="The current record that supersedes (same scope).")],
    reason: Reason,
    record: Annotated[str | None, typer.Option("--record", help="The record superseded (current or disputed).")] = None,
    family: Annotated[str | None, typer.Option(
        "--family", help="Instead of --record: every other current record of the scope whose capture named this"
        " family in reconciliation.family_refs (as --by's must).")] = None,
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Supersede a record by another: it becomes historical, linked to the current record --by."""
    if (record is None) == (family is None):
        raise _fail("name the superseded record with --record OLD, or its family with --family REF (one of them)")
    operation: dict[str, Any] = {"operation": "supersede", "by": by, "reason": reason}
    operation.update({"record_id": record} if record is not None else {"family_ref": family})
    _run(operation, data_dir, store, master_key_file, json_out)


@commands.command("revoke-trust")
def revoke_trust_cmd(
    scope: Annotated[str, typer.Option("--scope", help="The scope, as TENANT/WORKSPACE.")],
    reason: Reason,
    source_ref: Annotated[str | None, typer.Option("--source-ref", help="A citation's source_ref.")] = None,
    evidence_ref: Annotated[str | None, typer.Option(
        "--evidence-ref", help="The evidence the records rest on, by its digest (sha256:...): a record keeps its"
        " evidence's evidence_digest, not the capture's evidence_ref.")] = None,
    principal: Annotated[str | None, typer.Option("--principal", help="The principal whose captures they were.")]
    = None,
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Every current record of the scope resting on a source, an evidence or a principal: trust_invalid."""
    given = {k: v for k, v in (("source_ref", source_ref), ("evidence_ref", evidence_ref),
                               ("principal", principal)) if v is not None}
    if len(given) != 1:
        raise _fail("name exactly one of --source-ref, --evidence-ref, --principal")
    scope_ref = _scope_ref(scope)
    assert scope_ref is not None
    _run({"operation": "revoke_trust", "scope_ref": scope_ref, **given, "reason": reason},
         data_dir, store, master_key_file, json_out, scope_ref)


@commands.command("rewind")
def rewind_cmd(
    record: Record,
    to_cursor: Annotated[int, typer.Option("--to-cursor", min=0, help="The scope's journal cursor to go back to.")],
    reason: Reason,
    data_dir: DataDir = None,
    store: PgStore = None,
    master_key_file: PgKeyFile = None,
    json_out: JsonOut = False,
) -> None:
    """Undo a record's transitions after a cursor where the state machine allows it (historical ->
    current, closing the record that superseded it), else ILLEGAL_TRANSITION."""
    _run({"operation": "rewind", "record_id": record, "to_cursor": to_cursor, "reason": reason},
         data_dir, store, master_key_file, json_out)
