"""`engram-memory admin ...` through the real CLI (subprocesses) on real data dirs.

Stores are written by the engine (no embedding model, a frozen clock: searches are comparable
byte for byte) or by real `serve --no-semantic` processes; the online backup runs against a
live server. Every refusal is shown against a planted fault, next to a control that passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import anyio
import duckdb
import pytest
from mcp.shared.exceptions import MCPError

from engram_memory.models.canonical import canonical_text
from engram_memory.models.errors import EngramError
from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.crypto import COMMITTED, ROTATION_DIR, KeyStore, finish_rotation, key_file, key_files
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.timeutil import to_instant
from tests.conftest import CONTEXT, REPO, mcp_server, serve_argv
from tests.conftest import capture_args as wire_capture
from tests.store_fixtures import T0, call, capture_args, ctx, forget_args

MARKER = "zebra-quartz-7731"  # planted in every text: must never appear in an admin listing
SCOPE = "acme/main"  # tests.store_fixtures.ctx()
TEXTS = [f"We adopted DuckDB for the lifecycle store {MARKER}", f"Tantivy ranks the lexical channel {MARKER}",
         f"The billing service moved to Rust {MARKER}", f"Backups run nightly at two {MARKER}"]
QUERIES = ["DuckDB lifecycle", "Tantivy lexical", "billing Rust", "nightly backups", MARKER]
ALL_TOOLS = {f"engram_memory_{t}" for t in ("search", "get", "capture", "request_admission", "withdraw", "forget")}


def admin(args: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "admin", *args],
                          env=env or {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))


def ok_json(args: list[str], env: dict[str, str] | None = None) -> Any:
    proc = admin([*args, "--json"], env)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def refused(proc: subprocess.CompletedProcess[str], code: int, start: str) -> None:
    """One line on stderr, nothing on stdout, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("engram-memory: error: " + start) and proc.stderr.count("\n") == 1, proc.stderr


def listing(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else 0) for p in root.rglob("*"))


# ---- stores -----------------------------------------------------------------------------------


def open_engine(data_dir: Path) -> Engine:
    return Engine.open(EngineSettings(data_dir=data_dir, semantic=False), clock=lambda: T0)


def fill(data_dir: Path, *, held: int = 1, expiring: bool = False) -> dict[str, Any]:
    """``fill_engine`` on a DuckDB store of its own."""
    engine = open_engine(data_dir)
    try:
        return fill_engine(engine, held=held, expiring=expiring)
    finally:
        engine.close()


def fill_engine(engine: Engine, *, held: int = 1, expiring: bool = False) -> dict[str, Any]:
    """Admitted records, ``held`` candidates waiting for adjudication (their content was forgotten,
    then captured again), one plain pending candidate, optionally a record that expires an hour on.
    Shared by the PostgreSQL admin tests (tests/test_pg_admin.py): the same store on either backend."""
    c, out = ctx(), {"records": [], "held": [], "pending": None, "expiring": None}
    for i, text in enumerate(TEXTS):
        cap = call(engine, "capture", c, capture_args(text, key=f"capture-key-{i:06d}"))
        adm = call(engine, "request_admission", c,
                   {"candidate_id": cap["candidate_id"], "idempotency_key": f"admit-key-{i:07d}"})
        out["records"].append(adm["outcome"]["record_id"])
    for i in range(held):
        call(engine, "forget", c, forget_args(out["records"][-1 - i], key=f"forget-key-{i:07d}"))
        cap = call(engine, "capture", c, capture_args(TEXTS[-1 - i], key=f"again-key-{i:07d}"))
        answer = call(engine, "request_admission", c,
                      {"candidate_id": cap["candidate_id"], "idempotency_key": f"again-adm-{i:07d}"})
        assert answer["outcome"]["status"] == "pending_adjudication"
        out["held"].append(cap["candidate_id"])
    out["pending"] = call(engine, "capture", c, capture_args(f"Still undecided {MARKER}",
                                                             key="pending-key-000001"))["candidate_id"]
    if expiring:
        retention = {"derivative_rule": "make-ineligible", "expires_at": to_instant(T0 + 3_600_000)}
        cap = call(engine, "capture", c, capture_args(f"Short-lived note {MARKER}", key="expiring-key-0001",
                                                      retention=retention))
        adm = call(engine, "request_admission", c,
                   {"candidate_id": cap["candidate_id"], "idempotency_key": "expiring-adm-0001"})
        out["expiring"] = adm["outcome"]["record_id"]
    return out


def answers(data_dir: Path, record_ids: list[str] | None = None) -> str:
    """Every probe search's (and get's) value, canonical JSON: compared byte for byte."""
    engine = open_engine(data_dir)
    try:
        values: list[Any] = [call(engine, "search", ctx(), {"query": q, "purpose_ref": "purpose:test"})
                             for q in QUERIES]
        values += [call(engine, "get", ctx(), {"record_id": rid, "purpose_ref": "purpose:test"})
                   for rid in record_ids or []]
        return canonical_text(values)
    finally:
        engine.close()


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    data_dir = tmp_path / "data"
    return data_dir, fill(data_dir)


# ---- backup and restore -----------------------------------------------------------------------


def test_backup_while_a_server_runs_and_restore_answers_byte_identically(tmp_path: Path, offline_env) -> None:
    data_dir, restored = tmp_path / "live", tmp_path / "restored"
    env = {**offline_env, "ENGRAM_CLOCK_MS": str(T0)}  # both servers answer at the same instant
    context = CONTEXT | {"tenant": "acme", "workspace": "main"}
    argv = serve_argv(data_dir, context=context, extra=["--no-semantic"])

    async def search_all(mcp: Any) -> list[Any]:
        out = []
        for query in QUERIES:
            got = await mcp.call("search", {"query": query, "purpose_ref": CONTEXT["purpose_ref"]})
            assert got["ok"], got
            out.append(got["output"]["value"])
        return out

    async def live() -> list[Any]:
        async with mcp_server(argv, env, log_dir=tmp_path) as mcp:
            for text in TEXTS:
                cap = await mcp.call("capture", wire_capture(text, at=T0 - 60_000))
                adm = await mcp.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                           "idempotency_key": "adm-" + cap["output"]["value"]
                                                           ["candidate_id"][10:30]})
                assert adm["output"]["value"]["outcome"]["status"] == "accepted", adm
            before = await search_all(mcp)
            # While the server holds the store: the backup goes through it ...
            report = await anyio.to_thread.run_sync(ok_json, ["backup", "--data-dir", str(data_dir),
                                                              "--out", str(tmp_path / "b.tar")], env)
            assert report["online"] is True and report["heads"]["tenant:acme/workspace:main"]["cursor"] == "8"
            # ... everything else refuses, one line, and the socket's route wants the owner's token.
            for args in (["verify"], ["history", "--scope", SCOPE], ["rotate-master-key"], ["expire"]):
                proc = await anyio.to_thread.run_sync(admin, [*args, "--data-dir", str(data_dir)], env)
                refused(proc, 1, "STORE_BUSY: ")
            proc = await anyio.to_thread.run_sync(admin, ["restore", "--data-dir", str(data_dir),
                                                          "--from", str(tmp_path / "b.tar")], env)
            refused(proc, 1, "RESTORE_REFUSED: ")
            import httpx2

            with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(data_dir / "engram.sock"))) as client:
                assert client.post("http://localhost/admin/backup", json={"backup_key": "00" * 32}).status_code == 401
            # and what it did not refuse kept answering
            assert await search_all(mcp) == before
            return before

    before = anyio.run(live)
    restore = ["restore", "--data-dir", str(restored), "--from", str(tmp_path / "b.tar")]
    assert ok_json(restore, env)["replaced"] is False

    async def after() -> list[Any]:
        async with mcp_server(serve_argv(restored, context=context, extra=["--no-semantic"]), env,
                              log_dir=tmp_path) as mcp:
            return await search_all(mcp)

    again = anyio.run(after)
    assert [canonical_text(v) for v in again] == [canonical_text(v) for v in before]
    assert any(v["records"] for v in before)  # the comparison compared something


def test_offline_backup_restore_and_every_refusal(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    seeded = fill(data_dir)
    live = seeded["records"][:-1]
    expected = answers(data_dir, live)
    backup, key = tmp_path / "b.tar", tmp_path / "b.tar.key"
    report = ok_json(["backup", "--data-dir", str(data_dir), "--out", str(backup)])
    assert report["online"] is False and Path(report["key"]) == key and key.stat().st_mode & 0o077 == 0
    assert backup.stat().st_mode & 0o077 == 0
    with tarfile.open(backup) as tar:
        names = tar.getnames()
    # The store's master key never leaves it; data keys travel wrapped under the backup key.
    assert "master.key" not in names and "server.key" not in names and any(n.startswith("keys/") for n in names)
    assert key.read_bytes() not in backup.read_bytes()
    # Without its key the backup is ciphertext and metadata: no text of any record in it, while
    # the live store's projections (derived, plain) do carry it (the check can fail).
    assert MARKER.encode() not in backup.read_bytes() and b"DuckDB for the lifecycle" not in backup.read_bytes()
    assert any(MARKER.encode() in p.read_bytes() for p in (data_dir / "projections").rglob("*") if p.is_file())
    refused(admin(["backup", "--data-dir", str(data_dir), "--out", str(backup)]), 2, "--out")  # no overwrite
    refused(admin(["restore", "--data-dir", str(tmp_path / "no" / "data"), "--from", str(backup)]), 2,
            "--data-dir")
    assert not (tmp_path / "no").exists()

    # control: the untouched backup restores, and the restored store answers byte-identically
    fresh = tmp_path / "fresh"
    assert ok_json(["restore", "--data-dir", str(fresh), "--from", str(backup)])["replaced"] is False
    assert answers(fresh, live) == expected
    assert (fresh / "master.key").read_bytes() != (data_dir / "master.key").read_bytes()  # its own master key

    # damaged backups: a flipped byte, a truncation, an edited manifest, a key of another backup
    raw = backup.read_bytes()
    flipped = bytearray(raw)
    flipped[raw.index(b"DUCK") + 4096] ^= 1
    with tarfile.open(backup) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())  # type: ignore[union-attr]
    edited = json.dumps({**manifest, "created_at": "2020-01-01T00:00:00.000Z"}, separators=(",", ":")).encode()
    bad = {"flipped": bytes(flipped), "truncated": raw[: len(raw) // 2],
           "manifest": _replace_member(backup, "manifest.json", edited)}
    for name, data in bad.items():
        (tmp_path / f"{name}.tar").write_bytes(data)
        (tmp_path / f"{name}.tar.key").write_bytes(key.read_bytes())
    other = tmp_path / "other"
    fill(other, held=0)
    ok_json(["backup", "--data-dir", str(other), "--out", str(tmp_path / "o.tar")])
    before = listing(tmp_path)
    for name in bad:
        target = tmp_path / f"into-{name}"
        refused(admin(["restore", "--data-dir", str(target), "--from", str(tmp_path / f"{name}.tar")]), 1,
                "BACKUP_INVALID: ")
        assert not target.exists()
    refused(admin(["restore", "--data-dir", str(tmp_path / "into-x"), "--from", str(backup),
                   "--key", str(tmp_path / "o.tar.key")]), 1, "BACKUP_INVALID: the backup key does not belong")
    # a foreign store, and a directory that is not a store, are left as they were
    refused(admin(["restore", "--data-dir", str(other), "--from", str(backup)]), 1, "RESTORE_REFUSED: ")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine\n")
    refused(admin(["restore", "--data-dir", str(junk), "--from", str(backup)]), 1, "RESTORE_REFUSED: ")
    assert listing(tmp_path) == sorted(before + [("junk", 0), ("junk/notes.txt", 5)])

    # over an older copy of the same store: allowed, unless the store forgot something since
    assert ok_json(["restore", "--data-dir", str(fresh), "--from", str(backup)])["replaced"] is True
    engine = open_engine(fresh)
    try:
        call(engine, "forget", ctx(), forget_args(live[0], key="forget-after-backup"))
    finally:
        engine.close()
    proc = admin(["restore", "--data-dir", str(fresh), "--from", str(backup)])
    refused(proc, 1, "RESTORE_REFUSED: ")
    assert "forgot 1 record" in proc.stderr
    assert answers(fresh, live[1:]) != expected  # the forget stands: the refused restore changed nothing


def write_more(data_dir: Path, texts: list[str], tag: str) -> list[str]:
    """Admit more records into a stopped store (its journal moves on two events per text)."""
    engine = open_engine(data_dir)
    try:
        out = []
        for i, text in enumerate(texts):
            cap = call(engine, "capture", ctx(), capture_args(text, key=f"{tag}-capture-{i:06d}"))
            adm = call(engine, "request_admission", ctx(),
                       {"candidate_id": cap["candidate_id"], "idempotency_key": f"{tag}-admit-{i:06d}"})
            out.append(adm["outcome"]["record_id"])
        return out
    finally:
        engine.close()


def test_restore_over_a_store_ahead_of_the_backup_is_refused_unless_forced_and_then_kept_aside(
        tmp_path: Path) -> None:
    """Issue 40 §1: a restore never rolls a newer copy back silently, and --force never shreds it."""
    data_dir, backup = tmp_path / "data", tmp_path / "b.tar"
    fill(data_dir)
    ok_json(["backup", "--data-dir", str(data_dir), "--out", str(backup)])
    cursor = journal_head(data_dir)[0]
    newer = write_more(data_dir, [f"Written after the backup {MARKER} {i}" for i in range(2)], "after")
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(data_dir), str(copy)], check=True)
    expected, before = answers(copy, newer), listing(copy)
    proc = admin(["restore", "--data-dir", str(copy), "--from", str(backup)])
    refused(proc, 1, "RESTORE_REFUSED: the store at ")
    assert f"acme/main: 4 event(s) newer than the backup, cursor {cursor + 4} > {cursor}" in proc.stderr
    assert "--force" in proc.stderr
    assert listing(copy) == before and answers(copy, newer) == expected  # untouched

    # diverged: an older copy that went on another way is not "behind" the backup either
    older, older_backup = tmp_path / "older", tmp_path / "older.tar"
    subprocess.run(["cp", "-a", str(data_dir), str(older)], check=True)
    ok_json(["backup", "--data-dir", str(data_dir), "--out", str(older_backup)])
    write_more(data_dir, [f"Newest {MARKER}"], "newest")
    ok_json(["backup", "--data-dir", str(data_dir), "--out", str(tmp_path / "newest.tar")])
    ok_json(["restore", "--data-dir", str(older), "--from", str(older_backup)])  # same heads: allowed
    write_more(older, [f"Another path {MARKER}"], "other-path")
    proc = admin(["restore", "--data-dir", str(older), "--from", str(tmp_path / "newest.tar")])
    refused(proc, 1, "RESTORE_REFUSED: ")
    assert f"journal differs from the backup's at cursor {cursor + 6}" in proc.stderr

    # --force: restored, and the replaced store is kept whole beside it, named in the output
    forced = admin(["restore", "--data-dir", str(copy), "--from", str(backup), "--force", "--json"])
    assert forced.returncode == 0, forced.stderr
    report = json.loads(forced.stdout)
    kept = Path(report["kept_aside"])
    assert report["replaced"] is True and kept.parent == copy.parent and str(kept) in forced.stderr
    assert listing(kept) == before and answers(kept, newer) == expected  # every byte, keys included
    assert journal_head(copy)[0] == cursor


def _replace_member(backup: Path, name: str, data: bytes) -> bytes:
    import io

    out = io.BytesIO()
    with tarfile.open(backup) as src, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for member in src.getmembers():
            content = data if member.name == name else src.extractfile(member).read()  # type: ignore[union-attr]
            member.size = len(content)
            dst.addfile(member, io.BytesIO(content))
    return out.getvalue()


# ---- verify -----------------------------------------------------------------------------------


def test_verify_passes_then_reports_journal_corrupt_on_tampering(store) -> None:
    data_dir, _ = store
    report = ok_json(["verify", "--data-dir", str(data_dir)])
    assert report["ok"] is True and report["code"] is None
    table = admin(["verify", "--data-dir", str(data_dir), "--scope", SCOPE])
    assert table.returncode == 0 and "ok" in table.stdout
    con = duckdb.connect(str(data_dir / "engram.duckdb"))
    con.execute("UPDATE journal SET body = replace(body, '\"operation\":\"accept\"', '\"operation\":\"reject\"')"
                " WHERE cursor = 2")
    con.close()
    proc = admin(["verify", "--data-dir", str(data_dir)])
    assert proc.returncode == 1 and "JOURNAL_CORRUPT" in proc.stdout
    assert proc.stderr.startswith("engram-memory: error: JOURNAL_CORRUPT: ") and "Traceback" not in proc.stderr
    as_json = admin(["verify", "--data-dir", str(data_dir), "--json"])
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["code"] == "JOURNAL_CORRUPT"


# ---- expire, adjudicate -------------------------------------------------------------------------


def test_expire_makes_due_records_stop_being_current(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    seeded = fill(data_dir, held=0, expiring=True)
    early = {**os.environ, "ENGRAM_CLOCK_MS": str(T0 + 60_000)}
    assert ok_json(["expire", "--data-dir", str(data_dir)], early)["total"] == 0  # not due yet
    engine = open_engine(data_dir)
    try:  # the control: current until the command runs
        assert call(engine, "get", ctx(), {"record_id": seeded["expiring"], "purpose_ref": "purpose:test"})
    finally:
        engine.close()
    late = {**os.environ, "ENGRAM_CLOCK_MS": str(T0 + 7_200_000)}
    done = ok_json(["expire", "--data-dir", str(data_dir), "--scope", SCOPE], late)
    assert done == {"expired": {SCOPE: [seeded["expiring"]]}, "total": 1}
    events = ok_json(["history", "--data-dir", str(data_dir), "--scope", SCOPE, "--limit", "1"])["events"]
    assert events[0]["operation"] == "expire" and events[0]["record_id"] == seeded["expiring"]
    # Read at T0, when the record has not reached expires_at: only its expired state hides it.
    engine = open_engine(data_dir)
    try:
        with pytest.raises(EngramError) as err:
            call(engine, "get", ctx(), {"record_id": seeded["expiring"], "purpose_ref": "purpose:test"})
        hits = call(engine, "search", ctx(), {"query": "Short-lived note", "purpose_ref": "purpose:test"})
    finally:
        engine.close()
    assert err.value.code == "NOT_FOUND"
    assert seeded["expiring"] not in {r["record"]["record_id"] for r in hits["records"]}
    assert ok_json(["expire", "--data-dir", str(data_dir)], late)["total"] == 0  # done once


def journal_head(data_dir: Path) -> tuple[int, int]:
    con = duckdb.connect(str(data_dir / "engram.duckdb"), read_only=True)
    try:
        return con.execute("SELECT max(cursor), count(*) FROM journal").fetchone()  # type: ignore[return-value]
    finally:
        con.close()


def test_adjudicate_accept_and_reject_are_journalled_with_the_reason(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    seeded = fill(data_dir, held=2)
    keep, drop = seeded["held"]
    listed = ok_json(["candidates", "--data-dir", str(data_dir), "--scope", SCOPE])["candidates"]
    assert {c["candidate_id"]: c["held_for_adjudication"] for c in listed} == {
        keep: True, drop: True, seeded["pending"]: False}

    # refusals first: nothing journalled by any of them
    head = journal_head(data_dir)
    refused(admin(["adjudicate", "--data-dir", str(data_dir), "--candidate", keep, "--accept",
                   "--reason", "password=hunter2hunter2"]), 2, "--reason looks like it carries a secret")
    refused(admin(["adjudicate", "--data-dir", str(data_dir), "--candidate", keep, "--accept",
                   "--reason", "x" * 501]), 2, "--reason is 501 characters")
    refused(admin(["adjudicate", "--data-dir", str(data_dir), "--candidate", keep, "--reason", "why"]), 2,
            "say --accept or --reject")
    refused(admin(["adjudicate", "--data-dir", str(data_dir), "--candidate", "candidate_" + "0" * 64,
                   "--accept", "--reason", "why"]), 2, "no candidate")
    refused(admin(["adjudicate", "--data-dir", str(data_dir), "--candidate", seeded["pending"], "--accept",
                   "--reason", "the policy decides this one"]), 1, "NOT_ADJUDICABLE: ")
    assert journal_head(data_dir) == head

    accepted = ok_json(["adjudicate", "--data-dir", str(data_dir), "--candidate", keep, "--accept",
                        "--reason", "The user asked to keep it after all"])
    rejected = ok_json(["adjudicate", "--data-dir", str(data_dir), "--candidate", drop, "--reject",
                        "--reason", "Forgotten on purpose; stays forgotten"])
    assert accepted["status"] == "accepted" and accepted["record_id"].startswith("mem_")
    assert rejected["status"] == "rejected" and rejected["record_id"] is None
    events = ok_json(["history", "--data-dir", str(data_dir), "--scope", SCOPE, "--limit", "2"])["events"]
    assert [(e["operation"], e["candidate_id"], e["reason"]) for e in events] == [
        ("accept", keep, "The user asked to keep it after all"),
        ("reject", drop, "Forgotten on purpose; stays forgotten")]
    refused(admin(["adjudicate", "--data-dir", str(data_dir), "--candidate", keep, "--reject",
                   "--reason", "changed my mind"]), 1, "NOT_ADJUDICABLE: ")  # decided once
    assert ok_json(["verify", "--data-dir", str(data_dir)])["ok"] is True
    remaining = ok_json(["candidates", "--data-dir", str(data_dir), "--scope", SCOPE])["candidates"]
    assert [c["candidate_id"] for c in remaining] == [seeded["pending"]]
    engine = open_engine(data_dir)
    try:
        got = call(engine, "get", ctx(), {"record_id": accepted["record_id"], "purpose_ref": "purpose:test"})
        hits = call(engine, "search", ctx(), {"query": TEXTS[-1], "purpose_ref": "purpose:test"})
    finally:
        engine.close()
    assert got["record"]["components"][0]["text"] == TEXTS[-1]
    assert hits["records"][0]["record"]["record_id"] == accepted["record_id"]


# ---- reading: never content ---------------------------------------------------------------------


def test_history_and_candidates_never_show_content(store) -> None:
    data_dir, seeded = store
    for command in ("history", "candidates"):
        table = admin([command, "--data-dir", str(data_dir), "--scope", SCOPE])
        as_json = admin([command, "--data-dir", str(data_dir), "--scope", SCOPE, "--json"])
        for proc in (table, as_json):
            assert proc.returncode == 0, proc.stderr
            assert MARKER not in proc.stdout and "DuckDB for the lifecycle" not in proc.stdout
        data = json.loads(as_json.stdout)
        assert data["scope"] == SCOPE
    events = json.loads(admin(["history", "--data-dir", str(data_dir), "--scope", SCOPE, "--json"]).stdout)["events"]
    assert [e["cursor"] for e in events] == list(range(1, len(events) + 1))
    assert events[1]["previous_event_hash"] == events[0]["event_hash"]
    # the check can fail: the marker is in the store, one decryption away
    assert MARKER in answers(data_dir)
    refused(admin(["history", "--data-dir", str(data_dir), "--scope", "acme"]), 2, "--scope 'acme' is not")
    refused(admin(["candidates", "--data-dir", str(data_dir), "--scope", "acme/other"]), 2, "no scope acme/other")
    refused(admin(["history", "--data-dir", str(data_dir.parent / "nope"), "--scope", SCOPE]), 2,
            "no engram-memory store at")
    assert not (data_dir.parent / "nope").exists()


# ---- master key rotation ------------------------------------------------------------------------


def test_rotate_master_key_rewraps_every_key_and_destroys_the_old_one(store) -> None:
    data_dir, seeded = store
    live = seeded["records"][:-1]
    expected = answers(data_dir, live)
    old_master = (data_dir / "master.key").read_bytes()
    old_keys = {p.name: p.read_bytes() for p in key_files(data_dir / "keys")}
    assert ok_json(["rotate-master-key", "--data-dir", str(data_dir)]) == {
        "data_dir": str(data_dir), "rewrapped": len(old_keys), "old_master_key": "destroyed"}
    assert answers(data_dir, live) == expected
    new_keys = {p.name: p.read_bytes() for p in key_files(data_dir / "keys")}
    assert set(new_keys) == set(old_keys) and all(new_keys[n] != old_keys[n] for n in old_keys)
    for path in data_dir.rglob("*"):  # the old master's bytes are in no file of the store
        if path.is_file():
            assert old_master not in path.read_bytes(), path
    assert not (data_dir / ROTATION_DIR).exists()


def test_a_rotation_interrupted_at_any_point_leaves_a_readable_store(store) -> None:
    data_dir, seeded = store
    live = seeded["records"][:-1]
    expected = answers(data_dir, live)
    master = (data_dir / "master.key").read_bytes()
    # Crash before the commit: the staging is discarded, the old master stays.
    KeyStore(data_dir).stage_rotation(data_dir)
    (data_dir / ROTATION_DIR / COMMITTED).unlink()
    assert answers(data_dir, live) == expected
    assert (data_dir / "master.key").read_bytes() == master and not (data_dir / ROTATION_DIR).exists()
    # Crash after the commit, half the keys moved: the next open rolls forward.
    KeyStore(data_dir).stage_rotation(data_dir)
    staged = sorted((data_dir / ROTATION_DIR / "keys").iterdir())
    for path in staged[: len(staged) // 2 + 1]:
        os.replace(path, key_file(data_dir / "keys", path.name))
    assert answers(data_dir, live) == expected
    assert (data_dir / "master.key").read_bytes() != master and not (data_dir / ROTATION_DIR).exists()
    finish_rotation(data_dir)  # nothing left to do: idempotent
    # Crash after everything but the clean-up: only the commit marker is left.
    (data_dir / ROTATION_DIR).mkdir()
    (data_dir / ROTATION_DIR / COMMITTED).write_bytes(b"1")
    assert answers(data_dir, live) == expected and not (data_dir / ROTATION_DIR).exists()


# ---- none of it over MCP ------------------------------------------------------------------------


def test_no_admin_operation_is_an_mcp_tool(tmp_path: Path, offline_env) -> None:
    async def main() -> None:
        argv = serve_argv(tmp_path / "data", extra=["--no-semantic"])
        async with mcp_server(argv, offline_env, log_dir=tmp_path) as mcp:
            names = {t.name for t in (await mcp.session.list_tools()).tools}
            assert names == ALL_TOOLS
            for name in ("admin_verify", "engram_memory_admin_backup", "engram_memory_restore",
                         "engram_memory_rotate_master_key", "engram_memory_adjudicate", "engram_memory_history",
                         "engram_memory_candidates", "engram_memory_expire", "admin"):
                with pytest.raises(MCPError) as info:
                    await mcp.session.call_tool(name, {})
                assert (info.value.code, info.value.message) == (-32602, "Unknown tool"), name

    anyio.run(main)


def test_history_shows_each_event_at_its_own_instant(tmp_path: Path) -> None:
    """An admission's journal body keeps its capture's recorded_at (digest parity with the
    reference); the listing's ``at`` is when the decision was issued."""
    now = [T0]
    engine = Engine.open(EngineSettings(data_dir=tmp_path / "data", semantic=False), clock=lambda: now[0])
    try:
        text = f"Clocks move between calls {MARKER}"
        cap = call(engine, "capture", ctx(), capture_args(text, key="clock-cap-000001"))
        now[0] += 120
        call(engine, "request_admission", ctx(), {"candidate_id": cap["candidate_id"],
                                                  "idempotency_key": "clock-adm-0000001"})
    finally:
        engine.close()
    capture, accept = ok_json(["history", "--data-dir", str(tmp_path / "data"), "--scope", SCOPE])["events"]
    assert accept["operation"] == "accept"
    assert accept["recorded_at"] == capture["recorded_at"] == capture["at"] == "2026-05-28T20:26:40.000Z"
    assert accept["at"] == "2026-05-28T20:26:40.120Z"
    table = admin(["history", "--data-dir", str(tmp_path / "data"), "--scope", SCOPE]).stdout
    assert "20:26:40.120Z" in table
