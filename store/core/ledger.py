"""The idempotency ledger: one answer per (scope, principal, key), replayed byte for byte."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from engram_memory.models.canonical import canonical_text, nfc
from engram_memory.models.context import HostContext
from engram_memory.models.digests import receipt_digest
from engram_memory.models.errors import EngramError
from engram_memory.store.backend import LedgerEntry, Store, UnitOfWork


def key_digest(idempotency_key: str) -> str:
    return hashlib.sha256(nfc(idempotency_key).encode("utf-8")).hexdigest()


def intent_hash(tool: str, arguments: dict[str, Any]) -> str:
    """Binds tool, canonical arguments (after NFC and defaults) and target into one digest."""
    return receipt_digest("connector-intent", {"tool": tool, "arguments": arguments})


def lookup(db: Store | UnitOfWork, ctx: HostContext, idempotency_key: str, intent: str) -> dict[str, Any] | None:
    """The stored first answer for a replay; DIGEST_CONFLICT when the key means something else.

    Given a unit of work, the answer is read inside that transaction."""
    entry: LedgerEntry | None = db.ledger_lookup(ctx.scope_ref, ctx.principal, key_digest(idempotency_key))
    if entry is None:
        return None
    if entry.intent_hash != intent:
        raise EngramError("DIGEST_CONFLICT", "idempotency key bound to another intent")
    return json.loads(entry.value)


def store(
    uow: UnitOfWork,
    ctx: HostContext,
    idempotency_key: str,
    tool: str,
    intent: str,
    value: dict[str, Any],
    created_at: str,
    key_ref: str | None = None,
) -> None:
    """``key_ref``: the data key a "pending" withdraw/forget answer still owes (completed only once it is gone)."""
    uow.ledger_store(ctx.scope_ref, ctx.principal, key_digest(idempotency_key), tool, intent,
                     canonical_text(value), created_at, key_ref)


def update(db: Store | UnitOfWork, ctx: HostContext, idempotency_key: str, value: dict[str, Any]) -> None:
    """Record the final answer once a post-commit step (key destruction, purge) completed."""
    db.ledger_update(ctx.scope_ref, ctx.principal, key_digest(idempotency_key), canonical_text(value))
