"""The peer: LanceDB hybrid search over the same documents, the same vectors and the same queries.

LanceDB's own pieces are used as shipped: its native full-text index (``create_fts_index``
with its defaults: simple tokenizer, lowercase, English stemming, stop words removed, ASCII
folding), flat (exact) cosine vector search -- no ANN index, like our engine below its HNSW
threshold -- and its ``RRFReranker`` (K=60, its default). Only the embedding is shared: the
peer gets the very vectors our engine stored (read back from the engine's store), and query
vectors come from the engine's embedder, so model differences cannot explain any gap.

Optional: ``lancedb`` is the ``engram-memory[bench]`` extra. ``unavailable()`` says why not.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

# lance logs a deprecation WARN per hybrid sub-query (score auto-projection); its logger reads
# LANCEDB_LOG once, at import, so set it before lancedb is first imported.
os.environ.setdefault("LANCEDB_LOG", "error")

NAME = "lancedb"
TABLE = "docs"


def unavailable() -> str | None:
    """None if the peer can run, else the reason it is skipped."""
    try:
        import lancedb  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:
        return f"lancedb not importable ({exc}); pip install 'engram-memory[bench]'"
    return None


def peer_version() -> str:
    try:
        return version("lancedb")
    except PackageNotFoundError:
        return "unknown"


class LancePeer:
    def __init__(self, root: Path, ids: Sequence[str], texts: Sequence[str], vectors: np.ndarray,
                 rrf_k: int = 60) -> None:
        import lancedb
        import pyarrow as pa
        from lancedb.rerankers import RRFReranker

        if not (len(ids) == len(texts) == len(vectors)):
            raise ValueError("ids, texts and vectors differ in length")
        shutil.rmtree(root, ignore_errors=True)  # a peer table is rebuilt per run: it is cheap
        self.db = lancedb.connect(str(root))
        vecs = np.ascontiguousarray(vectors, dtype=np.float32)
        dim = vecs.shape[1]
        table = pa.table({
            "id": pa.array(list(ids), pa.string()),
            "text": pa.array(list(texts), pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vecs.reshape(-1), pa.float32()), dim),
        })
        self.table = self.db.create_table(TABLE, data=table, mode="overwrite")
        self.table.create_fts_index("text", replace=True)
        self.reranker = RRFReranker(K=rrf_k)

    @staticmethod
    def _pairs(rows: list[dict[str, Any]], key: str, negate: bool = False) -> list[tuple[str, float]]:
        return [(r["id"], -float(r[key]) if negate else float(r[key])) for r in rows]

    def fts(self, query: str, k: int) -> list[tuple[str, float]]:
        rows = self.table.search(query, query_type="fts").select(["id", "_score"]).limit(k).to_list()
        return self._pairs(rows, "_score")

    def vector(self, qvec: np.ndarray, k: int) -> list[tuple[str, float]]:
        search: Any = self.table.search(np.asarray(qvec, np.float32), query_type="vector")  # a vector builder
        rows = search.distance_type("cosine").select(["id", "_distance"]).limit(k).to_list()
        return self._pairs(rows, "_distance", negate=True)  # cosine distance: smaller is closer

    def hybrid(self, query: str, qvec: np.ndarray, k: int) -> list[tuple[str, float]]:
        search: Any = self.table.search(query_type="hybrid").vector(np.asarray(qvec, np.float32)).text(query)
        rows = search.distance_type("cosine").select(["id"]).rerank(self.reranker).limit(k).to_list()
        return self._pairs(rows, "_relevance_score")

    def close(self) -> None:
        del self.table, self.db  # lancedb holds no file handle to release; drop the references
