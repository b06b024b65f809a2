"""Rebuild every projection (or one scope's) from DuckDB, optionally verifying against the live ones.

Embeddings are read back from DuckDB (keyed by record and model digest), so a rebuild never
re-embeds an unchanged record. ``verify`` builds aside, compares the rebuilt projections
with the live ones on probe queries, reports any difference, then swaps them in.

A rebuild only ever opens an existing store: an absent or foreign directory, or an unknown
scope, is refused before anything is created (``existing_scopes`` reads DuckDB read-only).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress

from engram_memory.models.context import scope_names  # noqa: F401  (server/ still imports it from here)
from engram_memory.models.settings import EmbeddingModel, EngineSettings
from engram_memory.retrieval.lexical import LexicalDoc
from engram_memory.retrieval.projections import Projections
from engram_memory.store.backend import NotAStoreError, StoreBusyError
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.lifecycle import lexical_fields
from engram_memory.store.opening import embedded

PROBES = 200
LOCK_FILE = ".lock"  # store/duckdb/backend.py Database's advisory lock


class NoStoreError(ValueError):
    """The data directory holds no engram-memory store (nothing was created or changed)."""

    def __init__(self, data_dir: Path, reason: str) -> None:
        super().__init__(f"no engram-memory store at {data_dir} ({reason})")
        self.data_dir, self.reason = data_dir, reason


class UnknownScopeError(LookupError):
    """The store has no such scope (nothing was created or changed); ``known`` lists its scopes."""

    def __init__(self, scope_ref: str, known: list[str]) -> None:
        super().__init__(f"unknown scope {scope_ref}")
        self.scope_ref, self.known = scope_ref, known


def _held_by_another(data_dir: Path) -> bool:
    """Whether a running server holds the directory's advisory lock (the lock file is never created)."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's lock
    return False


def existing_scopes(data_dir: Path) -> list[str]:
    """The scope_refs of the store at ``data_dir``, read without creating or changing anything.

    Raises NoStoreError (no such directory, not a directory, no ``engram.duckdb``, not an
    engram-memory database) and StoreBusyError (a server owns the directory)."""
    try:
        if not data_dir.exists():
            raise NoStoreError(data_dir, "the directory does not exist")
        if not data_dir.is_dir():
            raise NoStoreError(data_dir, "not a directory")
        store_file = embedded().store_file
        if not (data_dir / store_file).is_file():
            raise NoStoreError(data_dir, f"no {store_file}")
        busy = _held_by_another(data_dir)
    except OSError as exc:
        raise NoStoreError(data_dir, f"cannot read it: {exc.strerror or exc}") from None
    if busy:
        raise StoreBusyError(f"data directory {data_dir} is in use by another engram-memory process")
    try:
        inspector = embedded().inspector(data_dir)
        try:
            return inspector.scopes()
        finally:
            inspector.close()
    except NotAStoreError as exc:
        raise NoStoreError(data_dir, exc.reason) from None


@dataclass
class ScopeReport:
    scope_dir: str
    records: int
    vectors: int
    differences: list[str] = field(default_factory=list)
    scope_ref: str = ""

    @property
    def tenant(self) -> str | None:
        names = scope_names(self.scope_ref)
        return names[0] if names else None

    @property
    def workspace(self) -> str | None:
        names = scope_names(self.scope_ref)
        return names[1] if names else None

    def as_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "workspace": self.workspace, "scope_dir": self.scope_dir,
                "records": self.records, "vectors": self.vectors, "differences": self.differences}


@dataclass
class RebuildReport:
    scopes: list[ScopeReport]

    @property
    def differences(self) -> int:
        return sum(len(s.differences) for s in self.scopes)

    def as_dict(self) -> dict[str, Any]:
        return {"scopes": [s.as_dict() for s in self.scopes], "differences": self.differences}


def _probe_queries(records: list[dict[str, Any]]) -> list[str]:
    step = max(1, len(records) // PROBES)
    probes = []
    for record in records[::step][:PROBES]:
        words = " ".join(c["text"] for c in record["components"]).split()
        probes.append(" ".join(words[:8]) or record["record_id"])
    return probes


def build_aside(aside: Path, like: Projections, scope_ref: str, records: list[dict[str, Any]],
                vectors: tuple[list[str], np.ndarray] | None, cursor: int) -> Projections:
    """A fresh rebuild of one scope's projections in ``aside`` (configured like ``like``)."""
    shutil.rmtree(aside, ignore_errors=True)
    built = Projections(aside, hnsw_threshold=like.hnsw_threshold, lexical_config=like.lexical_config)
    built.model_digest = like.model_digest
    built.rebuild(scope_ref, [LexicalDoc(r["record_id"], lexical_fields(r)) for r in records], vectors, cursor)
    return built


def compare_projections(live: Projections, built: Projections, scope_ref: str, records: list[dict[str, Any]],
                        vectors: tuple[list[str], np.ndarray] | None) -> list[str]:
    """How the live projections of a scope differ from a fresh rebuild (counts, probe rankings);
    shared by ``rebuild-index --verify`` and the store verifier (store/maintenance/verify.py)."""
    diffs = []
    live_lex, new_lex = live.lexical(scope_ref), built.lexical(scope_ref)
    if live_lex.count() != new_lex.count():
        diffs.append(f"lexical document count {live_lex.count()} != rebuilt {new_lex.count()}")
    for query in _probe_queries(records):
        if live_lex.search(query, 10) != new_lex.search(query, 10):
            diffs.append("lexical ranking differs for a probe query")
            break
    live_vec, new_vec = live.vectors(scope_ref), built.vectors(scope_ref)
    if live_vec.count() != new_vec.count():
        diffs.append(f"vector count {live_vec.count()} != rebuilt {new_vec.count()}")
    if vectors is not None and vectors[0]:
        step = max(1, len(vectors[0]) // PROBES)
        for row in vectors[1][::step][:PROBES]:
            if live_vec.search(row, 10) != new_vec.search(row, 10):
                diffs.append("vector ranking differs for a probe vector")
                break
    return diffs


def rebuild_index(data_dir: Path, scope_ref: str | None = None, verify: bool = False,
                  model_path: Path | None = None, show_progress: bool = True, semantic: bool = True,
                  store: str | None = None, master_key_file: Path | None = None,
                  model: EmbeddingModel | None = None) -> RebuildReport:
    """Raises StoreBusyError when a server owns the data directory; NoStoreError when it holds no
    store and UnknownScopeError for a scope the store does not have (both before any change).

    With ``store`` (a PostgreSQL URL), ``data_dir`` is one node's directory: its projections are
    rebuilt from the shared store (which other nodes keep serving meanwhile).

    Without ``model``/``model_path`` the store's own model is used; with one, the store switches to
    it (every record is re-embedded, and the store records it: store/core/embedding_model.py)."""
    switch = model is not None or model_path is not None
    settings = EngineSettings(data_dir=data_dir, model=model, model_path=model_path, semantic=semantic, store=store,
                              master_key_file=master_key_file)
    if store is None:
        known = existing_scopes(data_dir)
        if scope_ref is not None and scope_ref not in known:
            raise UnknownScopeError(scope_ref, known)
        if not known:
            return RebuildReport([])  # nothing to rebuild: not even the model is loaded
        engine = Engine.open(settings, switch_model=switch)
    else:
        # The scopes first, without the model: a refusal must not leave a model loading at exit.
        from engram_memory.store.opening import open_store

        db = open_store(settings)
        try:
            known = db.scopes()
        finally:
            db.close()
        if scope_ref is not None and scope_ref not in known:
            raise UnknownScopeError(scope_ref, known)
        if not known:
            return RebuildReport([])
        engine = Engine.open(settings, switch_model=switch)
    try:
        if engine.embedder is not None:
            # Records admitted before the model was ready get embedded now, and every record when
            # the model changed (its vectors are keyed by its digest: none of another model's are
            # read). Waits as long as that takes (the backfill ends, or gives up on a model failure).
            engine.wait_semantic(None)
        scopes = [scope_ref] if scope_ref else engine.scopes()
        reports = []
        # stdout carries the report (--json): the progress bar goes to stderr.
        with Progress(console=Console(stderr=True), disable=not show_progress, transient=False) as progress:
            task = progress.add_task("rebuilding projections", total=len(scopes))
            for scope in scopes:
                records = engine.live_records(scope)
                vectors = engine.stored_vectors(scope)
                cursor = engine.projection_cursor(scope)
                report = ScopeReport(engine.projections.scope_dir(scope).name, len(records),
                                     len(vectors[0]) if vectors else 0, scope_ref=scope)
                if verify:
                    aside = data_dir / "projections.rebuild"
                    built = build_aside(aside, engine.projections, scope, records, vectors, cursor)
                    report.differences = compare_projections(engine.projections, built, scope, records, vectors)
                    built.close()
                    engine.projections.replace_scope(scope, built.scope_dir(scope))
                    shutil.rmtree(aside, ignore_errors=True)
                else:
                    docs = [LexicalDoc(r["record_id"], lexical_fields(r)) for r in records]
                    engine.projections.rebuild(scope, docs, vectors, cursor)
                reports.append(report)
                progress.advance(task)
        return RebuildReport(reports)
    finally:
        engine.close()
