"""An import's batches (issue 40 §3): ONE transaction per batch of items (Engine.capture_and_admit)
must leave exactly what sending each item through capture then request_admission leaves -- the
same journal events and hashes, ledger answers, candidate and record rows -- on both backends,
with a secret rejected, forgotten content held for an operator, an invalid item and repeats
within a batch among the items. Real engines, a frozen clock, no embedding model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engram_memory.eval.bench_import import graph_lines
from engram_memory.store.core.crypto import key_files
from engram_memory.store.core.engine import Engine
from engram_memory.store.host import transfer
from tests.conftest import Backend
from tests.store_fixtures import T0, call, capture_args, ctx, forget_args
from tests.test_transfer import PASSWORD, engine_on, other  # noqa: F401 - the fixture

SCOPE_REF = ctx().scope_ref
HELD = "The staging cluster is called heron and will be retired"


def _items(tmp_path: Path) -> list[transfer.Item]:
    """Generated observations, a secret, the forgotten text, repeats, and an export item whose
    retention ends before the import's instant (refused by the lifecycle: INVALID_SCHEMA)."""
    graph = tmp_path / "graph.jsonl"
    lines = graph_lines(30, per_entity=5)
    lines.append({"type": "entity", "name": "Alice", "entityType": "person",
                  "observations": [f"Her database password is {PASSWORD}", "Leads the billing team",
                                   "Leads the billing team"]})
    lines.append(lines[0])  # the first entity again: its items are repeats
    graph.write_text("".join(json.dumps(line) + "\n" for line in lines))
    items = transfer.read_items(graph).items
    held = capture_args(HELD)
    expired = capture_args("A note past its retention", retention={"derivative_rule": "make-ineligible",
                                                                   "expires_at": "2020-01-01T00:00:00.000Z"})
    return [*items[:10], transfer.Item("held", {"payload": held["payload"], "evidence": held["evidence"]}),
            transfer.Item("expired", {"payload": expired["payload"], "evidence": expired["evidence"]}),
            *items[10:]]


def _forget_held(engine: Engine) -> None:
    cap = call(engine, "capture", ctx(), capture_args(HELD, key="capture-key-held01"))
    adm = call(engine, "request_admission", ctx(), {"candidate_id": cap["candidate_id"],
                                                    "idempotency_key": "admit-key-held0001"})
    call(engine, "forget", ctx(), forget_args(adm["outcome"]["record_id"]))


def _one_by_one(engine: Engine, items: list[transfer.Item]) -> transfer.ImportReport:
    """The path before batches: capture then request_admission of each item, in file order."""
    report = transfer.ImportReport(SCOPE_REF, "test", items=len(items))
    present: set[str] = set()
    import_ctx = transfer.import_context(SCOPE_REF)
    for item in items:
        ready = transfer._checked(import_ctx, item, report)
        if ready is not None:
            transfer._import_one(engine, import_ctx, ready, present, report)
    return report


def _state(engine: Engine) -> dict[str, list[Any]]:
    """Every row an import writes, without what is random by design (key refs, sealed bytes)."""
    db: Any = engine.db
    return {
        "journal": db.all("SELECT scope_ref, cursor, event_id, operation, body, event_hash FROM journal"
                          " ORDER BY scope_ref, cursor"),
        "scopes": db.all("SELECT scope_ref, high_water, last_event_hash, projection_cursor FROM scopes"),
        "ledger": db.all("SELECT scope_ref, principal, key_digest, tool, intent_hash, value, created_at"
                         " FROM idempotency ORDER BY key_digest"),
        "candidates": db.all("SELECT candidate_id, state, created_cursor, recorded_at, payload_digest, record_digest,"
                             " key_ref IS NULL, envelope IS NULL, outcome FROM candidates ORDER BY candidate_id"),
        "records": db.all("SELECT record_id, candidate_id, state, record_digest, payload_digest, recorded_cursor,"
                          " valid_t, event_at, event_kind IS NULL FROM records ORDER BY record_id"),
    }


@pytest.mark.parametrize("worker", [False, True], ids=["screened-here", "screened-on-a-worker"])
def test_a_batched_import_writes_exactly_what_one_item_at_a_time_writes(
        backend: Backend, other: Backend, tmp_path: Path, monkeypatch: Any, worker: bool) -> None:  # noqa: F811
    items = _items(tmp_path)
    monkeypatch.setattr(transfer, "BATCH", 7)  # several batches, repeats across and within them
    screened_here: list[str] = []
    checked_here: list[str] = []
    if worker:  # every batch goes to the second process first (store/host/import_worker.py)
        from engram_memory.store.host import import_worker
        from engram_memory.store.screen import lazy

        monkeypatch.setattr(import_worker, "PARALLEL_FROM", 1)
        check_args = transfer._check_args
        monkeypatch.setattr(transfer, "_check_args",
                            lambda scope, raw: checked_here.append(scope) or check_args(scope, raw))
        find_secret = lazy.secrets().find_secret
        monkeypatch.setattr(lazy.secrets(), "find_secret",
                            lambda text: screened_here.append(text) or find_secret(text))
    batched, single = engine_on(backend, tmp_path / "a"), engine_on(other, tmp_path / "b")
    try:
        for engine in (batched, single):
            _forget_held(engine)
        report = transfer.import_items(batched, SCOPE_REF, "test", items)
        screened_by_batches = list(screened_here)  # texts the worker was not sent (field names...)
        assert not checked_here  # with the worker, every item's checks came from it
        expected = _one_by_one(single, items)
        assert report.counts() == expected.counts()
        assert report.counts() == {"items": len(items), "imported": 31, "already_present": 6, "rejected": 1,
                                   "pending_adjudication": 1, "invalid": 1}, report.counts()
        assert sorted(report.record_ids) == sorted(expected.record_ids)
        assert len(report.rejected) == 1 and report.rejected[0]["reason"].startswith("secret:"), report.rejected
        if worker:  # the worker found the secret: the batched import never screened its text here
            assert screened_by_batches and not [t for t in screened_by_batches if PASSWORD in t]
        assert report.invalid[0]["item"] == "expired" and report.invalid[0]["reason"].startswith("INVALID_SCHEMA")
        assert _state(batched) == _state(single)
        # the candidate held for an operator kept its key: it can still be decided
        assert len(batched.keys.key_refs()) == len(single.keys.key_refs()) == 32
        # a second import is a no-op, answered from what the first committed: the payload digests
        # alone, no current record's body read or decrypted (sorting every body for that ran DuckDB
        # out of the import's bounded memory at ~40,000 records)
        bodies_read: list[str] = []
        for owner, name in ((batched.lifecycle, "load_record"), (batched.db, "current_records")):
            original = getattr(owner, name)
            monkeypatch.setattr(owner, name, lambda *a, _o=original, _n=name: bodies_read.append(_n) or _o(*a))
        again = transfer.import_items(batched, SCOPE_REF, "test", items)
        assert not bodies_read, bodies_read
        assert again.imported == 0 and not again.changed, again.counts()
        assert again.already_present + len(again.pending) + len(again.rejected) + len(again.invalid) == len(items)
    finally:
        batched.close()
        single.close()
    assert T0  # the engines' frozen instant (tests.test_transfer.engine_on)


def test_bench_import_measures_a_real_import_at_a_tiny_size(tmp_path: Path) -> None:
    """`python -m engram_memory.eval bench-import` (the 50,000-item figure's command) at 60 items."""
    import os
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "engram_memory.eval", "bench-import", "--items", "60", "--out",
                           str(out), "--work-dir", str(tmp_path / "work")],
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["items"] == 60 and result["counts"]["imported"] == 60, result
    assert result["wall_s"] > 0 and result["items_per_s"] > 0 and result["peak_rss_mib"] > 0
    assert result["command"].startswith("engram-memory admin import --scope acme/bench --from ")
    assert len(key_files(tmp_path / "work" / "store-60" / "keys")) == 60


def test_a_read_file_holds_its_items_compactly(tmp_path: Path) -> None:
    """20,000 items read (before an import starts) hold about their JSON's size: each one's arguments
    as bytes, its label made only if a report names it. orjson's own bytes objects kept ~4 KiB of
    heap each (a 50,000-item file took 277 MiB instead of 122)."""
    graph = tmp_path / "graph.jsonl"
    graph.write_text("".join(json.dumps(line) + "\n" for line in graph_lines(20_000)))
    probe = (  # resident memory now, not the peak: importing may peak higher than the items take
        "import os, sys\n"
        "from pathlib import Path\n"
        "from engram_memory.store.host.transfer import read_items\n"
        "def resident(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "before = resident()\n"
        "items = read_items(Path(sys.argv[1])).items\n"
        "print(len(items), sum(len(i._args) for i in items), resident() - before)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(graph)], capture_output=True, text=True, timeout=300,
                          check=True)
    count, json_bytes, grown = map(int, done.stdout.split())
    assert count == 20_000
    assert grown < 2.5 * json_bytes, (grown, json_bytes)  # ~16 MB of JSON; the 4 KiB each would be +80 MB
