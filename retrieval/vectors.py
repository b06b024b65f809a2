"""Semantic channel storage: cosine search over one scope directory, exact or HNSW.

* The authoritative data is ``vectors.npy`` (float32, unit-norm rows) + ``ids.json`` (row order).
  ``state.json`` is written last and names the digests of the other files, so a torn save is
  detected on open (the projection then reopens empty with cursor None, and the store replays).
* Below ``hnsw_threshold`` live items the search is exact (numpy). At or above it an hnswlib
  graph (labels = row numbers) proposes candidates. Either way the returned scores are
  recomputed canonically -- a float64 dot product of the stored float32 vectors (exact products,
  numpy pairwise sum per row, no BLAS) -- and sorted by (-score, id), so scores and ties never
  depend on BLAS kernels, threads, row order or graph layout.
* The exact vectors are held once: in exact mode as a numpy matrix, in HNSW mode only inside the
  graph (hnswlib keeps each inserted float32 vector as given, space "ip"), from which the exact
  rescoring reads its candidates (``get_items``) and a save writes vectors.npy block by block.
* The graph is built single-threaded with a fixed seed from rows sorted by id, so a rebuild is
  bit-reproducible. Incremental upserts insert into the existing graph (deterministic for the
  same operation sequence, but not identical to a rebuild).
* Purge: in exact mode a delete removes the row. In HNSW mode rebuilding the graph costs ~24 s at
  50k rows, so a delete overwrites the point in place instead -- its row and its graph data are
  zeroed (hnswlib updates the existing label), the label is marked deleted, its id blanked -- and
  the graph is rebuilt only once a tenth of the rows are such holes. Either way ``save()``
  replaces every file, so afterwards no file in the directory holds the deleted vector's bytes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np

from engram_memory.retrieval._files import atomic_write, read_json, replace_from_path, sha256_file, write_json

log = logging.getLogger(__name__)

VECTORS = "vectors.npy"
IDS = "ids.json"
GRAPH = "hnsw.bin"
STATE = "state.json"
STATE_FORMAT = 1
HNSWLIB_VERSION = version("hnswlib")
# Measured on the 2-vCPU box, 384-d clustered unit vectors: exact search costs ~0.55 ms at 10k,
# ~1.2 ms at 20k and ~7 ms at 50k (the query embedding itself costs ~29 ms); HNSW answers in
# 0.3-0.6 ms but a full single-threaded build takes ~3 s at 10k, ~7 s at 20k, ~24 s at 50k (so a
# delete punches a hole in place instead, see the module doc). Exact up to 50k keeps recall exact
# and rebuilds byte-identical where the latency is still negligible.
HOLE_FRACTION = 10  # HNSW mode: rebuild the graph once more than 1/10 of its rows are purged holes
# float32 dot products of unit vectors in 384-d differ from the exact value by < 3e-5; any
# candidate within this margin of the k-th float32 score is rescored canonically.
_EXACT_MARGIN = 1e-4
SCORE_BLOCK = 128  # rows rescored per float64 block (canonical_scores)
SAVE_BLOCK = 4096  # rows copied out of the HNSW graph at a time (a save, an exact fallback)
# Resident-memory estimate (resident_bytes): per row, its id string, list slot and dict entry; per
# graph element, hnswlib's level-0 links (2M ids + count) and label, its label map entry and the
# upper levels' links (~1/M of the elements, M ids each), beside the vector it holds.
ID_BYTES = 160
GRAPH_OVERHEAD_BYTES = 64


class VectorIndexError(RuntimeError):
    """Invalid vectors or an unusable projection directory."""


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """Unit-normalise float32 rows; the norm is taken in float64 from exact squares.

    BLAS-free (numpy's per-row pairwise sum), so the stored bytes of a vector do not depend
    on batch shape, row position or threading.
    """
    x = np.asarray(vectors, dtype=np.float32)
    if x.ndim != 2:
        raise VectorIndexError("vectors must be a 2-D array")
    if not np.all(np.isfinite(x)):
        raise VectorIndexError("vectors must be finite")
    wide = x.astype(np.float64)
    norms = np.sqrt(np.multiply(wide, wide).sum(axis=1))
    if np.any(norms == 0.0):
        raise VectorIndexError("zero vector cannot be indexed for cosine similarity")
    return (wide / norms[:, None]).astype(np.float32)


def canonical_scores(rows: np.ndarray, qvec: np.ndarray) -> list[float]:
    """Cosine scores recomputed without BLAS: float32×float32 products are exact in float64 and
    each row is reduced by numpy's pairwise sum, so a score depends only on the two vectors."""
    q = qvec.astype(np.float64)
    out = np.empty(len(rows))
    # In blocks: each row reduces on its own, so the bits do not change, and a search's thousand
    # candidate rows no longer leave two 3 MiB float64 temporaries in the heap.
    for start in range(0, len(rows), SCORE_BLOCK):
        block = rows[start:start + SCORE_BLOCK].astype(np.float64)
        np.multiply(block, q, out=block)
        out[start:start + SCORE_BLOCK] = block.sum(axis=1)
    return out.tolist()


class VectorIndex:
    """Cosine-similarity projection for one scope. Thread-safe; one instance per directory."""

    def __init__(
        self,
        path: Path,
        dim: int,
        *,
        hnsw_threshold: int,
        ef_search: int,
        M: int,
        ef_construction: int,
        seed: int,
    ) -> None:
        if dim < 1 or hnsw_threshold < 1 or ef_search < 1 or M < 2 or ef_construction < 1:
            raise ValueError("invalid vector index parameters")
        self._path = path
        self._dim = dim
        self._threshold = hnsw_threshold
        self._ef_search = ef_search
        self._M = M
        self._ef_construction = ef_construction
        self._seed = seed
        self._lock = threading.RLock()
        # Exact mode: capacity rows, the first _n live. HNSW mode: empty -- the graph holds the vectors.
        self._mat = np.zeros((0, dim), dtype=np.float32)
        self._n = 0
        self._ids: list[str] = []
        self._rows: dict[str, int] = {}  # live ids only
        self._holes: set[int] = set()  # purged rows kept as graph labels (HNSW mode), id ""
        self._graph: hnswlib.Index | None = None
        self._cursor: str | None = None
        self._model: str | None = None  # digest of the model whose vectors these are (None: not said)
        self._dirty = False
        self._unsaved = 0  # rows upserted since the last save

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path,
        dim: int,
        *,
        hnsw_threshold: int,
        ef_search: int = 128,
        M: int = 16,
        ef_construction: int = 200,
        seed: int = 100,
    ) -> VectorIndex:
        """Open (or create) the projection in ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        index = cls(
            path,
            dim,
            hnsw_threshold=hnsw_threshold,
            ef_search=ef_search,
            M=M,
            ef_construction=ef_construction,
            seed=seed,
        )
        index._load()
        return index

    @property
    def path(self) -> Path:
        return self._path

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def kind(self) -> str:
        return "hnsw" if self._graph is not None else "exact"

    @property
    def cursor(self) -> str | None:
        """Journal cursor of the in-memory state; persisted by ``save()`` together with the data."""
        return self._cursor

    def set_cursor(self, cursor: str) -> None:
        if not isinstance(cursor, str):
            raise TypeError("cursor must be a string")
        with self._lock:
            self._cursor = cursor
            self._dirty = True

    @property
    def model(self) -> str | None:
        """Digest of the embedding model whose vectors the index holds (persisted by ``save()``)."""
        return self._model

    def set_model(self, model_digest: str) -> None:
        """Name the model of the vectors: an index holds one model's, never two (the engine
        rebuilds an index of another model from the store's vectors of its own)."""
        with self._lock:
            if self._model != model_digest:
                self._model = model_digest
                self._dirty = True

    def count(self) -> int:
        """Live vectors (purged holes not counted)."""
        return self._n - len(self._holes)

    @property
    def unsaved(self) -> int:
        return self._unsaved

    def contains(self, record_id: str) -> bool:
        return record_id in self._rows

    def resident_bytes(self) -> int:
        """Estimated memory this index holds: its matrix (capacity rows), the HNSW graph
        (allocated elements, each with its own copy of the vector) and the ids."""
        with self._lock:
            size = self._mat.nbytes + len(self._ids) * ID_BYTES
            if self._graph is not None:
                per = self._dim * 4 + (2 * self._M + 1) * 4 + 8 + GRAPH_OVERHEAD_BYTES
                size += self._graph.get_max_elements() * per
            return size

    def describe(self) -> dict[str, object]:
        """What a rank receipt needs to name this channel's engine."""
        return {
            "engine": "hnswlib" if self._graph is not None else "numpy-exact",
            "engine_version": HNSWLIB_VERSION if self._graph is not None else np.__version__,
            "kind": self.kind,
            "metric": "cosine",
            "dim": self._dim,
            "hnsw": self._params(),
            "count": self.count(),
            "cursor": self._cursor,
        }

    # -- writes ------------------------------------------------------------------------------

    def upsert(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Insert or replace vectors (the last one wins for a repeated id); rows are normalised."""
        if isinstance(ids, str):
            raise TypeError("upsert takes a sequence of ids, not a string")
        ids = list(ids)
        x = np.asarray(vectors)
        if x.ndim != 2 or x.shape != (len(ids), self._dim):
            raise VectorIndexError(f"vectors must have shape ({len(ids)}, {self._dim})")
        if any(not isinstance(i, str) or not i for i in ids):
            raise VectorIndexError("ids must be non-empty strings")
        if not ids:
            return
        unit = normalize_rows(x)
        last = {rid: pos for pos, rid in enumerate(ids)}
        with self._lock:
            order = sorted(last)  # deterministic insertion order within a batch
            new = [rid for rid in order if rid not in self._rows]
            if self._graph is None:
                self._reserve(self._n + len(new))
            touched: list[int] = []
            for rid in order:
                row = self._rows.get(rid)
                if row is None:
                    row = self._n
                    self._n += 1
                    self._ids.append(rid)
                    self._rows[rid] = row
                if self._graph is None:
                    self._mat[row] = unit[last[rid]]
                touched.append(row)
            if self._graph is not None:
                self._ensure_graph_capacity(self._n)
                labels = np.asarray(touched, dtype=np.int64)
                self._graph.add_items(unit[[last[rid] for rid in order]], labels, num_threads=1)
            elif self._n >= self._threshold:
                self._build_graph()
            self._dirty = True
            self._unsaved += len(order)

    def delete(self, ids: Sequence[str]) -> None:
        """Remove vectors from memory (see the module doc for HNSW mode); ``save()`` purges files."""
        if isinstance(ids, str):
            raise TypeError("delete takes a sequence of ids, not a string")
        with self._lock:
            doomed = {rid for rid in ids if rid in self._rows}
            if not doomed:
                return
            if self._graph is not None and len(self._holes) + len(doomed) <= self._n // HOLE_FRACTION:
                self._punch_holes(sorted(self._rows[rid] for rid in doomed))
            else:
                keep = [row for row, rid in enumerate(self._ids) if rid and rid not in doomed]
                self._set_rows([self._ids[r] for r in keep], self._matrix()[keep])
                self._graph = None
                if self._n >= self._threshold:
                    self._build_graph()
            self._dirty = True

    def _punch_holes(self, rows: list[int]) -> None:
        assert self._graph is not None
        labels = np.asarray(rows, dtype=np.int64)
        # add_items on an existing label overwrites its stored vector (and repairs its links);
        # mark_deleted alone would leave the bytes in the graph.
        self._graph.add_items(np.zeros((len(rows), self._dim), dtype=np.float32), labels, num_threads=1)
        for row in rows:
            self._graph.mark_deleted(row)
            del self._rows[self._ids[row]]
            self._ids[row] = ""
            self._holes.add(row)

    def rebuild(self) -> None:
        """Canonical state: rows sorted by id, graph (if any) rebuilt from scratch."""
        with self._lock:
            self._drop_graph()
            if self.count() >= self._threshold:
                self._build_graph()
            else:
                self._sort_rows()
            self._dirty = True

    def clear(self) -> None:
        """Drop everything, forget the cursor and purge the files at once."""
        with self._lock:
            self._set_rows([], np.zeros((0, self._dim), dtype=np.float32))
            self._graph = None
            self._cursor = None
            self._model = None
            self._dirty = True
            self.save()

    def save(self) -> None:
        """Persist atomically: each file via temp + ``os.replace``, ``state.json`` last.

        A no-op when nothing changed since the last save or load.
        """
        with self._lock:
            if not self._dirty:
                return
            atomic_write(self._path / VECTORS, self._write_matrix)
            ids_bytes = json.dumps(self._ids, ensure_ascii=False).encode("utf-8")
            atomic_write(self._path / IDS, lambda fh: fh.write(ids_bytes))
            graph_file = self._path / GRAPH
            if self._graph is not None:
                graph = self._graph
                replace_from_path(graph_file, lambda tmp: graph.save_index(str(tmp)))
            elif graph_file.exists():
                graph_file.unlink()
            files = {VECTORS: sha256_file(self._path / VECTORS), IDS: sha256_file(self._path / IDS)}
            if self._graph is not None:
                files[GRAPH] = sha256_file(graph_file)
            state = {
                "format": STATE_FORMAT,
                "dim": self._dim,
                "count": self._n,
                "kind": self.kind,
                "hnsw": self._params(),
                "graph": self._graph_params(),
                "cursor": self._cursor,
                "files": files,
            }
            if self._model is not None:
                state["model"] = self._model
            write_json(self._path / STATE, state)
            self._dirty = False
            self._unsaved = 0

    # -- reads -------------------------------------------------------------------------------

    def search(self, qvec: np.ndarray, k: int) -> list[tuple[str, float]]:
        """Top ``k`` (clamped to [1, live items]) as ``(id, cosine)`` sorted by (-cosine, id)."""
        q = np.asarray(qvec, dtype=np.float32).reshape(-1)
        if q.shape != (self._dim,):
            raise VectorIndexError(f"query vector must have {self._dim} dimensions")
        q = normalize_rows(q[None, :])[0]
        with self._lock:
            live = self.count()
            if live == 0:
                return []
            k = max(1, min(int(k), live))
            rows = self._graph_candidates(q, k) if self._graph is not None else None
            if rows is None:
                rows = self._exact_candidates(q, k)
            scores = canonical_scores(self._rows_of(rows), q)
            ranked = sorted(zip((self._ids[r] for r in rows), scores, strict=True), key=_rank_key)
            return ranked[:k]

    # -- internals ---------------------------------------------------------------------------

    def _exact_candidates(self, q: np.ndarray, k: int) -> np.ndarray:
        # numpy's own loop, not BLAS: OpenBLAS's 2-thread gemv costs a flat ~8 ms whenever the
        # other core is busy (thread hand-off), while this stays ~0.55 ms per 10k rows.
        approx = np.einsum("ij,j->i", self._matrix(), q)
        if self._holes:
            approx[list(self._holes)] = -np.inf  # purged rows never rank
        live = self.count()
        if k >= live:
            return np.flatnonzero(approx > -np.inf) if self._holes else np.arange(self._n)
        kth = np.partition(approx, self._n - k)[self._n - k]
        return np.flatnonzero(approx >= kth - _EXACT_MARGIN)

    def _graph_candidates(self, q: np.ndarray, k: int) -> np.ndarray | None:
        assert self._graph is not None
        want = min(self.count(), max(k, self._ef_search))
        self._graph.set_ef(max(self._ef_search, want))
        try:
            labels, _ = self._graph.knn_query(q[None, :], k=want, num_threads=1)
        except RuntimeError:
            # The graph could not return `want` neighbours; exact search is always available.
            log.warning("hnsw returned too few neighbours; answering exactly")
            return None
        return labels[0].astype(np.int64)

    def _params(self) -> dict[str, int]:
        return {**self._graph_params(), "threshold": self._threshold, "ef_search": self._ef_search}

    def _graph_params(self) -> dict[str, int]:
        # What shapes the saved graph; ef_search and the threshold do not.
        return {"M": self._M, "ef_construction": self._ef_construction, "seed": self._seed}

    def _reserve(self, rows: int) -> None:
        if rows <= len(self._mat):
            return
        grown = np.zeros((max(rows, 2 * len(self._mat), 1024), self._dim), dtype=np.float32)
        grown[: self._n] = self._mat[: self._n]
        self._mat = grown

    def _set_rows(self, ids: list[str], mat: np.ndarray) -> None:
        self._ids = ids
        self._rows = {rid: row for row, rid in enumerate(ids) if rid}
        self._holes = {row for row, rid in enumerate(ids) if not rid}
        self._mat = np.ascontiguousarray(mat, dtype=np.float32)
        self._n = len(ids)

    def _sort_rows(self) -> None:
        """Live rows sorted by id (holes dropped): the canonical layout."""
        order = sorted((r for r in range(self._n) if self._ids[r]), key=self._ids.__getitem__)
        self._set_rows([self._ids[r] for r in order], self._matrix()[order])

    def _build_graph(self) -> None:
        self._sort_rows()
        graph = hnswlib.Index(space="ip", dim=self._dim)  # rows are unit-norm: ip == cosine
        graph.init_index(
            max_elements=max(self._n, 1),
            ef_construction=self._ef_construction,
            M=self._M,
            random_seed=self._seed,
        )
        graph.add_items(self._mat[: self._n], np.arange(self._n, dtype=np.int64), num_threads=1)
        graph.set_ef(self._ef_search)
        self._graph = graph
        self._mat = np.zeros((0, self._dim), dtype=np.float32)  # the graph holds them now

    def _drop_graph(self) -> None:
        """Back to a matrix: the graph's vectors copied out (exact mode, or before a rebuild)."""
        if self._graph is not None:
            self._mat = self._matrix()
            self._graph = None

    def _rows_of(self, rows: np.ndarray) -> np.ndarray:
        """The stored float32 vectors of ``rows`` (a purged hole reads as zeros)."""
        if self._graph is None:
            return self._mat[rows]
        out = np.zeros((len(rows), self._dim), dtype=np.float32)
        live = [i for i, row in enumerate(rows.tolist()) if row not in self._holes]
        if live:
            out[live] = np.asarray(self._graph.get_items(rows[live], return_type="numpy"), dtype=np.float32)
        return out

    def _matrix(self) -> np.ndarray:
        """All _n stored rows as one matrix (a copy out of the graph in HNSW mode)."""
        if self._graph is None:
            return self._mat[: self._n]
        return np.concatenate([self._rows_of(np.arange(start, min(start + SAVE_BLOCK, self._n), dtype=np.int64))
                               for start in range(0, self._n, SAVE_BLOCK)] or [self._mat[:0]])

    def _write_matrix(self, fh: Any) -> None:
        """vectors.npy, as np.save writes it, block by block: HNSW mode never copies the whole matrix."""
        if self._graph is None:
            np.save(fh, np.ascontiguousarray(self._mat[: self._n]), allow_pickle=False)
            return
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)), "fortran_order": False,
                  "shape": (self._n, self._dim)}
        np.lib.format.write_array_header_1_0(fh, header)
        for start in range(0, self._n, SAVE_BLOCK):
            fh.write(self._rows_of(np.arange(start, min(start + SAVE_BLOCK, self._n), dtype=np.int64)).tobytes())

    def _ensure_graph_capacity(self, rows: int) -> None:
        assert self._graph is not None
        capacity = self._graph.get_max_elements()
        if rows > capacity:
            self._graph.resize_index(max(rows, 2 * capacity))

    # -- loading -----------------------------------------------------------------------------

    def _load(self) -> None:
        # A save cut short by a crash leaves its temp file (atomic_write's ".<name>.tmp"): it may
        # hold vectors deleted since, and no later save rewrites the graph's once in exact mode.
        for name in (VECTORS, IDS, GRAPH, STATE):
            (self._path / f".{name}.tmp").unlink(missing_ok=True)
        state_file = self._path / STATE
        if not state_file.exists():
            if any((self._path / name).exists() for name in (VECTORS, IDS, GRAPH)):
                self._discard("data files without state.json")
            return
        try:
            state = read_json(state_file)
            if state.get("format") != STATE_FORMAT or state.get("dim") != self._dim:
                raise VectorIndexError("state format or dimension differs")
            files = state["files"]
            for name in (VECTORS, IDS):
                if sha256_file(self._path / name) != files[name]:
                    raise VectorIndexError(f"{name} does not match state.json")
            # Mapped, not read: in HNSW mode the graph holds the vectors and the matrix is dropped.
            mat = np.load(self._path / VECTORS, allow_pickle=False, mmap_mode="r")
            ids = json.loads((self._path / IDS).read_bytes().decode("utf-8"))
            live_ids = [i for i in ids if i]
            if mat.dtype != np.float32 or mat.shape != (len(ids), self._dim) or len(set(live_ids)) != len(live_ids):
                raise VectorIndexError("vectors and ids disagree")
        except (OSError, ValueError, KeyError, TypeError, VectorIndexError) as exc:
            self._discard(str(exc))
            return
        self._set_rows(list(ids), mat if len(ids) >= self._threshold else np.array(mat))
        self._cursor = state.get("cursor")
        model = state.get("model")
        self._model = model if isinstance(model, str) else None
        if self._n >= self._threshold:  # rows, holes included: the saved graph has one label each
            self._load_graph(state)
        elif self._holes:
            self._sort_rows()  # holes only exist beside a graph; exact mode drops them
            self._dirty = True

    def _load_graph(self, state: dict) -> None:
        graph_file = self._path / GRAPH
        digest = state["files"].get(GRAPH)
        if state.get("graph") != self._graph_params() or digest is None or not graph_file.exists():
            self._build_graph()  # parameters changed or no graph saved: canonical rebuild
            self._dirty = True
            return
        if sha256_file(graph_file) != digest:
            log.warning("hnsw graph in %s does not match state.json; rebuilding", self._path)
            self._build_graph()
            self._dirty = True
            return
        graph = hnswlib.Index(space="ip", dim=self._dim)
        graph.load_index(str(graph_file), max_elements=self._n)
        graph.set_ef(self._ef_search)  # ef is not persisted by hnswlib
        self._graph = graph
        self._mat = np.zeros((0, self._dim), dtype=np.float32)  # the graph holds the vectors

    def _discard(self, reason: str) -> None:
        # Unverifiable data may include vectors that were since deleted: purge it, start empty.
        log.warning("vector projection in %s discarded (%s); cursor reset", self._path, reason)
        for name in (VECTORS, IDS, GRAPH, STATE):
            (self._path / name).unlink(missing_ok=True)
        self._dirty = True


def _rank_key(hit: tuple[str, float]) -> tuple[float, str]:
    return (-hit[1], hit[0])
