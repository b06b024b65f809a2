"""The operator's queue in the store (store/host/approvals.py), on a real engine of each backend, with a
clock the test moves: parking, approval within the window, denial, expiry, digest conflicts, the
sealed arguments' key destroyed with the decision, and the approved call's error answered again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_memory.models.errors import EngramError
from engram_memory.models.settings import EngineSettings
from engram_memory.models.tools import parse_input
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.refusals import AdminRefusal, AdminUsageError
from engram_memory.store.host import approvals
from tests.conftest import Backend
from tests.store_fixtures import T0, admit_texts, call, ctx, forget_args

REASON = "the user asked for it"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clocked(backend: Backend, tmp_path: Path) -> Iterator[tuple[Engine, Clock]]:
    clock = Clock()
    settings = EngineSettings(data_dir=tmp_path / "data", semantic=False, store=backend.store,
                              master_key_file=backend.master_key_file)
    engine = Engine.open(settings, clock=clock)
    try:
        yield engine, clock
    finally:
        engine.close()


def gate(engine: Engine, tool: str, args: dict[str, Any], c: Any = None, ttl_s: float = 300) -> str:
    return approvals.admit_or_park(engine, c or ctx(), tool, parse_input(tool, args), ttl_s)


def refused(engine: Engine, tool: str, args: dict[str, Any], code: str = "gate_failed", **kw: Any) -> str:
    with pytest.raises(EngramError) as info:
        gate(engine, tool, args, **kw)
    assert info.value.code == code, info.value
    return info.value.detail


def test_park_approve_replay(clocked: tuple[Engine, Clock]) -> None:
    engine, clock = clocked
    rid = admit_texts(engine, ["Quay cranes are inspected monthly."])[0]
    args = forget_args(rid, "forget-approve-0001")
    request_id = refused(engine, "forget", args).rsplit(" ", 1)[-1]
    assert refused(engine, "forget", args).endswith("is pending")  # one request per key, not two
    [listed] = approvals.pending(engine, None, clock())
    assert listed["request_id"] == request_id and listed["target"] == rid
    parked = approvals.find(engine, request_id)
    assert parked is not None and parked.key_ref is not None
    assert approvals.parked_arguments(engine, parked) == {**args}
    # the same key for another target is a conflict, not a second request
    refused(engine, "forget", {**args, "record_id": "mem_" + "a" * 52}, "DIGEST_CONFLICT")
    with pytest.raises(AdminUsageError):
        approvals.decide(engine, request_id, True, "password=Tr0ub4dor&3xyzzy-Q", clock())
    clock.now += 10_000
    decided = approvals.decide(engine, request_id, True, REASON, clock())
    assert (decided["status"], decided["outcome"], decided["reason"]) == ("approved", "ok", REASON)
    assert engine.keys.load(parked.key_ref) is None  # the sealed arguments are unreadable now
    assert approvals.pending(engine, None, clock()) == []
    clock.now += 3_600_000  # whenever the retry comes, it answers the approved outcome
    assert gate(engine, "forget", args) == request_id
    value = call(engine, "forget", ctx(), args)
    assert value["replayed"] is True and value["receipt"]["to_state"] == "tombstoned"
    with pytest.raises(AdminRefusal) as info:
        approvals.decide(engine, request_id, False, REASON, clock())
    assert info.value.code == "NOT_PENDING"


def test_deny_expire_and_scope(clocked: tuple[Engine, Clock]) -> None:
    engine, clock = clocked
    a, b = admit_texts(engine, ["Buoys are repainted in May.", "Moorings are checked in June."])
    denied, expired = forget_args(a, "forget-deny-000001"), forget_args(b, "forget-expire-0001")
    denied_id = refused(engine, "forget", denied).rsplit(" ", 1)[-1]
    expired_id = refused(engine, "forget", expired, ttl_s=60).rsplit(" ", 1)[-1]
    # another scope never sees nor decides them
    assert approvals.pending(engine, "tenant:globex/workspace:ops", clock()) == []
    with pytest.raises(AdminRefusal) as info:
        approvals.decide(engine, denied_id, True, REASON, clock(), "tenant:globex/workspace:ops")
    assert info.value.code == "UNKNOWN_REQUEST"
    approvals.decide(engine, denied_id, False, "keep it", clock())
    refused(engine, "forget", denied)
    clock.now += 60_000  # the TTL passed: the retry itself finds it expired
    assert refused(engine, "forget", expired).endswith("is expired")
    with pytest.raises(AdminRefusal) as info:
        approvals.decide(engine, expired_id, True, REASON, clock())
    assert info.value.code == "NOT_PENDING"
    assert sorted(r["record_id"] for r in engine.live_records("tenant:acme/workspace:main")) == sorted([a, b])


def test_an_approved_call_that_fails_answers_its_code(clocked: tuple[Engine, Clock]) -> None:
    engine, clock = clocked
    rid = admit_texts(engine, ["Slipways are cleared weekly."])[0]
    first, second = forget_args(rid, "forget-first-00001"), forget_args(rid, "forget-second-0001")
    first_id = refused(engine, "forget", first).rsplit(" ", 1)[-1]
    second_id = refused(engine, "forget", second).rsplit(" ", 1)[-1]
    assert approvals.decide(engine, first_id, True, REASON, clock())["outcome"] == "ok"
    # the record is gone by now: the second approval runs and answers what forget answers
    assert approvals.decide(engine, second_id, True, REASON, clock())["outcome"] == "ALREADY_TERMINAL"
    refused(engine, "forget", second, "ALREADY_TERMINAL")
