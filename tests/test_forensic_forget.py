"""Forget, withdraw and rejection, forensically: afterwards no file under the data directory
holds the content's text or its float32 vector bytes, and no surviving key opens what is left.

Real engines and a real ``engram-memory serve`` process on real data directories, in hybrid mode
(the packaged model embeds; the vector files hold the rows). Each scan is shown to find the
content first (before the operation, or on a planted fault), so none of them can pass vacuously.
The scans (checks/forensic.py) read every file raw -- DuckDB file and WAL, Tantivy segments, meta
and lock files, vector files, temp files, keys -- and every DuckDB value, opening every sealed blob
with every data key still on disk (the directory holds the master key too).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
import typer

from engram_memory.checks.forensic import (
    content_needles,
    orphan_keys,
    readable_leftovers,
    scan_duckdb,
    scan_files,
    surviving_keys,
)
from engram_memory.models.settings import EngineSettings
from engram_memory.retrieval.vectors import VectorIndex, normalize_rows
from engram_memory.store.core import crypto
from engram_memory.store.core.crypto import open_sealed
from engram_memory.store.core.engine import Engine, embedding_text
from engram_memory.store.core.lifecycle import pending_context, record_context
from tests.retrieval_fixtures import disk_files
from tests.store_fixtures import (
    AGENT_FIELDS,
    IDEMPOTENCY_FIELDS,
    PURPOSE,
    T0,
    admission_args,
    admit_texts,
    call,
    capture_args,
    ctx,
    forget_args,
    unique_capture,
    withdraw_args,
)

# Each kind of content carries its own invented tokens, so a hit names what leaked.
FORGET_TOKENS = ("zorblaxquint", "velmarith", "quonfrellish")
FORGET_TEXT = "Decision: the zorblaxquint velmarith quonfrellish rollout stays frozen until spring."
WITHDRAW_TOKENS = ("plimbrathor", "gexwundle")
WITHDRAW_TEXT = "Draft: move the plimbrathor gexwundle budget review to the second week."
REJECT_TOKENS = ("trovenglass", "murquiddle")
REJECT_TEXT = "The trovenglass murquiddle deploy uses password=Hx7qLm2Vz9rT4wKp for the registry."
FILLER = [
    "The cat sat on the mat near the window all afternoon.",
    "Quarterly tax filings are due on the fifteenth of April.",
    "We picked PostgreSQL replicas for the reporting workload.",
    "A kitten naps on a rug in the sunshine.",
    "The release train leaves every second Tuesday.",
    "Rotate the on-call pager schedule weekly.",
    "Compress nightly backups with zstd before upload.",
    "Vendor invoices are approved by the finance lead.",
    "Staging mirrors production settings except for the mail relay.",
    "Schema migrations run before the application deploy.",
    "The audit log is retained for thirteen months.",
]
SCOPE = ctx().scope_ref


def open_engine(path: Path, **kw: Any) -> Engine:
    engine = Engine.open(EngineSettings(data_dir=path, **kw), clock=lambda: T0)
    assert engine.embedder is not None and engine.wait_semantic(240), "packaged model failed to load"
    return engine


def admit(engine: Engine, texts: list[str]) -> list[str]:
    # Admissions are projected in groups; one at a time here, so each record has a Tantivy segment
    # of its own, whose doc store holds its text uncompressed by its neighbours' -- what lets each
    # scan first find the content it then proves gone.
    return admit_texts(engine, texts, settle_each=True)


def traces(data_dir: Path, needles: dict[str, bytes], engine: Engine | None = None) -> dict[str, list[str]]:
    """Every place a needle was found: raw files, and DuckDB values and opened blobs (through the
    running engine's connection, or read-only once it closed)."""
    found: dict[str, list[str]] = {}
    for scan in (scan_files(data_dir, needles), scan_duckdb(data_dir, needles, engine.db.con if engine else None)):
        for name, places in scan.hits.items():
            found.setdefault(name, []).extend(places)
    return found


def vector_file_row(data_dir: Path, record_id: str) -> np.ndarray:
    """The record's row as the vector projection saved it (ids.json gives the row)."""
    vdir = next((data_dir / "projections").glob("*/vectors"))
    ids = json.loads((vdir / "ids.json").read_text())
    return np.load(vdir / "vectors.npy")[ids.index(record_id)]


def key_file(data_dir: Path, key_ref: str) -> Path:
    return crypto.key_file(data_dir / "keys", key_ref)


# ---- forget -----------------------------------------------------------------------------------


@pytest.mark.parametrize("hnsw_threshold", [50_000, 3], ids=["exact", "hnsw"])
def test_forget_leaves_no_text_vector_or_key_on_disk(tmp_path: Path, hnsw_threshold: int) -> None:
    data = tmp_path / "data"
    engine = open_engine(data, hnsw_threshold=hnsw_threshold)
    rid = admit(engine, [*FILLER, FORGET_TEXT])[-1]
    record = next(r for r in engine.live_records(SCOPE) if r["record_id"] == rid)
    assert embedding_text(record) == FORGET_TEXT
    vec = engine.embedder.encode([embedding_text(record)])[0]  # as the engine embeds it
    stored_ids, stored = engine.stored_vectors(SCOPE)
    assert stored[stored_ids.index(rid)].tobytes() == vec.tobytes()  # the bytes DuckDB seals
    key_ref, body = engine.db.one("SELECT key_ref, body FROM records WHERE record_id = ?", [rid])
    (embedding,) = engine.db.one("SELECT vector FROM embeddings WHERE record_id = ?", [rid])
    engine.close()  # saves the vector files (they are saved in batches) and checkpoints DuckDB
    assert vector_file_row(data, rid).tobytes() == normalize_rows(vec[None, :])[0].tobytes()

    needles = content_needles("forgotten", FORGET_TEXT, FORGET_TOKENS, vec)
    sealed = {"body": (body, record_context(rid)), "embedding": (embedding, record_context(rid))}
    before = traces(data, needles)
    # The scans can fail: before the forget they find every needle where it lives.
    assert set(before) == set(needles), set(needles) - set(before)
    assert any(p.endswith(".store") for p in before["forgotten:text"])  # Tantivy's doc store
    assert any(p.endswith(".store") for p in before["forgotten:stem:zorblaxquint"])
    # The sealed DuckDB copy matches the unit needle too when the model's own normalisation is
    # bit-identical to the index's (ONNX Runtime: it is); the files are what this line checks.
    vector_files = {Path(p).name for p in before["forgotten:vector-unit"] if not p.startswith("duckdb:")}
    assert vector_files == ({"vectors.npy", "hnsw.bin"} if hnsw_threshold == 3 else {"vectors.npy"})
    assert "duckdb:records.body (opened with a surviving key)" in before["forgotten:text"]
    assert "duckdb:embeddings.vector (opened with a surviving key)" in before["forgotten:vector"]
    assert set(readable_leftovers(data, sealed)) == {"body", "embedding"}

    engine = open_engine(data, hnsw_threshold=hnsw_threshold)
    try:
        assert engine.projections.vectors(SCOPE).kind == ("hnsw" if hnsw_threshold == 3 else "exact")
        out = call(engine, "forget", ctx(), forget_args(rid))
        assert out["projection_invalidation"] == "complete" and "coverage_receipt_digest" in out
        # True when answered: while the server still runs (WAL not checkpointed, files open).
        assert traces(data, needles, engine) == {}
        assert not key_file(data, key_ref).exists() and orphan_keys(data, engine.db.con) == []
        assert len(engine.live_records(SCOPE)) == len(FILLER)  # the others stay
        vdir = engine.projections.scope_dir(SCOPE) / "vectors"
        holes = json.loads((vdir / "ids.json").read_text()).count("")
        assert holes == (1 if hnsw_threshold == 3 else 0)  # HNSW: the path that zeroes a row in place
    finally:
        engine.close()
    assert traces(data, needles) == {}
    assert readable_leftovers(data, sealed) == {}  # old ciphertext may remain; nothing opens it
    assert orphan_keys(data) == []


def test_hnsw_graph_and_vector_files_lose_deleted_rows(tmp_path: Path) -> None:
    """Both HNSW delete paths (a hole punched in place, a rebuild past 1/10 holes) and the drop
    to exact mode, on random vectors: no saved file keeps a deleted row's bytes."""
    rng = np.random.default_rng(11)
    ids = [f"rec-{i:03d}" for i in range(60)]
    unit = normalize_rows(rng.standard_normal((60, 384)).astype(np.float32))
    path = tmp_path / "vectors"

    def holders(i: int) -> list[str]:
        return [p.name for p, data in disk_files(path) if unit[i].tobytes() in data]

    index = VectorIndex.open(path, 384, hnsw_threshold=20)
    index.upsert(ids, unit)
    index.save()
    assert index.kind == "hnsw" and holders(3) == ["hnsw.bin", "vectors.npy"]

    index.delete([ids[3]])  # 1 hole <= 60 // 10: punched in place
    index.save()
    assert index.kind == "hnsw" and holders(3) == [] and holders(4) == ["hnsw.bin", "vectors.npy"]
    index = VectorIndex.open(path, 384, hnsw_threshold=20)  # the holed graph loads and answers
    assert index.search(unit[4], 1)[0][0] == ids[4] and not index.contains(ids[3])

    index.delete(ids[10:20])  # 11 holes > 6: rebuilt
    index.save()
    assert index.kind == "hnsw" and all(holders(i) == [] for i in range(10, 20))

    index.delete(ids[20:45])  # 24 live rows... then below the threshold: exact, graph file gone
    index.delete(ids[45:50])
    index.save()
    assert index.kind == "exact" and not (path / "hnsw.bin").exists()
    assert all(holders(i) == [] for i in [3, *range(10, 50)]) and holders(55) == ["vectors.npy"]

    # A save cut short by a crash leaves a temp file no later exact-mode save rewrites.
    (path / ".hnsw.bin.tmp").write_bytes(b"hnsw" + unit[3].tobytes())
    assert holders(3) == [".hnsw.bin.tmp"]
    VectorIndex.open(path, 384, hnsw_threshold=20)
    assert holders(3) == []


# ---- withdraw and rejection ---------------------------------------------------------------------


def test_withdraw_and_rejection_leave_nothing_readable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = open_engine(data)
    try:
        admit(engine, FILLER[:3])
        withdrawn = call(engine, "capture", ctx(), capture_args(WITHDRAW_TEXT, key="capture-key-withdraw"))
        rejected = call(engine, "capture", ctx(), capture_args(REJECT_TEXT, key="capture-key-reject"))
        needles = {**content_needles("withdrawn", WITHDRAW_TEXT, WITHDRAW_TOKENS),
                   **content_needles("rejected", REJECT_TEXT, REJECT_TOKENS)}
        sealed = {}
        for label, cap in (("withdrawn", withdrawn), ("rejected", rejected)):
            cid = cap["candidate_id"]
            key_ref, envelope = engine.db.one("SELECT key_ref, envelope FROM candidates WHERE candidate_id = ?", [cid])
            sealed[label] = (envelope, pending_context(cid))
            assert key_file(data, key_ref).exists()
        # Pending candidates exist only sealed: no raw file shows them, the surviving keys open them.
        before = traces(data, needles, engine)
        assert set(before) == set(needles)
        assert all(places == ["duckdb:candidates.envelope (opened with a surviving key)"] for places in before.values())

        out = call(engine, "withdraw", ctx(), withdraw_args(withdrawn["candidate_id"]))
        assert out["key_destruction"] == "complete"
        out = call(engine, "request_admission", ctx(), admission_args(rejected["candidate_id"], key="admit-key-reject"))
        assert out["outcome"]["status"] == "rejected"
        assert traces(data, needles, engine) == {}
        assert orphan_keys(data, engine.db.con) == []
    finally:
        engine.close()
    assert traces(data, needles) == {}
    assert readable_leftovers(data, sealed) == {}


# ---- "pending" is honest, and recovery completes it ------------------------------------------------


def test_a_purge_that_cannot_finish_says_pending_until_recovery(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = open_engine(data)
    rid = admit(engine, [*FILLER[:4], FORGET_TEXT])[-1]
    needles = content_needles("forgotten", FORGET_TEXT, FORGET_TOKENS)
    lexical = engine.projections.lexical(SCOPE).path
    # The fault: a stale segment of the record the purge cannot unlink (a directory by a segment
    # file's name, holding a copy of the doc store) -- as a crash mid-merge could leave one.
    source = next(p for p in lexical.glob("*.store") if FORGET_TEXT.encode() in p.read_bytes())
    stuck = lexical / f"{uuid.uuid4().hex}.store"
    stuck.mkdir()
    (stuck / "segment").write_bytes(source.read_bytes())
    try:
        out = call(engine, "forget", ctx(), forget_args(rid))
        assert out["projection_invalidation"] == "pending" and "coverage_receipt_digest" not in out
        # Honest: the text is still on disk, in the file the purge could not remove.
        leftover = str((stuck / "segment").relative_to(data))
        assert traces(data, needles, engine) == {name: [leftover] for name in needles}
    finally:
        engine.close()  # a restart: the stale scope and the pending answer are found again

    engine = open_engine(data)
    try:
        replay = call(engine, "forget", ctx(), forget_args(rid))  # the scope's next use rebuilds it
        assert replay["replayed"] and replay["projection_invalidation"] == "complete"
        assert "coverage_receipt_digest" in replay
        assert traces(data, needles, engine) == {} and not stuck.exists()
    finally:
        engine.close()


def test_a_leftover_segment_file_goes_with_the_purge(tmp_path: Path) -> None:
    """A segment file meta.json does not name (tantivy collects only the files it created) is
    removed by the purge, not left holding the text."""
    data = tmp_path / "data"
    engine = open_engine(data)
    try:
        rid = admit(engine, [*FILLER[:2], FORGET_TEXT])[-1]
        needles = content_needles("forgotten", FORGET_TEXT, FORGET_TOKENS)
        lexical = engine.projections.lexical(SCOPE).path
        source = next(p for p in lexical.glob("*.store") if FORGET_TEXT.encode() in p.read_bytes())
        leftover = lexical / f"{uuid.uuid4().hex}.store"
        leftover.write_bytes(source.read_bytes())
        assert str(leftover.relative_to(data)) in traces(data, needles, engine)["forgotten:text"]
        assert call(engine, "forget", ctx(), forget_args(rid))["projection_invalidation"] == "complete"
        assert traces(data, needles, engine) == {} and not leftover.exists()
    finally:
        engine.close()


def test_a_key_that_cannot_be_destroyed_keeps_withdraw_and_forget_pending(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    engine = open_engine(data)
    rid = admit(engine, [*FILLER[:2], FORGET_TEXT])[-1]
    cap = call(engine, "capture", ctx(), capture_args(WITHDRAW_TEXT, key="capture-key-withdraw"))
    cid = cap["candidate_id"]
    (envelope,) = engine.db.one("SELECT envelope FROM candidates WHERE candidate_id = ?", [cid])
    (body,) = engine.db.one("SELECT body FROM records WHERE record_id = ?", [rid])
    sealed = {"envelope": (envelope, pending_context(cid)), "body": (body, record_context(rid))}
    destroy = engine.keys.destroy
    monkeypatch.setattr(engine.keys, "destroy", lambda key_ref: False)  # the fault: unlink refused
    try:
        withdrawn = call(engine, "withdraw", ctx(), withdraw_args(cid))
        forgotten = call(engine, "forget", ctx(), forget_args(rid))
        assert withdrawn["key_destruction"] == "pending" and forgotten["projection_invalidation"] == "pending"
        # Honest: the rows are gone, but their ciphertext is still on disk and a surviving key opens it.
        assert len(orphan_keys(data, engine.db.con)) == 2
        assert set(readable_leftovers(data, sealed)) == {"envelope", "body"}
        assert call(engine, "withdraw", ctx(), withdraw_args(cid))["key_destruction"] == "pending"  # still failing
        monkeypatch.setattr(engine.keys, "destroy", destroy)  # the fault clears
        assert call(engine, "withdraw", ctx(), withdraw_args(cid)) == {**withdrawn, "replayed": True,
                                                                      "key_destruction": "complete"}
        replay = call(engine, "forget", ctx(), forget_args(rid))
        assert replay["projection_invalidation"] == "complete" and replay["replayed"]
        assert orphan_keys(data, engine.db.con) == [] and readable_leftovers(data, sealed) == {}
    finally:
        engine.close()


def test_pending_answers_left_by_a_crash_complete_after_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """A process that dies with keys undestroyed: the next open sweeps them and completes."""
    data = tmp_path / "data"
    engine = open_engine(data)
    rid = admit(engine, [FILLER[0], FORGET_TEXT])[-1]
    cid = call(engine, "capture", ctx(), capture_args(WITHDRAW_TEXT, key="capture-key-withdraw"))["candidate_id"]
    monkeypatch.setattr(engine.keys, "destroy", lambda key_ref: False)
    assert call(engine, "withdraw", ctx(), withdraw_args(cid))["key_destruction"] == "pending"
    assert call(engine, "forget", ctx(), forget_args(rid))["projection_invalidation"] == "pending"
    engine.close()
    assert len(orphan_keys(data)) == 2
    engine = open_engine(data)
    try:
        assert orphan_keys(data, engine.db.con) == []  # swept at open
        assert call(engine, "withdraw", ctx(), withdraw_args(cid))["key_destruction"] == "complete"
        assert call(engine, "forget", ctx(), forget_args(rid))["projection_invalidation"] == "complete"
    finally:
        engine.close()


# ---- the same through a real server ---------------------------------------------------------------


@pytest.mark.anyio
async def test_server_forget_withdraw_and_rejection_leave_no_trace(start_server, data_dir_factory) -> None:
    """Over stdio with the MCP SDK client and a confirming human: the first run admits and embeds
    (its close saves the vector files and checkpoints), the second forgets, withdraws and rejects."""
    from tests.conftest import Human, key
    from tests.conftest import capture_args as mcp_capture_args
    from tests.test_e2e_retrieval import admit, hybrid_when_ready

    data = data_dir_factory("forensic-e2e")
    async with start_server(data, human=Human()) as mcp:
        rid = await admit(mcp, FORGET_TEXT)
        for text in FILLER[:3]:
            await admit(mcp, text)
        cids = {}
        for label, text in (("withdrawn", WITHDRAW_TEXT), ("rejected", REJECT_TEXT)):
            cap = await mcp.call("capture", mcp_capture_args(text))
            cids[label] = cap["output"]["value"]["candidate_id"]
        await hybrid_when_ready(mcp, "zorblaxquint rollout")  # the record is embedded and indexed

    # The real bytes: the vector DuckDB seals (opened with the record's key) and the saved row.
    con = duckdb.connect(str(data / "engram.duckdb"), read_only=True)
    try:
        key_ref, body = con.execute("SELECT key_ref, body FROM records WHERE record_id = ?", [rid]).fetchone()
        (blob,) = con.execute("SELECT vector FROM embeddings WHERE record_id = ?", [rid]).fetchone()
        envelopes = {label: con.execute("SELECT envelope FROM candidates WHERE candidate_id = ?", [cid]).fetchone()[0]
                     for label, cid in cids.items()}
    finally:
        con.close()
    vec = np.frombuffer(open_sealed(surviving_keys(data)[key_ref], blob, record_context(rid)), dtype=np.float32)
    assert vector_file_row(data, rid).tobytes() == normalize_rows(vec[None, :])[0].tobytes()

    needles = {**content_needles("forgotten", FORGET_TEXT, FORGET_TOKENS, vec),
               **content_needles("withdrawn", WITHDRAW_TEXT, WITHDRAW_TOKENS),
               **content_needles("rejected", REJECT_TEXT, REJECT_TOKENS)}
    sealed = {"body": (body, record_context(rid)), "embedding": (blob, record_context(rid)),
              **{label: (envelopes[label], pending_context(cid)) for label, cid in cids.items()}}
    before = traces(data, needles)
    assert set(before) == set(needles), set(needles) - set(before)
    assert "vectors.npy" in {Path(p).name for p in before["forgotten:vector-unit"]}

    async with start_server(data, human=Human()) as mcp:
        out = await mcp.call("forget", {"record_id": rid, "idempotency_key": key("forget"),
                                        "reason_ref": "reason:user-request"})
        assert out["ok"] and out["output"]["value"]["projection_invalidation"] == "complete", out
        out = await mcp.call("withdraw", {"candidate_id": cids["withdrawn"], "idempotency_key": key("withdraw"),
                                          "reason_ref": "reason:obsolete"})
        assert out["ok"] and out["output"]["value"]["key_destruction"] == "complete", out
        out = await mcp.call("request_admission", {"candidate_id": cids["rejected"], "idempotency_key": key("admit")})
        assert out["output"]["value"]["outcome"]["status"] == "rejected", out
        # While the server runs (its DuckDB WAL not checkpointed yet): no file holds the content.
        assert scan_files(data, needles).hits == {}
    assert traces(data, needles) == {}
    assert readable_leftovers(data, sealed) == {} and orphan_keys(data) == []
    assert not key_file(data, key_ref).exists()


def test_forget_timing_command_reports_clean_scans(tmp_path: Path) -> None:
    """The timing command (studies/forget_timing.py), small and lexical-only: its forgets complete
    and its own scans find nothing; a bad option is one line and exit 2."""
    from typer.testing import CliRunner

    from studies import forget_timing

    app = typer.Typer()
    app.command()(forget_timing.main)
    result = CliRunner().invoke(app, ["--records", "30", "--forgets", "3", "--no-semantic", "--no-progress",
                                      "--json", "--data-dir", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["answers"] == {"complete": 3} and report["forget_ms"]["n"] == 3
    assert report["scan"]["found"] == {} and report["scan"]["needles"] == 3 * 5 and report["scan"]["files"] > 0
    refused = CliRunner().invoke(app, ["--records", "3", "--forgets", "5"])
    assert refused.exit_code == 2
    assert refused.stderr.strip() == "engram-memory: error: --forgets must not exceed --records"


# ---- every agent-written field (issue 33 §1) -----------------------------------------------------

def test_no_agent_written_field_outlives_a_forget_on_disk(tmp_path: Path) -> None:
    """The event type used to sit in plaintext in records.event_type: nulled by the forget, it stayed
    in a stale DuckDB block (the WAL while running, the file after a clean stop). Now no agent
    value is ever stored in the clear, current records included, and after the forget and a clean
    stop no file under the data dir holds any of them."""
    data = tmp_path / "data"
    needles = {name: value.encode("utf-8") for name, value in AGENT_FIELDS.items()}
    engine = Engine.open(EngineSettings(data_dir=data, semantic=False), clock=lambda: T0)
    admit_texts(engine, FILLER[:3], settle_each=True)
    cap = call(engine, "capture", ctx(), unique_capture())
    out = call(engine, "request_admission", ctx(),
               admission_args(cap["candidate_id"], key=AGENT_FIELDS["admission_key"]))
    assert out["outcome"]["status"] == "accepted", out
    rid = out["outcome"]["record_id"]
    engine.settle()
    running = traces(data, needles, engine)
    engine.close()  # a clean stop: checkpointed, WAL folded into the file
    stopped = traces(data, needles)
    for before in (running, stopped):
        # The scan finds the content where it lives: sealed in the record's body (a surviving key
        # opens it) and, for the text, the lexical index of a current record.
        assert "duckdb:records.body (opened with a surviving key)" in before["type_ref"], before
        assert {"text", "component_id", "citation_id", "source_ref", "locator", "type_ref"} <= set(before)
        for name, places in before.items():
            # A current record's lexical document (text, refs) is in its projection (SECURITY.md);
            # DuckDB, file and WAL, holds nothing agent-written in the clear, current records included.
            raw = [p for p in places if not p.endswith("(opened with a surviving key)")
                   and not p.startswith("projections/")]
            assert raw == [], (name, raw)
        assert not set(IDEMPOTENCY_FIELDS) & set(before)  # kept as digests only

    engine = Engine.open(EngineSettings(data_dir=data, semantic=False), clock=lambda: T0)
    try:
        forgot = call(engine, "forget", ctx(), forget_args(rid, key=AGENT_FIELDS["forget_key"]))
        assert forgot["projection_invalidation"] == "complete"
        assert traces(data, needles, engine) == {}  # while running: file and WAL
    finally:
        engine.close()
    assert traces(data, needles) == {}  # after a clean stop
    assert sorted(p.name for p in data.iterdir()) == [".lock", "engram.duckdb", "keys", "master.key",
                                                       "projections", "server.key"]


def test_a_store_from_before_the_digest_is_rewritten_without_its_event_types(tmp_path: Path) -> None:
    """A store written before migration 6 kept each record's event type in plaintext (and, after
    its forget, in a stale block): migrating clears the column and the opening process copies the
    store into a fresh file, so no file keeps a type; search still knows which records are turns."""
    data = tmp_path / "data"
    old_type = b"event:OLDPLAINEVT"
    engine = Engine.open(EngineSettings(data_dir=data, semantic=False), clock=lambda: T0)
    rid = admit_texts(engine, FILLER[:3], settle_each=True)[-1]
    engine.close()
    # The store as the previous version left it: the type in the clear, no digest, migration 6 not applied.
    with duckdb.connect(str(data / "engram.duckdb")) as con:
        con.execute("UPDATE records SET event_type = ?, event_kind = NULL WHERE record_id = ?",
                    [old_type.decode(), rid])
        con.execute("DELETE FROM schema_migrations WHERE version = 6")
        con.execute("CHECKPOINT")
    assert traces(data, {"type": old_type})["type"] == ["engram.duckdb", "duckdb:records.event_type"]

    engine = Engine.open(EngineSettings(data_dir=data, semantic=False), clock=lambda: T0)
    try:
        assert engine.db.con.execute("SELECT max(version) FROM schema_migrations").fetchone() == (6,)
        assert engine.db.con.execute("SELECT count(*) FROM records WHERE event_type IS NOT NULL").fetchone() == (0,)
        assert traces(data, {"type": old_type}, engine) == {}
        found = call(engine, "search", ctx(), {"query": "PostgreSQL replicas", "purpose_ref": PURPOSE})
        assert rid in [p["record"]["record_id"] for p in found["records"]]
    finally:
        engine.close()
    assert traces(data, {"type": old_type}) == {}
    assert not (data / "engram.duckdb.rewrite").exists()


def test_needles_are_stemmed_as_the_records_language_is_indexed() -> None:
    """A German record's lexical fields hold German stems: the scan looks for those, not English ones."""
    from engram_memory.checks.forensic import content_needles
    from engram_memory.retrieval.lexical import query_terms

    text = "Die Entwickler veröffentlichten die neuen Versionen ihrer Anwendungen gestern Abend in Hamburg."
    needles = content_needles("de", text, ["Anwendungen"])
    german = query_terms("Anwendungen", code="de")
    assert german == ["anwend"] and "anwend" not in query_terms("Anwendungen", code="en")
    assert needles["de:stem:anwend"] == b"anwend"
