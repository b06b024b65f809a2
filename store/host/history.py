"""What an operator may read of a scope without decrypting anything: its journal and the
metadata of its pending candidates (ids, states, cursors, times, digests). Read-only, through
the store's ``Inspector`` (store/backend.py; either backend): no data key is ever loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engram_memory.store.backend import Inspector
from engram_memory.store.opening import embedded

# The journal fields shown (never a whole event body: it is already content-free, but the
# listing stays an explicit allow-list so a future field cannot leak through it).
JOURNAL_FIELDS = ("cursor", "operation", "event_id", "recorded_at", "candidate_id", "record_id",
                  "from_state", "to_state", "previous_event_hash", "event_hash")


def event_instant(event: dict[str, Any]) -> str:
    """When the event itself happened. An admission (accept/reject) event keeps its capture's
    ``recorded_at`` in the hashed body, as the reference engine does (REFERENCE_CONTRACT Q6:
    digest parity), so its own instant is the decision's ``issued_at`` (an operator's: ``decided_at``)."""
    decision = event.get("admission_decision") or {}
    verdict = event.get("adjudication") or event.get("host_operation") or {}
    return str(decision.get("issued_at") or verdict.get("decided_at") or event.get("recorded_at"))


def journal(data_dir: Path, scope_ref: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The journal of a scope of the stopped store in ``data_dir`` (``journal_of``)."""
    inspector = embedded().inspector(data_dir)
    try:
        return journal_of(inspector, scope_ref, limit)
    finally:
        inspector.close()


def journal_of(inspector: Inspector, scope_ref: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The scope's journal, oldest first (the last ``limit`` events when given)."""
    return journal_listing(inspector.journal_tail(scope_ref, limit))


def journal_listing(rows: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
    """(cursor, body, event_hash) rows, newest first, as listed: oldest first, allowed fields only
    (``Inspector.journal_tail``'s, of either backend)."""
    out = []
    for cursor, body, event_hash in reversed(rows):
        event = json.loads(body)
        entry = {name: event.get(name) for name in JOURNAL_FIELDS}
        entry["cursor"], entry["event_hash"] = int(cursor), event_hash
        entry["at"] = event_instant(event)
        operator = event.get("adjudication") or event.get("host_operation")
        # The operator's own words (an adjudication, a host operation) or the caller's reason reference.
        entry["reason"] = operator["reason"] if operator else event.get("reason_ref")
        out.append(entry)
    return out


def pending_candidates(data_dir: Path, scope_ref: str) -> list[dict[str, Any]]:
    """The pending candidates of a scope of the stopped store in ``data_dir`` (``pending_of``)."""
    inspector = embedded().inspector(data_dir)
    try:
        return pending_of(inspector, scope_ref)
    finally:
        inspector.close()


def pending_of(inspector: Inspector, scope_ref: str) -> list[dict[str, Any]]:
    """The scope's pending candidates: metadata only (their sealed envelopes are never opened).

    ``held`` says the candidate's content was forgotten in this scope before, so its admission
    waits for an operator (``admin adjudicate``); that is read from digests, not content."""
    return candidate_listing(inspector.pending_candidates(scope_ref))


def candidate_listing(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [{"candidate_id": cid, "principal": principal, "state": state, "created_cursor": int(cursor),
             "recorded_at": at, "payload_digest": pd, "record_digest": rd, "held_for_adjudication": bool(held)}
            for cid, principal, state, cursor, at, pd, rd, held in rows]
