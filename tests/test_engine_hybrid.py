"""Hybrid search on the real packaged model: semantic recall, fusion receipts, purge, determinism."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.errors import EngramError
from engram_memory.models.limits import SEMANTIC_FLOOR
from engram_memory.models.outputs import validate_output
from engram_memory.models.settings import EngineSettings
from engram_memory.retrieval.vectors import normalize_rows
from engram_memory.store.core.engine import Engine
from engram_memory.store.maintenance.rebuild import rebuild_index
from tests.retrieval_fixtures import disk_files
from tests.store_fixtures import PURPOSE, RERANK, T0, admission_args, call, capture_args, ctx, forget_args

DOCS = [
    "The cat sat on the mat near the window all afternoon.",
    "Quarterly tax filings are due on the fifteenth of April.",
    "We picked PostgreSQL replicas for the reporting workload.",
    "A kitten naps on a rug in the sunshine.",
    "The release train leaves every second Tuesday.",
]
HYBRID = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}


def open_engine(path: Path, **kw) -> Engine:
    engine = Engine.open(EngineSettings(data_dir=path, **kw), clock=lambda: T0)
    if kw.get("model_path") is None:
        assert engine.embedder is not None and engine.wait_semantic(180), "packaged model failed to load"
    return engine


def build(path: Path, **kw) -> tuple[Engine, list[str]]:
    engine = open_engine(path, **kw)
    ids = []
    for i, text in enumerate(DOCS):
        cap = call(engine, "capture", ctx(), capture_args(text, key=f"capture-key-{i:06d}"))
        out = call(engine, "request_admission", ctx(), admission_args(cap["candidate_id"], key=f"admit-key-{i:08d}"))
        ids.append(out["outcome"]["record_id"])
    return engine, ids


def search(engine: Engine, query: str, **kw) -> dict:
    value = call(engine, "search", ctx(), {"query": query, "purpose_ref": PURPOSE, **kw})
    validate_output("search", value)
    return value


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, list[str], Path]]:
    path = tmp_path_factory.mktemp("hybrid")
    engine, ids = build(path)
    yield engine, ids, path
    engine.close()


def test_semantic_finds_records_sharing_no_word(built) -> None:
    engine, ids, _ = built
    value = search(engine, "feline resting", capability_policy=HYBRID)
    top = [p["record"]["record_id"] for p in value["records"][:2]]
    assert set(top) == {ids[0], ids[3]}
    receipt = value["rank_receipt"]
    # the evaluated default: DBSF, equal weights (studies/fusion-study.md), and the semantic floor
    assert receipt["profile"] == "hybrid_v1"
    assert receipt["fusion"] == {"method": "dbsf", "weights": {"lexical": 0.5, "semantic": 0.5},
                                 "semantic_floor": SEMANTIC_FLOOR,
                                 "rerank": RERANK}
    semantic = receipt["channels"][1]
    assert semantic["contributed"] and semantic["index_kind"] == "exact" and semantic["engine"] == "numpy"
    assert semantic["model_id"].endswith("all-MiniLM-L6-v2") and semantic["model_digest"].startswith("sha256:")
    assert all("semantic" in r for r in receipt["ranked"])


@pytest.mark.parametrize("query", ["?!*:()", "the of and", "zebra xylophone quantum"])
def test_nothing_like_it_stored_is_an_empty_answer(built, query: str) -> None:
    """No query word in any record and no close vector: [] under both policies, receipt honest."""
    engine, _ids, _ = built
    for policy in (HYBRID, {"minimum_channels": "lexical", "network": "forbid"}):
        value = search(engine, query, capability_policy=policy)
        assert value["records"] == [] and "next_page_cursor" not in value
        receipt = value["rank_receipt"]
        assert receipt["profile"] == "hybrid_v1"  # the semantic channel ran under "lexical" too
        assert receipt["fusion"]["semantic_floor"] == SEMANTIC_FLOOR


def test_semantic_only_hits_below_the_floor_are_dropped(built, tmp_path: Path) -> None:
    """The floor drops only semantic-only hits below it; the others keep their fused order and score."""
    engine, ids, _ = built
    value = search(engine, "feline resting", capability_policy=HYBRID)
    ranked = value["rank_receipt"]["ranked"]
    assert ranked and all(r["semantic"]["score"] >= SEMANTIC_FLOOR or "lexical" in r for r in ranked)
    assert len(ranked) < len(ids)  # the unrelated records fall below it
    loose = Engine.open(EngineSettings(data_dir=tmp_path / "loose", semantic_floor=-1.0), clock=lambda: T0)
    try:
        assert loose.wait_semantic(180)
        for i, text in enumerate(DOCS):
            cap = call(loose, "capture", ctx(), capture_args(text, key=f"capture-key-{i:06d}"))
            call(loose, "request_admission", ctx(), admission_args(cap["candidate_id"], key=f"admit-key-{i:08d}"))
        everything = search(loose, "feline resting", capability_policy=HYBRID)["rank_receipt"]["ranked"]
    finally:
        loose.close()
    assert len(everything) == len(ids)
    kept = [(r["record_id"], r["score"]) for r in everything if r["semantic"]["score"] >= SEMANTIC_FLOOR]
    assert [(r["record_id"], r["score"]) for r in ranked] == kept


@pytest.mark.parametrize("hnsw_threshold", [50_000, 3], ids=["exact", "hnsw"])
def test_forget_purges_vector_and_embedding(tmp_path: Path, hnsw_threshold: int) -> None:
    engine, ids = build(tmp_path / "f", hnsw_threshold=hnsw_threshold)
    engine.settle()  # admissions are projected in groups: embedded and indexed now
    kind = "exact" if hnsw_threshold > len(DOCS) else "hnsw"
    assert engine.projections.vectors(ctx().scope_ref).kind == kind
    try:
        stored = engine.stored_vectors(ctx().scope_ref)
        vec = normalize_rows(stored[1][stored[0].index(ids[2])][None, :])[0].tobytes()
        engine.projections.vectors(ctx().scope_ref).save()  # saves are batched: put the bytes on disk
        assert any(vec in data for _, data in disk_files(tmp_path / "f" / "projections"))
        out = call(engine, "forget", ctx(), forget_args(ids[2]))
        assert out["projection_invalidation"] == "complete"
        assert engine.embedding_count(ids[2]) == 0
        hits = search(engine, "PostgreSQL replicas reporting", capability_policy=HYBRID)["records"]
        assert ids[2] not in {p["record"]["record_id"] for p in hits}
    finally:
        engine.close()
    for p, data in disk_files(tmp_path / "f" / "projections"):
        assert vec not in data and b"PostgreSQL" not in data and b"postgresql" not in data, p.name


def test_vectors_lost_in_a_crash_are_re_added_from_duckdb(tmp_path: Path) -> None:
    engine, ids = build(tmp_path / "c")
    query = {"capability_policy": HYBRID}
    before = canonical_bytes(search(engine, "feline resting", **query))
    index = engine.projections.vectors(ctx().scope_ref)
    assert index.count() == len(DOCS) and index.unsaved == len(DOCS)  # five rows: below the save batch
    engine.projections._vectors.clear()  # a crash: the unsaved rows never reach the files
    engine.close()
    saved = [np.load(f).shape[0] for f in (tmp_path / "c" / "projections").rglob("vectors.npy")]
    assert all(rows < len(DOCS) for rows in saved)  # the files lag DuckDB
    engine = open_engine(tmp_path / "c")
    try:
        assert engine.projections.vectors(ctx().scope_ref).count() == len(DOCS)
        assert canonical_bytes(search(engine, "feline resting", **query)) == before
    finally:
        engine.close()


def test_missing_model_is_ranking_unavailable_never_empty_success(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "m", model_path=tmp_path / "no-such-model")
    try:
        assert engine.embedder.wait(30) is False and engine.embedder.state == "failed"
        cap = call(engine, "capture", ctx(), capture_args(DOCS[0]))
        call(engine, "request_admission", ctx(), admission_args(cap["candidate_id"]))
        with pytest.raises(EngramError) as err:
            search(engine, "cat", capability_policy=HYBRID)
        assert err.value.code == "RANKING_UNAVAILABLE" and err.value.retriable
        value = search(engine, "cat")
        assert value["records"] and value["rank_receipt"]["channels"][1]["contributed"] is False
    finally:
        engine.close()


QUERIES = ["feline resting", "when are taxes due", "database for reports", "release schedule"]

BUILD_IN_SUBPROCESS = """
import hashlib, json, sys
from pathlib import Path
from engram_memory.models.canonical import canonical_bytes
from tests.test_engine_hybrid import QUERIES, build, search, HYBRID
engine, _ = build(Path(sys.argv[1]))
print(json.dumps([hashlib.sha256(canonical_bytes(search(engine, q, capability_policy=HYBRID))).hexdigest()
                  for q in QUERIES]))
engine.close()
"""


def digests(engine: Engine) -> list[str]:
    return [hashlib.sha256(canonical_bytes(search(engine, q, capability_policy=HYBRID))).hexdigest()
            for q in QUERIES]


def test_determinism_across_processes_restart_and_rebuild(built, tmp_path: Path) -> None:
    engine, _, path = built
    expected = digests(engine)
    proc = subprocess.run([sys.executable, "-c", BUILD_IN_SUBPROCESS, str(tmp_path / "other")],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected
    other = open_engine(tmp_path / "other")  # restart
    assert digests(other) == expected
    other.close()
    report = rebuild_index(tmp_path / "other", verify=True, show_progress=False)
    assert report.differences == 0 and report.scopes[0].vectors == len(DOCS)
    other = open_engine(tmp_path / "other")
    assert digests(other) == expected
    other.close()


def test_records_admitted_without_model_are_backfilled(tmp_path: Path) -> None:
    lexical_only = Engine.open(EngineSettings(data_dir=tmp_path / "b", semantic=False), clock=lambda: T0)
    for i, text in enumerate(DOCS):
        cap = call(lexical_only, "capture", ctx(), capture_args(text, key=f"capture-key-{i:06d}"))
        call(lexical_only, "request_admission", ctx(), admission_args(cap["candidate_id"], key=f"admit-key-{i:08d}"))
    assert lexical_only.embedding_count() == 0
    lexical_only.close()
    engine = open_engine(tmp_path / "b")  # waits for the background backfill
    try:
        assert engine.embedding_count() == len(DOCS)
        top = search(engine, "feline resting", capability_policy=HYBRID)["records"][0]
        assert "cat" in top["record"]["components"][0]["text"] or "kitten" in top["record"]["components"][0]["text"]
    finally:
        engine.close()
