"""retrieval.embedder: the packaged MiniLM (real model, loaded once), failure modes, clean stdout."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engram_memory.retrieval import embedder as emb
from engram_memory.retrieval.embedder import (
    PACKAGED_MODEL_ID,
    Embedder,
    EmbedderUnavailable,
    compute_model_digest,
    packaged_model_path,
    shared_embedder,
)
from engram_memory.retrieval.fusion import rrf
from engram_memory.retrieval.lexical import LexicalDoc, LexicalIndex
from engram_memory.retrieval.vectors import VectorIndex
from tests.retrieval_fixtures import real_embedder  # noqa: F401  (session fixture)

CAT = "the cat sat on the mat"
KITTEN = "a kitten rests on a rug"
TAX = "quarterly tax filing deadlines"


def test_packaged_model_identity_before_any_load() -> None:
    e = Embedder()  # never started: identity comes from the files alone
    assert e.state == "idle" and not e.wait(0.01)
    assert e.model_path == packaged_model_path()
    assert e.model_id == PACKAGED_MODEL_ID
    assert e.dim == 384
    digest = e.model_digest
    assert digest is not None and digest.startswith("sha256:") and len(digest) == 71
    assert digest == e.model_digest == compute_model_digest(packaged_model_path())
    with pytest.raises(EmbedderUnavailable):
        e.encode(["x"])


def test_real_model_semantic_neighbours(real_embedder: Embedder) -> None:  # noqa: F811
    assert real_embedder.state == "ready" and real_embedder.dim == 384
    v = real_embedder.encode([CAT, KITTEN, TAX])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.2
    assert real_embedder.encode([]).shape == (0, 384)
    again = real_embedder.encode_query(CAT)
    assert np.allclose(again, v[0], atol=1e-5)
    assert np.array_equal(real_embedder.encode_query(CAT), again)  # same input, same bits
    assert real_embedder.encode(["\ud800 broken surrogate", ""]).shape == (2, 384)
    with pytest.raises(TypeError):
        real_embedder.encode(CAT)  # a bare string is not a batch


def test_shared_embedder_is_one_instance_per_path(real_embedder: Embedder) -> None:  # noqa: F811
    assert shared_embedder() is real_embedder
    assert shared_embedder(None).state == "ready"


def test_hybrid_channels_end_to_end(real_embedder: Embedder, tmp_path: Path) -> None:  # noqa: F811
    texts = {"mem_cat": CAT, "mem_tax": TAX, "mem_deploy": "deploys happen every weekday at noon"}
    lex = LexicalIndex.open(tmp_path / "lex")
    lex.upsert([LexicalDoc(rid, {"primary": t}) for rid, t in texts.items()])
    vec = VectorIndex.open(tmp_path / "vec", real_embedder.dim, hnsw_threshold=1000)
    vec.upsert(list(texts), real_embedder.encode(list(texts.values())))
    query = "kitten"
    channels = {"lexical": lex.search(query, 10), "semantic": vec.search(real_embedder.encode_query(query), 10)}
    assert channels["lexical"] == []  # no shared token: only the semantic channel can find it
    assert rrf(channels)[0][0] == "mem_cat"
    lex.close()


def test_missing_model_path_fails_fast(tmp_path: Path) -> None:
    e = Embedder(tmp_path / "no-such-model")
    t0 = time.monotonic()
    e.start()
    assert e.wait(10) is False
    assert time.monotonic() - t0 < 2.0
    assert e.state == "failed" and "does not exist" in (e.error or "")
    assert e.model_digest is None and e.dim is None
    with pytest.raises(EmbedderUnavailable):
        e.encode(["x"])
    e.start()  # idempotent: still failed, no second thread
    assert e.state == "failed"


def test_broken_model_dir_fails_without_network(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json")
    (broken / "modules.json").write_text("[]")
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    e = Embedder(broken).start()
    assert e.wait(60) is False and e.state == "failed"
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "modules.json").write_text("[]")
    e2 = Embedder(weightless).start()
    assert e2.wait(5) is False and "no model weights" in (e2.error or "")


def test_digest_covers_weights_tokenizer_and_config_only(tmp_path: Path) -> None:
    src = packaged_model_path()
    assert src is not None
    copy = tmp_path / "model"
    copy.mkdir()
    for name in ("config.json", "modules.json", "tokenizer.json", "vocab.txt", "README.md"):
        shutil.copy(src / name, copy / name)
    (copy / "data_config.json").write_text('{"training": "metadata"}')  # the Hub's, not shipped with ours
    (copy / "1_Pooling").mkdir()
    shutil.copy(src / "1_Pooling" / "config.json", copy / "1_Pooling" / "config.json")
    (copy / "model.safetensors").write_bytes(b"fake weights")
    e = Embedder(copy)
    first = e.model_digest
    assert e.model_id == PACKAGED_MODEL_ID  # from the model card's usage line
    assert e.dim == 384
    (copy / "README.md").write_text("docs do not change the vectors")
    (copy / "data_config.json").write_text("[]")
    assert compute_model_digest(copy) == first
    (copy / "model.safetensors").write_bytes(b"other weights")
    assert compute_model_digest(copy) != first
    (copy / "model.safetensors").write_bytes(b"fake weights")
    (copy / "1_Pooling" / "config.json").write_text("{}")
    assert compute_model_digest(copy) != first
    (copy / "README.md").unlink()
    assert Embedder(copy).model_id == "local:model"


class _FakeModel:
    def get_sentence_embedding_dimension(self) -> int:
        return 4

    def encode(self, items, **kw) -> np.ndarray:
        return np.tile(np.array([0.5, 0.5, 0.5, 0.5], np.float32), (len(items), 1))


def test_loader_output_never_reaches_stdout(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "modules.json").write_text("[]")
    (model_dir / "model.safetensors").write_bytes(b"w")
    release = threading.Event()

    def noisy_import(path: Path) -> _FakeModel:
        with emb.stdout_to_stderr_in_this_thread():
            print("noise from an import")  # what a chatty dependency would do
            release.wait(5)
            sys.stdout.write("more noise\n")
        return _FakeModel()

    monkeypatch.setattr(emb, "load_sentence_transformer", noisy_import)
    e = Embedder(model_dir).start()
    print("server response line")  # main thread: still on the real stdout while loading
    release.set()
    assert e.wait(5) and e.dim == 4
    out, err = capsys.readouterr()
    assert out == "server response line\n"
    assert "noise from an import" in err and "more noise" in err
    assert e.encode(["a", "b"]).shape == (2, 4)


def test_concurrent_query_encodes_give_the_serial_bits(real_embedder: Embedder) -> None:  # noqa: F811
    """Single-query encodes run without the batch lock: from four threads at once, every vector
    must be bit-identical to the one encoded alone (no tokenizer race, no shared state)."""
    queries = [f"how does protein {i} change cell growth" for i in range(24)]
    serial = {q: real_embedder.encode([q])[0] for q in queries}
    mismatched: list[str] = []
    errors: list[BaseException] = []

    def worker(chunk: list[str]) -> None:
        try:
            for q in chunk:
                if not np.array_equal(real_embedder.encode([q])[0], serial[q]):
                    mismatched.append(q)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(queries[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not mismatched


def test_a_query_encode_signals_when_the_model_runs(real_embedder: Embedder) -> None:  # noqa: F811
    """The search hands the GIL to its encode until the graph starts (store/core/engine.py); the
    signal comes from inside the encode, with the same vector as without it."""
    running = threading.Event()
    started_at: list[float] = []
    worker = threading.Thread(target=lambda: started_at.append(time.perf_counter()) or
                              real_embedder.encode(["a query about cells"], running=running))
    worker.start()
    assert running.wait(30)
    worker.join(30)
    assert started_at and not worker.is_alive()
    plain = real_embedder.encode(["a query about cells"])
    signalled = real_embedder.encode(["a query about cells"], running=threading.Event())
    assert plain.tobytes() == signalled.tobytes()
