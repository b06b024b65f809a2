"""The error catalog: every code of the contract, its ``retriable`` flag and one constant message.

This is the only place a code's message or retry class is written. Messages never
interpolate input, ids or internal state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class ErrorSpec:
    retriable: bool
    message: str


class ErrorCode(StrEnum):
    """Every error code of the contract; the catalog below is keyed by it."""

    INVALID_SCHEMA = "INVALID_SCHEMA"
    INVALID_DIGEST = "INVALID_DIGEST"
    DIGEST_CONFLICT = "DIGEST_CONFLICT"
    UNAUTHORIZED = "UNAUTHORIZED"
    AUTHORIZATION_EXPIRED = "AUTHORIZATION_EXPIRED"
    AUTHORIZATION_REVOKED = "AUTHORIZATION_REVOKED"
    POLICY_UNAVAILABLE = "POLICY_UNAVAILABLE"
    POLICY_STALE = "POLICY_STALE"
    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_TERMINAL = "ALREADY_TERMINAL"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    CAPABILITY_UNAVAILABLE = "CAPABILITY_UNAVAILABLE"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    FENCE_LOST = "FENCE_LOST"
    CURSOR_GAP = "CURSOR_GAP"
    JOURNAL_CORRUPT = "JOURNAL_CORRUPT"
    BLOB_MISSING = "BLOB_MISSING"
    PROJECTION_STALE = "PROJECTION_STALE"
    PROJECTION_OVERSIZED = "PROJECTION_OVERSIZED"
    RANKING_UNAVAILABLE = "RANKING_UNAVAILABLE"
    STALE_PAGE = "STALE_PAGE"
    REGISTRY_VERSION_UNAVAILABLE = "REGISTRY_VERSION_UNAVAILABLE"
    BACKUP_INVALID = "BACKUP_INVALID"
    RESTORE_REFUSED = "RESTORE_REFUSED"
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    MUTATION_OUTCOME_UNKNOWN = "MUTATION_OUTCOME_UNKNOWN"
    GATE_FAILED = "gate_failed"  # the contract spells this one in lower case
    RATE_LIMITED = "RATE_LIMITED"
    MIGRATION_LEDGER_INVALID = "MIGRATION_LEDGER_INVALID"


_E = ErrorCode
CATALOG: dict[ErrorCode, ErrorSpec] = {
    _E.INVALID_SCHEMA: ErrorSpec(False, "The arguments do not match the tool schema."),
    _E.INVALID_DIGEST: ErrorSpec(False, "A digest in the arguments is malformed or does not match."),
    _E.DIGEST_CONFLICT: ErrorSpec(False, "The idempotency key is already bound to a different operation."),
    _E.UNAUTHORIZED: ErrorSpec(False, "The operation is not authorized for this caller."),
    _E.AUTHORIZATION_EXPIRED: ErrorSpec(False, "The authorization for this call has expired."),
    _E.AUTHORIZATION_REVOKED: ErrorSpec(False, "The authorization for this call has been revoked."),
    _E.POLICY_UNAVAILABLE: ErrorSpec(True, "The admission policy is unavailable; retry later."),
    _E.POLICY_STALE: ErrorSpec(True, "The admission policy changed; retry later."),
    _E.ILLEGAL_TRANSITION: ErrorSpec(False, "The lifecycle does not allow this transition."),
    _E.NOT_FOUND: ErrorSpec(False, "The target is not available."),
    _E.ALREADY_TERMINAL: ErrorSpec(False, "The target is already in a terminal state."),
    _E.DEADLINE_EXCEEDED: ErrorSpec(True, "The deadline passed before the operation completed."),
    _E.CANCELLED: ErrorSpec(True, "The operation was cancelled."),
    _E.CAPABILITY_UNAVAILABLE: ErrorSpec(False, "A required capability is unavailable."),
    _E.STORE_UNAVAILABLE: ErrorSpec(True, "The memory store is unavailable; retry later."),
    _E.FENCE_LOST: ErrorSpec(True, "The store lost its single-writer fence; retry later."),
    _E.CURSOR_GAP: ErrorSpec(True, "The journal cursor is not dense; retry later."),
    _E.JOURNAL_CORRUPT: ErrorSpec(False, "The memory journal failed an integrity check."),
    _E.BLOB_MISSING: ErrorSpec(False, "A record body referenced by the journal is missing."),
    _E.PROJECTION_STALE: ErrorSpec(True, "A search projection is stale; retry later."),
    _E.PROJECTION_OVERSIZED: ErrorSpec(False, "A record packet exceeds max_packet_bytes."),
    _E.RANKING_UNAVAILABLE: ErrorSpec(True, "A required ranking channel is unavailable; retry later."),
    _E.STALE_PAGE: ErrorSpec(False, "The page cursor is no longer valid; start a new search."),
    _E.REGISTRY_VERSION_UNAVAILABLE: ErrorSpec(False, "A required registry version is not installed."),
    _E.BACKUP_INVALID: ErrorSpec(False, "The backup failed verification."),
    _E.RESTORE_REFUSED: ErrorSpec(False, "The restore was refused."),
    _E.RESULT_TOO_LARGE: ErrorSpec(False, "The result exceeds the transport bound; lower the limit."),
    _E.MUTATION_OUTCOME_UNKNOWN: ErrorSpec(
        True, "The operation may have been applied; retry with the same key and arguments."
    ),
    _E.GATE_FAILED: ErrorSpec(False, "The confirmation gate was not satisfied."),
    _E.RATE_LIMITED: ErrorSpec(True, "Too many requests; retry later."),
    _E.MIGRATION_LEDGER_INVALID: ErrorSpec(False, "The migration ledger failed verification."),
}


class EngramError(Exception):
    """A domain refusal carrying one catalog code. Its text is never shown to callers."""

    def __init__(self, code: ErrorCode | str, detail: str = "") -> None:
        if code not in CATALOG:
            raise KeyError(code)
        # Kept as the plain string value: it is written verbatim into envelopes and the audit.
        self.code: str = ErrorCode(code).value
        super().__init__(f"{self.code}: {detail}" if detail else self.code)
        self.detail = detail  # for the audit trail only

    @property
    def retriable(self) -> bool:
        return CATALOG[ErrorCode(self.code)].retriable

    @property
    def message(self) -> str:
        return CATALOG[ErrorCode(self.code)].message


# JSON-RPC protocol errors (not envelopes).
PROTOCOL_CONTEXT_CODE = -32603
PROTOCOL_CONTEXT_MESSAGE = "Trusted invocation context unavailable"
PROTOCOL_UNKNOWN_TOOL_CODE = -32602
PROTOCOL_UNKNOWN_TOOL_MESSAGE = "Unknown tool"


class ProtocolError(Exception):
    """A JSON-RPC level rejection (context mismatch, unknown tool)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def context_unavailable() -> ProtocolError:
    return ProtocolError(PROTOCOL_CONTEXT_CODE, PROTOCOL_CONTEXT_MESSAGE)


def unknown_tool() -> ProtocolError:
    return ProtocolError(PROTOCOL_UNKNOWN_TOOL_CODE, PROTOCOL_UNKNOWN_TOOL_MESSAGE)
