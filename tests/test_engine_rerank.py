"""The hybrid's rerank stage through the real engine: speaker labels, event order, persistence."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from engram_memory.models.canonical import canonical_bytes
from engram_memory.store.core.engine import Engine
from tests.store_fixtures import RERANK, T0, admission_args, call, capture_args, ctx, forget_args
from tests.test_engine_hybrid import DOCS, HYBRID, open_engine, search

TURNS = [
    "Melanie: Thanks, Caroline! A support group sounds lovely, Caroline.",
    "Caroline: I went to a support group yesterday and it was so powerful.",
    "Melanie: The kids painted a sunrise by the lake last summer.",
    "Caroline: I chose the agency because they help LGBTQ+ folks with adoption.",
    "Melanie: What did you like most about the adoption agency?",
    "Caroline: They were inclusive and kind.",
]
SUPPORT = "When did Caroline go to the support group?"
AGENCY = "Why did Caroline choose the adoption agency?"


TURN = "event:turn"  # the default turn type (models/limits.py TURN_TYPES): the host says "a turn"


def converse(path: Path, texts: list[str] = TURNS, ordered: bool = True, type_ref: str | list[str] = TURN,
             **kw) -> tuple[Engine, list[str]]:
    """One record a minute (or every record at one instant), captured and admitted in order; each
    a conversation turn unless ``type_ref`` (one for all, or one per text) says otherwise."""
    engine = open_engine(path, **kw)
    ids = []
    kinds = type_ref if isinstance(type_ref, list) else [type_ref] * len(texts)
    for i, text in enumerate(texts):
        args = capture_args(text, key=f"capture-key-{i:06d}")
        args["payload"]["primary_event"]["at"] = T0 - 86_400_000 + (i * 60_000 if ordered else 0)
        args["payload"]["primary_event"]["type_ref"] = kinds[i]
        cap = call(engine, "capture", ctx(), args)
        out = call(engine, "request_admission", ctx(), admission_args(cap["candidate_id"], key=f"admit-key-{i:08d}"))
        ids.append(out["outcome"]["record_id"])
    return engine, ids


def order(value: dict, ids: list[str]) -> list[int]:
    return [ids.index(p["record"]["record_id"]) for p in value["records"]]


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Engine, list[str], Path]]:
    on_path = tmp_path_factory.mktemp("rerank-on")
    on, ids = converse(on_path)
    off, off_ids = converse(tmp_path_factory.mktemp("rerank-off"), rerank=False)
    assert off_ids == ids  # record ids derive from content: the same records in both stores
    yield on, off, ids, on_path
    on.close()
    off.close()


def test_the_named_speaker_outranks_a_turn_that_only_addresses_her(both) -> None:
    on, off, ids, _ = both
    assert order(search(off, SUPPORT, capability_policy=HYBRID), ids)[:2] == [1, 0]  # "Thanks, Caroline!" second
    got = search(on, SUPPORT, capability_policy=HYBRID)
    assert order(got, ids)[0] == 1 and order(got, ids).index(0) > 1  # the addressing turn drops below
    fusion = got["rank_receipt"]["fusion"]
    assert fusion["rerank"] == RERANK
    assert "rerank" not in search(off, SUPPORT, capability_policy=HYBRID)["rank_receipt"]["fusion"]
    scores = [p["score"] for p in got["records"]]
    assert scores == sorted(scores, reverse=True)  # a head this small is the whole ranking


def test_a_turn_rises_with_the_turn_before_it(both) -> None:
    """"They were inclusive and kind." shares no word with the question; its neighbour does."""
    on, off, ids, _ = both
    before, after = order(search(off, AGENCY, capability_policy=HYBRID), ids), order(
        search(on, AGENCY, capability_policy=HYBRID), ids)
    assert after[0] == 3 and after.index(5) < before.index(5)


def test_the_stage_survives_restart_and_a_store_from_before_the_column(both, tmp_path: Path) -> None:
    """event_at and the event type's keyed digest are read back from DuckDB (the type itself is
    never stored: issue 33); rows written before migrations 3 and 5 get them from their body."""
    _on, _off, _ids, _ = both
    engine, ids = converse(tmp_path)
    first = canonical_bytes(search(engine, AGENCY, capability_policy=HYBRID))
    engine.close()
    engine = open_engine(tmp_path)
    assert canonical_bytes(search(engine, AGENCY, capability_policy=HYBRID)) == first
    engine.close()
    with duckdb.connect(str(tmp_path / "engram.duckdb")) as con:
        assert con.execute("SELECT count(*) FROM records WHERE event_at IS NOT NULL").fetchone() == (len(TURNS),)
        kinds = con.execute("SELECT DISTINCT event_type, event_kind FROM records").fetchall()
        assert len(kinds) == 1 and kinds[0][0] is None and kinds[0][1].startswith("hmac-sha256:")
        con.execute("UPDATE records SET event_at = NULL, event_kind = NULL")
    engine = open_engine(tmp_path)
    try:
        assert canonical_bytes(search(engine, AGENCY, capability_policy=HYBRID)) == first
    finally:
        engine.close()


def test_a_forgotten_turn_leaves_the_timeline(tmp_path: Path) -> None:
    engine, ids = converse(tmp_path)
    try:
        before = order(search(engine, AGENCY, capability_policy=HYBRID), ids)
        call(engine, "forget", ctx(), forget_args(ids[4]))
        after = order(search(engine, AGENCY, capability_policy=HYBRID), ids)
        assert 4 in before and 4 not in after
        view = engine._view(ctx().scope_ref)
        assert ids[4] not in {r for rid in ids for r in view.timeline.neighbours(rid)}
        assert view.timeline.neighbours(ids[5]) == (ids[3],)  # the turn before the forgotten one
    finally:
        engine.close()


def test_documents_at_one_instant_rank_exactly_as_without_the_stage(tmp_path: Path) -> None:
    """No speaker label named, no event order: only the receipt's naming of the stage differs."""
    on, ids = converse(tmp_path / "on", DOCS, ordered=False)
    off, _ = converse(tmp_path / "off", DOCS, ordered=False, rerank=False)
    try:
        for query in ("feline resting", "tax filings in April", "release train"):
            a, b = search(on, query, capability_policy=HYBRID), search(off, query, capability_policy=HYBRID)
            assert [(p["record"]["record_id"], p["score"]) for p in a["records"]] == \
                   [(p["record"]["record_id"], p["score"]) for p in b["records"]]
            assert a["rank_receipt"]["ranked"] == b["rank_receipt"]["ranked"]
            assert a["rank_receipt"]["ordered_ids_digest"] == b["rank_receipt"]["ordered_ids_digest"]
    finally:
        on.close()
        off.close()


def test_pages_of_a_reranked_ranking_follow_it(both) -> None:
    """The cursor pins the reranked order: page after page gives exactly the one-page answer."""
    on, _off, ids, _ = both
    whole = search(on, AGENCY, capability_policy=HYBRID)
    seen, cursor = [], None
    while True:
        extra = {"page_cursor": cursor} if cursor else {}
        page = search(on, AGENCY, capability_policy=HYBRID, limit=2, **extra)
        seen += [(p["record"]["record_id"], p["score"], p["rank"]) for p in page["records"]]
        cursor = page.get("next_page_cursor")
        if cursor is None:
            break
    assert seen == [(p["record"]["record_id"], p["score"], p["rank"]) for p in whole["records"]]
    assert order(whole, ids)[0] == 3 and len(seen) == len(whole["records"]) > 2


def test_a_lexical_only_ranking_is_reranked_too(tmp_path: Path) -> None:
    """Without the model (or while it loads) the lexical_v1 ranking gets the same stage."""
    from engram_memory.models.settings import EngineSettings

    for rerank in (True, False):
        engine = Engine.open(EngineSettings(data_dir=tmp_path / str(rerank), semantic=False, rerank=rerank),
                             clock=lambda: T0)
        try:
            ids = []
            for i, text in enumerate(TURNS):
                args = capture_args(text, key=f"capture-key-{i:06d}")
                args["payload"]["primary_event"]["at"] = T0 - 86_400_000 + i * 60_000
                args["payload"]["primary_event"]["type_ref"] = TURN
                cap = call(engine, "capture", ctx(), args)
                out = call(engine, "request_admission", ctx(),
                           admission_args(cap["candidate_id"], key=f"admit-key-{i:08d}"))
                ids.append(out["outcome"]["record_id"])
            got = search(engine, SUPPORT)
            assert got["rank_receipt"]["profile"] == "lexical_v1"
            assert ("rerank" in got["rank_receipt"]["fusion"]) is rerank
            # BM25 alone puts "Thanks, Caroline! ... Caroline." second; the stage puts her own turns first
            assert order(got, ids)[:2] == ([1, 5] if rerank else [1, 0]), order(got, ids)
        finally:
            engine.close()


# ---- where the stage must stay out of the way (issue 24): exactly the fused ranking ------------

NOTES = [
    "Postgres: the primary runs on db-1 and the replica on db-2.",
    "Postgres: backups are taken nightly with pg_basebackup.",
    "Postgres: connection pooling goes through PgBouncer.",
    "We run Postgres version 16 since the upgrade last spring.",
    "Decision: we keep the billing service on Python 3.11 for now.",
    "Decision: the search index is rebuilt every Sunday night.",
    "Decision: incidents are reviewed on Mondays.",
    "Context: the billing service talks to Postgres through an ORM.",
    "Context: the team moved to a trunk-based workflow in May.",
    "Context: on-call rotates weekly.",
]


def assert_as_fused(on: Engine, off: Engine, queries: list[str]) -> None:
    for query in queries:
        a, b = search(on, query, capability_policy=HYBRID), search(off, query, capability_policy=HYBRID)
        assert a["rank_receipt"]["fusion"]["rerank"] == RERANK  # the stage ran
        assert [(p["record"]["record_id"], p["score"]) for p in a["records"]] == \
               [(p["record"]["record_id"], p["score"]) for p in b["records"]], query
        assert a["rank_receipt"]["ranked"] == b["rank_receipt"]["ranked"], query


@pytest.mark.parametrize("case", ["topic notes", "turns and notes", "another case", "one speaker"])
def test_the_stage_leaves_what_is_not_a_dialogue_exactly_as_fused(tmp_path: Path, case: str) -> None:
    """Topic-labelled notes captured a minute apart, a conversation beside them, a speaker's name
    in another case, and one person's turns: each ranks exactly as with the stage off."""
    if case == "topic notes":
        texts, kinds = NOTES, "event:decided"
        queries = ["Which Postgres version do we run?", "What Decision did we take on billing?",
                   "Context on the billing service"]
    elif case == "turns and notes":
        texts = TURNS + NOTES
        kinds = [TURN] * len(TURNS) + ["event:decided"] * len(NOTES)
        queries = ["Which Postgres version do we run?", "What Decision did we take about the search index?"]
    elif case == "another case":
        texts, kinds = TURNS, TURN
        queries = ["when did caroline go to the support group?", "why did CAROLINE choose the adoption agency?"]
    else:
        texts = ["Caroline: " + t.split(": ", 1)[1] for t in TURNS]
        kinds = TURN
        queries = [SUPPORT, AGENCY]
    on, _ = converse(tmp_path / "on", texts, type_ref=kinds)
    off, _ = converse(tmp_path / "off", texts, type_ref=kinds, rerank=False)
    try:
        assert_as_fused(on, off, queries)
    finally:
        on.close()
        off.close()


def test_the_issue_example_keeps_the_answer_first(tmp_path: Path) -> None:
    """Three notes opening "Postgres:" moved the upgrade note from rank 1 to rank 4 when the stage
    read any "Name:" line as a speaker; notes are not turns now. The same text captured as turns
    (the host says so) does move: the test of the guard can fail."""
    notes, ids = converse(tmp_path / "notes", NOTES[:4], type_ref="event:decided")
    fused, _ = converse(tmp_path / "fused", NOTES[:4], type_ref="event:decided", rerank=False)
    turns, turn_ids = converse(tmp_path / "turns", NOTES[:4], type_ref=TURN)
    try:
        query = "Which Postgres version do we run?"
        assert order(search(fused, query, capability_policy=HYBRID), ids)[0] == 3  # the answer leads
        assert order(search(notes, query, capability_policy=HYBRID), ids)[0] == 3  # and stays first
        assert order(search(turns, query, capability_policy=HYBRID), turn_ids)[0] != 3
    finally:
        for engine in (notes, fused, turns):
            engine.close()


def test_a_host_names_its_own_turn_types(tmp_path: Path) -> None:
    """turn_types is a setting: records typed "event:chat-message" are turns only where the host says
    so, and the receipt names the turn types the order was derived with."""
    custom, ids = converse(tmp_path / "custom", type_ref="event:chat-message", turn_types=("event:chat-message",))
    default, _ = converse(tmp_path / "default", type_ref="event:chat-message")
    try:
        got = search(custom, SUPPORT, capability_policy=HYBRID)
        assert got["rank_receipt"]["fusion"]["rerank"]["turn_types"] == ["event:chat-message"]
        assert order(got, ids)[0] == 1 and order(got, ids).index(0) > 1  # reranked as turns
        plain = search(default, SUPPORT, capability_policy=HYBRID)
        assert order(plain, ids)[:2] == [1, 0]  # not turns under the default setting: as fused
    finally:
        custom.close()
        default.close()
