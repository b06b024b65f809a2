"""studies/rerank_study.py: its scoring is ranx's, its features parse LoCoMo turns, its choice follows the signal.

The full study needs the model and every LoCoMo conversation (minutes); these checks pin the parts
its conclusions rest on, on data small enough to reason about.
"""

from __future__ import annotations

import numpy as np
import pytest

from engram_memory.eval import metrics
from studies import rerank_study as rs


def _query(fused: list[float], feature: list[float], gains: list[float], column: int = 1) -> rs.Query:
    z = np.zeros((len(fused), 1 + len(rs.FEATURES)))
    z[:, 0] = rs._z(np.array(fused))
    z[:, column] = rs._z(np.array(feature))
    ideal = rs._dcg(np.array(sorted((g for g in gains if g > 0), reverse=True)))
    return rs.Query(z, np.array(gains), ideal, sum(1 for g in gains if g > 0))


def test_evaluate_scores_as_ranx_does() -> None:
    ids = [f"d{i:02d}" for i in range(12)]
    fused = [float(12 - i) for i in range(12)]
    gains = [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1]  # one relevant at rank 3, one beyond the top 10
    q = _query(fused, [0.0] * 12, [float(g) for g in gains])
    nd, rc = rs.evaluate([q], np.array([1.0, 0, 0, 0, 0, 0]))
    run = {"q": [(d, s) for d, s in zip(ids, fused, strict=True)]}
    qrels = {"q": {d: 1 for d, g in zip(ids, gains, strict=True) if g}}
    ref = metrics.score(run, qrels, ("ndcg@10", "recall@10"))
    assert nd == pytest.approx(ref["ndcg@10"], abs=1e-9) and rc == pytest.approx(ref["recall@10"], abs=1e-9)
    assert rc == 0.5 and 0.0 < nd < 1.0


def test_speaker_and_sentences_of_a_turn() -> None:
    text = "Caroline: I went to a support group. It was powerful! [shares a photo: a dog by a wall]"
    assert rs.speaker(text) == "Caroline"
    assert rs.speaker("no label here") is None
    assert rs.sentences("session 1", text) == [
        "session 1\nCaroline: I went to a support group.",
        "session 1\nCaroline: It was powerful!",
        "session 1\nCaroline: a dog by a wall",
    ]


def test_the_study_chooses_the_feature_that_carries_the_signal() -> None:
    # Five collections whose relevant record the fused score puts last and "maxsim" puts first.
    per = {}
    for n in range(5):
        gains = [0.0] * 9 + [1.0]
        fused = [float(10 - i) for i in range(10)]
        maxsim = [0.0] * 9 + [1.0]
        per[f"c{n}"] = [_query(fused, maxsim, gains, column=1 + rs.FEATURES.index("maxsim"))]
    result = rs.study(per)
    rows = {r["label"]: r for r in result["rows"]}
    today = rows["the engine today"]
    assert np.mean(list(today["in_sample_ndcg"].values())) == pytest.approx(1 / np.log2(11))
    chosen = rows["+ maxsim"]
    assert chosen["in_sample"].startswith("fused + maxsim")
    assert set(chosen["rotation_ndcg"].values()) == {1.0}
    assert rows["+ speaker"]["in_sample"] == "fused (the engine today)"  # no signal, no weight
    assert result["oracle"]["judged order of the top 10"] == {f"c{n}": 1.0 for n in range(5)}
    text = rs.render(result, {f"c{n}": {"hybrid": {"ndcg@10": 0.1, "recall@10": 0.2}} for n in range(5)})
    assert "| + maxsim | 1.0000 | 1.0000 | fused + maxsim" in text
