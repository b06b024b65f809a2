"""Fusion across languages on a real engine (DuckDB, Tantivy, the packaged model): a lexical channel
that shares nothing, or only an incidental word, with the query must not pull the semantic ranking
down (retrieval/ranking.py, ``LEXICAL_COVERAGE_FULL``)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from engram_memory.models.limits import LEXICAL_COVERAGE_FULL
from engram_memory.retrieval.fusion import dbsf_bounds
from engram_memory.store.engine import Engine
from tests.store_fixtures import admission_args, call, capture_args, ctx
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
