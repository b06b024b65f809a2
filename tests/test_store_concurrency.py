"""Reads run together, writes alone; searches under concurrent writes stay consistent."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.rwlock import RWLock
from tests.store_fixtures import PURPOSE, T0, admission_args, call, capture_args, ctx, forget_args


def test_readers_overlap() -> None:
    lock = RWLock()
    both_inside = threading.Barrier(2, timeout=5)  # breaks (fails) unless two readers are inside at once

    def reader() -> None:
        with lock.read():
            both_inside.wait()

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not both_inside.broken


def test_a_writer_excludes_readers_and_waits_for_them() -> None:
    lock = RWLock()
    events: list[str] = []
    reader_in = threading.Event()

    def reader() -> None:
        with lock.read():
            reader_in.set()
            time.sleep(0.2)
            events.append("reader out")

    def writer() -> None:
        reader_in.wait(5)
        with lock.write():
            events.append("writer in")
            with lock.write():  # re-entrant for its owner
                with lock.read():  # and the owner may read its own state
                    events.append("writer nested")

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert events == ["reader out", "writer in", "writer nested"]


def test_searches_during_writes_never_see_a_forgotten_record(tmp_path: Path) -> None:
    engine = Engine.open(EngineSettings(data_dir=tmp_path / "data", semantic=False), clock=lambda: T0)
    c = ctx()
    try:
        ids = []
        for i in range(20):
            cap = call(engine, "capture", c, capture_args(f"shared topic record number {i}", key=f"capture-k-{i:08d}"))
            out = call(engine, "request_admission", c, admission_args(cap["candidate_id"], key=f"admit-k-{i:010d}"))
            ids.append(out["outcome"]["record_id"])
        forgotten: set[str] = set()
        errors: list[BaseException] = []
        stop = threading.Event()

        def searcher() -> None:
            try:
                while not stop.is_set():
                    gone_before = set(forgotten)  # forgotten before this search started
                    value = call(engine, "search", c, {"query": "shared topic record", "purpose_ref": PURPOSE,
                                                       "limit": 50})
                    shown = {p["record"]["record_id"] for p in value["records"]}
                    assert not shown & gone_before, "a forgotten record was returned"
                    assert value["rank_receipt"]["candidate_count"] == len(shown)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=searcher) for _ in range(4)]
        for t in threads:
            t.start()
        for i, rid in enumerate(ids[:10]):
            call(engine, "forget", c, forget_args(rid, key=f"forget-k-{i:09d}"))
            forgotten.add(rid)
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, errors[0]
        final = call(engine, "search", c, {"query": "shared topic record", "purpose_ref": PURPOSE, "limit": 50})
        assert {p["record"]["record_id"] for p in final["records"]} == set(ids[10:])
    finally:
        engine.close()
