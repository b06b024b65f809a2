"""Closed models of each tool's success ``value`` and of the envelope that carries it.

They are the source of the published ``outputSchema`` and a guard on what the engine
emits: ``validate_output`` refuses anything off-contract before it reaches a caller.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from models.errors import CATALOG, EngramError
from models.fields import (
    CandidateId,
    Cursor,
    Digest,
    Instant,
    OpaqueRef,
    PageCursor,
    RecordId,
    SafeInt,
    Score,
    const,
    safe_int,
)
from models.tools import (
    Citation,
    Closed,
    Component,
    PrimaryEvent,
    Reconciliation,
    Retention,
    ValidTime,
    validation_detail,
)

Rank = safe_int(1)
Count = safe_int(0)


class OutputContractError(EngramError):
    """The engine produced a value outside the published schema: an operational failure, never sent."""

    def __init__(self, detail: str) -> None:
        super().__init__("CAPABILITY_UNAVAILABLE", detail)


# ---- the (redacted) record ----------------------------------------------------------------


class Trust(Closed):
    class_: Literal["earned", "asserted", "signed"] = Field(alias="class")
    evidence_digest: Digest
    verifier_id: OpaqueRef
    verifier_version: OpaqueRef
    issued_at: Instant
    expires_at: Instant = None
    revocation_epoch: Cursor
    receipt_digest: Digest


class Record(Closed):
    """A MemoryRecordV2 after redaction by omission: only ``record_id`` is always present.

    Nested objects are whole: the project's redaction removes top-level fields only.
    """

    record_id: RecordId
    schema_version: Literal[2] = None
    scope_ref: OpaqueRef = None
    purpose_ref: OpaqueRef = None
    valid_time: ValidTime = None
    components: list[Component] = None
    primary_component_id: OpaqueRef = None
    primary_event: PrimaryEvent = None
    citations: list[Citation] = None
    retention: Retention = None
    reconciliation: Reconciliation = None
    payload_digest: Digest = None
    record_digest: Digest = None
    recorded_at: Instant = None
    recorded_cursor: Cursor = None
    authorization_receipt_digest: Digest = None
    trust: Trust = None


# ---- search -------------------------------------------------------------------------------


class ChannelReceipt(Closed):
    channel: Literal["lexical", "semantic"]
    contributed: bool
    engine: str
    engine_version: str
    index_kind: Literal["bm25", "exact", "hnsw", "none"]
    index_cursor: Cursor
    model_id: str = None
    model_digest: Digest = None


class FusionWeights(Closed):
    lexical: Score
    semantic: Score


class Fusion(Closed):
    method: Literal["rrf", "dbsf", "convex", "none"]
    k: Rank = None
    weights: FusionWeights = None


class ChannelRank(Closed):
    rank: Rank
    score: Score


class RankedEntry(Closed):
    record_id: RecordId
    rank: Rank
    score: Score
    lexical: ChannelRank = None
    semantic: ChannelRank = None


class RankReceipt(Closed):
    request_digest: Digest
    profile: Literal["lexical_v1", "hybrid_v1"]
    profile_version: str
    profile_config_digest: Digest
    valid_as_of: SafeInt  # epoch ms
    system_as_of: Cursor
    candidate_count: Count
    candidate_ids_digest: Digest
    ordered_ids_digest: Digest
    channels: list[ChannelReceipt]
    fusion: Fusion
    ranked: list[RankedEntry]
    issued_at: Instant
    receipt_digest: Digest


class RecordPacket(Closed):
    record: Record
    redacted_fields: list[str]
    redaction_receipt_digest: Digest
    score: Score
    rank: Rank


class SearchValue(Closed):
    records: list[RecordPacket]
    rank_receipt: RankReceipt
    next_page_cursor: PageCursor = None  # what search emits must be accepted back as page_cursor
    response_digest: Digest


# ---- get ----------------------------------------------------------------------------------


class ReadReceipt(Closed):
    record_id: RecordId
    record_digest: Digest
    valid_as_of: SafeInt
    system_as_of: Cursor
    validated_through_cursor: Cursor
    authorization_receipt_digest: Digest
    revalidation_receipt_digest: Digest
    checked_at: Instant
    receipt_digest: Digest


class GetValue(Closed):
    record: Record
    redacted_fields: list[str]
    redaction_receipt_digest: Digest
    read_receipt: ReadReceipt
    packet_digest: Digest


# ---- mutations ----------------------------------------------------------------------------


class CaptureValue(Closed):
    status: Literal["committed_pending", "duplicate_exact"]
    candidate_id: CandidateId
    record_digest: Digest = None
    cursor: Cursor
    transaction_receipt_digest: Digest


class AdmissionOutcome(Closed):
    status: Literal["accepted", "rejected", "pending_adjudication", "duplicate_exact"]
    candidate_id: CandidateId
    record_id: RecordId = None  # the engine always sets it on "accepted"; callers read status
    cursor: Cursor
    decision_receipt_digest: Digest
    transaction_receipt_digest: Digest


class RequestAdmissionValue(Closed):
    outcome: AdmissionOutcome
    replayed: bool


class _LifecycleReceipt(Closed):
    event_id: OpaqueRef
    cursor: Cursor
    event_digest: Digest
    authorization_receipt_digest: Digest
    transaction_receipt_digest: Digest


class WithdrawReceipt(_LifecycleReceipt):
    operation: Literal["withdraw"]
    from_state: Literal["pending"]
    to_state: Literal["withdrawn"]


class ForgetReceipt(_LifecycleReceipt):
    operation: Literal["tombstone"]
    from_state: Literal["accepted_current", "accepted_disputed", "historical", "expired", "trust_invalid"]
    to_state: Literal["tombstoned"]


class WithdrawValue(Closed):
    receipt: WithdrawReceipt
    replayed: bool
    key_destruction: Literal["pending", "complete"]


class ForgetValue(Closed):
    receipt: ForgetReceipt
    replayed: bool
    projection_invalidation: Literal["pending", "complete"]
    coverage_receipt_digest: Digest = None


OUTPUT_MODELS: dict[str, type[Closed]] = {
    "search": SearchValue,
    "get": GetValue,
    "capture": CaptureValue,
    "request_admission": RequestAdmissionValue,
    "withdraw": WithdrawValue,
    "forget": ForgetValue,
}


# ---- envelope -----------------------------------------------------------------------------

V = TypeVar("V", bound=Closed)
ErrorCode = Literal[tuple(CATALOG)]  # type: ignore[valid-type]  # the catalog is the single list


class Output(Closed, Generic[V]):
    schema_version: const(1)
    value: V


class SuccessEnvelope(Closed, Generic[V]):
    ok: const(True)
    output: Output[V]
    auditId: str
    redactionClass: Literal["high"]


class ErrorBody(Closed):
    code: ErrorCode
    message: str
    retriable: bool


class FailureEnvelope(Closed):
    ok: const(False)
    auditId: str
    redactionClass: Literal["high"]
    error: ErrorBody


def success_envelope_model(tool: str) -> type[SuccessEnvelope[Any]]:
    return SuccessEnvelope[OUTPUT_MODELS[tool]]  # type: ignore[index]


def validate_output(tool: str, value: dict[str, Any]) -> None:
    """Raise ``OutputContractError`` unless ``value`` is exactly the tool's published success value."""
    try:
        OUTPUT_MODELS[tool].model_validate(value)
    except ValidationError as exc:
        raise OutputContractError(validation_detail(exc)) from None


def validate_envelope(tool: str, envelope: dict[str, Any]) -> None:
    """Same guard for a whole envelope (success of this tool, or any catalog failure)."""
    model: type[BaseModel] = success_envelope_model(tool) if envelope.get("ok") is True else FailureEnvelope
    try:
        model.model_validate(envelope)
    except ValidationError as exc:
        raise OutputContractError(validation_detail(exc)) from None
