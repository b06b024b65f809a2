"""Canonical JSON and digests against the regression vectors of REFERENCE_CONTRACT §1.5, byte for byte."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_memory.models.canonical import (
    CanonicalizationError,
    canonical_bytes,
    canonical_text,
    integral_floats_to_int,
)
from engram_memory.models.digests import (
    ZERO_DIGEST,
    candidate_id,
    digest,
    payload_digest,
    receipt_digest,
    record_digest,
    record_id_from_digest,
)

A64 = "sha256:" + "a" * 64
INSTANT = "2026-08-16T12:34:56.789Z"

PAYLOAD = {
    "schema_version": 2,
    "scope_ref": "scope:case-7",
    "purpose_ref": "purpose:case",
    "valid_time": {"t": 1755350096789, "t_end": 1755350096789},
    "components": [
        {
            "component_id": "component:decision",
            "kind": "decision",
            "text": "Applied the documented correction.",
            "citation_ids": ["citation:source"],
        }
    ],
    "primary_component_id": "component:decision",
    "primary_event": {"at": 1755350096789, "type_ref": "event:correction-applied", "citation_id": "citation:source"},
    "citations": [
        {
            "citation_id": "citation:source",
            "source_ref": "source:case",
            "locator": {"scheme": "document", "value": "case-7#correction"},
            "content_digest": A64,
            "observed_at": INSTANT,
        }
    ],
    "retention": {"derivative_rule": "make-ineligible"},
    "reconciliation": {"family_refs": []},
}
PAYLOAD_DIGEST = "sha256:df5abcbf1d1091794c1f37efcd89e5f7bd6b91afa631e29f084178d35c55e913"
RECORD_DIGEST = "sha256:c75783c63ab735102bf1cf8fb361f8eee2771d3accb233a7e67c3354b5094415"
RECORD_ID = "mem_y5lyhrr2w42rak7rz6h3gypy53rhohj2zszdhj7gpqzvjnijiqkq"


def _record() -> dict:
    return {
        **PAYLOAD,
        "payload_digest": PAYLOAD_DIGEST,
        "recorded_at": INSTANT,
        "recorded_cursor": "7",
        "authorization_receipt_digest": A64,
        "trust": {
            "class": "asserted",
            "evidence_digest": A64,
            "verifier_id": "engine:asserted",
            "verifier_version": "1",
            "issued_at": INSTANT,
            "revocation_epoch": "0",
            "receipt_digest": A64,
        },
    }


# ---- §1.5 regression vectors ---------------------------------------------------------------


def test_payload_digest_vector() -> None:
    assert payload_digest(PAYLOAD) == PAYLOAD_DIGEST


def test_payload_digest_is_key_order_independent() -> None:
    reordered = dict(reversed(list(PAYLOAD.items())))
    assert payload_digest(reordered) == PAYLOAD_DIGEST


def test_record_digest_and_id_vector() -> None:
    rec = _record()
    assert record_digest(rec) == RECORD_DIGEST
    assert record_id_from_digest(RECORD_DIGEST) == RECORD_ID
    assert len(RECORD_ID) == 56


def test_record_digest_ignores_record_id_and_record_digest() -> None:
    rec = {**_record(), "record_id": RECORD_ID, "record_digest": RECORD_DIGEST}
    assert record_digest(rec) == RECORD_DIGEST


def test_record_digest_binds_every_other_field() -> None:
    rec = _record()
    rec["recorded_cursor"] = "8"
    assert record_digest(rec) != RECORD_DIGEST


def test_candidate_id_vector() -> None:
    assert (
        candidate_id("source:l3", "1", "idempotency-key-0001")
        == "candidate_d1f1ef92004dc7c691a4d0aac3a4c738f4859e9a4e8f0156b25ab968837cba2d"
    )


def test_offline_profile_config_digest_vector() -> None:
    config = {
        "profile": "offline_lexical_v1",
        "tokenizer_version": "graphify-memory:tokenizer:v1",
        "bm25": {"k1": 1.2, "b": 0.75},
        "field_weights": {"primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5},
        "rrf_k": 60,
        "max_lexical_variants": 8,
        "half_life_ms": 2592000000,
        "weights": {"lexical": 0.85, "recency": 0.15},
    }
    assert (
        receipt_digest("recall-profile-config", config, "profile_config_digest")
        == "sha256:c3bf9494494e49141a7c1119082609af3427cdab15034ff2be1fb4459ab5602a"
    )
    # the digest field itself is excluded from the body it covers
    with_field = {**config, "profile_config_digest": A64}
    assert receipt_digest("recall-profile-config", with_field, "profile_config_digest") == (
        "sha256:c3bf9494494e49141a7c1119082609af3427cdab15034ff2be1fb4459ab5602a"
    )


def test_empty_fold_state_digest_vector() -> None:
    # §8.4 on an empty journal: high-water "0", root hash ZERO, three empty lists.
    state = {"high_water_cursor": "0", "journal_root_hash": ZERO_DIGEST, "candidates": [], "records": [], "blobs": []}
    assert (
        receipt_digest("memory-fold-state", state)
        == "sha256:e38b70ea3b3d83bc7f55a4194595cbf4125e5c3af306bf1b1c34e5f13171646e"
    )


def test_digest_domain_separation() -> None:
    assert digest("a\0", {"x": 1}) != digest("b\0", {"x": 1})
    assert receipt_digest("k", {"x": 1}) == digest("graphify-memory/k/v1\0", {"x": 1})


# ---- ECMAScript number formatting -----------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (1e-5, "0.00001"),  # Python repr gives '1e-05'
        (3.0, "3"),
        (0.75, "0.75"),
        (0.1 + 0.2, "0.30000000000000004"),
        (-2.5, "-2.5"),
        (123456789.125, "123456789.125"),
        (2**53 - 1, "9007199254740991"),
        (-(2**53 - 1), "-9007199254740991"),
        (0, "0"),
    ],
)
def test_ecmascript_number_format(number: float, text: str) -> None:
    assert canonical_text(number) == text


# ---- strings, keys, refusals ----------------------------------------------------------------


def test_object_keys_sorted_by_utf16_code_units() -> None:
    # U+1F600 is D83D DE00 in UTF-16, which sorts before U+FF61 although its code point is larger.
    value = {"\uff61": 2, "\U0001f600": 1, "b": 0, "a": 0}
    assert canonical_bytes(value) == '{"a":0,"b":0,"\U0001f600":1,"\uff61":2}'.encode()


def test_no_whitespace_and_nested_sorting() -> None:
    assert canonical_text({"b": [1, {"d": True, "c": None}], "a": "x"}) == '{"a":"x","b":[1,{"c":null,"d":true}]}'


def test_string_escapes_match_json_stringify() -> None:
    assert canonical_text('"\\\b\f\n\r\t\x01\x1f é') == '"\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f é"'


def test_strings_and_keys_normalised_to_nfc() -> None:
    assert canonical_text({"cafe\u0301": "e\u0301"}) == '{"caf\u00e9":"\u00e9"}'


def test_nfc_key_collision_refused() -> None:
    with pytest.raises(CanonicalizationError):
        canonical_bytes({"\u00e9": 1, "e\u0301": 2})


@pytest.mark.parametrize(
    "bad",
    [
        -0.0,
        math.nan,
        math.inf,
        -math.inf,
        2**53,
        -(2**53),
        1e21,  # integral but unsafe
        float(2**53),
        "\ud800",  # lone surrogate
        {"\udc00": 1},
        {1: "non-string key"},
        b"bytes",
    ],
)
def test_non_canonicalisable_values_refused(bad: object) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_bytes(bad)
    with pytest.raises(CanonicalizationError):
        canonical_bytes({"nested": [bad]})


def test_integral_floats_become_ints() -> None:
    converted = integral_floats_to_int({"a": 2.0, "b": [3.0, 2.5], "c": True, "d": float(2**53)})
    assert converted == {"a": 2, "b": [3, 2.5], "c": True, "d": float(2**53)}
    assert type(converted["a"]) is int and type(converted["b"][0]) is int
    assert type(converted["c"]) is bool  # a bool is never turned into an int
    assert type(converted["d"]) is float  # unsafe: left for canonicalisation to refuse


# -- the fast path (orjson; json past its nesting limit) writes exactly rfc8785's bytes -------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_keys = st.one_of(st.text(st.characters(max_codepoint=127), max_size=6), _text)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _text
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0 or math.copysign(1, f) > 0),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


@given(_json)
@settings(max_examples=400, deadline=None)
def test_fast_path_matches_rfc8785(value: object) -> None:
    import rfc8785

    from engram_memory.models.canonical import normalize

    try:
        expected = rfc8785.dumps(normalize(value))
    except CanonicalizationError:
        return  # e.g. keys colliding after NFC: refused on both paths
    assert canonical_bytes(value) == expected


def test_fast_path_edge_strings() -> None:
    import rfc8785

    for value in [{"a": "\x00\x1f\x7f\u2028\"\\\b\f\n\r\t/"}, {"z": 1, "a": [True, None, -5]}, {"é": 1, "e": 2},
                  {"\ufb01": 1, "\U0001f600": 2}, {"k": 2**53 - 1}, {"k": 1.5}, ["\U0010ffff"]]:
        assert canonical_bytes(value) == rfc8785.dumps(value)


def test_fast_path_past_orjson_nesting_limit() -> None:
    """orjson refuses values nested 255 levels deep; the standard library's encoder takes over."""
    import rfc8785

    deep: object = {"leaf": [1.5, "x"]}
    for level in range(300):
        deep = [deep] if level % 2 else {"k": deep, "a": level}
    assert canonical_bytes(deep) == rfc8785.dumps(deep)


def test_fast_path_float_marks_cannot_be_forged() -> None:
    import rfc8785

    from engram_memory.models import canonical

    forged = canonical._MARK + "0"  # a string equal to the first float's stand-in
    for value in [{"a": forged, "b": 0.5}, {"a": [0.25, forged]}, {"s": forged}, [0.1, 0.2, 1e-7, 1.5e-300, 123.456]]:
        assert canonical_bytes(value) == rfc8785.dumps(value)


def test_engine_value_fast_path_keeps_every_rule() -> None:
    """The exact-type fast path of the normalisation (str/dict/list/int values an import digests ~25
    times an item) refuses, normalises and keeps what the general path does, nested in dicts/lists."""
    import enum

    class Sub(str):
        pass

    class Num(enum.IntEnum):
        ONE = 1

    assert canonical_bytes({"b": True, "a": False, "n": None, "i": -(2**53) + 1}) == \
        b'{"a":false,"b":true,"i":-9007199254740991,"n":null}'
    assert canonical_bytes({"k": [{"t": "e\u0301"}, "e\u0301"], "e\u0301": 1}) == \
        '{"k":[{"t":"\u00e9"},"\u00e9"],"\u00e9":1}'.encode()
    assert canonical_bytes({"s": Sub("x"), "n": Num.ONE, "f": 2.0, "l": ["a", 1]}) == \
        b'{"f":2,"l":["a",1],"n":1,"s":"x"}'
    for bad in ({"k": 2**53}, {"k": [-(2**53)]}, {"k": {"j": "\ud800"}}, {"k": b"x"}):
        with pytest.raises(CanonicalizationError):
            canonical_bytes(bad)
