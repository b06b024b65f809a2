"""Receipts anyone can check: `admin explain` re-derives a search's rank receipt from the store as of
its cursor; `admin check-receipt` recomputes a receipt's own digests without any store.

The golden transcript's calls are replayed into a fresh store by the engine, at the golden's pinned
clocks, and every search receipt is explained right after it was issued (the forget that follows
changes the corpus its scores were computed in); the replayed receipts are the golden's (ids, ranks
and digests exactly, floats within the model's CPU jitter). The other tests write small lexical
stores with the engine and run the real CLI in subprocesses.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engram_memory.models.context import HostContext
from engram_memory.models.digests import receipt_digest
from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from engram_memory.store.host.explain import check_receipt, explain_on, explain_with, parse_receipt, search_arguments
from tests.conftest import CONTEXT, REPO, Backend, store_backend
from tests.store_fixtures import PURPOSE, T0, call, capture_args, ctx, forget_args
from tests.test_golden_transcript import CLOCK_A_MS, CLOCK_B_MS, GOLDEN, PAGER, _align_floats

SCOPE = "acme/main"  # tests.store_fixtures.ctx()
MARKER = "okapi-violet-5521"  # in every text: an explanation never shows a record's content
TEXTS = [f"The journal lives in DuckDB {MARKER}", f"Tantivy indexes the journal words {MARKER}",
         f"The journal is hash chained per scope {MARKER}", f"Backups of the journal run nightly {MARKER}"]
LATER = [f"A second journal note about journal cursors {MARKER}", f"Compaction of the journal {MARKER}"]


def admin(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "admin", *args], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, cwd=str(REPO))


def write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return path


def search(engine: Engine, query: str = "journal", **extra: Any) -> dict[str, Any]:
    return call(engine, "search", ctx(), {"query": query, "purpose_ref": PURPOSE, **extra})


def admit(engine: Engine, texts: list[str], start: int = 0) -> list[str]:
    ids = []
    for i, text in enumerate(texts, start):
        cap = call(engine, "capture", ctx(), capture_args(text, key=f"explain-capture-{i:06d}"))
        adm = call(engine, "request_admission", ctx(),
                   {"candidate_id": cap["candidate_id"], "idempotency_key": f"explain-admit-{i:06d}"})
        ids.append(adm["outcome"]["record_id"])
    return ids


def open_lexical(data_dir: Path, **settings: Any) -> Engine:
    return Engine.open(EngineSettings(data_dir=data_dir, semantic=False, **settings), clock=lambda: T0)


def explained(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def mismatch(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """Exit 1: the differences one per line on stdout, then one line naming RECEIPT_MISMATCH."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("engram-memory: error: RECEIPT_MISMATCH: ") and proc.stderr.count("\n") == 1
    lines = proc.stdout.splitlines()
    assert lines and all(line.startswith("differs: ") for line in lines), proc.stdout
    return [line.removeprefix("differs: ") for line in lines]


# ---- the golden transcript ------------------------------------------------------------------------


def golden_calls(segment: str) -> list[dict[str, Any]]:
    """The golden's tool calls of one segment that were answered (an error changed nothing)."""
    steps = json.loads(GOLDEN.read_text(encoding="utf-8"))
    out = []
    for step in steps:
        request, response = step["request"], step["response"]
        if not step["step"].startswith(segment + ".") or request.get("method") != "tools/call":
            continue
        if "error" in response or response["isError"]:
            continue
        out.append({"step": step["step"], "tool": request["name"].removeprefix("engram_memory_"),
                    "arguments": request["arguments"], "value": json.loads(response["text"])["output"]["value"]})
    return out


def replay(engine: Engine, segment: str, cursors: dict[str, str], values: dict[str, dict[str, Any]]) -> int:
    """Replay a segment's calls; explain each search's receipt at once. Returns how many were explained."""
    c = HostContext(**CONTEXT)
    explainedn = 0
    for step in golden_calls(segment):
        args = dict(step["arguments"])
        if isinstance(args.get("page_cursor"), str):
            args["page_cursor"] = cursors[args["page_cursor"]]  # "<cursor n>": this run's own
        value = call(engine, step["tool"], c, args)
        if "next_page_cursor" in value:
            cursors[f"<cursor {len(cursors) + 1}>"] = value["next_page_cursor"]
        if step["tool"] != "search":
            continue
        golden = step["value"]["rank_receipt"]
        aligned, moved = _align_floats(golden, value["rank_receipt"])
        assert {k: v for k, v in aligned.items() if k != "receipt_digest"} == \
            {k: v for k, v in golden.items() if k != "receipt_digest"}, f"{step['step']}: not the golden's receipt"
        assert moved or aligned["receipt_digest"] == golden["receipt_digest"], step["step"]
        receipts = [parse_receipt(value)]
        if not moved:  # the golden's own bytes (its paging cursors are labels: the receipt alone)
            receipts.append(parse_receipt(golden))
        for receipt in receipts:
            arguments = search_arguments(receipt, **step["arguments"])
            result = explain_with(engine, receipt, arguments, c.scope_ref, engine.embedder)
            assert result.matched, (step["step"], result.differences)
            assert [row["record_id"] for row in result.rows] == [e["record_id"] for e in golden["ranked"]]
            assert not check_receipt(receipt, arguments).problems, step["step"]
            explainedn += 1
        values[step["step"]] = {"arguments": step["arguments"], "value": value}
    return explainedn


def test_golden_transcript_receipts_rederive(tmp_path: Path, backend: Backend) -> None:
    """Every search receipt of the golden transcript re-derives exactly from the store as of its
    cursor, on each store backend (the golden's bytes are the same on both)."""
    data_dir = tmp_path / "data"
    where = ["--data-dir", str(data_dir)] if backend.store is None else \
        ["--store", backend.store, "--master-key-file", str(backend.master_key_file)]
    store = {"store": backend.store, "master_key_file": backend.master_key_file}
    cursors: dict[str, str] = {}
    values: dict[str, dict[str, Any]] = {}
    engine = Engine.open(EngineSettings(data_dir=data_dir, **store), clock=lambda: CLOCK_A_MS)
    try:
        assert engine.wait_semantic(300), "the packaged embedding model did not load"
        done = replay(engine, "A", cursors, values)
        records = {e["record_id"] for v in values.values() for e in v["value"]["rank_receipt"]["ranked"]}
    finally:
        engine.close()
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False, **store), clock=lambda: CLOCK_B_MS)
    try:
        done += replay(engine, "B", cursors, values)
    finally:
        engine.close()
    searches = [s["step"] for seg in "AB" for s in golden_calls(seg) if s["tool"] == "search"]
    assert sorted(values) == sorted(searches) and len(searches) == 7, searches
    assert done >= len(searches)

    # The real CLI on the closed store: the last receipt matches; one from before the forget cannot
    # be re-derived any more, and says which record is gone -- by id, never its content.
    last = admin(["explain", *where, "--receipt",
                  str(write(tmp_path / "b.json", values["B.search.lexical"])), "--json"])
    assert last.returncode == 0, (last.stdout, last.stderr)
    assert explained(last)["matched"] is True
    early = values["A.search.default_policy"]
    proc = admin(["explain", *where, "--receipt", str(write(tmp_path / "a.json", early))])
    lines = mismatch(proc)
    gone = [line for line in lines if "has been forgotten since" in line]
    assert len(gone) == 1 and gone[0].startswith("record mem_"), lines
    assert gone[0].split()[1] not in records  # the pager record: never ranked, but it shaped the scores
    for word in PAGER.split():
        if len(word) > 6:
            assert word not in proc.stdout + proc.stderr


# ---- small lexical stores: tampering, forgets, later admissions -----------------------------------


@pytest.fixture
def lexical_store(tmp_path: Path) -> tuple[Path, list[str], dict[str, Any]]:
    data_dir = tmp_path / "data"
    engine = open_lexical(data_dir)
    try:
        ids = admit(engine, TEXTS)
        value = search(engine)
    finally:
        engine.close()
    assert len(value["rank_receipt"]["ranked"]) == len(TEXTS) == value["rank_receipt"]["candidate_count"]
    return data_dir, ids, value


def explain_args(data_dir: Path, receipt: Path, *extra: str) -> list[str]:
    return ["explain", "--data-dir", str(data_dir), "--receipt", str(receipt), "--query", "journal",
            "--purpose-ref", PURPOSE, *extra]


def test_match_table_json_and_receipt_alone(lexical_store: tuple[Path, list[str], dict[str, Any]],
                                            tmp_path: Path) -> None:
    data_dir, ids, value = lexical_store
    whole = write(tmp_path / "value.json", value)
    proc = admin(explain_args(data_dir, whole))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "it matches" in proc.stdout and SCOPE in proc.stdout and MARKER not in proc.stdout
    data = explained(admin(explain_args(data_dir, whole, "--json")))
    assert data["matched"] is True and data["differences"] == [] and data["scope"] == SCOPE
    assert [row["record_id"] for row in data["ranked"]] == [e["record_id"] for e in value["rank_receipt"]["ranked"]]
    assert all(row["score"] == row["rederived_score"] for row in data["ranked"])
    # The rank receipt alone, and a file carrying the call's arguments (no --query needed).
    alone = write(tmp_path / "receipt.json", value["rank_receipt"])
    assert admin(explain_args(data_dir, alone, "--scope", SCOPE)).returncode == 0
    carried = write(tmp_path / "call.json", {"arguments": {"query": "journal", "purpose_ref": PURPOSE},
                                             "value": value})
    assert admin(["explain", "--data-dir", str(data_dir), "--receipt", str(carried)]).returncode == 0
    ok = admin(["check-receipt", "--receipt", str(carried), "--json"])
    assert ok.returncode == 0, ok.stdout
    assert set(json.loads(ok.stdout)["checked"]) >= {"receipt_digest", "request_digest", "ordered_ids_digest",
                                                     "response_digest"}


def test_operator_mistakes_are_one_line(lexical_store: tuple[Path, list[str], dict[str, Any]],
                                        tmp_path: Path) -> None:
    data_dir, _ids, value = lexical_store
    whole = write(tmp_path / "value.json", value)
    for args, start in (
        (["--query", "not the query", "--purpose-ref", PURPOSE], "the query, --purpose-ref"),
        (["--purpose-ref", PURPOSE], "the receipt does not carry the query"),
        (["--query", "journal", "--purpose-ref", PURPOSE, "--limit", "3"], "the query, --purpose-ref"),
    ):
        proc = admin(["explain", "--data-dir", str(data_dir), "--receipt", str(whole), *args])
        assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
        assert proc.stderr.startswith("engram-memory: error: " + start) and proc.stderr.count("\n") == 1
    # check-receipt takes the query as one more thing to check: a wrong one is a field that differs.
    lines = mismatch(admin(["check-receipt", "--receipt", str(whole), "--query", "not the query",
                            "--purpose-ref", PURPOSE]))
    assert lines == ["rank_receipt.request_digest does not digest the query and its arguments"]
    assert admin(["check-receipt", "--receipt", str(whole), "--query", "journal", "--purpose-ref",
                  PURPOSE]).returncode == 0
    junk = write(tmp_path / "junk.json", {"records": []})
    for command in (explain_args(data_dir, junk), ["check-receipt", "--receipt", str(junk)]):
        proc = admin(command)
        assert proc.returncode == 2 and "holds no rank receipt" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_receipt_of_another_store_is_named_so(lexical_store: tuple[Path, list[str], dict[str, Any]],
                                                tmp_path: Path) -> None:
    """Issue 40 §4: not an unrelated scope and a talk of cursors, but one line saying the receipt's
    records are not in this store."""
    _data_dir, _ids, value = lexical_store
    other = tmp_path / "other"
    engine = open_lexical(other)
    try:
        admit(engine, [f"Another store's journal note {MARKER}"], start=40)
    finally:
        engine.close()
    whole = write(tmp_path / "value.json", value)
    for extra in ((), ("--scope", SCOPE)):
        proc = admin(explain_args(other, whole, *extra))
        assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
        assert proc.stderr == ("engram-memory: error: none of the 4 record(s) the receipt ranks is in this store:"
                               " it is a receipt of another store (name that store's --data-dir or --store)\n")


def tampered(value: dict[str, Any], how: str) -> dict[str, Any]:
    out = copy.deepcopy(value)
    r = out["rank_receipt"]
    if how == "score":
        r["ranked"][0]["score"] += 0.25
    elif how == "order":  # two ids swapped, the receipt digest recomputed: a careful forger
        first, second = r["ranked"][0], r["ranked"][1]
        first["record_id"], second["record_id"] = second["record_id"], first["record_id"]
        r["receipt_digest"] = receipt_digest("rank-receipt", r)
    elif how == "digest":
        r["ordered_ids_digest"] = "sha256:" + "0" * 64
    return out


@pytest.mark.parametrize("how,field", [("score", "receipt_digest"), ("order", "ordered_ids_digest"),
                                       ("digest", "receipt_digest")])
def test_a_tampered_receipt_is_caught_by_both(lexical_store: tuple[Path, list[str], dict[str, Any]],
                                              tmp_path: Path, how: str, field: str) -> None:
    data_dir, _ids, value = lexical_store
    forged = tampered(value, how)
    # The receipt alone: check-receipt names the field; explain sees what the store re-derives.
    alone = write(tmp_path / "forged.json", forged["rank_receipt"])
    lines = mismatch(admin(["check-receipt", "--receipt", str(alone)]))
    assert any(line.startswith(f"rank_receipt.{field} ") for line in lines), lines
    lines = mismatch(admin(explain_args(data_dir, alone)))
    expected = {"score": "rank 1 score: receipt ", "order": "rank 1 record_id: receipt ",
                "digest": "ordered_ids_digest: receipt sha256:000"}[how]
    assert any(line.startswith(expected) for line in lines), lines
    # The whole response: its packets and response digest no longer agree either.
    whole = write(tmp_path / "forged-value.json", forged)
    lines = mismatch(admin(["check-receipt", "--receipt", str(whole)]))
    if how != "digest":
        assert any(line.startswith("records[0].") for line in lines), lines
    assert mismatch(admin(explain_args(data_dir, whole)))
    # The control: the untouched receipt passes both.
    clean = write(tmp_path / "clean.json", value)
    assert admin(["check-receipt", "--receipt", str(clean)]).returncode == 0
    assert admin(explain_args(data_dir, clean)).returncode == 0


def test_explain_holds_the_packets_to_the_receipt(lexical_store: tuple[Path, list[str], dict[str, Any]],
                                                   tmp_path: Path) -> None:
    """A response whose packets were reordered, its receipt intact: explain refuses it as
    check-receipt does (the receipt alone still re-derives)."""
    data_dir, _ids, value = lexical_store
    assert len(value["records"]) >= 2
    swapped = json.loads(json.dumps(value))
    swapped["records"][0], swapped["records"][1] = swapped["records"][1], swapped["records"][0]
    whole = write(tmp_path / "swapped.json", swapped)
    lines = mismatch(admin(explain_args(data_dir, whole)))
    assert any(line.startswith("records[0].record.record_id is not") for line in lines), lines
    assert any(line.startswith("records[0].rank is not") for line in lines), lines
    assert admin(explain_args(data_dir, write(tmp_path / "receipt.json", swapped["rank_receipt"]))).returncode == 0


def test_a_forgotten_record_cannot_be_rederived(lexical_store: tuple[Path, list[str], dict[str, Any]],
                                                tmp_path: Path) -> None:
    data_dir, ids, value = lexical_store
    receipt = write(tmp_path / "value.json", value)
    engine = open_lexical(data_dir)
    try:
        call(engine, "forget", ctx(), forget_args(ids[1]))
    finally:
        engine.close()
    proc = admin(explain_args(data_dir, receipt))
    lines = mismatch(proc)
    assert lines == [f"record {ids[1]} has been forgotten since cursor {value['rank_receipt']['system_as_of']}:"
                     " the ranking can no longer be re-derived"]
    assert MARKER not in proc.stdout + proc.stderr and "Tantivy" not in proc.stdout + proc.stderr
    data = json.loads(admin(explain_args(data_dir, receipt, "--json")).stdout)
    assert data["matched"] is False and data["forgotten"] == [ids[1]]
    # The receipt itself is intact: the store-less check still passes.
    assert admin(["check-receipt", "--receipt", str(receipt)]).returncode == 0


def test_later_admissions_do_not_move_an_earlier_receipt(lexical_store: tuple[Path, list[str], dict[str, Any]],
                                                         tmp_path: Path) -> None:
    data_dir, _ids, early = lexical_store
    engine = open_lexical(data_dir)
    try:
        admit(engine, LATER, start=len(TEXTS))
        late = search(engine)
    finally:
        engine.close()
    # The later admissions changed the corpus statistics: the same record scores differently now.
    first = early["rank_receipt"]["ranked"][0]
    now = {e["record_id"]: e["score"] for e in late["rank_receipt"]["ranked"]}
    assert now[first["record_id"]] != first["score"]
    for value, name in ((early, "early.json"), (late, "late.json")):
        proc = admin(explain_args(data_dir, write(tmp_path / name, value), "--json"))
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert explained(proc)["system_as_of"] == value["rank_receipt"]["system_as_of"]
    # A later page of the early ranking re-derives too (pinned to the early ranking).
    engine = open_lexical(data_dir)
    try:
        pages = search(engine, limit=1)
        page2 = search(engine, limit=1, page_cursor=pages["next_page_cursor"])
    finally:
        engine.close()
    proc = admin(explain_args(data_dir, write(tmp_path / "page2.json", page2), "--limit", "1"))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)


# ---- PostgreSQL ------------------------------------------------------------------------------------


def test_postgres_receipt_rederives(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    with store_backend("postgres", request, tmp_path / "key") as pg:
        assert pg.store is not None and pg.master_key_file is not None
        engine = Engine.open(EngineSettings(data_dir=tmp_path / "node", store=pg.store,
                                            master_key_file=pg.master_key_file, semantic=False),
                             clock=lambda: T0)
        try:
            admit(engine, TEXTS)
            value = search(engine)
            admit(engine, LATER, start=len(TEXTS))
        finally:
            engine.close()
        receipt = write(tmp_path / "value.json", value)
        base = ["explain", "--store", pg.store, "--master-key-file", str(pg.master_key_file), "--receipt",
                str(receipt), "--query", "journal", "--purpose-ref", PURPOSE]
        proc = admin([*base, "--json"])
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        data = explained(proc)
        assert data["matched"] is True and len(data["ranked"]) == len(TEXTS)
        forged = write(tmp_path / "forged.json", tampered(value, "score"))
        base[base.index("--receipt") + 1] = str(forged)
        assert any(line.startswith("rank 1 score: receipt ") for line in mismatch(admin(base)))


def test_a_lexical_receipt_naming_the_model_rederives_without_embedding(tmp_path: Path) -> None:
    """A host that ranks lexically with a model configured names the model in the receipt: explain
    names it again from the model's files (no query is embedded), and a store without it differs."""
    engine = Engine.open(EngineSettings(data_dir=tmp_path / "data", channels=("lexical",)), clock=lambda: T0)
    try:
        admit(engine, TEXTS)
        value = search(engine)
        semantic = value["rank_receipt"]["channels"][1]
        assert value["rank_receipt"]["profile"] == "lexical_v1" and "model_digest" in semantic, semantic
        receipt = parse_receipt(value)
        arguments = search_arguments(receipt, query="journal", purpose_ref=PURPOSE)
        result = explain_on(engine, receipt, arguments, None)
        assert result.matched, result.differences
        without = explain_with(engine, receipt, arguments, result.scope_ref, None)
        assert without.differences == ["the receipt names an embedding model, and none is configured here"]
    finally:
        engine.close()


def test_the_servers_settings_come_from_its_config(tmp_path: Path) -> None:
    """A server that ranked without the rerank stage: explain with its config file matches; with the
    defaults it differs, and says where (the fusion the receipt names, and the profile digest)."""
    data_dir = tmp_path / "data"
    engine = open_lexical(data_dir, rerank=False)
    try:
        admit(engine, TEXTS)
        value = search(engine)
    finally:
        engine.close()
    assert "rerank" not in value["rank_receipt"]["fusion"]
    receipt = write(tmp_path / "value.json", value)
    lines = mismatch(admin(explain_args(data_dir, receipt)))
    assert any(line.startswith("fusion: ") for line in lines) and \
        any(line.startswith("profile_config_digest: ") for line in lines), lines
    config = tmp_path / "serve.toml"
    config.write_text("rerank = false\n", encoding="utf-8")
    proc = admin(explain_args(data_dir, receipt, "--config", str(config)))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    config.write_text("rerank = 3\n", encoding="utf-8")
    proc = admin(explain_args(data_dir, receipt, "--config", str(config)))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_host_operations_are_replayed_as_of_the_receipt(lexical_store: tuple[Path, list[str], dict[str, Any]],
                                                        tmp_path: Path) -> None:
    """A record disputed after a receipt still counts for it; one resolved back to current counts
    again for a receipt taken after the resolve (store/host/hostops.py events, replayed in order)."""
    from engram_memory.store.host.hostops import dispute_with, resolve_with

    data_dir, ids, early = lexical_store
    ranked = [e["record_id"] for e in early["rank_receipt"]["ranked"]]
    target = next(rid for rid in ids if rid in ranked)
    engine = open_lexical(data_dir)
    try:
        dispute_with(engine, target, "contradicted by the runbook", T0)
        disputed = search(engine)
        assert target not in [e["record_id"] for e in disputed["rank_receipt"]["ranked"]]
        resolve_with(engine, target, True, "the runbook was wrong", T0)
        resolved = search(engine)
        assert target in [e["record_id"] for e in resolved["rank_receipt"]["ranked"]]
    finally:
        engine.close()
    for value, name in ((early, "early.json"), (disputed, "disputed.json"), (resolved, "resolved.json")):
        proc = admin(explain_args(data_dir, write(tmp_path / name, value), "--json"))
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
