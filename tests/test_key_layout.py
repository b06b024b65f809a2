"""The data keys' fanned-out directory (issue 40 §3): ``keys/<2 hex>/<name>`` (store/core/crypto.py
``key_file``), and a store written in the flat layout before it (``keys/<name>``) still verifies as
it is, is fanned out at its next open (a crash in the middle loses no key), and forgets correctly.
Real engines and data dirs (no embedding model), the real ``admin verify``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.crypto import KEYS_DIR, KeyStore, fan_out, key_file, key_files
from engram_memory.store.core.engine import Engine
from engram_memory.store.maintenance.verify import verify_store
from tests.store_fixtures import T0, call, capture_args, ctx, forget_args

TEXTS = [f"Note {i} about the heron migration and ledger {i}" for i in range(12)]


def open_engine(path: Path) -> Engine:
    return Engine.open(EngineSettings(data_dir=path, semantic=False), clock=lambda: T0)


def build(path: Path) -> list[str]:
    """Twelve records and one candidate left pending; returns the record ids."""
    engine = open_engine(path)
    try:
        ids = []
        for i, text in enumerate(TEXTS):
            cap = call(engine, "capture", ctx(), capture_args(text, key=f"capture-key-{i:06d}"))
            adm = call(engine, "request_admission", ctx(), {"candidate_id": cap["candidate_id"],
                                                            "idempotency_key": f"admit-key-{i:07d}"})
            ids.append(adm["outcome"]["record_id"])
        call(engine, "capture", ctx(), capture_args("Still undecided about the osprey", key="pending-key-000001"))
        return ids
    finally:
        engine.close()


def flatten(keys: Path) -> list[str]:
    """Put every key file back in the flat layout of stores written before the fan-out."""
    names = []
    for path in key_files(keys):
        os.rename(path, keys / path.name)
        names.append(path.name)
    for directory in keys.iterdir():
        if directory.is_dir():
            directory.rmdir()
    return sorted(names)


def found(engine: Engine, text: str) -> list[str]:
    hits = call(engine, "search", ctx(), {"query": text, "purpose_ref": "purpose:test"})["records"]
    return [h["record"]["components"][0]["text"] for h in hits]


def test_keys_are_fanned_out_by_a_digest_of_their_name(tmp_path: Path) -> None:
    build(tmp_path / "s")
    keys = tmp_path / "s" / KEYS_DIR
    files = key_files(keys)
    assert len(files) == 13 and all(p.is_file() for p in files)  # 12 records, 1 pending candidate
    assert not [p for p in keys.iterdir() if p.is_file()]  # nothing flat
    for path in files:
        assert path == key_file(keys, "local:key-" + path.name) == key_file(keys, path.name)
        assert len(path.parent.name) == 2 and path.parent.parent == keys
    assert verify_store(tmp_path / "s").ok


def test_a_store_in_the_flat_layout_verifies_opens_fanned_out_and_forgets(tmp_path: Path) -> None:
    data = tmp_path / "old"
    ids = build(data)
    keys = data / KEYS_DIR
    names = flatten(keys)
    assert len(names) == 13 and sorted(p.name for p in keys.iterdir()) == names
    # verify reads the flat layout as it is, and changes nothing
    report = verify_store(data)
    assert report.ok, report.problems
    assert sorted(p.name for p in keys.iterdir()) == names
    # a crash in the middle of an earlier fan-out: some keys moved, one left in both places
    # (a stale flat copy: the fanned-out one wins), one .tmp a write left behind
    for name in names[:5]:
        target = key_file(keys, name)
        target.parent.mkdir(exist_ok=True)
        os.rename(keys / name, target)
    shutil.copyfile(key_file(keys, names[0]), keys / names[0])
    (keys / "deadbeef.tmp").write_bytes(b"\0" * 10)
    assert verify_store(data).ok is False  # the .tmp file is an unreferenced key file
    engine = open_engine(data)  # the next open fans out the rest
    try:
        assert not [p for p in keys.iterdir() if p.is_file()]
        assert sorted(p.name for p in key_files(keys)) == names
        assert found(engine, "heron migration ledger 3")[0] == TEXTS[3]
        # forget: the record's key file (fanned out now) is destroyed
        victim = key_file(keys, engine.db.one("SELECT key_ref FROM records WHERE record_id = ?", [ids[3]])[0])
        assert victim.is_file()
        out = call(engine, "forget", ctx(), forget_args(ids[3]))
        assert out["projection_invalidation"] == "complete"
        assert not victim.exists() and len(key_files(keys)) == 12
        assert TEXTS[3] not in found(engine, "heron migration ledger 3")
    finally:
        engine.close()
    report = verify_store(data)
    assert report.ok, report.problems
    assert fan_out(keys) == 0  # idempotent: nothing left to move


def test_a_rotation_staged_on_a_flat_store_finishes_into_the_fan_out(tmp_path: Path) -> None:
    data = tmp_path / "rot"
    build(data)
    keys = data / KEYS_DIR
    names = flatten(keys)
    KeyStore(data, migrate=False).stage_rotation(data)  # committed, then a crash before it moved the keys
    engine = open_engine(data)  # fans out, then rolls the rotation forward over the fanned-out files
    try:
        assert not [p for p in keys.iterdir() if p.is_file()]
        assert sorted(p.name for p in key_files(keys)) == names
        assert found(engine, "heron migration ledger 7")[0] == TEXTS[7]
    finally:
        engine.close()
    assert verify_store(data).ok
