"""Reusable annotated field types: the contract's primitive encodings (REFERENCE_CONTRACT §1.1, §3.2).

Every string bound of the contract is a UTF-8 *byte* bound measured after NFC. JSON Schema
can only count code points, so each type publishes the widest character bounds that a
byte-valid NFC value can have (a code point is 1..4 bytes: ``ceil(min/4)..max``) and the
exact byte check runs at validation time. Identifier types (digests, ids, cursors) are
matched as sent, without NFC: they are copied exactly as the server returned them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, TypeAlias

from annotated_types import Ge, Le, Len
from pydantic import (
    AfterValidator,
    AllowInfNan,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    WithJsonSchema,
)
from pydantic_core import core_schema

from engram_memory.models.canonical import SAFE_INTEGER_MAX, nfc
from engram_memory.models.limits import (
    ATTESTATION_MAX_BYTES,
    IDEMPOTENCY_KEY_MAX_BYTES,
    IDEMPOTENCY_KEY_MIN_BYTES,
    OPAQUE_MAX_BYTES,
    QUERY_MAX_BYTES,
    TEXT_MAX_BYTES,
)

CURSOR_MAX = 2**64 - 1


@dataclass(frozen=True)
class Utf8Bytes:
    """NFC-normalise, then require ``min_bytes <= len(utf8) <= max_bytes``; the value becomes the NFC text."""

    min_bytes: int
    max_bytes: int

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        js = handler(schema)
        if self.min_bytes > 0:
            js["minLength"] = math.ceil(self.min_bytes / 4)
        js["maxLength"] = self.max_bytes
        return js

    def _check(self, value: str) -> str:
        value = nfc(value)  # raises on a lone surrogate
        if not self.min_bytes <= len(value.encode("utf-8")) <= self.max_bytes:
            raise ValueError("string byte length out of bounds")
        return value


@dataclass(frozen=True)
class Matches:
    """Full-string match of an ASCII pattern, published as the JSON Schema ``pattern``."""

    pattern: str
    max_length: int | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        compiled = re.compile(self.pattern)

        def check(value: str) -> str:
            # fullmatch: Python's `$` would also match before a trailing newline
            if (self.max_length is not None and len(value) > self.max_length) or not compiled.fullmatch(value):
                raise ValueError("string does not match the required pattern")
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        js = handler(schema)
        js["pattern"] = f"^{self.pattern}$"
        if self.max_length is not None:
            js["maxLength"] = self.max_length  # ASCII-only pattern: characters == bytes
        return js


@dataclass(frozen=True)
class JsonSchemaExtra:
    """Add keywords that a runtime validator already enforces but pydantic does not publish."""

    extra: dict[str, Any]

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {**handler(schema), **self.extra}


def _real_instant(value: str) -> str:
    # With the fixed-width pattern, parse-then-format is the identity exactly when the fields
    # form a real instant, so constructing the datetime is the round trip. It refuses
    # 2026-02-30, hour 24, second 60 and year 0000 (valid in JS, not representable in Python).
    try:
        datetime(
            int(value[0:4]), int(value[5:7]), int(value[8:10]),
            int(value[11:13]), int(value[14:16]), int(value[17:19]), int(value[20:23]) * 1000,
        )  # fmt: skip
    except ValueError as exc:
        raise ValueError("instant is not a valid calendar time") from exc
    return value


def _cursor_in_range(value: str) -> str:
    if int(value) > CURSOR_MAX:
        raise ValueError("cursor above 2^64-1")
    return value


def _distinct(items: list[Any]) -> list[Any]:
    if len(set(items)) != len(items):
        raise ValueError("items are not distinct")
    return items


def const(value: bool | int) -> Any:
    """Exactly ``value``: pydantic's ``Literal[1]`` accepts ``True`` and ``Literal[True]`` accepts ``1``."""

    kind = "boolean" if isinstance(value, bool) else "integer"
    return Annotated[type(value), Strict(), _exactly(value), WithJsonSchema({"type": kind, "const": value})]


def utf8_text(min_bytes: int, max_bytes: int) -> Any:
    return Annotated[str, Strict(), Utf8Bytes(min_bytes, max_bytes)]


def safe_int(minimum: int = -SAFE_INTEGER_MAX, maximum: int = SAFE_INTEGER_MAX) -> Any:
    """A JSON integer; strict, so ``True`` and ``"5"`` are refused (integral floats are converted upstream)."""
    return Annotated[int, Strict(), Ge(minimum), Le(maximum)]


def distinct(item: Any, min_items: int, max_items: int) -> Any:
    """A list of distinct items (compared after each item's own normalisation, e.g. NFC)."""
    return Annotated[list[item], Len(min_items, max_items), Distinct, UNIQUE_ITEMS]


# The default of an optional field whose absence is meaningful: the field is absent, never null
# (an explicit null is refused and the published schema has no "default"). Typed Any so that
# ``x: T = ABSENT`` type-checks without widening ``T`` to ``T | None``, which would publish null.
ABSENT: Any = None

# Explicit aliases (what utf8_text / safe_int / const build), so type checkers see real types.
OpaqueRef: TypeAlias = Annotated[str, Strict(), Utf8Bytes(1, OPAQUE_MAX_BYTES)]
IdempotencyKey: TypeAlias = Annotated[str, Strict(), Utf8Bytes(IDEMPOTENCY_KEY_MIN_BYTES, IDEMPOTENCY_KEY_MAX_BYTES)]
Text: TypeAlias = Annotated[str, Strict(), Utf8Bytes(1, TEXT_MAX_BYTES)]
Query: TypeAlias = Annotated[str, Strict(), Utf8Bytes(1, QUERY_MAX_BYTES)]
PageCursor: TypeAlias = Annotated[str, Strict(), Utf8Bytes(1, OPAQUE_MAX_BYTES)]
Attestation: TypeAlias = Annotated[str, Strict(), Utf8Bytes(0, ATTESTATION_MAX_BYTES)]

Digest = Annotated[str, Strict(), Matches("sha256:[0-9a-f]{64}")]
RecordId = Annotated[str, Strict(), Matches("mem_[a-z2-7]+", max_length=OPAQUE_MAX_BYTES)]
CandidateId = Annotated[str, Strict(), Matches("candidate_[0-9a-f]{64}")]
# 20 digits is the length of 2^64-1; the length cap keeps int() cheap on hostile input.
Cursor = Annotated[str, Strict(), Matches("(0|[1-9][0-9]*)", max_length=20), AfterValidator(_cursor_in_range)]
# [0-9], not \d: Python's \d also matches non-ASCII digits.
Instant = Annotated[
    str,
    Strict(),
    Matches("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"),
    AfterValidator(_real_instant),
]

SafeInt: TypeAlias = Annotated[int, Strict(), Ge(-SAFE_INTEGER_MAX), Le(SAFE_INTEGER_MAX)]
Rank: TypeAlias = Annotated[int, Strict(), Ge(1), Le(SAFE_INTEGER_MAX)]  # 1-based
Count: TypeAlias = Annotated[int, Strict(), Ge(0), Le(SAFE_INTEGER_MAX)]

# A list of distinct items: ``Annotated[list[T], Len(lo, hi), Distinct, UNIQUE_ITEMS]`` (see distinct()).
Distinct = AfterValidator(_distinct)
UNIQUE_ITEMS = JsonSchemaExtra({"uniqueItems": True})


def _exactly(value: bool | int) -> AfterValidator:
    def check(item: Any) -> Any:
        if item != value:
            raise ValueError("unexpected constant")
        return item

    return AfterValidator(check)


# const(1), const(True), const(False) as explicit aliases.
ConstOne: TypeAlias = Annotated[int, Strict(), _exactly(1), WithJsonSchema({"type": "integer", "const": 1})]
ConstTrue: TypeAlias = Annotated[bool, Strict(), _exactly(True), WithJsonSchema({"type": "boolean", "const": True})]
ConstFalse: TypeAlias = Annotated[
    bool, Strict(), _exactly(False), WithJsonSchema({"type": "boolean", "const": False})
]
Score = Annotated[float, Strict(), AllowInfNan(False)]
