"""The store boundary: what the engine and the operator's tools ask of a store, backend-neutral.

Everything the engine, lifecycle rules, expiry, adjudication and the read path need from the
store is a method here, over domain values (no SQL, no driver types). ``store/duckdb/`` (embedded,
the default) and ``store/postgres/`` (shared by several nodes) implement the protocols:

* ``Store`` and ``UnitOfWork``: a store a process serves (``store/opening.py`` ``open_store``);
* ``Inspector``: the read-only view of a store that verify, history and rebuild read, with its
  ``DataKeys`` (key files in a data dir, or key rows of a shared store);
* ``EmbeddedBackend`` (a store in a data dir: DuckDB, ``store/duckdb/kind.py``) and
  ``SharedBackend`` (a store named by URL that several nodes share: PostgreSQL,
  ``store/postgres/kind.py``): what an operator's command does with a kind of store by its
  location. ``store/opening.py`` is the one place outside the backends that names them
  (``embedded()``, ``shared(url)``); the exceptions a caller catches live here, so no caller
  imports a backend to catch one.

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
from dataclasses import dataclass, field
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


class NotAStoreError(StoreError):
    """The data dir's store file is not a database of the backend, or not an engram-memory one
    (``reason`` says which, in one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class LiveNodesError(StoreRefused):
    """Nodes of the store are running: they hold the old master key (STORE_BUSY for the operator)."""


class MigrateUsageError(ValueError):
    """The source is not a store this version can migrate (one line for the operator, exit 2)."""


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

    def record_payload_digests(self, scope_ref: str, state: str) -> set[str]:
        """The payload digests of a scope's records in ``state``: the plain column, nothing decrypted."""
        ...

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

    # the operator console's reads (store/console/console_reads.py)
    def console_rows(self, query: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """A named console query (each backend's ``console.QUERIES``: the same names, columns and
        order) on this store; DuckDB runs it on the calling thread's read cursor."""
        ...

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


# -- what the operator's tools read and do (maintenance, history, the admin commands) ----------

# The tables whose rows are kept per scope (verify: none under a scope the scopes table does not list).
SCOPED_TABLES = ("journal", "candidates", "records", "embeddings", "tombstoned_payloads", "idempotency")


@dataclass(frozen=True)
class StoppedStore:
    """What a restore checks of a stopped store: its identity, where it journalled forgets, and
    each scope's journal head (high_water, last_event_hash)."""

    store_id: str | None
    tombstones: list[tuple[str, int]]
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)


@dataclass
class MigrateReport:
    """What ``admin migrate`` (or a restore into a shared store) copied."""

    store_id: str
    storage_epoch: str
    rows: dict[str, int] = field(default_factory=dict)
    data_keys: int = 0
    unreferenced_keys: int = 0  # key files no row referenced: not copied (their destruction completes)

    def as_dict(self) -> dict[str, Any]:
        return {"store_id": self.store_id, "storage_epoch": self.storage_epoch, "rows": dict(self.rows),
                "data_keys": self.data_keys, "unreferenced_key_files": self.unreferenced_keys}


class DataKeys(Protocol):
    """A store's data keys as ``admin verify`` checks them (DuckDB: key files under ``keys/``;
    PostgreSQL: ``data_keys`` rows), read-only."""

    def problem(self) -> str | None:
        """A store-wide key problem (no master key, a page-cursor key that does not open), or None."""
        ...

    def exists(self, key_ref: str) -> bool: ...

    def load(self, key_ref: str) -> bytes | None:
        """The data key, or None when it is absent or does not open under the master key."""
        ...

    def census(self, referenced: set[str]) -> tuple[list[str], int]:
        """(orphans: keys no row references, how many keys there are)."""
        ...


class Inspector(Protocol):
    """A read-only view of a whole store (a stopped DuckDB store, or one snapshot of a live
    PostgreSQL store): what verify, history, the candidates listing and rebuild read. Close it."""

    def close(self) -> None: ...

    def data_keys(self) -> DataKeys: ...

    def verify_journal(self, scope_ref: str) -> bool:
        """The scope's hash chain and dense cursors."""
        ...

    # store-wide
    def scopes(self) -> list[str]:
        """The scope_refs, sorted."""
        ...

    def referenced_keys(self) -> set[str]: ...

    def listed_scopes(self) -> set[str]: ...

    def scopes_in(self, table: str) -> list[str]:
        """The distinct scope_refs of one of SCOPED_TABLES."""
        ...

    # one scope
    def journal_rows(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(cursor, event_id, operation, body, event_hash) in cursor order."""
        ...

    def journal_tail(self, scope_ref: str, limit: int | None = None) -> list[tuple[int, str, str]]:
        """(cursor, body, event_hash), newest first (the last ``limit``)."""
        ...

    def pending_candidates(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(candidate_id, principal, state, created_cursor, recorded_at, payload_digest, record_digest,
        held) of the scope's pending candidates, in cursor order; ``held``: its payload was forgotten."""
        ...

    def head(self, scope_ref: str) -> tuple[Any, ...]:
        """(high_water, last_event_hash, projection_cursor)."""
        ...

    def journal_operations(self, scope_ref: str) -> list[tuple[Any, ...]]: ...

    def candidate_states(self, scope_ref: str) -> list[tuple[Any, ...]]: ...

    def record_links(self, scope_ref: str) -> list[tuple[Any, ...]]: ...

    def tombstoned_records(self, scope_ref: str) -> set[str]: ...

    def candidates(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(candidate_id, state, created_cursor, payload_digest, record_digest, key_ref, envelope, outcome)."""
        ...

    def records(self, scope_ref: str) -> list[tuple[Any, ...]]:
        """(record_id, state, record_digest, payload_digest, key_ref, body, its candidate's record_digest)."""
        ...

    def embedded_records(self, scope_ref: str) -> list[str]: ...

    def projection_cursor(self, scope_ref: str) -> int: ...

    def current_bodies(self, scope_ref: str, state: str) -> list[tuple[Any, ...]]:
        """(record_id, key_ref, body) of the scope's records in ``state`` with a body, by record_id."""
        ...

    def embedding_models(self, scope_ref: str, state: str) -> list[str]: ...

    def embeddings(self, scope_ref: str, state: str, model_digest: str) -> list[tuple[Any, ...]]:
        """(record_id, key_ref, vector) by record_id."""
        ...


class EmbeddedBackend(Protocol):
    """A kind of store that lives in a data dir and one process serves (DuckDB): what the
    maintenance commands do with it while no server holds the directory."""

    store_file: str  # the database file in the data dir

    def held(self, data_dir: Path, busy: Callable[[], Exception]) -> AbstractContextManager[None]:
        """Hold the data dir's advisory lock (never creating it); raises ``busy()`` when a server holds it."""
        ...

    def inspector(self, data_dir: Path) -> Inspector:
        """The stopped store, read-only. Raises StoreBusyError (a process holds the file) and
        NotAStoreError (no database of this kind; ``scopes()``: not an engram-memory one)."""
        ...

    def stopped(self, data_dir: Path) -> StoppedStore:
        """Raises StoreBusyError, and StoreError when it cannot be read as an engram-memory store."""
        ...

    def journal_hashes(self, data_dir: Path, at: dict[str, int]) -> dict[str, str]:
        """The event_hash of each scope's journal event at the given cursor (absent: no such event)."""
        ...


class SharedBackend(Protocol):
    """A kind of store named by a URL that several serving nodes share (PostgreSQL): what an
    operator's command, a restore and the benchmarks do with one. Its driver is an optional extra:
    ``check_url`` says in one line what to install; nothing else is called before it passed."""

    name: str  # how messages name the kind ("PostgreSQL")

    def check_url(self, text: str) -> str:
        """``text`` unchanged when it is a usable URL of this kind; else ValueError (URL not echoed)."""
        ...

    def redact_url(self, text: str) -> str:
        """The URL with any password replaced, for logs and reports."""
        ...

    def inspector(self, url: str, master_key: bytes | None = None, key_file: Path | None = None) -> Inspector:
        """One read-only snapshot of the live store (``master_key``, when given, is checked and
        opens its data keys). Raises StoreRefused (unreachable, not initialised, another key)."""
        ...

    def init_store(self, url: str, master_key: bytes) -> str:
        """Create the schema and identity of an empty store; its store id. StoreRefused if initialised."""
        ...

    def migrate_counts(self, data_dir: Path) -> dict[str, int]:
        """Rows per table a migration of the stopped embedded store at ``data_dir`` copies."""
        ...

    def migrate_store(self, data_dir: Path, url: str, master_key: bytes,
                      advance: Callable[[str, int], None] | None = None) -> MigrateReport:
        """Copy the stopped embedded store into the empty store at ``url``. Raises StoreBusyError,
        MigrateUsageError and StoreRefused (nothing written to the target then)."""
        ...

    def export_store(self, url: str, master_key: bytes, key_file: Path, data_dir: Path) -> dict[str, int]:
        """One snapshot of the store written as a new embedded store in ``data_dir`` (what a backup
        archives); the rows copied per table."""
        ...

    def store_heads(self, url: str, store_id: str) -> dict[str, tuple[int, str]] | None:
        """Each scope's (high water, last event hash) when ``url`` holds the store ``store_id``;
        None for another store, no store, or one that cannot be read."""
        ...

    def rotate_master_key(self, url: str, old_key: bytes, old_key_file: Path, new_key: bytes) -> int:
        """Re-wrap every key of the store under ``new_key`` in one transaction; how many data keys.
        Raises StoreRefused and LiveNodesError (nothing changed)."""
        ...

    # throwaway databases for the harnesses (benchmarks, crash runs), next to an admin URL
    def reachable(self, url: str, timeout_s: int = 10) -> bool: ...

    def create_database(self, admin_url: str, prefix: str) -> str:
        """A fresh, empty database next to ``admin_url``'s; its URL."""
        ...

    def drop_database(self, admin_url: str, url: str) -> None: ...

    def backend_pids(self, url: str) -> list[int]:
        """The server processes serving ``url``'s database (other than the asking connection's)."""
        ...
