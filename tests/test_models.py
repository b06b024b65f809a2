"""The contract models: bounds, cross-references, strictness, outputs and the generated schemas."""

from __future__ import annotations

import copy
import json
import unicodedata
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import jsonschema
import mcp.types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.client.session import ClientSession
from pydantic import TypeAdapter, ValidationError

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.envelope import failure, success
from engram_memory.models.errors import CATALOG, EngramError, ProtocolError
from engram_memory.models.fields import Cursor, Instant, OpaqueRef, SafeInt
from engram_memory.models.outputs import (
    FailureEnvelope,
    OutputContractError,
    success_envelope_model,
    validate_envelope,
    validate_output,
)
from engram_memory.models.schema import TOOL_NAMES, input_schema, output_schema
from engram_memory.models.tools import CaptureInput, SearchInput, parse_input, to_plain

TOOLS = ("search", "get", "capture", "request_admission", "withdraw", "forget")
D = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64
RID = "mem_y5lyhrr2w42rak7rz6h3gypy53rhohj2zszdhj7gpqzvjnijiqkq"
CID = "candidate_" + "d" * 64
KEY = "idempotency-key-0001"
INSTANT = "2026-08-16T12:34:56.789Z"


def nfc(s: str) -> str:
    return unicodedata.normalize("NFC", s)


def of_bytes(n: int) -> str:
    """An NFC string of exactly n UTF-8 bytes, mostly 3-byte characters."""
    return "\u20ac" * (n // 3) + "a" * (n % 3)


# ---- argument builders ----------------------------------------------------------------------


def minimal_capture() -> dict[str, Any]:
    return {
        "idempotency_key": KEY,
        "payload": {
            "schema_version": 2,
            "purpose_ref": "purpose:case",
            "valid_time": {"t": 1755350096789},
            "components": [{"component_id": "c:1", "kind": "decision", "text": "Use BM25.", "citation_ids": ["s:1"]}],
            "primary_component_id": "c:1",
            "primary_event": {"at": 1755350096789, "type_ref": "event:decided", "citation_id": "s:1"},
            "citations": [
                {
                    "citation_id": "s:1",
                    "source_ref": "source:adr-7",
                    "locator": {"scheme": "document", "value": "adr-7#decision"},
                    "content_digest": D,
                }
            ],
        },
        "evidence": {"evidence_ref": "evidence:1", "evidence_digest": D, "citation_ids": ["s:1"]},
    }


def full_capture() -> dict[str, Any]:
    """Every optional field present, two components and two citations."""
    args = minimal_capture()
    p = args["payload"]
    p["valid_time"]["t_end"] = 1755350096790
    p["components"].append({"component_id": "c:2", "kind": "context", "text": "Why.", "citation_ids": ["s:1", "s:2"]})
    p["citations"][0]["observed_at"] = INSTANT
    p["citations"].append(
        {
            "citation_id": "s:2",
            "source_ref": "source:chat",
            "locator": {"scheme": "url", "value": "https://example.org/x"},
            "content_digest": D2,
            "observed_at": INSTANT,
        }
    )
    p["retention"] = {"derivative_rule": "make-ineligible", "expires_at": "2027-01-01T00:00:00.000Z"}
    p["reconciliation"] = {"family_refs": ["family:a", "family:b"]}
    args["evidence"]["citation_ids"] = ["s:1", "s:2"]
    args["evidence"]["attestation"] = "signed by the reviewer"
    return args


def full_args(tool: str) -> dict[str, Any]:
    return {
        "search": {
            "query": "ranking decision",
            "purpose_ref": "purpose:case",
            "limit": 5,
            "max_packet_bytes": 8192,
            "capability_policy": {"minimum_channels": "lexical_and_semantic", "network": "allow"},
            "page_cursor": "eyJvZmZzZXQiOjV9",
        },
        "get": {"record_id": RID, "purpose_ref": "purpose:case", "max_packet_bytes": 4096},
        "capture": full_capture(),
        "request_admission": {"candidate_id": CID, "idempotency_key": KEY},
        "withdraw": {"candidate_id": CID, "idempotency_key": KEY, "reason_ref": "reason:obsolete"},
        "forget": {"record_id": RID, "idempotency_key": KEY, "reason_ref": "reason:wrong"},
    }[tool]


OPTIONAL_KEYS = {
    "limit",
    "max_packet_bytes",
    "capability_policy",
    "page_cursor",
    "t_end",
    "observed_at",
    "retention",
    "expires_at",
    "reconciliation",
    "attestation",
}


def accepted(tool: str, args: Any) -> Any:
    return parse_input(tool, args)


def refused(tool: str, args: Any) -> EngramError:
    with pytest.raises(EngramError) as info:
        parse_input(tool, args)
    assert info.value.code == "INVALID_SCHEMA"
    return info.value


def objects_in(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from objects_in(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from objects_in(v, (*path, i))


def slots_in(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every key path and list index in a JSON document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*path, k)
            yield from slots_in(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*path, i)
            yield from slots_in(v, (*path, i))


def with_value(doc: Any, path: tuple, value: Any) -> Any:
    doc = copy.deepcopy(doc)
    target = doc
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return doc


def without(doc: Any, path: tuple) -> Any:
    doc = copy.deepcopy(doc)
    target = doc
    for step in path[:-1]:
        target = target[step]
    del target[path[-1]]
    return doc


# ---- every tool: the full and the minimal argument objects ----------------------------------


@pytest.mark.parametrize("tool", TOOLS)
def test_full_arguments_accepted_and_round_trip(tool: str) -> None:
    args = full_args(tool)
    model = accepted(tool, args)
    assert to_plain(model) == args


def test_search_defaults_are_materialised() -> None:
    model = accepted("search", {"query": "q", "purpose_ref": "p"})
    assert isinstance(model, SearchInput)
    assert to_plain(model) == {
        "query": "q",
        "purpose_ref": "p",
        "limit": 10,
        "max_packet_bytes": 65536,
        "capability_policy": {"minimum_channels": "lexical", "network": "forbid"},
    }
    assert model.page_cursor is None


def test_get_default_packet_bytes() -> None:
    assert to_plain(accepted("get", {"record_id": RID, "purpose_ref": "p"}))["max_packet_bytes"] == 65536


def test_absent_optionals_are_omitted_not_null() -> None:
    plain = to_plain(accepted("capture", minimal_capture()))
    assert plain == minimal_capture()
    assert "null" not in json.dumps(plain)
    assert "retention" not in plain["payload"] and "attestation" not in plain["evidence"]


# ---- strictness: null, extra fields, missing fields, types -----------------------------------


@pytest.mark.parametrize("tool", TOOLS)
def test_null_refused_everywhere(tool: str) -> None:
    args = full_args(tool)
    slots = list(slots_in(args))
    assert slots
    for path in slots:
        refused(tool, with_value(args, path, None))


@pytest.mark.parametrize("tool", TOOLS)
def test_extra_field_refused_at_every_level(tool: str) -> None:
    args = full_args(tool)
    levels = list(objects_in(args))
    assert len(levels) >= (9 if tool == "capture" else 1)
    for path, _ in levels:
        refused(tool, with_value(args, (*path, "x_extra"), "v") if path else {**args, "x_extra": "v"})


@pytest.mark.parametrize("tool", TOOLS)
def test_model_written_confirmation_refused(tool: str) -> None:
    refused(tool, {**full_args(tool), "confirmed": True})


@pytest.mark.parametrize("host_field", ["scope_ref", "tenant", "principal", "auditId", "elicitationRef"])
def test_host_bound_fields_refused(host_field: str) -> None:
    refused("search", {**full_args("search"), host_field: "x"})
    args = full_capture()
    args["payload"][host_field] = "x"
    refused("capture", args)


@pytest.mark.parametrize("tool", TOOLS)
def test_every_required_field_is_required(tool: str) -> None:
    args = full_args(tool)
    for path in slots_in(args):
        if isinstance(path[-1], int):
            continue
        if path[-1] in OPTIONAL_KEYS:
            accepted(tool, without(args, path))
        else:
            refused(tool, without(args, path))


@pytest.mark.parametrize("bad", [None, [], "search", 5, True])
def test_arguments_must_be_an_object(bad: Any) -> None:
    refused("search", bad)


def test_unknown_tool_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError) as info:
        parse_input("engram_memory_search", {})
    assert info.value.code == -32602


def test_integral_float_accepted_as_int() -> None:
    model = accepted("search", {"query": "q", "purpose_ref": "p", "limit": 2.0, "max_packet_bytes": 4096.0})
    assert model.limit == 2 and type(model.limit) is int
    args = minimal_capture()
    args["payload"]["schema_version"] = 2.0
    args["payload"]["valid_time"] = {"t": 10.0, "t_end": 11.0}
    plain = to_plain(accepted("capture", args))
    assert plain["payload"]["schema_version"] == 2 and type(plain["payload"]["valid_time"]["t"]) is int


@pytest.mark.parametrize("bad", [True, False, "5", 2.5, [5], {"v": 5}])
def test_limit_type_is_strict(bad: Any) -> None:
    refused("search", {"query": "q", "purpose_ref": "p", "limit": bad})


@pytest.mark.parametrize("bad", [True, "2", 3, 1])
def test_schema_version_is_exactly_two(bad: Any) -> None:
    refused("capture", with_value(minimal_capture(), ("payload", "schema_version"), bad))


@pytest.mark.parametrize("bad", [5, True, b"q", ["q"]])
def test_strings_are_strict(bad: Any) -> None:
    refused("search", {"query": bad, "purpose_ref": "p"})


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        (("payload", "components", 0, "kind"), "Decision"),
        (("payload", "retention"), {"derivative_rule": "keep"}),
    ],
)
def test_enums_are_closed(path: tuple, bad: Any) -> None:
    refused("capture", with_value(minimal_capture(), path, bad))


@pytest.mark.parametrize(
    "policy",
    [
        {"minimum_channels": "semantic", "network": "forbid"},
        {"minimum_channels": "lexical", "network": "deny"},
        {"minimum_channels": "lexical"},
        {"network": "forbid"},
    ],
)
def test_capability_policy_closed_and_complete(policy: dict) -> None:
    refused("search", {"query": "q", "purpose_ref": "p", "capability_policy": policy})


# ---- integer bounds -------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "lo", "hi"), [("limit", 1, 50), ("max_packet_bytes", 4096, 1048576)])
def test_search_integer_bounds(field: str, lo: int, hi: int) -> None:
    base = {"query": "q", "purpose_ref": "p"}
    assert getattr(accepted("search", {**base, field: lo}), field) == lo
    assert getattr(accepted("search", {**base, field: hi}), field) == hi
    refused("search", {**base, field: lo - 1})
    refused("search", {**base, field: hi + 1})


def test_get_packet_bounds() -> None:
    base = {"record_id": RID, "purpose_ref": "p"}
    accepted("get", {**base, "max_packet_bytes": 4096})
    refused("get", {**base, "max_packet_bytes": 4095})
    refused("get", {**base, "max_packet_bytes": 1048577})


@pytest.mark.parametrize("path", [("payload", "valid_time", "t"), ("payload", "primary_event", "at")])
def test_safe_integer_bounds(path: tuple) -> None:
    args = minimal_capture()
    for ok in (2**53 - 1, -(2**53 - 1), 0, -1):
        accepted("capture", with_value(args, path, ok))
    for bad in (2**53, -(2**53), True, "1", 1.5):
        refused("capture", with_value(args, path, bad))


def test_t_end_not_before_t() -> None:
    args = minimal_capture()
    accepted("capture", with_value(args, ("payload", "valid_time"), {"t": 5, "t_end": 5}))
    refused("capture", with_value(args, ("payload", "valid_time"), {"t": 5, "t_end": 4}))


# ---- string byte bounds (after NFC) ---------------------------------------------------------

STRING_BOUNDS = [
    ("search", ("query",), 1, 8192),
    ("search", ("purpose_ref",), 1, 512),
    ("search", ("page_cursor",), 1, 512),
    ("get", ("purpose_ref",), 1, 512),
    ("capture", ("idempotency_key",), 16, 256),
    ("capture", ("payload", "purpose_ref"), 1, 512),
    ("capture", ("payload", "components", 0, "text"), 1, 65536),
    ("capture", ("payload", "primary_event", "type_ref"), 1, 512),
    ("capture", ("payload", "citations", 0, "source_ref"), 1, 512),
    ("capture", ("payload", "citations", 0, "locator", "scheme"), 1, 512),
    ("capture", ("payload", "citations", 0, "locator", "value"), 1, 512),
    ("capture", ("payload", "reconciliation", "family_refs", 0), 1, 512),
    ("capture", ("evidence", "evidence_ref"), 1, 512),
    ("capture", ("evidence", "attestation"), 0, 4096),
    ("request_admission", ("idempotency_key",), 16, 256),
    ("withdraw", ("idempotency_key",), 16, 256),
    ("withdraw", ("reason_ref",), 1, 512),
    ("forget", ("idempotency_key",), 16, 256),
    ("forget", ("reason_ref",), 1, 512),
]


def _base_for(tool: str, path: tuple) -> dict[str, Any]:
    args = full_args(tool)
    if path[-2:] == ("family_refs", 0):
        args = with_value(args, path[:-1], ["x"])  # one element: order cannot interfere
    return args


@pytest.mark.parametrize(("tool", "path", "lo", "hi"), STRING_BOUNDS)
def test_string_byte_bounds(tool: str, path: tuple, lo: int, hi: int) -> None:
    args = _base_for(tool, path)
    accepted(tool, with_value(args, path, of_bytes(hi)))
    refused(tool, with_value(args, path, of_bytes(hi + 1)))
    # 2-byte characters land exactly on an even bound and one byte above it
    accepted(tool, with_value(args, path, "\u00e9" * (hi // 2)))
    refused(tool, with_value(args, path, "\u00e9" * (hi // 2) + "a" * (hi % 2 + 1)))
    if lo > 0:
        accepted(tool, with_value(args, path, of_bytes(lo)))
        refused(tool, with_value(args, path, of_bytes(lo - 1)))
    else:
        accepted(tool, with_value(args, path, ""))


@pytest.mark.parametrize(("tool", "path", "lo", "hi"), STRING_BOUNDS)
def test_bytes_measured_after_nfc(tool: str, path: tuple, lo: int, hi: int) -> None:
    args = _base_for(tool, path)
    # NFD e + U+0301 is 3 bytes and becomes U+00E9 (2 bytes): over the bound as sent, inside after NFC.
    shrinking = "e\u0301" * (hi // 2)
    assert len(shrinking.encode()) > hi >= len(nfc(shrinking).encode())
    model = accepted(tool, with_value(args, path, shrinking))
    value = to_plain(model)
    for step in path:
        value = value[step]
    assert value == nfc(shrinking)
    # U+0958 is 3 bytes and NFC turns it into U+0915 U+093C (6 bytes): inside as sent, over after NFC.
    growing = "\u0958" * (hi // 3)
    assert len(growing.encode()) <= hi < len(nfc(growing).encode())
    refused(tool, with_value(args, path, growing))


def test_idempotency_key_is_bytes_not_characters() -> None:
    base = {"candidate_id": CID}
    accepted("request_admission", {**base, "idempotency_key": "\U0001f600" * 4})  # 4 chars, 16 bytes
    refused("request_admission", {**base, "idempotency_key": "\u00e9" * 7 + "a"})  # 15 bytes
    refused("request_admission", {**base, "idempotency_key": "a" * 15})
    accepted("request_admission", {**base, "idempotency_key": "\U0001f600" * 64})  # 256 bytes
    refused("request_admission", {**base, "idempotency_key": "\U0001f600" * 64 + "a"})


def test_lone_surrogate_refused() -> None:
    refused("search", {"query": "bad \ud800", "purpose_ref": "p"})


def test_nfc_key_collision_in_arguments_refused() -> None:
    refused("search", {"query": "q", "purpose_ref": "p", "caf\u00e9": 1, "cafe\u0301": 2})


# ---- identifier patterns --------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    ["mem_", "mem_ABC", "mem_abc1", "mem_abc\n", "MEM_abc", " mem_abc", "mem_" + "a" * 509, "mem_\uff41"],
)
def test_record_id_pattern(bad: str) -> None:
    accepted("get", {"record_id": "mem_abc", "purpose_ref": "p"})
    accepted("get", {"record_id": "mem_" + "a" * 508, "purpose_ref": "p"})  # 512 bytes
    refused("get", {"record_id": bad, "purpose_ref": "p"})
    refused("forget", {"record_id": bad, "idempotency_key": KEY, "reason_ref": "r"})


@pytest.mark.parametrize(
    "bad", ["candidate_" + "d" * 63, "candidate_" + "d" * 65, "candidate_" + "D" * 64, "candidate_" + "d" * 64 + "\n"]
)
def test_candidate_id_pattern(bad: str) -> None:
    refused("request_admission", {"candidate_id": bad, "idempotency_key": KEY})
    refused("withdraw", {"candidate_id": bad, "idempotency_key": KEY, "reason_ref": "r"})


@pytest.mark.parametrize(
    "bad", ["sha256:" + "A" * 64, "sha256:" + "a" * 63, "sha256:" + "a" * 65, "SHA256:" + "a" * 64, D + "\n", "a" * 64]
)
def test_digest_pattern(bad: str) -> None:
    refused("capture", with_value(minimal_capture(), ("evidence", "evidence_digest"), bad))
    refused("capture", with_value(minimal_capture(), ("payload", "citations", 0, "content_digest"), bad))


INSTANT_OK = [
    "2026-08-16T12:34:56.789Z",
    "2024-02-29T23:59:59.999Z",
    "0001-01-01T00:00:00.000Z",
    "0999-12-31T00:00:00.000Z",
]
INSTANT_BAD = [
    "2026-02-30T00:00:00.000Z",  # impossible date
    "2025-02-29T00:00:00.000Z",  # not a leap year
    "0000-01-01T00:00:00.000Z",  # representable in JS, not in Python
    "2026-08-16T24:00:00.000Z",
    "2026-08-16T23:59:60.000Z",
    "2026-13-01T00:00:00.000Z",
    "2026-08-16T12:34:56Z",
    "2026-08-16T12:34:56.78Z",
    "2026-08-16T12:34:56.789+00:00",
    "2026-08-16t12:34:56.789z",
    "2026-08-16 12:34:56.789Z",
    "2026-08-16T12:34:56.789Z\n",
    "\uff12026-08-16T12:34:56.789Z",  # full-width digit
]


@pytest.mark.parametrize("text", INSTANT_OK)
def test_instant_accepted(text: str) -> None:
    assert TypeAdapter(Instant).validate_python(text) == text
    accepted("capture", with_value(minimal_capture(), ("payload", "citations", 0, "observed_at"), text))


@pytest.mark.parametrize("text", INSTANT_BAD)
def test_instant_refused(text: str) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(Instant).validate_python(text)
    refused(
        "capture",
        with_value(minimal_capture(), ("payload", "retention"), {"derivative_rule": "retain", "expires_at": text}),
    )


@pytest.mark.parametrize("text", ["0", "7", "18446744073709551615"])
def test_cursor_accepted(text: str) -> None:
    assert TypeAdapter(Cursor).validate_python(text) == text


@pytest.mark.parametrize(
    "text", ["18446744073709551616", "01", "-1", "", "1.0", "1\n", "\u0661", "99999999999999999999999"]
)
def test_cursor_refused(text: str) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(Cursor).validate_python(text)


# ---- array bounds ---------------------------------------------------------------------------


def capture_with(n_components: int = 1, n_citations: int = 1, per_component: int = 1) -> dict[str, Any]:
    args = minimal_capture()
    p = args["payload"]
    cits = [f"s:{i}" for i in range(n_citations)]
    p["citations"] = [
        {"citation_id": c, "source_ref": "src", "locator": {"scheme": "doc", "value": "v"}, "content_digest": D}
        for c in cits
    ]
    p["components"] = [
        {"component_id": f"c:{i}", "kind": "context", "text": "t", "citation_ids": cits[:per_component]}
        for i in range(n_components)
    ]
    p["primary_component_id"] = "c:0"
    p["primary_event"]["citation_id"] = "s:0"
    args["evidence"]["citation_ids"] = cits[:per_component]
    return args


def test_component_count_bounds() -> None:
    accepted("capture", capture_with(n_components=64))
    refused("capture", capture_with(n_components=65))
    refused("capture", with_value(minimal_capture(), ("payload", "components"), []))


def test_citation_count_bounds() -> None:
    accepted("capture", capture_with(n_citations=256, per_component=256))
    refused("capture", capture_with(n_citations=257))
    refused("capture", with_value(minimal_capture(), ("payload", "citations"), []))


def test_component_and_evidence_citation_ids_bounds() -> None:
    args = capture_with(n_citations=256, per_component=256)
    assert len(args["payload"]["components"][0]["citation_ids"]) == 256
    # 257 ids cannot all be distinct with 256 citations: repeat one to hit the length bound
    over = [*args["payload"]["components"][0]["citation_ids"], "s:0"]
    refused("capture", with_value(args, ("payload", "components", 0, "citation_ids"), over))
    refused("capture", with_value(args, ("evidence", "citation_ids"), over))
    refused("capture", with_value(minimal_capture(), ("payload", "components", 0, "citation_ids"), []))
    refused("capture", with_value(minimal_capture(), ("evidence", "citation_ids"), []))


def test_family_refs_bounds() -> None:
    refs = sorted(f"family:{i:02d}" for i in range(65))
    base = minimal_capture()
    accepted("capture", with_value(base, ("payload", "reconciliation"), {"family_refs": []}))
    accepted("capture", with_value(base, ("payload", "reconciliation"), {"family_refs": refs[:64]}))
    refused("capture", with_value(base, ("payload", "reconciliation"), {"family_refs": refs}))


@pytest.mark.parametrize(
    ("refs", "ok"),
    [
        (["a", "b", "c"], True),
        (["b", "a"], False),
        (["a", "a"], False),
        # U+1F600 (UTF-16 D83D DE00) precedes U+FF61 in UTF-16 order, though not in code-point order
        (["\U0001f600", "\uff61"], True),
        (["\uff61", "\U0001f600"], False),
        (["e\u0301", "\u00e9"], False),  # equal after NFC
        (["B", "a"], True),  # code units, not case-folded
    ],
)
def test_family_refs_strictly_increasing_in_utf16(refs: list[str], ok: bool) -> None:
    args = with_value(minimal_capture(), ("payload", "reconciliation"), {"family_refs": refs})
    if ok:
        accepted("capture", args)
    else:
        refused("capture", args)


# ---- cross-references -----------------------------------------------------------------------


def test_repeated_citation_id_refused() -> None:
    args = full_capture()
    args["payload"]["citations"][1]["citation_id"] = "s:1"
    args["payload"]["components"][1]["citation_ids"] = ["s:1"]
    args["evidence"]["citation_ids"] = ["s:1"]
    refused("capture", args)


def test_citation_ids_equal_after_nfc_are_repeats() -> None:
    args = capture_with(n_citations=2, per_component=2)
    args["payload"]["citations"][0]["citation_id"] = "caf\u00e9"
    args["payload"]["citations"][1]["citation_id"] = "cafe\u0301"
    args["payload"]["components"][0]["citation_ids"] = ["caf\u00e9"]
    args["payload"]["primary_event"]["citation_id"] = "caf\u00e9"
    args["evidence"]["citation_ids"] = ["caf\u00e9"]
    refused("capture", args)


def test_references_resolve_through_nfc() -> None:
    args = minimal_capture()
    args["payload"]["citations"][0]["citation_id"] = "cafe\u0301"
    args["payload"]["components"][0]["citation_ids"] = ["caf\u00e9"]
    args["payload"]["primary_event"]["citation_id"] = "caf\u00e9"
    args["evidence"]["citation_ids"] = ["cafe\u0301"]
    plain = to_plain(accepted("capture", args))
    assert plain["payload"]["citations"][0]["citation_id"] == "caf\u00e9"


def test_repeated_component_id_refused() -> None:
    args = full_capture()
    args["payload"]["components"][1]["component_id"] = "c:1"
    refused("capture", args)


def test_repeated_citation_within_component_refused() -> None:
    refused("capture", with_value(full_capture(), ("payload", "components", 1, "citation_ids"), ["s:1", "s:1"]))
    refused("capture", with_value(full_capture(), ("evidence", "citation_ids"), ["s:2", "s:2"]))


def test_component_citation_must_resolve() -> None:
    refused("capture", with_value(full_capture(), ("payload", "components", 1, "citation_ids"), ["s:1", "s:9"]))


def test_primary_component_must_resolve() -> None:
    refused("capture", with_value(full_capture(), ("payload", "primary_component_id"), "c:9"))
    accepted("capture", with_value(full_capture(), ("payload", "primary_component_id"), "c:2"))


def test_primary_event_citation_must_exist() -> None:
    refused("capture", with_value(full_capture(), ("payload", "primary_event", "citation_id"), "s:9"))


def test_primary_event_citation_must_be_cited_by_primary_component() -> None:
    # s:2 exists and is cited by c:2, but the primary component c:1 does not cite it
    refused("capture", with_value(full_capture(), ("payload", "primary_event", "citation_id"), "s:2"))
    args = with_value(full_capture(), ("payload", "primary_component_id"), "c:2")
    accepted("capture", with_value(args, ("payload", "primary_event", "citation_id"), "s:2"))


def test_evidence_citations_must_resolve_in_payload() -> None:
    refused("capture", with_value(full_capture(), ("evidence", "citation_ids"), ["s:1", "s:9"]))
    accepted("capture", with_value(full_capture(), ("evidence", "citation_ids"), ["s:2"]))


# ---- whole-argument bound -------------------------------------------------------------------


def capture_of_size(total: int) -> dict[str, Any]:
    """A valid capture whose canonical serialisation is exactly ``total`` bytes."""
    args = capture_with(n_components=20)
    base = len(canonical_bytes(args))
    remaining = total - base
    for component in args["payload"]["components"]:
        extra = min(remaining, 65535)
        component["text"] += "a" * extra
        remaining -= extra
    assert remaining == 0
    assert len(canonical_bytes(args)) == total
    return args


def test_one_mebibyte_argument_bound() -> None:
    accepted("capture", capture_of_size(1_048_576))
    error = refused("capture", capture_of_size(1_048_577))
    assert "1 MiB" in error.detail


# ---- errors never echo input ----------------------------------------------------------------


def test_refusal_detail_and_message_never_echo_input() -> None:
    secret = "sk_live_do-not-echo-" + "z" * 9000
    error = refused("search", {"query": secret, "purpose_ref": "p"})
    assert error.message == CATALOG["INVALID_SCHEMA"].message
    assert "sk_live" not in error.detail and "sk_live" not in error.message
    assert "query" in error.detail


def test_pydantic_error_text_hides_input() -> None:
    # anyone logging the raw ValidationError must not leak content either
    args = with_value(minimal_capture(), ("payload", "components", 0, "text"), "secret-" + "z" * 70000)
    with pytest.raises(ValidationError) as info:
        CaptureInput.model_validate(args)
    assert "secret-" not in str(info.value)


@pytest.mark.parametrize(("field_type", "bad"), [(SafeInt, True), (SafeInt, "5"), (OpaqueRef, 5), (OpaqueRef, b"x")])
def test_field_types_are_strict_on_their_own(field_type: Any, bad: Any) -> None:
    # the field types keep their strictness outside the strict models (e.g. in a TypeAdapter)
    with pytest.raises(ValidationError):
        TypeAdapter(field_type).validate_python(bad)


# ---- outputs --------------------------------------------------------------------------------


def sample_record() -> dict[str, Any]:
    payload = {k: v for k, v in full_capture()["payload"].items()}
    return {
        "record_id": RID,
        **payload,
        "scope_ref": "tenant:t/workspace:w",
        "payload_digest": D,
        "record_digest": D,
        "recorded_at": INSTANT,
        "recorded_cursor": "7",
        "authorization_receipt_digest": D,
        "trust": {
            "class": "asserted",
            "evidence_digest": D,
            "verifier_id": "engine:asserted",
            "verifier_version": "1",
            "issued_at": INSTANT,
            "expires_at": "2027-01-01T00:00:00.000Z",
            "revocation_epoch": "0",
            "receipt_digest": D,
        },
    }


def sample_value(tool: str) -> dict[str, Any]:
    packet = {"record": sample_record(), "redacted_fields": [], "redaction_receipt_digest": D}
    lifecycle = {
        "event_id": KEY,
        "cursor": "9",
        "event_digest": D,
        "authorization_receipt_digest": D,
        "transaction_receipt_digest": D,
    }
    return {
        "search": {
            "records": [
                {**packet, "score": 0.98, "rank": 1},
                {
                    **packet,
                    "record": {"record_id": RID},
                    "redacted_fields": ["/citations", "/components"],
                    "score": 1,
                    "rank": 2,
                },
            ],
            "rank_receipt": {
                "request_digest": D,
                "profile": "hybrid_v1",
                "profile_version": "1.0.0",
                "profile_config_digest": D,
                "valid_as_of": 1755350096789,
                "system_as_of": "12",
                "candidate_count": 2,
                "candidate_ids_digest": D,
                "ordered_ids_digest": D,
                "channels": [
                    {
                        "channel": "lexical",
                        "contributed": True,
                        "engine": "tantivy",
                        "engine_version": "0.27.0",
                        "index_kind": "bm25",
                        "index_cursor": "12",
                    },
                    {
                        "channel": "semantic",
                        "contributed": True,
                        "engine": "hnswlib",
                        "engine_version": "0.8.0",
                        "index_kind": "hnsw",
                        "index_cursor": "12",
                        "model_id": "all-MiniLM-L6-v2",
                        "model_digest": D2,
                    },
                ],
                "fusion": {"method": "rrf", "k": 60, "weights": {"lexical": 0.5, "semantic": 0.5}},
                "ranked": [
                    {
                        "record_id": RID,
                        "rank": 1,
                        "score": 0.98,
                        "lexical": {"rank": 1, "score": 7.5},
                        "semantic": {"rank": 2, "score": 0.61},
                    },
                    {"record_id": RID, "rank": 2, "score": 0.5},
                ],
                "issued_at": INSTANT,
                "receipt_digest": D,
            },
            "next_page_cursor": "eyJvZmZzZXQiOjJ9",
            "response_digest": D,
        },
        "get": {
            **packet,
            "read_receipt": {
                "record_id": RID,
                "record_digest": D,
                "valid_as_of": 1755350096789,
                "system_as_of": "12",
                "validated_through_cursor": "12",
                "authorization_receipt_digest": D,
                "revalidation_receipt_digest": D,
                "checked_at": INSTANT,
                "receipt_digest": D,
            },
            "packet_digest": D,
        },
        "capture": {
            "status": "committed_pending",
            "candidate_id": CID,
            "record_digest": D,
            "cursor": "3",
            "transaction_receipt_digest": D,
        },
        "request_admission": {
            "outcome": {
                "status": "accepted",
                "candidate_id": CID,
                "record_id": RID,
                "cursor": "4",
                "decision_receipt_digest": D,
                "transaction_receipt_digest": D,
            },
            "replayed": False,
        },
        "withdraw": {
            "receipt": {**lifecycle, "operation": "withdraw", "from_state": "pending", "to_state": "withdrawn"},
            "replayed": True,
            "key_destruction": "complete",
        },
        "forget": {
            "receipt": {
                **lifecycle,
                "operation": "tombstone",
                "from_state": "accepted_current",
                "to_state": "tombstoned",
            },
            "replayed": False,
            "projection_invalidation": "pending",
            "coverage_receipt_digest": D,
        },
    }[tool]


@pytest.mark.parametrize("tool", TOOLS)
def test_sample_values_are_on_contract(tool: str) -> None:
    validate_output(tool, sample_value(tool))
    validate_envelope(tool, success(sample_value(tool), "audit-1"))


@pytest.mark.parametrize("tool", TOOLS)
def test_output_extra_field_refused_at_every_level(tool: str) -> None:
    value = sample_value(tool)
    for path, _ in objects_in(value):
        bad = with_value(value, (*path, "x_extra"), 1) if path else {**value, "x_extra": 1}
        with pytest.raises(OutputContractError):
            validate_output(tool, bad)


@pytest.mark.parametrize("tool", TOOLS)
def test_output_null_refused_everywhere(tool: str) -> None:
    value = sample_value(tool)
    for path in slots_in(value):
        with pytest.raises(OutputContractError):
            validate_output(tool, with_value(value, path, None))


def test_output_contract_error_is_an_operational_failure() -> None:
    with pytest.raises(OutputContractError) as info:
        validate_output("capture", {**sample_value("capture"), "status": "refused"})
    assert info.value.code == "CAPABILITY_UNAVAILABLE"


@pytest.mark.parametrize(
    ("tool", "path", "bad"),
    [
        ("capture", ("status",), "unavailable"),
        ("capture", ("candidate_id",), "cand_1"),
        ("request_admission", ("outcome", "status"), "refused"),
        ("request_admission", ("replayed",), 0),
        ("withdraw", ("receipt", "from_state"), "accepted_current"),
        ("withdraw", ("key_destruction",), "done"),
        ("forget", ("receipt", "from_state"), "pending"),
        ("forget", ("receipt", "to_state"), "withdrawn"),
        ("search", ("records", 0, "rank"), 0),
        ("search", ("records", 0, "rank"), 1.0),
        ("search", ("records", 0, "score"), True),
        ("search", ("records", 0, "score"), float("nan")),
        ("search", ("rank_receipt", "profile"), "offline_lexical_v1"),
        ("search", ("rank_receipt", "system_as_of"), "012"),
        ("search", ("rank_receipt", "fusion", "method"), "sum"),
        ("search", ("rank_receipt", "channels", 0, "index_kind"), "ivf"),
        ("search", ("rank_receipt", "candidate_count"), -1),
        ("search", ("next_page_cursor",), ""),
        ("search", ("records", 0, "record", "trust", "class"), "trusted"),
        ("get", ("read_receipt", "checked_at"), "2026-08-16T12:34:56Z"),
        ("get", ("record", "schema_version"), 1),
    ],
)
def test_output_values_are_closed(tool: str, path: tuple, bad: Any) -> None:
    with pytest.raises(OutputContractError):
        validate_output(tool, with_value(sample_value(tool), path, bad))


def test_record_requires_only_record_id() -> None:
    value = sample_value("get")
    validate_output("get", with_value(value, ("record",), {"record_id": RID}))
    with pytest.raises(OutputContractError):
        validate_output("get", with_value(value, ("record",), {"purpose_ref": "p"}))


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_every_failure_envelope_is_on_contract(code: str) -> None:
    validate_envelope("search", failure(code, "audit-1"))


def test_envelope_constants_are_strict() -> None:
    model = success_envelope_model("capture")
    good = success(sample_value("capture"), "a")
    model.model_validate(good)
    for bad in ({**good, "ok": 1}, with_value(good, ("output", "schema_version"), True)):
        with pytest.raises(ValidationError):
            model.model_validate(bad)
    with pytest.raises(ValidationError):
        FailureEnvelope.model_validate({**failure("NOT_FOUND", "a"), "ok": 0})


def test_envelope_guard_refuses_off_contract_envelopes() -> None:
    good = success(sample_value("capture"), "a")
    for bad in (
        {**good, "x": 1},
        {**good, "ok": 1},
        {**good, "redactionClass": "low"},
        with_value(good, ("output", "schema_version"), True),
        {**failure("NOT_FOUND", "a"), "error": {"code": "NOPE", "message": "m", "retriable": False}},
        {**good, "ok": False},
    ):
        with pytest.raises(OutputContractError):
            validate_envelope("capture", bad)


# ---- generated schemas ----------------------------------------------------------------------


def schema_nodes(node: Any) -> Iterator[dict]:
    """Every subschema (not data such as const/default/enum values)."""
    if not isinstance(node, dict):
        return
    yield node
    for key in ("items", "additionalProperties", "not", "contains"):
        if isinstance(node.get(key), dict):
            yield from schema_nodes(node[key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for sub in node.get(key, []):
            yield from schema_nodes(sub)
    for key in ("properties", "$defs", "patternProperties"):
        for sub in node.get(key, {}).values():
            yield from schema_nodes(sub)


ALL_SCHEMAS = [(f"in:{t}", input_schema(t)) for t in TOOLS] + [(f"out:{t}", output_schema(t)) for t in TOOLS]


@pytest.mark.parametrize(("name", "schema"), ALL_SCHEMAS, ids=[n for n, _ in ALL_SCHEMAS])
def test_schema_structure(name: str, schema: dict) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object"
    nodes = list(schema_nodes(schema))
    objects = [n for n in nodes if n.get("type") == "object" or "properties" in n]
    assert objects
    for node in objects:
        if node is schema and name.startswith("out:"):
            assert set(node) == {"type", "oneOf"}  # the branches are closed, not the union
            continue
        assert node.get("additionalProperties") is False, node
        assert set(node.get("required", [])) <= set(node["properties"])
    for node in nodes:
        types = node.get("type", [])
        assert "null" not in (types if isinstance(types, list) else [types])
        assert "$ref" not in node and "$defs" not in node and "title" not in node
        assert node.get("const", 0) is not None
        assert None not in node.get("enum", [])
        assert "default" not in node or node["default"] is not None
    assert "null" not in json.dumps(schema)


def test_input_schema_publishes_bounds_and_defaults() -> None:
    search = input_schema("search")["properties"]
    assert search["limit"] == {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}
    assert search["max_packet_bytes"]["default"] == 65536
    assert search["capability_policy"]["default"] == {"minimum_channels": "lexical", "network": "forbid"}
    assert "default" not in search["page_cursor"]
    assert input_schema("search")["required"] == ["query", "purpose_ref"]
    key = input_schema("capture")["properties"]["idempotency_key"]
    assert (key["minLength"], key["maxLength"]) == (4, 256)  # 16 bytes can be 4 four-byte characters
    get = input_schema("get")["properties"]["record_id"]
    assert get["pattern"] == "^mem_[a-z2-7]+$" and get["maxLength"] == 512
    comp = input_schema("capture")["properties"]["payload"]["properties"]["components"]
    assert (comp["minItems"], comp["maxItems"]) == (1, 64)
    assert comp["items"]["properties"]["citation_ids"]["uniqueItems"] is True


def test_schemas_are_fresh_copies() -> None:
    input_schema("search")["properties"].clear()
    assert input_schema("search")["properties"]


def test_tool_names() -> None:
    assert TOOL_NAMES == {t: f"engram_memory_{t}" for t in TOOLS}


@pytest.mark.parametrize("tool", TOOLS)
def test_input_schema_agrees_with_model_on_samples(tool: str) -> None:
    validator = jsonschema.Draft202012Validator(input_schema(tool))
    args = full_args(tool)
    validator.validate(args)
    assert not validator.is_valid({**args, "confirmed": True})
    assert not validator.is_valid({**args, next(iter(args)): None})


@pytest.mark.parametrize("tool", TOOLS)
def test_output_schema_accepts_real_envelopes(tool: str) -> None:
    validator = jsonschema.Draft202012Validator(output_schema(tool))
    good = success(sample_value(tool), "audit-1")
    validator.validate(good)
    for code in CATALOG:
        validator.validate(failure(code, "audit-1"))
    for path, _ in objects_in(good):  # every object of the envelope, down to the record's trust
        assert not validator.is_valid(with_value(good, (*path, "extra"), 1) if path else {**good, "extra": 1})
    for bad in (
        with_value(good, ("output", "schema_version"), 2),
        {**good, "ok": False},
        {**failure("NOT_FOUND", "a"), "output": good["output"]},
        with_value(failure("NOT_FOUND", "a"), ("error", "code"), "NOT_A_CODE"),
        without(good, ("auditId",)),
    ):
        assert not validator.is_valid(bad)


@pytest.mark.parametrize("tool", TOOLS)
def test_official_mcp_client_accepts_the_schemas(tool: str) -> None:
    listed = mcp.types.Tool(name=TOOL_NAMES[tool], input_schema=input_schema(tool), output_schema=output_schema(tool))
    wire = json.loads(listed.model_dump_json(by_alias=True, exclude_none=True))
    assert wire["inputSchema"] == input_schema(tool) and wire["outputSchema"] == output_schema(tool)
    # The same compile-and-check path ClientSession.call_tool uses on every structured result.
    fake_session = SimpleNamespace(_tool_output_validators={})
    validator = ClientSession._output_schema_validator(fake_session, TOOL_NAMES[tool], wire["outputSchema"])
    assert validator.is_valid(success(sample_value(tool), "audit-1"))
    assert validator.is_valid(failure("STORE_UNAVAILABLE", "audit-1"))
    assert not validator.is_valid({**success(sample_value(tool), "audit-1"), "extra": True})


# ---- properties -----------------------------------------------------------------------------

REF = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
SAFE = st.integers(-(2**53 - 1), 2**53 - 1)
INSTANTS = st.datetimes().map(
    lambda d: (
        f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}."
        f"{d.microsecond // 1000:03d}Z"
    )
)


def _utf16(s: str) -> bytes:
    return nfc(s).encode("utf-16-be")


@st.composite
def captures(draw: st.DrawFn) -> dict[str, Any]:
    cits = draw(st.lists(REF, min_size=1, max_size=5, unique_by=nfc))
    comp_ids = draw(st.lists(REF, min_size=1, max_size=4, unique_by=nfc))
    components = [
        {
            "component_id": cid,
            "kind": draw(st.sampled_from(["context", "decision", "evidence"])),
            "text": draw(st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)),
            "citation_ids": draw(st.lists(st.sampled_from(cits), min_size=1, unique=True)),
        }
        for cid in comp_ids
    ]
    primary = draw(st.sampled_from(components))
    t = draw(SAFE)
    valid_time = {"t": t}
    if draw(st.booleans()):
        valid_time["t_end"] = draw(st.integers(t, 2**53 - 1))
    citations = []
    for cid in cits:
        citation = {
            "citation_id": cid,
            "source_ref": draw(REF),
            "locator": {"scheme": draw(REF), "value": draw(REF)},
            "content_digest": "sha256:" + draw(st.text("0123456789abcdef", min_size=64, max_size=64)),
        }
        if draw(st.booleans()):
            citation["observed_at"] = draw(INSTANTS)
        citations.append(citation)
    payload = {
        "schema_version": 2,
        "purpose_ref": draw(REF),
        "valid_time": valid_time,
        "components": components,
        "primary_component_id": primary["component_id"],
        "primary_event": {
            "at": draw(SAFE),
            "type_ref": draw(REF),
            "citation_id": draw(st.sampled_from(primary["citation_ids"])),
        },
        "citations": citations,
    }
    if draw(st.booleans()):
        payload["retention"] = {"derivative_rule": draw(st.sampled_from(["retain", "make-ineligible"]))}
        if draw(st.booleans()):
            payload["retention"]["expires_at"] = draw(INSTANTS)
    if draw(st.booleans()):
        refs = draw(st.lists(REF, max_size=6, unique_by=nfc))
        payload["reconciliation"] = {"family_refs": sorted(refs, key=_utf16)}
    evidence = {
        "evidence_ref": draw(REF),
        "evidence_digest": D,
        "citation_ids": draw(st.lists(st.sampled_from(cits), min_size=1, unique=True)),
    }
    if draw(st.booleans()):
        evidence["attestation"] = draw(st.text(st.characters(codec="utf-8"), max_size=30))
    key = draw(st.text(st.characters(codec="utf-8"), min_size=16, max_size=40))
    return {"idempotency_key": key, "payload": payload, "evidence": evidence}


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(captures())
def test_valid_capture_survives_parse_plain_parse(args: dict[str, Any]) -> None:
    first = parse_input("capture", args)
    assert isinstance(first, CaptureInput)
    plain = to_plain(first)
    second = parse_input("capture", plain)
    assert second == first
    assert to_plain(second) == plain
    # the published schema is never stricter than the model on valid input
    jsonschema.Draft202012Validator(input_schema("capture")).validate(plain)
    # everything in the plain form is already NFC
    for text in _strings(plain):
        assert text == nfc(text)


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


@settings(max_examples=300)
@given(st.text(st.characters(codec="utf-8"), max_size=200))
def test_opaque_ref_accepts_exactly_the_nfc_byte_range(text: str) -> None:
    size = len(nfc(text).encode())
    args = {"candidate_id": CID, "idempotency_key": KEY, "reason_ref": text}
    if 1 <= size <= 512:
        assert to_plain(parse_input("withdraw", args))["reason_ref"] == nfc(text)
    else:
        refused("withdraw", args)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200)
@given(st.sampled_from(TOOLS), JSON)
def test_parser_only_ever_raises_invalid_schema(tool: str, garbage: Any) -> None:
    try:
        parse_input(tool, garbage)
    except EngramError as exc:
        assert exc.code == "INVALID_SCHEMA"
