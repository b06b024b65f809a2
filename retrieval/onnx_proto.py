"""The ONNX file format's messages, from its schema, without the ``onnx`` package.

An ONNX model is a protobuf ``ModelProto`` (onnx/onnx-ml.proto). ``onnx-ml.descriptor.pb`` beside this
module is that schema as protobuf's serialized ``FileDescriptorProto``, exactly as ``onnx`` 1.23.2 ships
it in ``onnx/onnx_ml_pb2.py`` (Apache-2.0; tests/test_retrieval_onnx.py checks the bytes against an
installed ``onnx``). Loaded into a private descriptor pool, it gives the message classes through
``protobuf`` — which ONNX Runtime already requires — so the default install does not carry ``onnx``
(31 MB, most of it backend test data) to write one file.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parent / "onnx-ml.descriptor.pb"
# TensorProto.DataType and AttributeProto.AttributeType values the graph builder uses.
FLOAT, INT8, INT64, FLOAT16 = 1, 3, 7, 10  # TensorProto.DataType
EXTERNAL = 1  # TensorProto.DataLocation: the tensor's bytes are in another file (external_data)
ATTR_FLOAT, ATTR_INT, ATTR_INTS = 1, 2, 7


@cache
def message(name: str) -> Any:
    """The message class ``onnx.<name>`` (``ModelProto``, ``NodeProto``, ...)."""
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"onnx.{name}"))


@cache
def _pool() -> Any:
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()  # private: an installed ``onnx`` registers the same file globally
    pool.AddSerializedFile(SCHEMA.read_bytes())
    return pool
