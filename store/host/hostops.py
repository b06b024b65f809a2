"""Host lifecycle operations: dispute, resolve, supersede, revoke trust, rewind (never agent tools).

The reference engine's host-side transitions (REFERENCE_CONTRACT §7.2), run by an operator
through ``engram-memory admin dispute|resolve|supersede|revoke-trust|rewind``
(server/admin/lifecycle.py) on an OPEN engine: the data dir's own (opened by the command, or in
process by the server that owns the dir: server/admin/socket_routes.py), or an admin node of a shared store
(store/core/admin_node.py), whose serving nodes follow from the journal (Engine._sync).

Each operation is one journal event in one transaction, under the engine's write lock, hash-chained
like every event, carrying the operator's screened reason (``host_operation``) and answered with a
decision receipt. The legal moves are models/states.py's table; anything else is refused before a
cursor is allocated (the store unchanged). Search and get return ``accepted_current`` records only,
so a disputed, historical or untrusted record leaves them, and one resolved or rewound back to
current returns (its stored vector is indexed again, not re-embedded).
"""

from __future__ import annotations

from typing import Any

from engram_memory.models.digests import receipt_digest
from engram_memory.models.errors import EngramError
from engram_memory.models.states import Operation, RecordState, next_state
from engram_memory.store.core.refusals import ILLEGAL_TRANSITION, NOTHING_MATCHES, AdminRefusal, AdminUsageError
from engram_memory.store.core.timeutil import to_instant
from engram_memory.store.host.adjudicate import check_reason

CURRENT = RecordState.ACCEPTED_CURRENT.value
# What revoke-trust may name a record's support by (exactly one per call).
TRUST_SELECTORS = ("source_ref", "evidence_ref", "principal")


def operation_digest(operation: dict[str, Any]) -> str:
    """The digest of an operation request's canonical JSON (e.g. ``{"operation": "supersede",
    "record_id": OLD, "by": NEW, "reason": R}``): shown before an operator confirms it."""
    return receipt_digest("host-operation-request", operation)


# -- the operations ---------------------------------------------------------------------------


def dispute_with(engine: Any, record_id: str, reason: str, now: int) -> dict[str, Any]:
    """accepted_current -> accepted_disputed: out of search and get until resolved."""
    return _single(engine, Operation.DISPUTE, "dispute", record_id, reason, now)


def resolve_with(engine: Any, record_id: str, current: bool, reason: str, now: int) -> dict[str, Any]:
    """accepted_disputed -> accepted_current (resolve_dispute) or historical (the contract's
    mark_non_current: resolve_dispute itself only ever leads back to current)."""
    operation = Operation.RESOLVE_DISPUTE if current else Operation.MARK_NON_CURRENT
    if not current:
        # Only a disputed record is resolved; mark_non_current alone would also take a current one.
        scope_ref = _scope_of(engine, record_id)
        state = _state(engine, scope_ref, record_id)
        if state != RecordState.ACCEPTED_DISPUTED:
            raise AdminRefusal(ILLEGAL_TRANSITION, f"record {record_id} is {state}: only a disputed record"
                               " is resolved")
    return _single(engine, operation, "resolve", record_id, reason, now)


def supersede_with(engine: Any, old_id: str, new_id: str, reason: str, now: int) -> dict[str, Any]:
    """OLD (current or disputed) -> historical, linked to NEW: a current record of the same scope."""
    return _supersede(engine, [old_id], new_id, reason, now, {})


def supersede_family_with(engine: Any, new_id: str, family_ref: str, reason: str, now: int) -> dict[str, Any]:
    """Every other current record of NEW's scope that names ``family_ref`` in its
    ``reconciliation.family_refs`` (as NEW must) -> historical, linked to NEW: one event."""
    reason = check_reason(reason)
    scope_ref = _scope_of(engine, new_id)
    records = {r["record_id"]: r for r in engine.live_records(scope_ref)}
    if new_id not in records:
        raise AdminRefusal(ILLEGAL_TRANSITION, f"record {new_id} is {_state(engine, scope_ref, new_id)}: only a"
                           " current record supersedes another")
    if family_ref not in _families(records[new_id]):
        raise AdminUsageError(f"record {new_id} does not name family {family_ref} in its reconciliation.family_refs")
    olds = sorted(rid for rid, r in records.items() if rid != new_id and family_ref in _families(r))
    if not olds:
        raise AdminRefusal(NOTHING_MATCHES, f"no other current record of {scope_ref} is in family {family_ref}")
    return _supersede(engine, olds, new_id, reason, now, {"family_ref": family_ref})


def revoke_trust_with(engine: Any, scope_ref: str, reason: str, now: int, *, source_ref: str | None = None,
                      evidence_ref: str | None = None, principal: str | None = None) -> dict[str, Any]:
    """Every current record of the scope resting on the source (a citation's ``source_ref``), the
    evidence (its ``trust.evidence_digest``: a record keeps its evidence's digest, the capture's
    evidence_ref is not part of it) or the principal (whose capture it was) -> trust_invalid."""
    reason = check_reason(reason)
    given = {k: v for k, v in (("source_ref", source_ref), ("evidence_ref", evidence_ref),
                               ("principal", principal)) if v is not None}
    if len(given) != 1:
        raise AdminUsageError("name exactly one of --source-ref, --evidence-ref, --principal")
    (kind, ref), = given.items()
    if scope_ref not in engine.scopes():
        raise AdminUsageError(f"no scope {scope_ref} in the store")
    if kind == "principal":
        ids = sorted(rid for rid, p in engine.db.record_principals(scope_ref, CURRENT).items() if p == ref)
    else:
        ids = sorted(r["record_id"] for r in engine.live_records(scope_ref) if _rests_on(r, kind, ref))
    if not ids:
        raise AdminRefusal(NOTHING_MATCHES, f"no current record of {scope_ref} rests on {kind} {ref}")
    return _commit(engine, scope_ref, Operation.TRUST_INVALIDATE, "revoke-trust", ids, reason, now,
                   {"selector": {kind: ref}})


def rewind_with(engine: Any, record_id: str, to_cursor: int, reason: str, now: int) -> dict[str, Any]:
    """Undo the record's transitions after cursor ``to_cursor``, where the state machine allows
    it: a record that was current then and is historical now becomes current again (rewind), and
    the record that superseded it meanwhile, if still current or disputed, becomes historical."""
    reason = check_reason(reason)
    scope_ref = _scope_of(engine, record_id)
    if to_cursor < 0 or to_cursor >= engine.db.high_water(scope_ref):
        raise AdminUsageError(f"--to-cursor {to_cursor} is not a cursor before the head of {scope_ref}"
                              f" (0..{engine.db.high_water(scope_ref) - 1})")
    events = engine.db.record_events(scope_ref, record_id)
    then: str | None = None
    superseder: str | None = None
    for event in events:
        state = state_after(event, record_id)
        if int(event["cursor"]) <= to_cursor:
            then = state or then
        elif state == RecordState.HISTORICAL and event["operation"] == Operation.SUPERSEDE:
            superseder = event["related_record_id"]
    now_state = _state(engine, scope_ref, record_id)
    if then != CURRENT or now_state != RecordState.HISTORICAL:
        was = f"was {then} at cursor {to_cursor}" if then else f"did not exist at cursor {to_cursor}"
        raise AdminRefusal(ILLEGAL_TRANSITION, f"record {record_id} is {now_state} and {was}: the state machine"
                           " rewinds only a historical record to the current state it had")
    extra: dict[str, Any] = {"to_cursor": str(to_cursor)}
    related = None
    if superseder is not None and _state(engine, scope_ref, superseder) in (CURRENT, RecordState.ACCEPTED_DISPUTED):
        related = superseder
    return _commit(engine, scope_ref, Operation.REWIND, "rewind", [record_id], reason, now, extra, related=related)


def apply_operation(engine: Any, request: dict[str, Any], now: int) -> dict[str, Any]:
    """One operation request (the owner's local route, server/admin/socket_routes.py, and the CLI): its
    ``operation`` names the call, the other fields its arguments (strings; ``current`` a boolean,
    ``to_cursor`` an integer). Raises AdminUsageError for a malformed request."""
    def text(name: str) -> str:
        value = request.get(name)
        if not isinstance(value, str):
            raise AdminUsageError(f"host operation request: {name} must be a string")
        return value

    op, reason = text("operation"), text("reason")
    if op == "dispute":
        return dispute_with(engine, text("record_id"), reason, now)
    if op == "resolve":
        if not isinstance(request.get("current"), bool):
            raise AdminUsageError("host operation request: current must be true or false")
        return resolve_with(engine, text("record_id"), request["current"], reason, now)
    if op == "supersede" and "family_ref" in request:
        return supersede_family_with(engine, text("by"), text("family_ref"), reason, now)
    if op == "supersede":
        return supersede_with(engine, text("record_id"), text("by"), reason, now)
    if op == "revoke_trust":
        selectors = {k: text(k) for k in TRUST_SELECTORS if k in request}
        return revoke_trust_with(engine, text("scope_ref"), reason, now, **selectors)
    if op == "rewind":
        to_cursor = request.get("to_cursor")
        if not isinstance(to_cursor, int) or isinstance(to_cursor, bool):
            raise AdminUsageError("host operation request: to_cursor must be an integer")
        return rewind_with(engine, text("record_id"), to_cursor, reason, now)
    raise AdminUsageError(f"unknown host operation {op!r}")


# -- the journal ------------------------------------------------------------------------------


def state_after(event: dict[str, Any], record_id: str) -> str | None:
    """The state an event leaves a record in (None: the event does not change it)."""
    if record_id == event.get("record_id") or record_id in (event.get("record_ids") or ()):
        return str(event["to_state"]) if "to_state" in event else None
    if record_id == event.get("related_record_id") and "related_to_state" in event:
        return str(event["related_to_state"])
    return None


def _single(engine: Any, operation: Operation, command: str, record_id: str, reason: str,
            now: int) -> dict[str, Any]:
    reason = check_reason(reason)
    scope_ref = _scope_of(engine, record_id)
    return _commit(engine, scope_ref, operation, command, [record_id], reason, now, {})


def _supersede(engine: Any, olds: list[str], new_id: str, reason: str, now: int,
               extra: dict[str, Any]) -> dict[str, Any]:
    reason = check_reason(reason)
    scope_ref = _scope_of(engine, new_id)
    for old in olds:
        if old == new_id:
            raise AdminUsageError("a record does not supersede itself")
        if _scope_of(engine, old) != scope_ref:
            raise AdminUsageError(f"record {old} and record {new_id} are in different scopes")
    return _commit(engine, scope_ref, Operation.SUPERSEDE, "supersede", olds, reason, now, extra,
                   superseded_by=new_id)


def _commit(engine: Any, scope_ref: str, operation: Operation, command: str, record_ids: list[str], reason: str,
            now: int, extra: dict[str, Any], *, related: str | None = None,
            superseded_by: str | None = None) -> dict[str, Any]:
    """The one event, its state rows and the projections, under the engine's write lock; the
    states are read (and the moves checked) inside the transaction, before any cursor exists."""
    at = to_instant(now)
    with engine._rw.write():  # the engine's write lock: one writer, as every mutation
        with engine.db.transaction() as uow:
            from_states = [_row_state(uow, scope_ref, rid) for rid in record_ids]
            moved = [rid for rid, state in zip(record_ids, from_states, strict=True) if state != CURRENT]
            if len(record_ids) > 1 and moved:  # chosen among the current records, before this transaction
                raise AdminRefusal(ILLEGAL_TRANSITION, f"record {moved[0]} changed state meanwhile; run it again")
            to_state = _move(operation, record_ids, from_states)
            links: dict[str, Any] = {}
            if superseded_by is not None:
                by_state = _row_state(uow, scope_ref, superseded_by)
                if by_state != CURRENT:
                    raise AdminRefusal(ILLEGAL_TRANSITION, f"record {superseded_by} is {by_state}: only a current"
                                       " record supersedes another")
                links = {"related_record_id": superseded_by}
            if related is not None and _row_state(uow, scope_ref, related) not in (
                    CURRENT, RecordState.ACCEPTED_DISPUTED):
                related = None  # changed meanwhile: nothing left to close
            if related is not None:
                links = {"related_record_id": related, "related_from_state": _row_state(uow, scope_ref, related),
                         "related_to_state": RecordState.HISTORICAL.value}
            cursor = uow.high_water(scope_ref) + 1
            verdict = {"command": command, "reason": reason, "decided_at": at, **extra}
            verdict["receipt_digest"] = receipt_digest("host-operation", {
                "operation": operation.value, "record_ids": record_ids, **links, **verdict})
            target = {"record_id": record_ids[0]} if len(record_ids) == 1 and command != "revoke-trust" \
                else {"record_ids": record_ids}
            event = uow.append_event(scope_ref, {
                "event_id": f"{operation.value}:{record_ids[0] if len(record_ids) == 1 else 'records'}:{cursor}",
                "recorded_at": at,
                "operation": operation.value,
                **target,
                "from_state": from_states[0],  # the same for all (current) when there are several
                "to_state": to_state,
                **links,
                "authorization_receipt_digest": verdict["receipt_digest"],
                "host_operation": verdict,
            }, advance_projection=True)
            for rid in record_ids:
                uow.set_record_state(rid, to_state)
            if related is not None:
                uow.set_record_state(related, RecordState.HISTORICAL.value)
        gone = [] if to_state == CURRENT else list(record_ids)
        back = list(record_ids) if to_state == CURRENT else []
        if related is not None:
            gone.append(related)
        engine.host_transition(scope_ref, sorted(gone), back, int(event["cursor"]))
    receipt = engine.lifecycle._lifecycle_receipt(event, operation.value, event["from_state"], to_state,
                                                  verdict["receipt_digest"], at)
    receipt = {**receipt, "record_ids": record_ids, "count": len(record_ids), **links}
    return {"operation": operation.value, "command": command, "scope_ref": scope_ref, "record_ids": record_ids,
            "from_state": event["from_state"], "to_state": to_state, "cursor": int(event["cursor"]),
            "event_id": event["event_id"], "event_hash": event["event_hash"], "reason": reason,
            "receipt": receipt, **links, **extra}


def _move(operation: Operation, record_ids: list[str], from_states: list[str]) -> str:
    targets = set()
    for rid, state in zip(record_ids, from_states, strict=True):
        try:
            targets.add(next_state(operation, state).value)
        except EngramError:
            raise AdminRefusal(ILLEGAL_TRANSITION, f"{operation.value} of record {rid}, which is {state},"
                               " is not a legal transition") from None
    (target,) = targets
    return target


def _row_state(uow: Any, scope_ref: str, record_id: str) -> str:
    status = uow.record_state(scope_ref, record_id)
    if status is None:  # another node changed the store since the record was located
        raise AdminUsageError(f"no record {record_id} in {scope_ref}")
    return str(status.state)


def _scope_of(engine: Any, record_id: str) -> str:
    scope_ref = engine.db.record_scope(record_id)
    if scope_ref is None:
        raise AdminUsageError(f"no record {record_id} in the store")
    return str(scope_ref)


def _state(engine: Any, scope_ref: str, record_id: str) -> str:
    status = engine.db.record_state(scope_ref, record_id)
    if status is None:
        raise AdminUsageError(f"no record {record_id} in {scope_ref}")
    return str(status.state)


def _families(record: dict[str, Any] | None) -> list[str]:
    return list(((record or {}).get("reconciliation") or {}).get("family_refs") or [])


def _rests_on(record: dict[str, Any], kind: str, ref: str) -> bool:
    if kind == "source_ref":
        return any(c["source_ref"] == ref for c in record["citations"])
    return bool(record["trust"].get("evidence_digest") == ref)
