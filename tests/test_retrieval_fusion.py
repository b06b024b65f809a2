"""retrieval.fusion: RRF, DBSF and convex combination -- formulas, ties, determinism, validation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_memory.retrieval.fusion import channel_ranks, convex, dbsf, dbsf_bounds, rrf

LEX = [("a", 9.0), ("b", 5.0), ("c", 1.0)]
SEM = [("c", 0.9), ("a", 0.8), ("d", 0.1)]


def test_rrf_formula_and_order() -> None:
    fused = rrf({"lexical": LEX, "semantic": SEM})
    expected = {
        "a": 1 / 61 + 1 / 62,
        "b": 1 / 62,
        "c": 1 / 63 + 1 / 61,
        "d": 1 / 63,
    }
    assert [rid for rid, _ in fused] == ["a", "c", "b", "d"]
    assert {rid: s for rid, s in fused} == pytest.approx(expected, rel=0, abs=0)
    weighted = rrf({"lexical": LEX, "semantic": SEM}, k=2, weights={"lexical": 2.0, "semantic": 0.5})
    assert dict(weighted)["b"] == 2.0 / 4


def test_ties_break_on_record_id() -> None:
    fused = rrf({"x": [("b", 1.0)], "y": [("a", 1.0)]})
    assert fused == [("a", 1 / 61), ("b", 1 / 61)]
    assert convex({"x": [("z", 3.0)], "w": [("y", 5.0)]}, {"x": 1.0, "w": 1.0}) == [("y", 1.0), ("z", 1.0)]


def test_dbsf_formula() -> None:
    scores = [s for _, s in LEX]
    mean = sum(scores) / 3
    sigma = math.sqrt(sum((s - mean) ** 2 for s in scores) / 2)  # sample deviation, as Qdrant
    low, span = mean - 3 * sigma, 6 * sigma
    fused = dict(dbsf({"lexical": LEX}))
    assert fused == pytest.approx({rid: (s - low) / span for rid, s in LEX})
    single = dbsf({"one": [("a", 7.0)], "flat": [("b", 2.0), ("c", 2.0)]})
    assert single == [("a", 0.5), ("b", 0.5), ("c", 0.5)]  # zero spread -> the midpoint
    heavy = dict(dbsf({"lexical": LEX, "semantic": SEM}, weights={"lexical": 0.0, "semantic": 1.0}))
    assert heavy["b"] == 0.0


def test_dbsf_does_not_clip_a_head_above_three_sigma() -> None:
    """Deep lists put the head beyond μ + 3σ; a clip at 1.0 would tie it and let record_id decide."""
    tail = [(f"n{i:03d}", 1.0 + i / 1000) for i in reversed(range(200))]
    head = [("z-best", 60.0), ("y-second", 50.0), ("x-third", 40.0)]
    fused = dbsf({"lexical": head + tail})
    assert [rid for rid, _ in fused[:3]] == ["z-best", "y-second", "x-third"]
    assert fused[2][1] > 1.0 and fused[0][1] > fused[1][1] > fused[2][1]


def test_convex_min_max() -> None:
    fused = dict(convex({"lexical": LEX, "semantic": SEM}, {"lexical": 0.3, "semantic": 0.7}))
    lex_n = {"a": 1.0, "b": 0.5, "c": 0.0}
    sem_n = {"c": 1.0, "a": 0.875, "d": 0.0}
    for rid in "abcd":
        assert fused[rid] == pytest.approx(0.3 * lex_n.get(rid, 0.0) + 0.7 * sem_n.get(rid, 0.0))
    with pytest.raises(ValueError):
        convex({"lexical": LEX, "semantic": SEM}, {"lexical": 1.0})


def test_empty_and_single_channel() -> None:
    assert rrf({}) == [] and dbsf({}) == [] and convex({}, {}) == []
    assert rrf({"lexical": []}) == []
    assert [rid for rid, _ in rrf({"lexical": LEX})] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "bad",
    [
        [("b", 1.0), ("a", 2.0)],  # not sorted by score
        [("b", 1.0), ("a", 1.0)],  # tie not sorted by id
        [("a", 2.0), ("a", 1.0)],  # duplicate
        [("a", float("nan"))],
        [("", 1.0)],
    ],
)
def test_rejects_non_canonical_channels(bad: list[tuple[str, float]]) -> None:
    for fuse in (rrf, dbsf, lambda c: convex(c, {"x": 1.0})):
        with pytest.raises(ValueError):
            fuse({"x": bad})


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        rrf({"x": LEX}, k=-1)
    with pytest.raises(ValueError):
        rrf({"x": LEX}, weights={"x": -1.0})
    with pytest.raises(ValueError):
        dbsf({"x": LEX}, weights={"y": 1.0})


def test_channel_ranks_for_receipts() -> None:
    assert channel_ranks({"lexical": LEX, "semantic": SEM}) == {
        "a": {"lexical": 1, "semantic": 2},
        "b": {"lexical": 2},
        "c": {"lexical": 3, "semantic": 1},
        "d": {"semantic": 3},
    }


def _ranked(draw_items: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(draw_items.items(), key=lambda h: (-h[1], h[0]))


channel = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.floats(min_value=-50, max_value=50, allow_nan=False),
    max_size=12,
).map(_ranked)


@given(st.dictionaries(st.sampled_from(["lexical", "semantic", "ppr"]), channel, max_size=3))
def test_fusions_are_deterministic_and_canonical(channels: dict[str, list[tuple[str, float]]]) -> None:
    reordered = dict(reversed(list(channels.items())))  # mapping order must not matter
    weights = {name: 1.0 + i for i, name in enumerate(sorted(channels))}
    union = {rid for hits in channels.values() for rid, _ in hits}
    for fuse in (rrf, dbsf, lambda c: convex(c, weights)):
        out = fuse(channels)
        assert out == fuse(reordered)
        assert out == sorted(out, key=lambda h: (-h[1], h[0]))
        assert {rid for rid, _ in out} == union
        assert all(math.isfinite(s) for _, s in out)


def test_rank_drops_semantic_only_hits_below_the_floor() -> None:
    from engram_memory.retrieval.ranking import FusionConfig, rank

    channels = {"lexical": [("b", 2.0), ("c", 1.0)],
                "semantic": [("a", 0.9), ("b", 0.3), ("c", 0.05), ("d", 0.01)]}
    config = FusionConfig(semantic_floor=0.2)
    loose = rank(channels, FusionConfig(semantic_floor=-1.0))
    kept = rank(channels, config)
    # "d" is semantic-only and below the floor; "c" is below it too but the lexical channel found it
    assert kept.ids == [rid for rid in loose.ids if rid != "d"]
    assert dict(kept.fused) == {rid: s for rid, s in loose.fused if rid != "d"}
    assert rank({"semantic": [("a", 0.1), ("b", 0.05)]}, config).ids == ["a", "b"]  # no lexical channel ran
    assert rank({"lexical": [], "semantic": [("a", 0.1)]}, config).ids == []
    assert config.describe(True, True)["semantic_floor"] == 0.2
    assert "semantic_floor" not in config.describe(False, False)


def _dbsf_reference(channels: dict[str, list[tuple[str, float]]], weights: dict[str, float]) -> list[tuple[str, float]]:
    """DBSF as a loop of Python floats: the array version must give the same bits and order."""
    fused: dict[str, float] = {}
    for name in sorted(channels):
        hits = channels[name]
        if not hits:
            continue
        low, span = dbsf_bounds([float(s) for _rid, s in hits])
        for rid, s in hits:
            norm = 0.5 if span == 0.0 else (float(s) - low) / span
            fused[rid] = fused.get(rid, 0.0) + weights[name] * norm
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=4)
scores = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 2.5]), st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))
wide_channel = st.dictionaries(ids, scores, max_size=40).map(_ranked)  # ties, signed zeros, any code point


@given(st.dictionaries(st.sampled_from(["lexical", "semantic"]), wide_channel, max_size=2),
       st.floats(min_value=0.0, max_value=3.0), st.floats(min_value=0.0, max_value=3.0))
def test_dbsf_equals_the_python_float_loop_bit_for_bit(channels: dict[str, list[tuple[str, float]]],
                                                       w_lex: float, w_sem: float) -> None:
    weights = {"lexical": w_lex, "semantic": w_sem}
    want = _dbsf_reference(channels, weights)
    got = dbsf(channels, weights={k: weights[k] for k in channels})
    assert [(rid, s.hex()) for rid, s in got] == [(rid, s.hex()) for rid, s in want]
