"""The operator's lifecycle operations from the console: each named by an exact request, shown with
its digest before it runs, and run only when the confirmed digest still matches.

Adjudication is store/host/adjudicate.py's; dispute, resolve, supersede and revoke trust are the host
lifecycle API of store/host/hostops.py; approve and deny decide a request awaiting the operator's
approval (store/host/approvals.py), in the page's scope only; forget is the agent's own forget
(Engine.forget: one tombstone event, the key destroyed, the projections purged), run for the
operator, whose confirmation replaces the host's confirmation guard:

* the console derives the whole forget request first -- ``record_id``, a fresh ``idempotency_key``
  and the operator's reason as ``reason_ref`` -- and shows its digest, which is the intent hash the
  store binds that key to (store/core/ledger.py ``intent_hash("forget", request)``);
* the operator confirms that digest (a single-use confirmation that lives at most
  ``CONFIRM_TTL_S``, the contract's bound for a human approval) and the console runs exactly that
  request, after recomputing its digest from what was submitted;
* it runs under the operator's own context (principal ``operator``, agent ``console``), leaves an
  audit row, and a repeated submit of the same confirmation replays the first answer (same key).
"""

from __future__ import annotations

import secrets
from typing import Any

from engram_memory.models.limits import CONFIRM_TTL_S
from engram_memory.models.states import Operation, can_transition
from engram_memory.store.console.console_reads import operator_context, record_console_call
from engram_memory.store.core.ledger import intent_hash
from engram_memory.store.core.refusals import AdminRefusal, AdminUsageError
from engram_memory.store.host import hostops
from engram_memory.store.host.adjudicate import check_reason

__all__ = ["CONFIRM_TTL_S", "OPERATIONS", "build", "digest", "legal_operations", "run"]

# operation -> the request fields the operator gives (beyond "operation" and "reason").
OPERATIONS: dict[str, tuple[str, ...]] = {
    "dispute": ("record_id",),
    "resolve": ("record_id", "current"),
    "supersede": ("record_id", "by"),
    "revoke_trust": ("scope_ref", "source_ref", "evidence_ref", "principal"),
    "forget": ("record_id", "idempotency_key", "reason_ref"),
    # a request awaiting the operator's approval (store/host/approvals.py), decided for its own scope
    "approve": ("scope_ref", "request_id"),
    "deny": ("scope_ref", "request_id"),
}
REVOKE_TARGETS = ("source_ref", "evidence_ref", "principal")
# The record operations of the record page, each with the lifecycle move that decides where it is
# legal (resolve only ever starts from a disputed record: store/hostops.resolve).
RECORD_MOVES: dict[str, Operation] = {"dispute": Operation.DISPUTE, "resolve": Operation.RESOLVE_DISPUTE,
                                      "supersede": Operation.SUPERSEDE, "forget": Operation.TOMBSTONE}


def legal_operations(state: str) -> list[str]:
    """The record page's operations a record in ``state`` may undergo (the state machine's table)."""
    return [name for name, move in RECORD_MOVES.items() if can_transition(move, state)]


def build(operation: str, fields: dict[str, str]) -> dict[str, Any]:
    """The exact request of an operation from a form's fields (AdminUsageError for a bad one).
    A forget gets its idempotency key here, once: the confirmed request carries it on."""
    if operation not in OPERATIONS:
        raise AdminUsageError(f"unknown operation {operation!r}")
    reason = check_reason(fields.get("reason", ""))
    if operation == "forget":
        key = "console-forget-" + secrets.token_hex(16)  # fresh: one key per confirmed forget
        forget = {"record_id": _required(fields, "record_id"), "idempotency_key": key, "reason_ref": reason}
        from engram_memory.models.tools import ForgetInput

        try:  # the agent's forget input, checked before the operator is shown it
            ForgetInput(**forget)
        except ValueError:
            raise AdminUsageError("a forget's reason is at most 512 UTF-8 bytes and its record a record id") from None
        return dict(forget)
    request: dict[str, Any] = {"operation": operation}
    if operation == "revoke_trust":
        request["scope_ref"] = _required(fields, "scope_ref")
        given = [k for k in REVOKE_TARGETS if fields.get(k, "").strip()]
        if len(given) != 1:
            raise AdminUsageError("revoke trust names exactly one of: source_ref, evidence_ref, principal")
        request[given[0]] = fields[given[0]].strip()
    elif operation in ("approve", "deny"):
        request["scope_ref"] = _required(fields, "scope_ref")
        request["request_id"] = _required(fields, "request_id")
    else:
        request["record_id"] = _required(fields, "record_id")
    if operation == "resolve":
        current = fields.get("current", "")
        if current not in ("current", "historical"):
            raise AdminUsageError("resolve says current or historical")
        request["current"] = current == "current"
    if operation == "supersede":
        request["by"] = _required(fields, "by")
    request["reason"] = reason
    return request


def _required(fields: dict[str, str], name: str) -> str:
    value = fields.get(name, "").strip()
    if not value:
        raise AdminUsageError(f"{name} is required")
    return value


def digest(operation: str, request: dict[str, Any]) -> str:
    """What the operator confirms: the forget request's intent hash, or the host operation's digest."""
    if operation == "forget":
        return intent_hash("forget", request)
    return str(hostops.operation_digest(request))


def run(engine: Any, operation: str, request: dict[str, Any], now: int, session: str) -> dict[str, Any]:
    """Run a confirmed request; returns the operation's result (its receipt included)."""
    if operation == "forget":
        return _forget(engine, request, session)
    reason = request["reason"]
    if operation in ("approve", "deny"):
        from engram_memory.store.host.approvals import decide

        return decide(engine, request["request_id"], operation == "approve", reason, now, request["scope_ref"])
    if operation == "dispute":
        result = hostops.dispute_with(engine, request["record_id"], reason, now)
    elif operation == "resolve":
        result = hostops.resolve_with(engine, request["record_id"], request["current"], reason, now)
    elif operation == "supersede":
        result = hostops.supersede_with(engine, request["record_id"], request["by"], reason, now)
    else:
        target = {k: request[k] for k in REVOKE_TARGETS if k in request}
        result = hostops.revoke_trust_with(engine, request["scope_ref"], reason, now, **target)
    return dict(result)


def _forget(engine: Any, request: dict[str, Any], session: str) -> dict[str, Any]:
    from engram_memory.models.errors import EngramError
    from engram_memory.models.tools import ForgetInput, to_plain
    from engram_memory.store.console.console_reads import record_scope

    scope_ref = record_scope(engine, request["record_id"])
    if scope_ref is None:
        raise AdminUsageError(f"no record {request['record_id']}")
    try:
        value = to_plain(engine.forget(operator_context(scope_ref, session), ForgetInput(**request)))
    except EngramError as exc:
        record_console_call(engine, scope_ref, "forget", session, ok=False, code=exc.code)
        raise AdminRefusal(exc.code, f"forget refused: {exc.code}") from None
    record_console_call(engine, scope_ref, "forget", session, ok=True)
    return {"operation": "forget", "scope_ref": scope_ref, "record_ids": [request["record_id"]], **value}


