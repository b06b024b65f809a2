"""`engram-memory admin export` and `admin import` (issue 25 §3) through the real CLI (subprocesses),
on both backends: real DuckDB data dirs and real PostgreSQL stores made by `admin init-store`.

Stores are filled by real engines (no embedding model, a frozen clock, so searches compare exactly);
the imports run at the same frozen instant (ENGRAM_CLOCK_MS). Every refusal is one line and its exit
code, and leaves the journal as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from engram_memory.models.settings import EngineSettings
from engram_memory.store.engine import Engine
from tests.conftest import DUCKDB, Backend, store_backend
from tests.store_fixtures import T0, call, capture_args, ctx, forget_args, sha, withdraw_args
from tests.test_admin_cli import admin, ok_json, refused

SCOPE = "acme/main"  # tests.store_fixtures.ctx()
PURPOSE = {"purpose_ref": "purpose:test"}
TEXTS = ["We adopted DuckDB for the lifecycle store", "Tantivy ranks the lexical channel with BM25",
         "The billing service moved to Rust in March", "Backups of the billing database run nightly at two",
         "The lexical channel indexes component text and citations"]
FORGOTTEN = "The staging cluster is called heron and will be retired"
WITHDRAWN = "A draft about the pelican migration that was withdrawn"
QUERIES = ["DuckDB lifecycle store", "lexical channel", "billing", "nightly backups", "Rust March", "heron",
           "pelican"]
PASSWORD = "Tr0ub4dor-3xK-horse"
GRAPH = [
    {"type": "entity", "name": "Alice Moreau", "entityType": "person",
     "observations": ["Leads the billing team", "Prefers PostgreSQL for ledgers",
                      f"Her database password is {PASSWORD}"]},
    {"type": "entity", "name": "Acme Billing", "entityType": "service",
     "observations": ["Written in Rust since March", "Invoices are generated on the first of the month"]},
    {"type": "entity", "name": "Nightly backup", "entityType": "job", "observations": []},
    {"type": "relation", "from": "Alice Moreau", "to": "Acme Billing", "relationType": "owns"},
    {"type": "relation", "from": "Nightly backup", "to": "Acme Billing", "relationType": "protects"},
]


def engine_on(backend: Backend, where: Path) -> Engine:
    """A real engine on the store: the DuckDB store in ``where``, or a node of the PostgreSQL store
    (``where`` is its node dir)."""
    settings = EngineSettings(data_dir=where, semantic=False, store=backend.store,
                              master_key_file=backend.master_key_file)
    return Engine.open(settings, clock=lambda: T0)


def store_args(backend: Backend, where: Path) -> list[str]:
    return backend.args() if backend.store else ["--data-dir", str(where)]


def cli(args: list[str]) -> Any:
    return admin(args, {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                        "ENGRAM_CLOCK_MS": str(T0)})


def cli_json(args: list[str]) -> Any:
    proc = cli([*args, "--json"])
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


def fill(engine: Engine) -> dict[str, Any]:
    """Five current records (one with two citations), one forgotten, one withdrawn candidate,
    one candidate still pending."""
    c, out = ctx(), {"records": {}}
    for i, text in enumerate([*TEXTS, FORGOTTEN]):
        extra: dict[str, Any] = {}
        if i == 1:
            extra = {"components": [{"component_id": "c1", "kind": "decision", "text": text,
                                     "citation_ids": ["s1", "s2"]}],
                     "citations": [{"citation_id": "s1", "source_ref": "doc:adr-7",
                                    "locator": {"scheme": "path", "value": "docs/adr-7.md#L3"},
                                    "content_digest": sha(text)},
                                   {"citation_id": "s2", "source_ref": "doc:bench-2",
                                    "locator": {"scheme": "url", "value": "https://example.test/bench#2"},
                                    "content_digest": sha("bench " + text)}]}
        cap = call(engine, "capture", c, capture_args(text, key=f"capture-key-{i:06d}", **extra))
        adm = call(engine, "request_admission", c,
                   {"candidate_id": cap["candidate_id"], "idempotency_key": f"admit-key-{i:07d}"})
        out["records"][text] = adm["outcome"]["record_id"]
    call(engine, "forget", c, forget_args(out["records"][FORGOTTEN]))
    cap = call(engine, "capture", c, capture_args(WITHDRAWN, key="withdrawn-key-00001"))
    call(engine, "withdraw", c, withdraw_args(cap["candidate_id"]))
    call(engine, "capture", c, capture_args("Still undecided about the osprey", key="pending-key-000001"))
    return out


def searches(engine: Engine, scope_ctx: Any = None, queries: list[str] = QUERIES) -> list[list[Any]]:
    """Each probe's hits: texts and citations, in rank order."""
    return [[(hit["record"]["components"], hit["record"]["citations"])
             for hit in call(engine, "search", scope_ctx or ctx(), {"query": q, **PURPOSE})["records"]]
            for q in queries]


def journal(backend: Backend, where: Path, scope: str) -> list[Any]:
    return cli_json(["history", "--scope", scope, *store_args(backend, where)])["events"]


@pytest.fixture
def other(backend: Backend, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A second, empty store of the same backend."""
    with store_backend(backend.name, request, tmp_path / "other-key") as chosen:
        yield chosen


# ---- the round trip ---------------------------------------------------------------------------


def test_export_then_import_into_an_empty_store_answers_the_same_searches(
        backend: Backend, other: Backend, tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    engine = engine_on(backend, source)
    try:
        seeded = fill(engine)
        before = searches(engine)
    finally:
        engine.close()
    # The probes discriminate, and some rank several records (an order to keep).
    assert any(len(hits) >= 2 for hits in before) and all(len(hits) < len(TEXTS) for hits in before)

    out = tmp_path / "scope.jsonl"
    done = cli_json(["export", "--scope", SCOPE, "--out", str(out), *store_args(backend, source)])
    assert done["records"] == len(TEXTS) and (out.stat().st_mode & 0o777) == 0o600
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0] == {"format": "engram-memory-export", "version": 1, "scope": SCOPE,
                        "exported_at": "2026-05-28T20:26:40.000Z", "records": len(TEXTS)}
    records = lines[1:]
    assert [r["payload"]["components"][0]["text"] for r in records] == TEXTS  # journal order
    assert [r["record_id"] for r in records] == [seeded["records"][t] for t in TEXTS]
    assert {r["state"] for r in records} == {"accepted_current"}
    assert len(records[1]["payload"]["citations"]) == 2
    text = out.read_text()
    # Never a forgotten record, a withdrawn or pending candidate, a key or a key reference.
    for absent in (FORGOTTEN, seeded["records"][FORGOTTEN], WITHDRAWN, "osprey", "key_ref", "dek"):
        assert absent not in text
    assert all(set(r) == {"record_id", "state", "record_digest", "payload_digest", "recorded_at",
                          "recorded_cursor", "evidence_digest", "payload"} for r in records)
    if backend.store is None:
        for key_file in (source / "master.key", *(source / "keys").glob("*")):
            secret = key_file.read_bytes()
            assert secret.hex() not in text and secret not in text.encode()

    report = cli_json(["import", "--scope", SCOPE, "--from", str(out), *store_args(other, target)])
    assert report["format"] == "engram-memory-export/1" and report["store_changed"] is True
    assert report["counts"] == {"items": len(TEXTS), "imported": len(TEXTS), "already_present": 0,
                                "rejected": 0, "pending_adjudication": 0, "invalid": 0}
    engine = engine_on(other, target)
    try:
        after = searches(engine)
    finally:
        engine.close()
    assert after == before

    # A second import of the same file changes nothing.
    head = journal(other, target, SCOPE)
    again = cli_json(["import", "--scope", SCOPE, "--from", str(out), *store_args(other, target)])
    assert again["counts"]["imported"] == 0 and again["counts"]["already_present"] == len(TEXTS)
    assert again["store_changed"] is False and journal(other, target, SCOPE) == head


def test_content_forgotten_since_the_export_waits_for_an_operator(backend: Backend, tmp_path: Path) -> None:
    """Importing an older export back: what is current is already present; what was forgotten since
    is never silently re-admitted (pending adjudication), and a withdrawn candidate stays out."""
    source = tmp_path / "source"
    engine = engine_on(backend, source)
    try:
        seeded = fill(engine)
    finally:
        engine.close()
    out = tmp_path / "scope.jsonl"
    cli_json(["export", "--scope", SCOPE, "--out", str(out), *store_args(backend, source)])
    engine = engine_on(backend, source)
    try:
        call(engine, "forget", ctx(), forget_args(seeded["records"][TEXTS[2]], key="forget-key-0000002"))
    finally:
        engine.close()
    report = cli_json(["import", "--scope", SCOPE, "--from", str(out), *store_args(backend, source)])
    assert report["counts"] == {"items": len(TEXTS), "imported": 0, "already_present": len(TEXTS) - 1,
                                "rejected": 0, "pending_adjudication": 1, "invalid": 0}
    assert report["pending_adjudication"][0]["item"] == f"line 4 ({seeded['records'][TEXTS[2]]})"
    pending = cli_json(["candidates", "--scope", SCOPE, *store_args(backend, source)])["candidates"]
    assert report["pending_adjudication"][0]["candidate_id"] in {c["candidate_id"] for c in pending}


# ---- the MCP memory server's knowledge graph ---------------------------------------------------


def test_memory_graph_import_rejects_the_secret_and_a_second_import_is_a_no_op(
        backend: Backend, tmp_path: Path) -> None:
    where = tmp_path / "store"
    graph = tmp_path / "memory.json"
    too_long = {"type": "entity", "name": "Huge", "entityType": "blob", "observations": ["x" * 70_000]}
    graph.write_text("\n".join(json.dumps(item) for item in [*GRAPH, too_long]) + "\n")
    proc = cli(["import", "--scope", "acme/graph", "--from", str(graph), *store_args(backend, where), "--json"])
    assert proc.returncode == 0, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["format"] == "mcp-memory-graph"
    # 5 observations + 1 entity without observations + 2 relations + the too long one.
    assert report["counts"] == {"items": 9, "imported": 7, "already_present": 0, "rejected": 1,
                                "pending_adjudication": 0, "invalid": 1}
    assert report["rejected"] == [{"item": "line 1 entity 'Alice Moreau' observation 3",
                                   "reason": "secret:prose_credential"}]
    assert report["invalid"][0]["item"] == "line 6 entity 'Huge' observation 1"
    assert report["invalid"][0]["reason"].startswith("INVALID_SCHEMA")

    graph_ctx = ctx(workspace="graph")
    engine = engine_on(backend, tmp_path / "node" if backend.store else where)
    try:
        texts = [[c[0]["text"] for c, _cites in hits]
                 for hits in searches(engine, graph_ctx, ["billing", "Acme Billing owns", "password", "backup"])]
        record = call(engine, "get", graph_ctx, {"record_id": report["record_ids"][0], **PURPOSE})["record"]
    finally:
        engine.close()
    assert "Alice Moreau (person): Leads the billing team" in texts[0]
    assert "Alice Moreau owns Acme Billing" in texts[1]
    assert texts[2] == []  # the password never became memory
    assert "Nightly backup (job)" in texts[3] and "Nightly backup protects Acme Billing" in texts[3]
    assert record["primary_event"]["type_ref"] == "memory-graph:entity:person"
    assert record["citations"][0]["source_ref"] == "memory-graph:entity:Alice Moreau"

    head = journal(backend, where, "acme/graph")
    proc = cli(["import", "--scope", "acme/graph", "--from", str(graph), *store_args(backend, where)])
    assert proc.returncode == 0, proc.stderr
    assert "already present" in proc.stdout and "store unchanged" in proc.stdout
    assert PASSWORD not in proc.stdout + proc.stderr and "secret:prose_credential" in proc.stdout
    assert journal(backend, where, "acme/graph") == head

    # The same graph as one object (as the memory server's read_graph answers it): the same items.
    whole = tmp_path / "graph.json"
    whole.write_text(json.dumps({"entities": [{k: v for k, v in e.items() if k != "type"} for e in GRAPH[:3]],
                                 "relations": [{k: v for k, v in r.items() if k != "type"} for r in GRAPH[3:]]}))
    again = cli_json(["import", "--scope", "acme/graph", "--from", str(whole), *store_args(backend, where)])
    assert again["counts"] == {"items": 8, "imported": 0, "already_present": 7, "rejected": 1,
                               "pending_adjudication": 0, "invalid": 0}
    assert again["store_changed"] is False and journal(backend, where, "acme/graph") == head

    # A malformed file: one line, exit 2, nothing written.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(GRAPH[0]) + "\n" + '{"type": "relation", "from": "Alice Moreau"}\n')
    refused(cli(["import", "--scope", "acme/graph", "--from", str(bad), *store_args(backend, where)]), 2,
            f"{bad} line 2: not a memory graph entity")
    bad.write_text("this is not json\n")
    refused(cli(["import", "--scope", "acme/graph", "--from", str(bad), *store_args(backend, where)]), 2,
            f"{bad} line 1 is not JSON")
    assert journal(backend, where, "acme/graph") == head


# ---- refusals -----------------------------------------------------------------------------------


def test_export_and_import_refuse_a_data_dir_a_server_holds(tmp_path: Path) -> None:
    where, out = tmp_path / "store", tmp_path / "out.jsonl"
    engine = engine_on(DUCKDB, where)
    try:
        fill(engine)
        out.write_text('{"format": "engram-memory-export", "version": 1}\n')
        for args in (["export", "--out", str(tmp_path / "new.jsonl")], ["import", "--from", str(out)]):
            refused(cli([*args, "--scope", SCOPE, "--data-dir", str(where)]), 1, "STORE_BUSY: data dir")
    finally:
        engine.close()
    assert not (tmp_path / "new.jsonl").exists()
    refused(cli(["export", "--scope", SCOPE, "--data-dir", str(where), "--out", str(out)]), 2,
            f"--out {out} already exists")
    refused(cli(["export", "--scope", "acme/none", "--data-dir", str(where), "--out", str(tmp_path / "n.jsonl")]),
            2, "no scope acme/none")
    out.write_text('{"format": "engram-memory-export", "version": 9}\n')
    refused(cli(["import", "--scope", SCOPE, "--data-dir", str(tmp_path / "fresh"), "--from", str(out)]), 2,
            f"{out} line 1: not an engram-memory-export version 1 header")
    assert not (tmp_path / "fresh").exists()  # refused before a store was created
    ok_json(["verify", "--data-dir", str(where)])


@pytest.mark.anyio
async def test_an_imported_graph_is_what_an_agent_finds_through_the_server(
        tmp_path: Path, offline_env: dict[str, str]) -> None:
    """The host imports; the agent, through a real stdio server and the MCP SDK client, searches
    and reads what was imported -- and never the observation the policy refused."""
    from tests.conftest import CONTEXT, mcp_server, search_args, serve_argv

    where = tmp_path / "store"
    graph = tmp_path / "memory.json"
    graph.write_text("\n".join(json.dumps(item) for item in GRAPH) + "\n")
    scope = f"{CONTEXT['tenant']}/{CONTEXT['workspace']}"
    assert cli(["import", "--scope", scope, "--from", str(graph), "--data-dir", str(where)]).returncode == 0
    async with mcp_server(serve_argv(where, extra=["--no-semantic"]), offline_env) as mcp:
        found = await mcp.call("search", search_args("billing team PostgreSQL ledgers"))
        assert found["ok"], found
        texts = [c["text"] for p in found["output"]["value"]["records"] for c in p["record"]["components"]]
        assert any("Leads the billing team" in t for t in texts) and any("ledgers" in t for t in texts)
        first = found["output"]["value"]["records"][0]["record"]["record_id"]
        got = await mcp.call("get", {"record_id": first, "purpose_ref": CONTEXT["purpose_ref"]})
        assert got["ok"], got
        secret = await mcp.call("search", search_args("database password"))
        assert secret["ok"] and PASSWORD not in json.dumps(secret)
