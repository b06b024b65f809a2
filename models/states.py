"""Lifecycle states, fusion methods and the state machine's legal transitions (REFERENCE_CONTRACT §7).

The transition table is the one place a legal move is written; the store consults
:func:`next_state` instead of spelling the rules as ``if`` chains.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final, Literal

from engram_memory.models.errors import EngramError, ErrorCode


class CandidateState(StrEnum):
    """A candidate's state (§7.1); rejected and withdrawn candidates are not records."""

    PENDING = "pending"
    ACCEPTED = "accepted"  # admitted: it became a record (candidates table)
    REJECTED = "rejected"
    WITHDRAWN = "withdrawn"


class RecordState(StrEnum):
    """An admitted record's state (§7.1)."""

    ACCEPTED_CURRENT = "accepted_current"
    ACCEPTED_DISPUTED = "accepted_disputed"
    HISTORICAL = "historical"
    EXPIRED = "expired"
    TRUST_INVALID = "trust_invalid"
    TOMBSTONED = "tombstoned"


State = CandidateState | RecordState


class FusionMethod(StrEnum):
    """How channel rankings are fused (the methods an operator may configure)."""

    RRF = "rrf"
    DBSF = "dbsf"
    CONVEX = "convex"


# What a rank receipt names as the method when a single channel contributed (nothing fused).
NO_FUSION: Final = "none"
# The default: chosen with rotation over the development collections (studies/fusion-study.md).
DEFAULT_FUSION: Final = FusionMethod.DBSF
DEFAULT_FUSION_WEIGHTS: Final = (0.5, 0.5)  # lexical, semantic


class Operation(StrEnum):
    """Lifecycle operations (§7.2) the store implements; the values are the journal's ``operation``."""

    ACCEPT = "accept"
    REJECT = "reject"
    WITHDRAW = "withdraw"
    EXPIRE = "expire"
    TOMBSTONE = "tombstone"  # the forget tool
    # Host operations (engram-memory admin ...; store/host/hostops.py), never an agent's tool.
    DISPUTE = "dispute"
    RESOLVE_DISPUTE = "resolve_dispute"
    SUPERSEDE = "supersede"
    MARK_NON_CURRENT = "mark_non_current"
    REWIND = "rewind"
    TRUST_INVALIDATE = "trust_invalidate"


# capture: (absent) -> pending
INITIAL_STATE: Final = CandidateState.PENDING
# Records search and get may return (§7.3 recall_current).
VISIBLE: Final = frozenset({RecordState.ACCEPTED_CURRENT})

_CURRENTISH = (RecordState.ACCEPTED_CURRENT, RecordState.ACCEPTED_DISPUTED, RecordState.HISTORICAL)

# (operation, from_state) -> to_state: every legal move, and only those. The to_state is the
# contract's (the journal event's ``to_state``); see CANDIDATE_ROW_STATE for the candidate row.
TRANSITIONS: Final[Mapping[tuple[Operation, State], State]] = MappingProxyType(
    {
        (Operation.ACCEPT, CandidateState.PENDING): RecordState.ACCEPTED_CURRENT,
        (Operation.REJECT, CandidateState.PENDING): CandidateState.REJECTED,
        (Operation.WITHDRAW, CandidateState.PENDING): CandidateState.WITHDRAWN,
        **{(Operation.EXPIRE, s): RecordState.EXPIRED for s in _CURRENTISH},
        (Operation.DISPUTE, RecordState.ACCEPTED_CURRENT): RecordState.ACCEPTED_DISPUTED,
        (Operation.RESOLVE_DISPUTE, RecordState.ACCEPTED_DISPUTED): RecordState.ACCEPTED_CURRENT,
        **{(Operation.SUPERSEDE, s): RecordState.HISTORICAL for s in _CURRENTISH[:2]},
        # resolve --historical: the contract's mark_non_current (resolve_dispute leads only to current)
        **{(Operation.MARK_NON_CURRENT, s): RecordState.HISTORICAL for s in _CURRENTISH[:2]},
        (Operation.REWIND, RecordState.HISTORICAL): RecordState.ACCEPTED_CURRENT,
        **{(Operation.TRUST_INVALIDATE, s): RecordState.TRUST_INVALID for s in _CURRENTISH},
        **{
            (Operation.TOMBSTONE, s): RecordState.TOMBSTONED
            for s in (*_CURRENTISH, RecordState.EXPIRED, RecordState.TRUST_INVALID)
        },
    }
)

# What the candidates table records after a candidate operation (an accepted candidate's row
# says "accepted"; the record it became is accepted_current).
CANDIDATE_ROW_STATE: Final[Mapping[Operation, CandidateState]] = MappingProxyType(
    {
        Operation.ACCEPT: CandidateState.ACCEPTED,
        Operation.REJECT: CandidateState.REJECTED,
        Operation.WITHDRAW: CandidateState.WITHDRAWN,
    }
)

# Illegal moves refused with another code than ILLEGAL_TRANSITION (today's store):
# forgetting a tombstoned record and withdrawing a withdrawn candidate are ALREADY_TERMINAL;
# a withdrawn candidate is gone for request_admission (NOT_FOUND, the reference's defect Q1 fixed).
# Withdrawing an admitted or rejected candidate stays ILLEGAL_TRANSITION.
REFUSALS: Final[Mapping[tuple[Operation, State], ErrorCode]] = MappingProxyType(
    {
        (Operation.TOMBSTONE, RecordState.TOMBSTONED): ErrorCode.ALREADY_TERMINAL,
        (Operation.WITHDRAW, CandidateState.WITHDRAWN): ErrorCode.ALREADY_TERMINAL,
        (Operation.ACCEPT, CandidateState.WITHDRAWN): ErrorCode.NOT_FOUND,
        (Operation.REJECT, CandidateState.WITHDRAWN): ErrorCode.NOT_FOUND,
    }
)

# request_admission on a candidate decided earlier (under another key) is no transition: it
# answers the original decision marked duplicate_exact.
DECIDED: Final = frozenset({CandidateState.ACCEPTED, CandidateState.REJECTED})

_ORDER: Final[tuple[State, ...]] = (*CandidateState, *RecordState)


def legal_from(operation: Operation | str) -> tuple[State, ...]:
    """The states ``operation`` may start from, in declaration order (§7.1)."""
    op = Operation(operation)
    return tuple(s for s in _ORDER if (op, s) in TRANSITIONS)


# The from-states of the store's record operations, in contract order.
EXPIRABLE: Final = legal_from(Operation.EXPIRE)  # accepted_current, accepted_disputed, historical
FORGETTABLE: Final = legal_from(Operation.TOMBSTONE)  # ... expired, trust_invalid
# Terminal: rejected and withdrawn candidates, tombstoned records (tombstone dominates).
TERMINAL: Final = frozenset({CandidateState.REJECTED, CandidateState.WITHDRAWN, RecordState.TOMBSTONED})


def can_transition(operation: Operation | str, from_state: State | str) -> bool:
    return (Operation(operation), parse_state(from_state)) in TRANSITIONS


def next_state(operation: Operation | str, from_state: State | str) -> State:
    """The state ``operation`` leads to from ``from_state``, or the refusal today's store gives.

    Raises ``EngramError`` with the code in :data:`REFUSALS` for those moves and
    ``ILLEGAL_TRANSITION`` for every other move not in :data:`TRANSITIONS`.
    """
    op = Operation(operation)
    state = parse_state(from_state)
    target = TRANSITIONS.get((op, state))
    if target is not None:
        return target
    raise EngramError(REFUSALS.get((op, state), ErrorCode.ILLEGAL_TRANSITION), f"{op} from {state}")


def admission_step(candidate_state: CandidateState | str) -> Literal["decide", "duplicate_exact"]:
    """What request_admission does with a candidate in this state (NOT_FOUND when it was withdrawn)."""
    state = CandidateState(candidate_state)
    if state in DECIDED:
        return "duplicate_exact"
    next_state(Operation.ACCEPT, state)  # raises for withdrawn (NOT_FOUND)
    return "decide"


def parse_state(value: State | str) -> State:
    """A state from its string value (record states and candidate states never share a value)."""
    if isinstance(value, CandidateState | RecordState):
        return value
    try:
        return RecordState(value)
    except ValueError:
        return CandidateState(value)  # raises ValueError on an unknown state
