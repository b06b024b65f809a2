"""The embedder's forward pass on ONNX Runtime: the packaged model's vectors as sentence-transformers
computes them on torch, an export cache that repairs itself, and a serving process without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engram_memory.retrieval.embedder import Embedder, packaged_model_path
from engram_memory.retrieval.onnx_runtime import MANIFEST, ONNX_FILE, OnnxUnavailable, Pipeline, ensure_onnx
from tests.retrieval_fixtures import real_embedder  # noqa: F401  (session fixture)

SCIFACT = Path(__file__).resolve().parents[2] / "shared" / "data" / "scifact"
TEXTS = ["the cat sat on the mat", "a kitten rests on a rug", "quarterly tax filing deadlines",
         "Ünïcödé façade naïve café", "x" * 3000, ""]


def queries(n: int = 60) -> list[str]:
    path = SCIFACT / "queries.jsonl"
    if not path.exists():  # beside the checkout in CI and sessions, as for the other SciFact tests
        pytest.skip(f"{path} is missing (the development collections sit in ../shared/data)")
    with path.open() as fh:
        return [json.loads(line)["text"] for _, line in zip(range(n), fh, strict=False)]


def test_onnx_vectors_equal_sentence_transformers_on_torch(real_embedder: Embedder) -> None:  # noqa: F811
    assert real_embedder.runtime == "onnxruntime-1.32.0/fp32"
    torch_embedder = Embedder(runtime="torch").start()
    assert torch_embedder.wait(300), torch_embedder.error
    assert torch_embedder.runtime is not None and torch_embedder.runtime.startswith("torch-")
    texts = TEXTS + queries()
    single = np.vstack([real_embedder.encode_query(t) for t in texts])
    batch = real_embedder.encode(texts)
    reference = torch_embedder.encode(texts)
    # Measured: 2.0e-7 per component on SciFact queries and abstracts (fp32 rounding, not drift).
    assert np.abs(single - reference).max() < 2e-6
    assert np.abs(batch - reference).max() < 2e-6
    assert float((single * reference).sum(axis=1).min()) > 0.99999
    # Long texts are cut where sentence-transformers cuts them (max_seq_length 256 tokens).
    assert np.allclose(real_embedder.encode_query("x" * 3000), real_embedder.encode_query("x" * 6000))


def test_the_pipeline_is_read_from_the_model_files(tmp_path: Path) -> None:
    model = packaged_model_path()
    assert model is not None
    assert Pipeline.read(model) == Pipeline(max_seq_length=256, pooling="mean")
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling"):
        (tmp_path / name).symlink_to(model / name)
    dense = json.loads((model / "modules.json").read_text()) + [
        {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]
    (tmp_path / "modules.json").unlink()
    (tmp_path / "modules.json").write_text(json.dumps(dense))
    with pytest.raises(OnnxUnavailable, match="module"):
        Pipeline.read(tmp_path)  # a Dense layer is not reproduced: such a model runs on torch


def test_a_missing_or_corrupt_export_is_rebuilt(tmp_path: Path) -> None:
    model = packaged_model_path()
    assert model is not None
    digest = Embedder().model_digest
    assert digest is not None
    onnx = ensure_onnx(model, digest, tmp_path)
    manifest = json.loads((onnx.parent / MANIFEST).read_text())
    assert onnx.name == ONNX_FILE and manifest["model_digest"] == digest
    first = onnx.stat().st_mtime_ns
    assert ensure_onnx(model, digest, tmp_path) == onnx and onnx.stat().st_mtime_ns == first  # cached
    with onnx.open("r+b") as fh:  # a flipped byte in the middle of the weights
        fh.seek(onnx.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    rebuilt = ensure_onnx(model, digest, tmp_path)
    assert json.loads((rebuilt.parent / MANIFEST).read_text())["onnx_sha256"] == manifest["onnx_sha256"]
    onnx.unlink()
    e = Embedder(cache_dir=tmp_path).start()  # the file is gone: exported again, never a crash
    assert e.wait(300) and e.runtime == "onnxruntime-1.32.0/fp32"
    assert onnx.exists()


def test_a_serving_process_never_imports_torch_once_exported(real_embedder: Embedder) -> None:  # noqa: F811
    code = ("import sys; from engram_memory.retrieval.embedder import Embedder; e = Embedder().start(); "
            "assert e.wait(300), e.error; e.encode_query('hello'); print(e.runtime, 'torch' in sys.modules)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["onnxruntime-1.32.0/fp32", "False"]


def test_a_document_batch_leaves_no_resident_memory_behind(real_embedder: Embedder) -> None:  # noqa: F811
    """Once its vectors are out, a batch's activations go back to the OS: with ONNX Runtime's arena
    (its default) this fails, the activations stay resident for good, and an idle server kept what
    its last ingest needed."""
    code = (
        "from engram_memory.retrieval.embedder import Embedder\n"
        "def rss():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) / 1024\n"
        "e = Embedder().start(); assert e.wait(300), e.error\n"
        "e.encode_query('warm'); before = rss()\n"
        "docs = [' '.join(f'protein{i} binds receptor{j} in cell line {i * j}' for j in range(40))\n"
        "        for i in range(32)]\n"
        "e.encode(docs); print(round(rss() - before))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) < 60  # MiB kept after the batch
