"""Per-scope search projections (one Tantivy index and one vector index per tenant/workspace).

Each scope gets its own directory, so a search can never rank another scope's record and
index statistics never mix scopes. Projections are derived data: the store can always
rebuild them, and each records the journal cursor it reflects.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from engram_memory.models.limits import HNSW_THRESHOLD
from engram_memory.retrieval.lexical import (
    REFERENCE_PROFILE,
    LexicalConfig,
    LexicalDoc,
    LexicalIndex,
    LexicalIndexError,
)
from engram_memory.retrieval.vectors import VectorIndex

SAVE_MIN_ROWS = 256


def scope_dirname(scope_ref: str) -> str:
    return hashlib.sha256(scope_ref.encode("utf-8")).hexdigest()[:32]


class Projections:
    def __init__(
        self,
        root: Path,
        dim: int = 384,
        hnsw_threshold: int = HNSW_THRESHOLD,
        lexical_config: LexicalConfig = REFERENCE_PROFILE,
    ) -> None:
        self.root = root
        self.lexical_config = lexical_config
        self.root.mkdir(parents=True, exist_ok=True)
        self.dim = dim
        self.hnsw_threshold = hnsw_threshold
        self._lexical: dict[str, LexicalIndex] = {}
        self._vectors: dict[str, VectorIndex] = {}
        # The embedding model whose vectors are indexed (its digest, set by the engine once known):
        # every index written is tagged with it (VectorIndex.model).
        self.model_digest: str | None = None
        self._lock = threading.RLock()
        # A scope directory set aside by a replace_scope that did not finish holds projections of
        # records forgotten since: derived data nobody reads, so it goes.
        for old in self.root.glob("*.old"):
            _remove_tree(old)

    def scope_dir(self, scope_ref: str) -> Path:
        return self.root / scope_dirname(scope_ref)

    def lexical(self, scope_ref: str) -> LexicalIndex:
        with self._lock:
            if scope_ref not in self._lexical:
                path = self.scope_dir(scope_ref) / "lexical"
                try:
                    index = LexicalIndex.open(path, self.lexical_config)
                except LexicalIndexError:
                    if not (path / "meta.json").exists():
                        raise
                    # An index of an earlier format (e.g. without the id fast fields): derived
                    # data, so it starts empty; its cursor no longer matches the journal, and the
                    # store rebuilds the scope from DuckDB before its next use.
                    shutil.rmtree(path)
                    index = LexicalIndex.open(path, self.lexical_config)
                self._lexical[scope_ref] = index
            return self._lexical[scope_ref]

    def vectors(self, scope_ref: str) -> VectorIndex:
        with self._lock:
            if scope_ref not in self._vectors:
                self._vectors[scope_ref] = VectorIndex.open(
                    self.scope_dir(scope_ref) / "vectors", self.dim, hnsw_threshold=self.hnsw_threshold
                )
            return self._vectors[scope_ref]

    def add_lexical(self, scope_ref: str, docs: list[LexicalDoc], cursor: int) -> None:
        index = self.lexical(scope_ref)
        index.upsert(docs)
        index.set_cursor(str(cursor))

    def add_vectors(self, scope_ref: str, ids: list[str], vectors: np.ndarray, cursor: int) -> None:
        """Index vectors at once; persist them in spread-out saves.

        A save rewrites vectors.npy (and the HNSW graph): O(n), about a second at 100k rows, too
        much for every admission. DuckDB holds every vector, so the files may lag: they are saved
        once a twentieth of the index (at least SAVE_MIN_ROWS rows) is unsaved, at every purge and
        at close; after a crash the next open re-adds the missing tail from DuckDB."""
        index = self.vectors(scope_ref)
        index.upsert(ids, vectors)
        index.set_cursor(str(cursor))
        if self.model_digest is not None:
            index.set_model(self.model_digest)
        if index.unsaved >= max(SAVE_MIN_ROWS, index.count() // 20):
            index.save()

    def remove(self, scope_ref: str, record_ids: list[str], cursor: int) -> None:
        """Physically purge the records from both projections (delete + merge / rewrite)."""
        lexical = self.lexical(scope_ref)
        lexical.delete(record_ids)
        lexical.set_cursor(str(cursor))
        vectors = self.vectors(scope_ref)
        vectors.delete(record_ids)
        vectors.set_cursor(str(cursor))
        vectors.save()

    def rebuild(
        self,
        scope_ref: str,
        docs: Iterable[LexicalDoc],
        vectors: tuple[list[str], np.ndarray] | None,
        cursor: int,
    ) -> None:
        with self._lock:
            for cache in (self._lexical, self._vectors):
                _close(cache.pop(scope_ref, None))
            # Not ignore_errors: a file left behind may hold a forgotten record, and the caller
            # reports a purge complete only when this rebuild succeeded.
            _remove_tree(self.scope_dir(scope_ref))
        lexical = self.lexical(scope_ref)
        lexical.upsert(list(docs))
        lexical.set_cursor(str(cursor))
        vindex = self.vectors(scope_ref)
        if vectors is not None and vectors[0]:
            vindex.upsert(vectors[0], vectors[1])
        if vectors is not None and self.model_digest is not None:
            vindex.set_model(self.model_digest)
        vindex.set_cursor(str(cursor))
        vindex.save()

    def lexical_description(self) -> dict:
        return self.lexical_config.describe()

    def close(self) -> None:
        with self._lock:
            for vectors in self._vectors.values():
                vectors.save()  # the unsaved tail (see add_vectors)
            for cache in (self._lexical, self._vectors):
                for index in cache.values():
                    _close(index)
                cache.clear()

    def replace_scope(self, scope_ref: str, built_dir: Path) -> None:
        """Swap in a scope directory built elsewhere (rebuild --verify builds aside first)."""
        with self._lock:
            for cache in (self._lexical, self._vectors):
                _close(cache.pop(scope_ref, None))
            live = self.scope_dir(scope_ref)
            old = live.with_name(live.name + ".old")
            _remove_tree(old)
            if live.exists():
                live.rename(old)
            shutil.move(str(built_dir), str(live))
            _remove_tree(old)


def _remove_tree(path: Path) -> None:
    """Remove a directory tree; a missing one is fine, any other failure raises."""
    if path.exists():
        shutil.rmtree(path)


def _close(index: object) -> None:
    close = getattr(index, "close", None)
    if close is not None:
        close()
