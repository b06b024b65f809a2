"""Per-scope search projections (one Tantivy index and one vector index per tenant/workspace).

Each scope gets its own directory, so a search can never rank another scope's record and
index statistics never mix scopes. Projections are derived data: the store can always
rebuild them, and each records the journal cursor it reflects.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections import OrderedDict
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
    read_cursor,
)
from engram_memory.retrieval.vectors import VectorIndex

SAVE_MIN_ROWS = 256
# What one resident scope costs beside its vectors (the estimate a memory budget is kept by):
# an open Tantivy index with its writer and reader, measured at ~2.9 MiB RSS each (40 indexes
# opened in one process on the 2-core box), plus its files (memory-mapped: counted whole, an upper
# bound of the pages a search touches); and per live record, the engine's scope view (a window,
# its timeline entry, the id strings) -- the view is loaded and dropped with the projections.
LEXICAL_OPEN_BYTES = 3 << 20
VIEW_BYTES_PER_RECORD = 400


def scope_dirname(scope_ref: str) -> str:
    return hashlib.sha256(scope_ref.encode("utf-8")).hexdigest()[:32]


class Projections:
    def __init__(
        self,
        root: Path,
        dim: int = 384,
        hnsw_threshold: int = HNSW_THRESHOLD,
        lexical_config: LexicalConfig = REFERENCE_PROFILE,
        memory_budget: int | None = None,
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
        # Memory budget (bytes; None: every scope used stays resident). Resident scopes, least
        # recently used first; a scope loaded by a write or the watcher, not a read, goes first.
        self.memory_budget = memory_budget
        self._order: OrderedDict[str, None] = OrderedDict()
        self._sizes: dict[str, int] = {}  # estimated resident bytes per scope (resident_bytes)
        self._reset: set[str] = set()  # scopes whose lexical index of an earlier format was discarded
        self.evictions = 0
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
                    self._reset.add(scope_ref)
                self._lexical[scope_ref] = index
                self._loaded(scope_ref)
            return self._lexical[scope_ref]

    def vectors(self, scope_ref: str) -> VectorIndex:
        with self._lock:
            if scope_ref not in self._vectors:
                self._vectors[scope_ref] = VectorIndex.open(
                    self.scope_dir(scope_ref) / "vectors", self.dim, hnsw_threshold=self.hnsw_threshold
                )
                self._loaded(scope_ref)
            return self._vectors[scope_ref]

    # -- the memory budget ---------------------------------------------------------------------
    #
    # The engine marks a scope used at each read, and trims under its write lock (no read is in
    # flight then, so no search holds an index being closed). An evicted scope's files are saved
    # first; its next use reopens them: the same files, so the same answers and receipts.

    def _loaded(self, scope_ref: str) -> None:
        self._sizes.pop(scope_ref, None)
        if scope_ref not in self._order:
            self._order[scope_ref] = None
            self._order.move_to_end(scope_ref, last=False)  # loaded, not yet read: the first to go

    def use(self, scope_ref: str) -> None:
        """A read of the scope: both projections open, the scope the most recently used."""
        with self._lock:
            self.lexical(scope_ref)
            self.vectors(scope_ref)
            self._order.move_to_end(scope_ref)

    def resident(self, scope_ref: str) -> bool:
        """Both projections of the scope are open (and none was found of an earlier format)."""
        return scope_ref in self._lexical and scope_ref in self._vectors and scope_ref not in self._reset

    def take_reset(self, scope_ref: str) -> bool:
        """True once after the scope's lexical index of an earlier format was discarded (rebuild it)."""
        with self._lock:
            found = scope_ref in self._reset
            self._reset.discard(scope_ref)
            return found

    def lexical_cursor(self, scope_ref: str) -> str | None:
        """The lexical projection's journal cursor, read from its file when the scope is not resident."""
        with self._lock:
            index = self._lexical.get(scope_ref)
            if index is not None:
                return index.cursor
        return read_cursor(self.scope_dir(scope_ref) / "lexical")

    def resident_bytes(self, scope_ref: str | None = None) -> int:
        """Estimated memory of one resident scope's projections and view (0: not resident), or of all."""
        with self._lock:
            if scope_ref is None:
                return sum(self.resident_bytes(scope) for scope in list(self._order))
            if scope_ref not in self._order:
                return 0
            size = self._sizes.get(scope_ref)
            if size is None:
                size = 0
                lexical = self._lexical.get(scope_ref)
                if lexical is not None:
                    size += LEXICAL_OPEN_BYTES + _tree_bytes(lexical.path)
                vectors = self._vectors.get(scope_ref)
                if vectors is not None:
                    size += vectors.resident_bytes() + VIEW_BYTES_PER_RECORD * vectors.count()
                self._sizes[scope_ref] = size
            return size

    def resident_scopes(self) -> list[str]:
        """Resident scopes, least recently used first."""
        with self._lock:
            return list(self._order)

    def trim(self, keep: str | None = None) -> list[str]:
        """Evict the least recently used scopes (never ``keep``) until the estimate fits the budget.
        The caller holds the engine's write lock. Returns the scopes evicted."""
        if self.memory_budget is None:
            return []
        with self._lock:
            if keep is not None:
                self._sizes.pop(keep, None)  # re-measured: it may have grown since
            total = self.resident_bytes()
            evicted = []
            for scope in list(self._order):
                if total <= self.memory_budget:
                    break
                if scope == keep:
                    continue
                total -= self.resident_bytes(scope)
                self.evict(scope)
                evicted.append(scope)
            return evicted

    def evict(self, scope_ref: str) -> None:
        """Save and close the scope's projections; its next use reopens them from its directory."""
        with self._lock:
            vectors = self._vectors.get(scope_ref)
            if vectors is not None:
                vectors.save()  # the unsaved tail (see add_vectors)
            self._drop(scope_ref)
            self.evictions += 1

    def _drop(self, scope_ref: str) -> None:
        for cache in (self._lexical, self._vectors):
            _close(cache.pop(scope_ref, None))
        self._order.pop(scope_ref, None)
        self._sizes.pop(scope_ref, None)

    def add_lexical(self, scope_ref: str, docs: list[LexicalDoc], cursor: int) -> None:
        index = self.lexical(scope_ref)
        index.upsert(docs)
        index.set_cursor(str(cursor))
        self._sizes.pop(scope_ref, None)

    def add_vectors(self, scope_ref: str, ids: list[str], vectors: np.ndarray, cursor: int) -> None:
        """Index vectors at once; persist them in spread-out saves.

        A save rewrites vectors.npy (and the HNSW graph): O(n), about a second at 100k rows, too
        much for every admission. DuckDB holds every vector, so the files may lag: they are saved
        once a twentieth of the index (at least SAVE_MIN_ROWS rows) is unsaved, at every purge and
        at close; after a crash the next open re-adds the missing tail from DuckDB."""
        index = self.vectors(scope_ref)
        index.upsert(ids, vectors)
        index.set_cursor(str(cursor))
        self._sizes.pop(scope_ref, None)
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
        self._sizes.pop(scope_ref, None)

    def rebuild(
        self,
        scope_ref: str,
        docs: Iterable[LexicalDoc],
        vectors: tuple[list[str], np.ndarray] | None,
        cursor: int,
    ) -> None:
        with self._lock:
            self._drop(scope_ref)
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
            self._order.clear()
            self._sizes.clear()

    def replace_scope(self, scope_ref: str, built_dir: Path) -> None:
        """Swap in a scope directory built elsewhere (rebuild --verify builds aside first)."""
        with self._lock:
            self._drop(scope_ref)
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


def _tree_bytes(path: Path) -> int:
    """Total size of the files under ``path`` (0 when it is missing)."""
    total = 0
    for item in path.rglob("*") if path.exists() else ():
        try:
            total += item.stat().st_size if item.is_file() else 0
        except OSError:
            pass  # a file a merge removed meanwhile
    return total


def _close(index: object) -> None:
    close = getattr(index, "close", None)
    if close is not None:
        close()
