"""The store boundary: what the engine asks of its store, backend-neutral.

Everything the engine, lifecycle rules, expiry, adjudication and the read path need from the
store is a method here, over domain values (no SQL, no driver types). ``store/duckdb/`` (embedded,
the default) and ``store/postgres/`` (shared by several nodes) implement the two protocols.

Contracts a backend must keep (the single-writer assumptions made explicit):

* ``UnitOfWork.append_event`` reads the scope's head (cursor and last event hash) *inside* the
  transaction, so two writers can never fork a scope's hash chain; a backend may cache the head
  only while it is the one writer (DuckDB: the data directory's flock).
* ``UnitOfWork.ledger_lookup`` answers from inside the mutation's transaction.
* Every failure of the store itself (not of the request) is a ``StoreError``, or one of the
  native error types a backend registers with ``register_store_errors``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# The approvals table's columns, in the order every backend reads and writes them.
APPROVAL_COLUMNS = ("request_id", "scope_ref", "principal", "agent_id", "tool", "target", "key_digest",
                    "intent_hash", "context", "key_ref", "arguments", "status", "created_at_ms",
                    "expires_at_ms", "decided_at_ms", "reason", "outcome")


class StoreError(RuntimeError):
    """The store failed (I/O, constraint, lost connection): STORE_UNAVAILABLE to a caller."""


class StoreRefused(StoreError):
    """The store cannot be served as launched (not initialised, another master key, unreachable):
    one line for the operator, who must fix the launch (exit 2)."""


# The ``meta`` key that names the embedding model a store was created with (store/models.py).
EMBEDDING_MODEL_KEY = "embedding_model"


class StoreBusyError(RuntimeError):
    """Another process owns the data directory (DuckDB allows one writer)."""


_NATIVE_ERRORS: list[type[BaseException]] = []


def register_store_errors(*types: type[BaseException]) -> None:
    """A backend names its driver's own error types once, so callers need not import the driver."""
    _NATIVE_ERRORS.extend(t for t in types if t not in _NATIVE_ERRORS)


def is_store_error(exc: BaseException) -> bool:
    return isinstance(exc, (StoreError, *_NATIVE_ERRORS))


# -- domain rows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    """One idempotency-ledger answer: the intent it is bound to and the JCS text of the value."""

    intent_hash: str
    value: str


@dataclass(frozen=True)
class PendingAnswer:
    """A withdraw or forget answer still saying "pending" (value parsed)."""

    scope_ref: str
    tool: str
    principal: str
    key_digest: str
    value: dict[str, Any]


@dataclass(frozen=True)
class Candidate:
    scope_ref: str
    state: str
    created_cursor: int
    recorded_at: str
    key_ref: str | None
    envelope: bytes | None
    outcome: str | None
    payload_digest: str


@dataclass(frozen=True)
class NewCandidate:
    candidate_id: str
    scope_ref: str
    principal: str
    state: str
    created_cursor: int
    recorded_at: str
    payload_digest: str
    record_digest: str
    key_ref: str | None  # None (with the envelope) for a candidate inserted closed: insert_candidates
    envelope: bytes | None


# The records columns a new record fills, in NewRecord's order, on both backends (the DuckDB table
# also keeps the always-NULL event_type: store/duckdb/schema.py migration 6).
RECORD_COLUMNS: tuple[str, ...] = (
    "record_id", "scope_ref", "candidate_id", "state", "record_digest", "payload_digest", "recorded_cursor",
    "valid_t", "valid_t_end", "expires_at_ms", "key_ref", "body", "event_at", "event_kind",
)


@dataclass(frozen=True)
class NewRecord:
    record_id: str
    scope_ref: str
    candidate_id: str
    state: str
    record_digest: str
    payload_digest: str
    recorded_cursor: int
    valid_t: str
    valid_t_end: str | None
    expires_at_ms: int | None
    key_ref: str
    body: bytes
    event_at: int | None
    event_kind: str | None  # the keyed digest of primary_event.type_ref (store/core/lifecycle.py event_kind)


@dataclass(frozen=True)
class RecordStatus:
    state: str
    key_ref: str | None
    payload_digest: str


@dataclass(frozen=True)
class DueExpiry:
    record_id: str
    state: str
    record_digest: str
    expires_at_ms: int


@dataclass(frozen=True)
class SealedRecord:
    """A record's sealed body as stored (decrypted by the caller, who holds the keys)."""

    record_id: str
    scope_ref: str
    key_ref: str
    body: bytes


@dataclass(frozen=True)
class JournalChange:
    """What one journal event did to one record the projections may hold (another node's, on a
    shared store): ``current`` says whether the record is current (searchable) after it."""

    cursor: int
    operation: str  # accept, tombstone, expire, or a host operation (store/host/hostops.py)
    record_id: str
    current: bool


# The journal operations that change which records are current: the projections follow them.
PROJECTED_OPERATIONS = ("accept", "tombstone", "expire", "dispute", "resolve_dispute", "supersede",
                        "mark_non_current", "rewind", "trust_invalidate")


def journal_changes_of(rows: Sequence[tuple[Any, str, str]]) -> list[JournalChange]:
    """(cursor, operation, body) rows of PROJECTED_OPERATIONS, in cursor order, as changes: the
    event's record(s) (``record_id``, or a revoke-trust's ``record_ids``) enter its ``to_state``;
    a rewind's ``related_record_id`` its ``related_to_state``."""
    out = []
    for cursor, operation, body in rows:
        event = json.loads(body)
        current = event["to_state"] == "accepted_current"
        for rid in event.get("record_ids") or [event["record_id"]]:
            out.append(JournalChange(int(cursor), operation, rid, current))
        if "related_to_state" in event:
            out.append(JournalChange(int(cursor), operation, event["related_record_id"],
                                     event["related_to_state"] == "accepted_current"))
    return out


def names_record(events: Sequence[dict[str, Any]], record_id: str) -> list[dict[str, Any]]:
    """The events that name the record: as its target, its related record, or among its targets."""
    return [e for e in events if record_id in (e.get("record_id"), e.get("related_record_id"))
            or record_id in (e.get("record_ids") or ())]


@dataclass(frozen=True)
class LiveWindow:
    """What a scope view keeps of a current record (store/core/live.py), undecrypted."""

    record_id: str
    valid_t: Any
    valid_t_end: Any
    expires_at_ms: Any
    event_at: Any
    event_kind: str | None  # keyed digest of the event type; None: a record stored before it was kept


# -- the protocols -------------------------------------------------------------------------


class KeyRing(Protocol):
    """Data keys wrapped by the master key, one per candidate or record (store/core/crypto.py says how
    they are used); destroying one crypto-shreds everything sealed with it."""

    server_secret: bytes  # authenticates page cursors: the same on every node of a store

    def create(self) -> tuple[str, bytes]: ...

    def create_many(self, count: int) -> list[tuple[str, bytes]]:
        """``count`` new keys, made durable together (one sync, not one per key): an import's
        batch creates its keys with this before the one commit that names them."""
        ...

    def load(self, key_ref: str) -> bytes | None: ...

    def destroy(self, key_ref: str) -> bool: ...

    def key_refs(self) -> list[str]: ...

    def sweep_orphans(self, referenced: set[str]) -> int: ...


class ReplayGuard(Protocol):
    """Each signed context's (kid, jti) is accepted once until it expires (models/hostauth.py)."""

    def claim(self, kid: str, jti: str, exp: int, now: float) -> bool: ...


class UnitOfWork(Protocol):
    """One transaction: the journal event, its state rows and its ledger entry commit together."""

    def high_water(self, scope_ref: str) -> int: ...

    def append_event(self, scope_ref: str, event: dict[str, Any],
                     advance_projection: bool = False) -> dict[str, Any]: ...

    def set_projection_cursor(self, scope_ref: str, cursor: int) -> None: ...

    def ledger_lookup(self, scope_ref: str, principal: str, key_digest: str) -> LedgerEntry | None: ...

    def candidate(self, candidate_id: str, scope_ref: str | None) -> Candidate | None: ...

    def record_state(self, scope_ref: str, record_id: str) -> RecordStatus | None: ...

    def tombstoned(self, scope_ref: str, payload_digest: str) -> bool: ...

    def ledger_store(self, scope_ref: str, principal: str, key_digest: str, tool: str, intent_hash: str,
                     value: str, created_at: str, key_ref: str | None = None) -> None:
        """Store a first answer; ``key_ref``: the data key a "pending" withdraw/forget answer owes."""
        ...

    def ledger_update(self, scope_ref: str, principal: str, key_digest: str, value: str) -> None: ...

    def insert_candidate(self, candidate: NewCandidate) -> None: ...

    def close_candidate(self, candidate_id: str, state: str, outcome: str | None = None) -> None: ...

    def insert_record(self, record: NewRecord) -> None: ...

    def set_record_state(self, record_id: str, state: str) -> None: ...

    def tombstone_record(self, record_id: str, state: str) -> None: ...

    def delete_embeddings(self, record_id: str) -> None: ...

    def tombstone_payload(self, scope_ref: str, payload_digest: str, record_id: str, cursor: int) -> None: ...

    # -- a batch of mutations in one transaction (an import: Lifecycle.capture_and_admit) --------

    def ledger_lookup_many(self, scope_ref: str, principal: str, key_digests: Sequence[str]
                           ) -> dict[str, LedgerEntry]:
        """The stored answers of those keys that have one, by key digest."""
        ...

    def tombstoned_many(self, scope_ref: str, payload_digests: Sequence[str]) -> set[str]:
        """Those payload digests forgotten in the scope."""
        ...

    def append_events(self, scope_ref: str, events: Sequence[tuple[dict[str, Any], bool]]) -> list[dict[str, Any]]:
        """``append_event`` of each (event, advance_projection), in order, at consecutive cursors."""
        ...

    def insert_candidates(self, candidates: Sequence[NewCandidate], outcomes: Sequence[str | None]) -> None:
        """New candidates; one with an outcome is inserted closed (as insert_candidate then
        close_candidate with that outcome: its key and envelope are None)."""
        ...

    def insert_records(self, records: Sequence[NewRecord]) -> None: ...

    def ledger_store_many(self, scope_ref: str, principal: str,
                          rows: Sequence[tuple[str, str, str, str, str]]) -> None:
        """First answers: (key_digest, tool, intent_hash, value, created_at) each."""
        ...

    def live_keys(self, scope_ref: str, record_ids: Sequence[str], state: str) -> list[tuple[str, str]]:
        """(record_id, key_ref) of those records of the scope still in ``state`` with a key; read
        under the scope's lock (a shared store), so no forget commits before this transaction's
        writes (an embedding inserted for a record forgotten in between)."""
        ...

    def due_expiries(self, scope_ref: str, states: Sequence[str], now_ms: int) -> list[DueExpiry]: ...

    def insert_embeddings(self, rows: Sequence[tuple[str, str | None, str, bytes]]) -> None: ...


class Store(Protocol):
    """The store as the engine sees it: transactions, reads, and the few store-wide values."""

    storage_epoch: str
    # True when other processes write the same store (PostgreSQL nodes): the engine then checks the
    # shared journal before it trusts its own projections and views (Engine._sync).
    shared: bool

    def close(self) -> None: ...

    def clock(self) -> int | None:
        """The store's clock (epoch ms) when several nodes share it: every decision that must agree
        across nodes (expiry) is taken by it; None: the process's own wall clock decides."""
        ...

    def bound_memory(self, mib: int) -> None:
        """Cap the store's own cache for a bulk job (an import): DuckDB otherwise keeps every block
        it wrote cached, up to most of the machine's memory; PostgreSQL's cache is the server's."""
        ...

    def key_ring(self) -> KeyRing: ...

    def replay_guard(self) -> ReplayGuard: ...

    def transaction(self) -> AbstractContextManager[UnitOfWork]: ...

    # ledger (outside a transaction: a fast path for replays; re-read inside one to be exact)
    def ledger_lookup(self, scope_ref: str, principal: str, key_digest: str) -> LedgerEntry | None: ...

    def ledger_update(self, scope_ref: str, principal: str, key_digest: str, value: str) -> None: ...

    def pending_answers(self, scope_ref: str | None = None) -> list[PendingAnswer]: ...

    def owed_keys(self, scope_ref: str) -> list[str]:
        """Data keys the scope's pending answers owe whose rows another node left behind (a shared
        store; a single process retries its own: Lifecycle.pending_keys and the start-up sweep)."""
        ...

    # lifecycle state
    def candidate(self, candidate_id: str, scope_ref: str | None) -> Candidate | None: ...

    def candidate_count(self, scope_ref: str) -> int: ...

    def record_state(self, scope_ref: str, record_id: str) -> RecordStatus | None: ...

    def tombstoned(self, scope_ref: str, payload_digest: str) -> bool: ...

    def due_expiries(self, scope_ref: str, states: Sequence[str], now_ms: int) -> list[DueExpiry]: ...

    # scopes and the journal
    def scopes(self) -> list[str]: ...

    def projection_cursors(self) -> dict[str, int]: ...

    def projection_cursor(self, scope_ref: str) -> int: ...

    def high_water(self, scope_ref: str) -> int: ...

    def verify_journal(self, scope_ref: str) -> bool: ...

    def journal_changes(self, scope_ref: str, after: int, through: int) -> list[JournalChange]: ...

    def record_events(self, scope_ref: str, record_id: str) -> list[dict[str, Any]]:
        """The journal events of a scope that name a record (as bodies, in cursor order)."""
        ...

    def record_scope(self, record_id: str) -> str | None:
        """The scope of a record in any state (None: no such record)."""
        ...

    def record_principals(self, scope_ref: str, state: str) -> dict[str, str]:
        """record_id -> the principal whose capture it was, for a scope's records in ``state``."""
        ...

    # records (sealed; the caller decrypts)
    def referenced_keys(self) -> set[str]: ...

    def current_records(self, scope_ref: str, state: str) -> list[SealedRecord]: ...

    def missing_embeddings(self, scope_ref: str, state: str, model_digest: str | None,
                           limit: int) -> list[SealedRecord]: ...

    def load_records(self, record_ids: Sequence[str]) -> list[SealedRecord]: ...

    def live_windows(self, scope_ref: str, state: str) -> list[LiveWindow]: ...

    # stored embeddings
    def stored_embeddings(self, scope_ref: str, state: str,
                          model_digest: str | None) -> list[tuple[str, str, bytes]]: ...

    def stored_embedding_count(self, scope_ref: str, state: str, model_digest: str | None) -> int: ...

    def embedding_count(self, record_id: str | None = None) -> int: ...

    def embeddings_of(self, record_ids: Sequence[str], model_digest: str | None) -> dict[str, tuple[str, bytes]]:
        """Some records' stored embeddings: record_id -> (key_ref, sealed vector), forgotten ones left out."""
        ...

    # the nodes of a shared store (a single-process store has one node: itself, always level)
    def acknowledge(self, scope_ref: str, cursor: int) -> None:
        """This node's projections of the scope reflect the journal through ``cursor``."""
        ...

    def watch(self, on_change: Callable[[str], None]) -> None:
        """Call ``on_change(scope_ref)`` (from a background thread) when another node changes a scope."""
        ...

    def unacknowledged(self, scope_ref: str, cursor: int) -> int:
        """How many live nodes' projections of the scope are still behind ``cursor``."""
        ...

    # the embedding model the store was created with (JSON, store/models.py; None: not recorded)
    def embedding_model(self) -> str | None: ...

    def record_embedding_model(self, value: str) -> None: ...

    # identity and copies (backup)
    def store_id(self) -> str: ...

    def heads(self) -> dict[str, tuple[int, str]]: ...

    def copy_to(self, path: Path) -> None: ...

    # audit
    def append_audit(self, rows: Sequence[Sequence[Any]]) -> None: ...

    # requests awaiting an operator's approval (store/host/approvals.py; columns: APPROVAL_COLUMNS)
    def approval_insert(self, row: Sequence[Any]) -> bool:
        """Park a request; False if (scope, principal, key digest) already has one."""
        ...

    def approval_find(self, scope_ref: str, principal: str, key_digest: str) -> tuple[Any, ...] | None: ...

    def approval_get(self, request_id: str) -> tuple[Any, ...] | None: ...

    def approvals_pending(self, scope_ref: str | None) -> list[tuple[Any, ...]]: ...

    def approval_decide(self, request_id: str, status: str, decided_at_ms: int, reason: str) -> bool:
        """pending -> ``status`` (the sealed arguments' key_ref and blob dropped); False if no longer pending."""
        ...

    def approval_outcome(self, request_id: str, outcome: str) -> None: ...
