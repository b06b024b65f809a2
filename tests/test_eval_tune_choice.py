"""eval.tune.choose: the shipped fusion stays unless a robust challenger is significantly better."""

from __future__ import annotations

from typing import Any

from studies.tune import GRID, SHIPPED, choose

CHALLENGER = "convex 0.5/0.5"  # any grid row but the shipped one


def _collection(ndcg: dict[str, float], p_vs_default: dict[str, float]) -> dict[str, Any]:
    scores = {"lexical": {"ndcg@10": 0.50}, "semantic": {"ndcg@10": 0.55}}
    p_values: dict[str, dict[str, float]] = {}
    for label, *_ in GRID:
        scores[label] = {"ndcg@10": ndcg.get(label, 0.40)}  # below both channels: not robust
        p_values[label] = {} if label == SHIPPED else {SHIPPED: p_vs_default.get(label, 1.0)}
    scores[SHIPPED] = {"ndcg@10": ndcg.get(SHIPPED, 0.60)}
    return {"scores": scores, "p_values": p_values}


def test_shipped_default_matches_engine_config() -> None:
    assert SHIPPED == "dbsf"


def test_higher_mean_without_significance_keeps_the_default() -> None:
    per = {
        "a": _collection({CHALLENGER: 0.62}, {CHALLENGER: 0.3}),
        "b": _collection({CHALLENGER: 0.61}, {CHALLENGER: 0.2}),
    }
    choice = choose(per)
    assert choice["best"] == SHIPPED and choice["best_mean"] == CHALLENGER


def test_significant_robust_gain_replaces_the_default() -> None:
    per = {
        "a": _collection({CHALLENGER: 0.66}, {CHALLENGER: 0.01}),
        "b": _collection({CHALLENGER: 0.61}, {CHALLENGER: 0.4}),
    }
    assert choose(per)["best"] == CHALLENGER


def test_a_significant_loss_anywhere_disqualifies() -> None:
    per = {
        "a": _collection({CHALLENGER: 0.70}, {CHALLENGER: 0.001}),
        "b": _collection({CHALLENGER: 0.56, SHIPPED: 0.60}, {CHALLENGER: 0.01}),
    }
    row = next(r for r in choose(per)["table"] if r["config"] == CHALLENGER)
    assert row["significantly_worse_than_default"] == ["b"]
    assert choose(per)["best"] == SHIPPED


def test_a_challenger_that_loses_to_a_channel_is_not_chosen() -> None:
    per = {
        "a": _collection({CHALLENGER: 0.90}, {CHALLENGER: 0.001}),
        "b": _collection({CHALLENGER: 0.52}, {CHALLENGER: 0.9}),
    }
    assert choose(per)["best"] == SHIPPED
