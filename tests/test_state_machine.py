"""The whole contract as a Hypothesis state machine, over the REAL engine in process.

Random sequences of capture (sometimes of secret-like text the admission policy rejects),
request_admission, withdraw, forget, search, get, replays of earlier mutations under their key,
and reuse of a key with other arguments run against ``Engine.open`` on a fresh data directory
(2 tenants x 2 workspaces x 2 principals, lexical channel only, a fixed clock that a rule moves
forward). Every answer is compared with the plain-Python model in tests/contract_model.py:

* lifecycle answers and refusals (NOT_FOUND / ALREADY_TERMINAL / ILLEGAL_TRANSITION) follow
  models/states.py; request_admission of a decided candidate is its first decision marked
  ``duplicate_exact``; of a pending one whose content was forgotten, ``pending_adjudication``;
* an idempotent replay answers the first answer byte for byte (canonical JSON), marked as a
  replay; the same key with other arguments (or another tool) is DIGEST_CONFLICT; the same key
  under another principal or scope is a fresh call;
* search and get never return another scope's record nor a forgotten one; get of a foreign,
  forgotten or unknown id is the same NOT_FOUND; a search for a word finds exactly the model's
  current records of the scope holding it (all pages, with their texts);
* host operations (store/host/hostops.py: dispute, resolve, supersede, revoke trust, rewind) move
  records as the model's state machine says, or are refused (ILLEGAL_TRANSITION, NOTHING_MATCHES,
  the operator's mistakes) without a journal event; forget then starts from every state they
  reach, its receipt naming it;
* after every step the scope's current records, every record's state and the candidate count
  match the model.

CI runs a few examples. The long run (300 sequences of up to 30 steps, about 3 minutes)::

    ENGRAM_STATE_MACHINE_EXAMPLES=300 python -m pytest -q -s -p no:cacheprovider tests/test_state_machine.py

(``ENGRAM_STATE_MACHINE_STEPS`` sets the steps per sequence; ``-s`` shows the step count.)

The same machine runs on PostgreSQL (parametrised, issue 22): each example gets a fresh
database initialised as ``admin init-store`` does, and two engines (two nodes, each with its
own data dir and projections) on it take the calls in turn, so a capture and its admission,
a forget and the search after it, and the pages of one search reach different nodes; the
model is the same. CI runs a few examples (ENGRAM_TEST_PG_URL, or a throwaway cluster); the
long run::

    ENGRAM_STATE_MACHINE_PG_EXAMPLES=300 \
        python -m pytest -q -s -p no:cacheprovider tests/test_state_machine.py -k postgres
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from engram_memory.models.context import HostContext
from engram_memory.models.digests import candidate_id as derive_candidate_id
from engram_memory.models.digests import record_id_from_digest
from engram_memory.models.errors import EngramError
from engram_memory.models.limits import LIMIT_MAX, PACKET_BYTES_MAX
from engram_memory.models.outputs import validate_output
from engram_memory.models.settings import EngineSettings
from engram_memory.retrieval.lexical import query_terms
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.refusals import AdminRefusal, AdminUsageError
from engram_memory.store.host.hostops import dispute_with, resolve_with, revoke_trust_with, rewind_with, supersede_with
from engram_memory.store.postgres.backend import init_store
from engram_memory.store.postgres.databases import create_database, drop_database
from engram_memory.store.screen.policy import _texts, contains_secret
from tests.contract_model import (
    CURRENT,
    DISPUTED,
    HISTORICAL,
    TOMBSTONED,
    TRUST_INVALID,
    Candidate,
    ContractModel,
    Rec,
    Refusal,
    Scope,
    Usage,
    check_refusal,
    check_same,
    check_search,
    replay_of,
)
from tests.store_fixtures import PURPOSE, T0, admission_args, call, capture_args, forget_args, withdraw_args

EXAMPLES = int(os.environ.get("ENGRAM_STATE_MACHINE_EXAMPLES", "15"))
# On PostgreSQL each example creates a database and opens two engines: fewer in CI.
PG_EXAMPLES = int(os.environ.get("ENGRAM_STATE_MACHINE_PG_EXAMPLES", "10"))
STEPS = int(os.environ.get("ENGRAM_STATE_MACHINE_STEPS", "30"))

TENANTS = ("t1", "t2")
WORKSPACES = ("w1", "w2")
PRINCIPALS = ("p1", "p2")
SCOPES: tuple[Scope, ...] = tuple((t, w) for t in TENANTS for w in WORKSPACES)
# Few words, so texts repeat (forgotten content comes back) and searches find several records.
# Distinct stems, none of them in the fixed fields (citation source "doc:adr-7").
VOCAB = ("amber", "basalt", "cobalt", "dune", "fjord")
ABSENT_WORD = "quartz"  # never captured: a search for it finds nothing
SECRETS = (
    "ghp_Zx9Qw2Er4Ty6Ui8Op0As1Df3Gh5Jk7Lz9Xc2V",
    "AKIAQ7XG2MZK4PLR9WTB",
    "postgres://admin:Sup3rS3cret@db.internal:5432/app",
)
MUTATIONS = ("capture", "request_admission", "withdraw", "forget")
REASON = "the operator checked it"
SOURCE = "doc:adr-7"  # the source every capture cites (tests/store_fixtures.py)

STATS: Counter[str] = Counter()  # rules run, by name, over every example of the session


def secret_kind(payload: Any, evidence: Any) -> str | None:
    """The default policy's verdict on a capture's strings (None: nothing secret-like)."""
    return "secret" if contains_secret(_texts(payload, evidence)) else None


def host(scope: Scope, principal: str) -> HostContext:
    return HostContext(tenant=scope[0], workspace=scope[1], principal=principal, agent_id="agent-1",
                       purpose_ref=PURPOSE)


def attempt(engine: Engine, tool: str, c: HostContext, args: dict[str, Any]
            ) -> tuple[dict[str, Any] | None, EngramError | None]:
    try:
        return call(engine, tool, c, args), None
    except EngramError as exc:
        return None, exc


def outcome_name(value: dict[str, Any] | None, err: EngramError | None) -> str:
    """How a mutation ended, for the statistics: an error code, a status, or ok / replayed."""
    if err is not None or value is None:
        return err.code if err is not None else "?"
    if "outcome" in value:
        return value["outcome"]["status"] + ("/replayed" if value["replayed"] else "")
    if "status" in value:
        return value["status"]
    return "replayed" if value["replayed"] else "ok"


# Mostly one word, so the same content comes back in a scope (after it was forgotten, too).
texts = st.one_of(st.sampled_from(VOCAB), st.lists(st.sampled_from(VOCAB), min_size=2, max_size=3).map(" ".join))
scopes = st.sampled_from(SCOPES)
principals = st.sampled_from(PRINCIPALS)
# Mostly act in the target's own scope; sometimes in a random (often foreign) one.
foreign = st.integers(0, 3).map(lambda i: i == 0)
picks = st.integers(0, 2**16)
fake_candidates = st.integers(0, 2**32).map(lambda n: "candidate_" + f"{n:064x}")
# Well-formed ids no record has: "mem_" and 52 base32 letters (hex digits 0, 1, 8, 9 mapped to letters).
_LETTERS = str.maketrans("0189", "abcd")
fake_records = st.integers(0, 2**32).map(lambda n: "mem_" + "a" * 44 + f"{n:08x}".translate(_LETTERS))


class Fresh(NamedTuple):
    """A mutation the ledger did not decide: its answer (or refusal), to check against the model."""

    ctx: HostContext
    lk: tuple[str, str, str, str]
    value: dict[str, Any] | None
    err: EngramError | None
    what: str


class ContractMachine(RuleBasedStateMachine):
    model_class = ContractModel
    # None: one engine on DuckDB. A PostgreSQL admin URL: every example gets a fresh database
    # (admin init-store's init_store) and ``nodes`` engines on it, each with its own data dir.
    store_url: str | None = None
    nodes = 1

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="engram-sm-")
        self.now = T0
        self.database: str | None = None
        root = Path(self.tmp.name)
        if self.store_url is None:
            configs = [EngineSettings(data_dir=root / "data", semantic=False)]
        else:
            self.database = create_database(self.store_url, "engram_sm")
            key = root / "master.key"
            key.write_bytes(secrets.token_bytes(32))
            init_store(self.database, key.read_bytes())
            configs = [EngineSettings(data_dir=root / f"node-{k}", semantic=False, store=self.database,
                                      master_key_file=key) for k in range(self.nodes)]
        self.engines: list[Engine] = []
        for config in configs:
            self.engines.append(Engine.open(config, clock=lambda: self.now))
        self.turn = 0
        self.model = self.model_class()
        self.serial = 0
        self.dirty: set[Scope] = set()  # scopes mutated since the last store check
        self.calls: list[tuple[str, Scope, str, dict[str, Any]]] = []  # every mutation call made

    @property
    def engine(self) -> Engine:
        """The engine that takes the next call: the nodes in turn, so a capture and its admission,
        a mutation and the read after it, and the pages of one search reach different nodes."""
        engine = self.engines[self.turn % len(self.engines)]
        self.turn += 1
        return engine

    def teardown(self) -> None:
        try:
            self.store_matches_model()
        finally:
            for engine in self.engines:
                engine.close()
            self.tmp.cleanup()
            if self.database is not None:
                assert self.store_url is not None
                drop_database(self.store_url, self.database)

    def key(self, label: str) -> str:
        self.serial += 1
        return f"{label}-key-{self.serial:012d}"

    def count(self, name: str) -> None:
        STATS[name] += 1
        STATS["steps"] += 1

    # -- the mutations, each checked against the model -------------------------------------

    def mutate(self, scope: Scope, principal: str, tool: str, args: dict[str, Any]) -> Fresh | None:
        """Run one mutation and check the ledger's part (a replay or a conflict: None returned);
        a call the ledger does not decide comes back for the tool's own checks."""
        c = host(scope, principal)
        lk = (scope[0], scope[1], principal, args["idempotency_key"])
        bound = self.model.bound(lk, tool, args)
        value, err = attempt(self.engine, tool, c, args)
        what = f"{tool} by {principal} in {scope}"
        STATS[f"{tool}->{outcome_name(value, err)}"] += 1
        if isinstance(bound, Refusal):
            check_refusal(err.code if err else None, bound, what + " (key reused, other intent)")
            return None
        if bound is not None:
            assert err is None, f"{what}: replay refused with {err.code}"
            assert value is not None
            check_same(value, replay_of(tool, bound.answer), what + " (replay)")
            return None
        return Fresh(c, lk, value, err, what)

    def do_capture(self, scope: Scope, principal: str, args: dict[str, Any]) -> tuple[str, Scope] | None:
        fresh = self.mutate(scope, principal, "capture", args)
        if fresh is None:
            return None
        c, lk, value, err, what = fresh
        tool = "capture"
        assert err is None, f"{what}: refused with {err.code}"
        assert value is not None
        validate_output("capture", value)
        key = args["idempotency_key"]
        assert value["status"] == "committed_pending", what
        cid = value["candidate_id"]
        assert cid == derive_candidate_id(c.source_ref, "0", key), f"{what}: candidate id not derived from key"
        assert cid not in self.model.candidates, f"{what}: candidate id {cid} reused"
        text = args["payload"]["components"][0]["text"]
        secret = secret_kind(args["payload"], args["evidence"]) is not None
        self.model.candidates[cid] = Candidate(scope, text, secret=secret, principal=principal)
        self.model.saw(scope, int(value["cursor"]))
        self.model.bind(lk, tool, args, value)
        return cid, scope

    def do_admission(self, scope: Scope, principal: str, args: dict[str, Any]) -> tuple[str, Scope] | None:
        fresh = self.mutate(scope, principal, "request_admission", args)
        if fresh is None:
            return None
        c, lk, value, err, what = fresh
        tool = "request_admission"
        cid = args["candidate_id"]
        expect = self.model.admission(scope, cid)
        if isinstance(expect, Refusal):
            check_refusal(err.code if err else None, expect, what)
            return None
        assert err is None, f"{what}: expected {expect}, refused with {err.code}"
        assert value is not None
        validate_output("request_admission", value)
        cand = self.model.candidates[cid]
        outcome = value["outcome"]
        assert value["replayed"] is False, what
        if expect == "duplicate":
            assert cand.outcome is not None
            check_same(value, {"outcome": {**cand.outcome, "status": "duplicate_exact"}, "replayed": False},
                       what + " (decided earlier)")
            return None
        if expect == "adjudicate":
            assert outcome["status"] == "pending_adjudication" and "record_id" not in outcome, f"{what}: {outcome}"
            assert outcome["candidate_id"] == cid
            self.model.bind(lk, tool, args, value)  # bound to its key; the candidate stays pending
            return None
        cand.outcome = outcome
        self.model.saw(scope, int(outcome["cursor"]))
        self.model.bind(lk, tool, args, value)
        if expect == "reject":
            assert outcome["status"] == "rejected" and "record_id" not in outcome, f"{what}: {outcome}"
            cand.state = "rejected"
            return None
        assert outcome["status"] == "accepted", f"{what}: {outcome}"
        rid = outcome["record_id"]
        captured = self._capture_answer(cid)
        assert rid == record_id_from_digest(captured["record_digest"]), f"{what}: record id not the predicted one"
        assert rid not in self.model.records, f"{what}: record id {rid} reused"
        cand.state, cand.record_id = "accepted", rid
        self.model.records[rid] = Rec(scope, cand.text, principal=cand.principal,
                                      history=[(int(outcome["cursor"]), CURRENT, None)])
        return rid, scope

    def do_withdraw(self, scope: Scope, principal: str, args: dict[str, Any]) -> None:
        fresh = self.mutate(scope, principal, "withdraw", args)
        if fresh is None:
            return
        c, lk, value, err, what = fresh
        tool = "withdraw"
        expect = self.model.withdrawal(scope, args["candidate_id"])
        if isinstance(expect, Refusal):
            check_refusal(err.code if err else None, expect, what)
            return
        assert err is None, f"{what}: refused with {err.code}"
        assert value is not None
        validate_output("withdraw", value)
        receipt = value["receipt"]
        assert (receipt["operation"], receipt["from_state"], receipt["to_state"]) == (
            "withdraw", "pending", "withdrawn")
        assert value["replayed"] is False and value["key_destruction"] == "complete", what
        self.model.candidates[args["candidate_id"]].state = "withdrawn"
        self.model.saw(scope, int(receipt["cursor"]))
        self.model.bind(lk, tool, args, value)

    def do_forget(self, scope: Scope, principal: str, args: dict[str, Any]) -> None:
        fresh = self.mutate(scope, principal, "forget", args)
        if fresh is None:
            return
        c, lk, value, err, what = fresh
        tool = "forget"
        rid = args["record_id"]
        expect = self.model.forgetting(scope, rid)
        if isinstance(expect, Refusal):
            check_refusal(err.code if err else None, expect, what)
            return
        assert err is None, f"{what}: refused with {err.code}"
        assert value is not None
        validate_output("forget", value)
        receipt = value["receipt"]
        rec = self.model.records[rid]
        assert (receipt["operation"], receipt["from_state"], receipt["to_state"]) == (
            "tombstone", rec.state, "tombstoned"), what
        assert value["replayed"] is False and value["projection_invalidation"] == "complete", what
        STATS[f"forget_from_{rec.state}"] += 1
        rec.moved(int(receipt["cursor"]), TOMBSTONED)
        self.model.saw(scope, int(receipt["cursor"]))
        self.model.tombstoned.setdefault(scope, set()).add(rec.text)
        self.model.bind(lk, tool, args, value)

    def _capture_answer(self, cid: str) -> dict[str, Any]:
        for bound in self.model.ledger.values():
            if bound.tool == "capture" and bound.answer["candidate_id"] == cid:
                return bound.answer
        raise AssertionError(f"model bug: no capture answer for {cid}")

    @staticmethod
    def lk(made: tuple[str, Scope, str, dict[str, Any]]) -> tuple[str, str, str, str]:
        _tool, scope, principal, args = made
        return (scope[0], scope[1], principal, args["idempotency_key"])

    def run_mutation(self, scope: Scope, principal: str, tool: str, args: dict[str, Any]) -> Any:
        self.calls.append((tool, scope, principal, args))
        self.dirty.add(scope)
        return {
            "capture": self.do_capture,
            "request_admission": self.do_admission,
            "withdraw": self.do_withdraw,
            "forget": self.do_forget,
        }[tool](scope, principal, args)

    # -- rules -----------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.count("initialize")

    # Targets are picked among everything the model knows (pick modulo the count, in creation
    # order): any candidate or record, whatever its state, in its own scope or another one.

    def candidate(self, pick: int) -> tuple[str, Scope]:
        cids = list(self.model.candidates)
        cid = cids[pick % len(cids)]
        return cid, self.model.candidates[cid].scope

    def record(self, pick: int) -> tuple[str, Scope]:
        rids = list(self.model.records)
        rid = rids[pick % len(rids)]
        return rid, self.model.records[rid].scope

    @rule(scope=scopes, principal=principals, text=texts,
          secret=st.integers(0, 4).map(lambda i: SECRETS[i] if i < len(SECRETS) else None))
    def capture(self, scope: Scope, principal: str, text: str, secret: str | None) -> None:
        self.count("capture")
        if secret is not None:
            text = f"{text} {secret}"
        self.run_mutation(scope, principal, "capture", capture_args(text, self.key("capture")))

    @precondition(lambda self: self.model.candidates)
    @rule(pick=picks, principal=principals, foreign=foreign, elsewhere=scopes,
          unknown=st.one_of(st.none(), st.none(), st.none(), fake_candidates))
    def request_admission(self, pick: int, principal: str, foreign: bool, elsewhere: Scope,
                          unknown: str | None) -> None:
        self.count("request_admission")
        cid, own = self.candidate(pick)
        scope = elsewhere if foreign else own
        self.run_mutation(scope, principal, "request_admission", admission_args(unknown or cid, self.key("admit")))

    @rule(scope=scopes, principal=principals, text=texts)
    def capture_and_admit(self, scope: Scope, principal: str, text: str) -> None:
        """The common path in one step, so sequences reach records (and their forgetting) sooner."""
        self.count("capture_and_admit")
        made = self.run_mutation(scope, principal, "capture", capture_args(text, self.key("capture")))
        assert made is not None
        self.run_mutation(scope, principal, "request_admission", admission_args(made[0], self.key("admit")))

    @precondition(lambda self: any(r.state == TOMBSTONED for r in self.model.records.values()))
    @rule(pick=picks, principal=principals)
    def capture_forgotten_again(self, pick: int, principal: str) -> None:
        """Capture the content of a forgotten record again, in its scope, and ask for admission:
        pending_adjudication, never a silent re-admission."""
        self.count("capture_forgotten_again")
        gone = [r for r in self.model.records.values() if r.state == TOMBSTONED]
        rec = gone[pick % len(gone)]
        made = self.run_mutation(rec.scope, principal, "capture", capture_args(rec.text, self.key("capture")))
        assert made is not None
        self.run_mutation(rec.scope, principal, "request_admission", admission_args(made[0], self.key("admit")))

    @precondition(lambda self: self.model.candidates)
    @rule(pick=picks, principal=principals, foreign=foreign, elsewhere=scopes,
          unknown=st.one_of(st.none(), st.none(), st.none(), fake_candidates))
    def withdraw(self, pick: int, principal: str, foreign: bool, elsewhere: Scope, unknown: str | None) -> None:
        self.count("withdraw")
        cid, own = self.candidate(pick)
        scope = elsewhere if foreign else own
        self.run_mutation(scope, principal, "withdraw", withdraw_args(unknown or cid, self.key("withdraw")))

    @precondition(lambda self: self.model.records)
    @rule(pick=picks, principal=principals, foreign=foreign, elsewhere=scopes)
    def forget(self, pick: int, principal: str, foreign: bool, elsewhere: Scope) -> None:
        self.count("forget")
        rid, own = self.record(pick)
        scope = elsewhere if foreign else own
        args = forget_args(rid, self.key("forget"))
        self.run_mutation(scope, principal, "forget", args)

    @precondition(lambda self: self.calls)
    @rule(pick=st.integers(0, 2**16), committed=st.integers(0, 3).map(lambda i: i > 0))
    def replay(self, pick: int, committed: bool) -> None:
        """An earlier call again (the pick-th, modulo; mostly among those that committed), same key
        and arguments: the first committed answer, or (nothing was committed under the key) the
        call evaluated afresh."""
        self.count("replay")
        calls = [c for c in self.calls if self.lk(c) in self.model.ledger] if committed else []
        calls = calls or self.calls
        tool, scope, principal, args = calls[pick % len(calls)]
        lk = (scope[0], scope[1], principal, args["idempotency_key"])
        STATS["replay_of_bound" if lk in self.model.ledger else "replay_of_unbound"] += 1
        self.run_mutation(scope, principal, tool, args)

    @precondition(lambda self: self.calls)
    @rule(pick=st.integers(0, 2**16), tool=st.sampled_from(MUTATIONS), text=texts, principal=principals,
          same_principal=st.integers(0, 3).map(lambda i: i > 0))
    def reuse_key(self, pick: int, tool: str, text: str, principal: str, same_principal: bool) -> None:
        """The key of an earlier call with other arguments or another tool (DIGEST_CONFLICT when
        that key is bound for this principal and scope; a fresh call otherwise)."""
        self.count("reuse_key")
        calls = [c for c in self.calls if self.lk(c) in self.model.ledger] or self.calls
        _old_tool, scope, old_principal, old_args = calls[pick % len(calls)]
        key = old_args["idempotency_key"]
        who = old_principal if same_principal else principal
        args = {
            "capture": lambda: capture_args(f"{text} reused", key),
            "request_admission": lambda: admission_args("candidate_" + "f" * 64, key),
            "withdraw": lambda: {**withdraw_args("candidate_" + "e" * 64, key), "reason_ref": "reason:other"},
            "forget": lambda: {**forget_args("mem_" + "z" * 52, key), "reason_ref": "reason:other"},
        }[tool]()
        lk = (scope[0], scope[1], who, key)
        if lk in self.model.ledger:
            STATS["reuse_key_conflict"] += 1
        self.run_mutation(scope, who, tool, args)

    @rule(scope=scopes, principal=principals, word=st.sampled_from((*VOCAB, ABSENT_WORD)))
    def search(self, scope: Scope, principal: str, word: str) -> None:
        self.count("search")
        c = host(scope, principal)
        expected = self.model.matching(scope, word)
        found: dict[str, str] = {}
        args: dict[str, Any] = {"query": word, "purpose_ref": PURPOSE, "limit": LIMIT_MAX,
                                "max_packet_bytes": PACKET_BYTES_MAX}
        pages = 0
        while True:
            value, err = attempt(self.engine, "search", c, args)
            assert err is None, f"search {word!r} in {scope}: refused with {err.code}"
            assert value is not None
            validate_output("search", value)
            pages += 1
            assert value["rank_receipt"]["candidate_count"] == len(expected), (
                f"search {word!r} in {scope}: candidate_count {value['rank_receipt']['candidate_count']}"
                f" != {len(expected)}")
            for packet in value["records"]:
                rid = packet["record"]["record_id"]
                assert rid not in found, f"search {word!r}: {rid} twice"
                rec = self.model.records.get(rid)
                assert rec is not None, f"search {word!r} in {scope}: unknown record {rid}"
                assert rec.scope == scope, f"search {word!r} in {scope}: record {rid} of {rec.scope}"
                assert rec.current, f"search {word!r} in {scope}: forgotten record {rid}"
                found[rid] = " ".join(comp["text"] for comp in packet["record"]["components"])
            if "next_page_cursor" not in value:
                break
            args = {**args, "page_cursor": value["next_page_cursor"]}
            assert pages < 50, "search paging does not end"
        check_search(found, expected, f"search {word!r} in {scope}")

    @precondition(lambda self: self.model.records)
    @rule(pick=picks, principal=principals, foreign=foreign, elsewhere=scopes, unknown=fake_records)
    def get(self, pick: int, principal: str, foreign: bool, elsewhere: Scope, unknown: str) -> None:
        self.count("get")
        rid, own = self.record(pick)
        scope = elsewhere if foreign else own
        c = host(scope, principal)
        value, err = attempt(self.engine, "get", c, {"record_id": rid, "purpose_ref": PURPOSE})
        visible = self.model.visible(scope, rid)
        what = f"get {rid} in {scope}"
        if visible is None:
            assert err is not None, f"{what}: returned a record the model says is foreign or forgotten"
            # Foreign, forgotten and unknown ids answer the very same refusal.
            _, baseline = attempt(self.engine, "get", c, {"record_id": unknown, "purpose_ref": PURPOSE})
            assert baseline is not None and baseline.code == "NOT_FOUND"
            assert (err.code, err.message, str(err)) == (baseline.code, baseline.message, str(baseline)), what
            STATS["get_not_found"] += 1
            return
        assert err is None, f"{what}: refused with {err.code}"
        assert value is not None
        validate_output("get", value)
        assert value["record"]["record_id"] == rid and value["read_receipt"]["record_id"] == rid, what
        text = " ".join(comp["text"] for comp in value["record"]["components"])
        assert text == visible.text, f"{what}: text {text!r} != {visible.text!r}"
        STATS["get_found"] += 1

    # -- host operations (never an agent's tool), on the engine whose turn it is -----------------

    def host_op(self, what: str, scope: Scope | None, expect: Any, run: Any) -> dict[str, Any] | None:
        """Run a host operation; a refusal or mistake must be the model's and journal nothing."""
        scope_ref = host(scope, PRINCIPALS[0]).scope_ref if scope is not None else None
        engine = self.engine
        head = engine.db.high_water(scope_ref) if scope_ref else None
        name = what.split()[0]
        try:
            result: dict[str, Any] = run(engine)
        except AdminUsageError as exc:
            STATS[f"host_{name}->usage"] += 1
            assert isinstance(expect, Usage), f"{what}: expected {expect}, got a usage error: {exc}"
        except AdminRefusal as exc:
            STATS[f"host_{name}->{exc.code}"] += 1
            assert isinstance(expect, Refusal), f"{what}: expected {expect}, refused with {exc.code}"
            check_refusal(exc.code, expect, what)
        else:
            STATS[f"host_{name}->ok"] += 1
            assert not isinstance(expect, Usage | Refusal), f"{what}: expected {expect}, it succeeded"
            assert scope is not None and result["scope_ref"] == scope_ref, what
            assert result["receipt"]["cursor"] == str(result["cursor"]) == str(head + 1 if head is not None else 0)
            self.model.saw(scope, int(result["cursor"]))
            self.dirty.add(scope)
            return result
        if scope_ref is not None:
            assert engine.db.high_water(scope_ref) == head, f"{what}: a refused operation journalled"
        return None

    def host_target(self, pick: int, unknown: str | None) -> tuple[str, Scope | None]:
        if unknown is not None:
            return unknown, None
        return self.record(pick)

    @precondition(lambda self: self.model.records)
    @rule(pick=picks, unknown=st.one_of(st.none(), st.none(), st.none(), fake_records))
    def host_dispute(self, pick: int, unknown: str | None) -> None:
        self.count("host_dispute")
        rid, scope = self.host_target(pick, unknown)
        expect = self.model.host_single(rid, (CURRENT,))
        result = self.host_op(f"dispute {rid}", scope, expect, lambda e: dispute_with(e, rid, REASON, self.now))
        if result is not None:
            assert (result["from_state"], result["to_state"], result["record_ids"]) == (CURRENT, DISPUTED, [rid])
            self.model.records[rid].moved(result["cursor"], DISPUTED)

    @precondition(lambda self: self.model.records)
    @rule(pick=picks, current=st.booleans(), unknown=st.one_of(st.none(), st.none(), st.none(), fake_records))
    def host_resolve(self, pick: int, current: bool, unknown: str | None) -> None:
        self.count("host_resolve")
        rid, scope = self.host_target(pick, unknown)
        expect = self.model.host_single(rid, (DISPUTED,))
        result = self.host_op(f"resolve {rid}", scope, expect,
                              lambda e: resolve_with(e, rid, current, REASON, self.now))
        if result is not None:
            to = CURRENT if current else HISTORICAL
            assert (result["from_state"], result["to_state"]) == (DISPUTED, to), result
            self.model.records[rid].moved(result["cursor"], to)

    @precondition(lambda self: self.model.records)
    @rule(old_pick=picks, new_pick=picks, same_scope=foreign.map(lambda f: not f))
    def host_supersede(self, old_pick: int, new_pick: int, same_scope: bool) -> None:
        """Mostly by another record of the same scope; sometimes by any record (another scope's, itself)."""
        self.count("host_supersede")
        old, scope = self.record(old_pick)
        others = [rid for rid, r in self.model.records.items() if r.scope == scope and rid != old]
        pool = others if same_scope and others else list(self.model.records)
        new = pool[new_pick % len(pool)]
        expect = self.model.superseding(old, new)
        result = self.host_op(f"supersede {old} by {new}", scope, expect,
                              lambda e: supersede_with(e, old, new, REASON, self.now))
        if result is not None:
            assert (result["from_state"], result["to_state"], result["related_record_id"]) == (
                self.model.records[old].state, HISTORICAL, new), result
            self.model.records[old].moved(result["cursor"], HISTORICAL, superseded_by=new)

    @rule(scope=scopes, principal=principals, texts=st.tuples(texts, texts), rewind=st.booleans())
    def supersede_and_rewind(self, scope: Scope, principal: str, texts: tuple[str, str], rewind: bool) -> None:
        """Two new records of a scope, the first superseded by the second, then perhaps rewound to
        its acceptance: the host's common path in one step (random picks reach it rarely)."""
        self.count("supersede_and_rewind")
        made = []
        for text in texts:
            cap = self.run_mutation(scope, principal, "capture", capture_args(text, self.key("capture")))
            assert cap is not None
            made.append(self.run_mutation(scope, principal, "request_admission",
                                          admission_args(cap[0], self.key("admit"))))
        if None in made:  # content forgotten before: held for adjudication
            return
        (old, _), (new, _) = made
        self.host_supersede(old_pick=list(self.model.records).index(old),
                            new_pick=[r for r, rec in self.model.records.items()
                                      if rec.scope == scope and r != old].index(new), same_scope=True)
        if rewind:
            accepted = self.model.records[old].history[0][0]
            self.host_rewind(pick=list(self.model.records).index(old), moment=0, back=0, unknown=None,
                             to=accepted)

    @rule(scope=scopes, principal=st.one_of(principals, st.none()))
    def host_revoke_trust(self, scope: Scope, principal: str | None) -> None:
        """Trust revoked for a principal's captures, or (None) for the source every capture cites."""
        self.count("host_revoke_trust")
        scope_ref = host(scope, PRINCIPALS[0]).scope_ref
        expect = self.model.revoking(scope, principal) if scope in self.model.high else Usage("no such scope")
        selector = {"principal": principal} if principal is not None else {"source_ref": SOURCE}
        result = self.host_op(f"revoke-trust {selector} in {scope}", scope, expect,
                              lambda e: revoke_trust_with(e, scope_ref, REASON, self.now, **selector))
        if result is not None:
            assert result["record_ids"] == expect and result["receipt"]["count"] == len(expect), result
            for rid in result["record_ids"]:
                self.model.records[rid].moved(result["cursor"], TRUST_INVALID)

    @precondition(lambda self: self.model.records)
    @rule(pick=picks, moment=picks, back=st.integers(0, 1),
          unknown=st.one_of(st.none(), st.none(), st.none(), fake_records))
    def host_rewind(self, pick: int, moment: int, back: int, unknown: str | None, to: int | None = None) -> None:
        """Back to a cursor the record moved at (or the one before it); mostly a historical record."""
        self.count("host_rewind")
        rid, scope = self.host_target(pick, unknown)
        historical = [r for r, rec in self.model.records.items() if rec.state == HISTORICAL]
        if historical and unknown is None and pick % 4 and to is None:
            rid = historical[pick % len(historical)]
            scope = self.model.records[rid].scope
        rec = self.model.records.get(rid)
        cursors = [c for c, _, _ in rec.history] if rec is not None else [1]
        to_cursor = max(0, cursors[moment % len(cursors)] - back) if to is None else to
        expect = self.model.rewinding(rid, to_cursor)
        result = self.host_op(f"rewind {rid} to {to_cursor}", scope, expect,
                              lambda e: rewind_with(e, rid, to_cursor, REASON, self.now))
        if result is not None:
            assert (result["from_state"], result["to_state"]) == (HISTORICAL, CURRENT), result
            assert result.get("related_record_id") == expect, result
            self.model.records[rid].moved(result["cursor"], CURRENT)
            if isinstance(expect, str):
                self.model.records[expect].moved(result["cursor"], HISTORICAL)

    @rule(ms=st.integers(1, 3_600_000))
    def advance_clock(self, ms: int) -> None:
        self.count("advance_clock")
        self.now += ms

    @invariant()
    def touched_scopes_match_model(self) -> None:
        self.store_matches_model(only_touched=True)

    def store_matches_model(self, only_touched: bool = False) -> None:
        """The store's current records and candidate count of every scope (of those a mutation
        touched since the last check, after each step) are the model's."""
        touched, self.dirty = self.dirty, set()
        for scope in [s for s in SCOPES if s in touched or not only_touched]:
            scope_ref = host(scope, PRINCIPALS[0]).scope_ref
            engine = self.engine
            live = {r["record_id"] for r in engine.live_records(scope_ref)}
            assert live == self.model.current(scope), f"current records of {scope}: {live} != model"
            for rid, rec in self.model.records.items():
                if rec.scope == scope:
                    status = engine.db.record_state(scope_ref, rid)
                    assert status is not None and status.state == rec.state, f"state of {rid}: {status} != {rec.state}"
            expected = sum(1 for cand in self.model.candidates.values() if cand.scope == scope)
            assert self.engine.candidate_count(scope_ref) == expected, f"candidates of {scope}"


def machine_settings(examples: int, steps: int = STEPS, **extra: Any) -> settings:
    return settings(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], **extra)


def test_vocabulary_is_what_the_model_assumes() -> None:
    """The model's premises: each word is its own search term, and the secrets are secrets."""
    stems = [query_terms(w) for w in (*VOCAB, ABSENT_WORD)]
    assert all(len(s) == 1 for s in stems) and len({s[0] for s in stems}) == len(stems)
    for secret in SECRETS:
        args = capture_args(f"amber {secret}")
        assert secret_kind(args["payload"], args["evidence"]) is not None, secret
    args = capture_args("amber basalt")
    assert secret_kind(args["payload"], args["evidence"]) is None


BACKENDS = ("duckdb", "postgres-2-nodes")


def on_backend(machine: type[ContractMachine], backend: str, request: pytest.FixtureRequest
               ) -> type[ContractMachine]:
    """The machine on DuckDB as it is, or on PostgreSQL with two engines (nodes) on one store."""
    if backend == "duckdb":
        return machine
    return type(f"{machine.__name__}OnPostgres", (machine,), {"store_url": request.getfixturevalue("pg_url"),
                                                                "nodes": 2})


@pytest.mark.parametrize("backend", BACKENDS)
def test_contract_state_machine(backend: str, request: pytest.FixtureRequest) -> None:
    STATS.clear()
    examples = EXAMPLES if backend == "duckdb" else PG_EXAMPLES
    run_state_machine_as_test(on_backend(ContractMachine, backend, request), settings=machine_settings(examples))
    print(f"\nstate machine on {backend}: {examples} examples x up to {STEPS} steps;"
          f" {STATS['steps']} rules run: {dict(sorted(STATS.items()))}")
    assert STATS["steps"] > 0


# ---- the test can fail ------------------------------------------------------------------------


class WrongModel(ContractModel):
    """A deliberately wrong model: withdrawing an admitted candidate "is" ALREADY_TERMINAL."""

    def withdrawal(self, scope: Scope, cid: str) -> str | Refusal:
        cand = self.candidates.get(cid)
        if cand is not None and cand.scope == scope and cand.state == "accepted":
            return Refusal("ALREADY_TERMINAL")
        return super().withdrawal(scope, cid)


class WrongMachine(ContractMachine):
    model_class = WrongModel


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_machine_catches_a_divergence(backend: str, request: pytest.FixtureRequest) -> None:
    """The machine's checks fire on the real engine: against a model wrong about one refusal code,
    and against a model that lost track of a record (fixed steps: a Hypothesis search for them
    would cost minutes)."""
    scope = SCOPES[0]
    machine = on_backend(WrongMachine, backend, request)()
    try:
        machine.start()
        machine.capture_and_admit(scope=scope, principal="p1", text="amber basalt")
        (rid,) = machine.model.records
        with pytest.raises(AssertionError, match="expected ALREADY_TERMINAL, got ILLEGAL_TRANSITION"):
            machine.withdraw(pick=0, principal="p2", foreign=False, elsewhere=scope, unknown=None)
        machine.search(scope=scope, principal="p1", word="amber")  # the model is right here
        machine.model.records[rid].current = False  # wrong: the record is still current
        with pytest.raises(AssertionError, match="search .basalt."):
            machine.search(scope=scope, principal="p1", word="basalt")
        with pytest.raises(AssertionError, match="returned a record"):
            machine.get(pick=0, principal="p2", foreign=False, elsewhere=scope, unknown="mem_" + "a" * 52)
        with pytest.raises(AssertionError, match="current records"):
            machine.store_matches_model()
        machine.model.records[rid].current = True  # right again
        machine.model.records[rid].state = "accepted_disputed"  # wrong: it is current, a dispute is legal
        with pytest.raises(AssertionError, match="dispute .*: expected Refusal"):
            machine.host_dispute(pick=0, unknown=None)
        # (the store disputed it: the model is right again, and the end-of-sequence check passes)
    finally:
        machine.teardown()


def test_helpers_refuse_wrong_answers() -> None:
    first = {"status": "committed_pending", "candidate_id": "candidate_" + "0" * 64, "cursor": "1"}
    check_same(replay_of("capture", first), {**first, "status": "duplicate_exact"}, "ok")
    with pytest.raises(AssertionError):
        check_same(replay_of("capture", first), first, "a replay not marked as one")
    with pytest.raises(AssertionError):
        first_admission = {"outcome": {}, "replayed": False}
        check_same(first_admission, replay_of("request_admission", first_admission), "a replay not marked")
    with pytest.raises(AssertionError):
        check_refusal("ILLEGAL_TRANSITION", Refusal("ALREADY_TERMINAL"), "wrong code")
    with pytest.raises(AssertionError):
        check_refusal(None, Refusal("NOT_FOUND"), "success instead of a refusal")
    with pytest.raises(AssertionError):
        check_search({"mem_a": "amber", "mem_b": "amber"}, {"mem_a": "amber"}, "an extra record")
    with pytest.raises(AssertionError):
        check_search({"mem_a": "amber basalt"}, {"mem_a": "amber"}, "another text")
    model = ContractModel()
    s1, s2 = SCOPES[0], SCOPES[1]
    model.candidates["c"] = Candidate(s1, "amber", secret=False, state="accepted", record_id="mem_a")
    model.records["mem_a"] = Rec(s1, "amber")
    assert model.withdrawal(s1, "c") == Refusal("ILLEGAL_TRANSITION")
    assert model.withdrawal(s2, "c") == Refusal("NOT_FOUND")
    assert model.admission(s1, "c") == "duplicate"
    assert model.visible(s2, "mem_a") is None and model.matching(s2, "amber") == {}
    model.records["mem_a"].current = False
    assert model.forgetting(s1, "mem_a") == Refusal("ALREADY_TERMINAL")
    assert model.visible(s1, "mem_a") is None and model.matching(s1, "amber") == {}
