"""Canonical JSON (RFC 8785 / JCS) with the reference engine's normalisation rules.

Normalisation happens before serialisation: strings to NFC (lone surrogates refused),
non-finite numbers and -0 refused, integral numbers must be safe integers, object keys
NFC-normalised with collisions refused. Serialisation (UTF-16 key order, ECMAScript
number formatting) is delegated to the maintained ``rfc8785`` library.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any

import rfc8785

SAFE_INTEGER_MAX = 2**53 - 1


class CanonicalizationError(ValueError):
    """The value cannot be canonicalised (maps to INVALID_SCHEMA at validation sites)."""


def nfc(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogate
        raise CanonicalizationError("unpaired surrogate") from exc
    if unicodedata.is_normalized("NFC", text):  # the common case, without a copy
        return text
    return unicodedata.normalize("NFC", text)


def utf8_len(text: str) -> int:
    """Byte length after NFC, the unit every contract bound is measured in."""
    return len(nfc(text).encode("utf-8"))


def normalize(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return nfc(value)
    if isinstance(value, int):
        if abs(value) > SAFE_INTEGER_MAX:
            raise CanonicalizationError("unsafe integer")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalizationError("non-finite number")
        if value == 0 and math.copysign(1.0, value) < 0:
            raise CanonicalizationError("negative zero")
        if value.is_integer():
            if abs(value) > SAFE_INTEGER_MAX:
                raise CanonicalizationError("unsafe integer")
            return int(value)
        return value
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalizationError("non-string key")
            nkey = nfc(key)
            if nkey in out:
                raise CanonicalizationError("duplicate key after NFC normalisation")
            out[nkey] = normalize(item)
        return out
    raise CanonicalizationError("unsupported type")


def canonical_bytes(value: Any) -> bytes:
    try:
        return rfc8785.dumps(normalize(value))
    except rfc8785.CanonicalizationError as exc:
        raise CanonicalizationError("not canonicalisable") from exc


def canonical_text(value: Any) -> str:
    return canonical_bytes(value).decode("utf-8")


def integral_floats_to_int(value: Any) -> Any:
    """JSON cannot tell 2 from 2.0: treat integral safe floats as integers (JS semantics)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) <= SAFE_INTEGER_MAX:
        return int(value)
    if isinstance(value, list):
        return [integral_floats_to_int(v) for v in value]
    if isinstance(value, dict):
        return {k: integral_floats_to_int(v) for k, v in value.items()}
    return value
