"""Secrets never become memory ("Prove it", item 4).

(a) the five strings once accepted by hand are rejected through the real engine, and nothing of them
    can be searched or read afterwards; a credentialed URL is rejected in any id or ref field;
(b) the whole labelled corpus (checks/secrets/corpus.jsonl) and the generator's corpus for another
    seed (not held-out: the rules were tuned on the generator) through the policy function:
    recall >= 0.98, false-positive rate <= 0.02;
(c) a sample through the real engine (capture + request_admission) gives the policy function's verdicts;
(d) benign look-alikes in ids and refs are accepted, and read back intact.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_memory.checks import secrets_eval
from engram_memory.models.digests import record_id_from_digest
from engram_memory.models.errors import EngramError
from engram_memory.models.outputs import validate_output
from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from engram_memory.store.screen.policy import DefaultAdmissionPolicy, secret_kind
from engram_memory.store.screen.secrets import find_secret, strings_of
from tests.store_fixtures import PURPOSE, T0, admission_args, call, capture_args, ctx

CORPUS = secrets_eval.DEFAULT_CORPUS  # shipped with the package (engram_memory/checks/secrets/)
REPO = Path(__file__).resolve().parents[1]

GOOGLE_KEY = "AIzaSyD3fK9wQx1Lm7Pn2Rt8Vz4Yb6Hc0Jg5Ues"  # made up: AIza + 35 characters
PG_URL = "postgresql://user:pass@host/db"
HAND_TRIED = [
    "The admin password for the staging console is hunter2-Winter2026!",
    "The admin password is hunter2",
    "pwd: correcthorsebatterystaple",
    GOOGLE_KEY,
    PG_URL,
]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine.open(EngineSettings(data_dir=tmp_path / "data", semantic=False), clock=lambda: T0)
    yield e
    e.close()


def place(args: dict[str, Any], where: str, value: str) -> dict[str, Any]:
    """The capture with ``value`` in one field (an id replaced everywhere it is referenced)."""
    args = copy.deepcopy(args)
    payload, evidence = args["payload"], args["evidence"]
    component, citation = payload["components"][0], payload["citations"][0]
    if where == "component_id":
        component["component_id"] = payload["primary_component_id"] = value
    elif where == "citation_id":
        component["citation_ids"] = evidence["citation_ids"] = [value]
        citation["citation_id"] = payload["primary_event"]["citation_id"] = value
    elif where == "type_ref":
        payload["primary_event"]["type_ref"] = value
    elif where == "locator":
        citation["locator"]["value"] = value
    elif where == "source_ref":
        citation["source_ref"] = value
    elif where == "evidence_ref":
        evidence["evidence_ref"] = value
    else:
        raise AssertionError(where)
    return args


def capture_and_admit(engine: Engine, args: dict[str, Any], n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    args = {**args, "idempotency_key": f"secrets-capture-{n:06d}"}
    cap = call(engine, "capture", ctx(), args)
    validate_output("capture", cap)
    out = call(engine, "request_admission", ctx(), admission_args(cap["candidate_id"], key=f"secrets-admit-{n:06d}"))
    validate_output("request_admission", out)
    return cap, out["outcome"]


def search_ids(engine: Engine, query: str) -> list[str]:
    value = call(engine, "search", ctx(), {"query": query, "purpose_ref": PURPOSE, "limit": 50})
    validate_output("search", value)
    return [packet["record"]["record_id"] for packet in value["records"]]


# ---- (a) the hand-tried cases through the real engine -------------------------------------------


def test_hand_tried_secrets_are_rejected_and_never_searchable_or_readable(engine: Engine) -> None:
    # A control that IS admitted, so "search finds nothing" below is not vacuous.
    _, control = capture_and_admit(engine, capture_args("The staging console moved to the new VPC."), 0)
    assert control["status"] == "accepted"

    minted: list[str] = []
    for n, text in enumerate(HAND_TRIED, 1):
        cap, outcome = capture_and_admit(engine, capture_args(text), n)
        assert outcome["status"] == "rejected", text  # a normal outcome, never an error
        assert "record_id" not in outcome
        minted.append(record_id_from_digest(cap["record_digest"]))  # the id it would have had

    for query in ("staging console", "admin password", "hunter2", "hunter2-Winter2026", "Winter2026",
                  "correcthorsebatterystaple", "pwd", GOOGLE_KEY, "postgresql", "user pass host db"):
        found = search_ids(engine, query)
        assert set(found) <= {control["record_id"]}, query
    assert search_ids(engine, "staging console") == [control["record_id"]]
    for record_id in minted:
        with pytest.raises(EngramError) as info:
            call(engine, "get", ctx(), {"record_id": record_id, "purpose_ref": PURPOSE})
        assert info.value.code == "NOT_FOUND"
    assert call(engine, "get", ctx(), {"record_id": control["record_id"], "purpose_ref": PURPOSE})


@pytest.mark.parametrize("where", ["component_id", "citation_id", "type_ref", "locator", "source_ref",
                                   "evidence_ref"])
def test_credentialed_url_in_an_id_or_ref_is_rejected(engine: Engine, where: str) -> None:
    args = place(capture_args("We moved the reporting database to the new cluster."), where, PG_URL)
    cap, outcome = capture_and_admit(engine, args, 1)
    assert outcome["status"] == "rejected"
    assert "record_id" not in outcome
    with pytest.raises(EngramError) as info:
        call(engine, "get", ctx(), {"record_id": record_id_from_digest(cap["record_digest"]), "purpose_ref": PURPOSE})
    assert info.value.code == "NOT_FOUND"
    assert search_ids(engine, "reporting database cluster") == []


def test_every_string_of_the_candidate_is_screened() -> None:
    """The walk is generic: family refs, purpose_ref, attestation, the locator scheme -- any string."""
    base = capture_args("A harmless decision about the release train.")
    payload, evidence = base["payload"], base["evidence"]
    assert DefaultAdmissionPolicy().decide(payload, evidence) == "accept"
    probes: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for mutate in (
        lambda p, e: p.update(reconciliation={"family_refs": ["family:adr", PG_URL]}),
        lambda p, e: p.update(purpose_ref="purpose:" + GOOGLE_KEY),
        lambda p, e: p["citations"][0]["locator"].update(scheme="pwd: correcthorsebatterystaple"),
        lambda p, e: e.update(attestation="signed off; the admin password is hunter2"),
        lambda p, e: p.update(extra={"nested": [{"deep": ["postgres://app:Sup3r-s3cret@db/app"]}]}),
    ):
        p, e = copy.deepcopy(payload), copy.deepcopy(evidence)
        mutate(p, e)
        probes.append((p, e))
    for p, e in probes:
        assert DefaultAdmissionPolicy().decide(p, e) == "reject"
        assert secret_kind(p, e) is not None
    # digests, ids and the scope are screened too, and never trip it
    assert set(strings_of({"a": [payload, evidence]})) >= {payload["citations"][0]["content_digest"],
                                                          evidence["evidence_digest"]}


# ---- (b) the corpus through the policy function --------------------------------------------------


def test_corpus_meets_the_targets_through_the_policy_function() -> None:
    examples = secrets_eval.load_corpus(CORPUS)
    assert sum(e["label"] == "secret" for e in examples) >= 300
    assert sum(e["label"] == "benign" for e in examples) >= 300
    assert {e["text"] for e in examples} >= set(HAND_TRIED)
    assert len(GOOGLE_KEY) == 4 + 35 and GOOGLE_KEY.startswith("AIza")
    result = secrets_eval.score_policy(examples, "corpus")
    assert result.recall >= secrets_eval.RECALL_TARGET, result.misses
    assert result.fpr <= secrets_eval.FPR_TARGET, result.misses
    for (label, kind), tally in result.kinds.items():  # no kind is sacrificed to the average
        if label == "secret":
            assert tally.rate >= 0.9, (kind, result.misses)
        else:
            assert tally.rate <= 0.1, (kind, result.misses)


def test_another_seed_of_the_generator_meets_the_targets() -> None:
    result = secrets_eval.score_policy(secrets_eval.generated_corpus(), "generated")
    assert result.recall >= secrets_eval.RECALL_TARGET, result.misses
    assert result.fpr <= secrets_eval.FPR_TARGET, result.misses


def test_hand_written_probes() -> None:
    """Sentences written by hand, not by the generator (checks/secrets/probes.jsonl): no false positive,
    and at most the one known miss ('key is "..."' with no credential word)."""
    result = secrets_eval.score_policy(secrets_eval.load_corpus(secrets_eval.PROBES), "probes")
    assert result.benign.n >= 80 and result.benign.caught == 0, result.misses
    assert result.secret.n >= 40 and result.secret.n - result.secret.caught <= 1, result.misses


def test_the_committed_corpus_is_what_the_generator_makes() -> None:
    from engram_memory.checks.secrets_corpus import SEED, generate

    assert secrets_eval.load_corpus(CORPUS) == generate(SEED)


# ---- (c) the real engine agrees with the policy function ----------------------------------------


def test_engine_verdicts_match_the_policy_function(tmp_path: Path) -> None:
    examples = secrets_eval.load_corpus(CORPUS)
    rng = random.Random(4)
    by_label = {label: [e for e in examples if e["label"] == label] for label in ("secret", "benign")}
    sample = [e for e in examples if e.get("source") == "hand-tried"]
    sample += rng.sample(by_label["secret"], 18) + rng.sample(by_label["benign"], 18)
    runner = secrets_eval.EngineRunner(tmp_path / "data")
    try:
        for example in sample:
            verdict, record_id = runner.verdict(example)
            assert verdict == secrets_eval.policy_verdict(example), example
            assert (record_id is not None) == (verdict == "accepted")
            expected = ("rejected", "blocked") if example["label"] == "secret" else ("accepted",)
            assert verdict in expected, example
    finally:
        runner.close()


# ---- (d) benign look-alikes in ids and refs -----------------------------------------------------

LOOKALIKES = [
    ("component_id", "c-password-policy"),
    ("component_id", "k-3f9a1c2d"),
    ("citation_id", "cite:token-rotation-runbook"),
    ("citation_id", "123e4567-e89b-12d3-a456-426614174000"),
    ("type_ref", "event:secret-rotated"),
    ("type_ref", "event:password-reset"),
    ("locator", "docs/security/passwords.md#L12"),
    ("locator", "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ("source_ref", "https://wiki.example.com/Secrets_Management"),
    ("source_ref", "mem_7x2kq4bd3owlu5w6hqnt2w5lhl2b4ofx5cq6gf7ut6vt4a3pa3ia"),
    ("source_ref", "postgres://db.internal:5432/app"),
    ("source_ref", "git@github.com:acme/api.git"),
    ("evidence_ref", "candidate_8f14e45fceea167a5a36dedd4bea2543c2a8c6e2a1f9e7c4d9a1b2c3d4e5f6a7"),
    ("evidence_ref", "ev:api-key-audit-2026"),
]


def test_benign_lookalikes_in_ids_and_refs_are_accepted(engine: Engine) -> None:
    for n, (where, value) in enumerate(LOOKALIKES, 1):
        assert find_secret(value) is None, value
        args = place(capture_args(f"Decision {n}: rotate credentials through the vault runbook."), where, value)
        _, outcome = capture_and_admit(engine, args, n)
        assert outcome["status"] == "accepted", (where, value)
        got = call(engine, "get", ctx(), {"record_id": outcome["record_id"], "purpose_ref": PURPOSE})
        validate_output("get", got)
        record = got["record"]
        carried = set(strings_of([record["components"], record["citations"], record["primary_event"]]))
        if where != "evidence_ref":  # evidence is not part of the record
            assert value in carried, (where, value)


# ---- (e) the frozen, hand-written corpus and the development collections (issue 24) -------------

FROZEN_SHA256 = "3dfeadae88b83909a101f1b482fbe5fdca3172c128ca4a48f14406a6c0a58a2c"
ISSUE_SECRETS = [
    "the wifi password is sunflower", "root pw for db is 'hunter2'", "the pass is letmein",
    "ssh root@10.0.0.5 password toor", "log into the router with admin/admin",
    "Netflix: jane@x.com / Netflix2023!", "my pin is 4821", "WPA2 key: sunflower99", "The garage code is 4821",
    "le mot de passe du wifi est tournesol", "la contraseña del wifi es girasol", "das WLAN-Passwort ist Sonnenblume",
    "wallet seed phrase: abandon ability able about above absent absorb abstract absurd abuse access accident",
    "The 2FA backup codes are 8391-2047, 5520-1938, 7781-0012",
]
ISSUE_BENIGN = ["Login flow: user/pass then TOTP.", "Set the session cookie to SameSite=Lax.",
                "the password is wrong, ask IT to reset it", "a password is required for every account",
                "API key: `<your-api-key>`", "passwords are rotated every 90 days",
                "boarding pass and passport", "first pass: tokenize", "the zip code for the office is 94103",
                "PIN endocytosis regulates auxin transport", "the key insight is that latency is dominated by DNS"]


HELDOUT_SHA256 = "e9650b291cafeffbcd29f699aef8598e16d7a84a3e78dc7d95c633c77d42376a"
HELDOUT2_SHA256 = "ae2add287bc46ebc22aa671015347da6b1f1e0c27183c7b3be7a834e9283b9bd"
HELDOUT3_SHA256 = "5cbc2010bb41a9f39525811bdcb8bcd5425dff7d902879401945564877fa08ec"
HELDOUT4_SHA256 = "bf6259512dbc093f04c1dafa33cb204ceca1e85b0bb4ae030594196389b5ac2c"
# Round 6: the nine blind files concatenated (en de fr es it pt nl ja zh), as hashed before the first run.
HELDOUT6_SHA256 = "703ae72f19bc220f0e85eb935af21e725a25a0a6502622f6568f70beced76e2a"
# Round 7: the nine blind files concatenated in file-name order (de en es fr it ja nl pt zh), as hashed.
HELDOUT7_SHA256 = "10ccdd601aaf734e34686a67c5d7fb28e75989ae9fa7b1b703dc8fcfabea3dc0"
# Round 8: the nine blind files concatenated in file-name order (de en es fr it ja nl pt zh), as hashed
# by their writers; run once against the screen frozen for it (0.755 / 0.022), development data since.
HELDOUT8_SHA256 = "51c1f2be298a8753d891a32d82d4a59db9984999eb528020092f2f2fd7d9f50a"
# Round 9: the same nine languages, concatenated in file-name order; run once against the screen frozen
# for it (0.739 / 0.019), development data since.
HELDOUT9_SHA256 = "4d67d9fc623f51662ae9bb0ce6c006b76986e3ef79ba4c58bcca414d97d279e1"


def test_the_frozen_corpora_are_the_ones_written_before_the_rules() -> None:
    import hashlib

    assert hashlib.sha256(secrets_eval.FROZEN.read_bytes()).hexdigest() == FROZEN_SHA256  # never edited to fit
    assert hashlib.sha256(secrets_eval.HELDOUT.read_bytes()).hexdigest() == HELDOUT_SHA256
    assert hashlib.sha256(secrets_eval.HELDOUT2.read_bytes()).hexdigest() == HELDOUT2_SHA256
    assert hashlib.sha256(secrets_eval.HELDOUT3.read_bytes()).hexdigest() == HELDOUT3_SHA256
    assert hashlib.sha256(secrets_eval.HELDOUT4.read_bytes()).hexdigest() == HELDOUT4_SHA256
    assert hashlib.sha256(secrets_eval.HELDOUT6.read_bytes()).hexdigest() == HELDOUT6_SHA256
    assert hashlib.sha256(secrets_eval.HELDOUT7.read_bytes()).hexdigest() == HELDOUT7_SHA256
    assert hashlib.sha256(secrets_eval.HELDOUT8.read_bytes()).hexdigest() == HELDOUT8_SHA256
    assert hashlib.sha256(secrets_eval.HELDOUT9.read_bytes()).hexdigest() == HELDOUT9_SHA256


@pytest.mark.parametrize(("path", "size", "recall", "fpr"), [
    # Round 1: 558 sentences by another engineer; first run 0.812 / 0.007, then the rules were developed on it.
    (secrets_eval.HELDOUT, 558, 0.98, 0.01),
    # Round 2: 523 sentences written blind to the code and the other corpora; first run 0.704 / 0.019 (the
    # unseen measurement of round 1's rules), then developed on: 0.927 / 0.004, and 0.946 / 0.004 after round 3.
    (secrets_eval.HELDOUT2, 523, 0.94, 0.01),
    # Round 3: 521 sentences written blind; first run 0.776 / 0.027, then developed on (tables, exports, config
    # calls, labels over lines, noun-less passwords): 0.970 / 0.004.
    (secrets_eval.HELDOUT3, 521, 0.96, 0.01),
    # Round 4: 530 sentences written blind in seven languages (three the rules had never read), run once
    # against the final rules: 0.728 / 0.038 -- the unseen figure. Not developed on.
    (secrets_eval.HELDOUT4, 530, 0.72, 0.04),
])
def test_the_held_out_rounds_keep_their_floors(path: Path, size: int, recall: float, fpr: float) -> None:
    """Floors, so a change that loses ground on any round fails here. Only round 4 is unseen; the next
    unseen measurement needs a fifth round, written and run once."""
    examples = secrets_eval.load_corpus(path)
    languages = {"en", "fr", "es", "de"} | ({"it", "pt", "nl"} if path == secrets_eval.HELDOUT4 else set())
    assert len(examples) == size and {e["lang"] for e in examples} == languages
    result = secrets_eval.score_policy(examples, path.stem)
    assert result.recall >= recall and result.fpr <= fpr, (result.recall, result.fpr)


def test_the_frozen_corpus_meets_the_targets() -> None:
    examples = secrets_eval.load_corpus(secrets_eval.FROZEN)
    assert len(examples) == 433 and {e["lang"] for e in examples} == {"en", "fr", "es", "de"}
    result = secrets_eval.score_policy(examples, "frozen")
    assert result.recall >= secrets_eval.RECALL_TARGET, result.misses
    assert result.fpr <= secrets_eval.FPR_TARGET, result.misses
    for lang in ("en", "fr", "es", "de"):  # no language is sacrificed to the average
        part = secrets_eval.score_policy([e for e in examples if e["lang"] == lang], lang)
        assert part.recall >= 0.95 and part.fpr <= 0.02, (lang, part.misses)


@pytest.mark.parametrize("text", ISSUE_SECRETS)
def test_credentials_stated_in_prose_are_secrets(text: str) -> None:
    assert find_secret(text) is not None, text


@pytest.mark.parametrize("text", ISSUE_BENIGN)
def test_talk_about_credentials_is_not_a_secret(text: str) -> None:
    assert find_secret(text) is None, text


def _screen_the_development_collections(stride: int) -> tuple[int, list[tuple[str, str]]]:
    """Every ``stride``-th document and query of SciFact, Cranfield, Medline, the LoCoMo conversations
    and the shipped sample (all of them at stride 1) through the screen: how many, and which rejected."""
    import json

    data = REPO.parent / "shared" / "data"
    corpora = sorted(data.rglob("corpus.jsonl"))
    if not corpora:  # beside the checkout in CI and sessions, as for the other collection tests
        pytest.skip(f"the development collections are missing under {data}")
    assert len(corpora) >= 8, f"some development collections are missing under {data}"
    screened, rejected = 0, []
    for corpus in [*corpora, REPO / "eval" / "sample" / "corpus.jsonl"]:
        for n, line in enumerate(corpus.open(encoding="utf-8")):
            if n % stride:
                continue
            doc = json.loads(line)
            screened += 1
            if find_secret(f"{doc.get('title', '')}\n{doc.get('text', '')}".strip()):
                rejected.append((corpus.parent.name, doc["_id"]))
        for n, line in enumerate((corpus.parent / "queries.jsonl").open(encoding="utf-8")):
            if n % stride:
                continue
            screened += 1
            if find_secret(json.loads(line)["text"]):
                rejected.append((corpus.parent.name, "query"))
    return screened, rejected


def test_a_slice_of_the_development_collections_is_not_rejected() -> None:
    """The default run's version of the screen below: every 20th document and query of each
    development collection (about 650 texts, seconds instead of two minutes)."""
    screened, rejected = _screen_the_development_collections(20)
    assert screened > 600 and rejected == [], rejected[:10]


@pytest.mark.slow
def test_no_document_of_the_development_collections_is_rejected() -> None:
    """Every document and query of SciFact, Cranfield, Medline, the LoCoMo conversations and the
    shipped sample goes through the screen: none may be taken for a secret (2 min: `-m slow`)."""
    screened, rejected = _screen_the_development_collections(1)
    assert screened > 12_000 and rejected == [], rejected[:10]


@pytest.mark.parametrize(("text", "secret"), [
    # AWS's documented example keys, said to be examples: the rules read them as placeholders ...
    ("The AWS docs use AKIAIOSFODNN7EXAMPLE as the sample access key; ours is in Parameter Store.", False),
    ("AWS 文档里的示例密钥 AKIAIOSFODNN7EXAMPLE 是假的", False),
    ("aws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
     "   # from the AWS docs", False),
    # ... not when nothing says so: people paste the example as their own key (probes, frozen corpus).
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", True),
    ("my AWS secret access key is wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", True),
    # and a real-shaped key beside the word "example" is still a key
    ("example config: aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq8Tr4Ws", True),
])
def test_a_documented_example_key_said_to_be_one_is_not_a_secret(text: str, secret: bool) -> None:
    from engram_memory.store.screen.secrets import find_rule_secret

    assert (find_rule_secret(text) is not None) is secret, text
