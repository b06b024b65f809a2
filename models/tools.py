"""Tool input models (REFERENCE_CONTRACT §3.2-§3.8) and the single argument parser.

Every object is closed and strict: unknown keys, ``null``, ``"5"`` for 5 and ``true`` for 1 are
refused. Optional fields default to ``None`` *without* admitting ``None`` as a value, so an
explicit ``null`` fails while an omitted field stays absent; ``to_plain`` therefore omits
exactly the fields that were not sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from annotated_types import Ge, Le, Len
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator

from engram_memory.models.canonical import canonical_bytes, integral_floats_to_int
from engram_memory.models.errors import EngramError, unknown_tool
from engram_memory.models.fields import (
    ABSENT,
    UNIQUE_ITEMS,
    Attestation,
    CandidateId,
    Digest,
    Distinct,
    IdempotencyKey,
    Instant,
    OpaqueRef,
    PageCursor,
    Query,
    RecordId,
    SafeInt,
    Text,
)
from engram_memory.models.limits import (
    LIMIT_DEFAULT,
    LIMIT_MAX,
    LIMIT_MIN,
    MAX_ARGUMENT_BYTES,
    MAX_CITATIONS,
    MAX_COMPONENTS,
    MAX_FAMILY_REFS,
    PACKET_BYTES_DEFAULT,
    PACKET_BYTES_MAX,
    PACKET_BYTES_MIN,
)

PacketBytes: TypeAlias = Annotated[int, Strict(), Ge(PACKET_BYTES_MIN), Le(PACKET_BYTES_MAX)]
Limit: TypeAlias = Annotated[int, Strict(), Ge(LIMIT_MIN), Le(LIMIT_MAX)]
CitationIds: TypeAlias = Annotated[list[OpaqueRef], Len(1, MAX_CITATIONS), Distinct, UNIQUE_ITEMS]


class Closed(BaseModel):
    """Base of every contract object: closed, strict, immutable, input never echoed in errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, hide_input_in_errors=True)


# ---- search / get -------------------------------------------------------------------------


class CapabilityPolicy(Closed):
    minimum_channels: Literal["lexical", "lexical_and_semantic"]
    network: Literal["forbid", "allow"]  # "allow" grants nothing; it is only bound into request_digest


class SearchInput(Closed):
    query: Query
    purpose_ref: OpaqueRef
    limit: Limit = LIMIT_DEFAULT
    max_packet_bytes: PacketBytes = PACKET_BYTES_DEFAULT
    capability_policy: CapabilityPolicy = CapabilityPolicy(minimum_channels="lexical", network="forbid")
    page_cursor: PageCursor = ABSENT


class GetInput(Closed):
    record_id: RecordId
    purpose_ref: OpaqueRef
    max_packet_bytes: PacketBytes = PACKET_BYTES_DEFAULT


# ---- capture ------------------------------------------------------------------------------


class ValidTime(Closed):
    t: SafeInt  # epoch milliseconds
    t_end: SafeInt = ABSENT  # absent: open-ended

    @model_validator(mode="after")
    def _ordered(self) -> ValidTime:
        if self.t_end is not None and self.t_end < self.t:
            raise ValueError("t_end precedes t")
        return self


class Component(Closed):
    component_id: OpaqueRef
    kind: Literal["context", "decision", "evidence"]
    text: Text
    citation_ids: CitationIds


class PrimaryEvent(Closed):
    at: SafeInt
    type_ref: OpaqueRef
    citation_id: OpaqueRef


class Locator(Closed):
    scheme: OpaqueRef  # same 1..512-byte NFC rule as an opaque reference
    value: OpaqueRef


class Citation(Closed):
    citation_id: OpaqueRef
    source_ref: OpaqueRef
    locator: Locator
    content_digest: Digest
    observed_at: Instant = ABSENT


class Retention(Closed):
    derivative_rule: Literal["retain", "make-ineligible"]
    expires_at: Instant = ABSENT  # "after capture time" and the host ceiling are checked by the store


def _utf16_key(text: str) -> bytes:
    return text.encode("utf-16-be")


class Reconciliation(Closed):
    family_refs: list[OpaqueRef] = Field(max_length=MAX_FAMILY_REFS, json_schema_extra={"uniqueItems": True})

    @model_validator(mode="after")
    def _strictly_increasing(self) -> Reconciliation:
        # The reference compares with JS `<`, i.e. UTF-16 code units, which differs from
        # code-point order for characters beyond the BMP.
        keys = [_utf16_key(ref) for ref in self.family_refs]
        if any(a >= b for a, b in zip(keys, keys[1:], strict=False)):
            raise ValueError("family_refs not strictly increasing")
        return self


class Payload(Closed):
    schema_version: Literal[2]
    purpose_ref: OpaqueRef
    valid_time: ValidTime
    components: list[Component] = Field(min_length=1, max_length=MAX_COMPONENTS)
    primary_component_id: OpaqueRef
    primary_event: PrimaryEvent
    citations: list[Citation] = Field(min_length=1, max_length=MAX_CITATIONS)
    retention: Retention = ABSENT
    reconciliation: Reconciliation = ABSENT

    @model_validator(mode="after")
    def _cross_references(self) -> Payload:
        citation_ids = [c.citation_id for c in self.citations]
        if len(set(citation_ids)) != len(citation_ids):
            raise ValueError("citation_id repeated")
        components = {c.component_id: c for c in self.components}
        if len(components) != len(self.components):
            raise ValueError("component_id repeated")
        known = set(citation_ids)
        if any(cid not in known for c in self.components for cid in c.citation_ids):
            raise ValueError("component citation does not resolve")
        primary = components.get(self.primary_component_id)
        if primary is None:
            raise ValueError("primary_component_id does not resolve")
        if self.primary_event.citation_id not in known or self.primary_event.citation_id not in primary.citation_ids:
            raise ValueError("primary_event.citation_id not cited by the primary component")
        return self


class Evidence(Closed):
    evidence_ref: OpaqueRef
    evidence_digest: Digest
    citation_ids: CitationIds
    attestation: Attestation = ABSENT


class CaptureInput(Closed):
    idempotency_key: IdempotencyKey
    payload: Payload
    evidence: Evidence

    @model_validator(mode="after")
    def _evidence_resolves(self) -> CaptureInput:
        known = {c.citation_id for c in self.payload.citations}
        if any(cid not in known for cid in self.evidence.citation_ids):
            raise ValueError("evidence citation does not resolve")
        return self


# ---- lifecycle ----------------------------------------------------------------------------


class RequestAdmissionInput(Closed):
    candidate_id: CandidateId
    idempotency_key: IdempotencyKey


class WithdrawInput(Closed):
    candidate_id: CandidateId
    idempotency_key: IdempotencyKey
    reason_ref: OpaqueRef


class ForgetInput(Closed):
    record_id: RecordId
    idempotency_key: IdempotencyKey
    reason_ref: OpaqueRef


INPUT_MODELS: dict[str, type[Closed]] = {
    "search": SearchInput,
    "get": GetInput,
    "capture": CaptureInput,
    "request_admission": RequestAdmissionInput,
    "withdraw": WithdrawInput,
    "forget": ForgetInput,
}


def validation_detail(exc: ValidationError) -> str:
    """Audit-only detail: paths and error kinds, never the offending values."""
    parts = [
        f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]
    return "; ".join(parts)[:2000]


def parse_input(tool: str, arguments: object) -> Closed:
    """Validate one tool's arguments; every refusal is ``EngramError("INVALID_SCHEMA")``.

    An unknown tool name is a protocol error (-32602), not a schema error.
    """
    model = INPUT_MODELS.get(tool)
    if model is None:
        raise unknown_tool()
    if not isinstance(arguments, dict):
        raise EngramError("INVALID_SCHEMA", "arguments are not an object")
    try:
        # JSON cannot tell 2 from 2.0 (JS semantics); convert before strict validation.
        arguments = integral_floats_to_int(arguments)
        # The bound is measured on the canonical (JCS, NFC) serialisation: wire whitespace does not count.
        if len(canonical_bytes(arguments)) > MAX_ARGUMENT_BYTES:
            raise EngramError("INVALID_SCHEMA", "arguments exceed 1 MiB")
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise EngramError("INVALID_SCHEMA", validation_detail(exc)) from None
    except (ValueError, TypeError, RecursionError) as exc:  # canonicalisation: NaN, NFC key collision, depth
        raise EngramError("INVALID_SCHEMA", type(exc).__name__) from None


def to_plain(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict: NFC strings, defaults materialised, absent optional fields omitted (never null)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
