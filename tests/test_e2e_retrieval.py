"""End to end over stdio, hybrid retrieval: a real `engram-memory serve` subprocess (real DuckDB,
Tantivy and vector files, the real packaged model where the semantic channel is needed), driven
by the MCP SDK's ClientSession. Nothing of ours is mocked.

The embedding model costs ~10-15 s per process, so it is loaded by few processes here: the hybrid
server (test 1, once per store backend) and the ``rebuild-index --verify`` run (test 5). Everything
else runs with ``--no-semantic`` (a model path that does not exist is refused at launch; the engine's
own answer to a vanished model is tested in process).

The tests that touch the store (hybrid retrieval with stored embeddings, paging under the store's
page-cursor key, forget's purge of the node's projection files) run on both store backends (the
``backend`` fixture); the rest exercise the retrieval stack or a DuckDB-only mode (rebuild-index).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from engram_memory.models.limits import SEMANTIC_FLOOR
from tests.conftest import (
    ALL,
    CONTEXT,
    Human,
    Mcp,
    capture_args,
    check_result,
    key,
    mcp_server,
    search_args,
    serve_argv,
)
from tests.retrieval_fixtures import disk_files
from tests.store_fixtures import RERANK
from tests.test_engine_rerank import TURNS

pytestmark = pytest.mark.anyio

LEXICAL_ONLY = ["--no-semantic"]
HYBRID = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
ENGRAM_CLI = Path(sys.executable).with_name("engram-memory")
STALE = {"code": "STALE_PAGE", "message": "The page cursor is no longer valid; start a new search.",
         "retriable": False}
UNAVAILABLE = {"code": "RANKING_UNAVAILABLE", "message": "A required ranking channel is unavailable; retry later.",
               "retriable": True}

# A frozen store clock for the reproducibility runs (tests 5 and 6): every server run on those
# data dirs gets the same ENGRAM_CLOCK_MS, and every payload instant is fixed relative to it.
FROZEN_MS = 1_767_225_600_000  # 2026-01-01T00:00:00.000Z
FROZEN_VALID_T = FROZEN_MS - 3_600_000


# ---- helpers --------------------------------------------------------------------------------


async def admit(mcp: Mcp, text: str, *, capture_key: str | None = None, admit_key: str | None = None,
                fixed_time: bool = False) -> str:
    """capture -> request_admission (accepted); returns the record_id."""
    args = capture_args(text, key=capture_key)
    if fixed_time:  # no wall-clock instant may leak into a reproducibility run
        args["payload"]["valid_time"] = {"t": FROZEN_VALID_T}
        args["payload"]["primary_event"]["at"] = FROZEN_VALID_T
    cap = await mcp.call("capture", args)
    assert cap["ok"], cap
    assert cap["output"]["value"]["status"] == "committed_pending", cap
    adm = await mcp.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                               "idempotency_key": admit_key or key("admit")})
    assert adm["ok"], adm
    outcome = adm["output"]["value"]["outcome"]
    assert outcome["status"] == "accepted", outcome
    assert outcome["record_id"].startswith("mem_")
    return outcome["record_id"]


def ids_of(envelope: dict[str, Any]) -> list[str]:
    assert envelope["ok"], envelope
    return [p["record"]["record_id"] for p in envelope["output"]["value"]["records"]]


def value_bytes(envelope: dict[str, Any], fields: tuple[str, ...] = ("records", "rank_receipt", "response_digest")
                ) -> bytes:
    """The compared part of a search value, serialised exactly (key order kept, no re-sorting)."""
    assert envelope["ok"], envelope
    value = envelope["output"]["value"]
    missing = [f for f in fields if f not in value]
    assert not missing, (missing, value)
    return json.dumps({f: value[f] for f in fields}, ensure_ascii=False, separators=(",", ":")).encode()


def files_containing(root: Path, needle: bytes) -> list[str]:
    assert root.is_dir(), root
    return [str(p.relative_to(root)) for p, data in disk_files(root) if needle in data]


def run_cli(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ENGRAM_CLI), *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, cwd=str(Path(__file__).resolve().parents[1]))


def forge(cursor: str) -> str:
    """Flip one character inside the cursor's body (never the MAC's last char: its low bits are padding)."""
    body, mac = cursor.split(".")
    i = len(body) // 2
    flipped = "B" if body[i] != "B" else "C"
    return body[:i] + flipped + body[i + 1:] + "." + mac


def reoffset(cursor: str, offset: int) -> str:
    """A well-formed cursor whose body asks for another offset, under the original MAC."""
    body, mac = cursor.split(".")
    data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert data["o"] != offset
    data["o"] = offset
    raw = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=") + "." + mac


# ---- 1. hybrid over MCP with the packaged model ----------------------------------------------

TARGET = "The cat sat on the mat near the window all afternoon."
OTHERS = [
    "Quarterly tax filings are due on the fifteenth of April.",
    "We picked PostgreSQL replicas for the reporting workload.",
    "The release train leaves every second Tuesday.",
    "Rotate the on-call pager schedule weekly.",
    "Compress nightly backups with zstd before upload.",
]
PARAPHRASE = "feline resting"  # shares no word (nor stem) with TARGET


def rrf(entry: dict[str, Any], k: int = 60) -> float:
    total = 0.0
    for channel in ("lexical", "semantic"):  # the fusion's own (sorted) channel order
        if channel in entry:
            total += 1.0 / (k + entry[channel]["rank"])
    return total


async def hybrid_when_ready(mcp: Mcp, query: str) -> tuple[dict[str, Any], int]:
    """The first successful ``lexical_and_semantic`` search, and how many RANKING_UNAVAILABLE came first."""
    deadline = time.monotonic() + 120
    refusals = 0
    while not (hybrid := await mcp.call("search", search_args(query, capability_policy=HYBRID)))["ok"]:
        assert hybrid["error"] == UNAVAILABLE, hybrid
        assert "output" not in hybrid
        refusals += 1
        assert time.monotonic() < deadline, "the embedding model never became ready: " + mcp.stderr()[-2000:]
        await anyio.sleep(0.5)
    return hybrid, refusals


async def test_hybrid_paraphrase_sharing_no_word_is_found_with_a_full_receipt(
    start_server, data_dir_factory, backend
) -> None:
    from engram_memory.retrieval.embedder import PACKAGED_MODEL_ID, compute_model_digest, packaged_model_path

    assert not set(PARAPHRASE.lower().split()) & set(TARGET.lower().rstrip(".").split())
    model_dir = packaged_model_path()
    assert model_dir is not None, "the packaged model is missing"
    expected_digest = compute_model_digest(model_dir)
    assert expected_digest and expected_digest.startswith("sha256:")

    # the packaged model; the host selects RRF so the fused scores can be re-derived from the ranks
    async with start_server(data_dir_factory("hybrid"), extra=["--fusion", "rrf"], backend=backend) as mcp:
        target_id = await admit(mcp, TARGET)  # admitted while the model loads: backfilled later
        other_ids = [await admit(mcp, text) for text in OTHERS]
        assert len(set(other_ids + [target_id])) == 6

        # The lexical channel alone cannot find it: no shared word. The model loads in the
        # background (about a second on ONNX Runtime once exported), so this search may already be
        # hybrid; the receipt below shows the lexical channel had no hit either way.
        lexical = await mcp.call("search", search_args(PARAPHRASE))
        if lexical["output"]["value"]["rank_receipt"]["profile"] == "lexical_v1":
            assert ids_of(lexical) == [], lexical

        hybrid, _refusals = await hybrid_when_ready(mcp, PARAPHRASE)
        found = ids_of(hybrid)
        assert target_id in found[:3], (target_id, found)
        value = hybrid["output"]["value"]
        receipt = value["rank_receipt"]
        assert receipt["profile"] == "hybrid_v1"
        assert receipt["fusion"] == {"method": "rrf", "k": 60, "semantic_floor": SEMANTIC_FLOOR, "rerank": RERANK}
        lex, sem = receipt["channels"]
        assert (lex["channel"], lex["contributed"], lex["engine"], lex["index_kind"]) == (
            "lexical", True, "tantivy", "bm25")
        assert (sem["channel"], sem["contributed"], sem["engine"], sem["index_kind"]) == (
            "semantic", True, "numpy", "exact")
        assert sem["model_id"] == PACKAGED_MODEL_ID
        assert sem["model_digest"] == expected_digest
        # All six records are indexed (the backfill ran); both indexes sit at the same cursor.
        assert receipt["candidate_count"] == 6
        assert lex["index_cursor"] == sem["index_cursor"] == receipt["system_as_of"]
        ranked = {e["record_id"]: e for e in receipt["ranked"]}
        assert list(ranked) == found
        entry = ranked[target_id]
        assert "lexical" not in entry  # no lexical hit ...
        assert entry["semantic"]["rank"] <= 3 and isinstance(entry["semantic"]["score"], float)  # ... semantic did it
        for e in receipt["ranked"]:
            assert e["score"] == pytest.approx(rrf(e), rel=1e-12), e
        for position, packet in enumerate(value["records"], start=1):
            assert packet["rank"] == position and ranked[packet["record"]["record_id"]]["rank"] == position

        # A query sharing words with the target: both channels rank it, and fused it comes first.
        both = await mcp.call("search", search_args("cat on the mat by the window", capability_policy=HYBRID))
        assert ids_of(both)[0] == target_id
        first = both["output"]["value"]["rank_receipt"]["ranked"][0]
        assert first["lexical"]["rank"] == 1 and first["semantic"]["rank"] == 1, first
        assert first["score"] == pytest.approx(2.0 / 61, rel=1e-12)

        # Once ready, a default (lexical-minimum) search is hybrid too.
        default = await mcp.call("search", search_args(PARAPHRASE))
        assert default["output"]["value"]["rank_receipt"]["profile"] == "hybrid_v1"
        assert target_id in ids_of(default)[:3]


async def test_dbsf_selected_by_the_host_fuses_unclipped_scores_from_the_receipt(
    start_server, data_dir_factory
) -> None:
    """``--fusion dbsf`` over MCP: every fused score re-derives from the receipt's raw channel scores."""
    import statistics

    # The floor off (-1): every record is a hit, so the receipt lists every score the statistics use.
    async with start_server(data_dir_factory("dbsf"), extra=["--fusion", "dbsf", "--semantic-floor", "-1"]) as mcp:
        target_id = await admit(mcp, TARGET)
        for text in OTHERS:
            await admit(mcp, text)
        hybrid, _ = await hybrid_when_ready(mcp, "cat on the mat by the window")
        receipt = hybrid["output"]["value"]["rank_receipt"]
        assert receipt["fusion"] == {"method": "dbsf", "weights": {"lexical": 0.5, "semantic": 0.5},
                                     "semantic_floor": -1.0, "rerank": RERANK}  # inert here: no speakers, one instant
        ranked = receipt["ranked"]
        assert len(ranked) == 6 and ranked[0]["record_id"] == target_id  # limit 10: every hit is listed
        norm: dict[str, dict[str, float]] = {}
        for channel in ("lexical", "semantic"):
            raw = {e["record_id"]: e[channel]["score"] for e in ranked if channel in e}
            mu = statistics.fmean(raw.values())
            sd = statistics.stdev(raw.values()) if len(raw) > 1 else 0.0
            norm[channel] = {r: 0.5 if sd == 0 else (v - (mu - 3 * sd)) / (6 * sd) for r, v in raw.items()}
        assert len(norm["semantic"]) == 6  # exact search over all live records
        for e in ranked:
            expected = sum(0.5 * norm[c].get(e["record_id"], 0.0) for c in ("lexical", "semantic"))
            assert e["score"] == pytest.approx(expected, rel=1e-9), e


# ---- 2. a missing model: RANKING_UNAVAILABLE, never an empty success --------------------------


class InProcess:
    """The real MCP server object over the SDK's in-memory transport (no launch preflight)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return check_result(await self.client.call_tool("engram_memory_" + tool, arguments))


@asynccontextmanager
async def engine_without_model(data_dir: Path) -> AsyncIterator[InProcess]:
    """A model that vanished after launch (serve refuses a missing one before serving): the
    engine must keep answering, lexically, and say the semantic channel is unavailable."""
    from mcp import Client

    from engram_memory.server.app import build_server
    from engram_memory.server.config import load_config
    from engram_memory.server.launch import launch_dispatcher, open_engine
    from engram_memory.server.tools import instructions

    cfg = load_config(CONTEXT | {"tools": ALL, "data_dir": data_dir, "model_path": Path("/nonexistent")})
    engine = open_engine(cfg)
    try:
        server = build_server(launch_dispatcher(cfg, engine), instructions(cfg.semantic))
        async with Client(server, mode="legacy") as client:
            yield InProcess(client)
    finally:
        engine.close()


async def test_missing_model_is_ranking_unavailable_and_lexical_still_works(data_dir_factory) -> None:
    async with engine_without_model(data_dir_factory("nomodel")) as mcp:
        record_id = await admit(mcp, "Pin the CPU build of torch next to sentence-transformers.")
        # The failed load is immediate; the answer stays the same, call after call.
        for _ in range(5):
            out = await mcp.call("search", search_args("torch CPU build", capability_policy=HYBRID))
            assert out["ok"] is False and out["error"] == UNAVAILABLE, out
            assert "output" not in out
            await anyio.sleep(0.2)

        lexical = await mcp.call("search", search_args("torch CPU build"))
        assert ids_of(lexical) == [record_id]
        receipt = lexical["output"]["value"]["rank_receipt"]
        assert receipt["profile"] == "lexical_v1"
        assert receipt["fusion"] == {"method": "none", "rerank": RERANK}  # the stage runs on one channel too
        lex, sem = receipt["channels"]
        assert lex["channel"] == "lexical" and lex["contributed"] is True
        assert sem["channel"] == "semantic" and sem["contributed"] is False
        assert (sem["engine"], sem["index_kind"]) == ("none", "none")
        assert "model_digest" not in sem  # unknown for a missing model: omitted, never null
        assert all("semantic" not in e and "lexical" in e for e in receipt["ranked"])
        explicit = await mcp.call("search", search_args("torch CPU build", capability_policy={
            "minimum_channels": "lexical", "network": "forbid"}))
        assert ids_of(explicit) == [record_id]


async def test_rebuild_index_with_missing_model_is_refused_promptly(
    start_server, data_dir_factory, offline_env
) -> None:
    """A mistyped --model-path is a one-line refusal before any work (it used to rebuild with 0 vectors)."""
    data_dir = data_dir_factory("rebuild-nomodel")
    async with start_server(data_dir, extra=LEXICAL_ONLY) as mcp:
        record_id = await admit(mcp, "Keep the lexical projection when the model directory is gone.")
    t0 = time.monotonic()
    try:
        proc = await anyio.to_thread.run_sync(lambda: run_cli(
            ["rebuild-index", "--data-dir", str(data_dir), "--model-path", "/nonexistent"], offline_env, timeout=20))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"rebuild-index --model-path /nonexistent still running after {exc.timeout} s"
                    f" (stderr: {exc.stderr!r})")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert time.monotonic() - t0 < 20
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1] == (
        "engram-memory: error: --model-path /nonexistent does not exist (omit it to use the packaged model)")
    async with start_server(data_dir, extra=LEXICAL_ONLY) as mcp:  # the store is untouched
        assert ids_of(await mcp.call("search", search_args("lexical projection model directory"))) == [record_id]


# ---- 3. paging over MCP -------------------------------------------------------------------------


async def test_paging_visits_every_record_once_and_stale_cursors_are_refused(
    start_server, data_dir_factory, backend
) -> None:
    """On PostgreSQL the page-cursor key is the store's (a row wrapped by the master key), not a file."""
    texts = [f"The ledger reconciliation step {word} runs after the nightly import."
             for word in ("alpha", "bravo", "charlie", "delta", "echo")]
    async with start_server(data_dir_factory("paging"), extra=LEXICAL_ONLY, backend=backend) as mcp:
        admitted = [await admit(mcp, t) for t in texts]
        await admit(mcp, "Unrelated: keep the staging bucket private.")  # never part of the pages

        query = search_args("ledger reconciliation", limit=2)
        seen: list[str] = []
        ranks: list[int] = []
        cursors: list[str] = []
        args = dict(query)
        for _ in range(10):
            page = await mcp.call("search", args)
            got = ids_of(page)
            value = page["output"]["value"]
            assert 1 <= len(got) <= 2, value
            seen += got
            ranks += [p["rank"] for p in value["records"]]
            if "next_page_cursor" not in value:
                break
            cursors.append(value["next_page_cursor"])
            args = query | {"page_cursor": value["next_page_cursor"]}
        assert len(cursors) == 2  # pages of 2, 2, 1
        assert sorted(seen) == sorted(admitted) and len(seen) == len(set(seen)) == 5
        assert ranks == [1, 2, 3, 4, 5]
        assert len(set(cursors)) == 2

        # The same cursor with the same query replays the same page (no state changed).
        again = await mcp.call("search", query | {"page_cursor": cursors[0]})
        assert ids_of(again) == seen[2:4]

        # A forged cursor: one character flipped, or a body re-written under the old MAC.
        for forged in (forge(cursors[0]), reoffset(cursors[0], 0), cursors[0] + "A", "not-a-cursor"):
            out = await mcp.call("search", query | {"page_cursor": forged})
            assert out["error"] == STALE, (forged, out)
        # The cursor with another query, or the same query with other parameters.
        for other in (search_args("ledger import", limit=2), search_args("ledger reconciliation", limit=3),
                      search_args("ledger reconciliation", limit=2, max_packet_bytes=8192)):
            out = await mcp.call("search", other | {"page_cursor": cursors[0]})
            assert out["error"] == STALE, (other, out)

        # A new admission changes the state the cursor pinned.
        new_id = await admit(mcp, "The ledger reconciliation step foxtrot runs after the nightly import.")
        for cursor in cursors:
            out = await mcp.call("search", query | {"page_cursor": cursor})
            assert out["error"] == STALE, out
        fresh = await mcp.call("search", search_args("ledger reconciliation", limit=10))
        assert sorted(ids_of(fresh)) == sorted(admitted + [new_id])


# ---- 4. forget purges the projection files ----------------------------------------------------


async def test_forget_purges_the_marker_from_every_projection_file(start_server, data_dir_factory, backend) -> None:
    """On PostgreSQL too: the projections are the node's own files in its data dir."""
    data_dir = data_dir_factory("purge")
    projections = data_dir / "projections"
    marker, control = "quorblaxian", "zentrivolt"
    human = Human()
    async with start_server(data_dir, human=human, extra=LEXICAL_ONLY, backend=backend) as mcp:
        record_id = await admit(mcp, f"The {marker} cache warms the index before the first query.")
        keep_id = await admit(mcp, f"The {control} pool drains connections on shutdown.")
        # A search projects the admissions waiting for it (they are applied in groups), so the
        # files hold both records now. Projection files are not DuckDB: readable while the server
        # runs. Tantivy keeps the text.
        assert ids_of(await mcp.call("search", search_args(marker))) == [record_id]
        before = files_containing(projections, marker.encode())
        assert before, "the marker is not in any projection file even before forget"
        assert files_containing(projections, control.encode())

        forgot = await mcp.call("forget", {"record_id": record_id, "idempotency_key": key("forget"),
                                           "reason_ref": "reason:obsolete"})
        assert forgot["ok"], forgot
        value = forgot["output"]["value"]
        assert value["projection_invalidation"] == "complete"
        assert value["coverage_receipt_digest"].startswith("sha256:")
        assert value["receipt"]["to_state"] == "tombstoned" and value["replayed"] is False
        assert len(human.prompts) == 1 and record_id in human.prompts[0].message
        assert ids_of(await mcp.call("search", search_args(marker))) == []
        assert ids_of(await mcp.call("search", search_args(control))) == [keep_id]

    # No server runs now: every file under projections/, hidden ones included.
    assert files_containing(projections, marker.encode()) == []
    assert files_containing(projections, marker.capitalize().encode()) == []
    assert files_containing(projections, control.encode()), "the surviving record vanished too"


# ---- 5 and 6. rebuild-index, restart and cross-process determinism under a frozen clock -----
# DuckDB only: ``rebuild-index`` takes no --store yet, and two PostgreSQL nodes share one journal
# (cross-node determinism belongs to the multi-node tests).

CORPUS = [
    "Projections are derived data: rebuild them from the DuckDB journal.",
    "The journal keeps one dense cursor per tenant and workspace scope.",
    "Rank receipts name every channel, its engine and its index cursor.",
    "Page cursors are authenticated with the data directory's server key.",
    "Forgotten records are purged from every projection of the scope.",
]
FORGET_TEXT = "A temporary journal note that the operator forgets."
PAGED = search_args("journal cursor projection scope", limit=2)  # 2 of 4 matches: has a next page
WHOLE = search_args("journal cursor projection scope receipts", limit=10)  # everything on one page


def frozen_env(offline_env: dict[str, str]) -> dict[str, str]:
    return offline_env | {"ENGRAM_CLOCK_MS": str(FROZEN_MS)}


def frozen_server(data_dir: Path, offline_env: dict[str, str], human: Human | None = None) -> Any:
    return mcp_server(serve_argv(data_dir, extra=LEXICAL_ONLY), frozen_env(offline_env), human=human)


async def frozen_searches(mcp: Mcp) -> dict[str, dict[str, Any]]:
    paged = await mcp.call("search", PAGED)
    second = await mcp.call("search", PAGED | {"page_cursor": paged["output"]["value"]["next_page_cursor"]})
    return {"paged": paged, "second": second, "whole": await mcp.call("search", WHOLE)}


async def build_frozen(data_dir: Path, offline_env: dict[str, str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The fixed sequence of tool calls: fixed keys, fixed instants, a forget and a pending capture."""
    async with frozen_server(data_dir, offline_env, human=Human()) as mcp:
        ids = [await admit(mcp, text, capture_key=f"frozen-capture-{i:04d}", admit_key=f"frozen-admit-{i:06d}",
                           fixed_time=True) for i, text in enumerate(CORPUS + [FORGET_TEXT])]
        pending = capture_args("A pending candidate never shows up in search.", key="frozen-pending-0001")
        pending["payload"]["valid_time"] = {"t": FROZEN_VALID_T}
        pending["payload"]["primary_event"]["at"] = FROZEN_VALID_T
        assert (await mcp.call("capture", pending))["ok"]
        forgot = await mcp.call("forget", {"record_id": ids[-1], "idempotency_key": "frozen-forget-000001",
                                           "reason_ref": "reason:obsolete"})
        assert forgot["ok"] and forgot["output"]["value"]["projection_invalidation"] == "complete", forgot
        searches = await frozen_searches(mcp)
    return ids[:-1], searches


@pytest.fixture(scope="module")
def frozen_corpus(data_dir_factory: Callable[[str], Path], offline_env: dict[str, str]
                  ) -> tuple[Path, list[str], dict[str, dict[str, Any]]]:
    data_dir = data_dir_factory("frozen-a")
    ids, searches = anyio.run(build_frozen, data_dir, offline_env)
    return data_dir, ids, searches


def check_frozen_searches(ids: list[str], searches: dict[str, dict[str, Any]]) -> None:
    """The reference answers are meaningful: the pages partition the matches; the clock is frozen."""
    paged, second, whole = (searches[k]["output"]["value"] for k in ("paged", "second", "whole"))
    assert len(paged["records"]) == 2 and "next_page_cursor" in paged
    assert "next_page_cursor" not in whole
    whole_ids = [p["record"]["record_id"] for p in whole["records"]]
    assert sorted(whole_ids) == sorted(ids)  # the forgotten one and the pending one are absent
    paged_ids = [p["record"]["record_id"] for p in paged["records"] + second["records"]]
    assert len(set(paged_ids)) == len(paged_ids) and set(paged_ids) <= set(ids)
    for value in (paged, second, whole):
        assert value["rank_receipt"]["valid_as_of"] == FROZEN_MS
        assert value["rank_receipt"]["issued_at"] == "2026-01-01T00:00:00.000Z"


async def test_rebuild_index_refuses_while_serving_then_verifies_identical_bytes(
    frozen_corpus, offline_env
) -> None:
    data_dir, ids, reference = frozen_corpus
    check_frozen_searches(ids, reference)
    env = frozen_env(offline_env)

    async with frozen_server(data_dir, offline_env) as mcp:
        busy = await anyio.to_thread.run_sync(lambda: run_cli(["rebuild-index", "--data-dir", str(data_dir)], env))
        assert busy.returncode == 1, (busy.returncode, busy.stdout, busy.stderr)
        assert busy.stdout == ""
        assert busy.stderr.strip().splitlines()[-1] == (
            f"engram-memory: error: STORE_BUSY: data dir {data_dir} is in use by a running server; stop it first")
        assert "Traceback" not in busy.stderr
        # Across a restart (same data dir, same frozen clock): the same bytes, page cursor included.
        restarted = await frozen_searches(mcp)
        # The refused rebuild touched nothing.
        assert (await mcp.call("search", WHOLE))["output"]["value"] == reference["whole"]["output"]["value"]
    for name in reference:
        assert value_bytes(restarted[name]) == value_bytes(reference[name]), name
        assert (restarted[name]["output"]["value"].get("next_page_cursor")
                == reference[name]["output"]["value"].get("next_page_cursor"))

    done = await anyio.to_thread.run_sync(lambda: run_cli(["rebuild-index", "--data-dir", str(data_dir), "--verify"],
                                                          env))
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("scope ")]
    assert len(lines) == 1, done.stdout
    assert f": {len(ids)} records, " in lines[0] and lines[0].endswith("verify: identical"), lines[0]
    assert "Traceback" not in done.stderr

    async with frozen_server(data_dir, offline_env) as mcp:
        rebuilt = await frozen_searches(mcp)
    for name in reference:
        assert value_bytes(rebuilt[name]) == value_bytes(reference[name]), name


async def test_two_processes_two_data_dirs_same_calls_same_bytes(
    frozen_corpus, data_dir_factory, offline_env
) -> None:
    _, ids_a, reference = frozen_corpus
    data_dir_b = data_dir_factory("frozen-b")
    ids_b, searches = await build_frozen(data_dir_b, offline_env)
    assert ids_b == ids_a  # record ids derive from content, instants and cursors: no randomness
    check_frozen_searches(ids_b, searches)
    # One page: records, rank receipt and response digest are byte-identical.
    assert value_bytes(searches["whole"]) == value_bytes(reference["whole"])
    # Paged: the ranking is identical; the cursor is HMAC'd with each data dir's own key, so it
    # (and the response digest binding it) must differ between the two directories.
    for name in ("paged", "second"):
        assert value_bytes(searches[name], ("records", "rank_receipt")) == value_bytes(
            reference[name], ("records", "rank_receipt")), name
    assert (searches["paged"]["output"]["value"]["next_page_cursor"]
            != reference["paged"]["output"]["value"]["next_page_cursor"])
    # And a cursor from one directory is STALE_PAGE in the other.
    async with frozen_server(data_dir_b, offline_env) as mcp:
        out = await mcp.call("search", PAGED | {"page_cursor": reference["paged"]["output"]["value"][
            "next_page_cursor"]})
        assert out["error"] == STALE, out



# ---- the rerank stage over MCP --------------------------------------------------------------



async def test_conversation_turns_are_reranked_by_speaker_and_neighbours_over_mcp(
    start_server, data_dir_factory
) -> None:
    """Turns captured a minute apart through the stdio server: the named speaker's turn leads and
    the receipt names the stage; the same store served with --no-rerank keeps the fused order."""
    data_dir = data_dir_factory("rerank")
    async with start_server(data_dir) as mcp:
        ids = []
        for i, text in enumerate(TURNS):
            args = capture_args(text, key=key(f"turn{i}"), at=FROZEN_VALID_T + i * 60_000)
            args["payload"]["primary_event"]["type_ref"] = "event:turn"  # the host says: a conversation turn
            cap = await mcp.call("capture", args)
            adm = await mcp.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                       "idempotency_key": key(f"turn-admit{i}")})
            ids.append(adm["output"]["value"]["outcome"]["record_id"])
        on, _ = await hybrid_when_ready(mcp, "When did Caroline go to the support group?")
        why = await mcp.call("search", search_args("Why did Caroline choose the adoption agency?",
                                                   capability_policy=HYBRID))
    async with start_server(data_dir, extra=["--no-rerank"]) as mcp:
        off, _ = await hybrid_when_ready(mcp, "When did Caroline go to the support group?")
    assert on["output"]["value"]["rank_receipt"]["fusion"]["rerank"] == RERANK
    assert "rerank" not in off["output"]["value"]["rank_receipt"]["fusion"]
    order_on, order_off = [ids.index(r) for r in ids_of(on)], [ids.index(r) for r in ids_of(off)]
    assert order_off[:2] == [1, 0] and order_on[0] == 1 and order_on.index(0) > 1  # "Thanks, Caroline!" drops
    assert ids_of(why)[0] == ids[3]  # her own answer leads


async def test_topic_notes_rank_exactly_as_fused_over_mcp(start_server, data_dir_factory) -> None:
    """Issue 24: notes opening "Postgres:" are topics, not speakers. Through the stdio server, the
    ranking with the stage equals the ranking of the same store served with --no-rerank."""
    from tests.test_engine_rerank import NOTES

    data_dir = data_dir_factory("topic-notes")
    query = "Which Postgres version do we run?"
    async with start_server(data_dir) as mcp:
        for i, text in enumerate(NOTES):  # a minute apart, typed as notes (event:decided)
            args = capture_args(text, key=key(f"note{i}"), at=FROZEN_VALID_T + i * 60_000)
            cap = await mcp.call("capture", args)
            adm = await mcp.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                       "idempotency_key": key(f"note-admit{i}")})
            assert adm["output"]["value"]["outcome"]["status"] == "accepted", adm
        on, _ = await hybrid_when_ready(mcp, query)
    async with start_server(data_dir, extra=["--no-rerank"]) as mcp:
        off, _ = await hybrid_when_ready(mcp, query)
    assert on["output"]["value"]["rank_receipt"]["fusion"]["rerank"] == RERANK  # the stage ran
    shown = [(p["record"]["record_id"], p["score"]) for p in on["output"]["value"]["records"]]
    assert shown == [(p["record"]["record_id"], p["score"]) for p in off["output"]["value"]["records"]]
    assert on["output"]["value"]["records"][0]["record"]["components"][0]["text"] == NOTES[3]  # the answer


async def test_credentials_stated_in_prose_are_rejected_over_mcp(start_server, data_dir_factory) -> None:
    """Issue 24: a credential said in a sentence, in any of the four languages, is rejected by the
    admission policy through the real server; talk about a password is admitted."""
    async with start_server(data_dir_factory("prose-secrets"), extra=["--no-semantic"]) as mcp:
        for i, (text, status) in enumerate([("the wifi password is sunflower", "rejected"),
                                            ("das WLAN-Passwort ist Sonnenblume", "rejected"),
                                            ("Netflix: jane@x.com / Netflix2023!", "rejected"),
                                            ("Login flow: user/pass then TOTP.", "accepted"),
                                            ("the password is wrong, ask IT to reset it", "accepted")]):
            cap = await mcp.call("capture", capture_args(text, key=key(f"prose{i}")))
            assert cap["ok"], cap
            adm = await mcp.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                       "idempotency_key": key(f"prose-admit{i}")})
            assert adm["output"]["value"]["outcome"]["status"] == status, (text, adm)
        found = await mcp.call("search", search_args("wifi password sunflower"))
        assert "sunflower" not in json.dumps(found["output"]["value"]["records"])
