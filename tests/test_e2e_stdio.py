"""End to end over stdio: a real `engram-memory serve` subprocess, the real engine and store,
driven by the MCP SDK's ClientSession. Nothing of ours is mocked.

Every test that reaches the store runs on both store backends (conftest's ``backend``: DuckDB and a
fresh PostgreSQL database); those answered before the store is touched (schema, grants, purpose,
launch refusals, tool listing) run on DuckDB only."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import signal
import subprocess
import sys
import time
import unicodedata
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from engram_memory.server.hostkeys import keygen
from tests.conftest import (
    ALL,
    CONTEXT,
    PURPOSE,
    Human,
    Mcp,
    capture_args,
    get_args,
    key,
    search_args,
    serve_argv,
)

pytestmark = pytest.mark.anyio

LEXICAL_ONLY = ["--no-semantic"]  # most tests do not need the embedding model loaded


async def capture_and_admit(mcp: Mcp, text: str) -> tuple[str, str]:
    """capture -> request_admission(accepted). Returns (candidate_id, record_id)."""
    cap = await mcp.call("capture", capture_args(text))
    assert cap["ok"], cap
    value = cap["output"]["value"]
    assert value["status"] == "committed_pending"
    candidate_id = value["candidate_id"]
    adm = await mcp.call("request_admission", {"candidate_id": candidate_id, "idempotency_key": key("admit")})
    assert adm["ok"], adm
    outcome = adm["output"]["value"]["outcome"]
    assert outcome["status"] == "accepted", outcome
    assert outcome["record_id"].startswith("mem_")
    return candidate_id, outcome["record_id"]


def record_ids(envelope: dict[str, Any]) -> list[str]:
    assert envelope["ok"], envelope
    return [p["record"]["record_id"] for p in envelope["output"]["value"]["records"]]


def without_audit(envelope: dict[str, Any]) -> bytes:
    rest = {k: v for k, v in envelope.items() if k != "auditId"}
    return json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()


def random_record_id() -> str:
    return "mem_" + base64.b32encode(secrets.token_bytes(32)).decode().rstrip("=").lower()


# ---- the story -----------------------------------------------------------------------------


async def test_full_story_capture_admit_search_get_forget(start_server, data_dir_factory, backend) -> None:
    """With the semantic channel on (the default): the model loads in the background."""
    human = Human()
    text = "We chose DuckDB as the single source of truth for the lifecycle journal."
    t0 = time.monotonic()
    async with start_server(data_dir_factory("story"), human=human, backend=backend) as mcp:
        assert time.monotonic() - t0 < 15, "initialize must not wait for the embedding model"
        _, record_id = await capture_and_admit(mcp, text)

        found = await mcp.call("search", search_args("DuckDB source of truth journal"))
        assert record_id in record_ids(found)
        assert found["output"]["value"]["rank_receipt"]

        # The semantic channel comes up in the background; until then a search that requires it
        # is RANKING_UNAVAILABLE (retriable), never a silent lexical fallback.
        both = search_args("which database holds the lifecycle journal",
                           capability_policy={"minimum_channels": "lexical_and_semantic", "network": "forbid"})
        deadline = time.monotonic() + 120
        while not (hybrid := await mcp.call("search", both))["ok"]:
            assert hybrid["error"]["code"] == "RANKING_UNAVAILABLE" and hybrid["error"]["retriable"], hybrid
            assert time.monotonic() < deadline, "the embedding model never became ready"
            await anyio.sleep(0.5)
        assert record_id in record_ids(hybrid)
        assert "semantic" in json.dumps(hybrid["output"]["value"]["rank_receipt"])

        got = await mcp.call("get", get_args(record_id))
        assert got["ok"], got
        value = got["output"]["value"]
        assert value["record"]["record_id"] == record_id
        assert value["read_receipt"]["record_id"] == record_id

        forgot = await mcp.call(
            "forget", {"record_id": record_id, "idempotency_key": key("forget"), "reason_ref": "reason:obsolete"}
        )
        assert forgot["ok"], forgot
        assert forgot["output"]["value"]["receipt"]["to_state"] == "tombstoned"
        # The human saw what would happen, on which target, and never the memory text.
        assert len(human.prompts) == 1
        prompt = human.prompts[0]
        assert record_id in prompt.message and "engram_memory_forget" in prompt.message
        assert text not in prompt.message and "DuckDB" not in prompt.message
        assert prompt.requested_schema["required"] == ["confirm"]
        assert prompt.requested_schema["properties"]["confirm"]["type"] == "boolean"

        assert record_id not in record_ids(await mcp.call("search", search_args("DuckDB source of truth journal")))
        gone = await mcp.call("get", get_args(record_id))
        assert gone["error"]["code"] == "NOT_FOUND" and gone["error"]["retriable"] is False


async def test_withdraw_pending_then_admission_is_not_found(start_server, data_dir_factory, backend) -> None:
    human = Human()
    async with start_server(data_dir_factory("withdraw"), human=human, extra=LEXICAL_ONLY, backend=backend) as mcp:
        cap = await mcp.call("capture", capture_args("Retry flaky uploads with exponential backoff."))
        candidate_id = cap["output"]["value"]["candidate_id"]
        out = await mcp.call(
            "withdraw", {"candidate_id": candidate_id, "idempotency_key": key("wd"), "reason_ref": "reason:wrong"}
        )
        assert out["ok"], out
        receipt = out["output"]["value"]["receipt"]
        assert (receipt["from_state"], receipt["to_state"]) == ("pending", "withdrawn")
        assert candidate_id in human.prompts[0].message
        adm = await mcp.call("request_admission", {"candidate_id": candidate_id, "idempotency_key": key("adm")})
        assert adm["error"]["code"] == "NOT_FOUND"


# The gate answers before the store; one refusal on PostgreSQL proves it changes nothing there too.
@pytest.mark.parametrize(("answer", "backend"), [("decline", "duckdb"), ("decline", "postgres"), ("cancel", "duckdb"),
                                                 ("false", "duckdb"), ("error", "duckdb")], indirect=["backend"])
async def test_refused_confirmation_is_gate_failed_and_changes_nothing(
    start_server, data_dir_factory, answer: str, backend
) -> None:
    human = Human(answers=[answer])
    async with start_server(data_dir_factory("decline"), human=human, extra=LEXICAL_ONLY, backend=backend) as mcp:
        _, record_id = await capture_and_admit(mcp, "Use UTC millisecond instants in every receipt.")
        args = {"record_id": record_id, "idempotency_key": key("forget"), "reason_ref": "reason:x"}
        out = await mcp.call("forget", args)
        assert out["error"] == {
            "code": "gate_failed",
            "message": "The confirmation gate was not satisfied.",
            "retriable": False,
        }
        still = await mcp.call("get", get_args(record_id))
        assert still["ok"], still
        assert record_id in record_ids(await mcp.call("search", search_args("UTC millisecond instants")))
        # A later approved attempt with the same key still works: the refusal consumed nothing.
        assert (await mcp.call("forget", args))["ok"]


async def test_confirmation_ttl_expiry_is_gate_failed(start_server, data_dir_factory, backend) -> None:
    human = Human(answers=["sleep:3"])
    extra = LEXICAL_ONLY + ["--confirm-ttl-seconds", "1"]
    async with start_server(data_dir_factory("ttl"), human=human, extra=extra, backend=backend) as mcp:
        cap = await mcp.call("capture", capture_args("Pin CPU torch beside sentence-transformers."))
        candidate_id = cap["output"]["value"]["candidate_id"]
        args = {"candidate_id": candidate_id, "idempotency_key": key("wd"), "reason_ref": "reason:x"}
        out = await mcp.call("withdraw", args)
        assert out["error"]["code"] == "gate_failed"
        adm = await mcp.call("request_admission", {"candidate_id": candidate_id, "idempotency_key": key("adm")})
        assert adm["ok"] and adm["output"]["value"]["outcome"]["status"] == "accepted"


async def test_host_can_require_confirmation_for_capture(start_server, data_dir_factory, backend) -> None:
    human = Human(answers=["decline", "accept"])
    extra = LEXICAL_ONLY + ["--confirm", "capture"]
    async with start_server(data_dir_factory("confirm-capture"), human=human, extra=extra, backend=backend) as mcp:
        tools = {t.name: t for t in (await mcp.session.list_tools()).tools}
        assert "confirm" in tools["engram_memory_capture"].description
        args = capture_args("Tag releases from the main branch only.")
        assert (await mcp.call("capture", args))["error"]["code"] == "gate_failed"
        ok = await mcp.call("capture", args)
        assert ok["ok"] and ok["output"]["value"]["status"] == "committed_pending"
        assert len(human.prompts) == 2
        assert "Tag releases" not in human.prompts[1].message
        # request_admission is not named in --confirm: no prompt.
        await mcp.call("request_admission", {"candidate_id": ok["output"]["value"]["candidate_id"],
                                             "idempotency_key": key("adm")})
        assert len(human.prompts) == 2


async def test_idempotent_capture_replay_is_duplicate_exact(start_server, data_dir_factory, backend) -> None:
    data_dir = data_dir_factory("replay")
    async with start_server(data_dir, extra=LEXICAL_ONLY, backend=backend) as mcp:
        args = capture_args("Ties in the ranking break on record_id.", key="replay-key-0000000001")
        first = await mcp.call("capture", args)
        second = await mcp.call("capture", args)
        assert first["output"]["value"]["status"] == "committed_pending"
        assert second["output"]["value"]["status"] == "duplicate_exact"
        assert second["output"]["value"]["candidate_id"] == first["output"]["value"]["candidate_id"]
        assert first["auditId"] != second["auditId"]
        other = capture_args("Different content under the same key.", key="replay-key-0000000001")
        conflict = await mcp.call("capture", other)
        assert conflict["error"]["code"] == "DIGEST_CONFLICT"

    # Every envelope was recorded in the audit trail under its auditId; the raw key never was.
    _, table = backend.query("SELECT audit_id, tool, ok, code, idk, scope_ref, agent_id FROM audit", data_dir)
    rows = {r[0]: r[1:] for r in table}
    idk = "idk_" + hashlib.sha256(b"replay-key-0000000001").hexdigest()[:12]
    scope, agent = "tenant:tenant-a/workspace:ws-1", "agent-7"
    assert rows[first["auditId"]] == ("capture", True, None, idk, scope, agent)
    assert rows[second["auditId"]] == ("capture", True, None, idk, scope, agent)
    assert rows[conflict["auditId"]] == ("capture", False, "DIGEST_CONFLICT", idk, scope, agent)


# ---- schema and protocol errors -------------------------------------------------------------


async def test_schema_errors_are_envelopes_and_precede_the_gate(start_server, data_dir_factory) -> None:
    human = Human()
    async with start_server(data_dir_factory("schema"), human=human, extra=LEXICAL_ONLY) as mcp:
        # A model-written confirmation is just an unknown field: INVALID_SCHEMA, and no prompt.
        out = await mcp.call("forget", {"record_id": random_record_id(), "idempotency_key": key("f"),
                                        "reason_ref": "r", "confirmed": True})
        assert out["error"] == {"code": "INVALID_SCHEMA", "message": "The arguments do not match the tool schema.",
                                "retriable": False}
        assert human.prompts == []
        short_key = await mcp.call("request_admission", {"candidate_id": "candidate_" + "0" * 64,
                                                         "idempotency_key": "short"})
        assert short_key["error"]["code"] == "INVALID_SCHEMA"
        missing_purpose = await mcp.call("search", {"query": "x"})
        assert missing_purpose["error"]["code"] == "INVALID_SCHEMA"


async def test_unknown_tool_is_32602(start_server, data_dir_factory) -> None:
    async with start_server(data_dir_factory("unknown"), extra=LEXICAL_ONLY) as mcp:
        for name in ("engram_memory_admin", "engram_nope", "search", "ENGRAM_MEMORY_SEARCH"):
            with pytest.raises(MCPError) as info:
                await mcp.session.call_tool(name, {})
            assert (info.value.code, info.value.message) == (-32602, "Unknown tool"), name


async def test_wrong_purpose_is_32603(start_server, data_dir_factory) -> None:
    async with start_server(data_dir_factory("purpose"), extra=LEXICAL_ONLY) as mcp:
        cases = [
            ("search", search_args("anything") | {"purpose_ref": "purpose:other"}),
            ("get", get_args(random_record_id()) | {"purpose_ref": "purpose:other"}),
            ("capture", capture_args("Something durable.", purpose="purpose:other")),
        ]
        for tool, args in cases:
            err = await mcp.call_error(tool, args)
            assert (err.code, err.message) == (-32603, "Trusted invocation context unavailable"), tool
        # An NFD spelling of the bound purpose is the same purpose after NFC.
        nfd = unicodedata.normalize("NFD", PURPOSE)
        assert nfd != PURPOSE
        assert (await mcp.call("search", search_args("anything") | {"purpose_ref": nfd}))["ok"]


async def test_ungranted_tool_is_absent_and_unknown(start_server, data_dir_factory) -> None:
    async with start_server(data_dir_factory("grants"), tools="search,get", extra=LEXICAL_ONLY) as mcp:
        names = [t.name for t in (await mcp.session.list_tools()).tools]
        assert names == ["engram_memory_search", "engram_memory_get"]
        err = await mcp.call_error("capture", capture_args("Not allowed here."))
        assert (err.code, err.message) == (-32602, "Unknown tool")


@pytest.mark.parametrize(
    "context,tools",
    [({}, ALL), (CONTEXT, None), ({k: v for k, v in CONTEXT.items() if k != "agent_id"}, ALL)],
    ids=["no-context", "no-tools", "partial-context"],
)
async def test_memory_disabled_lists_nothing(start_server, data_dir_factory, context, tools) -> None:
    async with start_server(data_dir_factory("disabled"), context=context, tools=tools) as mcp:
        assert (await mcp.session.list_tools()).tools == []
        err = await mcp.call_error("search", search_args("x"))
        assert (err.code, err.message) == (-32602, "Unknown tool")
        instructions = mcp.init.instructions or ""
        assert "disabled" in instructions and "--tools" in instructions
        # The client learns why, not only the operator's stderr.
        assert ("missing: " in instructions) if tools else ("no tool granted" in instructions)


async def test_client_without_elicitation_cannot_forget(start_server, data_dir_factory, backend) -> None:
    """With the host's queue off; by default the operator decides (tests/test_approvals.py)."""
    async with start_server(data_dir_factory("no-elicit"), human=None, extra=[*LEXICAL_ONLY, "--confirm-fallback",
                                                                              "off"], backend=backend) as mcp:
        _, record_id = await capture_and_admit(mcp, "Projections are rebuilt from DuckDB.")
        err = await mcp.call_error("forget", {"record_id": record_id, "idempotency_key": key("f"),
                                              "reason_ref": "reason:x"})
        assert (err.code, err.message) == (-32603, "Trusted invocation context unavailable")
        assert (await mcp.call("get", get_args(record_id)))["ok"]


# ---- discovery ------------------------------------------------------------------------------


async def test_tools_list_shape(start_server, data_dir_factory) -> None:
    async with start_server(data_dir_factory("list"), human=Human(), extra=LEXICAL_ONLY) as mcp:
        assert "Search before capture" in (mcp.init.instructions or "")
        tools = {t.name: t for t in (await mcp.session.list_tools()).tools}
        assert list(tools) == [f"engram_memory_{t}" for t in ALL.split(",")]
        for name, tool in tools.items():
            assert tool.input_schema["type"] == "object"
            assert tool.input_schema.get("additionalProperties") is False
            assert tool.output_schema and tool.output_schema["type"] == "object"
            assert tool.annotations and tool.annotations.open_world_hint is False
            assert "error.code" in tool.description and "retriable" in tool.description, name
        assert tools["engram_memory_search"].annotations.read_only_hint is True
        assert tools["engram_memory_get"].annotations.read_only_hint is True
        for name in ("engram_memory_forget", "engram_memory_withdraw"):
            assert "human to confirm" in tools[name].description
            assert tools[name].annotations.destructive_hint is True
            assert tools[name].annotations.idempotent_hint is True
        assert tools["engram_memory_capture"].annotations.destructive_hint is False
        capture = tools["engram_memory_capture"].description
        assert "secret" in capture.lower() and "candidate is not a record" in capture.lower()
        assert "search first" in capture.lower()
        assert "human to confirm" not in capture  # not named in --confirm


# ---- scope isolation ------------------------------------------------------------------------


async def test_scope_isolation_foreign_targets_are_not_found(start_server, data_dir_factory, backend) -> None:
    """Servers one after the other on one data dir (DuckDB allows one process)."""
    data_dir = data_dir_factory("scopes")
    text = "Scope isolation is physical as well as logical."
    async with start_server(data_dir, extra=LEXICAL_ONLY, backend=backend) as a:
        candidate_id, record_id = await capture_and_admit(a, text)
        assert record_id in record_ids(await a.call("search", search_args("scope isolation physical logical")))
        pending = (await a.call("capture", capture_args("A pending candidate of tenant A.")))["output"]["value"]

    human = Human()
    tenant_b = CONTEXT | {"tenant": "tenant-b"}
    random_candidate = "candidate_" + secrets.token_hex(32)
    async with start_server(data_dir, context=tenant_b, human=human, extra=LEXICAL_ONLY, backend=backend) as b:
        pairs = [  # (foreign target, random well-formed target): same envelope bytes, auditId aside
            ("get", get_args(record_id), get_args(random_record_id())),
            ("forget", {"record_id": record_id, "reason_ref": "r:x"},
             {"record_id": random_record_id(), "reason_ref": "r:x"}),
            ("withdraw", {"candidate_id": pending["candidate_id"], "reason_ref": "r:x"},
             {"candidate_id": random_candidate, "reason_ref": "r:x"}),
            ("request_admission", {"candidate_id": pending["candidate_id"]}, {"candidate_id": random_candidate}),
            ("request_admission", {"candidate_id": candidate_id}, {"candidate_id": random_candidate}),
        ]
        for tool, foreign_args, random_args in pairs:
            if tool != "get":
                foreign_args = foreign_args | {"idempotency_key": key(tool)}
                random_args = random_args | {"idempotency_key": key(tool)}
            foreign = await b.call(tool, foreign_args)
            unknown = await b.call(tool, random_args)
            assert foreign["error"]["code"] == "NOT_FOUND", (tool, foreign)
            assert without_audit(foreign) == without_audit(unknown), tool  # indistinguishable, byte for byte
        assert record_id not in record_ids(await b.call("search", search_args("scope isolation physical logical")))

    workspace_2 = CONTEXT | {"workspace": "ws-2"}
    async with start_server(data_dir, context=workspace_2, extra=LEXICAL_ONLY, backend=backend) as w:
        assert (await w.call("get", get_args(record_id)))["error"]["code"] == "NOT_FOUND"

    # Tenant A's memory is untouched by B's attempts.
    async with start_server(data_dir, human=Human(), extra=LEXICAL_ONLY, backend=backend) as a:
        assert (await a.call("get", get_args(record_id)))["ok"]
        adm = await a.call("request_admission", {"candidate_id": pending["candidate_id"], "idempotency_key": key("a")})
        assert adm["output"]["value"]["outcome"]["status"] == "accepted"


# ---- one server per data dir ----------------------------------------------------------------


async def test_http_server_on_an_owned_data_dir_exits_at_once(start_server, data_dir_factory, backend,
                                                              offline_env) -> None:
    """A second stdio launch relays (tests/test_local_hosts.py); an HTTP server cannot share."""
    data_dir = data_dir_factory("busy")
    keys = data_dir_factory("busy-keys")
    keygen(keys, "host-a", ["*/*"])
    async with start_server(data_dir, extra=LEXICAL_ONLY, backend=backend) as mcp:
        assert (await mcp.call("search", search_args("warm up")))["ok"]
        # On PostgreSQL the data dir is the node's own (its projections and node id): one process too.
        argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--http", "127.0.0.1:1",
                "--host-keys", str(keys / "host-keys.toml"), "--data-dir", str(data_dir), "--no-semantic",
                *backend.args()]

        def second() -> tuple[subprocess.CompletedProcess[str], float]:
            t0 = time.monotonic()
            proc = subprocess.run(argv, env=offline_env, stdin=subprocess.PIPE, capture_output=True,
                                  text=True, timeout=60)
            return proc, time.monotonic() - t0

        proc, elapsed = await anyio.to_thread.run_sync(second)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("engram-memory: error: data dir ") and "in use" in last
        assert "Traceback" not in proc.stderr
        assert elapsed < 40  # not a relay's takeover wait (TAKEOVER_S, 60 s); start-up alone under load: ~23 s
        # The first server is unaffected.
        assert (await mcp.call("search", search_args("still here")))["ok"]


def test_bad_config_exits_2_with_one_line(offline_env, data_dir_factory) -> None:
    argv = serve_argv(data_dir_factory("badcfg"), tools="search,admin")
    proc = subprocess.run(argv, env=offline_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("engram-memory: error: unknown tool(s) in tools: admin")
    assert proc.stdout == ""


def test_console_script_is_installed() -> None:
    script = __import__("pathlib").Path(sys.executable).with_name("engram-memory")
    assert script.exists()
    proc = subprocess.run([str(script), "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--purpose-ref" in proc.stdout
    top = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert "serve" in top.stdout and "rebuild-index" in top.stdout


def test_ctrl_c_stops_the_stdio_server_while_stdin_stays_open(offline_env, data_dir_factory, backend) -> None:
    """A terminal's Ctrl-C never closes stdin: the server must still stop, cleanly."""
    data_dir = data_dir_factory("ctrlc")
    proc = subprocess.Popen(serve_argv(data_dir, extra=LEXICAL_ONLY, backend=backend), env=offline_env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (data_dir / "engram.sock").exists():  # the store is open and serving
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert out == b""
    text = err.decode()
    assert "waiting for an MCP client on stdin (Ctrl-D or Ctrl-C stops the server)" in text
    assert "stopped" in text and "Traceback" not in text
    assert not (data_dir / "engram.sock").exists()  # the owner socket went with it


@pytest.mark.parametrize("case", ["data-dir-is-file", "data-dir-under-file", "model-path-missing",
                                  "model-path-is-a-file", "model-path-not-a-model", "model-path-broken",
                                  "host-keys-missing", "host-keys-empty"])
def test_launch_mistakes_exit_2_with_one_line_before_serving(case: str, offline_env, tmp_path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    data_dir, extra = tmp_path / "data", []
    expected = {
        "data-dir-is-file": f"data_dir {afile} exists and is not a directory",
        "data-dir-under-file": f"data_dir {afile}/sub is not usable: Not a directory",
        "model-path-missing": f"model_path {tmp_path}/nope does not exist (omit it to use the packaged model)",
        "model-path-is-a-file": f"model_path {afile} is not a model directory (it is a file)",
        "model-path-not-a-model": f"model_path {tmp_path} is not a sentence-transformers model directory (no"
                                  " modules.json or config.json)",
        "model-path-broken": f"model_path {tmp_path}/broken holds no model weights (model.safetensors or"
                             " pytorch_model.bin)",
        "host-keys-missing": f"host-keys file not found: {tmp_path}/keys.toml",
        "host-keys-empty": f"host-keys file {tmp_path}/empty.toml lists no [[host]]: no host could call",
    }[case]
    if case == "data-dir-is-file":
        data_dir = afile
    elif case == "data-dir-under-file":
        data_dir = afile / "sub"
    elif case == "model-path-missing":
        extra = ["--model-path", str(tmp_path / "nope")]
    elif case == "model-path-is-a-file":
        extra = ["--model-path", str(afile)]
    elif case == "model-path-not-a-model":
        extra = ["--model-path", str(tmp_path)]
    elif case == "model-path-broken":
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "modules.json").write_text("[]")
        extra = ["--model-path", str(tmp_path / "broken")]
    if case.startswith("host-keys"):
        (tmp_path / "empty.toml").write_text('server_id = "engram-local"\n')
        name = "keys.toml" if case == "host-keys-missing" else "empty.toml"
        argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--http", "127.0.0.1:1",
                "--host-keys", str(tmp_path / name), "--data-dir", str(data_dir)]
    else:
        argv = serve_argv(data_dir, extra=extra)
    proc = subprocess.run(argv, env=offline_env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1] == "engram-memory: error: " + expected
    assert "Traceback" not in proc.stderr
    if not case.startswith("data-dir"):
        assert not data_dir.exists(), "a refused launch created the data dir"


async def test_every_file_the_server_creates_is_owner_only(start_server, data_dir_factory, backend) -> None:
    data_dir = data_dir_factory("modes") / "data"
    async with start_server(data_dir, extra=LEXICAL_ONLY, backend=backend) as mcp:
        await capture_and_admit(mcp, "Owner-only files keep the memory private on a shared machine.")
        assert (await mcp.call("search", search_args("owner-only files")))["ok"]
        paths = [data_dir, *data_dir.rglob("*")]
        opened = {p.relative_to(data_dir).as_posix(): p.stat().st_mode & 0o777 for p in paths if p.exists()}
    assert "engram.sock" in opened
    # DuckDB's file, or a PostgreSQL node's id beside its projections (and no DuckDB file).
    assert ("engram.duckdb" in opened) is (backend.store is None)
    assert ("node.id" in opened) is (backend.store is not None)
    wide = {name: oct(mode) for name, mode in opened.items() if mode & 0o077}
    assert not wide, wide
