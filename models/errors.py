"""The error catalog: every code of the contract, its ``retriable`` flag and one constant message.

This is the only place a code's message or retry class is written. Messages never
interpolate input, ids or internal state.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorSpec:
    retriable: bool
    message: str


CATALOG: dict[str, ErrorSpec] = {
    "INVALID_SCHEMA": ErrorSpec(False, "The arguments do not match the tool schema."),
    "INVALID_DIGEST": ErrorSpec(False, "A digest in the arguments is malformed or does not match."),
    "DIGEST_CONFLICT": ErrorSpec(False, "The idempotency key is already bound to a different operation."),
    "UNAUTHORIZED": ErrorSpec(False, "The operation is not authorized for this caller."),
    "AUTHORIZATION_EXPIRED": ErrorSpec(False, "The authorization for this call has expired."),
    "AUTHORIZATION_REVOKED": ErrorSpec(False, "The authorization for this call has been revoked."),
    "POLICY_UNAVAILABLE": ErrorSpec(True, "The admission policy is unavailable; retry later."),
    "POLICY_STALE": ErrorSpec(True, "The admission policy changed; retry later."),
    "ILLEGAL_TRANSITION": ErrorSpec(False, "The lifecycle does not allow this transition."),
    "NOT_FOUND": ErrorSpec(False, "The target is not available."),
    "ALREADY_TERMINAL": ErrorSpec(False, "The target is already in a terminal state."),
    "DEADLINE_EXCEEDED": ErrorSpec(True, "The deadline passed before the operation completed."),
    "CANCELLED": ErrorSpec(True, "The operation was cancelled."),
    "CAPABILITY_UNAVAILABLE": ErrorSpec(False, "A required capability is unavailable."),
    "STORE_UNAVAILABLE": ErrorSpec(True, "The memory store is unavailable; retry later."),
    "FENCE_LOST": ErrorSpec(True, "The store lost its single-writer fence; retry later."),
    "CURSOR_GAP": ErrorSpec(True, "The journal cursor is not dense; retry later."),
    "JOURNAL_CORRUPT": ErrorSpec(False, "The memory journal failed an integrity check."),
    "BLOB_MISSING": ErrorSpec(False, "A record body referenced by the journal is missing."),
    "PROJECTION_STALE": ErrorSpec(True, "A search projection is stale; retry later."),
    "PROJECTION_OVERSIZED": ErrorSpec(False, "A record packet exceeds max_packet_bytes."),
    "RANKING_UNAVAILABLE": ErrorSpec(True, "A required ranking channel is unavailable; retry later."),
    "STALE_PAGE": ErrorSpec(False, "The page cursor is no longer valid; start a new search."),
    "REGISTRY_VERSION_UNAVAILABLE": ErrorSpec(False, "A required registry version is not installed."),
    "BACKUP_INVALID": ErrorSpec(False, "The backup failed verification."),
    "RESTORE_REFUSED": ErrorSpec(False, "The restore was refused."),
    "RESULT_TOO_LARGE": ErrorSpec(False, "The result exceeds the transport bound; lower the limit."),
    "MUTATION_OUTCOME_UNKNOWN": ErrorSpec(
        True, "The operation may have been applied; retry with the same key and arguments."
    ),
    "gate_failed": ErrorSpec(False, "The confirmation gate was not satisfied."),
    "RATE_LIMITED": ErrorSpec(True, "Too many requests; retry later."),
    "MIGRATION_LEDGER_INVALID": ErrorSpec(False, "The migration ledger failed verification."),
}


class EngramError(Exception):
    """A domain refusal carrying one catalog code. Its text is never shown to callers."""

    def __init__(self, code: str, detail: str = "") -> None:
        if code not in CATALOG:
            raise KeyError(code)
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail  # for the audit trail only

    @property
    def retriable(self) -> bool:
        return CATALOG[self.code].retriable

    @property
    def message(self) -> str:
        return CATALOG[self.code].message


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
