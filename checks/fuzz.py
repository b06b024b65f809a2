"""Hostile input: schema-driven, mutated tool arguments sent to a REAL server over stdio.

Arguments are generated from the input schemas the server publishes (``tools/list``), then
mutated (extra fields, nulls, wrong types, bounds +-1 in UTF-8 bytes, non-NFC text, lone
surrogates, deep nesting, 1e400 and -0, arguments over 1 MiB, malformed ids and cursors) and
sent through the MCP SDK's own ``ClientSession`` to ``python -m engram_memory.server.cli serve``
(a subprocess: eval never imports the server). What the SDK client cannot put on the wire
(lone surrogates, 1e400, non-object arguments, multi-MiB frames) goes as raw JSON-RPC frames
to a second server. Every call has a timeout. Checked for every answer:

* it is a success envelope, or the failure envelope with a catalog code, its catalog message
  and retriable flag, or a JSON-RPC error whose code is one of -32700/-32600/-32601/-32602/-32603;
* no answer contains the run's marker (planted in every generated string value);
* every request is answered (a timeout is a violation), and the server answers a normal
  ``tools/list`` after every batch;
* a fixed search/get read back after every batch is unchanged, and the store's row counts
  (read from ``engram.duckdb`` read-only after the server stops) change only by what the
  calls that succeeded explain.

Each case is generated from ``random.Random(f"{seed}:{index}")``: a violation's (seed, index)
reproduces it (``engram-memory fuzz --seed S --only INDEX``).

    engram-memory fuzz --calls 100000 --seed 7 --out out/fuzz
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import os
import random
import select
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from engram_memory.models.errors import CATALOG
from engram_memory.models.limits import (
    IDEMPOTENCY_KEY_MAX_BYTES,
    IDEMPOTENCY_KEY_MIN_BYTES,
    LIMIT_MAX,
    LIMIT_MIN,
    MAX_ARGUMENT_BYTES,
    OPAQUE_MAX_BYTES,
    PACKET_BYTES_MAX,
    PACKET_BYTES_MIN,
    QUERY_MAX_BYTES,
    TEXT_MAX_BYTES,
)

JSONRPC_CODES = frozenset({-32700, -32600, -32601, -32602, -32603})
CATALOG_CODES = {code.value: spec for code, spec in CATALOG.items()}
TOOLS = ("search", "get", "capture", "request_admission", "withdraw", "forget")
MUTATING = frozenset({"capture", "request_admission", "withdraw", "forget"})
PREFIX = "engram_memory_"
PURPOSE = "purpose:fuzz-caf\u00e9"
CONTEXT = {"tenant": "tenant-fuzz", "workspace": "ws-fuzz", "principal": "fuzz@example.test",
           "agent_id": "agent-fuzz", "purpose_ref": PURPOSE}
STORE_TABLES = ("candidates", "records", "journal", "idempotency", "embeddings", "tombstoned_payloads")
SEED_TEXTS = ("The fuzz fixture decision alpha uses DuckDB for the ledger.",
              "The fuzz fixture decision beta keeps BM25 for lexical search.",
              "The fuzz fixture decision gamma stays pending forever.")
FIXED_QUERY = "fuzz fixture decision"


# ---- the marker --------------------------------------------------------------------------------


def make_marker(seed: int) -> str:
    """A string no reply could contain by chance (letters only: never a JSON escape)."""
    return "zqx" + hashlib.sha256(f"fuzz-marker:{seed}".encode()).hexdigest()[:12].translate(
        str.maketrans("0123456789", "ghijklmnop")) + "xqz"


def contains_marker(obj: Any, marker: str) -> bool:
    """Looks for the marker in any spelling a reply could carry it (raw, escaped, NFC/NFD)."""
    text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, default=str)
    return marker in text or marker in unicodedata.normalize("NFC", text)


# ---- valid arguments from a schema -------------------------------------------------------------


@dataclass
class Fixtures:
    """Live ids from the seeded store, so some generated ids hit real targets."""

    record_ids: list[str] = field(default_factory=list)
    candidate_ids: list[str] = field(default_factory=list)
    cursors: list[str] = field(default_factory=list)


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


class Gen:
    """Valid instances of the published (closed, fully inlined) input schemas, with the marker
    in every free string so an echo of any of them is visible."""

    def __init__(self, rng: random.Random, marker: str, fixtures: Fixtures) -> None:
        self.rng = rng
        self.marker = marker
        self.fx = fixtures

    def text(self, lo: int, hi: int) -> str:
        """A string of [lo, hi] UTF-8 bytes carrying the marker (when it fits)."""
        rng = self.rng
        target = rng.randint(max(lo, len(self.marker) + 2), max(lo, min(hi, len(self.marker) + 40)))
        filler = rng.choice(["abc def ", "caf\u00e9 ", "\u65e5\u672c ", "\U0001f600 ", "x"])
        s = self.marker + " "
        while len(s.encode()) < target:
            s += filler
        while len(s.encode()) > hi:
            s = s[:-1]
        return s if len(s.encode()) >= lo else s + "a" * (lo - len(s.encode()))

    def string(self, name: str, schema: dict[str, Any]) -> str:
        rng = self.rng
        pattern = schema.get("pattern", "")
        if name == "purpose_ref":
            return PURPOSE if rng.random() < 0.9 else unicodedata.normalize("NFD", PURPOSE)
        if "mem_" in pattern:
            if self.fx.record_ids and rng.random() < 0.6:
                return rng.choice(self.fx.record_ids)
            return "mem_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz234567") for _ in range(26))
        if "candidate_" in pattern:
            if self.fx.candidate_ids and rng.random() < 0.6:
                return rng.choice(self.fx.candidate_ids)
            return "candidate_" + "".join(rng.choice("0123456789abcdef") for _ in range(64))
        if "sha256" in pattern:
            return "sha256:" + hashlib.sha256(str(rng.random()).encode()).hexdigest()
        if "T" in pattern and "Z" in pattern:  # an RFC 3339 instant with milliseconds
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(rng.randint(0, 4_000_000_000))) + ".000Z"
        if "enum" in schema:
            return rng.choice(schema["enum"])
        if name == "idempotency_key":
            return self.text(IDEMPOTENCY_KEY_MIN_BYTES, 64) + str(rng.getrandbits(64))
        if name == "page_cursor" and self.fx.cursors and rng.random() < 0.5:
            return rng.choice(self.fx.cursors)
        return self.text(max(1, schema.get("minLength", 1)), min(schema.get("maxLength", 512), 200))

    def value(self, name: str, schema: dict[str, Any]) -> Any:
        rng = self.rng
        if "const" in schema:
            return schema["const"]
        kind = schema.get("type")
        if kind == "object":
            props = schema.get("properties", {})
            required = set(schema.get("required", []))
            return {k: self.value(k, s) for k, s in props.items() if k in required or rng.random() < 0.5}
        if kind == "array":
            n = rng.randint(schema.get("minItems", 0), min(schema.get("maxItems", 3), 3))
            items = [self.value(name, schema.get("items", {})) for _ in range(n)]
            return list(dict.fromkeys(items)) if schema.get("uniqueItems") else items
        if kind == "integer":
            lo, hi = schema.get("minimum", -(2**31)), schema.get("maximum", 2**31)
            if name in ("t", "at", "t_end"):
                return int(time.time() * 1000) - rng.randint(60_000, 10**9)
            return rng.choice([lo, hi, rng.randint(lo, hi)])
        if kind == "string":
            return self.string(name, schema)
        if kind == "boolean":
            return rng.random() < 0.5
        return self.text(1, 40)

    def capture(self) -> dict[str, Any]:
        """A coherent capture (citations and ids that match), which the server may accept."""
        now = int(time.time() * 1000) - 60_000
        text = self.text(1, 300)
        return {
            "idempotency_key": "fuzz-" + self.marker + "-" + str(self.rng.getrandbits(64)),
            "payload": {
                "schema_version": 2, "purpose_ref": PURPOSE, "valid_time": {"t": now},
                "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["s1"]}],
                "primary_component_id": "c1",
                "primary_event": {"at": now, "type_ref": "event:decided", "citation_id": "s1"},
                "citations": [{"citation_id": "s1", "source_ref": "doc:" + self.marker,
                               "locator": {"scheme": "path", "value": "docs/" + self.marker},
                               "content_digest": sha(text)}],
            },
            "evidence": {"evidence_ref": "ev:" + self.marker, "evidence_digest": sha("ev" + text),
                         "citation_ids": ["s1"]},
        }


# ---- mutations ---------------------------------------------------------------------------------


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``obj`` (dict keys and list indexes), the root excluded."""
    out: list[tuple[Any, ...]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((*prefix, k))
            out.extend(paths(v, (*prefix, k)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append((*prefix, i))
            out.extend(paths(v, (*prefix, i)))
    return out


def schema_at(schema: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    node = schema
    for step in path:
        node = node.get("items", {}) if isinstance(step, int) else node.get("properties", {}).get(step, {})
    return node


def get_at(obj: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        obj = obj[step]
    return obj


def set_at(obj: Any, path: tuple[Any, ...], value: Any) -> None:
    get_at(obj, path[:-1])[path[-1]] = value


def nest(depth: int, leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def bytes_string(rng: random.Random, marker: str, n: int) -> str:
    """Exactly ``n`` UTF-8 bytes (n >= 0), the marker first when it fits, multi-byte chars mixed in."""
    parts = [marker] if n >= len(marker) else []
    size = len(marker) if parts else 0
    pieces = ["a", "\u00e9", "\u65e5", "\U0001f600"]
    while size < n:
        room = n - size
        piece = rng.choice(pieces)
        if len(piece.encode()) > room:
            piece = "a"
        chunk = piece * max(1, min(room // len(piece.encode()), rng.randint(1, 64)))
        parts.append(chunk)
        size += len(chunk.encode())
    return "".join(parts)


BYTE_BOUNDS = {"query": QUERY_MAX_BYTES, "text": TEXT_MAX_BYTES, "idempotency_key": IDEMPOTENCY_KEY_MAX_BYTES,
               "attestation": 4096}


@dataclass
class Case:
    index: int
    tool: str  # a tool name without the prefix, or a raw name for unknown-tool cases
    mutation: str
    arguments: Any
    raw: bytes | None = None  # set: sent as a raw frame, not through the SDK client
    name: str | None = None  # the wire tool name when it is not PREFIX + tool


def mutate(rng: random.Random, marker: str, tool: str, args: dict[str, Any], schema: dict[str, Any],
           fx: Fixtures) -> tuple[str, Any, bytes | None]:
    """One mutation of valid ``args``: (its name, the new arguments, a raw frame if the SDK can't send it)."""
    spots = paths(args)
    path = rng.choice(spots) if spots else ()
    kind = rng.choice([
        "none", "extra_field", "extra_nested", "drop_required", "null", "wrong_type", "string_bounds",
        "int_bounds", "float_for_int", "non_nfc", "deep_nesting", "huge_argument", "bad_id", "bad_cursor",
        "lone_surrogate", "number_1e400", "negative_zero", "empty_object", "unknown_tool", "non_object_raw",
        "many_components", "protocol_frame",
    ])
    a = copy.deepcopy(args)
    if kind == "none":
        return "none", a, None
    if kind == "extra_field":
        a[marker + "_extra"] = rng.choice([marker, 1, None, [marker], {marker: marker}])
        return kind, a, None
    if kind == "extra_nested":
        objs = [p for p in spots if isinstance(get_at(a, p), dict)]
        if not objs:
            a["_" + marker] = marker
            return "extra_field", a, None
        get_at(a, rng.choice(objs))[marker] = marker
        return kind, a, None
    if kind == "drop_required":
        if not path:
            return "empty_object", {}, None
        parent = get_at(a, path[:-1])
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.clear()  # an empty array (below minItems where one is set)
        return kind, a, None
    if kind == "null":
        if path:
            set_at(a, path, None)
        return kind, a if path else {"query": None}, None
    if kind == "wrong_type":
        current = get_at(a, path) if path else a
        options = [1, 1.5, True, False, marker, [marker], {marker: 1}, "1", "true", [], {}]
        options = [o for o in options if type(o) is not type(current)]
        if path:
            set_at(a, path, rng.choice(options))
        return kind, a, None
    if kind == "string_bounds":
        strings = [p for p in spots if isinstance(get_at(a, p), str) and isinstance(p[-1], str)]
        if not strings:
            return "none", a, None
        p = rng.choice(strings)
        s = schema_at(schema, p)
        limit = BYTE_BOUNDS.get(p[-1], s.get("maxLength", OPAQUE_MAX_BYTES) if "pattern" not in s else 512)
        lo = IDEMPOTENCY_KEY_MIN_BYTES if p[-1] == "idempotency_key" else s.get("minLength", 1)
        n = rng.choice([limit, limit + 1, lo, max(0, lo - 1), 0, limit * 4 + 3])
        set_at(a, p, bytes_string(rng, marker, n))
        return f"{kind}:{p[-1]}:{n}", a, None
    if kind == "int_bounds":
        ints = [p for p in spots if type(get_at(a, p)) is int]
        extra = {"search": ["limit", "max_packet_bytes"], "get": ["max_packet_bytes"]}.get(tool, [])
        if extra and (not ints or rng.random() < 0.6):
            name = rng.choice(extra)
            values = {"limit": [LIMIT_MIN - 1, LIMIT_MIN, LIMIT_MAX, LIMIT_MAX + 1, -1, 2**63],
                      "max_packet_bytes": [PACKET_BYTES_MIN - 1, PACKET_BYTES_MIN, PACKET_BYTES_MAX,
                                           PACKET_BYTES_MAX + 1, 0, 2**64]}[name]
            a[name] = rng.choice(values)
            return f"{kind}:{name}:{a[name]}", a, None
        if not ints:
            return "none", a, None
        p = rng.choice(ints)
        s = schema_at(schema, p)
        lo, hi = s.get("minimum", 0), s.get("maximum", 2**53)
        set_at(a, p, rng.choice([lo - 1, lo, hi, hi + 1, 2**64, -(2**64)]))
        return f"{kind}:{p[-1]}", a, None
    if kind == "float_for_int":
        field = "limit" if tool == "search" else None
        ints = [p for p in spots if type(get_at(a, p)) is int]
        value = rng.choice([5.0, 5.5, -0.0, 1e308, float(LIMIT_MAX) + 0.5])
        if field:
            a[field] = value
        elif ints:
            set_at(a, rng.choice(ints), value)
        return f"{kind}:{value!r}", a, None
    if kind == "non_nfc":
        strings = [p for p in spots if isinstance(get_at(a, p), str)]
        if not strings:
            return "none", a, None
        p = rng.choice(strings)
        set_at(a, p, unicodedata.normalize("NFD", get_at(a, p) + " cafe\u0301 \u212b \ufb01 ") + marker)
        if rng.random() < 0.3:  # two keys that collide once NFC'd
            a["cafe\u0301" + marker] = 1
            a["caf\u00e9" + marker] = 2
        return kind, a, None
    if kind == "deep_nesting":
        depth = rng.choice([32, 100, 400, 900])
        if path:
            set_at(a, path, nest(depth, marker))
        else:
            a[marker] = nest(depth, marker)
        return f"{kind}:{depth}", a, None
    if kind == "huge_argument":
        n = rng.choice([MAX_ARGUMENT_BYTES - 10, MAX_ARGUMENT_BYTES + 1, MAX_ARGUMENT_BYTES + 4096])
        target = rng.choice(["extra", "field"])
        strings = [p for p in spots if isinstance(get_at(a, p), str)]
        if target == "field" and strings:
            set_at(a, rng.choice(strings), bytes_string(rng, marker, n))
        else:
            a[marker] = bytes_string(rng, marker, n)
        return f"{kind}:{n}", a, None
    if kind == "many_components" and tool == "capture":
        # every field within its bound, the whole over 1 MiB
        comp = a["payload"]["components"][0] if a.get("payload", {}).get("components") else None
        if isinstance(comp, dict):
            body = bytes_string(rng, marker, 17_000)
            a["payload"]["components"] = [dict(comp, component_id=f"c{i}", text=body) for i in range(64)]
            a["payload"]["components"][0]["component_id"] = a["payload"].get("primary_component_id", "c1")
        return "many_components", a, None
    if kind == "bad_id":
        bad = rng.choice([
            "mem_", "mem_ABC", "mem_018", "mem_abc\n", "mem_abc\u0000", "MEM_abc", "mem_" + "a" * 600,
            "candidate_" + "0" * 63, "candidate_" + "0" * 65, "candidate_" + "A" * 64,
            "candidate_" + "0" * 64 + "\n", "sha256:" + "0" * 63, "sha256:" + "G" * 64, marker,
            "mem_" + marker, "candidate_" + marker,
        ])
        ids = [p for p in spots if isinstance(p[-1], str) and p[-1] in (
            "record_id", "candidate_id", "content_digest", "evidence_digest", "observed_at", "expires_at")]
        if ids:
            set_at(a, rng.choice(ids), bad)
        else:
            a["record_id"] = bad
        return "bad_id", a, None
    if kind == "bad_cursor":
        cur = rng.choice(fx.cursors) if fx.cursors else base64.urlsafe_b64encode(os.urandom(40)).decode()
        i = rng.randrange(len(cur))
        bad = rng.choice([
            cur[:i] + ("A" if cur[i] != "A" else "B") + cur[i + 1:], cur[:-1], cur + "=", cur + marker,
            marker, base64.urlsafe_b64encode(marker.encode() * 5).decode(), "", " ", "a" * 513,
        ])
        if tool == "search":
            a["page_cursor"] = bad
        else:
            a["page_cursor"] = bad  # an unknown field for the others
        return "bad_cursor", a, None
    if kind == "empty_object":
        return kind, {}, None
    if kind == "unknown_tool":
        return kind, a, None  # the runner renames the tool
    # ---- what the SDK client cannot send: raw frames ----
    if kind == "lone_surrogate":
        strings = [p for p in spots if isinstance(get_at(a, p), str)]
        if strings:
            p = rng.choice(strings)
            set_at(a, p, get_at(a, p) + rng.choice(["\ud800", "\udfff", "\udc00x"]) + marker)
        else:
            a[marker] = "\ud83d" + marker
        return kind, a, _frame(tool, json.dumps(a).encode())
    if kind == "number_1e400":
        text = json.dumps(a)
        literal = rng.choice(["1e400", "-1e400", "1E+999", "123456789012345678901234567890", "0.1e-400"])
        if tool == "search":
            body = text[:-1] + (", " if a else "") + '"limit": ' + literal + "}"
        else:
            body = text[:-1] + (", " if a else "") + '"' + marker + '": ' + literal + "}"
        return f"{kind}:{literal}", a, _frame(tool, body.encode())
    if kind == "negative_zero":
        body = json.dumps(dict(a, **({"limit": 0} if tool == "search" else {"max_packet_bytes": 0})))
        body = body.replace('": 0}', '": -0}').replace('": 0,', '": -0,')
        return kind, a, _frame(tool, body.encode())
    if kind == "protocol_frame":  # frames wrong at the JSON-RPC level, each carrying the marker
        m = marker.encode()
        return kind, a, rng.choice([
            b'{"jsonrpc":"2.0","id":1,"method":"' + m + b'/call"}',  # unknown method
            b'{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"' + m + b'"}}',  # unserved
            b'{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"' + m + b'"}}',  # version
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"' + m + b'"}',  # params not an object
            b'{"jsonrpc":"2.0","id":1,"method":"tools/\\ud800' + m + b'"}',  # lone surrogate in method
            b"not json " + m,  # a non-JSON line
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\xff' + m + b'"}}',  # not UTF-8
        ])
    if kind == "non_object_raw":
        body = rng.choice(["[1, 2]", json.dumps(marker), "null", "1", "true", "[" * 5000 + "]" * 5000])
        return kind, a, _frame(tool, body.encode())
    return "none", a, None


def _frame(tool: str, arguments_json: bytes, request_id: Any = 1) -> bytes:
    head = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}).encode()[:-1]
    return head + b', "params": {"name": "' + (PREFIX + tool).encode() + b'", "arguments": ' + arguments_json + b"}}"


def make_case(seed: int, index: int, marker: str, schemas: dict[str, dict[str, Any]], fx: Fixtures) -> Case:
    rng = random.Random(f"{seed}:{index}")
    tool = rng.choice(TOOLS)
    gen = Gen(rng, marker, fx)
    args = gen.capture() if tool == "capture" and rng.random() < 0.5 else gen.value("", schemas[tool])
    if not isinstance(args, dict):
        args = {}
    mutation, new, raw = mutate(rng, marker, tool, args, schemas[tool], fx)
    case = Case(index, tool, mutation, new, raw)
    if mutation == "unknown_tool":
        case.name = rng.choice([PREFIX + marker, "engram_memory_Search", PREFIX + tool + " ", tool, "", marker])
    return case


# ---- checks ------------------------------------------------------------------------------------


def check_envelope(envelope: Any, text: str | None, is_error: bool | None) -> str:
    """The outcome code ("ok" or the catalog code); raises AssertionError on an off-contract answer."""
    assert isinstance(envelope, dict), "structuredContent is not an object"
    if text is not None:
        assert json.loads(text) == envelope, "text copy differs from structuredContent"
    assert envelope.get("redactionClass") == "high", "redactionClass"
    audit = envelope.get("auditId")
    assert isinstance(audit, str) and audit.startswith("aud_") and len(audit) == 30, "auditId"
    if envelope.get("ok") is True:
        assert set(envelope) == {"ok", "output", "auditId", "redactionClass"}, "success keys"
        assert is_error in (None, False), "isError on a success"
        return "ok"
    assert envelope.get("ok") is False, "ok is neither true nor false"
    assert set(envelope) == {"ok", "auditId", "redactionClass", "error"}, "failure keys"
    assert is_error in (None, True), "isError false on a failure"
    err = envelope["error"]
    assert set(err) == {"code", "message", "retriable"}, "error keys"
    spec = CATALOG_CODES.get(err["code"])
    assert spec is not None, f"code {err['code']!r} not in the catalog"
    assert err["message"] == spec.message and err["retriable"] is spec.retriable, "message/retriable off-catalog"
    return str(err["code"])


def check_rpc_error(code: Any, message: Any, data: Any) -> str:
    assert code in JSONRPC_CODES, f"JSON-RPC error code {code!r} not allowed"
    assert isinstance(message, str), "error message not a string"
    return f"rpc:{code}"


# ---- the two clients -----------------------------------------------------------------------------


def serve_argv(data_dir: Path, semantic: bool) -> list[str]:
    argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--data-dir", str(data_dir),
            "--tools", ",".join(TOOLS), "--rate-limit", "0"]
    for k, v in CONTEXT.items():
        argv += ["--" + k.replace("_", "-"), v]
    return argv + ([] if semantic else ["--no-semantic"])


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    return env


class RawClient:
    """JSON-RPC lines straight to a server's stdin (for what the SDK client refuses to send)."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr: Any) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        self._buf = b""
        self.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz-raw", "version": "1"}}})
            .encode())
        assert self.answer(120)["id"] == 0
        self.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')

    def send(self, raw: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                raise TimeoutError("no answer")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise EOFError("server closed stdout")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.communicate()


# ---- the run -------------------------------------------------------------------------------------


@dataclass
class Summary:
    seed: int
    calls: int = 0
    per_tool: Counter[str] = field(default_factory=Counter)
    per_outcome: Counter[str] = field(default_factory=Counter)
    per_mutation: Counter[str] = field(default_factory=Counter)
    ok_mutations: Counter[str] = field(default_factory=Counter)  # successful mutating calls per tool
    violations: list[dict[str, Any]] = field(default_factory=list)
    store_before: dict[str, int] = field(default_factory=dict)
    store_after: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "calls": self.calls, "seconds": round(self.seconds, 2),
            "per_tool": dict(sorted(self.per_tool.items())),
            "per_outcome": dict(sorted(self.per_outcome.items())),
            "per_mutation": dict(sorted(self.per_mutation.items())),
            "successful_mutating_calls": dict(sorted(self.ok_mutations.items())),
            "store_before": self.store_before, "store_after": self.store_after,
            "violations": self.violations,
        }


_PER_CALL = frozenset({"rank_receipt", "issued_at", "receipt", "read_receipt", "packet_digest",
                       "response_digest", "next_page_cursor"})  # the last two cover the read instant too


def _stable(value: Any) -> Any:
    """A read's value without what legitimately differs per call: receipts carry the read instant
    (``valid_as_of``), and the digests and page cursor that cover them differ with it."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _PER_CALL}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _expired(record: dict[str, Any], now: float) -> bool:
    from datetime import datetime

    at = record.get("retention", {}).get("expires_at")
    return isinstance(at, str) and datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() <= now


def unexplained_change(before: list[Any], after: list[Any], now: float) -> str | None:
    """What changed in the fixed reads that no admission explains, or None.

    Records admitted with an ``expires_at`` stop being current when it passes (the contract):
    such a record leaving the search, and the other hits' scores and ranks moving with the index
    statistics, is explained. Anything else -- a new hit, a changed record, a changed get -- is not."""

    def hits(read: Any) -> dict[str, Any] | None:
        if not isinstance(read, str):
            return None
        return {h["record"]["record_id"]: h["record"] for h in json.loads(read).get("records", [])}

    problems = []
    old, new = hits(before[0]), hits(after[0])
    if old is None or new is None:
        if before[0] != after[0]:
            was, now_ = (before[0] if old is None else "ok"), (after[0] if new is None else "ok")
            problems.append(f"search answer {was} -> {now_}")
    else:
        gone = [rid for rid in old if rid not in new and not _expired(old[rid], now)]
        added = [rid for rid in new if rid not in old]
        changed = [rid for rid in new if rid in old and new[rid] != old[rid]]
        for label, ids in (("left the search", gone), ("entered the search", added), ("changed", changed)):
            if ids:
                problems.append(f"{len(ids)} record(s) {label}: {', '.join(ids[:3])}")
    for b, a in zip(before[1:], after[1:], strict=True):
        if b != a:
            problems.append(f"a get changed: {str(b)[:120]} -> {str(a)[:120]}")
    return "; ".join(problems) or None


def store_counts(data_dir: Path) -> dict[str, int]:
    import duckdb

    path = next(data_dir.rglob("*.duckdb"))
    con = duckdb.connect(str(path), read_only=True)
    try:
        counts = {t: int(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in STORE_TABLES}  # type: ignore[index]
        for table, col in (("candidates", "state"), ("records", "state")):
            for state, n in con.execute(f"SELECT {col}, count(*) FROM {table} GROUP BY 1").fetchall():
                counts[f"{table}.{state}"] = int(n)
        return counts
    finally:
        con.close()


def check_store(summary: Summary) -> None:
    """Rows change only by what successful calls explain; with none, not at all."""
    b, a, ok = summary.store_before, summary.store_after, summary.ok_mutations
    mutated = sum(ok.values())

    def viol(msg: str) -> None:
        summary.violations.append({"kind": "store_changed_by_refused_calls", "detail": msg,
                                   "before": b, "after": a, "successful_mutating_calls": dict(ok)})

    if mutated == 0 and {k: a.get(k, 0) for k in STORE_TABLES} != {k: b.get(k, 0) for k in STORE_TABLES}:
        viol("rows changed although no mutating call succeeded")
    if a.get("candidates", 0) - b.get("candidates", 0) > ok["capture"]:
        viol("more new candidates than successful captures")
    if a.get("records", 0) - b.get("records", 0) > ok["request_admission"]:
        viol("more new records than successful admissions")
    if a.get("records.forgotten", 0) + a.get("records.tombstoned", 0) != b.get("records.forgotten", 0) + b.get(
            "records.tombstoned", 0) and ok["forget"] == 0:
        viol("records forgotten without a successful forget")
    if a.get("candidates.withdrawn", 0) != b.get("candidates.withdrawn", 0) and ok["withdraw"] == 0:
        viol("candidates withdrawn without a successful withdraw")


def run_fuzz(calls: int, seed: int, work_dir: Path, *, semantic: bool = False, timeout: float = 30.0,
             batch: int = 250, only: int | None = None,
             progress: Callable[[int], None] | None = None) -> Summary:
    """Run ``calls`` cases (or just case ``only``) against fresh servers in ``work_dir``."""
    import anyio

    summary = Summary(seed)
    started = time.monotonic()
    anyio.run(_run, calls, seed, work_dir, semantic, timeout, batch, only, progress, summary)
    summary.seconds = time.monotonic() - started
    check_store(summary)
    return summary


async def _run(calls: int, seed: int, work_dir: Path, semantic: bool, timeout: float, batch: int,
               only: int | None, progress: Callable[[int], None] | None, summary: Summary) -> None:
    import anyio
    import mcp_types as types
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.shared.exceptions import MCPError

    marker = make_marker(seed)
    data_dir = work_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = offline_env()
    argv = serve_argv(data_dir, semantic)
    fx = Fixtures()
    stderr_path = work_dir / "server.stderr"

    async def decline(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")  # withdraw/forget are confirmed: the human says no

    def violation(case: Case, kind: str, detail: str) -> None:
        summary.violations.append({
            "kind": kind, "detail": detail[:2000], "seed": seed, "index": case.index, "tool": case.tool,
            "mutation": case.mutation, "reproduce": f"engram-memory fuzz --seed {seed} --only {case.index}",
        })

    with stderr_path.open("a") as errlog:
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
        # ---- seed the store: two admitted records, one pending candidate, a page cursor ----
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, elicitation_callback=decline) as session:
                await session.initialize()
                listed = await session.list_tools()
                schemas = {t.name.removeprefix(PREFIX): t.input_schema for t in listed.tools}
                assert set(schemas) == set(TOOLS), sorted(schemas)
                for i, text in enumerate(SEED_TEXTS):
                    gen = Gen(random.Random(i), "seed", fx)
                    args = gen.capture()
                    args["payload"]["components"][0]["text"] = text
                    args["payload"]["citations"][0]["content_digest"] = sha(text)
                    cap = (await session.call_tool(PREFIX + "capture", args)).structured_content or {}
                    assert cap.get("ok"), cap
                    cid = cap["output"]["value"]["candidate_id"]
                    fx.candidate_ids.append(cid)
                    if i < 2:
                        adm = (await session.call_tool(PREFIX + "request_admission", {
                            "candidate_id": cid, "idempotency_key": f"fuzz-seed-admit-{i:08d}"})).structured_content
                        assert adm and adm["ok"] and adm["output"]["value"]["outcome"]["status"] == "accepted", adm
                        fx.record_ids.append(adm["output"]["value"]["outcome"]["record_id"])
                page = (await session.call_tool(PREFIX + "search", {
                    "query": FIXED_QUERY, "purpose_ref": PURPOSE, "limit": 1})).structured_content or {}
                cursor = page.get("output", {}).get("value", {}).get("next_page_cursor")
                if cursor:
                    fx.cursors.append(cursor)
        summary.store_before = store_counts(data_dir)

        async def fixed_reads(session: ClientSession) -> Any:
            out = []
            reads: list[tuple[str, dict[str, Any]]] = [
                ("search", {"query": FIXED_QUERY, "purpose_ref": PURPOSE, "limit": 50}),
                *(("get", {"record_id": r, "purpose_ref": PURPOSE}) for r in fx.record_ids)]
            for name, args in reads:
                env_ = (await session.call_tool(PREFIX + name, args)).structured_content or {}
                value = env_.get("output", {}).get("value", {})
                out.append(json.dumps(_stable(value), sort_keys=True) if env_.get("ok") else env_.get("error"))
            return out

        raw_argv = serve_argv(work_dir / "raw-data", semantic)
        raw: RawClient | None = RawClient(raw_argv, env, errlog)
        # ---- the cases, in batches; the server restarts only after a lost answer ----
        indexes = [only] if only is not None else list(range(calls))
        pos = 0
        try:
            while pos < len(indexes):
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write, elicitation_callback=decline) as session:
                        await session.initialize()
                        baseline = await fixed_reads(session)
                        restart = False
                        while pos < len(indexes) and not restart:
                            chunk = indexes[pos:pos + batch]
                            pos += len(chunk)
                            admitted_before = summary.ok_mutations["request_admission"]
                            for index in chunk:
                                case = make_case(seed, index, marker, schemas, fx)
                                outcome = await _one(case, session, raw, timeout, marker, violation, summary,
                                                     MCPError, types, argv, env, errlog)
                                if outcome == "restart":
                                    restart = True
                                    break
                                if outcome == "reraw":
                                    if raw is not None:
                                        raw.close()
                                    raw = RawClient(raw_argv, env, errlog)
                                if progress:
                                    progress(1)
                            # the server is still up and the fixed reads are unchanged
                            try:
                                with anyio.fail_after(timeout):
                                    listed = await session.list_tools()
                                    assert len(listed.tools) == len(TOOLS)
                                    now = await fixed_reads(session)
                            except Exception as exc:  # noqa: BLE001
                                violation(Case(chunk[-1], "-", "after-batch", None), "server_down_after_batch",
                                          repr(exc))
                                break
                            if now != baseline:
                                why = unexplained_change(baseline, now, time.time())
                                if why is None:
                                    summary.per_outcome["fixed_reads:expiry"] += 1  # explained, counted
                                elif summary.ok_mutations["request_admission"] == admitted_before:
                                    violation(Case(chunk[-1], "-", "after-batch", None), "fixed_reads_changed",
                                              f"batch {chunk[0]}..{chunk[-1]}: {why}")
                                baseline = now
        finally:
            if raw is not None:
                raw.close()
    summary.store_after = store_counts(data_dir)
    raw_counts = store_counts(work_dir / "raw-data")
    if any(raw_counts.get(t, 0) for t in STORE_TABLES):  # nothing but refused frames ever reached it
        summary.violations.append({"kind": "store_changed_by_refused_calls", "detail": "raw-frame server",
                                   "after": raw_counts})


async def _one(case: Case, session: Any, raw: RawClient | None, timeout: float, marker: str,
               violation: Callable[[Case, str, str], None], summary: Summary, MCPError: Any, types: Any,
               argv: list[str], env: dict[str, str], errlog: Any) -> str:
    import anyio

    summary.calls += 1
    summary.per_tool[case.tool] += 1
    summary.per_mutation[case.mutation.split(":")[0]] += 1
    name = case.name if case.name is not None else PREFIX + case.tool
    outcome = "?"
    if case.raw is not None:
        assert raw is not None
        try:
            frame = case.raw

            def exchange() -> dict[str, Any]:
                raw.send(frame)
                return raw.answer(timeout)

            with anyio.fail_after(timeout + 5):  # a write the server never reads is a lost answer too
                reply = await anyio.to_thread.run_sync(exchange, abandon_on_cancel=True)
        except (TimeoutError, EOFError, BrokenPipeError) as exc:
            violation(case, "no_answer", f"raw frame: {exc!r}")
            summary.per_outcome["violation"] += 1
            return "reraw"
        try:
            assert reply.get("jsonrpc") == "2.0", "wrong jsonrpc"
            # JSON-RPC: a frame that does not parse is answered with id null
            parse_error = "error" in reply and reply["error"].get("code") == -32700
            assert reply.get("id") == (None if parse_error else 1), "wrong id"
            if "error" in reply:
                e = reply["error"]
                outcome = check_rpc_error(e.get("code"), e.get("message"), e.get("data"))
            else:
                result = reply["result"]
                content = result.get("content") or [{}]
                outcome = check_envelope(result.get("structuredContent"), content[0].get("text"),
                                         result.get("isError"))
            assert not contains_marker(reply, marker), "reply echoes input"
        except (AssertionError, KeyError, TypeError) as exc:
            violation(case, "off_contract", f"{exc}: {json.dumps(reply)[:1500]}")
            outcome = "violation"
        summary.per_outcome[outcome] += 1
        return outcome
    try:
        with anyio.fail_after(timeout):
            result = await session.call_tool(name, case.arguments)
    except TimeoutError:
        violation(case, "no_answer", f"no answer within {timeout}s")
        summary.per_outcome["violation"] += 1
        return "restart"
    except MCPError as exc:
        err = exc.error
        try:
            outcome = check_rpc_error(err.code, err.message, err.data)
            assert not contains_marker([err.message, err.data], marker), "JSON-RPC error echoes input"
        except AssertionError as a:
            violation(case, "off_contract", f"{a}: {err!r}"[:1500])
            outcome = "violation"
        summary.per_outcome[outcome] += 1
        return outcome
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
        violation(case, "server_down", repr(exc))
        summary.per_outcome["violation"] += 1
        return "restart"
    except Exception as exc:  # noqa: BLE001 - the SDK client refused to send it: the same bytes go raw
        summary.per_outcome["client_refused:" + type(exc).__name__] += 1
        try:
            case.raw = _frame(case.tool, json.dumps(case.arguments).encode())
        except (ValueError, RecursionError):
            return "client_refused"
        if case.name is not None:
            return "client_refused"
        summary.calls -= 1
        summary.per_tool[case.tool] -= 1
        summary.per_mutation[case.mutation.split(":")[0]] -= 1
        return await _one(case, session, raw, timeout, marker, violation, summary, MCPError, types, argv, env,
                          errlog)
    try:
        text = result.content[0].text if len(result.content) == 1 else None
        assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent), "content"
        outcome = check_envelope(result.structured_content, text, result.is_error)
        assert not contains_marker(result.model_dump(mode="json"), marker), "reply echoes input"
    except AssertionError as exc:
        violation(case, "off_contract", f"{exc}: {result.model_dump_json()[:1500]}")
        outcome = "violation"
    if outcome == "ok" and case.tool in MUTATING and case.name is None:
        summary.ok_mutations[case.tool] += 1
    summary.per_outcome[outcome] += 1
    return outcome


# ---- the command -------------------------------------------------------------------------------


def fuzz_cmd(
    calls: Annotated[int, typer.Option("--calls", min=1, help="Generated tool calls.")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Seed: case i is random.Random(f'{seed}:{i}').")] = 0,
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="Output dir: fuzz.json, server.stderr.")] = Path(
        "out/fuzz"),
    only: Annotated[int | None, typer.Option("--only", help="Run just this case index (reproduce).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds to wait for each answer.")] = 30.0,
    semantic: Annotated[bool, typer.Option("--semantic/--no-semantic", help="Load the embedding model.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar on stderr.")] = True,
) -> None:
    """Hostile input: schema-generated, mutated tool calls against a real stdio server; exit 1 on a violation."""
    from tqdm import tqdm

    out.mkdir(parents=True, exist_ok=True)
    total = 1 if only is not None else calls
    with tempfile.TemporaryDirectory(prefix="engram-fuzz-") as tmp, tqdm(
            total=total, disable=not progress, unit="call", file=sys.stderr) as bar:
        summary = run_fuzz(calls, seed, Path(tmp), semantic=semantic, timeout=timeout, only=only,
                           progress=bar.update)
        stderr_src = Path(tmp) / "server.stderr"
        if stderr_src.exists():
            (out / "server.stderr").write_bytes(stderr_src.read_bytes()[-5_000_000:])
    report = summary.as_json()
    (out / "fuzz.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    rate = summary.calls / summary.seconds if summary.seconds else math.nan
    sys.stdout.write(f"{summary.calls} calls in {summary.seconds:.1f}s ({rate:.0f}/s), "
                     f"{len(summary.violations)} violation(s); summary: {out / 'fuzz.json'}\n")
    raise typer.Exit(1 if summary.violations else 0)
