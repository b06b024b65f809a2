"""Requests awaiting an operator's approval: the human gate of a client that cannot elicit.

withdraw and forget (and capture / request_admission when the host marks them) need a human's
confirmation, asked through MCP elicitation (server/gate.py). A client that did not declare
elicitation cannot ask; unless the host turned the queue off (``confirm_fallback = "off"``), its
call is parked here instead: bound to the call's principal, agent, scope, capability, target and
operation digest (the idempotency ledger's intent hash), its arguments sealed under a data key of
their own. The agent is answered ``gate_failed`` and retries the same call with the same key.

The operator decides (``engram-memory admin approvals|approve|deny``, the console):

* approve: the parked call runs at once, under the agent's bound context, and its answer goes
  into the idempotency ledger as every mutation's does; the agent's retry with the same key
  then answers it (``replayed: true``) whenever it comes;
* deny: the retry is ``gate_failed``;
* no decision within the TTL (at most 300 s): expired, the retry is ``gate_failed``.

A decision is final for that idempotency key; the sealed arguments' key is destroyed with it.
Every decision leaves an audit row, and the request keeps the operator's reason (screened for
secrets, store/host/adjudicate.py ``check_reason``).
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from engram_memory.models.canonical import canonical_bytes, canonical_text
from engram_memory.models.context import TOOL_PREFIX, HostContext
from engram_memory.models.envelope import new_audit_id
from engram_memory.models.errors import EngramError, ErrorCode
from engram_memory.models.hostauth import confirmation_target
from engram_memory.models.limits import CONFIRM_TTL_S, EXECUTION_WINDOW_S, SECOND_MS
from engram_memory.models.tools import parse_input, to_plain
from engram_memory.store.backend import APPROVAL_COLUMNS
from engram_memory.store.core import ledger
from engram_memory.store.core.crypto import open_sealed, seal
from engram_memory.store.core.refusals import NOT_PENDING, UNKNOWN_REQUEST, AdminRefusal
from engram_memory.store.host.adjudicate import check_reason

log = logging.getLogger("engram_memory.approvals")

PENDING, APPROVED, DENIED, EXPIRED = "pending", "approved", "denied", "expired"
OK = "ok"  # the outcome of an approved call that answered a success
REQUEST_PREFIX = "apr_"


def new_request_id() -> str:
    """"apr_" + 26 lowercase base32 characters (128 random bits)."""
    return REQUEST_PREFIX + base64.b32encode(secrets.token_bytes(16)).decode("ascii").rstrip("=").lower()


def _aad(request_id: str) -> bytes:
    return b"engram-memory/approval-arguments/" + request_id.encode("ascii")


@dataclass(frozen=True)
class ParkedRequest:
    request_id: str
    scope_ref: str
    principal: str
    agent_id: str
    tool: str
    target: str
    key_digest: str
    intent_hash: str
    context: str
    key_ref: str | None
    arguments: bytes | None
    status: str
    created_at_ms: int
    expires_at_ms: int
    decided_at_ms: int | None
    reason: str | None
    outcome: str | None

    @classmethod
    def of(cls, row: tuple[Any, ...]) -> ParkedRequest:
        values = dict(zip(APPROVAL_COLUMNS, row, strict=True))
        for key in ("created_at_ms", "expires_at_ms", "decided_at_ms"):
            if values[key] is not None:
                values[key] = int(values[key])
        return cls(**values)

    def row(self) -> tuple[Any, ...]:
        return tuple(getattr(self, c) for c in APPROVAL_COLUMNS)

    def host(self) -> HostContext:
        return HostContext(**json.loads(self.context))

    def summary(self, now: int) -> dict[str, Any]:
        """What an operator sees of the request (never the arguments' free text)."""
        tenant, _, workspace = self.scope_ref.partition("/")
        data: dict[str, Any] = {
            "request_id": self.request_id,
            "scope": tenant.removeprefix("tenant:") + "/" + workspace.removeprefix("workspace:"),
            "scope_ref": self.scope_ref,
            "agent_id": self.agent_id,
            "principal": self.principal,
            "capability": TOOL_PREFIX + self.tool,
            "target": self.target,
            "operation_digest": self.intent_hash,
            "status": self.status,
            "age_s": max(0, (now - self.created_at_ms) // SECOND_MS),
            "expires_in_s": max(0, -(-(self.expires_at_ms - now) // SECOND_MS)),
        }
        if self.decided_at_ms is not None:
            data["decided_at_ms"] = self.decided_at_ms
        for key in ("reason", "outcome"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return data


# -- the agent's side: park, or let an approved call through -------------------------------------


def admit_or_park(engine: Any, host: HostContext, tool: str, model: Any, ttl_s: float = CONFIRM_TTL_S) -> str:
    """The confirmation of a call whose client cannot ask its human.

    Returns when the operator approved this exact call (the engine then answers it: the ledger
    replays the answer the approval produced). Otherwise raises ``gate_failed``, parking the call
    first when it is new, or ``DIGEST_CONFLICT`` when its key is parked for another operation.
    Returns the request id it found."""
    plain = to_plain(model)
    intent = ledger.intent_hash(tool, plain)
    key_digest = ledger.key_digest(plain["idempotency_key"])
    now = int(engine.clock())
    with engine._rw.write():  # one writer, as every mutation
        row = engine.db.approval_find(host.scope_ref, host.principal, key_digest)
        if row is None:
            request_id = _park(engine, host, tool, plain, intent, key_digest, now, ttl_s)
            raise EngramError(ErrorCode.GATE_FAILED, f"awaiting the operator's approval: {request_id}")
        request = ParkedRequest.of(row)
        if request.intent_hash != intent or request.tool != tool:
            raise EngramError(ErrorCode.DIGEST_CONFLICT, "idempotency key parked for another operation")
        if request.status == PENDING and now >= request.expires_at_ms:
            request = _expire(engine, request, now)
        if request.status != APPROVED:
            raise EngramError(ErrorCode.GATE_FAILED, f"request {request.request_id} is {request.status}")
        if request.outcome in (None, ErrorCode.MUTATION_OUTCOME_UNKNOWN.value):
            # Still running, or its outcome unknown: the ledger says whether it was applied; if not,
            # it may run now only within the execution window of the approval.
            answered = engine.db.ledger_lookup(host.scope_ref, host.principal, key_digest) is not None
            decided = request.decided_at_ms or 0
            if not answered and now - decided > EXECUTION_WINDOW_S * SECOND_MS:
                raise EngramError(ErrorCode.GATE_FAILED, "approved call not executed within the window")
            return request.request_id
        if request.outcome != OK:
            raise EngramError(request.outcome or ErrorCode.GATE_FAILED, "the approved call's answer")
        return request.request_id


def _park(engine: Any, host: HostContext, tool: str, plain: dict[str, Any], intent: str, key_digest: str,
          now: int, ttl_s: float) -> str:
    request_id = new_request_id()
    key_ref, dek = engine.keys.create()
    ttl_ms = int(min(float(ttl_s), float(CONFIRM_TTL_S)) * SECOND_MS)
    request = ParkedRequest(
        request_id=request_id, scope_ref=host.scope_ref, principal=host.principal, agent_id=host.agent_id,
        tool=tool, target=confirmation_target(plain), key_digest=key_digest, intent_hash=intent,
        context=canonical_text(_context(host)), key_ref=key_ref,
        arguments=seal(dek, canonical_bytes(plain), _aad(request_id)), status=PENDING,
        created_at_ms=now, expires_at_ms=now + ttl_ms, decided_at_ms=None, reason=None, outcome=None)
    if not engine.db.approval_insert(request.row()):  # raced by the same key: that one stands
        engine.keys.destroy(key_ref)
    else:
        log.info("%s parked for the operator's approval as %s (%s)", tool, request_id, host.scope_ref)
    return request_id


def _context(host: HostContext) -> dict[str, str]:
    return {"tenant": host.tenant, "workspace": host.workspace, "principal": host.principal,
            "agent_id": host.agent_id, "purpose_ref": host.purpose_ref, "session": host.session}


def _expire(engine: Any, request: ParkedRequest, now: int) -> ParkedRequest:
    """pending -> expired (under the engine's write lock); its arguments become unreadable."""
    if engine.db.approval_decide(request.request_id, EXPIRED, now, "not decided within the TTL"):
        _destroy(engine, request)
        _audit(engine, request, "approval_expired", ok=False)
    row = engine.db.approval_get(request.request_id)
    return ParkedRequest.of(row) if row is not None else request


def _destroy(engine: Any, request: ParkedRequest) -> None:
    if request.key_ref is not None and not engine.keys.destroy(request.key_ref):
        log.error("the sealed arguments' key of %s could not be destroyed", request.request_id)


def _audit(engine: Any, request: ParkedRequest, tool: str, ok: bool, code: str | None = None) -> None:
    from engram_memory.store.core.engine import AuditEvent

    engine.record_audit(request.host(), AuditEvent(new_audit_id(), tool, ok, code, None))


# -- the operator's side: list, approve, deny ----------------------------------------------------


def pending(engine: Any, scope_ref: str | None, now: int) -> list[dict[str, Any]]:
    """The requests awaiting a decision (one scope, or all); those past their TTL expire here."""
    out: list[dict[str, Any]] = []
    with engine._rw.write():
        for row in engine.db.approvals_pending(scope_ref):
            request = ParkedRequest.of(row)
            if now >= request.expires_at_ms:
                _expire(engine, request, now)
                continue
            out.append(request.summary(now))
    return out


def find(engine: Any, request_id: str) -> ParkedRequest | None:
    with engine._rw.write():  # the store's main connection: one thread at a time
        row = engine.db.approval_get(request_id)
    return None if row is None else ParkedRequest.of(row)


def parked_arguments(engine: Any, request: ParkedRequest) -> dict[str, Any] | None:
    """The parked call's arguments (None once decided: their key is destroyed)."""
    if request.key_ref is None or request.arguments is None:
        return None
    dek = engine.keys.load(request.key_ref)
    if dek is None:
        return None
    return dict(json.loads(open_sealed(dek, request.arguments, _aad(request.request_id))))


def decide(engine: Any, request_id: str, approve: bool, reason: str, now: int,
           scope_ref: str | None = None) -> dict[str, Any]:
    """Approve (and execute at once) or deny one pending request. ``scope_ref``: only a request
    of that scope (a console bound to one scope); another scope's request is unknown there.

    Raises AdminRefusal (unknown, expired or already decided: exit 1) or AdminUsageError (reason)."""
    reason = check_reason(reason)
    with engine._rw.write():
        row = engine.db.approval_get(request_id)
        request = None if row is None else ParkedRequest.of(row)
        if request is None or (scope_ref is not None and request.scope_ref != scope_ref):
            raise AdminRefusal(UNKNOWN_REQUEST, f"no request {request_id} awaits approval")
        if request.status == PENDING and now >= request.expires_at_ms:
            _expire(engine, request, now)
            raise AdminRefusal(NOT_PENDING, f"request {request_id} expired (not decided within its TTL)")
        if request.status != PENDING:
            raise AdminRefusal(NOT_PENDING, f"request {request_id} is already {request.status}")
        arguments = parked_arguments(engine, request) if approve else None
        if approve and arguments is None:
            raise AdminRefusal(NOT_PENDING, f"request {request_id}'s arguments are unreadable")
        status = APPROVED if approve else DENIED
        if not engine.db.approval_decide(request_id, status, now, reason):
            raise AdminRefusal(NOT_PENDING, f"request {request_id} was decided meanwhile")
        _destroy(engine, request)
        _audit(engine, request, "approval_" + status, ok=True)
    if arguments is not None:  # outside the lock: a shared store's forget awaits the other nodes unlocked
        outcome = _execute(engine, request, arguments)
        with engine._rw.write():
            engine.db.approval_outcome(request_id, outcome)
    with engine._rw.write():
        decided = ParkedRequest.of(engine.db.approval_get(request_id) or request.row())
    return decided.summary(now)


def _execute(engine: Any, request: ParkedRequest, arguments: dict[str, Any]) -> str:
    """Run the approved call under the agent's bound context; its answer lands in the ledger."""
    from engram_memory.store.core.engine import AuditEvent

    host = request.host()
    audit_id = new_audit_id()
    try:
        model = parse_input(request.tool, arguments)
        getattr(engine, request.tool)(host, model)
    except EngramError as exc:
        log.info("approved %s %s answered %s", request.tool, request.request_id, exc.code)
        outcome = exc.code
    except Exception:
        log.exception("approved %s %s failed", request.tool, request.request_id)
        outcome = ErrorCode.MUTATION_OUTCOME_UNKNOWN.value
    else:
        outcome = OK
    engine.record_audit(host, AuditEvent(audit_id, request.tool, outcome == OK, None if outcome == OK else outcome,
                                         arguments.get("idempotency_key")))
    return outcome
