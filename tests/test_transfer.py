"""`engram-memory admin export` and `admin import` (issue 25 §3) through the real CLI (subprocesses),
on both backends: real DuckDB data dirs and real PostgreSQL stores made by `admin init-store`.

Stores are filled by real engines (no embedding model, a frozen clock, so searches compare exactly);
the imports run at the same frozen instant (ENGRAM_CLOCK_MS). Every refusal is one line and its exit
code, and leaves the journal as it was.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.crypto import key_files
from engram_memory.store.core.engine import Engine
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
        for key_file in (source / "master.key", *key_files(source / "keys")):
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
        out.write_text('{"format": "engram-memory-export", "version": 1, "scope": "acme/main", "records": 0}\n')
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


# ---- hostile and ordinary files (issue 40 §2) ---------------------------------------------------

# Every character str.splitlines() breaks a line on but JSON does not, and one character of each
# plane that has any (0, 1, 2, 3, 14, 15, 16; 4-13 are unassigned but still pass through).
SEPARATORS = ["\u2028", "\u2029", "\u0085", "\x1c", "\x1d", "\x1e"]
PLANES = ["\u00e9", "\U0001F600", "\U00020000", "\U00030000", "\U00040000", "\U000D0000", "\U000E0041",
          "\U000F0000", "\U0010FFFD"]
ODD = [f"Line separator {c!r} between two halves{c}of one note" for c in SEPARATORS] + \
    [f"Plane {ord(c) >> 16} character {c} kept whole" for c in PLANES]


def test_every_line_separator_and_every_plane_round_trip(backend: Backend, other: Backend, tmp_path: Path) -> None:
    """An export holding U+2028, U+2029, U+0085 (and the other characters splitlines() breaks on)
    and a character of every plane imports back whole; so does a memory graph holding them."""
    source, target = tmp_path / "source", tmp_path / "target"
    engine = engine_on(backend, source)
    try:
        for i, text in enumerate(ODD):
            cap = call(engine, "capture", ctx(), capture_args(text, key=f"odd-capture-{i:06d}"))
            call(engine, "request_admission", ctx(), {"candidate_id": cap["candidate_id"],
                                                      "idempotency_key": f"odd-admit-{i:07d}"})
    finally:
        engine.close()
    out = tmp_path / "odd.jsonl"
    cli_json(["export", "--scope", SCOPE, "--out", str(out), *store_args(backend, source)])
    assert "\u2028".encode() in out.read_bytes()  # raw in the file: only "\n" ends a line
    report = cli_json(["import", "--scope", SCOPE, "--from", str(out), *store_args(other, target)])
    assert report["counts"]["imported"] == len(ODD) and report["counts"]["invalid"] == 0, report
    exported = [json.loads(line) for line in out.read_bytes().split(b"\n")[1:] if line]
    assert [r["payload"]["components"][0]["text"] for r in exported] == ODD

    graph = tmp_path / "memory.json"
    graph.write_text("".join(json.dumps({"type": "entity", "name": f"Note {i}", "entityType": "odd",
                                         "observations": [text]}, ensure_ascii=False) + "\n"
                             for i, text in enumerate(ODD)), encoding="utf-8")
    report = cli_json(["import", "--scope", "acme/graph", "--from", str(graph), *store_args(other, target)])
    assert report["counts"]["imported"] == len(ODD) and report["counts"]["invalid"] == 0, report


def test_a_truncated_or_edited_export_is_refused_whole_unless_allow_partial(
        backend: Backend, other: Backend, tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    engine = engine_on(backend, source)
    try:
        fill(engine)
    finally:
        engine.close()
    out = tmp_path / "scope.jsonl"
    cli_json(["export", "--scope", SCOPE, "--out", str(out), *store_args(backend, source)])
    lines = out.read_bytes().split(b"\n")[:-1]
    truncated, edited = tmp_path / "truncated.jsonl", tmp_path / "edited.jsonl"
    truncated.write_bytes(b"\n".join(lines[:3]) + b"\n")
    record = json.loads(lines[3])
    record["payload"]["components"][0]["text"] = "The billing service moved to Go in April"
    edited.write_bytes(b"\n".join([*lines[:3], json.dumps(record).encode(), *lines[4:]]) + b"\n")
    refused(cli(["import", "--scope", SCOPE, "--from", str(truncated), *store_args(other, target)]), 2,
            f"{truncated}: the header says 5 record(s), the file holds 2 (truncated?); nothing imported")
    refused(cli(["import", "--scope", SCOPE, "--from", str(edited), *store_args(other, target)]), 2,
            f"{edited} line 4 ({record['record_id']}): the payload does not match its payload_digest")
    if other.store is None:
        assert not target.exists()  # refused before a store was created
    # --allow-partial: what checks is imported, the rest reported
    proc = cli(["import", "--scope", SCOPE, "--from", str(truncated), "--allow-partial", "--json",
                *store_args(other, target)])
    assert proc.returncode == 0 and "the header says 5 record(s), the file holds 2" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["counts"]["imported"] == 2
    report = cli_json(["import", "--scope", SCOPE, "--from", str(edited), "--allow-partial",
                       *store_args(other, target)])
    assert report["counts"] == {"items": 5, "imported": 2, "already_present": 2, "rejected": 0,
                                "pending_adjudication": 0, "invalid": 1}
    assert report["invalid"] == [{"item": f"line 4 ({record['record_id']})",
                                  "reason": "DIGEST_MISMATCH: the payload does not match its payload_digest"}]


def test_pretty_printed_graph_bom_and_unpaired_surrogates(tmp_path: Path) -> None:
    where = tmp_path / "store"
    pretty = tmp_path / "graph.json"  # as the reference server's read_graph answers, saved by a Windows editor
    whole = {"entities": [{k: v for k, v in e.items() if k != "type"} for e in GRAPH[:3]],
             "relations": [{k: v for k, v in r.items() if k != "type"} for r in GRAPH[3:]]}
    pretty.write_bytes(b"\xef\xbb\xbf" + json.dumps(whole, indent=2).replace("\n", "\r\n").encode())
    report = cli_json(["import", "--scope", "acme/graph", "--from", str(pretty), "--data-dir", str(where)])
    assert report["format"] == "mcp-memory-graph" and report["counts"]["imported"] == 7, report
    lines = tmp_path / "memory.jsonl"
    lines.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps(item).encode() + b"\r\n" for item in GRAPH))
    again = cli_json(["import", "--scope", "acme/graph", "--from", str(lines), "--data-dir", str(where)])
    assert again["counts"]["already_present"] == 7 and again["store_changed"] is False

    # an unpaired surrogate (a JSON escape) is an invalid item on either format, never a traceback
    lone = tmp_path / "lone.jsonl"
    lone.write_text('{"type": "entity", "name": "Bad \\ud800 name", "entityType": "x", "observations": ["a"]}\n'
                    '{"type": "entity", "name": "Good name", "entityType": "x",'
                    ' "observations": ["fine \\ud83d\\ude00"]}\n')
    proc = cli(["import", "--scope", "acme/graph", "--from", str(lone), "--data-dir", str(where), "--json"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert report["counts"]["imported"] == 1 and report["invalid"] == [
        {"item": "line 1 entity 'Bad \\ud800 name' observation 1",
         "reason": "INVALID_SCHEMA: text holds an unpaired surrogate (not valid Unicode)"}]
    out = tmp_path / "export.jsonl"
    cli_json(["export", "--scope", "acme/graph", "--out", str(out), "--data-dir", str(where)])
    head, first, *rest = out.read_text().split("\n")
    bad = json.loads(first)
    bad["payload"]["components"][0]["text"] = "Bad \ud800 text"
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([head, json.dumps(bad), *rest]))
    proc = cli(["import", "--scope", "acme/copy", "--from", str(broken), "--data-dir", str(where), "--json"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["invalid"][0]["reason"] == report["invalid"][0]["reason"]
    # imported into another scope than the export's: said, on stderr and in the report
    assert "was exported from scope acme/graph; its records are imported into acme/copy" in proc.stderr
    assert json.loads(proc.stdout)["notes"] == [f"{broken} was exported from scope acme/graph; its records are"
                                                " imported into acme/copy"]


def test_import_and_restore_read_regular_files_only(tmp_path: Path) -> None:
    """/dev/zero, a FIFO, a directory, a line over the cap: one line each, at once, nothing created."""
    where = tmp_path / "store"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as fh:
        fh.write(b'{"type": "entity", "name": "' + b"x" * (5 * 1024 * 1024) + b'"}\n')
    for path, start in ((Path("/dev/zero"), "/dev/zero is not a regular file"),
                        (fifo, f"{fifo} is not a regular file"),
                        (tmp_path, f"{tmp_path} is a directory"),
                        (huge, f"{huge} line 1 is longer than 4 MiB")):
        proc = admin(["import", "--scope", SCOPE, "--from", str(path), "--data-dir", str(where)], timeout=30)
        refused(proc, 2, start)
    assert not where.exists()
    for args, start in ((["--from", str(tmp_path)], f"--from {tmp_path} is a directory, not a backup file"),
                        (["--from", str(huge), "--key", str(tmp_path)], f"--key {tmp_path} is a directory"),
                        (["--from", str(fifo)], f"--from {fifo} is not a regular file")):
        refused(admin(["restore", "--data-dir", str(tmp_path / "r"), *args], timeout=30), 2, start)


# ---- interruption and progress (issue 40 §3) ----------------------------------------------------


def _import_until_progress(graph: Path, where: Path, scope: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Start an import (stderr a pipe, not a terminal) and read its stderr until it has imported some items."""
    proc = subprocess.Popen([sys.executable, "-m", "engram_memory.server.cli", "admin", "import", "--scope", scope,
                             "--from", str(graph), "--data-dir", str(where)],
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("engram-memory: importing: ") and not line.startswith("engram-memory: importing: 0/"):
            return proc, seen
    raise AssertionError(("".join(seen), proc.wait()))


def test_sigint_says_how_far_and_sigkill_is_recoverable_then_the_same_command_finishes(tmp_path: Path) -> None:
    graph, where = tmp_path / "memory.jsonl", tmp_path / "store"
    total = 3000  # batches commit hundreds of items at once: enough that both interrupted runs leave work
    graph.write_text("".join(json.dumps({"type": "entity", "name": f"Entity {e}", "entityType": "note",
                                         "observations": [f"Observation {e}-{k} about ledger {e * 10 + k}"
                                                          for k in range(10)]}) + "\n"
                             for e in range(total // 10)))
    # SIGINT: one line saying how far it got and what to do, exit 130
    proc, seen = _import_until_progress(graph, where, SCOPE)
    assert seen[:2] == [f"engram-memory: read {total} item(s) (mcp-memory-graph)\n",
                        f"engram-memory: importing: 0/{total} item(s)\n"], seen
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and out == "" and "Traceback" not in err, (proc.returncode, err)
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"engram-memory: interrupted after \d+ item\(s\) of {total}; run the same command again"
                        " to finish", last), last
    # SIGKILL: verify says either ok or that what is left is the recoverable kind, and what repairs it
    proc, _seen = _import_until_progress(graph, where, SCOPE)
    proc.kill()
    proc.communicate(timeout=60)
    check = admin(["verify", "--data-dir", str(where), "--json"])
    report = json.loads(check.stdout)
    if not report["ok"]:
        assert check.returncode == 1 and report["recoverable"] is True, check.stdout
        assert "the next open repairs it" in check.stderr, check.stderr
    # the same command finishes, without duplicates, and shows every phase as plain lines
    done = cli(["import", "--scope", SCOPE, "--from", str(graph), "--data-dir", str(where), "--json"])
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)["counts"]
    assert counts["imported"] + counts["already_present"] == total and counts["invalid"] == 0, counts
    phases = [line.split(":")[1].strip().split(" ")[0] for line in done.stderr.splitlines()]
    assert phases[:2] == ["read", "importing"] and phases[-2:] == ["indexing", "done"], done.stderr
    assert f"engram-memory: importing: {total}/{total} item(s)" in done.stderr
    ok_json(["verify", "--data-dir", str(where)])
    exported = cli_json(["export", "--scope", SCOPE, "--out", str(tmp_path / "all.jsonl"), "--data-dir", str(where)])
    assert exported["records"] == total  # each observation once


def test_verify_names_an_orphan_key_as_recoverable_and_the_next_open_repairs_it(tmp_path: Path) -> None:
    from engram_memory.store.core.crypto import KeyStore

    where = tmp_path / "store"
    engine = engine_on(DUCKDB, where)
    try:
        fill(engine)
    finally:
        engine.close()
    KeyStore(where).create()  # what a write killed between its key file and its commit leaves
    proc = admin(["verify", "--data-dir", str(where)])
    assert proc.returncode == 1 and "data keys referenced by no candidate or record" in proc.stdout
    assert proc.stderr.startswith(f"engram-memory: error: STORE_INCONSISTENT: the store at {where} does not verify"
                                  " (1 problem(s)); all of the recoverable kind an interrupted write (a crash, a"
                                  " kill) leaves, nothing lost: the next open repairs it"), proc.stderr
    assert json.loads(admin(["verify", "--data-dir", str(where), "--json"]).stdout)["recoverable"] is True
    engine_on(DUCKDB, where).close()  # the next open
    assert ok_json(["verify", "--data-dir", str(where)])["ok"] is True
