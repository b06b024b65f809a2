"""The engine facade: the six operations over DuckDB and the projections (no MCP here).

Data flows one way: validated input -> lifecycle (one DuckDB transaction) -> projections
-> value. Every public method is serialised by one lock: DuckDB has a single writer and
Tantivy a single index writer, and it keeps journal cursors dense.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.context import HostContext, HostPolicy
from models.digests import receipt_digest
from retrieval.lexical import REFERENCE_PROFILE, LexicalConfig, LexicalDoc
from retrieval.projections import DEFAULT_HNSW_THRESHOLD, Projections
from retrieval.ranking import FusionConfig
from store.crypto import KeyStore, open_sealed, seal
from store.db import Database, StoreBusyError
from store.lifecycle import Lifecycle, lexical_fields, record_context
from store.timeutil import default_clock, to_instant

__all__ = ["AuditEvent", "Engine", "EngineConfig", "StoreBusyError"]

log = logging.getLogger("engram.engine")


@dataclass(frozen=True)
class EngineConfig:
    data_dir: Path
    policy: HostPolicy = field(default_factory=HostPolicy)
    model_path: Path | None = None  # None: the packaged model
    semantic: bool = True  # load the embedding model in the background
    fusion: str = "convex"  # convex | rrf | dbsf; convex 0.5/0.5 won the evaluation (eval/RESULTS.md)
    rrf_k: int = 60
    fusion_weights: tuple[float, float] = (0.5, 0.5)  # lexical, semantic (score-based fusion)
    hnsw_threshold: int = DEFAULT_HNSW_THRESHOLD
    lexical: LexicalConfig = REFERENCE_PROFILE  # per-field BM25 boosts
    # Which channels rank. Hosts keep both; the evaluation harness restricts it to score
    # each channel on its own through the same search path.
    channels: tuple[str, ...] = ("lexical", "semantic")
    clock: Callable[[], int] | None = None  # epoch milliseconds; None: wall clock


@dataclass(frozen=True)
class AuditEvent:
    audit_id: str
    tool: str
    ok: bool
    code: str | None  # error code, or None on success
    idempotency_key: str | None  # stored only as "idk_" + 12 hex of its SHA-256


def embedding_text(record: dict[str, Any]) -> str:
    return "\n".join(c["text"] for c in record["components"])


class Engine:
    def __init__(self, config: EngineConfig, db: Database) -> None:
        self.config = config
        self.db = db
        self.clock = config.clock or default_clock()
        self.keys = KeyStore(config.data_dir)
        self.lifecycle = Lifecycle(db, self.keys, config.policy)
        self.fusion = FusionConfig(
            method=config.fusion,
            k=config.rrf_k,
            weights={"lexical": config.fusion_weights[0], "semantic": config.fusion_weights[1]},
        )
        self.projections = Projections(
            config.data_dir / "projections", hnsw_threshold=config.hnsw_threshold, lexical_config=config.lexical
        )
        self.lock = threading.RLock()
        self._batch: dict[str, tuple[list[dict[str, Any]], int]] | None = None
        self._stale: set[str] = set()
        self._closed = False
        self._semantic_done = threading.Event()  # ready: model loaded and backfill complete
        self._semantic_settled = threading.Event()  # ready, or given up (model missing/broken)
        self.embedder = None
        if config.semantic:
            from retrieval.embedder import shared_embedder

            self.embedder = shared_embedder(config.model_path)
            self.embedder.start()

    @classmethod
    def open(cls, config: EngineConfig) -> Engine:
        """Open (or create) a data directory; raises StoreBusyError if another process owns it."""
        engine = cls(config, Database(config.data_dir))
        engine.recover()
        return engine

    def close(self) -> None:
        with self.lock:
            self._closed = True
            self.projections.close()
            self.db.close()

    # -- recovery ------------------------------------------------------------------------

    def recover(self) -> None:
        """Converge after a crash: sweep keys no row references, bring projections up to date."""
        with self.lock:
            referenced = {
                r[0]
                for r in self.db.all(
                    "SELECT key_ref FROM candidates WHERE key_ref IS NOT NULL"
                    " UNION SELECT key_ref FROM records WHERE key_ref IS NOT NULL"
                )
            }
            swept = self.keys.sweep_orphans(referenced)
            if swept:
                log.info("destroyed %d orphan data keys", swept)
            # Projections that lag the journal are rebuilt lazily, on the scope's next use, so a
            # server answers initialize at once even after a crash.
            for scope_ref, projection_cursor in self.db.all("SELECT scope_ref, projection_cursor FROM scopes"):
                if self.projections.lexical(scope_ref).cursor != str(projection_cursor):
                    self._stale.add(scope_ref)
        if self.embedder is not None:
            threading.Thread(target=self._semantic_loader, name="engram-semantic", daemon=True).start()

    # -- projections ---------------------------------------------------------------------

    def _live_records(self, scope_ref: str) -> list[dict[str, Any]]:
        rows = self.db.all(
            "SELECT record_id, key_ref, body FROM records WHERE scope_ref = ? AND state = 'accepted_current'"
            " ORDER BY record_id",
            [scope_ref],
        )
        out = []
        for rid, key_ref, body in rows:
            record = self.lifecycle.load_record(rid, key_ref, body)
            if record is not None:
                out.append(record)
        return out

    def _stored_vectors(self, scope_ref: str) -> tuple[list[str], np.ndarray] | None:
        if self.embedder is None:
            return None
        rows = self.db.all(
            "SELECT e.record_id, r.key_ref, e.vector FROM embeddings e JOIN records r USING (record_id)"
            " WHERE e.scope_ref = ? AND e.model_digest = ? AND r.state = 'accepted_current' ORDER BY e.record_id",
            [scope_ref, self.embedder.model_digest],
        )
        ids, vecs = [], []
        for rid, key_ref, blob in rows:
            dek = self.keys.load(key_ref)
            if dek is None:
                continue
            ids.append(rid)
            vecs.append(np.frombuffer(open_sealed(dek, blob, record_context(rid)), dtype=np.float32))
        return (ids, np.vstack(vecs)) if ids else (ids, np.zeros((0, self.projections.dim), np.float32))

    def rebuild_scope(self, scope_ref: str) -> None:
        with self.lock:
            records = self._live_records(scope_ref)
            docs = [LexicalDoc(r["record_id"], lexical_fields(r)) for r in records]
            self.projections.rebuild(scope_ref, docs, self._stored_vectors(scope_ref),
                                     self.db.projection_cursor(scope_ref))

    def scopes(self) -> list[str]:
        return [r[0] for r in self.db.all("SELECT scope_ref FROM scopes ORDER BY scope_ref")]

    def _embed_and_store(self, scope_ref: str, records: list[dict[str, Any]], cursor: int,
                         vectors: np.ndarray | None = None) -> None:
        """Embed admitted records once (kept in DuckDB, sealed with the record key) and index them.

        Records forgotten meanwhile have no key any more and are skipped."""
        if self.embedder is None or self.embedder.state != "ready" or not records:
            return
        if vectors is None:
            vectors = self.embedder.encode([embedding_text(r) for r in records])
        by_id = {r["record_id"]: i for i, r in enumerate(records)}
        kept_ids, kept_rows, values = [], [], []
        with self.db.transaction() as con:
            # Two statements per chunk, not two per record: DuckDB costs ~1 ms a statement.
            live = con.execute(
                "SELECT record_id, key_ref FROM records WHERE record_id IN (SELECT unnest(?::VARCHAR[]))"
                " AND state = 'accepted_current' AND key_ref IS NOT NULL ORDER BY record_id",
                [list(by_id)],
            ).fetchall()
            for rid, key_ref in live:
                dek = self.keys.load(key_ref)
                if dek is None:
                    continue
                vec = vectors[by_id[rid]]
                values += [rid, self.embedder.model_digest, scope_ref,
                           seal(dek, np.asarray(vec, np.float32).tobytes(), record_context(rid))]
                kept_ids.append(rid)
                kept_rows.append(vec)
            if kept_ids:
                con.execute(
                    "INSERT INTO embeddings VALUES " + ", ".join(["(?, ?, ?, ?)"] * len(kept_ids))
                    + " ON CONFLICT DO NOTHING",
                    values,
                )
        if kept_ids:
            self.projections.add_vectors(scope_ref, kept_ids, np.vstack(kept_rows), cursor)

    BACKFILL_CHUNK = 256

    def _missing_embeddings(self, limit: int) -> tuple[str, list[dict[str, Any]]] | None:
        assert self.embedder is not None
        for scope_ref in self.scopes():
            missing = self.db.all(
                "SELECT record_id, key_ref, body FROM records r WHERE scope_ref = ? AND state = 'accepted_current'"
                " AND NOT EXISTS (SELECT 1 FROM embeddings e WHERE e.record_id = r.record_id"
                " AND e.model_digest = ?) ORDER BY record_id LIMIT ?",
                [scope_ref, self.embedder.model_digest, limit],
            )
            records = [r for r in (self.lifecycle.load_record(*m) for m in missing) if r is not None]
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
            with self.lock:
                if self._closed:
                    return
                for scope_ref in self.scopes():
                    self._repair_vectors(scope_ref)
            while True:
                with self.lock:
                    if self._closed:
                        return
                    todo = self._missing_embeddings(self.BACKFILL_CHUNK)
                    if todo is None:
                        self._semantic_done.set()  # under the lock: no admission slips in between
                        return
                scope_ref, records = todo
                vectors = self.embedder.encode([embedding_text(r) for r in records])
                with self.lock:
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
        stored_count = self.db.one(
            "SELECT count(*) FROM embeddings e JOIN records r USING (record_id)"
            " WHERE e.scope_ref = ? AND e.model_digest = ? AND r.state = 'accepted_current'",
            [scope_ref, self.embedder.model_digest],
        )[0]
        index = self.projections.vectors(scope_ref)
        if index.count() == stored_count:
            return
        stored = self._stored_vectors(scope_ref)
        assert stored is not None
        ids, mat = stored
        missing = [i for i, rid in enumerate(ids) if not index.contains(rid)]
        if index.count() != len(ids) - len(missing):
            self.rebuild_scope(scope_ref)
            return
        self.projections.add_vectors(scope_ref, [ids[i] for i in missing], mat[missing],
                                     self.db.projection_cursor(scope_ref))
        index.save()

    def semantic_ready(self) -> bool:
        """The model is loaded and every live record has its vector indexed."""
        return self._semantic_done.is_set()

    def wait_semantic(self, timeout: float | None = None) -> bool:
        """Block until the semantic channel is ready or has given up; True when ready."""
        if self.embedder is None:
            return False
        self._semantic_settled.wait(timeout)
        return self._semantic_done.is_set()

    def _fresh(self, scope_ref: str) -> None:
        """Rebuild a scope whose projections lag the journal (crash, failed purge) before use."""
        if scope_ref in self._stale:
            self.rebuild_scope(scope_ref)
            self._stale.discard(scope_ref)

    # -- the six operations --------------------------------------------------------------

    def capture(self, ctx: HostContext, args: Any) -> dict[str, Any]:
        with self.lock:
            return self.lifecycle.capture(ctx, _plain(args), self.clock())

    def request_admission(self, ctx: HostContext, args: Any) -> dict[str, Any]:
        with self.lock:
            self._fresh(ctx.scope_ref)
            value, admitted = self.lifecycle.request_admission(ctx, _plain(args), self.clock())
            if admitted is not None:
                if self._batch is not None:
                    records = self._batch.get(admitted.scope_ref, ([], 0))[0]
                    records.append(admitted.record)
                    self._batch[admitted.scope_ref] = (records, admitted.cursor)
                else:
                    self._project_admitted(admitted.scope_ref, [admitted.record], admitted.cursor)
            return value

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Bulk ingestion (eval, imports): each mutation is still its own transaction, but the
        projection updates of admitted records are applied once, together, at the end."""
        with self.lock:
            self._batch = {}
            try:
                yield
            finally:
                pending, self._batch = self._batch, None
                for scope_ref, (records, cursor) in sorted(pending.items()):
                    self._project_admitted(scope_ref, records, cursor)

    def _project_admitted(self, scope_ref: str, records: list[dict[str, Any]], cursor: int) -> None:
        docs = [LexicalDoc(r["record_id"], lexical_fields(r)) for r in records]
        self.projections.add_lexical(scope_ref, docs, cursor)
        if self.semantic_ready():
            for start in range(0, len(records), 256):
                self._embed_and_store(scope_ref, records[start:start + 256], cursor)

    def withdraw(self, ctx: HostContext, args: Any) -> dict[str, Any]:
        with self.lock:
            return self.lifecycle.withdraw(ctx, _plain(args), self.clock())

    def forget(self, ctx: HostContext, args: Any) -> dict[str, Any]:
        with self.lock:
            self._fresh(ctx.scope_ref)
            plain = _plain(args)
            value, rid = self.lifecycle.forget(ctx, plain, self.clock())
            if rid is None:
                return value  # replay: the first answer, byte for byte
            cursor = int(value["receipt"]["cursor"])
            try:
                self.projections.remove(ctx.scope_ref, [rid], cursor)
            except Exception:  # noqa: BLE001 - reported as pending; the next use rebuilds the scope
                log.exception("projection purge failed; invalidation stays pending")
                self._stale.add(ctx.scope_ref)
                return value
            coverage = receipt_digest(
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
            return self.lifecycle.complete_forget(ctx, plain["idempotency_key"], value, coverage)

    def get(self, ctx: HostContext, args: Any) -> dict[str, Any]:
        from retrieval.search import get_record

        with self.lock:
            self._fresh(ctx.scope_ref)
            return get_record(self, ctx, _plain(args))

    def search(self, ctx: HostContext, args: Any) -> dict[str, Any]:
        from retrieval.search import search

        with self.lock:
            self._fresh(ctx.scope_ref)
            return search(self, ctx, _plain(args))

    # -- audit ---------------------------------------------------------------------------

    def record_audit(self, ctx: HostContext, event: AuditEvent) -> None:
        idk = None
        if event.idempotency_key is not None:
            idk = "idk_" + hashlib.sha256(event.idempotency_key.encode("utf-8")).hexdigest()[:12]
        with self.lock:
            self.db.con.execute(
                "INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [event.audit_id, to_instant(self.clock()), ctx.scope_ref, ctx.principal, ctx.agent_id,
                 ctx.session, event.tool, event.ok, event.code, idk],
            )


def _plain(args: Any) -> dict[str, Any]:
    if isinstance(args, dict):
        return args
    from models.tools import to_plain

    return to_plain(args)
