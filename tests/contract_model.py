"""A plain-Python model of the engine's contract, for the stateful test (tests/test_state_machine.py).

Nothing here touches the engine: the model says what an operation must answer, given what the
model knows, and the ``check_*`` helpers compare a real answer with that expectation (raising
``AssertionError`` on any divergence). The rules modelled are those of models/states.py and
store/lifecycle.py:

* scope = (tenant, workspace); candidates and records belong to a scope, idempotency keys to a
  (scope, principal) pair; a foreign or unknown id is NOT_FOUND, the same answer either way;
* candidate: pending -> accepted (a current record) | rejected (secret-like content) | withdrawn;
  withdraw of withdrawn is ALREADY_TERMINAL, of accepted/rejected ILLEGAL_TRANSITION;
  request_admission of withdrawn is NOT_FOUND, of accepted/rejected the first decision marked
  ``duplicate_exact`` (not a ledger entry); of a pending candidate whose payload equals a
  forgotten record of the scope ``pending_adjudication`` (a ledger entry like any answer; the candidate stays pending);
* record: current -> forgotten (tombstoned); forget of a forgotten record is ALREADY_TERMINAL;
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


@dataclass
class Rec:
    scope: Scope
    text: str
    current: bool = True


@dataclass
class Bound:
    """A ledger entry: the first committed answer under a key."""

    tool: str
    args: dict[str, Any]
    answer: dict[str, Any]


@dataclass(frozen=True)
class Refusal:
    """An expected EngramError code."""

    code: str


@dataclass
class ContractModel:
    candidates: dict[str, Candidate] = field(default_factory=dict)
    records: dict[str, Rec] = field(default_factory=dict)
    ledger: dict[LedgerKey, Bound] = field(default_factory=dict)
    tombstoned: dict[Scope, set[str]] = field(default_factory=dict)  # forgotten payloads (by text)

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
        if not rec.current:
            return Refusal("ALREADY_TERMINAL")
        return "forget"

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
