"""``engram-memory admin approvals|approve|deny``: the operator decides the requests a client
without elicitation could not have its human confirm (store/host/approvals.py).

``approvals`` lists the requests awaiting a decision; ``approve`` runs one at once, under the
agent's bound context (its answer goes into the idempotency ledger: the agent's retry with the
same key answers it), ``deny`` refuses it (the retry answers gate_failed). Where the store is:
through the owner's socket when a server holds the data dir (server/admin/socket_routes.py), the data
dir's own engine when none does, or the live PostgreSQL store with ``--store``/``--master-key-file``.
An unknown, expired or already decided request is one line and exit status 1.
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
    Scope,
    _busy,
    _closed_store,
    _emit,
    _outcomes,
    _pg_outcomes,
    _postgres,
    _refuse,
    _scope_ref,
    _short,
    _table,
    _target,
)

commands = typer.Typer()  # registered on admin_app by server/admin/app.py

Request = Annotated[str, typer.Option("--request", help="The request id (apr_...), as admin approvals lists it.")]
Reason = Annotated[str, typer.Option("--reason", help="Why (kept with the decision; screened for secrets).")]


def _run(body: dict[str, Any], data_dir: Path | None, store: str | None, key_file: Path | None,
         what: str) -> dict[str, Any]:
    """One approval request (store/host/approvals.py through server/admin/socket_routes.approval_request), where
    the store is."""
    from engram_memory.server.admin.socket_routes import approval_request

    pg = _postgres(store, key_file, data_dir)
    if pg is not None:
        assert pg.key_file is not None
        from engram_memory.store.core.admin_node import admin_engine

        with _pg_outcomes(), _busy(f"{what} on the PostgreSQL store"), admin_engine(pg.url, pg.key_file) as engine:
            return approval_request(engine, body)
    from engram_memory.store.maintenance.backup import held_by_another

    target = _target(data_dir)
    online = held_by_another(target) if target.is_dir() else False
    with _outcomes():
        if online:
            from engram_memory.server.admin.socket_routes import APPROVALS_PATH, OwnerUnreachable, request_hostop

            try:
                with _busy(f"{what} (through the running server)"):
                    return request_hostop(target, body, APPROVALS_PATH)
            except OwnerUnreachable as exc:
                raise _refuse("STORE_BUSY", f"data dir {target} is held by a process that does not answer:"
                              f" {exc}") from None
        _closed_store(target, body.get("scope_ref"))
        return _offline(target, body)


def _offline(data_dir: Path, body: dict[str, Any]) -> dict[str, Any]:
    """The data dir's own engine, without the embedding model (a server started later embeds and
    indexes what changed)."""
    from engram_memory.models.settings import EngineSettings
    from engram_memory.server.admin.socket_routes import approval_request
    from engram_memory.store.core.engine import Engine

    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        return approval_request(engine, body)
    finally:
        engine.close()


@commands.command("approvals")
def approvals_cmd(scope: Scope = None, data_dir: DataDir = None, store: PgStore = None,
                  master_key_file: PgKeyFile = None, json_out: JsonOut = False) -> None:
    """List the requests awaiting the operator's approval (withdraw, forget, ... of a client without
    elicitation): id, agent, principal, capability, target, operation digest, age."""
    body: dict[str, Any] = {"action": "list"}
    scope_ref = _scope_ref(scope)
    if scope_ref is not None:
        body["scope_ref"] = scope_ref
    requests = _run(body, data_dir, store, master_key_file, "listing requests")["requests"]
    _emit(json_out, {"requests": requests}, lambda: _table(
        f"{len(requests)} request(s) awaiting approval", ["id", "scope", "agent", "principal", "capability",
                                                          "target", "operation digest", "age", "expires in"],
        [[r["request_id"], r["scope"], r["agent_id"], r["principal"], r["capability"], r["target"],
          _short(r["operation_digest"]), f"{r['age_s']} s", f"{r['expires_in_s']} s"] for r in requests]))


def _decide(request: str, approve: bool, reason: str, data_dir: Path | None, store: str | None,
            key_file: Path | None, json_out: bool) -> None:
    from engram_memory.store.host.adjudicate import check_reason

    with _outcomes():
        check_reason(reason)  # before the store is touched
    action = "approve" if approve else "deny"
    result = _run({"action": action, "request_id": request, "reason": reason}, data_dir, store, key_file,
                  f"{action} {request}")
    title = f"request {request}: {result['status']}"
    if "outcome" in result:
        title += f", the call answered {result['outcome']}"
    _emit(json_out, result, lambda: _table(title, ["field", "value"],
                                           [[k, v] for k, v in result.items() if k != "scope_ref"]))


@commands.command("approve")
def approve_cmd(request: Request, reason: Reason, data_dir: DataDir = None, store: PgStore = None,
                master_key_file: PgKeyFile = None, json_out: JsonOut = False) -> None:
    """Approve a request awaiting approval: it runs at once under the agent's context; the agent's
    retry with the same idempotency key answers its outcome."""
    _decide(request, True, reason, data_dir, store, master_key_file, json_out)


@commands.command("deny")
def deny_cmd(request: Request, reason: Reason, data_dir: DataDir = None, store: PgStore = None,
             master_key_file: PgKeyFile = None, json_out: JsonOut = False) -> None:
    """Deny a request awaiting approval: the agent's retry answers gate_failed."""
    _decide(request, False, reason, data_dir, store, master_key_file, json_out)
