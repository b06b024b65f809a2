"""Golden transcript: one scripted stdio MCP session, compared byte for byte with tests/golden/transcript.json.

The golden pins the WIRE BYTES of today's behaviour: the initialize answer (serverInfo name, title and
instructions; never the SDK's version strings nor protocolVersion), the full tools/list definitions, the
exact text content (the canonical JSON envelope) and isError of every tools/call, and the code and message of
every protocol error. A real ``serve`` subprocess (conftest's ``mcp_server``/``serve_argv``) is driven by the
MCP SDK's ClientSession, under a pinned store clock (ENGRAM_CLOCK_MS) with every instant and idempotency key
in the arguments fixed, so the same script yields the same bytes.

Only values random by construction are normalised, on the parsed JSON, before re-serialising exactly like
the server does (``json.dumps(ensure_ascii=False, separators=(",", ":"))``, asserted to reproduce the
server's text first, so the comparison stays byte-level):

* ``auditId`` (128 random bits per call) -> ``aud_<n>`` in order of appearance;
* ``next_page_cursor`` (HMAC'd with the data dir's random ``server.key``), and every ``page_cursor``
  argument echoing one -> ``<cursor n>``;
* the ``response_digest`` of a page that carries a ``next_page_cursor`` (it digests the cursor's bytes, so
  it is as random as the cursor) -> ``<response_digest of a page with cursor n>``.

Everything else -- digests, ids, cursors of the journal, scores, receipts, messages -- is compared exactly,
with one allowance for the CPU: the model's float32 arithmetic follows the machine's instruction set
(AVX2 and AVX-512 kernels differ by ~1e-7), so a float that differs from the golden by at most
``MODEL_FLOAT_TOLERANCE`` is taken as the golden's, and so are the two digests that cover such floats
(``rank_receipt.receipt_digest``, ``response_digest``) -- once the receipt digest is checked to be the
digest of the receipt as served. Ids, ranks, orders and every other byte still must match exactly.

Re-record ONLY ON PURPOSE (a deliberate change of the wire), and say why in the commit message::

    ENGRAM_GOLDEN_RECORD=1 HF_HUB_OFFLINE=1 python -m pytest -q -p no:cacheprovider tests/test_golden_transcript.py

With ENGRAM_GOLDEN_RECORD=1 the test writes the golden file instead of comparing (and passes). Review the
diff of tests/golden/transcript.json before committing it: every changed byte is a changed answer.
"""

from __future__ import annotations

import base64
import difflib
import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from engram_memory.models.digests import receipt_digest
from tests import conftest
from tests.conftest import PURPOSE, Backend, Human, Mcp, check_result, mcp_server, serve_argv

pytestmark = pytest.mark.anyio

GOLDEN = Path(__file__).parent / "golden" / "transcript.json"
RECORD = os.environ.get("ENGRAM_GOLDEN_RECORD") == "1"

# The pinned store clock of segment A, and the later one of segment B (past the expiring record's expires_at).
CLOCK_A_MS = 1_767_225_600_000  # 2026-01-01T00:00:00.000Z
CLOCK_B_MS = CLOCK_A_MS + 2 * 86_400_000  # 2026-01-03T00:00:00.000Z
VALID_T = CLOCK_A_MS - 3_600_000  # every payload instant: one hour before the segment A clock
EXPIRES_AT = "2026-01-02T00:00:00.000Z"  # CLOCK_A_MS + 1 day: live in segment A, expired in segment B
HYBRID = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
READY_DEADLINE_S = 120

# Admitted records (distinct texts). EXPIRING carries retention.expires_at; BIG's packet exceeds 4096 bytes.
DUCKDB = "We chose DuckDB as the single source of truth for the lifecycle journal."
PAGER = "Rotate the on-call pager schedule weekly, handing over on Monday mornings."
BACKUPS = "Compress the nightly journal backups with zstd before uploading them to the archive bucket."
EXPIRING = "The staging journal certificate stays pinned until the storage migration finishes."
BIG = " ".join(
    f"Runbook step {i}: the quarterly ledger reconciliation compares every settlement batch with the bank"
    f" statement and files discrepancies under the treasury queue." for i in range(1, 41)
)
PENDING = "Prefer squash merges on the release branches to keep the journal history linear."
DECLINED = "Tag every release candidate from the main branch after the journal checks pass."
# The documented AWS example access key id (split so secret scanners of this repository stay quiet).
SECRET = "Staging deploy credentials for the journal exporter: aws_access_key_id " + "AKIA" + "IOSFODNN7EXAMPLE"


def capture_args(text: str, key: str, *, retention: dict[str, Any] | None = None) -> dict[str, Any]:
    """conftest.capture_args with every instant fixed relative to the pinned clock and the key explicit."""
    args = conftest.capture_args(text, key=key, at=VALID_T)
    if retention is not None:
        args["payload"]["retention"] = retention
    return args


def search_args(query: str, **extra: Any) -> dict[str, Any]:
    return {"query": query, "purpose_ref": PURPOSE, **extra}


def get_args(record_id: str, **extra: Any) -> dict[str, Any]:
    return {"record_id": record_id, "purpose_ref": PURPOSE, **extra}


def forged_cursor() -> str:
    """A well-formed cursor (the encoder's body layout) under an all-zero MAC: fixed bytes, never valid."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    body = {"d": "0" * 64, "o": 1, "p": "hybrid_v1", "r": "0" * 64, "s": "1", "v": CLOCK_A_MS}
    return b64(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()) + "." + b64(bytes(32))


# ---- the transcript -----------------------------------------------------------------------------


def wire(obj: Any) -> str:
    """The server's own serialisation of an envelope (server.dispatch.envelope_result)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class Transcript:
    """Records each step's request and response, normalising only what is random by construction."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.names: set[str] = set()
        self._audit: dict[str, str] = {}
        self._cursors: dict[str, str] = {}

    # -- normalisation ----------------------------------------------------------------------

    def cursor_label(self, cursor: str) -> str:
        if cursor not in self._cursors:
            self._cursors[cursor] = f"<cursor {len(self._cursors) + 1}>"
        return self._cursors[cursor]

    def known_cursor(self, cursor: str) -> str:
        """A page_cursor argument: the label of the next_page_cursor it echoes, else the exact value."""
        return self._cursors.get(cursor, cursor)

    def _normalise(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self._normalise(item) for item in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "auditId" and isinstance(v, str):
                out[k] = self._audit.setdefault(v, f"aud_{len(self._audit) + 1}")
            elif k == "next_page_cursor" and isinstance(v, str):
                out[k] = self.cursor_label(v)
            else:
                out[k] = self._normalise(v)
        if isinstance(node.get("next_page_cursor"), str) and isinstance(node.get("response_digest"), str):
            label = self._cursors[node["next_page_cursor"]].strip("<>")
            out["response_digest"] = f"<response_digest of a page with {label}>"
        return out

    def _add(self, name: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        assert name not in self.names, f"duplicate step name {name}"
        self.names.add(name)
        self.steps.append({"step": name, "request": request, "response": response})

    def _request(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        args = dict(arguments)
        if isinstance(args.get("page_cursor"), str):
            args["page_cursor"] = self.known_cursor(args["page_cursor"])
        return {"method": "tools/call", "name": tool, "arguments": args}

    # -- recording ----------------------------------------------------------------------------

    def initialize(self, mcp: Mcp) -> None:
        info = mcp.init.server_info
        self._add(
            "initialize",
            {"method": "initialize"},
            {"serverInfo": {"name": info.name, "title": info.title}, "instructions": mcp.init.instructions},
        )

    async def tools_list(self, mcp: Mcp) -> None:
        tools = (await mcp.session.list_tools()).tools
        self._add(
            "tools/list",
            {"method": "tools/list"},
            {"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]},
        )

    async def call(self, mcp: Mcp, name: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call a tool (short name gets the engram_memory_ prefix); record it; return the RAW envelope."""
        full = tool if tool.startswith("engram_") else "engram_memory_" + tool
        request = self._request(full, arguments)
        result = await mcp.session.call_tool(full, arguments)
        envelope = check_result(result)
        text = result.content[0].text
        parsed = json.loads(text)
        assert wire(parsed) == text, f"{name}: re-serialising the text does not reproduce the server's bytes"
        self._add(name, request, {"isError": result.is_error, "text": wire(self._normalise(parsed))})
        return envelope

    async def call_error(self, mcp: Mcp, name: str, tool: str, arguments: dict[str, Any]) -> MCPError:
        """A call answered by a JSON-RPC error (protocol rejection): record its code and message."""
        full = tool if tool.startswith("engram_") else "engram_memory_" + tool
        request = self._request(full, arguments)
        with pytest.raises(MCPError) as info:
            await mcp.session.call_tool(full, arguments)
        self._add(name, request, {"error": {"code": info.value.code, "message": info.value.message}})
        return info.value


def value(envelope: dict[str, Any]) -> dict[str, Any]:
    assert envelope["ok"], envelope
    return envelope["output"]["value"]


def code(envelope: dict[str, Any]) -> str:
    assert not envelope["ok"], envelope
    return envelope["error"]["code"]


async def wait_semantic_ready(mcp: Mcp) -> None:
    """Poll (unrecorded) until a lexical_and_semantic search answers; RANKING_UNAVAILABLE until then."""
    deadline = time.monotonic() + READY_DEADLINE_S
    while not (out := await mcp.call("search", search_args("warm up", capability_policy=HYBRID)))["ok"]:
        assert out["error"]["code"] == "RANKING_UNAVAILABLE", out
        assert time.monotonic() < deadline, "the embedding model never became ready: " + mcp.stderr()[-2000:]
        await anyio.sleep(0.25)


# ---- the script ---------------------------------------------------------------------------------


async def segment_a(t: Transcript, mcp: Mcp, human: Human) -> dict[str, str]:
    """Semantic channel on, clock A. Returns the record ids segment B reads."""
    t.initialize(mcp)
    await t.tools_list(mcp)
    await wait_semantic_ready(mcp)

    # -- capture ---------------------------------------------------------------------------
    captures = {
        "duckdb": capture_args(DUCKDB, "golden-capture-duckdb-0001"),
        "pager": capture_args(PAGER, "golden-capture-pager-00001"),
        "backups": capture_args(BACKUPS, "golden-capture-backups-001"),
        "expiring": capture_args(
            EXPIRING, "golden-capture-expiring-01",
            retention={"derivative_rule": "make-ineligible", "expires_at": EXPIRES_AT},
        ),
        "big": capture_args(BIG, "golden-capture-big-000001"),
    }
    candidates: dict[str, str] = {}
    for label, args in captures.items():
        out = value(await t.call(mcp, f"A.capture.{label}", "capture", args))
        assert out["status"] == "committed_pending", out
        candidates[label] = out["candidate_id"]

    replay = value(await t.call(mcp, "A.capture.replay", "capture", captures["duckdb"]))
    assert replay["status"] == "duplicate_exact" and replay["candidate_id"] == candidates["duckdb"], replay
    conflict = capture_args("Different content under the DuckDB capture key.", "golden-capture-duckdb-0001")
    assert code(await t.call(mcp, "A.capture.same_key_other_args", "capture", conflict)) == "DIGEST_CONFLICT"
    extra = capture_args("An extra field is not part of the closed schema.", "golden-capture-invalid-01")
    extra["confirmed"] = True
    assert code(await t.call(mcp, "A.capture.extra_field", "capture", extra)) == "INVALID_SCHEMA"

    # -- admission -------------------------------------------------------------------------
    records: dict[str, str] = {}
    admit_keys = {label: f"golden-admit-{label}-000001" for label in candidates}
    for label, cid in candidates.items():
        args = {"candidate_id": cid, "idempotency_key": admit_keys[label]}
        outcome = value(await t.call(mcp, f"A.admit.{label}", "request_admission", args))["outcome"]
        assert outcome["status"] == "accepted", outcome
        records[label] = outcome["record_id"]
    again = {"candidate_id": candidates["duckdb"], "idempotency_key": admit_keys["duckdb"]}
    assert value(await t.call(mcp, "A.admit.replay", "request_admission", again))["replayed"] is True
    new_key = {"candidate_id": candidates["duckdb"], "idempotency_key": "golden-admit-duckdb-000002"}
    await t.call(mcp, "A.admit.decided_new_key", "request_admission", new_key)

    secret = value(await t.call(mcp, "A.capture.secret", "capture", capture_args(SECRET, "golden-capture-secret-01")))
    adm = {"candidate_id": secret["candidate_id"], "idempotency_key": "golden-admit-secret-000001"}
    assert value(await t.call(mcp, "A.admit.secret", "request_admission", adm))["outcome"]["status"] == "rejected"

    # -- search ----------------------------------------------------------------------------
    await t.call(mcp, "A.search.default_policy", "search", search_args("DuckDB journal source of truth"))
    await t.call(mcp, "A.search.lexical_and_semantic", "search",
                 search_args("which database holds the lifecycle journal", capability_policy=HYBRID))
    paged = search_args("journal", limit=1)
    page = value(await t.call(mcp, "A.search.page1", "search", paged))
    assert "next_page_cursor" in page, page
    first_cursor = page["next_page_cursor"]
    page = value(await t.call(mcp, "A.search.page2", "search", paged | {"page_cursor": first_cursor}))
    assert "next_page_cursor" in page, page
    await t.call(mcp, "A.search.page3", "search", paged | {"page_cursor": page["next_page_cursor"]})
    await t.call(mcp, "A.search.cursor_other_query", "search",
                 search_args("zstd backups", limit=1, page_cursor=first_cursor))
    await t.call(mcp, "A.search.cursor_forged", "search", paged | {"page_cursor": forged_cursor()})
    await t.call(mcp, "A.search.cursor_garbage", "search", paged | {"page_cursor": "not-a-cursor"})
    await t.call(mcp, "A.search.oversized_packet", "search",
                 search_args("quarterly ledger reconciliation settlement treasury", limit=1, max_packet_bytes=4096))

    # -- get -------------------------------------------------------------------------------
    await t.call(mcp, "A.get.admitted", "get", get_args(records["duckdb"]))
    await t.call(mcp, "A.get.oversized_packet", "get", get_args(records["big"], max_packet_bytes=4096))
    await t.call(mcp, "A.get.unknown_id", "get", get_args("mem_" + "a" * 52))
    wrong_purpose = get_args(records["duckdb"]) | {"purpose_ref": "purpose:other"}
    await t.call_error(mcp, "A.get.wrong_purpose", "get", wrong_purpose)
    await t.call_error(mcp, "A.call.unknown_tool", "engram_memory_admin", {})

    # -- withdraw --------------------------------------------------------------------------
    pending = value(await t.call(mcp, "A.capture.pending", "capture",
                                 capture_args(PENDING, "golden-capture-pending-01")))
    declined = value(await t.call(mcp, "A.capture.declined", "capture",
                                  capture_args(DECLINED, "golden-capture-declined-1")))
    withdraw = {"candidate_id": pending["candidate_id"], "idempotency_key": "golden-withdraw-pending-01",
                "reason_ref": "reason:superseded"}
    assert value(await t.call(mcp, "A.withdraw.pending", "withdraw", withdraw))["receipt"]["to_state"] == "withdrawn"
    await t.call(mcp, "A.withdraw.replay", "withdraw", withdraw)
    await t.call(mcp, "A.withdraw.again_new_key", "withdraw",
                 withdraw | {"idempotency_key": "golden-withdraw-pending-02"})
    prompts = len(human.prompts)
    human.answers.append("decline")
    declined_args = {"candidate_id": declined["candidate_id"], "idempotency_key": "golden-withdraw-declined-1",
                     "reason_ref": "reason:superseded"}
    assert code(await t.call(mcp, "A.withdraw.human_declines", "withdraw", declined_args)) == "gate_failed"
    assert len(human.prompts) == prompts + 1 and not human.answers
    await t.call(mcp, "A.withdraw.admitted_candidate", "withdraw",
                 {"candidate_id": candidates["pager"], "idempotency_key": "golden-withdraw-admitted-1",
                  "reason_ref": "reason:superseded"})

    # -- forget ----------------------------------------------------------------------------
    forget = {"record_id": records["pager"], "idempotency_key": "golden-forget-pager-00001",
              "reason_ref": "reason:obsolete"}
    assert value(await t.call(mcp, "A.forget.record", "forget", forget))["receipt"]["to_state"] == "tombstoned"
    assert value(await t.call(mcp, "A.forget.replay", "forget", forget))["replayed"] is True
    await t.call(mcp, "A.forget.again_new_key", "forget", forget | {"idempotency_key": "golden-forget-pager-00002"})
    await t.call(mcp, "A.search.after_forget", "search", search_args("on-call pager schedule"))
    await t.call(mcp, "A.get.forgotten", "get", get_args(records["pager"]))
    return records


async def segment_b(t: Transcript, mcp: Mcp, records: dict[str, str]) -> None:
    """Same data dir, --no-semantic, clock B (past the expiring record's expires_at)."""
    await t.call(mcp, "B.search.lexical_and_semantic", "search",
                 search_args("storage migration certificate", capability_policy=HYBRID))
    await t.call(mcp, "B.search.lexical", "search", search_args("journal"))
    await t.call(mcp, "B.get.expired", "get", get_args(records["expiring"]))
    await t.call(mcp, "B.get.live", "get", get_args(records["duckdb"]))


# ---- comparison ---------------------------------------------------------------------------------


def pretty(step: dict[str, Any]) -> list[str]:
    """A readable rendering of a step (the text content re-indented) for the diff only."""
    shown = json.loads(json.dumps(step))
    response = shown.get("response", {})
    if isinstance(response.get("text"), str):
        response["text"] = json.loads(response["text"])
    return json.dumps(shown, ensure_ascii=False, indent=2).splitlines()


MODEL_FLOAT_TOLERANCE = 1e-6


def _align_floats(want: Any, got: Any) -> tuple[Any, bool]:
    """``got`` with every float within the tolerance of ``want``'s replaced by it; whether any was."""
    if isinstance(want, float) and isinstance(got, float) and want != got:
        return (want, True) if abs(want - got) <= MODEL_FLOAT_TOLERANCE else (got, False)
    if isinstance(want, dict) and isinstance(got, dict):
        out, moved = {}, False
        for k, v in got.items():
            out[k], m = _align_floats(want[k], v) if k in want else (v, False)
            moved = moved or m
        return out, moved
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        pairs = [_align_floats(w, g) for w, g in zip(want, got, strict=True)]
        return [v for v, _ in pairs], any(m for _, m in pairs)
    return got, False


def tolerate_model_floats(want: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """``got`` with the CPU's float jitter (and the digests over it) taken as the golden's."""
    text_w, text_g = want.get("response", {}).get("text"), got.get("response", {}).get("text")
    if not (isinstance(text_w, str) and isinstance(text_g, str)) or text_w == text_g:
        return got
    parsed_w, parsed_g = json.loads(text_w), json.loads(text_g)
    aligned, moved = _align_floats(parsed_w, parsed_g)
    value_w, value_g = parsed_w.get("output", {}).get("value"), aligned.get("output", {}).get("value")
    if not moved or not isinstance(value_w, dict) or not isinstance(value_g, dict) or "rank_receipt" not in value_g:
        return got
    served = parsed_g["output"]["value"]["rank_receipt"]
    body = {k: v for k, v in served.items() if k != "receipt_digest"}
    assert receipt_digest("rank-receipt", body) == served["receipt_digest"], "a rank receipt digest is wrong"
    for key, node_w, node_g in (("receipt_digest", value_w.get("rank_receipt", {}), value_g["rank_receipt"]),
                                ("response_digest", value_w, value_g)):
        if key in node_w and key in node_g:
            node_g[key] = node_w[key]
    return {**got, "response": {**got["response"], "text": wire(aligned)}}


def first_difference(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> str | None:
    for i, (want, got) in enumerate(zip(expected, actual, strict=False)):
        got = tolerate_model_floats(want, got)
        if wire(want) != wire(got):
            diff = "\n".join(difflib.unified_diff(pretty(want), pretty(got), "golden", "actual", lineterm=""))
            return (
                f"step {i} ({want.get('step')!r} in the golden, {got.get('step')!r} now) differs.\n"
                f"golden request:  {wire(want.get('request'))}\n"
                f"actual request:  {wire(got.get('request'))}\n"
                f"golden response: {wire(want.get('response'))}\n"
                f"actual response: {wire(got.get('response'))}\n"
                f"diff (text content re-indented):\n{diff}"
            )
    if len(expected) != len(actual):
        longer, label = (expected, "golden only") if len(expected) > len(actual) else (actual, "actual only")
        extra = [s["step"] for s in longer[min(len(expected), len(actual)):]]
        return f"{len(expected)} golden steps, {len(actual)} now; {label}: {extra}"
    return None


async def test_golden_transcript(tmp_path: Path, offline_env: dict[str, str], backend: Backend) -> None:
    """The same script and the same golden bytes on each store backend (DuckDB and PostgreSQL)."""
    if RECORD and backend.store is not None:
        pytest.skip("the golden is recorded on DuckDB only; PostgreSQL is compared with it")
    data_dir = tmp_path / "data"
    t = Transcript()
    human = Human()
    # all six tools, conftest's CONTEXT, semantic channel on (the default)
    argv_a = serve_argv(data_dir, backend=backend)
    env_a = offline_env | {"ENGRAM_CLOCK_MS": str(CLOCK_A_MS)}
    async with mcp_server(argv_a, env_a, human=human, log_dir=tmp_path) as mcp:
        records = await segment_a(t, mcp, human)

    argv_b = serve_argv(data_dir, extra=["--no-semantic"], backend=backend)
    env_b = offline_env | {"ENGRAM_CLOCK_MS": str(CLOCK_B_MS)}
    async with mcp_server(argv_b, env_b, human=Human(), log_dir=tmp_path) as mcp:
        await segment_b(t, mcp, records)

    # The script ran on the store it was given: two opens (two storage epochs, which the receipts
    # digest), the journal in that store, and no DuckDB file beside a PostgreSQL node.
    _, epoch = backend.query("SELECT value FROM meta WHERE key = 'storage_epoch'", data_dir)
    assert epoch == [("2",)], epoch
    _, events = backend.query("SELECT count(*) FROM journal", data_dir)
    assert events[0][0] > 0, events
    assert (data_dir / "engram.duckdb").exists() is (backend.store is None)

    if RECORD:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(t.steps, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        return
    assert GOLDEN.exists(), f"{GOLDEN} is missing: record it with ENGRAM_GOLDEN_RECORD=1 (see the module docstring)"
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    problem = first_difference(expected, t.steps)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


def test_only_model_float_jitter_is_tolerated() -> None:
    receipt = {"ranked": [{"rank": 1, "score": 0.5}], "issued_at": "2026-01-01T00:00:00.000Z"}

    def step(score: float, rank: int = 1) -> dict[str, Any]:
        r = {**receipt, "ranked": [{"rank": rank, "score": score}]}
        r["receipt_digest"] = receipt_digest("rank-receipt", r)
        value = {"records": [], "rank_receipt": r, "response_digest": f"sha256:{score}"}
        return {"response": {"isError": False, "text": wire({"ok": True, "output": {"value": value}})}}

    golden = step(0.5)
    assert wire(tolerate_model_floats(golden, step(0.5 + 3e-7))) == wire(golden)  # jitter: the golden's bytes
    assert wire(tolerate_model_floats(golden, step(0.5 + 1e-3))) != wire(golden)  # a real change: still differs
    assert wire(tolerate_model_floats(golden, step(0.5 + 3e-7, rank=2))) != wire(golden)  # ranks are exact
