"""retrieval/rerank.py: speaker labels, the event timeline, and the head's reordering (pure)."""

from __future__ import annotations

import random

import pytest

from engram_memory.retrieval.rerank import (
    FEATURES,
    HeadFacts,
    RerankConfig,
    Timeline,
    features,
    names_label,
    rerank,
    speaker_labels,
)


def test_speaker_labels_are_line_leading_names() -> None:
    text = "session 1, 1:56 pm on 8 May, 2023\nCaroline: Hey Mel! Time: later"
    assert speaker_labels(text) == {"Caroline"}  # "1:56" is not a label (no space after the colon)
    assert speaker_labels("Dr. Ada Lovelace: notes\nBob: yes") == {"Dr. Ada Lovelace", "Bob"}
    assert speaker_labels("No label here. Ratio 3:1 and see: below") == frozenset()
    assert speaker_labels("x" * 41 + ": too long for a name") == frozenset()


def test_a_label_is_named_only_as_a_whole_word() -> None:
    labels = "Mel"
    assert names_label("What did Mel paint?", labels)
    assert names_label("Mel's painting", labels)
    assert not names_label("What did Melanie paint?", labels)
    assert not names_label("what did mel paint?", labels)  # a name: case-sensitive


def test_timeline_neighbours_follow_event_order_and_skip_shared_instants() -> None:
    t = Timeline({"c": 30, "a": 10, "b": 20})
    assert t.neighbours("b") == ("a", "c") and t.neighbours("a") == ("b",) and t.neighbours("c") == ("b",)
    t.add("d", 20)  # shares b's instant: no order between them
    assert t.neighbours("b") == ("a",) and t.neighbours("d") == ("c",)
    t.remove("d")
    t.remove("missing")
    assert t.neighbours("b") == ("a", "c") and t.neighbours("unknown") == ()
    t.add("b", 40)  # a record moved in time is re-placed, not duplicated
    assert len(t) == 3 and t.neighbours("c") == ("a", "b")
    same = Timeline({f"r{i}": 7 for i in range(5)})  # a batch captured at one instant has no order
    assert all(same.neighbours(f"r{i}") == () for i in range(5))


def _ranked(n: int) -> list[tuple[str, float]]:
    return [(f"r{i:02d}", 1.0 - i / 100) for i in range(n)]


def test_constant_features_leave_the_ranking_bit_for_bit() -> None:
    ranked = _ranked(40)
    facts = {rid: HeadFacts(frozenset({"Ann"}), ()) for rid, _ in ranked}  # every head record by Ann
    assert rerank("What did Ann say?", ranked, facts, RerankConfig()) == ranked
    assert rerank("What did Ann say?", ranked, {}, RerankConfig()) == ranked
    assert rerank("q", ranked[:1], {}, RerankConfig()) == ranked[:1]


def test_the_named_speaker_rises_and_the_tail_stays() -> None:
    ranked = _ranked(40)
    caroline = HeadFacts(frozenset({"Caroline"}), ())
    facts = {"r05": caroline, "r07": caroline, "r09": caroline, "r35": caroline,
             "r02": HeadFacts(frozenset({"Vitamin D"}), ())}  # a topic line on one record
    out = rerank("When did Caroline take Vitamin D?", ranked, facts, RerankConfig(head=30))
    assert [rid for rid, _ in out[:3]] == ["r05", "r07", "r09"] and out[30:] == ranked[30:]  # r35: below the head
    assert sorted(rid for rid, _ in out[:30]) == [rid for rid, _ in ranked[:30]]
    values = features("When did Caroline take Vitamin D?", ranked[:30], facts, dict(ranked))
    assert values["speaker"][2] == 0.0  # named, but it labels one record: not a speaker
    two = {"r05": caroline, "r07": caroline}  # fewer than SPEAKER_MIN_RECORDS turns: no speaker either
    assert rerank("When did Caroline go?", ranked, two, RerankConfig(head=30)) == ranked
    off = RerankConfig(head=30, weights={"neighbour": 1.0, "speaker": 0.0})
    assert rerank("When did Caroline go?", ranked, facts, off) == ranked  # the weight is what moves it


def test_a_strong_neighbour_lifts_a_record() -> None:
    ranked = _ranked(30) + [("far", 0.2)]
    ann, bob = frozenset({"Ann"}), frozenset({"Bob"})
    # A dialogue (Ann and Bob) the query asks about (it names Ann, who says several things).
    facts = {"r20": HeadFacts(bob, ("r00",)), "r21": HeadFacts(bob, ("far",)),
             "r22": HeadFacts(frozenset(), ("r00",)),
             "r25": HeadFacts(ann), "r26": HeadFacts(ann), "r27": HeadFacts(ann)}
    out = [rid for rid, _ in rerank("What did Ann say?", ranked, facts, RerankConfig())]
    assert out.index("r20") < out.index("r21")  # any neighbour beats none; the stronger more
    values = features("What did Ann say?", ranked[:30], facts, dict(ranked))
    assert values["neighbour"][20] == 1.0 and values["neighbour"][21] == 0.2
    assert values["neighbour"][22] == 0.0  # not a conversation turn: its neighbours do not count
    # The same turns for a query naming nobody, or with one speaker only: no neighbour counts.
    assert set(features("anything", ranked[:30], facts, dict(ranked))["neighbour"]) == {0.0}
    monologue = {rid: HeadFacts(ann, f.neighbours) for rid, f in facts.items() if f.labels}
    assert set(features("What did Ann say?", ranked[:30], monologue, dict(ranked))["neighbour"]) == {0.0}


def test_order_equals_the_z_scored_sum_the_study_ranks_by() -> None:
    """fused + σ·Σ w·z(f) orders as z(fused) + Σ w·z(f) does (studies/rerank_study.py's form)."""
    rng = random.Random(7)
    cfg = RerankConfig()
    for _ in range(50):
        ranked = sorted(((f"r{i:02d}", rng.random()) for i in range(30)), key=lambda h: (-h[1], h[0]))
        ids = [rid for rid, _ in ranked]
        facts = {rid: HeadFacts(frozenset({"Ann"}) if rng.random() < 0.3 else frozenset(),
                                tuple(rng.sample(ids, 1))) for rid in ids}
        values = features("Ann?", ranked, facts, dict(ranked))

        def z(xs: list[float]) -> list[float]:
            m = sum(xs) / len(xs)
            sd = (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5
            return [(x - m) / sd if sd else 0.0 for x in xs]

        zf = z([s for _, s in ranked])
        total = [zf[i] + sum(cfg.weights[n] * z(values[n])[i] for n in FEATURES) for i in range(30)]
        expect = [ids[i] for i in sorted(range(30), key=lambda i: (-round(total[i], 9), ids[i]))]
        assert [rid for rid, _ in rerank("Ann?", ranked, facts, cfg)] == expect


def test_the_receipt_names_head_and_weights() -> None:
    assert RerankConfig().describe() == {"head": 100, "weights": {"neighbour": 1.0, "speaker": 2.0},
                                         "turn_types": ["event:turn"]}
    with pytest.raises(KeyError):
        RerankConfig(weights={"speaker": 1.0}).describe()
