"""Admissions answer before their projection updates; those follow in groups (store/core/projector.py).

What must hold whatever the grouping's timing: a read right after an admission sees it in both
channels, with the same bytes as a store that projected every record before answering; a forget
that comes before the group purges it anyway; a process that dies with admissions waiting comes
back with every one of them searchable; a clean close leaves nothing to rebuild."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from engram_memory.models.canonical import canonical_bytes
from engram_memory.store.core import projector
from engram_memory.store.core.engine import Engine
from tests.retrieval_fixtures import disk_files
from tests.store_fixtures import admit_texts, call, ctx, forget_args
from tests.test_engine_hybrid import DOCS, HYBRID, open_engine, search

QUERIES = ["feline resting", "reporting database", "tax deadline", "release schedule"]


def admit_all(engine: Engine, texts: list[str]) -> list[str]:
    return admit_texts(engine, texts)


def answers(engine: Engine) -> list[bytes]:
    return [canonical_bytes(search(engine, q, capability_policy=HYBRID)) for q in QUERIES]


@pytest.mark.parametrize("background", [False, True], ids=["held", "free"])
def test_a_search_right_after_admissions_sees_them_as_a_batch_built_store_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: bool) -> None:
    if not background:  # the group never closes by itself: the search must project it
        monkeypatch.setattr(projector, "QUIET_S", 3600.0)
        monkeypatch.setattr(projector, "MAX_WAIT_S", 3600.0)
    grouped = open_engine(tmp_path / "grouped")
    batched = open_engine(tmp_path / "batched")
    try:
        ids = admit_all(grouped, DOCS)
        assert grouped._projector is not None
        if not background:
            assert grouped._projector.waiting()  # nothing projected yet
        first = answers(grouped)  # no wait: the search projects what waits, inline
        assert not grouped._projector.waiting()
        with batched.batch():  # every projection applied together, before any read
            admit_all(batched, DOCS)
        assert first == answers(batched)
        top = search(grouped, "feline resting", capability_policy=HYBRID)["records"]
        assert {p["record"]["record_id"] for p in top[:2]} == {ids[0], ids[3]}  # the semantic channel has them
    finally:
        grouped.close()
        batched.close()


def test_the_background_thread_projects_a_group_without_any_read(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "d")
    try:
        admit_all(engine, DOCS)
        deadline = time.monotonic() + 30
        while engine._projector.waiting() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not engine._projector.waiting()
        scope = ctx().scope_ref
        assert engine.projections.lexical(scope).cursor == str(engine.db.projection_cursor(scope))
        assert engine.db.embedding_count(None) == len(DOCS)  # embedded by the group, no read asked
    finally:
        engine.close()


def test_a_forget_before_the_group_lands_leaves_nothing_behind(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "d")
    secret_word = b"zorblaxquintessa"
    try:
        ids = admit_all(engine, [*DOCS, "The zorblaxquintessa migration note."])
        out = call(engine, "forget", ctx(), forget_args(ids[-1]))
        assert out["projection_invalidation"] == "complete"
        assert search(engine, "zorblaxquintessa")["records"] == []
        assert engine.embedding_count(ids[-1]) == 0
    finally:
        engine.close()
    assert not any(secret_word in data for _, data in disk_files(tmp_path / "d" / "projections"))


CRASH = """
import os, sys
from pathlib import Path
import engram_memory.store.core.projector as projector
projector.QUIET_S = projector.MAX_WAIT_S = 3600.0  # the group never closes before the process dies
from tests.test_projector import admit_all
from tests.test_engine_hybrid import DOCS, open_engine
engine = open_engine(Path(sys.argv[1]))
admit_all(engine, DOCS)
assert engine._projector.waiting()
os._exit(0)  # no close: the admissions' projection updates die with the process
"""


def test_admissions_waiting_when_the_process_dies_are_searchable_after_restart(tmp_path: Path) -> None:
    data = tmp_path / "d"
    subprocess.run([sys.executable, "-c", CRASH, str(data)], check=True, timeout=300,
                   cwd=Path(__file__).resolve().parent.parent)
    engine = open_engine(data)
    try:
        scope = ctx().scope_ref
        assert scope in engine._stale  # the lexical projection lags the journal: rebuilt before use
        value = search(engine, "feline resting", capability_policy=HYBRID)
        assert len(value["records"]) >= 2
        assert engine.projections.lexical(scope).count() == len(DOCS)
        assert engine.projections.vectors(scope).count() == len(DOCS)
    finally:
        engine.close()


def test_a_clean_close_projects_what_waits(tmp_path: Path) -> None:
    data = tmp_path / "d"
    engine = open_engine(data)
    admit_all(engine, DOCS)
    engine.close()
    engine = open_engine(data)
    try:
        scope = ctx().scope_ref
        assert scope not in engine._stale
        assert engine.projections.lexical(scope).count() == len(DOCS)
    finally:
        engine.close()
