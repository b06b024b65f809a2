"""The embedder's forward pass on ONNX Runtime, its graph assembled from the model's weights without
torch (retrieval/onnx_graph.py): the packaged model's vectors as sentence-transformers computes them on
torch (the reference runtime, installed in CI by the `torch` extra), a graph cache that repairs itself,
and a serving process without torch."""

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

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SCIFACT = DATA / "scifact"
# The development collections whose queries and documents the torch-free vectors are compared on.
DEVELOPMENT = ("scifact", "cranfield", "medline", "locomo/locomo-26")
TEXTS = ["the cat sat on the mat", "a kitten rests on a rug", "quarterly tax filing deadlines",
         "Ünïcödé façade naïve café", "x" * 3000, ""]


def queries(n: int = 60) -> list[str]:
    path = SCIFACT / "queries.jsonl"
    if not path.exists():  # beside the checkout in CI and sessions, as for the other SciFact tests
        pytest.skip(f"{path} is missing (the development collections sit in ../shared/data)")
    with path.open() as fh:
        return [json.loads(line)["text"] for _, line in zip(range(n), fh, strict=False)]


def development_texts(per_file: int = 25) -> list[str]:
    """The first queries and documents of each development collection (title + text, as ingested)."""
    texts: list[str] = []
    for name in DEVELOPMENT:
        for file, field in (("queries.jsonl", "text"), ("corpus.jsonl", "doc")):
            path = DATA / name / file
            if not path.exists():
                pytest.skip(f"{path} is missing (the development collections sit in ../shared/data)")
            with path.open() as fh:
                for _, line in zip(range(per_file), fh, strict=False):
                    row = json.loads(line)
                    texts.append(row["text"] if field == "text" else f"{row.get('title', '')}\n{row['text']}".strip())
    return texts


def test_onnx_vectors_equal_sentence_transformers_on_torch(real_embedder: Embedder) -> None:  # noqa: F811
    assert real_embedder.runtime == "onnxruntime-1.32.0/fp32"
    torch_embedder = Embedder(runtime="torch").start()
    assert torch_embedder.wait(300), torch_embedder.error
    assert torch_embedder.runtime is not None and torch_embedder.runtime.startswith("torch-")
    texts = TEXTS + development_texts()
    single = np.vstack([real_embedder.encode_query(t) for t in texts])
    batch = real_embedder.encode(texts)
    reference = torch_embedder.encode(texts)
    # The bound is 1e-5 per component; measured 1.5e-7 over these 206 texts (fp32 rounding).
    assert np.abs(single - reference).max() < 1e-5
    assert np.abs(batch - reference).max() < 1e-5
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


def test_a_missing_corrupt_or_outdated_graph_is_rebuilt(tmp_path: Path) -> None:
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
    # A graph an older builder wrote (here: the manifest says so) is assembled again.
    (onnx.parent / MANIFEST).write_text(json.dumps({**manifest, "builder": "bert-graph/0"}))
    before = onnx.stat().st_mtime_ns
    assert ensure_onnx(model, digest, tmp_path) == onnx and onnx.stat().st_mtime_ns != before
    assert json.loads((onnx.parent / MANIFEST).read_text())["builder"] == manifest["builder"]
    onnx.unlink()
    e = Embedder(cache_dir=tmp_path).start()  # the file is gone: assembled again, never a crash
    assert e.wait(300) and e.runtime == "onnxruntime-1.32.0/fp32"
    assert onnx.exists()


def test_the_graph_is_assembled_without_torch(tmp_path: Path) -> None:
    """An empty graph cache: the process assembles the graph and encodes, and never imports torch,
    transformers or sentence-transformers (all installed here, so an import would show)."""
    code = ("import sys; from engram_memory.retrieval.embedder import Embedder; e = Embedder().start(); "
            "assert e.wait(300), e.error; e.encode_query('hello'); "
            "print(e.runtime, *(m in sys.modules for m in ('torch', 'transformers', 'sentence_transformers')))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "ENGRAM_MODEL_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["onnxruntime-1.32.0/fp32", "False", "False", "False"]
    assert [p.name for p in tmp_path.glob("*/*")] and all(p.is_file() for p in tmp_path.glob("*/model.onnx"))


def test_a_model_the_builder_cannot_express_is_named(tmp_path: Path) -> None:
    """Another architecture: ONNX is unavailable with a line naming it (the embedder then runs the
    model on torch when the `torch` extra is installed, else fails naming the extra)."""
    model = packaged_model_path()
    assert model is not None
    for item in model.iterdir():
        if item.name != "config.json":
            (tmp_path / item.name).symlink_to(item)
    config = json.loads((model / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    with pytest.raises(OnnxUnavailable, match="architecture 'gpt2' is not one the ONNX builder assembles"):
        ensure_onnx(tmp_path, "sha256:" + "0" * 64, tmp_path / "cache")
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(OnnxUnavailable, match="activation 'relu'"):
        ensure_onnx(tmp_path, "sha256:" + "1" * 64, tmp_path / "cache")


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


def test_the_graph_is_valid_onnx_written_with_onnx_s_own_schema(tmp_path: Path) -> None:
    """The schema we write with is byte for byte the one the onnx package ships, and the file the builder
    writes passes onnx's full checker (shape inference included)."""
    import onnx
    import onnx.onnx_ml_pb2

    from engram_memory.retrieval.onnx_graph import build
    from engram_memory.retrieval.onnx_proto import SCHEMA

    assert SCHEMA.read_bytes() == onnx.onnx_ml_pb2.DESCRIPTOR.serialized_pb
    model = packaged_model_path()
    assert model is not None
    from engram_memory.retrieval.onnx_graph import DATA_FILE

    built = build(model)
    path = tmp_path / "model.onnx"
    path.write_bytes(built.model)
    (tmp_path / DATA_FILE).write_bytes(b"".join(built.data))  # the weights, as ONNX external data
    onnx.checker.check_model(str(path), full_check=True)
    loaded = onnx.load(str(path))  # reads the external data back
    assert sum(t.ByteSize() for t in loaded.graph.initializer) > 90_000_000
    assert [i.name for i in loaded.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert loaded.opset_import[0].version == 17


def _q4_table(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A table as ggml's Q4_0 dequantises one: per 32 values an fp16 scale (either sign, some zero)
    times integers in [-8, 7], the block's largest magnitude at -8."""
    q = rng.integers(-8, 8, size=(rows, cols // 32, 32)).astype(np.float32)
    q[..., 0] = -8
    d = rng.normal(0, 0.02, size=(rows, cols // 32)).astype(np.float16).astype(np.float32)
    d[0, :2] = 0.0  # blocks of zeros, one of them with negative zeros
    table = q * d[..., None]
    return table.reshape(rows, cols)


def test_a_4bit_word_table_is_kept_as_4bit_blocks_exactly_or_not_at_all() -> None:
    """block_int4 gives back int8 values and fp16 scales whose float32 products are the table bit for
    bit (zeros' signs included), and declines anything else: a value one ulp off, real fp32 weights."""
    from safetensors.numpy import load_file

    from engram_memory.retrieval.onnx_graph import block_int4

    rng = np.random.default_rng(34)
    table = _q4_table(rng, 300, 64)
    assert np.signbit(table[0, :64]).any() and not table[0, :64].any()
    compact = block_int4(table)
    assert compact is not None
    q, d = compact
    assert q.dtype == np.int8 and d.dtype == np.float16 and q.min() >= -8 and q.max() <= 7
    back = (q.reshape(300, 2, 32).astype(np.float32) * d.astype(np.float32)[..., None]).reshape(300, 64)
    assert np.array_equal(back.view(np.uint32), table.view(np.uint32))
    off = table.copy()
    off[299, 5] = np.nextafter(off[299, 5], np.float32(1))
    assert block_int4(off) is None
    model = packaged_model_path()
    assert model is not None
    assert block_int4(load_file(str(model / "model.safetensors"))["embeddings.word_embeddings.weight"]) is None
