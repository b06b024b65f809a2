"""Closed models of each tool's success ``value`` and of the envelope that carries it.

They are the source of the published ``outputSchema`` and a guard on what the engine
emits: ``validate_output`` refuses anything off-contract before it reaches a caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Literal, TypeAlias, TypeVar, cast

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from engram_memory.models.errors import CATALOG, EngramError
from engram_memory.models.fields import (
    ABSENT,
    CandidateId,
    ConstFalse,
    ConstOne,
    ConstTrue,
    Count,
    Cursor,
    Digest,
    Instant,
    OpaqueRef,
    PageCursor,
    Rank,
    RecordId,
    SafeInt,
    Score,
)
from engram_memory.models.states import NO_FUSION, FusionMethod, Operation, legal_from, next_state
from engram_memory.models.tools import (
    Citation,
    Closed,
    Component,
    PrimaryEvent,
    Reconciliation,
    Retention,
    ValidTime,
    validation_detail,
)


# Literals derived from the enums and the transition table (the values, so the published schema
# stays a plain string enum). Type checkers see ``str``: a computed Literal is opaque to them.
def _values_literal(values: Any) -> Any:
    return Literal[tuple(str(getattr(v, "value", v)) for v in values)]


if TYPE_CHECKING:
    FusionMethodName: TypeAlias = str
    WithdrawFrom: TypeAlias = str
    WithdrawTo: TypeAlias = str
    ForgetFrom: TypeAlias = str
    ForgetTo: TypeAlias = str
else:
    FusionMethodName = _values_literal((*FusionMethod, NO_FUSION))
    WithdrawFrom = _values_literal(legal_from(Operation.WITHDRAW))
    WithdrawTo = _values_literal([next_state(Operation.WITHDRAW, s) for s in legal_from(Operation.WITHDRAW)])
    ForgetFrom = _values_literal(legal_from(Operation.TOMBSTONE))
    ForgetTo = _values_literal({next_state(Operation.TOMBSTONE, s) for s in legal_from(Operation.TOMBSTONE)})


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
    expires_at: Instant = ABSENT
    revocation_epoch: Cursor
    receipt_digest: Digest


class Record(Closed):
    """A MemoryRecordV2 after redaction by omission: only ``record_id`` is always present.

    Nested objects are whole: the project's redaction removes top-level fields only.
    """

    record_id: RecordId
    schema_version: Literal[2] = ABSENT
    scope_ref: OpaqueRef = ABSENT
    purpose_ref: OpaqueRef = ABSENT
    valid_time: ValidTime = ABSENT
    components: list[Component] = ABSENT
    primary_component_id: OpaqueRef = ABSENT
    primary_event: PrimaryEvent = ABSENT
    citations: list[Citation] = ABSENT
    retention: Retention = ABSENT
    reconciliation: Reconciliation = ABSENT
    payload_digest: Digest = ABSENT
    record_digest: Digest = ABSENT
    recorded_at: Instant = ABSENT
    recorded_cursor: Cursor = ABSENT
    authorization_receipt_digest: Digest = ABSENT
    trust: Trust = ABSENT

    @model_serializer(mode="wrap")
    def _stored_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A record is served as it is stored: in canonical (RFC 8785) key order at every level.
        return _sorted_keys(handler(self))


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


# ---- search -------------------------------------------------------------------------------


class ChannelReceipt(Closed):
    channel: Literal["lexical", "semantic"]
    contributed: bool
    engine: str
    engine_version: str
    index_kind: Literal["bm25", "exact", "hnsw", "none"]
    index_cursor: Cursor
    analyzer: str = ABSENT  # the lexical channel's analyzer (its name changes with its tokens)
    model_id: str = ABSENT
    model_digest: Digest = ABSENT
    model_runtime: str = ABSENT  # e.g. onnxruntime-1.32.0/fp32: what computed the query vector


class FusionWeights(Closed):
    lexical: Score
    semantic: Score


class RerankWeights(Closed):
    neighbour: Score
    speaker: Score


class Rerank(Closed):
    """Search's second stage (retrieval/rerank.py): how many ranked hits it reorders, how, and
    which primary_event.type_ref values make a record a conversation turn (the only records it moves)."""

    head: Rank
    weights: RerankWeights
    turn_types: list[OpaqueRef]


class Fusion(Closed):
    method: FusionMethodName
    k: Rank = ABSENT
    weights: FusionWeights = ABSENT
    semantic_floor: Score = ABSENT
    lexical_coverage: Score = ABSENT  # when it scaled the lexical weight down (retrieval/ranking.py)
    # the query's language, when the embedding model was not trained for it and its weight was scaled down
    semantic_language: str = ABSENT
    rerank: Rerank = ABSENT


class ChannelRank(Closed):
    rank: Rank
    score: Score
    analyzer: str = ABSENT  # a lexical hit: the analyzer of its language (retrieval/languages.py)


class RankedEntry(Closed):
    record_id: RecordId
    rank: Rank
    score: Score
    lexical: ChannelRank = ABSENT
    semantic: ChannelRank = ABSENT


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
    next_page_cursor: PageCursor = ABSENT  # what search emits must be accepted back as page_cursor
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
    record_digest: Digest = ABSENT
    cursor: Cursor
    transaction_receipt_digest: Digest


class AdmissionOutcome(Closed):
    status: Literal["accepted", "rejected", "pending_adjudication", "duplicate_exact"]
    candidate_id: CandidateId
    record_id: RecordId = ABSENT  # the engine always sets it on "accepted"; callers read status
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
    from_state: WithdrawFrom
    to_state: WithdrawTo


class ForgetReceipt(_LifecycleReceipt):
    operation: Literal["tombstone"]
    from_state: ForgetFrom
    to_state: ForgetTo


class WithdrawValue(Closed):
    receipt: WithdrawReceipt
    replayed: bool
    key_destruction: Literal["pending", "complete"]


class ForgetValue(Closed):
    receipt: ForgetReceipt
    replayed: bool
    projection_invalidation: Literal["pending", "complete"]
    coverage_receipt_digest: Digest = ABSENT


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
if TYPE_CHECKING:
    ErrorCode: TypeAlias = str
else:  # the catalog is the single list; a Literal keeps the published schema a plain string enum
    ErrorCode = _values_literal(CATALOG)


class Output(Closed, Generic[V]):
    schema_version: ConstOne
    value: V


class SuccessEnvelope(Closed, Generic[V]):
    ok: ConstTrue
    output: Output[V]
    auditId: str
    redactionClass: Literal["high"]


class ErrorBody(Closed):
    code: ErrorCode
    message: str
    retriable: bool


class FailureEnvelope(Closed):
    ok: ConstFalse
    auditId: str
    redactionClass: Literal["high"]
    error: ErrorBody


def success_envelope_model(tool: str) -> type[SuccessEnvelope[Any]]:
    # A runtime parametrisation: the value model is chosen by tool name.
    return cast(type[SuccessEnvelope[Any]], SuccessEnvelope[OUTPUT_MODELS[tool]])  # type: ignore[valid-type]


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
