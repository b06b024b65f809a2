"""A plain-Python model of the engine's contract, for the stateful test (tests/test_state_machine.py).

Nothing here touches the engine: the model says what an operation must answer, given what the
model knows, and the ``check_*`` helpers compare a real answer with that expectation (raising
``AssertionError`` on any divergence). The rules modelled are those of models/states.py and
store/core/lifecycle.py:

* scope = (tenant, workspace); candidates and records belong to a scope, idempotency keys to a
  (scope, principal) pair; a foreign or unknown id is NOT_FOUND, the same answer either way;
* candidate: pending -> accepted (a current record) | rejected (secret-like content) | withdrawn;
  withdraw of withdrawn is ALREADY_TERMINAL, of accepted/rejected ILLEGAL_TRANSITION;
  request_admission of withdrawn is NOT_FOUND, of accepted/rejected the first decision marked
  ``duplicate_exact`` (not a ledger entry); of a pending candidate whose payload equals a
  forgotten record of the scope ``pending_adjudication`` (a ledger entry like any answer; the candidate stays pending);
* record: current -> forgotten (tombstoned); forget of a forgotten record is ALREADY_TERMINAL;
  forget works from every other state (its receipt's from_state names it);
* host operations (store/host/hostops.py, never an agent's tool): dispute current -> disputed; resolve
  disputed -> current | historical; supersede (current | disputed) -> historical by a current
  record of the same scope; revoke trust: every current record of the scope captured by a
  principal (or citing a source) -> trust_invalid (none: NOTHING_MATCHES); rewind historical ->
  current when the record was current at the cursor given, closing the record that superseded it
  after that cursor if it is still current or disputed; every other move ILLEGAL_TRANSITION, an
  unknown record, a record superseding itself or one of another scope a usage error. Only
  current records are searched and got;
* the ledger keeps the first committed answer per (scope, principal, key); a replay with the same
  tool and arguments answers it again, marked as a replay (capture: ``status`` becomes
  ``duplicate_exact``; the others: ``replayed`` becomes true), anything else under that key is
  DIGEST_CONFLICT. Refusals and uncommitted answers bind nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engram_memory.models.canonical import canonical_bytes

Scope = tuple[str, str]  # (tenant, workspace)
LedgerKey = tuple[str, str, str, str]  # (tenant, workspace, principal, idempotency_key)


@dataclass
class Candidate:
    scope: Scope
    text: str
    secret: bool
    state: str = "pending"  # pending | accepted | rejected | withdrawn
    outcome: dict[str, Any] | None = None  # the committed admission outcome (accepted/rejected)
    record_id: str | None = None
    principal: str = ""  # whose capture it was


CURRENT, DISPUTED, HISTORICAL = "accepted_current", "accepted_disputed", "historical"
TRUST_INVALID, TOMBSTONED = "trust_invalid", "tombstoned"


@dataclass
class Rec:
    scope: Scope
    text: str
    state: str = CURRENT
    principal: str = ""
    # (cursor, state after, superseded by) of each event that moved it (its acceptance first)
    history: list[tuple[int, str, str | None]] = field(default_factory=list)

    @property
    def current(self) -> bool:
        return self.state == CURRENT

    @current.setter
    def current(self, value: bool) -> None:  # a test's shorthand: current, or forgotten
        self.state = CURRENT if value else TOMBSTONED

    def moved(self, cursor: int, state: str, superseded_by: str | None = None) -> None:
        self.state = state
        self.history.append((cursor, state, superseded_by))


@dataclass
class Bound:
    """A ledger entry: the first committed answer under a key."""

    tool: str
    args: dict[str, Any]
    answer: dict[str, Any]


@dataclass(frozen=True)
class Refusal:
    """An expected EngramError code (a host operation's: an AdminRefusal code)."""

    code: str


@dataclass(frozen=True)
class Usage:
    """An expected AdminUsageError (a host operation the operator got wrong)."""

    why: str


@dataclass
class ContractModel:
    candidates: dict[str, Candidate] = field(default_factory=dict)
    records: dict[str, Rec] = field(default_factory=dict)
    ledger: dict[LedgerKey, Bound] = field(default_factory=dict)
    tombstoned: dict[Scope, set[str]] = field(default_factory=dict)  # forgotten payloads (by text)
    high: dict[Scope, int] = field(default_factory=dict)  # each scope's journal head, as answers said

    # -- what an operation must do (before it runs) ---------------------------------------

    def bound(self, lk: LedgerKey, tool: str, args: dict[str, Any]) -> Bound | Refusal | None:
        """The ledger's say: the first answer (replay), DIGEST_CONFLICT, or None (a fresh call)."""
        entry = self.ledger.get(lk)
        if entry is None:
            return None
        if entry.tool != tool or canonical_bytes(entry.args) != canonical_bytes(args):
            return Refusal("DIGEST_CONFLICT")
        return entry

    def admission(self, scope: Scope, cid: str) -> str | Refusal:
        """'accept' | 'reject' | 'adjudicate' | 'duplicate' | a refusal."""
        cand = self.candidates.get(cid)
        if cand is None or cand.scope != scope or cand.state == "withdrawn":
            return Refusal("NOT_FOUND")
        if cand.state in ("accepted", "rejected"):
            return "duplicate"
        if cand.secret:
            return "reject"
        if cand.text in self.tombstoned.get(scope, set()):
            return "adjudicate"
        return "accept"

    def withdrawal(self, scope: Scope, cid: str) -> str | Refusal:
        cand = self.candidates.get(cid)
        if cand is None or cand.scope != scope:
            return Refusal("NOT_FOUND")
        if cand.state == "withdrawn":
            return Refusal("ALREADY_TERMINAL")
        if cand.state in ("accepted", "rejected"):
            return Refusal("ILLEGAL_TRANSITION")
        return "withdraw"

    def forgetting(self, scope: Scope, rid: str) -> str | Refusal:
        rec = self.records.get(rid)
        if rec is None or rec.scope != scope:
            return Refusal("NOT_FOUND")
        if rec.state == TOMBSTONED:
            return Refusal("ALREADY_TERMINAL")
        return "forget"

    # -- host operations: a Usage (the operator's mistake), a Refusal, or the moves they make ----

    def host_single(self, rid: str, allowed: tuple[str, ...]) -> Usage | Refusal | None:
        rec = self.records.get(rid)
        if rec is None:
            return Usage("unknown record")
        return None if rec.state in allowed else Refusal("ILLEGAL_TRANSITION")

    def superseding(self, old: str, new: str) -> Usage | Refusal | None:
        if old not in self.records or new not in self.records:
            return Usage("unknown record")
        if old == new or self.records[old].scope != self.records[new].scope:
            return Usage("itself or another scope")
        if self.records[old].state not in (CURRENT, DISPUTED) or self.records[new].state != CURRENT:
            return Refusal("ILLEGAL_TRANSITION")
        return None

    def revoking(self, scope: Scope, principal: str | None) -> list[str] | Refusal:
        """The current records of the scope captured by ``principal`` (None: citing the one source
        every capture cites), sorted; NOTHING_MATCHES when there is none."""
        ids = sorted(rid for rid, r in self.records.items() if r.scope == scope and r.current
                     and principal in (None, r.principal))
        return ids or Refusal("NOTHING_MATCHES")

    def rewinding(self, rid: str, to_cursor: int) -> Usage | Refusal | str | None:
        """None (no record to close) or the record to close, when the rewind is legal."""
        rec = self.records.get(rid)
        if rec is None:
            return Usage("unknown record")
        if to_cursor >= self.high.get(rec.scope, 0):
            return Usage("a cursor not before the head")
        then = [state for cursor, state, _ in rec.history if cursor <= to_cursor]
        if not then or then[-1] != CURRENT or rec.state != HISTORICAL:
            return Refusal("ILLEGAL_TRANSITION")
        later = [by for cursor, _, by in rec.history if cursor > to_cursor and by is not None]
        if later and self.records[later[-1]].state in (CURRENT, DISPUTED):
            return later[-1]
        return None

    def saw(self, scope: Scope, cursor: int) -> None:
        self.high[scope] = max(self.high.get(scope, 0), cursor)

    def visible(self, scope: Scope, rid: str) -> Rec | None:
        rec = self.records.get(rid)
        return rec if rec is not None and rec.scope == scope and rec.current else None

    def matching(self, scope: Scope, word: str) -> dict[str, str]:
        """The current records of ``scope`` whose text holds ``word``: record_id -> text."""
        return {rid: r.text for rid, r in self.records.items()
                if r.scope == scope and r.current and word in r.text.split()}

    def current(self, scope: Scope) -> set[str]:
        return {rid for rid, r in self.records.items() if r.scope == scope and r.current}

    # -- what an operation did (after it ran) ----------------------------------------------

    def bind(self, lk: LedgerKey, tool: str, args: dict[str, Any], answer: dict[str, Any]) -> None:
        assert lk not in self.ledger, f"model bug: {lk} bound twice"
        self.ledger[lk] = Bound(tool, args, answer)


# ---- checks -----------------------------------------------------------------------------------


def replay_of(tool: str, first: dict[str, Any]) -> dict[str, Any]:
    """What a replay of ``first`` must answer (the first answer, marked as a replay)."""
    if tool == "capture":
        return {**first, "status": "duplicate_exact"}
    return {**first, "replayed": True}


def check_same(actual: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    """Byte-for-byte equality of two answers in their canonical (RFC 8785) form."""
    a, e = canonical_bytes(actual), canonical_bytes(expected)
    assert a == e, f"{what}: answer differs\n  expected {e.decode()}\n  actual   {a.decode()}"


def check_refusal(code: str | None, expected: Refusal, what: str) -> None:
    assert code == expected.code, f"{what}: expected {expected.code}, got {code or 'success'}"


def check_search(found: dict[str, str], expected: dict[str, str], what: str) -> None:
    """The search answered exactly the model's records (ids and their texts)."""
    extra = sorted(set(found) - set(expected))
    missing = sorted(set(expected) - set(found))
    assert not extra and not missing, f"{what}: extra {extra}, missing {missing}"
    for rid, text in expected.items():
        assert found[rid] == text, f"{what}: {rid} text {found[rid]!r} != {text!r}"
