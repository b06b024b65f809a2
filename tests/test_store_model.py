"""A store remembers its embedding model (store/core/embedding_model.py), on both backends: a new store
records the model it is created with (name, then id and digest once loaded), a later open without
a model uses it, another model named is refused, and a switch (rebuild-index) records the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_memory.models.settings import DEFAULT_MODEL, EngineSettings
from engram_memory.retrieval.embedder import PACKAGED_MODEL_ID
from engram_memory.store.core.embedding_model import ModelMismatch
from engram_memory.store.core.engine import Engine
from tests.conftest import Backend


def settings(data: Path, backend: Backend, **kw) -> EngineSettings:
    return EngineSettings(data_dir=data, store=backend.store, master_key_file=backend.master_key_file, **kw)


def test_a_store_records_its_model_and_refuses_another(tmp_path: Path, backend: Backend) -> None:
    engine = Engine.open(settings(tmp_path / "a", backend))  # no model named: a new store takes the default
    try:
        assert engine.config.model == DEFAULT_MODEL and engine.wait_semantic(300) and engine.embedder is not None
        recorded = json.loads(engine.db.embedding_model() or "{}")
        assert recorded == {"model": DEFAULT_MODEL, "model_id": PACKAGED_MODEL_ID,
                            "model_digest": engine.embedder.model_digest}
    finally:
        engine.close()
    # another model named is refused before anything loads (the store's vectors are the default's)
    with pytest.raises(ModelMismatch) as refused:
        Engine.open(settings(tmp_path / "a", backend, model="multilingual-e5-small"))
    assert str(refused.value).endswith(f"was created with --model {DEFAULT_MODEL}, not --model multilingual-e5-small:"
                                       " omit the option to use its model, or switch it with: engram-memory"
                                       " rebuild-index --model multilingual-e5-small (re-embeds every record)")
    # the same model named, or none, opens it; a switch records the new model (no model loaded here)
    for kw in ({"model": DEFAULT_MODEL}, {}):
        Engine.open(settings(tmp_path / "a", backend, semantic=False, **kw)).close()
    engine = Engine.open(settings(tmp_path / "a", backend, semantic=False, model="multilingual-e5-small"),
                         switch_model=True)
    try:
        assert engine.config.model == "multilingual-e5-small"
        assert json.loads(engine.db.embedding_model() or "{}") == {"model": "multilingual-e5-small"}
    finally:
        engine.close()


def test_a_store_without_a_record_records_the_model_it_is_opened_with(tmp_path: Path) -> None:
    """A store of an older version recorded nothing: its next open records the model it uses."""
    Engine.open(EngineSettings(data_dir=tmp_path, semantic=False)).close()  # no model loaded: nothing recorded
    engine = Engine.open(EngineSettings(data_dir=tmp_path, semantic=False))
    try:
        assert engine.db.embedding_model() is None
    finally:
        engine.close()
    engine = Engine.open(EngineSettings(data_dir=tmp_path))
    try:
        assert engine.wait_semantic(300)
        assert json.loads(engine.db.embedding_model() or "{}")["model"] == DEFAULT_MODEL
    finally:
        engine.close()


def test_an_older_store_with_vectors_records_only_a_named_model(tmp_path: Path) -> None:
    """An older store holding vectors but no record: opened without --model it is served by the default
    and records nothing (it may be another model's store); opened with a model named, it records it."""
    import duckdb

    from tests.store_fixtures import admit_texts

    engine = Engine.open(EngineSettings(data_dir=tmp_path))
    try:
        assert engine.wait_semantic(300)
        admit_texts(engine, ["the release freezes schema changes on Fridays"], settle_each=True)
        assert engine.db.embedding_count() > 0
    finally:
        engine.close()
    with duckdb.connect(str(tmp_path / "engram.duckdb")) as con:  # as an older version left it
        con.execute("DELETE FROM meta WHERE key = 'embedding_model'")
    engine = Engine.open(EngineSettings(data_dir=tmp_path))
    try:
        assert engine.wait_semantic(300)
        assert engine.db.embedding_model() is None
    finally:
        engine.close()
    engine = Engine.open(EngineSettings(data_dir=tmp_path, model=DEFAULT_MODEL))
    try:
        # The model loads on a background thread that then uses the store's connection: this test reads
        # that connection directly (an engine call would take the engine's lock), so it waits first.
        assert engine.wait_semantic(300)
        assert json.loads(engine.db.embedding_model() or "{}")["model"] == DEFAULT_MODEL
    finally:
        engine.close()
