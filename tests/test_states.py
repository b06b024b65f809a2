"""The lifecycle transition table (models/states.py), the enums and the contract numbers."""

from __future__ import annotations

import itertools

import pytest

from engram_memory.models import limits
from engram_memory.models.errors import CATALOG, EngramError, ErrorCode
from engram_memory.models.states import (
    DECIDED,
    EXPIRABLE,
    FORGETTABLE,
    TERMINAL,
    TRANSITIONS,
    CandidateState,
    FusionMethod,
    Operation,
    RecordState,
    admission_step,
    can_transition,
    legal_from,
    next_state,
    parse_state,
)

C, R, Op = CandidateState, RecordState, Operation
ALL_STATES = (*CandidateState, *RecordState)

# Every legal move, written out by hand (REFERENCE_CONTRACT §7.2, the subset the store implements).
LEGAL = {
    (Op.ACCEPT, C.PENDING): R.ACCEPTED_CURRENT,
    (Op.REJECT, C.PENDING): C.REJECTED,
    (Op.WITHDRAW, C.PENDING): C.WITHDRAWN,
    (Op.EXPIRE, R.ACCEPTED_CURRENT): R.EXPIRED,
    (Op.EXPIRE, R.ACCEPTED_DISPUTED): R.EXPIRED,
    (Op.EXPIRE, R.HISTORICAL): R.EXPIRED,
    (Op.TOMBSTONE, R.ACCEPTED_CURRENT): R.TOMBSTONED,
    (Op.TOMBSTONE, R.ACCEPTED_DISPUTED): R.TOMBSTONED,
    (Op.TOMBSTONE, R.HISTORICAL): R.TOMBSTONED,
    (Op.TOMBSTONE, R.EXPIRED): R.TOMBSTONED,
    (Op.TOMBSTONE, R.TRUST_INVALID): R.TOMBSTONED,
    (Op.DISPUTE, R.ACCEPTED_CURRENT): R.ACCEPTED_DISPUTED,
    (Op.RESOLVE_DISPUTE, R.ACCEPTED_DISPUTED): R.ACCEPTED_CURRENT,
    (Op.SUPERSEDE, R.ACCEPTED_CURRENT): R.HISTORICAL,
    (Op.SUPERSEDE, R.ACCEPTED_DISPUTED): R.HISTORICAL,
    (Op.MARK_NON_CURRENT, R.ACCEPTED_CURRENT): R.HISTORICAL,
    (Op.MARK_NON_CURRENT, R.ACCEPTED_DISPUTED): R.HISTORICAL,
    (Op.REWIND, R.HISTORICAL): R.ACCEPTED_CURRENT,
    (Op.TRUST_INVALIDATE, R.ACCEPTED_CURRENT): R.TRUST_INVALID,
    (Op.TRUST_INVALIDATE, R.ACCEPTED_DISPUTED): R.TRUST_INVALID,
    (Op.TRUST_INVALIDATE, R.HISTORICAL): R.TRUST_INVALID,
}
REFUSED_OTHERWISE = {
    (Op.TOMBSTONE, R.TOMBSTONED): "ALREADY_TERMINAL",  # forget after forget (new key)
    (Op.WITHDRAW, C.WITHDRAWN): "ALREADY_TERMINAL",  # withdraw after withdraw (new key)
    (Op.ACCEPT, C.WITHDRAWN): "NOT_FOUND",  # a withdrawn candidate is gone
    (Op.REJECT, C.WITHDRAWN): "NOT_FOUND",
}


def test_the_table_is_exactly_the_legal_moves() -> None:
    assert dict(TRANSITIONS) == LEGAL


@pytest.mark.parametrize("op,state", list(itertools.product(Operation, ALL_STATES)))
def test_every_move_is_legal_or_refused_with_todays_code(op: Operation, state: CandidateState | RecordState) -> None:
    if (op, state) in LEGAL:
        assert next_state(op, state) == LEGAL[op, state]
        assert next_state(str(op), str(state)) == LEGAL[op, state]  # the store's strings work too
        assert can_transition(op, state)
        return
    assert not can_transition(op, state)
    with pytest.raises(EngramError) as info:
        next_state(op, str(state))
    assert info.value.code == REFUSED_OTHERWISE.get((op, state), "ILLEGAL_TRANSITION")
    assert type(info.value.code) is str


def test_withdraw_after_admission_is_illegal() -> None:
    for state in (C.ACCEPTED, C.REJECTED):
        with pytest.raises(EngramError) as info:
            next_state("withdraw", state)
        assert info.value.code == "ILLEGAL_TRANSITION"


def test_from_state_sets_in_contract_order() -> None:
    assert EXPIRABLE == (R.ACCEPTED_CURRENT, R.ACCEPTED_DISPUTED, R.HISTORICAL)
    assert FORGETTABLE == (*EXPIRABLE, R.EXPIRED, R.TRUST_INVALID)
    assert legal_from("withdraw") == (C.PENDING,)
    assert not any((op, s) in TRANSITIONS for op in Operation for s in TERMINAL)


def test_admission_step() -> None:
    assert admission_step("pending") == "decide"
    for state in DECIDED:
        assert admission_step(state) == "duplicate_exact"
    with pytest.raises(EngramError) as info:
        admission_step("withdrawn")
    assert info.value.code == "NOT_FOUND"


def test_state_values_are_disjoint_and_parse() -> None:
    assert not {s.value for s in CandidateState} & {s.value for s in RecordState}
    for state in ALL_STATES:
        assert parse_state(state.value) is state
    with pytest.raises(ValueError):
        parse_state("pending_adjudication")  # an admission outcome, not a state (§7.1)


def test_error_codes_are_the_catalog() -> None:
    assert list(CATALOG) == list(ErrorCode)
    assert ErrorCode.GATE_FAILED == "gate_failed"
    for code in ErrorCode:
        by_enum, by_str = EngramError(code), EngramError(code.value)
        assert by_enum.code == by_str.code == code.value and type(by_enum.code) is str
        assert str(by_enum) == code.value
        assert by_enum.message == CATALOG[code].message
    with pytest.raises(KeyError):
        EngramError("NOPE")


def test_fusion_methods() -> None:
    assert [m.value for m in FusionMethod] == ["rrf", "dbsf", "convex"]


def test_contract_numbers() -> None:
    assert limits.MAX_ARGUMENT_BYTES == limits.RESULT_BOUND == 1_048_576
    assert limits.OPAQUE_MAX_BYTES == 512
    assert (limits.LIMIT_MIN, limits.LIMIT_MAX, limits.LIMIT_DEFAULT) == (1, 50, 10)
    assert (limits.PACKET_BYTES_MIN, limits.PACKET_BYTES_MAX, limits.PACKET_BYTES_DEFAULT) == (4_096, 1_048_576, 65_536)
    assert limits.CONFIRM_TTL_S == 300 and limits.EXECUTION_WINDOW_S == 30
    assert limits.RRF_K == 60 and limits.HNSW_THRESHOLD == 50_000 and limits.CHANNEL_DEPTH == 1000


def test_schema_bounds_come_from_limits() -> None:
    from engram_memory.models.schema import input_schema

    props = input_schema("search")["properties"]
    assert props["limit"]["minimum"] == limits.LIMIT_MIN and props["limit"]["maximum"] == limits.LIMIT_MAX
    assert props["limit"]["default"] == limits.LIMIT_DEFAULT
    assert props["max_packet_bytes"]["maximum"] == limits.PACKET_BYTES_MAX
    assert props["max_packet_bytes"]["default"] == limits.PACKET_BYTES_DEFAULT
    assert props["purpose_ref"]["maxLength"] == limits.OPAQUE_MAX_BYTES
