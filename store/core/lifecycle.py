"""The lifecycle engine: capture, request_admission, withdraw, forget, expiry.

Each mutation is ONE DuckDB transaction covering the journal event, the state rows, the
idempotency ledger entry and the tombstone set. Key destruction and projection updates
follow the commit and are idempotent, so a crash in between converges on restart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from engram_memory.models.canonical import canonical_bytes, canonical_text
from engram_memory.models.context import HostContext, HostPolicy
from engram_memory.models.digests import candidate_id as derive_candidate_id
from engram_memory.models.digests import (
    payload_digest,
    receipt_digest,
    record_digest,
    record_id_from_digest,
)
from engram_memory.models.errors import EngramError
from engram_memory.models.states import (
    CANDIDATE_ROW_STATE,
    EXPIRABLE,
    INITIAL_STATE,
    CandidateState,
    Operation,
    RecordState,
    admission_step,
    next_state,
)
from engram_memory.store.backend import KeyRing, NewCandidate, NewRecord, Store, UnitOfWork
from engram_memory.store.core import ledger
from engram_memory.store.core.authz import authorization_receipt
from engram_memory.store.core.crypto import open_sealed, seal
from engram_memory.store.core.keyreserve import KeyReserve
from engram_memory.store.core.timeutil import from_instant, to_instant
from engram_memory.store.screen.policy import DefaultAdmissionPolicy, screen_cache

ASSERTED_VERIFIER = "engram-memory:asserted"  # this server's name (the reference says graphify-memory)
CURRENT = RecordState.ACCEPTED_CURRENT


def pending_context(candidate_id: str) -> bytes:
    return receipt_digest("pending-context", {"candidate_id": candidate_id}).encode()


def record_context(record_id: str) -> bytes:
    return receipt_digest("record-context", {"record_id": record_id}).encode()


def event_at(record: dict[str, Any]) -> int | None:
    """The record's ``primary_event.at`` (its place in event order), kept beside the sealed body."""
    event = record.get("primary_event")
    return int(event["at"]) if event else None


def event_type(record: dict[str, Any]) -> str | None:
    """The record's ``primary_event.type_ref`` (a host's turn type makes it a conversation turn)."""
    event = record.get("primary_event")
    return str(event["type_ref"]) if event else None


EVENT_KIND_KEY_LABEL = b"engram-memory/event-kind/v1"


def event_kind(server_secret: bytes, scope_ref: str, type_ref: str | None) -> str | None:
    """The keyed digest kept beside a sealed record in place of its ``primary_event.type_ref``.

    The type is agent-written, so it is never stored in plaintext (SECURITY.md, "What each column
    holds"): the engine only asks whether a record is a turn, which it answers by comparing this
    digest with the digests of the host's turn types. Keyed with a subkey of the store's server
    secret (the same on every node, carried by backups and ``admin migrate``/``export``) and bound
    to the scope, so equal types in two scopes do not match and no guess can be checked without
    the key."""
    if type_ref is None:
        return None
    key = hmac.new(server_secret, EVENT_KIND_KEY_LABEL, hashlib.sha256).digest()
    message = scope_ref.encode("utf-8") + b"\x00" + type_ref.encode("utf-8")
    return "hmac-sha256:" + hmac.new(key, message, hashlib.sha256).hexdigest()


def primary_text(record: dict[str, Any]) -> str:
    return next((c["text"] for c in record["components"] if c["component_id"] == record["primary_component_id"]), "")


def lexical_fields(record: dict[str, Any]) -> dict[str, str]:
    """The accepted lexical document of REFERENCE_CONTRACT §6.4."""
    fields = {"primary": "", "decision": "", "evidence": "", "context": "", "citations": ""}
    by_kind: dict[str, list[str]] = {"decision": [], "evidence": [], "context": []}
    for component in record["components"]:
        by_kind[component["kind"]].append(component["text"])
    fields["primary"] = primary_text(record)
    for kind, texts in by_kind.items():
        fields[kind] = "\n".join(texts)
    fields["citations"] = "\n".join(c["source_ref"] for c in record["citations"])
    return fields


@dataclass
class AdmittedRecord:
    """What the projections need after an acceptance commit."""

    scope_ref: str
    record: dict[str, Any]
    cursor: int


@dataclass
class BatchItem:
    """One capture and its admission request (Lifecycle.capture_and_admit): the capture's plain
    arguments (its idempotency key included) and the admission's idempotency key."""

    capture: dict[str, Any]
    admit_key: str


@dataclass
class BatchOutcome:
    """What one item of a batch came to: the capture's and the admission's answers, or the error
    that refused it, or ``deferred`` (to be sent one by one: a replay)."""

    capture: dict[str, Any] | None = None
    admission: dict[str, Any] | None = None
    admitted: AdmittedRecord | None = None
    error: EngramError | None = None
    deferred: bool = False


@dataclass
class _Prepared:
    """An item of a batch on its way through capture_and_admit."""

    index: int
    cid: str
    capture_kd: str
    admit_kd: str
    capture_intent: str
    admit_intent: str
    error: EngramError | None = None
    pd: str = ""
    envelope: bytes = b""
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    decision: str = ""
    decision_digest: str = ""
    decision_envelope: dict[str, Any] = dataclasses.field(default_factory=dict)
    cursor: int = 0
    record: dict[str, Any] = dataclasses.field(default_factory=dict)
    capture_event: dict[str, Any] = dataclasses.field(default_factory=dict)
    admission_event: dict[str, Any] = dataclasses.field(default_factory=dict)

    def finish_capture(self, cursor: int, recorded_at: str, auth: str) -> None:
        """The capture's cursor is known: its record (digest, id) and journal event."""
        self.cursor = cursor
        env = self.env
        self.record = Lifecycle._build_record(env["payload"], self.pd, env["recorded_at"], cursor,
                                              env["authorization_receipt_digest"], env["trust"])
        self.capture_event = {
            "event_id": "capture:" + self.cid,
            "recorded_at": recorded_at,
            "operation": "capture",
            "candidate_id": self.cid,
            "to_state": INITIAL_STATE.value,
            "authorization_receipt_digest": auth,
        }



def asserted_trust(evidence_digest: str, payload_digest: str, issued_at: str) -> dict[str, Any]:
    """The trust receipt of a capture: the host asserted the evidence (no verifier checked it)."""
    trust: dict[str, Any] = {
        "class": "asserted",
        "evidence_digest": evidence_digest,
        "verifier_id": ASSERTED_VERIFIER,
        "verifier_version": "1",
        "issued_at": issued_at,
        "revocation_epoch": "0",
    }
    trust["receipt_digest"] = receipt_digest("asserted-trust", {**trust, "payload_digest": payload_digest})
    return trust

class Lifecycle:
    def __init__(self, db: Store, keys: KeyRing, policy: HostPolicy) -> None:
        self.db = db
        self.keys = keys
        self.host_policy = policy
        self.admission_policy = DefaultAdmissionPolicy()
        # Data keys whose destruction failed after their commit (the row no longer names them):
        # retried by retry_keys; after a restart the orphan sweep at open finds them.
        self.pending_keys: set[str] = set()

    # -- helpers -------------------------------------------------------------------------

    def _transaction_receipt(self, operation: str, cursor: int, event_hash: str, committed_at: str,
                             rec_digest: str | None = None) -> str:
        body: dict[str, Any] = {
            "operation": operation,
            "cursor": str(cursor),
            "storage_epoch": self.db.storage_epoch,
            "event_digest": event_hash,
            "committed_at": committed_at,
        }
        if rec_digest is not None:
            body["record_digest"] = rec_digest
        return receipt_digest("canonical-transaction", body)

    def _effective_payload(self, ctx: HostContext, payload: dict[str, Any], now: int) -> dict[str, Any]:
        retention = dict(payload.get("retention") or {"derivative_rule": "make-ineligible"})
        reconciliation = payload.get("reconciliation") or {"family_refs": []}
        if "expires_at" in retention:
            expires = from_instant(retention["expires_at"])
            if expires <= now:
                raise EngramError("INVALID_SCHEMA", "expires_at not after capture time")
            ceiling = self.host_policy.retention_ceiling_ms
            if ceiling is not None and expires - now > ceiling:
                raise EngramError("UNAUTHORIZED", "expires_at beyond host ceiling")
        if retention["derivative_rule"] == "retain" and not self.host_policy.allow_retain:
            raise EngramError("UNAUTHORIZED", "retain not allowed by host")
        if any(f not in self.host_policy.consented_families for f in reconciliation["family_refs"]):
            raise EngramError("UNAUTHORIZED", "reconciliation family without host consent")
        return {**payload, "scope_ref": ctx.scope_ref, "retention": retention, "reconciliation": reconciliation}

    # -- capture -------------------------------------------------------------------------

    def capture(self, ctx: HostContext, args: dict[str, Any], now: int) -> dict[str, Any]:
        key = args["idempotency_key"]
        intent = ledger.intent_hash("capture", args)
        with self.db.transaction() as uow:  # the ledger read inside it
            replay = ledger.lookup(uow, ctx, key, intent)
            if replay is not None:
                return {**replay, "status": "duplicate_exact"}

            payload = self._effective_payload(ctx, args["payload"], now)
            evidence = args["evidence"]
            cid = derive_candidate_id(ctx.source_ref, "0", key)
            recorded_at = to_instant(now)
            pd = payload_digest(payload)
            auth = authorization_receipt(ctx, "capture", {"scope_ref": ctx.scope_ref})
            trust = asserted_trust(evidence["evidence_digest"], pd, recorded_at)
            key_ref, dek = self.keys.create()
            cursor = uow.high_water(ctx.scope_ref) + 1
            record = self._build_record(payload, pd, recorded_at, cursor, auth, trust)
            envelope = canonical_bytes(
                {
                    "schema_version": 1,
                    "payload": payload,
                    "evidence": evidence,
                    "authorization_receipt_digest": auth,
                    "trust": trust,
                    "recorded_at": recorded_at,
                }
            )
            event = uow.append_event(
                ctx.scope_ref,
                {
                    "event_id": "capture:" + cid,
                    "recorded_at": recorded_at,
                    "operation": "capture",
                    "candidate_id": cid,
                    "to_state": INITIAL_STATE.value,
                    "authorization_receipt_digest": auth,
                },
            )
            uow.insert_candidate(NewCandidate(
                cid, ctx.scope_ref, ctx.principal, INITIAL_STATE.value, cursor, recorded_at, pd,
                record["record_digest"], key_ref, seal(dek, envelope, pending_context(cid))))
            value = {
                "status": "committed_pending",
                "candidate_id": cid,
                "record_digest": record["record_digest"],
                "cursor": str(cursor),
                "transaction_receipt_digest": self._transaction_receipt(
                    "capture", cursor, event["event_hash"], recorded_at
                ),
            }
            ledger.store(uow, ctx, key, "capture", intent, value, recorded_at)
        return value

    @staticmethod
    def _build_record(payload: dict[str, Any], pd: str, recorded_at: str, cursor: int, auth: str,
                      trust: dict[str, Any]) -> dict[str, Any]:
        record = {
            **payload,
            "payload_digest": pd,
            "recorded_at": recorded_at,
            "recorded_cursor": str(cursor),
            "authorization_receipt_digest": auth,
            "trust": trust,
        }
        rd = record_digest(record)
        return {**record, "record_digest": rd, "record_id": record_id_from_digest(rd)}

    @staticmethod
    def _candidate(src: Store | UnitOfWork, ctx: HostContext, cid: str) -> tuple[Any, ...] | None:
        # One query shape for unknown and foreign ids: both simply find no row.
        c = src.candidate(cid, ctx.scope_ref)
        if c is None:
            return None
        return (c.state, c.created_cursor, c.recorded_at, c.key_ref, c.envelope, c.outcome, c.payload_digest)

    # -- request_admission ---------------------------------------------------------------

    def request_admission(self, ctx: HostContext, args: dict[str, Any], now: int
                          ) -> tuple[dict[str, Any], AdmittedRecord | None]:
        key, cid = args["idempotency_key"], args["candidate_id"]
        intent = ledger.intent_hash("request_admission", args)
        with self.db.transaction() as uow:  # the ledger and state read inside it
            replay = ledger.lookup(uow, ctx, key, intent)
            if replay is not None:
                return {**replay, "replayed": True}, None
            row = self._candidate(uow, ctx, cid)
            if row is None:
                raise EngramError("NOT_FOUND")
            state, created_cursor, _recorded_at, key_ref, sealed, outcome, pd = row
            if admission_step(state) == "duplicate_exact":  # a withdrawn candidate is NOT_FOUND
                # Decided earlier under another key: the same decision, marked as a duplicate.
                return {"outcome": {**json.loads(outcome), "status": "duplicate_exact"}, "replayed": False}, None
            dek = self.keys.load(key_ref) if key_ref else None
            if dek is None or sealed is None:
                raise EngramError("MUTATION_OUTCOME_UNKNOWN", "pending candidate without key")
            env = json.loads(open_sealed(dek, sealed, pending_context(cid)))
            payload, evidence = env["payload"], env["evidence"]
            # pd was computed from this very payload at capture; the envelope is authenticated (GCM).
            record = self._build_record(
                payload, pd, env["recorded_at"], int(created_cursor),
                env["authorization_receipt_digest"], env["trust"],
            )
            decision = self.admission_policy.decide(payload, evidence)
            if decision == "accept" and uow.tombstoned(ctx.scope_ref, record["payload_digest"]):
                decision = "adjudication_required"  # forgotten content is never silently re-admitted
            issued_at = to_instant(now)
            envelope = self._decision_envelope(record["record_digest"], decision, issued_at)
            decision_digest = envelope["receipt_digest"]
            if decision == "adjudication_required":
                pending_value = self._pending_value(cid, str(created_cursor), decision_digest)
                # No state changes, but the answer is bound to the key like any other: a same-key
                # retry replays this decision receipt instead of issuing a new one.
                ledger.store(uow, ctx, key, "request_admission", intent, pending_value, issued_at)
                return pending_value, None

            auth = authorization_receipt(ctx, "request_admission", {"candidate_id": cid})
            accepted = decision == "accept"
            operation = Operation.ACCEPT if accepted else Operation.REJECT
            to_state = next_state(operation, CandidateState.PENDING).value
            admitted: AdmittedRecord | None = None
            record_key = self.keys.create() if accepted else None
            event_body: dict[str, Any] = {
                "event_id": "admission:" + cid,
                "recorded_at": record["recorded_at"],
                "operation": operation.value,
                "candidate_id": cid,
                "to_state": to_state,
                "authorization_receipt_digest": auth,
                "admission_decision": envelope,
            }
            if accepted:
                event_body["record_id"] = record["record_id"]
                event_body["record_digest"] = record["record_digest"]
            # An acceptance also moves the projection cursor: the projections must show it.
            event = uow.append_event(ctx.scope_ref, event_body, advance_projection=accepted)
            cursor = int(event["cursor"])
            outcome_value: dict[str, Any] = {
                "status": CANDIDATE_ROW_STATE[operation].value,
                "candidate_id": cid,
                "cursor": str(cursor),
                "decision_receipt_digest": decision_digest,
                "transaction_receipt_digest": self._transaction_receipt(
                    event_body["operation"], cursor, event["event_hash"], issued_at,
                    record["record_digest"] if accepted else None,
                ),
            }
            if accepted:
                assert record_key is not None
                outcome_value["record_id"] = record["record_id"]
                rkey_ref, rdek = record_key
                valid = record["valid_time"]
                expires = record["retention"].get("expires_at")
                uow.insert_record(NewRecord(
                    record["record_id"], ctx.scope_ref, cid, to_state, record["record_digest"],
                    record["payload_digest"], int(created_cursor), valid["t"], valid.get("t_end"),
                    from_instant(expires) if expires else None, rkey_ref,
                    seal(rdek, canonical_bytes(record), record_context(record["record_id"])),
                    event_at(record), event_kind(self.keys.server_secret, ctx.scope_ref, event_type(record))))
                admitted = AdmittedRecord(ctx.scope_ref, record, cursor)
            uow.close_candidate(cid, CANDIDATE_ROW_STATE[operation].value, canonical_text(outcome_value))
            value = {"outcome": outcome_value, "replayed": False}
            ledger.store(uow, ctx, key, "request_admission", intent, value, issued_at)
        self._destroy(key_ref)  # a failure is retried (retry_keys), or swept at the next open
        return value, admitted

    # -- a batch of captures, each with its admission request, in one transaction (an import) --

    def capture_and_admit(self, ctx: HostContext, items: list[BatchItem], now: int,
                          keys: KeyReserve | None = None) -> list[BatchOutcome]:
        """What ``capture`` then ``request_admission`` of each item would do, in item order, in ONE
        transaction: the same journal events, rows, ledger answers and receipts, each item screened
        and decided on its own (one refused item is its own outcome, the others commit). A capture
        decided without adjudication never gets a key file (its key and envelope would be dropped in
        the same commit); the record keys and those of candidates left pending are created together
        (KeyRing.create_many) before the commit. An item either key of which is in the ledger
        already, or whose capture key an earlier item of the batch uses, is ``deferred``: the
        caller sends it through capture and request_admission one by one (their replays). ``keys``:
        where the batch's keys come from (an import's KeyReserve, made ahead), the store's ring if
        None."""
        outcomes: list[BatchOutcome] = [BatchOutcome() for _ in items]
        recorded_at = issued_at = to_instant(now)
        auth_capture = authorization_receipt(ctx, "capture", {"scope_ref": ctx.scope_ref})
        source = ctx.source_ref  # a digest: the same for every item of the batch
        prepared: list[_Prepared] = []
        seen: set[str] = set()
        with screen_cache():  # this batch's repeated field names and constants screened once
            for index, item in enumerate(items):
                key = item.capture["idempotency_key"]
                if key in seen:
                    outcomes[index].deferred = True
                    continue
                seen.add(key)
                prepared.append(self._prepare(ctx, index, item, now, recorded_at, auth_capture, source))
        with self.db.transaction() as uow:
            digests = [d for p in prepared for d in (p.capture_kd, p.admit_kd)]
            known = uow.ledger_lookup_many(ctx.scope_ref, ctx.principal, digests) if digests else {}
            todo = []
            for p in prepared:
                if p.capture_kd in known or p.admit_kd in known:
                    outcomes[p.index].deferred = True  # a replay: answered by the one-by-one path
                elif p.error is not None:
                    outcomes[p.index].error = p.error
                else:
                    todo.append(p)
            forgotten = uow.tombstoned_many(ctx.scope_ref, [p.pd for p in todo]) if todo else set()
            for p in todo:
                if p.decision == "accept" and p.pd in forgotten:
                    p.decision = "adjudication_required"  # forgotten content is never silently re-admitted
            made = iter((keys or self.keys).create_many(sum(1 for p in todo if p.decision != "reject")))
            cursor = uow.high_water(ctx.scope_ref)
            events: list[tuple[dict[str, Any], bool]] = []
            for p in todo:
                cursor += 1
                p.finish_capture(cursor, recorded_at, auth_capture)
                p.decision_envelope = self._decision_envelope(p.record["record_digest"], p.decision, issued_at)
                p.decision_digest = p.decision_envelope["receipt_digest"]
                events.append((p.capture_event, False))
                if p.decision != "adjudication_required":
                    cursor += 1
                    p.admission_event = self._admission_event(ctx, p, issued_at)
                    events.append((p.admission_event, p.decision == "accept"))
            bodies = iter(uow.append_events(ctx.scope_ref, events))
            candidates: list[NewCandidate] = []
            closed: list[str | None] = []
            records: list[NewRecord] = []
            answers: list[tuple[str, str, str, str, str]] = []
            for p in todo:
                out = outcomes[p.index]
                capture_event = next(bodies)
                out.capture = {
                    "status": "committed_pending",
                    "candidate_id": p.cid,
                    "record_digest": p.record["record_digest"],
                    "cursor": str(p.cursor),
                    "transaction_receipt_digest": self._transaction_receipt(
                        "capture", p.cursor, capture_event["event_hash"], recorded_at),
                }
                answers.append((p.capture_kd, "capture", p.capture_intent, canonical_text(out.capture), recorded_at))
                candidate = NewCandidate(p.cid, ctx.scope_ref, ctx.principal, INITIAL_STATE.value, p.cursor,
                                         recorded_at, p.pd, p.record["record_digest"], None, None)
                if p.decision == "adjudication_required":
                    key_ref, dek = next(made)
                    candidates.append(dataclasses.replace(candidate, key_ref=key_ref,
                                                          envelope=seal(dek, p.envelope, pending_context(p.cid))))
                    closed.append(None)
                    out.admission = self._pending_value(p.cid, str(p.cursor), p.decision_digest)
                    answers.append((p.admit_kd, "request_admission", p.admit_intent, canonical_text(out.admission),
                                    issued_at))
                    continue
                accepted = p.decision == "accept"
                operation = Operation.ACCEPT if accepted else Operation.REJECT
                event = next(bodies)
                cursor = int(event["cursor"])
                outcome: dict[str, Any] = {
                    "status": CANDIDATE_ROW_STATE[operation].value,
                    "candidate_id": p.cid,
                    "cursor": str(cursor),
                    "decision_receipt_digest": p.decision_digest,
                    "transaction_receipt_digest": self._transaction_receipt(
                        operation.value, cursor, event["event_hash"], issued_at,
                        p.record["record_digest"] if accepted else None),
                }
                if accepted:
                    rkey_ref, rdek = next(made)
                    outcome["record_id"] = p.record["record_id"]
                    records.append(self._new_record(ctx.scope_ref, p.cid, p.record, rkey_ref, rdek))
                    out.admitted = AdmittedRecord(ctx.scope_ref, p.record, cursor)
                candidates.append(dataclasses.replace(candidate, state=CANDIDATE_ROW_STATE[operation].value))
                closed.append(canonical_text(outcome))
                out.admission = {"outcome": outcome, "replayed": False}
                answers.append((p.admit_kd, "request_admission", p.admit_intent, canonical_text(out.admission),
                                issued_at))
            uow.insert_candidates(candidates, closed)
            uow.insert_records(records)
            uow.ledger_store_many(ctx.scope_ref, ctx.principal, answers)
        return outcomes

    def _prepare(self, ctx: HostContext, index: int, item: BatchItem, now: int, recorded_at: str,
                 auth: str, source: str) -> _Prepared:
        """An item's work that needs no transaction: its effective payload, digests, envelope and
        the admission policy's screen (what capture and request_admission compute)."""
        args = item.capture
        key = args["idempotency_key"]
        admit_args = {"candidate_id": derive_candidate_id(source, "0", key),
                      "idempotency_key": item.admit_key}
        p = _Prepared(index=index, cid=admit_args["candidate_id"],
                      capture_kd=ledger.key_digest(key), admit_kd=ledger.key_digest(item.admit_key),
                      capture_intent=ledger.intent_hash("capture", args),
                      admit_intent=ledger.intent_hash("request_admission", admit_args))
        try:
            payload = self._effective_payload(ctx, args["payload"], now)
        except EngramError as exc:
            p.error = exc
            return p
        evidence = args["evidence"]
        p.pd = payload_digest(payload)
        trust = asserted_trust(evidence["evidence_digest"], p.pd, recorded_at)
        p.envelope = canonical_bytes({"schema_version": 1, "payload": payload, "evidence": evidence,
                                      "authorization_receipt_digest": auth, "trust": trust,
                                      "recorded_at": recorded_at})
        # What the admission reads back from the sealed envelope: the same JSON, decoded.
        env = json.loads(p.envelope)
        p.env = env
        p.decision = self.admission_policy.decide(env["payload"], env["evidence"])
        return p

    def _decision_envelope(self, record_digest: str, decision: str, issued_at: str) -> dict[str, Any]:
        """The admission decision receipt (one request_admission's, or one item's of a batch)."""
        envelope: dict[str, Any] = {
            "policy_id": self.admission_policy.policy_id,
            "policy_version": self.admission_policy.policy_version,
            "record_digest": record_digest,
            "decision": decision,
            "issued_at": issued_at,
        }
        envelope["receipt_digest"] = receipt_digest("admission-decision", envelope)
        return envelope

    def _admission_event(self, ctx: HostContext, p: _Prepared, issued_at: str) -> dict[str, Any]:
        envelope = p.decision_envelope
        accepted = p.decision == "accept"
        operation = Operation.ACCEPT if accepted else Operation.REJECT
        body: dict[str, Any] = {
            "event_id": "admission:" + p.cid,
            "recorded_at": p.record["recorded_at"],
            "operation": operation.value,
            "candidate_id": p.cid,
            "to_state": next_state(operation, CandidateState.PENDING).value,
            "authorization_receipt_digest": authorization_receipt(ctx, "request_admission",
                                                                  {"candidate_id": p.cid}),
            "admission_decision": envelope,
        }
        if accepted:
            body["record_id"] = p.record["record_id"]
            body["record_digest"] = p.record["record_digest"]
        return body

    @staticmethod
    def _pending_value(cid: str, pending_cursor: str, decision_digest: str) -> dict[str, Any]:
        return {
            "outcome": {
                "status": "pending_adjudication",
                "candidate_id": cid,
                "cursor": pending_cursor,
                "decision_receipt_digest": decision_digest,
                "transaction_receipt_digest": receipt_digest(
                    "admission-pending",
                    {"candidate_id": cid, "cursor": pending_cursor, "decision_receipt_digest": decision_digest},
                ),
            },
            "replayed": False,
        }

    def _new_record(self, scope_ref: str, cid: str, record: dict[str, Any], key_ref: str, dek: bytes) -> NewRecord:
        valid = record["valid_time"]
        expires = record["retention"].get("expires_at")
        return NewRecord(
            record["record_id"], scope_ref, cid, next_state(Operation.ACCEPT, CandidateState.PENDING).value,
            record["record_digest"],
            record["payload_digest"], int(record["recorded_cursor"]), valid["t"], valid.get("t_end"),
            from_instant(expires) if expires else None, key_ref,
            seal(dek, canonical_bytes(record), record_context(record["record_id"])),
            event_at(record), event_kind(self.keys.server_secret, scope_ref, event_type(record)))

    # -- operator adjudication (host-only: engram-memory admin adjudicate) --------------

    def adjudicate(self, cid: str, accept: bool, reason: str, now: int
                   ) -> tuple[dict[str, Any], AdmittedRecord | None]:
        """The operator's decision on a candidate held for adjudication: accept or reject it,
        journalled with the operator's reason. Kept apart from request_admission on purpose:
        no agent context is involved, and the journal says an operator decided.

        Raises LookupError for an unknown candidate and ValueError when it is not awaiting
        adjudication (not pending, or the policy would decide it on its own)."""
        c = self.db.candidate(cid, None)
        if c is None:
            raise LookupError(cid)
        scope_ref, state, created_cursor, key_ref, sealed, pd = (
            c.scope_ref, c.state, c.created_cursor, c.key_ref, c.envelope, c.payload_digest)
        if state != CandidateState.PENDING:
            raise ValueError(f"candidate {cid} is {state}, not awaiting adjudication")
        dek = self.keys.load(key_ref) if key_ref else None
        if dek is None or sealed is None:
            raise ValueError(f"candidate {cid} has lost its data key")
        assert key_ref is not None  # a data key was loaded from it
        env = json.loads(open_sealed(dek, sealed, pending_context(cid)))
        decision = self.admission_policy.decide(env["payload"], env["evidence"])
        if decision == "accept" and self._tombstoned(scope_ref, pd):
            decision = "adjudication_required"
        if decision != "adjudication_required":
            raise ValueError(f"candidate {cid} is not awaiting adjudication (the policy decides it: {decision})")
        record = self._build_record(env["payload"], pd, env["recorded_at"], int(created_cursor),
                                    env["authorization_receipt_digest"], env["trust"])
        at = to_instant(now)
        operation = Operation.ACCEPT if accept else Operation.REJECT
        to_state = next_state(operation, CandidateState.PENDING).value
        verdict = {"decision": "accept" if accept else "reject", "reason": reason, "decided_at": at,
                   "record_digest": record["record_digest"]}
        verdict["receipt_digest"] = receipt_digest("operator-adjudication", {"candidate_id": cid, **verdict})
        record_key = self.keys.create() if accept else None
        admitted: AdmittedRecord | None = None
        with self.db.transaction() as uow:
            # Decided on a read made before the transaction: the candidate must still be pending
            # now that its scope is held (an agent's withdraw, or another node, may have closed it).
            now_row = uow.candidate(cid, scope_ref)
            if now_row is None or now_row.state != CandidateState.PENDING:
                raise ValueError(f"candidate {cid} is no longer awaiting adjudication")
            body: dict[str, Any] = {
                "event_id": "adjudication:" + cid,
                "recorded_at": at,
                "operation": operation.value,
                "candidate_id": cid,
                "from_state": state,
                "to_state": to_state,
                "authorization_receipt_digest": verdict["receipt_digest"],
                "adjudication": verdict,
            }
            if accept:
                body["record_id"] = record["record_id"]
                body["record_digest"] = record["record_digest"]
            event = uow.append_event(scope_ref, body, advance_projection=accept)
            cursor = int(event["cursor"])
            outcome: dict[str, Any] = {
                "status": CANDIDATE_ROW_STATE[operation].value,
                "candidate_id": cid,
                "cursor": str(cursor),
                "decision_receipt_digest": verdict["receipt_digest"],
                "transaction_receipt_digest": self._transaction_receipt(
                    operation.value, cursor, event["event_hash"], at, record["record_digest"] if accept else None),
            }
            if accept:
                assert record_key is not None
                rkey_ref, rdek = record_key
                outcome["record_id"] = record["record_id"]
                valid = record["valid_time"]
                expires = record["retention"].get("expires_at")
                uow.insert_record(NewRecord(
                    record["record_id"], scope_ref, cid, to_state, record["record_digest"],
                    record["payload_digest"], int(created_cursor), valid["t"], valid.get("t_end"),
                    from_instant(expires) if expires else None, rkey_ref,
                    seal(rdek, canonical_bytes(record), record_context(record["record_id"])),
                    event_at(record), event_kind(self.keys.server_secret, scope_ref, event_type(record))))
                admitted = AdmittedRecord(scope_ref, record, cursor)
            uow.close_candidate(cid, CANDIDATE_ROW_STATE[operation].value, canonical_text(outcome))
        self.keys.destroy(key_ref)  # a failure leaves an orphan key, swept at the next open
        return {"scope_ref": scope_ref, "event": event, "outcome": outcome}, admitted

    def _tombstoned(self, scope_ref: str, pd: str) -> bool:
        return self.db.tombstoned(scope_ref, pd)

    # -- withdraw ------------------------------------------------------------------------

    def withdraw(self, ctx: HostContext, args: dict[str, Any], now: int) -> dict[str, Any]:
        key, cid = args["idempotency_key"], args["candidate_id"]
        intent = ledger.intent_hash("withdraw", args)
        with self.db.transaction() as uow:  # the ledger and state read inside it
            replay = ledger.lookup(uow, ctx, key, intent)
            if replay is not None:
                return {**replay, "replayed": True}
            row = self._candidate(uow, ctx, cid)
            if row is None:
                raise EngramError("NOT_FOUND")
            state, key_ref = row[0], row[3]
            to_state = next_state(Operation.WITHDRAW, state).value  # ALREADY_TERMINAL / ILLEGAL_TRANSITION
            at = to_instant(now)
            auth = authorization_receipt(ctx, "withdraw", {"candidate_id": cid})
            event = uow.append_event(ctx.scope_ref, _transition_event(
                Operation.WITHDRAW, "candidate_id", cid, state, to_state, auth, args["reason_ref"], at))
            uow.close_candidate(cid, CANDIDATE_ROW_STATE[Operation.WITHDRAW].value)
            receipt = self._lifecycle_receipt(event, Operation.WITHDRAW.value, state, to_state, auth, at)
            # Written as "pending" in the same transaction; upgraded once the key is gone, so a
            # replay always returns the answer the first call gave.
            value = {"receipt": receipt, "replayed": False, "key_destruction": "pending"}
            ledger.store(uow, ctx, key, "withdraw", intent, value, at, key_ref)
        if key_ref is None or self._destroy(key_ref):
            value = {**value, "key_destruction": "complete"}
            ledger.update(self.db, ctx, key, value)
        return value

    def _lifecycle_receipt(self, event: dict[str, Any], operation: str, from_state: str, to_state: str,
                           auth: str, at: str) -> dict[str, Any]:
        cursor = int(event["cursor"])
        return {
            "event_id": event["event_id"],
            "operation": operation,
            "from_state": from_state,
            "to_state": to_state,
            "cursor": str(cursor),
            "event_digest": event["event_hash"],
            "authorization_receipt_digest": auth,
            "transaction_receipt_digest": self._transaction_receipt(operation, cursor, event["event_hash"], at),
        }

    # -- forget --------------------------------------------------------------------------

    def forget(self, ctx: HostContext, args: dict[str, Any], now: int) -> tuple[dict[str, Any], str | None]:
        """Tombstone a record; returns the value and the record_id whose projections must be purged
        (None for a replay)."""
        key, rid = args["idempotency_key"], args["record_id"]
        intent = ledger.intent_hash("forget", args)
        with self.db.transaction() as uow:  # the ledger and state read inside it
            replay = ledger.lookup(uow, ctx, key, intent)
            if replay is not None:
                return {**replay, "replayed": True}, None
            status = uow.record_state(ctx.scope_ref, rid)
            if status is None:
                raise EngramError("NOT_FOUND")
            state, key_ref, pd = status.state, status.key_ref, status.payload_digest
            to_state = next_state(Operation.TOMBSTONE, state).value  # ALREADY_TERMINAL / ILLEGAL_TRANSITION
            at = to_instant(now)
            auth = authorization_receipt(ctx, "tombstone", {"record_id": rid})
            event = uow.append_event(ctx.scope_ref, _transition_event(
                Operation.TOMBSTONE, "record_id", rid, state, to_state, auth, args["reason_ref"], at),
                advance_projection=True)
            cursor = int(event["cursor"])
            uow.tombstone_record(rid, to_state)
            uow.delete_embeddings(rid)
            uow.tombstone_payload(ctx.scope_ref, pd, rid, cursor)
            receipt = self._lifecycle_receipt(event, Operation.TOMBSTONE.value, state, to_state, auth, at)
            value = {"receipt": receipt, "replayed": False, "projection_invalidation": "pending"}
            ledger.store(uow, ctx, key, "forget", intent, value, at, key_ref)
        if key_ref is not None:
            self._destroy(key_ref)  # crypto-shreds the body; the engine completes only once it is gone
        return value, rid

    def complete_forget(self, ctx: HostContext, idempotency_key: str, value: dict[str, Any],
                        coverage_digest: str) -> dict[str, Any]:
        """Called once every projection has physically dropped the record and its key is gone."""
        value = {**value, "projection_invalidation": "complete", "coverage_receipt_digest": coverage_digest}
        ledger.update(self.db, ctx, idempotency_key, value)
        return value

    # -- post-commit steps that did not finish ---------------------------------------------

    def _destroy(self, key_ref: str) -> bool:
        if self.keys.destroy(key_ref):
            return True
        self.pending_keys.add(key_ref)
        return False

    def retry_keys(self) -> bool:
        """Destroy the keys whose destruction failed before; True once none is left."""
        for key_ref in sorted(self.pending_keys):
            if self.keys.destroy(key_ref):
                self.pending_keys.discard(key_ref)
        return not self.pending_keys

    def destroy_owed(self, scope_ref: str) -> bool:
        """Destroy the data keys the scope's pending answers owe that are still there (on a shared
        store: left by a node that died or failed between its commit and the key's deletion, whose
        own retry list is gone with it); True once none is left."""
        for key_ref in self.db.owed_keys(scope_ref):
            self.keys.destroy(key_ref)
        return not self.db.owed_keys(scope_ref)

    def pending_scopes(self) -> dict[str, set[str]]:
        """``{scope_ref: {tool}}`` of the withdraw and forget answers still saying "pending"."""
        out: dict[str, set[str]] = {}
        for answer in self.db.pending_answers():
            out.setdefault(answer.scope_ref, set()).add(answer.tool)
        return out

    def complete_pending(self, scope_ref: str, coverage_digest: str) -> int:
        """Upgrade a scope's pending withdraw/forget answers, so a replay returns the final one.

        Only once the caller made it true: no data key left to destroy (retry_keys) and, for a
        forget, the scope's projections rebuilt from the current records (the coverage)."""
        answers = self.db.pending_answers(scope_ref)
        with self.db.transaction() as uow:
            for answer in answers:
                value = answer.value
                if answer.tool == "withdraw":
                    value = {**value, "key_destruction": "complete"}
                else:
                    value = {**value, "projection_invalidation": "complete", "coverage_receipt_digest": coverage_digest}
                uow.ledger_update(scope_ref, answer.principal, answer.key_digest, canonical_text(value))
        return len(answers)

    # -- expiry maintenance --------------------------------------------------------------

    def expire_due(self, scope_ref: str, now: int) -> list[str]:
        """Append an expire event for each record past retention.expires_at (REFERENCE §7.4).

        The engine calls it only when its scope view says a record is due (store/core/live.py)."""
        if not self.db.due_expiries(scope_ref, [s.value for s in EXPIRABLE], now):
            return []  # the common case, without a transaction
        at = to_instant(now)
        with self.db.transaction() as uow:
            # Read again inside: another node of a shared store may have expired them meanwhile.
            due = uow.due_expiries(scope_ref, [s.value for s in EXPIRABLE], now)
            if not due:
                return []
            cursor = 0
            for d in due:
                rid, state, rd = d.record_id, d.state, d.record_digest
                expires_at = to_instant(d.expires_at_ms)
                auth = receipt_digest("retention-expiry", {"record_id": rid, "expires_at": expires_at})
                event = uow.append_event(
                    scope_ref,
                    {
                        "event_id": f"maintenance:expire:{rid}:{expires_at}",
                        "recorded_at": at,
                        "operation": Operation.EXPIRE.value,
                        "record_id": rid,
                        "from_state": state,
                        "to_state": next_state(Operation.EXPIRE, state).value,
                        "record_digest": rd,
                        "authorization_receipt_digest": auth,
                        "reason_ref": "memory:retention-expiry",
                    },
                )
                cursor = int(event["cursor"])
                uow.set_record_state(rid, RecordState.EXPIRED.value)
            uow.set_projection_cursor(scope_ref, cursor)
        return [d.record_id for d in due]

    # -- reads ---------------------------------------------------------------------------

    def load_record(self, record_id: str, key_ref: str, body: bytes) -> dict[str, Any] | None:
        dek = self.keys.load(key_ref)
        if dek is None:
            return None
        return json.loads(open_sealed(dek, body, record_context(record_id)))


def _transition_event(operation: Operation, subject_field: str, subject: str, from_state: str,
                      to_state: str, auth: str, reason_ref: str, at: str) -> dict[str, Any]:
    """The journal event of a withdraw (``candidate_id``) or a forget (``record_id``)."""
    return {
        "event_id": f"{operation.value}:{subject}",
        "recorded_at": at,
        "operation": operation.value,
        subject_field: subject,
        "from_state": from_state,
        "to_state": to_state,
        "authorization_receipt_digest": auth,
        "reason_ref": reason_ref,
    }
