"""retrieval.vectors: exact and HNSW cosine search, canonical scores, atomic saves, purge."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import pytest

from engram_memory.retrieval.vectors import (
    GRAPH,
    IDS,
    STATE,
    VECTORS,
    VectorIndex,
    VectorIndexError,
    canonical_scores,
    normalize_rows,
)
from tests.retrieval_fixtures import files_containing

DIM = 32


def clustered(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(4, n // 25), dim)).astype(np.float32)
    x = centres[rng.integers(0, len(centres), n)] + 0.4 * rng.standard_normal((n, dim)).astype(np.float32)
    return x.astype(np.float32)


def ids_for(n: int) -> list[str]:
    return [f"mem_{i:05d}" for i in range(n)]


def open_index(path: Path, threshold: int, **kw) -> VectorIndex:
    return VectorIndex.open(path, DIM, hnsw_threshold=threshold, **kw)


def brute_force(x: np.ndarray, ids: list[str], q: np.ndarray, k: int) -> list[str]:
    unit = normalize_rows(x)
    scores = canonical_scores(unit, normalize_rows(q[None, :])[0])
    return [rid for rid, _ in sorted(zip(ids, scores, strict=True), key=lambda h: (-h[1], h[0]))[:k]]


@pytest.mark.parametrize("threshold", [10**6, 50], ids=["exact", "hnsw"])
def test_search_returns_sorted_cosines(tmp_path: Path, threshold: int) -> None:
    x, ids = clustered(200), ids_for(200)
    ix = open_index(tmp_path / "v", threshold)
    ix.upsert(ids, x)
    assert ix.kind == ("exact" if threshold > 200 else "hnsw")
    q = x[17]
    hits = ix.search(q, 10)
    assert hits[0][0] == ids[17] and hits[0][1] == pytest.approx(1.0, abs=1e-6)
    assert hits == sorted(hits, key=lambda h: (-h[1], h[0]))
    assert all(type(s) is float for _, s in hits)
    want = np.sort(normalize_rows(x) @ normalize_rows(q[None, :])[0])[::-1][:10]
    assert np.allclose([s for _, s in hits], want, atol=1e-5)
    assert [rid for rid, _ in hits] == brute_force(x, ids, q, 10)


def test_k_is_clamped_to_live_items(tmp_path: Path) -> None:
    for threshold in (10**6, 3):
        ix = open_index(tmp_path / f"v{threshold}", threshold)
        assert ix.search(np.ones(DIM), 5) == []
        ix.upsert(ids_for(4), clustered(4))
        assert len(ix.search(np.ones(DIM), 100)) == 4  # hnswlib would raise for k > live items
        assert len(ix.search(np.ones(DIM), 0)) == 1
        ix.delete(["mem_00000"])
        assert len(ix.search(np.ones(DIM), 100)) == 3


@pytest.mark.parametrize("threshold", [10**6, 20], ids=["exact", "hnsw"])
def test_ties_and_scores_do_not_depend_on_insertion_order(tmp_path: Path, threshold: int) -> None:
    base = clustered(60, seed=4)
    x = np.vstack([base, np.repeat(base[:1], 6, axis=0)])  # six exact duplicates of row 0
    ids = ids_for(len(x))
    results = []
    for name, seed in (("a", None), ("b", 1), ("c", 2)):
        order = list(range(len(x)))
        if seed is not None:
            random.Random(seed).shuffle(order)
        ix = open_index(tmp_path / name, threshold)
        for start in range(0, len(order), 9):  # several batches, rows land in different positions
            part = order[start : start + 9]
            ix.upsert([ids[i] for i in part], x[part])
        ix.rebuild()
        results.append([ix.search(q, 5) for q in x[:10]])
    assert results[0] == results[1] == results[2]
    top = results[0][0]
    assert [rid for rid, _ in top[:5]] == sorted(rid for rid, _ in top[:5])  # 7 tied: lowest ids first
    assert len({s for _, s in top}) == 1


def test_canonical_scores_ignore_row_position_and_batch_shape() -> None:
    rng = np.random.default_rng(9)
    rows = normalize_rows(rng.standard_normal((257, 384)).astype(np.float32))
    q = normalize_rows(rng.standard_normal((1, 384)).astype(np.float32))[0]
    full = canonical_scores(rows, q)
    perm = rng.permutation(len(rows))
    permuted = canonical_scores(rows[perm], q)
    assert [full[i] for i in perm] == permuted
    assert [canonical_scores(rows[i : i + 1], q)[0] for i in range(0, 257, 16)] == full[0:257:16]
    # the float64 products of each row, summed by numpy's pairwise sum, in one piece: the scores the
    # receipts already carry (blocks of rows must not change a bit)
    assert full == np.multiply(rows.astype(np.float64), q.astype(np.float64)).sum(axis=1).tolist()
    one = normalize_rows(rows[5:6])
    assert one.tobytes() == normalize_rows(np.vstack([rows[:5], rows[5:6]]))[5:6].tobytes()


def test_hnsw_rebuild_is_bit_reproducible(tmp_path: Path) -> None:
    x, ids = clustered(300, seed=2), ids_for(300)
    digests = []
    for name, order in (("a", range(300)), ("b", reversed(range(300)))):
        order = list(order)
        ix = open_index(tmp_path / name, 100)
        ix.upsert([ids[i] for i in order], x[order])  # crosses the threshold: canonical build
        assert ix.kind == "hnsw"
        ix.save()
        digests.append({f: hashlib.sha256((tmp_path / name / f).read_bytes()).hexdigest() for f in (VECTORS, GRAPH)})
    assert digests[0] == digests[1]


def test_switches_between_exact_and_hnsw(tmp_path: Path) -> None:
    x, ids = clustered(30), ids_for(30)
    ix = open_index(tmp_path / "v", 25)
    ix.upsert(ids[:20], x[:20])
    assert ix.kind == "exact"
    ix.upsert(ids[20:], x[20:])
    assert ix.kind == "hnsw"
    ix.save()
    assert (tmp_path / "v" / GRAPH).exists()
    ix.delete(ids[:10])
    assert ix.kind == "exact" and ix.count() == 20
    ix.save()
    assert not (tmp_path / "v" / GRAPH).exists()


def test_hnsw_recall_against_exact(tmp_path: Path) -> None:
    x, ids = clustered(1500, seed=7), ids_for(1500)
    ix = open_index(tmp_path / "v", 1000)
    ix.upsert(ids, x)
    assert ix.kind == "hnsw"
    queries = clustered(40, seed=8)
    recall = np.mean(
        [len({r for r, _ in ix.search(q, 10)} & set(brute_force(x, ids, q, 10))) / 10 for q in queries]
    )
    assert recall >= 0.95


@pytest.mark.parametrize("threshold", [10**6, 20], ids=["exact", "hnsw"])
def test_save_load_roundtrip(tmp_path: Path, threshold: int) -> None:
    x, ids = clustered(50), ids_for(50)
    ix = open_index(tmp_path / "v", threshold)
    assert ix.cursor is None
    ix.upsert(ids, x)
    ix.set_cursor("17")
    ix.save()
    want = [ix.search(q, 7) for q in x[:5]]
    again = open_index(tmp_path / "v", threshold)
    assert again.cursor == "17" and again.count() == 50 and again.kind == ix.kind
    assert [again.search(q, 7) for q in x[:5]] == want
    again.upsert(["mem_new"], x[:1] * 2.0)  # grows past the loaded capacity
    assert again.search(x[0], 2)[0][1] == pytest.approx(1.0, abs=1e-6)


def test_unsaved_cursor_is_not_persisted(tmp_path: Path) -> None:
    ix = open_index(tmp_path / "v", 100)
    ix.upsert(["a"], clustered(1))
    ix.save()
    ix.set_cursor("9")  # cursor and data travel together: only save() persists them
    assert open_index(tmp_path / "v", 100).cursor is None


@pytest.mark.parametrize("threshold", [10**6, 20], ids=["exact", "hnsw"])
def test_delete_purges_vector_bytes_from_every_file(tmp_path: Path, threshold: int) -> None:
    path = tmp_path / "v"
    x, ids = clustered(60, seed=3), ids_for(60)
    ix = open_index(path, threshold)
    ix.upsert(ids, x)
    ix.save()
    secret = normalize_rows(x[13:14])[0]
    needles = [secret.astype(np.float32).tobytes(), x[13].astype(np.float32).tobytes()]
    assert files_containing(path, needles[:1])  # positive control: stored bytes are findable
    ix.delete([ids[13]])
    ix.save()
    assert files_containing(path, needles) == {}
    assert ids[13] not in {rid for rid, _ in ix.search(x[13], 60)}
    reopened = open_index(path, threshold)
    assert reopened.count() == 59 and not reopened.contains(ids[13])


def saved_index(tmp_path: Path, n: int, seed: int, threshold: int):
    """An index of ``n`` clustered vectors, saved once: the purge tests' starting point."""
    path = tmp_path / "v"
    x, ids = clustered(n, seed=seed), ids_for(n)
    ix = open_index(path, threshold)
    ix.upsert(ids, x)
    ix.save()
    return path, x, ids, ix


def test_replacing_a_vector_purges_the_old_bytes(tmp_path: Path) -> None:
    path, x, ids, ix = saved_index(tmp_path, 40, seed=5, threshold=20)
    old = normalize_rows(x[3:4])[0].tobytes()
    ix.upsert([ids[3]], x[4:5] + 1.0)  # in-place update of the hnsw point
    ix.save()
    assert files_containing(path, [old]) == {}


def test_torn_save_is_detected_and_purged(tmp_path: Path) -> None:
    path = tmp_path / "v"
    ix = open_index(path, 100)
    ix.upsert(ids_for(5), clustered(5))
    ix.set_cursor("5")
    ix.save()
    np.save(path / VECTORS, np.zeros((5, DIM), np.float32))  # data no longer matches state.json
    reopened = open_index(path, 100)
    assert reopened.count() == 0 and reopened.cursor is None
    assert not any((path / f).exists() for f in (VECTORS, IDS, STATE))


def test_clear_purges_files(tmp_path: Path) -> None:
    path = tmp_path / "v"
    ix = open_index(path, 3)
    x = clustered(5)
    ix.upsert(ids_for(5), x)
    ix.set_cursor("3")
    ix.save()
    ix.clear()
    assert ix.count() == 0 and ix.cursor is None and ix.kind == "exact"
    assert files_containing(path, [normalize_rows(x[:1])[0].tobytes()]) == {}
    assert open_index(path, 3).count() == 0


def test_rejects_bad_vectors(tmp_path: Path) -> None:
    ix = open_index(tmp_path / "v", 100)
    with pytest.raises(VectorIndexError):
        ix.upsert(["a"], np.ones((1, DIM + 1)))
    with pytest.raises(VectorIndexError):
        ix.upsert(["a", "b"], np.ones((1, DIM)))
    with pytest.raises(VectorIndexError):
        ix.upsert(["a"], np.full((1, DIM), np.nan))
    with pytest.raises(VectorIndexError):
        ix.upsert(["a"], np.zeros((1, DIM)))
    with pytest.raises(VectorIndexError):
        ix.upsert([""], np.ones((1, DIM)))
    with pytest.raises(VectorIndexError):
        ix.search(np.ones(DIM + 1), 3)
    with pytest.raises(TypeError):
        ix.delete("mem_00001")  # a bare string would delete ids 'm', 'e', ...
    assert ix.count() == 0
    ix.upsert(["a", "a"], np.vstack([np.ones(DIM), -np.ones(DIM)]))  # last one wins
    assert ix.count() == 1 and ix.search(-np.ones(DIM), 1)[0][1] == pytest.approx(1.0)


def test_dimension_change_discards_old_projection(tmp_path: Path) -> None:
    ix = open_index(tmp_path / "v", 100)
    ix.upsert(["a"], clustered(1))
    ix.save()
    other = VectorIndex.open(tmp_path / "v", DIM * 2, hnsw_threshold=100)
    assert other.count() == 0 and other.cursor is None


def test_graph_reuse_and_rebuild_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "v"
    x, ids = clustered(60, seed=6), ids_for(60)
    ix = open_index(path, 20)
    ix.upsert(ids, x)
    ix.save()
    graph_bytes = (path / GRAPH).read_bytes()
    same_graph = open_index(path, 30, ef_search=64)  # threshold/ef do not shape the graph: reuse it
    assert same_graph.kind == "hnsw"
    same_graph.save()  # nothing changed: no rewrite
    assert (path / GRAPH).read_bytes() == graph_bytes
    other = open_index(path, 20, M=8)  # a different graph parameter: canonical rebuild
    assert other.kind == "hnsw" and other.search(x[0], 1)[0][0] == ids[0]
    other.save()
    assert (path / GRAPH).read_bytes() != graph_bytes
    assert other.describe()["hnsw"]["M"] == 8 and other.describe()["kind"] == "hnsw"


def test_hnsw_delete_punches_a_hole_in_place_and_purges(tmp_path: Path) -> None:
    # HNSW mode: a forget must not rebuild the graph (~24 s at 50k) -- the point is zeroed and
    # marked deleted in place -- and still no file keeps the vector's bytes.
    path, x, ids, ix = saved_index(tmp_path, 100, seed=8, threshold=50)
    graph = ix._graph
    needles = [normalize_rows(x[21:22])[0].tobytes(), normalize_rows(x[22:23])[0].tobytes()]
    assert files_containing(path, needles[:1])
    ix.delete([ids[21], ids[22]])
    assert ix._graph is graph and ix.kind == "hnsw"  # no rebuild
    assert ix.count() == 98 and not ix.contains(ids[21])
    for q in (x[21], x[22], x[0]):
        got = ix.search(q, 98)
        assert len(got) == 98 and {ids[21], ids[22]}.isdisjoint(r for r, _ in got)
    assert [r for r, _ in ix.search(x[40], 5)] == brute_force(np.delete(x, [21, 22], 0),
                                                                ids[:21] + ids[23:], x[40], 5)
    ix.save()
    assert files_containing(path, needles) == {}
    assert ids[21].encode() not in (path / "ids.json").read_bytes()
    reopened = open_index(path, 50)
    assert reopened.kind == "hnsw" and reopened.count() == 98 and not reopened.contains(ids[22])
    assert reopened.search(x[0], 98) == ix.search(x[0], 98)
    exact = open_index(path, 10**6)  # threshold raised: exact mode drops the holes
    assert exact.kind == "exact" and exact.count() == 98
    assert exact.search(x[5], 10) == reopened.search(x[5], 10)
    # past a tenth of the rows in holes, the graph is rebuilt canonically without them
    reopened.delete(ids[30:40])
    assert reopened._graph is not None and reopened.count() == 88 and not reopened._holes
    reopened.upsert([ids[21]], x[21:22])  # a purged id may come back as a new row
    assert reopened.search(x[21], 1)[0][0] == ids[21]


def test_hnsw_holds_the_vectors_once_with_the_same_answers_and_files(tmp_path: Path) -> None:
    """Issue 39 §3: where HNSW serves a scope, the exact vectors live only in hnswlib's graph (the
    rescoring reads them with get_items); scores, answers and vectors.npy are those of the matrix."""
    n = 600
    x, ids = clustered(n, seed=7), ids_for(n)
    exact = open_index(tmp_path / "exact", threshold=10 * n)
    graph = open_index(tmp_path / "hnsw", threshold=100)
    for index in (exact, graph):
        index.upsert(ids[:300], x[:300])
        index.upsert(ids[300:], x[300:])
        index.upsert(ids[:3], x[3:6])  # replaced in place
        index.delete(ids[20:30])  # HNSW: purged holes
    assert graph.kind == "hnsw" and exact.kind == "exact"
    assert graph._mat.nbytes == 0  # no second copy beside the graph
    assert graph.resident_bytes() < exact.resident_bytes() + n * (DIM * 4 + 2 * 16 * 4 + 100)
    unit = dict(zip(ids, normalize_rows(np.vstack([x[3:6], x[3:]])), strict=True))
    rng = np.random.default_rng(3)
    for q in rng.standard_normal((20, DIM)).astype(np.float32):
        got = graph.search(q, 50)
        qn = normalize_rows(q[None, :])[0]
        # the rescoring read the very bytes that were inserted (canonical scores of the inputs)
        assert [s for _, s in got] == canonical_scores(np.vstack([unit[i] for i, _ in got]), qn)
        assert graph.search(q, 50) == got
    for index in (exact, graph):
        index.rebuild()  # canonical rows: sorted by id, holes dropped
        index.save()
    assert (tmp_path / "hnsw" / VECTORS).read_bytes() == (tmp_path / "exact" / VECTORS).read_bytes()
    again = open_index(tmp_path / "hnsw", threshold=100)
    assert again.kind == "hnsw" and again._mat.nbytes == 0
    for q in rng.standard_normal((5, DIM)).astype(np.float32):
        assert again.search(q, 40) == graph.search(q, 40)
