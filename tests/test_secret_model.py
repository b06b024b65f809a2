"""The learned secrets screen beside the rules (issue 36): the artefact, its decisions, its training."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest

from engram_memory.checks import secrets_eval
from engram_memory.store.screen.policy import DefaultAdmissionPolicy, secret_kind
from engram_memory.store.screen.secret_model import ARTEFACT, DIM, features, load_model, windows
from engram_memory.store.screen.secrets import CLASSIFIER_KIND, find_rule_secret, find_secret, rules_only

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"


def test_the_shipped_artefact_loads_and_its_card_describes_it() -> None:
    model = load_model()
    assert model is not None
    assert model.weights.shape == (DIM,) and model.weights.dtype == np.float32
    card = json.loads((ARTEFACT / "card.json").read_text(encoding="utf-8"))
    assert 0.5 <= card["threshold"] < 1.0 and card["threshold"] == model.threshold
    assert card["threshold"] > card["threshold_rule"]["prose_max"]  # ordinary prose passes
    for name in ("corpus", "probes", "frozen", "heldout", "heldout2", "heldout3", "heldout4"):
        assert name in card["training"]["labelled"] and name in card["cross_validated"]
    assert sum(card["training"]["prose_windows"].values()) > 10_000
    assert (ARTEFACT / "weights.npy").stat().st_size < 300_000  # small
    for name, digest in card["training"]["labelled_sha256"].items():  # trained on the corpora as committed
        assert hashlib.sha256((secrets_eval.DATA / name).read_bytes()).hexdigest() == digest, name


def test_features_are_the_same_for_the_same_text_and_windows_cover_long_text() -> None:
    a, b = features("the wifi password is pollitos1958"), features("the wifi password is pollitos1958")
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert a[0].max() < DIM and a[0].min() >= 0
    long = "\n".join(f"Line {i}: the quarterly report is attached, see the figures." for i in range(40))
    parts = windows(long)
    assert len(parts) > 1 and all(len(p) <= 320 for p in parts)
    assert windows("short") == ["short"] and windows("   ") == []


def _classifier_only(path: Path) -> list[str]:
    return [e["text"] for e in secrets_eval.load_corpus(path)
            if e["label"] == "secret" and find_rule_secret(e["text"]) is None and find_secret(e["text"])]


def test_the_classifier_catches_secrets_the_rules_miss() -> None:
    """Development data the rules miss (round 4, never developed on by the rules) that the model catches,
    and the decision names it: secret:classifier."""
    caught = _classifier_only(secrets_eval.HELDOUT4) + _classifier_only(secrets_eval.HELDOUT2)
    assert len(caught) >= 10, caught
    for text in caught:
        assert find_secret(text) == CLASSIFIER_KIND
        with rules_only():
            assert find_secret(text) is None
        payload = {"components": [{"component_id": "c1", "text": text}]}
        assert secret_kind(payload, {}) == CLASSIFIER_KIND
        assert DefaultAdmissionPolicy().decide(payload, {}) == "reject"


def test_the_engine_names_the_classifier_and_rules_only_turns_it_off(tmp_path: Path) -> None:
    caught = _classifier_only(secrets_eval.HELDOUT4)
    assert caught
    example = {"text": caught[0], "label": "secret", "kind": "x", "where": "text"}
    runner = secrets_eval.EngineRunner(tmp_path / "data")
    try:
        assert runner.verdict(example)[0] == "rejected"
        with rules_only():
            assert runner.verdict(example)[0] == "accepted"
    finally:
        runner.close()


def test_the_screen_adds_little_to_an_admission() -> None:
    """The learned screen's cost on a whole candidate (every string of it), p50 over the corpus's examples."""
    examples = secrets_eval.load_corpus(secrets_eval.HELDOUT4)[:200]
    payloads = [secrets_eval.capture_arguments(e, i) for i, e in enumerate(examples)]
    policy = DefaultAdmissionPolicy()

    def p50(on: bool) -> float:
        took = []
        for args in payloads:
            start = time.perf_counter()
            if on:
                policy.decide(args["payload"], args["evidence"])
            else:
                with rules_only():
                    policy.decide(args["payload"], args["evidence"])
            took.append(time.perf_counter() - start)
        return float(np.median(took)) * 1000

    p50(True)  # the model loaded, caches warm
    added = p50(True) - p50(False)
    assert added < 30.0, added


@pytest.mark.skipif(not DATA.is_dir(), reason="the development collections are beside the checkout")
def test_training_reproduces_its_artefact_byte_for_byte(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    from engram_memory.checks import secrets_train

    small = tmp_path / "data"
    for name in ("medline", "locomo/locomo-26"):
        (small / name).mkdir(parents=True)
        for file in ("corpus.jsonl", "queries.jsonl"):
            (small / name / file).write_bytes((DATA / name / file).read_bytes())
    rows = secrets_train.labelled_examples()[::6]
    secrets_train.train(small, tmp_path / "a", say=lambda _m: None, rows=rows)
    secrets_train.train(small, tmp_path / "b", say=lambda _m: None, rows=rows)
    for file in ("weights.npy", "card.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    assert load_model.__wrapped__(tmp_path / "a") is not None


def test_a_lone_surrogate_is_screened_not_a_crash() -> None:
    """Text decoded from JSON may hold an unpaired surrogate (an import's graph file did): the learned
    screen reads it as bytes like any other (the rules already did)."""
    for text in ("entity \ud800 one", "\udfff", "password: Zx\ud83d-hunter7!"):
        features(text)
        find_secret(text)  # no UnicodeEncodeError
    model = load_model()
    assert model is not None and not model.fires("the \ud800 release ships on Friday")


def test_the_model_may_overrule_a_statement_rule_and_never_a_sure_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A statement rule's finding stands only if the model's probability reaches the card's veto; a
    token shape, a header or a key never depends on the model. A vetoed first line does not hide a
    sure finding on a later one."""
    from engram_memory.store.screen import secrets as screen
    from engram_memory.store.screen.secret_model import VETOABLE, SecretModel

    shipped = load_model()
    assert shipped is not None
    statement = "the admin password for the staging console is Tr0ub4dor-and-3"
    header = "Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0"
    assignment = "Notes from the incident. password: correcthorsebattery Follow-up owed."
    assert find_rule_secret(statement) in VETOABLE and find_rule_secret(header) not in VETOABLE
    assert find_rule_secret(assignment) not in VETOABLE  # a key = value is sure, whatever the model says
    vetoing = SecretModel(weights=shipped.weights, bias=shipped.bias, threshold=1.01, veto=1.0)  # overrules all
    assert vetoing.overrules(find_rule_secret(statement), statement)
    assert not vetoing.overrules(find_rule_secret(header), header)
    assert not SecretModel(weights=shipped.weights, bias=shipped.bias, threshold=1.01).overrules(
        find_rule_secret(statement), statement)  # veto 0: never
    monkeypatch.setattr(screen, "load_model", lambda: vetoing)
    assert find_secret(statement) is None
    assert find_secret(statement + "\n" + header) == find_rule_secret(header)
    assert find_secret(assignment) == find_rule_secret(assignment)
    with rules_only():
        assert find_secret(statement) == find_rule_secret(statement)


def test_the_shipped_card_names_its_veto() -> None:
    card = json.loads((ARTEFACT / "card.json").read_text(encoding="utf-8"))
    model = load_model()
    assert model is not None and model.veto == card["veto"] and card["veto"] in card["threshold_rule"]["veto_grid"]
    assert 0.0 <= model.veto < model.threshold
