"""The lifecycle engine on a real DuckDB file and real key files (no projections involved)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_memory.models.context import HostPolicy
from engram_memory.models.errors import EngramError
from engram_memory.models.outputs import validate_output
from engram_memory.store.backend import StoreBusyError
from engram_memory.store.core.crypto import KeyStore, key_files
from engram_memory.store.core.lifecycle import Lifecycle
from engram_memory.store.duckdb.backend import Database
from tests.store_fixtures import T0, admission_args, capture_args, ctx, forget_args, withdraw_args

SECRET_TEXT = "The staging database lives at postgres://admin:Sup3rS3cret@db.internal:5432/app"


class Harness:
    def __init__(self, path: Path, policy: HostPolicy | None = None) -> None:
        self.path = path
        self.db = Database(path)
        self.keys = KeyStore(path)
        self.life = Lifecycle(self.db, self.keys, policy or HostPolicy())
        self.now = T0

    def capture(self, text: str, key: str = "capture-key-000001", c=None, **extra):
        value = self.life.capture(c or ctx(), capture_args(text, key, **extra), self.now)
        validate_output("capture", value)
        return value

    def admit(self, cid: str, key: str = "admit-key-0000001", c=None):
        value = self.life.request_admission(c or ctx(), admission_args(cid, key), self.now)[0]
        validate_output("request_admission", value)
        return value

    def state(self, table: str, id_col: str, value: str) -> str:
        return self.db.one(f"SELECT state FROM {table} WHERE {id_col} = ?", [value])[0]

    def file_bytes(self) -> bytes:
        self.db.con.execute("CHECKPOINT")
        return b"".join(p.read_bytes() for p in self.path.rglob("*") if p.is_file() and "engram.duckdb" in p.name)

    def close(self) -> None:
        self.db.close()


@pytest.fixture
def h(tmp_path: Path):
    harness = Harness(tmp_path / "data")
    yield harness
    harness.close()


def test_capture_is_pending_and_encrypted(h: Harness) -> None:
    marker = "zebra-quartz-marker decided to adopt DuckDB"
    value = h.capture(marker)
    assert value["status"] == "committed_pending"
    assert value["candidate_id"].startswith("candidate_") and value["cursor"] == "1"
    assert h.state("candidates", "candidate_id", value["candidate_id"]) == "pending"
    assert marker.encode() not in h.file_bytes()
    assert b"zebra-quartz-marker" not in h.file_bytes()


def test_capture_replay_and_conflict(h: Harness) -> None:
    first = h.capture("We chose Tantivy for BM25.")
    again = h.capture("We chose Tantivy for BM25.")
    assert again == {**first, "status": "duplicate_exact"}
    assert h.db.high_water(ctx().scope_ref) == 1  # nothing new was journaled
    with pytest.raises(EngramError) as err:
        h.capture("Different content under the same key.")
    assert err.value.code == "DIGEST_CONFLICT"
    # the same key from another principal is another key
    other = h.capture("Different content under the same key.", c=ctx(principal="bob"))
    assert other["status"] == "committed_pending" and other["candidate_id"] != first["candidate_id"]


def test_capture_record_digest_predicts_admitted_record(h: Harness) -> None:
    cap = h.capture("Predictable record ids.")
    out = h.admit(cap["candidate_id"])
    assert out["outcome"]["status"] == "accepted"
    row = h.db.one("SELECT record_digest FROM records WHERE record_id = ?", [out["outcome"]["record_id"]])
    assert row[0] == cap["record_digest"]


def test_admission_accept_then_replay_and_duplicate(h: Harness) -> None:
    cap = h.capture("Admission works.")
    out = h.admit(cap["candidate_id"])
    assert out["replayed"] is False and out["outcome"]["record_id"].startswith("mem_")
    assert h.admit(cap["candidate_id"]) == {**out, "replayed": True}
    dup = h.admit(cap["candidate_id"], key="admit-key-0000002")
    assert dup["outcome"] == {**out["outcome"], "status": "duplicate_exact"} and dup["replayed"] is False
    # the candidate's key is destroyed and its envelope dropped once decided
    assert h.db.one("SELECT key_ref, envelope FROM candidates") == (None, None)
    with pytest.raises(EngramError) as err:
        h.life.capture(ctx(), {**capture_args("x"), "idempotency_key": "admit-key-0000001"}, h.now)
    assert err.value.code == "DIGEST_CONFLICT"  # same key, other tool


def test_secret_content_is_rejected_and_unreadable(h: Harness) -> None:
    cap = h.capture(SECRET_TEXT)
    out = h.admit(cap["candidate_id"])
    assert out["outcome"]["status"] == "rejected" and "record_id" not in out["outcome"]
    assert h.state("candidates", "candidate_id", cap["candidate_id"]) == "rejected"
    assert h.db.one("SELECT count(*) FROM records")[0] == 0
    assert b"Sup3rS3cret" not in h.file_bytes()
    assert key_files(h.path / "keys") == []


def test_withdraw_destroys_key_and_blocks_admission(h: Harness) -> None:
    cap = h.capture("A draft that will be withdrawn.")
    key_ref = h.db.one("SELECT key_ref FROM candidates")[0]
    out = h.life.withdraw(ctx(), withdraw_args(cap["candidate_id"]), h.now)
    validate_output("withdraw", out)
    assert out["key_destruction"] == "complete" and out["replayed"] is False
    assert out["receipt"]["from_state"] == "pending" and out["receipt"]["to_state"] == "withdrawn"
    assert h.keys.load(key_ref) is None
    assert h.life.withdraw(ctx(), withdraw_args(cap["candidate_id"]), h.now) == {**out, "replayed": True}
    with pytest.raises(EngramError) as err:
        h.admit(cap["candidate_id"])
    assert err.value.code == "NOT_FOUND"  # a withdrawn candidate is never admitted (reference Q1)
    with pytest.raises(EngramError) as err:
        h.life.withdraw(ctx(), withdraw_args(cap["candidate_id"], key="withdraw-key-00002"), h.now)
    assert err.value.code == "ALREADY_TERMINAL"


def test_withdraw_after_admission_is_illegal(h: Harness) -> None:
    cap = h.capture("Admitted, then someone tries to withdraw it.")
    h.admit(cap["candidate_id"])
    cursor = h.db.high_water(ctx().scope_ref)
    with pytest.raises(EngramError) as err:
        h.life.withdraw(ctx(), withdraw_args(cap["candidate_id"]), h.now)
    assert err.value.code == "ILLEGAL_TRANSITION"
    assert h.db.high_water(ctx().scope_ref) == cursor  # no cursor allocated by a refusal


def test_forget_tombstones_shreds_and_blocks_readmission(h: Harness) -> None:
    text = "Forgettable fact about the billing service."
    cap = h.capture(text)
    rid = h.admit(cap["candidate_id"])["outcome"]["record_id"]
    rkey = h.db.one("SELECT key_ref FROM records")[0]
    value, purge = h.life.forget(ctx(), forget_args(rid), h.now)
    validate_output("forget", value)
    assert purge == rid and value["receipt"]["operation"] == "tombstone"
    assert value["receipt"]["from_state"] == "accepted_current" and value["projection_invalidation"] == "pending"
    assert h.state("records", "record_id", rid) == "tombstoned"
    assert h.keys.load(rkey) is None and h.db.one("SELECT body FROM records")[0] is None
    replay, purge2 = h.life.forget(ctx(), forget_args(rid), h.now)
    assert purge2 is None and replay == {**value, "replayed": True}
    with pytest.raises(EngramError) as err:
        h.life.forget(ctx(), forget_args(rid, key="forget-key-0000002"), h.now)
    assert err.value.code == "ALREADY_TERMINAL"
    # the same content captured again is pending, and admission holds it for adjudication
    again = h.capture(text, key="capture-key-000002")
    assert again["status"] == "committed_pending"
    held = h.admit(again["candidate_id"], key="admit-key-0000003")
    assert held["outcome"]["status"] == "pending_adjudication" and "record_id" not in held["outcome"]
    assert h.state("candidates", "candidate_id", again["candidate_id"]) == "pending"
    # the held answer is bound to its key: a retry replays the same decision receipt
    assert h.admit(again["candidate_id"], key="admit-key-0000003") == {**held, "replayed": True}
    # replaying the original capture key is a capture replay, not a new adjudication
    assert h.capture(text)["status"] == "duplicate_exact"


def test_scope_isolation_not_found(h: Harness) -> None:
    cap = h.capture("Tenant A's private decision.")
    other = ctx(tenant="globex")
    for call in (
        lambda: h.life.request_admission(other, admission_args(cap["candidate_id"]), h.now),
        lambda: h.life.withdraw(other, withdraw_args(cap["candidate_id"]), h.now),
    ):
        with pytest.raises(EngramError) as err:
            call()
        assert err.value.code == "NOT_FOUND"
    rid = h.admit(cap["candidate_id"])["outcome"]["record_id"]
    with pytest.raises(EngramError) as err:
        h.life.forget(other, forget_args(rid), h.now)
    assert err.value.code == "NOT_FOUND"
    assert h.state("records", "record_id", rid) == "accepted_current"
    assert h.db.high_water(other.scope_ref) == 0


def test_host_policy_at_capture(tmp_path: Path) -> None:
    policy = HostPolicy(retention_ceiling_ms=30 * 86_400_000, consented_families=frozenset({"f:ok"}))
    h = Harness(tmp_path / "d", policy)
    try:
        def code(**extra) -> str:
            with pytest.raises(EngramError) as err:
                h.capture("Retention checks.", **extra)
            return err.value.code

        assert code(retention={"derivative_rule": "retain"}) == "UNAUTHORIZED"
        assert code(retention={"derivative_rule": "make-ineligible", "expires_at": "2027-01-01T00:00:00.000Z"}) \
            == "UNAUTHORIZED"
        assert code(retention={"derivative_rule": "make-ineligible", "expires_at": "2026-05-28T20:26:40.000Z"}) \
            == "INVALID_SCHEMA"  # not strictly after capture time
        assert code(reconciliation={"family_refs": ["f:nope"]}) == "UNAUTHORIZED"
        ok = h.capture("Retention checks.", retention={"derivative_rule": "make-ineligible",
                                                       "expires_at": "2026-06-01T00:00:00.000Z"},
                       reconciliation={"family_refs": ["f:ok"]})
        assert ok["status"] == "committed_pending"
        # a retry later still replays: retention was resolved at the first capture
        h.now += 10 * 86_400_000
        assert h.capture("Retention checks.", retention={"derivative_rule": "make-ineligible",
                                                         "expires_at": "2026-06-01T00:00:00.000Z"},
                         reconciliation={"family_refs": ["f:ok"]})["status"] == "duplicate_exact"
    finally:
        h.close()


def test_expiry_moves_record_out(h: Harness) -> None:
    cap = h.capture("Short-lived.", retention={"derivative_rule": "make-ineligible",
                                              "expires_at": "2026-05-29T00:00:00.000Z"})
    rid = h.admit(cap["candidate_id"])["outcome"]["record_id"]
    assert h.life.expire_due(ctx().scope_ref, T0) == []
    assert h.life.expire_due(ctx().scope_ref, T0 + 86_400_000) == [rid]
    assert h.state("records", "record_id", rid) == "expired"
    value, _ = h.life.forget(ctx(), forget_args(rid), h.now)
    assert value["receipt"]["from_state"] == "expired"


def test_expiry_sweep_sees_records_admitted_after_it_ran(h: Harness) -> None:
    # The sweep remembers the next due time per scope; a later admission must lower it.
    assert h.life.expire_due(ctx().scope_ref, T0) == []  # nothing expires: remembered
    late = h.capture("Expires later.", retention={"derivative_rule": "make-ineligible",
                                                  "expires_at": "2026-06-20T00:00:00.000Z"})
    h.admit(late["candidate_id"])
    soon = h.capture("Expires soon.", key="capture-key-000009",
                     retention={"derivative_rule": "make-ineligible", "expires_at": "2026-05-29T00:00:00.000Z"})
    rid = h.admit(soon["candidate_id"], key="admit-key-000009")["outcome"]["record_id"]
    assert h.life.expire_due(ctx().scope_ref, T0) == []
    assert h.life.expire_due(ctx().scope_ref, T0 + 86_400_000) == [rid]
    assert h.life.expire_due(ctx().scope_ref, T0 + 86_400_000) == []
    assert len(h.life.expire_due(ctx().scope_ref, T0 + 40 * 86_400_000)) == 1


def test_journal_is_dense_and_chained(h: Harness) -> None:
    cap = h.capture("Chain one.")
    h.admit(cap["candidate_id"])
    h.capture("Chain two.", key="capture-key-000002")
    scope = ctx().scope_ref
    assert h.db.verify_journal(scope)
    cursors = [r[0] for r in h.db.all("SELECT cursor FROM journal WHERE scope_ref = ? ORDER BY cursor", [scope])]
    assert cursors == [1, 2, 3]
    body = json.loads(h.db.one("SELECT body FROM journal WHERE cursor = 2")[0])
    h.db.con.execute("UPDATE journal SET body = ? WHERE cursor = 2", [json.dumps({**body, "reason_ref": "x"})])
    assert not h.db.verify_journal(scope)


def test_second_process_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    h = Harness(tmp_path / "busy")
    try:
        code = (
            "import sys; from pathlib import Path; from engram_memory.store.backend import StoreBusyError\n"
            "from engram_memory.store.duckdb.backend import Database\n"
            "try:\n    Database(Path(sys.argv[1]))\nexcept StoreBusyError as e:\n    print('busy'); sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "busy")], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 3 and "busy" in proc.stdout
    finally:
        h.close()
    with pytest.raises(StoreBusyError):
        a = Database(tmp_path / "again")
        try:
            Database(tmp_path / "again")
        finally:
            a.close()


def test_crash_before_commit_changes_nothing(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    cap = h.capture("Crash test.")
    before = h.db.all("SELECT * FROM candidates")

    def boom(*_a, **_k):
        raise RuntimeError("simulated crash inside the transaction")

    monkeypatch.setattr(h.life.__class__, "_transaction_receipt", boom)
    with pytest.raises(RuntimeError):
        h.admit(cap["candidate_id"])
    monkeypatch.undo()
    assert h.db.all("SELECT * FROM candidates") == before
    assert h.db.one("SELECT count(*) FROM records")[0] == 0
    assert h.db.high_water(ctx().scope_ref) == 1
    assert h.admit(cap["candidate_id"])["outcome"]["status"] == "accepted"  # the retry converges
