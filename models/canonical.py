"""Canonical JSON (RFC 8785 / JCS) with the reference engine's normalisation rules.

Normalisation happens before serialisation: strings to NFC (lone surrogates refused),
non-finite numbers and -0 refused, integral numbers must be safe integers, object keys
NFC-normalised with collisions refused. Serialisation (UTF-16 key order, ECMAScript
number formatting) is delegated to the maintained ``rfc8785`` library, except where orjson (or,
past its nesting limit, the standard library's C encoder) provably writes the same bytes (see
``canonical_bytes``).
"""

from __future__ import annotations

import json
import math
import re
import secrets
import unicodedata
from typing import Any

import orjson
import rfc8785

SAFE_INTEGER_MAX = 2**53 - 1


class CanonicalizationError(ValueError):
    """The value cannot be canonicalised (maps to INVALID_SCHEMA at validation sites)."""


def nfc(text: str) -> str:
    if text.isascii():  # the common case (ids, digests, refs): already NFC, no surrogates
        return text
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
    return _normalize(value, _Walk(None))


class _Walk:
    """What ``canonical_bytes`` learns while normalising (see there)."""

    __slots__ = ("floats", "slow")

    def __init__(self, floats: list[float] | None) -> None:
        self.floats = floats  # None: keep floats; a list: swap each for a numbered mark
        self.slow = False  # a non-ASCII key: UTF-16 order may differ from code point order


def _normalize(value: Any, walk: _Walk) -> Any:
    # The exact types an engine value is built of take shortcuts (an import normalises ~25 values an
    # item, ~16 nodes each): an ASCII str is already NFC, a safe int is itself. Same result either way.
    kind = type(value)
    if kind is str and value.isascii():
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is str and key.isascii():
                nkey = key
            else:
                if not isinstance(key, str):
                    raise CanonicalizationError("non-string key")
                nkey = nfc(key)
                if not nkey.isascii():
                    walk.slow = True
            if nkey in out:
                raise CanonicalizationError("duplicate key after NFC normalisation")
            sub = type(item)
            if (sub is str and item.isascii()) or (sub is int and -SAFE_INTEGER_MAX <= item <= SAFE_INTEGER_MAX):
                out[nkey] = item
            else:
                out[nkey] = _normalize(item, walk)
        return out
    if isinstance(value, (list, tuple)):
        if value and type(value[0]) is str and _ascii_strings(value):
            return list(value)  # ids and digests (receipts list thousands): nothing to normalise
        return [_normalize(v, walk) for v in value]
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
        if walk.floats is None:
            return value
        walk.floats.append(value)
        return f"{_MARK}{len(walk.floats) - 1}"
    raise CanonicalizationError("unsupported type")


def _ascii_strings(values: list[Any] | tuple[Any, ...]) -> bool:
    """Every item is an exact ``str`` of ASCII (already NFC; no surrogates), checked in C."""
    try:
        return "".join(values).isascii() and all(type(v) is str for v in values)
    except TypeError:  # a non-string item
        return False


# A per-process random mark standing in for a float while orjson (or json) runs; JSON-escaped
# it reads "\u0000f<hex>:<n>". A string that happens to equal a mark changes the count and
# sends the value down the rfc8785 path, so the output is exact either way.
_MARK = "\x00f" + secrets.token_hex(8) + ":"
_MARK_RE = re.compile(re.escape(json.dumps(_MARK)[:-1]).encode() + rb'(\d+)"')


def canonical_bytes(value: Any) -> bytes:
    """JCS bytes of the normalised value.

    For a value with ASCII keys -- every digest input the engine builds -- JCS is exactly
    ``orjson.dumps(OPT_SORT_KEYS)`` -- the same bytes as ``json.dumps(sort_keys, compact,
    ensure_ascii=False)`` -- with each non-integral number written the ECMAScript way: code
    point order equals UTF-16 order on ASCII keys, safe integers print alike, and all three
    escape only ``"``, ``\\`` and U+0000-U+001F with the same short forms and lowercase
    ``\\u00xx``. Floats go through rfc8785 one by one (ECMAScript formatting is its job); the
    rest runs in orjson, ~20x faster than the standard library's C encoder (an import writes ~25
    canonical values an item), which takes over past orjson's nesting limit (255 levels).
    Anything else is rfc8785's. tests/test_canonical.py checks they agree.
    """
    ascii_only = _ascii_only(value)
    if ascii_only is not None:
        return ascii_only
    walk = _Walk([])
    normalized = _normalize(value, walk)
    if not walk.slow:
        try:
            text = orjson.dumps(normalized, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # nested deeper than orjson goes
            text = json.dumps(normalized, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        floats = walk.floats or []
        if not floats:
            return text
        marks = _MARK_RE.findall(text)
        if sorted(int(m) for m in marks) == list(range(len(floats))):
            return _MARK_RE.sub(lambda m: rfc8785.dumps(floats[int(m[1])]), text)
    try:
        return rfc8785.dumps(normalize(value))
    except rfc8785.CanonicalizationError as exc:
        raise CanonicalizationError("not canonicalisable") from exc


# Types orjson would write its own way (a subclass of str/int/dict/list, a datetime, a dataclass)
# are refused instead, so they take the normalising path below.
_STRICT = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME \
    | orjson.OPT_PASSTHROUGH_DATACLASS
# Outside the strings, what normalisation must see: a float (a digit then "." or an exponent), an
# integer of 16+ digits (maybe past 2**53 - 1), or a null (orjson writes NaN and infinities so).
_NUMBER_RULES = re.compile(rb"[0-9][.eE]|[0-9]{16}|null")


def _ascii_only(value: Any) -> bytes | None:
    """JCS bytes of a value of ASCII text, safe integers and bools -- nearly every value the
    engine digests -- without the Python walk of ``_normalize`` (~70% of canonicalisation's time in
    an import): orjson writes it in C, and its output being ASCII proves every string and key is
    ASCII (so NFC, no surrogate, no collision after NFC, UTF-16 order = code point order) and has
    no escape (a control character or a quote in a string goes the general way); the
    numbers between the strings show that none needs normalising (nor is there a null: orjson
    writes NaN so). None: take the general path.
    (orjson writes an Enum or a UUID as its value where normalisation refuses them: the engine's
    values are JSON-decoded or its own dicts of str and int, never those.)"""
    try:
        out = orjson.dumps(value, option=_STRICT)
    except (orjson.JSONEncodeError, TypeError):
        return None
    # Without a backslash no string holds an escaped quote: every other piece between quotes is
    # what lies outside the strings (a regular expression over the strings costs 10x more).
    if not out.isascii() or b"\\" in out or _NUMBER_RULES.search(b"".join(out.split(b'"')[::2])):
        return None
    return out


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
