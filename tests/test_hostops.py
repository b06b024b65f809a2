"""Host lifecycle operations (store/host/hostops.py) on the REAL engine, on DuckDB and on PostgreSQL.

On DuckDB the operator's engine is the serving engine itself (as the owner applies a host
operation in process); on PostgreSQL it is an admin node (store/core/admin_node.py) beside a
serving node, which must follow each operation from the shared journal. The agent's side is
called through the engine's typed API with the contract's models (tests/store_fixtures.py call).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engram_memory.models.errors import EngramError
from engram_memory.models.outputs import validate_output
from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.admin_node import admin_engine
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.refusals import AdminRefusal, AdminUsageError
from engram_memory.store.host.hostops import (
    apply_operation,
    dispute_with,
    operation_digest,
    resolve_with,
    revoke_trust_with,
    rewind_with,
    supersede_family_with,
    supersede_with,
)
from engram_memory.store.maintenance.verify import verify_postgres, verify_store
from engram_memory.store.postgres.backend import init_store
from engram_memory.store.postgres.databases import create_database, drop_database
from tests.store_fixtures import PURPOSE, T0, admission_args, call, capture_args, ctx, forget_args

REASON = "the operator checked the source document"
FAMILY = "family:deploy-target"


def duckdb_settings(root: Path) -> EngineSettings:
    return EngineSettings(data_dir=root / "data", semantic=False, consented_families=(FAMILY,))


@dataclass
class Rig:
    """A store with a serving engine (the agent's calls) and the operator's engine."""

    backend: str
    root: Path
    engine: Engine
    admin: Engine
    url: str | None = None
    key_file: Path | None = None
    now: int = T0
    serial: int = 0
    stack: ExitStack = field(default_factory=ExitStack)

    def key(self, label: str) -> str:
        self.serial += 1
        return f"{label}-key-{self.serial:010d}"

    def admit(self, text: str, c: Any = None, **extra: Any) -> str:
        c = c or ctx()
        args = capture_args(text, self.key("capture"))
        for name, value in extra.items():
            if name == "source_ref":
                args["payload"]["citations"][0]["source_ref"] = value
            elif name == "evidence_digest":
                args["evidence"]["evidence_digest"] = value
            else:
                args["payload"][name] = value
        made = call(self.engine, "capture", c, args)
        value = call(self.engine, "request_admission", c, admission_args(made["candidate_id"], self.key("admit")))
        assert value["outcome"]["status"] == "accepted", value
        return str(value["outcome"]["record_id"])

    def search(self, word: str, c: Any = None) -> list[str]:
        value = call(self.engine, "search", c or ctx(), {"query": word, "purpose_ref": PURPOSE, "limit": 50})
        validate_output("search", value)
        return [p["record"]["record_id"] for p in value["records"]]

    def get(self, rid: str, c: Any = None) -> str | None:
        """The record's id when get returns it, else the refusal code."""
        try:
            value = call(self.engine, "get", c or ctx(), {"record_id": rid, "purpose_ref": PURPOSE})
        except EngramError as exc:
            return exc.code
        return str(value["record"]["record_id"])

    def state(self, rid: str, c: Any = None) -> str:
        status = self.engine.db.record_state((c or ctx()).scope_ref, rid)
        assert status is not None
        return str(status.state)

    def snapshot(self, rids: list[str]) -> tuple[Any, ...]:
        """What a refusal must leave unchanged: the journal's head and every record's state."""
        scope = ctx().scope_ref
        return (self.engine.db.high_water(scope), self.engine.db.heads().get(scope),
                tuple(self.state(r) for r in rids))

    def verify(self) -> None:
        """``admin verify`` passes (the DuckDB store closed for it, then reopened)."""
        if self.url is not None:
            assert self.key_file is not None
            report = verify_postgres(self.url, self.key_file.read_bytes(), self.key_file)
        else:
            self.engine.close()
            report = verify_store(self.root / "data")
            self.engine = self.admin = Engine.open(duckdb_settings(self.root), clock=lambda: self.now)
        assert report.ok, report.problems


@pytest.fixture(params=["duckdb", "postgres"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    if request.param == "duckdb":
        engine = Engine.open(duckdb_settings(tmp_path), clock=lambda: T0)
        r = Rig("duckdb", tmp_path, engine, engine)
        engine.clock = lambda: r.now
        try:
            yield r
        finally:
            r.engine.close()
        return
    pg_url = request.getfixturevalue("pg_url")
    url = create_database(pg_url, "engram_hostops")
    key_file = tmp_path / "master.key"
    key_file.write_bytes(secrets.token_bytes(32))
    init_store(url, key_file.read_bytes())
    stack = ExitStack()
    try:
        engine = Engine.open(EngineSettings(data_dir=tmp_path / "node", semantic=False, store=url,
                                            master_key_file=key_file, consented_families=(FAMILY,)), clock=lambda: T0)
        stack.callback(engine.close)
        admin = stack.enter_context(admin_engine(url, key_file))
        r = Rig("postgres", tmp_path, engine, admin, url, key_file, stack=stack)
        engine.clock = lambda: r.now
        yield r
    finally:
        stack.close()
        drop_database(pg_url, url)


# ---- each operation -------------------------------------------------------------------------


def test_dispute_leaves_search_and_get_and_resolve_brings_it_back(rig: Rig) -> None:
    a = rig.admit("amber basalt")
    b = rig.admit("amber cobalt")
    assert sorted(rig.search("amber")) == sorted([a, b]) and rig.get(a) == a
    result = dispute_with(rig.admin, a, REASON, rig.now)
    assert (result["operation"], result["from_state"], result["to_state"]) == (
        "dispute", "accepted_current", "accepted_disputed")
    assert result["record_ids"] == [a] and result["reason"] == REASON and result["scope_ref"] == ctx().scope_ref
    receipt = result["receipt"]
    assert receipt["event_digest"] == result["event_hash"] and receipt["cursor"] == str(result["cursor"])
    assert receipt["from_state"] == "accepted_current" and receipt["count"] == 1
    assert rig.state(a) == "accepted_disputed"
    assert rig.search("amber") == [b] and rig.search("basalt") == []
    assert rig.get(a) == "NOT_FOUND"

    back = resolve_with(rig.admin, a, True, REASON, rig.now)
    assert (back["operation"], back["from_state"], back["to_state"]) == (
        "resolve_dispute", "accepted_disputed", "accepted_current")
    assert sorted(rig.search("amber")) == sorted([a, b]) and rig.search("basalt") == [a] and rig.get(a) == a

    dispute_with(rig.admin, a, REASON, rig.now)
    done = resolve_with(rig.admin, a, False, REASON, rig.now)
    assert (done["operation"], done["to_state"]) == ("mark_non_current", "historical")
    assert rig.state(a) == "historical" and rig.search("basalt") == [] and rig.get(a) == "NOT_FOUND"
    rig.verify()


def test_supersede_links_old_to_new(rig: Rig) -> None:
    old = rig.admit("dune fjord")
    new = rig.admit("dune cobalt")
    result = supersede_with(rig.admin, old, new, REASON, rig.now)
    assert (result["operation"], result["from_state"], result["to_state"]) == (
        "supersede", "accepted_current", "historical")
    assert result["related_record_id"] == new and result["receipt"]["related_record_id"] == new
    assert rig.state(old) == "historical" and rig.state(new) == "accepted_current"
    assert rig.search("dune") == [new] and rig.search("fjord") == [] and rig.get(old) == "NOT_FOUND"
    # A disputed record is superseded too.
    third = rig.admit("dune basalt")
    dispute_with(rig.admin, third, REASON, rig.now)
    assert supersede_with(rig.admin, third, new, REASON, rig.now)["from_state"] == "accepted_disputed"
    rig.verify()


def test_supersede_by_family(rig: Rig) -> None:
    family = {"family_refs": [FAMILY]}
    one = rig.admit("amber deploys to eu", reconciliation=family)
    two = rig.admit("amber deploys to us", reconciliation=family)
    other = rig.admit("amber unrelated")
    new = rig.admit("amber deploys to asia", reconciliation=family)
    result = supersede_family_with(rig.admin, new, FAMILY, REASON, rig.now)
    assert result["record_ids"] == sorted([one, two]) and result["receipt"]["count"] == 2
    assert result["family_ref"] == FAMILY
    assert sorted(rig.search("amber")) == sorted([other, new])
    with pytest.raises(AdminRefusal) as info:  # nothing left in the family but NEW
        supersede_family_with(rig.admin, new, FAMILY, REASON, rig.now)
    assert info.value.code == "NOTHING_MATCHES"
    with pytest.raises(AdminUsageError):  # NEW must be of the family
        supersede_family_with(rig.admin, other, FAMILY, REASON, rig.now)


@pytest.mark.parametrize("selector", ["source_ref", "evidence_ref", "principal"])
def test_revoke_trust_invalidates_every_current_record_resting_on_it(rig: Rig, selector: str) -> None:
    mallory = ctx(principal="mallory")
    bad = [rig.admit("cobalt one", c=mallory, source_ref="doc:leaked", evidence_digest="sha256:" + "e" * 64),
           rig.admit("cobalt two", c=mallory, source_ref="doc:leaked", evidence_digest="sha256:" + "e" * 64)]
    good = rig.admit("cobalt three")
    gone_before = rig.admit("cobalt four", c=mallory, source_ref="doc:leaked", evidence_digest="sha256:" + "e" * 64)
    dispute_with(rig.admin, gone_before, REASON, rig.now)  # not current: left as it is
    ref = {"source_ref": "doc:leaked", "evidence_ref": "sha256:" + "e" * 64, "principal": "mallory"}[selector]
    result = revoke_trust_with(rig.admin, ctx().scope_ref, REASON, rig.now, **{selector: ref})
    assert (result["operation"], result["from_state"], result["to_state"]) == (
        "trust_invalidate", "accepted_current", "trust_invalid")
    assert result["record_ids"] == sorted(bad) and result["receipt"]["count"] == 2
    assert result["receipt"]["record_ids"] == sorted(bad) and result["selector"] == {selector: ref}
    assert [rig.state(r) for r in bad] == ["trust_invalid"] * 2 and rig.state(gone_before) == "accepted_disputed"
    assert rig.search("cobalt") == [good] and rig.get(bad[0]) == "NOT_FOUND"
    with pytest.raises(AdminRefusal) as info:
        revoke_trust_with(rig.admin, ctx().scope_ref, REASON, rig.now, **{selector: ref})
    assert info.value.code == "NOTHING_MATCHES"
    with pytest.raises(AdminUsageError):
        revoke_trust_with(rig.admin, ctx().scope_ref, REASON, rig.now, source_ref="a", principal="b")
    rig.verify()


def test_rewind_undoes_a_supersede(rig: Rig) -> None:
    old = rig.admit("fjord amber")
    cursor = rig.engine.db.high_water(ctx().scope_ref)
    new = rig.admit("fjord basalt")
    supersede_with(rig.admin, old, new, REASON, rig.now)
    assert rig.search("fjord") == [new]
    result = rewind_with(rig.admin, old, cursor, REASON, rig.now)
    assert (result["operation"], result["from_state"], result["to_state"]) == ("rewind", "historical",
                                                                                "accepted_current")
    assert result["related_record_id"] == new and result["related_to_state"] == "historical"
    assert rig.state(old) == "accepted_current" and rig.state(new) == "historical"
    assert rig.search("fjord") == [old] and rig.get(old) == old and rig.get(new) == "NOT_FOUND"
    rig.verify()


# ---- refusals leave the store unchanged -----------------------------------------------------


def test_illegal_transitions_are_refused_and_change_nothing(rig: Rig) -> None:
    a = rig.admit("basalt one")
    b = rig.admit("basalt two")
    cursor_a = rig.engine.db.high_water(ctx().scope_ref)
    untrusted = rig.admit("basalt three", source_ref="doc:bad")
    revoke_trust_with(rig.admin, ctx().scope_ref, REASON, rig.now, source_ref="doc:bad")
    gone = rig.admit("basalt four")
    call(rig.engine, "forget", ctx(), forget_args(gone, rig.key("forget")))
    rids = [a, b, untrusted, gone]
    illegal = [
        lambda: resolve_with(rig.admin, a, True, REASON, rig.now),  # a current record is not disputed
        lambda: resolve_with(rig.admin, a, False, REASON, rig.now),
        lambda: dispute_with(rig.admin, untrusted, REASON, rig.now),
        lambda: dispute_with(rig.admin, gone, REASON, rig.now),  # tombstone dominates
        lambda: supersede_with(rig.admin, untrusted, b, REASON, rig.now),
        lambda: supersede_with(rig.admin, a, untrusted, REASON, rig.now),  # NEW must be current
        lambda: rewind_with(rig.admin, a, cursor_a, REASON, rig.now),  # current: nothing to rewind
        lambda: rewind_with(rig.admin, untrusted, cursor_a, REASON, rig.now),  # did not exist then
        lambda: rewind_with(rig.admin, gone, cursor_a, REASON, rig.now),
    ]
    for attempt in illegal:
        before = rig.snapshot(rids)
        with pytest.raises(AdminRefusal) as info:
            attempt()
        assert info.value.code == "ILLEGAL_TRANSITION", info.value
        assert rig.snapshot(rids) == before
    mistakes = [
        lambda: dispute_with(rig.admin, "mem_" + "a" * 52, REASON, rig.now),
        lambda: dispute_with(rig.admin, a, "   ", rig.now),
        lambda: dispute_with(rig.admin, a, "rotated: password is Sup3rS3cret!", rig.now),
        lambda: supersede_with(rig.admin, a, a, REASON, rig.now),
        lambda: rewind_with(rig.admin, a, 10_000, REASON, rig.now),
        lambda: apply_operation(rig.admin, {"operation": "erase", "reason": REASON}, rig.now),
        lambda: apply_operation(rig.admin, {"operation": "dispute", "reason": REASON}, rig.now),
        lambda: apply_operation(rig.admin, {"operation": "resolve", "record_id": a, "current": "yes",
                                            "reason": REASON}, rig.now),
        lambda: apply_operation(rig.admin, {"operation": "rewind", "record_id": a, "to_cursor": "1",
                                            "reason": REASON}, rig.now),
    ]
    for attempt in mistakes:
        before = rig.snapshot(rids)
        with pytest.raises(AdminUsageError):
            attempt()
        assert rig.snapshot(rids) == before
    other = ctx(workspace="elsewhere")
    foreign = rig.admit("basalt foreign", c=other)
    with pytest.raises(AdminUsageError, match="different scopes"):
        supersede_with(rig.admin, a, foreign, REASON, rig.now)
    assert rig.search("basalt") == [a, b] or sorted(rig.search("basalt")) == sorted([a, b])


# ---- the agent's forget from each new state -------------------------------------------------


def test_forget_works_from_every_host_state(rig: Rig) -> None:
    disputed = rig.admit("dune disputed")
    historical = rig.admit("dune historical")
    untrusted = rig.admit("dune untrusted", source_ref="doc:revoked")
    keeper = rig.admit("dune keeper")
    dispute_with(rig.admin, disputed, REASON, rig.now)
    supersede_with(rig.admin, historical, keeper, REASON, rig.now)
    revoke_trust_with(rig.admin, ctx().scope_ref, REASON, rig.now, source_ref="doc:revoked")
    for rid, state in ((disputed, "accepted_disputed"), (historical, "historical"), (untrusted, "trust_invalid")):
        value = call(rig.engine, "forget", ctx(), forget_args(rid, rig.key("forget")))
        validate_output("forget", value)
        receipt = value["receipt"]
        assert (receipt["from_state"], receipt["to_state"]) == (state, "tombstoned")
        assert value["projection_invalidation"] == "complete"
        assert rig.state(rid) == "tombstoned"
    assert rig.search("dune") == [keeper]
    rig.verify()


# ---- the journal: digests, replay ---------------------------------------------------------------


def test_operation_digest_binds_every_field() -> None:
    request = {"operation": "supersede", "record_id": "mem_a", "by": "mem_b", "reason": "stale"}
    assert operation_digest(request) == operation_digest(dict(reversed(list(request.items()))))
    assert operation_digest(request).startswith("sha256:")
    for name in request:
        assert operation_digest({**request, name: request[name] + "x"}) != operation_digest(request)


def test_a_node_that_was_away_catches_up_on_every_operation(rig: Rig) -> None:
    """A rebuilt (DuckDB: rebuild from the store) or caught-up (PostgreSQL: a second serving node
    opened afterwards) node answers the searches the live node answers."""
    ids = [rig.admit(f"amber {w}") for w in ("one", "two", "three", "four", "five")]
    cursor = rig.engine.db.high_water(ctx().scope_ref)
    dispute_with(rig.admin, ids[0], REASON, rig.now)
    supersede_with(rig.admin, ids[1], ids[2], REASON, rig.now)
    rewind_with(rig.admin, ids[1], cursor, REASON, rig.now)
    revoke_trust_with(rig.admin, ctx().scope_ref, REASON, rig.now, principal="alice")
    resolve_with(rig.admin, ids[0], True, REASON, rig.now)
    words = ["amber", "one", "two", "three", "four", "five"]
    live = {w: sorted(rig.search(w)) for w in words}
    assert live["amber"] == [ids[0]]
    if rig.url is None:
        from engram_memory.store.maintenance.rebuild import rebuild_index

        rig.engine.close()
        rebuild_index(rig.root / "data", show_progress=False, semantic=False)
        rig.engine = rig.admin = Engine.open(duckdb_settings(rig.root))
    else:
        late = Engine.open(EngineSettings(data_dir=rig.root / "late-node", semantic=False, store=rig.url,
                                          master_key_file=rig.key_file))
        rig.stack.callback(late.close)
        rig.engine = late
    assert {w: sorted(rig.search(w)) for w in words} == live


def test_verify_catches_a_record_state_its_journal_does_not_lead_to(tmp_path: Path) -> None:
    engine = Engine.open(duckdb_settings(tmp_path), clock=lambda: T0)
    rig = Rig("duckdb", tmp_path, engine, engine)
    try:
        rid = rig.admit("amber planted")
        dispute_with(engine, rid, REASON, T0)
    finally:
        engine.close()
    assert verify_store(tmp_path / "data").ok
    import duckdb

    with duckdb.connect(str(tmp_path / "data" / "engram.duckdb")) as con:  # a state row edited behind the journal
        con.execute("UPDATE records SET state = 'accepted_current' WHERE record_id = ?", [rid])
    report = verify_store(tmp_path / "data")
    assert any("state is not the one their journal events lead to" in p and rid in p for p in report.problems)
