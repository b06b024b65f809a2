"""End to end over streamable HTTP with per-call signed host contexts (the real server and SDK).

The module's shared server runs once per store backend (DuckDB, then a fresh PostgreSQL database:
the replay cache is then the store's shared table), and so do the audit and stop tests; rate limits,
host-key reloads and the bind address never reach the store and run on DuckDB only."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from mcp.shared.exceptions import MCPError

from engram_memory.models.hostauth import CONFIRMATION_META_KEY, CONTEXT_META_KEY, HostSigner, new_private_key
from engram_memory.server.hostkeys import host_entry
from tests.conftest import (
    BACKENDS,
    PURPOSE,
    Backend,
    capture_args,
    check_result,
    get_args,
    key,
    search_args,
    store_backend,
)
from tests.http_fixtures import (
    HostKit,
    HttpServer,
    SignedClient,
    free_port,
    host_context,
    http_server,
    signed_client,
    wait_healthy,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> HostKit:
    kit = HostKit(tmp_path_factory.mktemp("hostkeys"))
    kit.add("host-a")
    kit.add("host-b")
    return kit


@pytest.fixture(scope="module", params=BACKENDS)
def module_backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """Each store backend in turn for the module's shared server (the tests below use distinct tenants)."""
    with store_backend(request.param, request, tmp_path_factory.mktemp("store-key")) as chosen:
        yield chosen


@pytest.fixture(scope="module")
def server(kit: HostKit, tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str],
           module_backend: Backend) -> Iterator[HttpServer]:
    data_dir: Path = tmp_path_factory.mktemp("http-data")
    with http_server(data_dir, kit, offline_env, backend=module_backend) as srv:
        yield srv


async def test_whole_lifecycle_under_a_signed_context(server: HttpServer, kit: HostKit) -> None:
    host = host_context(tenant="life", principal="pat")
    async with signed_client(server.url, kit, "host-a", host) as c:
        assert await c.list_names() == [f"engram_memory_{t}" for t in
                                        ("search", "get", "capture", "request_admission", "withdraw", "forget")]
        cap = await c.call("capture", capture_args("Signed contexts bind every HTTP call to one scope."))
        candidate_id = cap["output"]["value"]["candidate_id"]
        adm = await c.call("request_admission", {"candidate_id": candidate_id, "idempotency_key": key("adm")})
        record_id = adm["output"]["value"]["outcome"]["record_id"]
        found = await c.call("search", search_args("signed contexts scope"))
        assert record_id in [p["record"]["record_id"] for p in found["output"]["value"]["records"]]
        assert (await c.call("get", get_args(record_id)))["ok"]

        other = await c.call("capture", capture_args("A candidate that will be withdrawn."))
        withdrawn = await c.call("withdraw", {"candidate_id": other["output"]["value"]["candidate_id"],
                                              "idempotency_key": key("wd"), "reason_ref": "reason:test"})
        assert withdrawn["ok"], withdrawn
        forgot = await c.call("forget", {"record_id": record_id, "idempotency_key": key("fg"),
                                         "reason_ref": "reason:test"})
        assert forgot["ok"], forgot
        assert (await c.call("get", get_args(record_id)))["error"]["code"] == "NOT_FOUND"


# ---- helpers ----------------------------------------------------------------------------------

CONTEXT_CODE, CONTEXT_MESSAGE = -32603, "Trusted invocation context unavailable"
UNKNOWN_CODE, UNKNOWN_MESSAGE = -32602, "Unknown tool"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}
MCP_HEADERS = [("Accept", "application/json, text/event-stream"), ("Content-Type", "application/json")]


def instant(epoch_s: float) -> str:
    """An Instant ("YYYY-MM-DDTHH:MM:SS.mmmZ") for a deadline claim."""
    moment = datetime.fromtimestamp(epoch_s, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


async def raw_post(url: str, headers: list[tuple[str, str]], body: dict[str, Any] | None = None) -> httpx2.Response:
    """POST an MCP request with exactly these extra headers (values sent as Latin-1 bytes)."""
    raw = [(k.encode("ascii"), v.encode("latin-1")) for k, v in MCP_HEADERS + headers]
    async with httpx2.AsyncClient(timeout=10) as http:
        return await http.post(url, headers=raw, json=body or INITIALIZE)


async def protocol_error(c: SignedClient, tool: str, arguments: dict[str, Any], meta: dict[str, Any]) -> MCPError:
    with pytest.raises(MCPError) as info:
        await c.raw(tool, arguments, meta)
    return info.value


async def assert_context_refused(c: SignedClient, tool: str, arguments: dict[str, Any],
                                 meta: dict[str, Any]) -> None:
    err = await protocol_error(c, tool, arguments, meta)
    assert (err.code, err.message) == (CONTEXT_CODE, CONTEXT_MESSAGE), err


async def envelope_of(c: SignedClient, tool: str, arguments: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    return check_result(await c.raw(tool, arguments, meta))


def error_code(envelope: dict[str, Any]) -> str:
    assert envelope["ok"] is False, envelope
    return str(envelope["error"]["code"])


async def admit(c: SignedClient, text: str) -> str:
    """Capture and admit one record under the client's context; its record_id."""
    cap = await c.call("capture", capture_args(text))
    assert cap["ok"], cap
    adm = await c.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                             "idempotency_key": key("adm")})
    assert adm["ok"], adm
    return str(adm["output"]["value"]["outcome"]["record_id"])


async def candidate(c: SignedClient, text: str) -> str:
    cap = await c.call("capture", capture_args(text))
    assert cap["ok"], cap
    return str(cap["output"]["value"]["candidate_id"])


async def still_there(c: SignedClient, record_id: str) -> None:
    got = await c.call("get", get_args(record_id))
    assert got["ok"], got


def forget_args(record_id: str, reason: str = "reason:test", idk: str | None = None) -> dict[str, Any]:
    return {"record_id": record_id, "idempotency_key": idk or key("fg"), "reason_ref": reason}


def withdraw_args(candidate_id: str) -> dict[str, Any]:
    return {"candidate_id": candidate_id, "idempotency_key": key("wd"), "reason_ref": "reason:test"}


def search_ids(envelope: dict[str, Any]) -> list[str]:
    assert envelope["ok"], envelope
    return [p["record"]["record_id"] for p in envelope["output"]["value"]["records"]]


# ---- bearer authentication (raw HTTP) ---------------------------------------------------------


async def test_mcp_without_a_bearer_is_401_and_says_nothing(server: HttpServer, kit: HostKit) -> None:
    response = await raw_post(server.url, [])
    assert response.status_code == 401
    assert response.text == "unauthorized\n"
    assert response.headers["www-authenticate"] == 'Bearer realm="engram-memory"'
    assert "mcp-session-id" not in response.headers  # no MCP processing happened
    # Any other path is refused the same way (not a 404 that maps the server).
    async with httpx2.AsyncClient(timeout=10) as http:
        other = await http.get(server.base + "/anything")
    assert (other.status_code, other.text) == (401, "unauthorized\n")


async def test_wrong_and_malformed_bearers_are_401(server: HttpServer, kit: HostKit) -> None:
    good = kit.token("host-a")
    refused = [
        [("Authorization", "Bearer " + good[:-1] + ("A" if good[-1] != "A" else "B"))],  # wrong token
        [("Authorization", "Bearer not-a-host-token")],
        [("Authorization", "Bearer")],
        [("Authorization", "Bearer t\u00f6ken")],  # not ASCII (sent as Latin-1 bytes)
        [("Authorization", "Basic " + good)],
        [("Authorization", good)],  # no scheme
        [("Authorization", "Bearer " + good + " trailing")],
        [("Authorization", "Bearer " + good), ("Authorization", "Bearer " + good)],  # two headers
        [("Authorization", "Bearer " + kit.token("host-a") + kit.token("host-b"))],
    ]
    for headers in refused:
        response = await raw_post(server.url, headers)
        assert response.status_code == 401, headers
        assert response.text == "unauthorized\n", headers
        for secret in (good, kit.token("host-b"), "host-a", "host-b", "sha256", kit.server_id):
            assert secret not in response.text
            assert all(secret not in v for v in response.headers.values())
    # The right token passes the same raw request (so the refusals above were about the header).
    ok = await raw_post(server.url, [("Authorization", "Bearer " + good)])
    assert ok.status_code == 200


async def test_healthz_answers_without_auth_and_only_liveness(server: HttpServer) -> None:
    async with httpx2.AsyncClient(timeout=10) as http:
        plain = await http.get(server.base + "/healthz")
        wrong = await http.get(server.base + "/healthz", headers={"Authorization": "Bearer wrong"})
    for response in (plain, wrong):
        assert response.status_code == 200
        assert response.text == "ok\n"


# ---- tools/list ---------------------------------------------------------------------------------


async def test_tools_list_lists_exactly_the_contexts_tools(server: HttpServer, kit: HostKit) -> None:
    async with signed_client(server.url, kit, "host-a", host_context(tenant="list")) as c:
        assert await c.list_names(meta={}) == []
        assert await c.list_names(meta=c.meta(now=time.time() - 400)) == []  # expired context
        assert await c.list_names(meta=c.meta(tools=["search", "get"])) == [
            "engram_memory_search", "engram_memory_get"]
        assert await c.list_names(meta=c.meta(tools=["forget"])) == ["engram_memory_forget"]
        assert await c.list_names(meta=c.meta(tools=[])) == []
        # A context used by tools/list is spent: it cannot then carry a call.
        spent = c.meta(tools=["search"])
        await c.list_names(meta=spent)
        await assert_context_refused(c, "search", search_args("anything"), spent)


async def test_an_unsigned_listing_is_expected_traffic_an_unsigned_call_a_warning(server: HttpServer,
                                                                                   kit: HostKit) -> None:
    """The SDK's client lists tools unsigned when it connects: that refusal goes below the default
    level (DEBUG); an unsigned tools/call is a host mistake and stays a WARNING (issue 32 §4)."""
    async with signed_client(server.url, kit, "host-a", host_context(tenant="quiet")) as c:
        before = len(server.stderr())
        assert await c.list_names(meta={}) == []
        assert refusal_levels(server.stderr()[before:]) == ["DEBUG"]
        before = len(server.stderr())
        await protocol_error(c, "search", search_args("unsigned"), {})
        assert refusal_levels(server.stderr()[before:]) == ["WARNING"]


def refusal_levels(log: str) -> list[str]:
    """The level of each 'no token' refusal logged (the log format: time, level, logger: message)."""
    return [line.split()[2] for line in log.splitlines() if line.endswith("invocation context refused: no token")]


# ---- tools/call: the signed context -------------------------------------------------------------


def bad_contexts(c: SignedClient, kit: HostKit, tools: list[str]) -> dict[str, dict[str, Any]]:
    """A ``_meta`` per way a context can fail to bind (all sent with host-a's bearer)."""
    host = c.host
    other_key = HostSigner("host-a", new_private_key(), kit.server_id)  # same kid, a key not in the file
    stranger = HostSigner("host-z", new_private_key(), kit.server_id)
    return {
        "none": {},
        "null": {CONTEXT_META_KEY: None},
        "garbage": {CONTEXT_META_KEY: "not.a.jwt"},
        "expired": c.meta(tools=tools, now=time.time() - 400, ttl_s=60),
        "wrong signature": {CONTEXT_META_KEY: other_key.context(host, tools)},
        "wrong audience": {CONTEXT_META_KEY: kit.signer("host-a", audience="another-server").context(host, tools)},
        "lifetime over 300 s": c.meta(tools=tools, ttl_s=301),
        "issued in the future": c.meta(tools=tools, now=time.time() + 120),
        "unknown kid": {CONTEXT_META_KEY: stranger.context(host, tools)},
        "signed by host-b": {CONTEXT_META_KEY: kit.signer("host-b").context(host, tools)},
    }


async def test_calls_without_a_valid_context_are_refused(server: HttpServer, kit: HostKit) -> None:
    args = search_args("signed context")
    async with signed_client(server.url, kit, "host-a", host_context(tenant="ctx")) as c:
        assert (await c.call("search", args))["ok"]  # the baseline call works
        for label, meta in bad_contexts(c, kit, ["search"]).items():
            err = await protocol_error(c, "search", args, meta)
            assert (err.code, err.message) == (CONTEXT_CODE, CONTEXT_MESSAGE), label
        # A mutation under each bad context, even with a valid confirmation, changes nothing.
        record_id = await admit(c, "A record no unbound forget can touch.")
        for label, meta in bad_contexts(c, kit, ["forget", "get"]).items():
            forget = forget_args(record_id)
            meta = meta | {CONFIRMATION_META_KEY: c.signer.confirmation("forget", c.host, forget)}
            err = await protocol_error(c, "forget", forget, meta)
            assert (err.code, err.message) == (CONTEXT_CODE, CONTEXT_MESSAGE), label
            await still_there(c, record_id)
        assert (await c.call("search", args))["ok"]  # the session is still usable


async def test_a_replayed_context_is_refused(server: HttpServer, kit: HostKit) -> None:
    async with signed_client(server.url, kit, "host-a", host_context(tenant="replay")) as c:
        meta = c.meta()
        assert (await envelope_of(c, "search", search_args("first use"), meta))["ok"]
        await assert_context_refused(c, "search", search_args("first use"), meta)
        await assert_context_refused(c, "get", get_args("mem_whatever"), meta)
        # The same jti, freshly signed, is still a replay.
        jti = jwt.decode(meta[CONTEXT_META_KEY], options={"verify_signature": False})["jti"]
        await assert_context_refused(c, "search", search_args("again"), c.meta(jti=jti))


async def test_host_b_context_with_host_a_bearer_is_refused(server: HttpServer, kit: HostKit) -> None:
    host = host_context(tenant="cross")
    # host-b's own bearer with host-b's context works; host-a's bearer with host-b's context does not.
    async with signed_client(server.url, kit, "host-b", host) as b:
        assert (await b.call("search", search_args("cross host")))["ok"]
    async with signed_client(server.url, kit, "host-b", host, token=kit.token("host-a")) as mixed:
        await assert_context_refused(mixed, "search", search_args("cross host"), mixed.meta())
        assert await mixed.list_names(meta=mixed.meta()) == []


async def test_purpose_ref_differing_from_the_context_is_refused(server: HttpServer, kit: HostKit) -> None:
    async with signed_client(server.url, kit, "host-a", host_context(tenant="purpose")) as c:
        await assert_context_refused(c, "search", search_args("q") | {"purpose_ref": "purpose:other"}, c.meta())
        await assert_context_refused(c, "get", get_args("mem_unknownrecord") | {"purpose_ref": "purpose:other"},
                                     c.meta())
        cap = capture_args("A capture under another purpose.", purpose="purpose:other")
        await assert_context_refused(c, "capture", cap, c.meta())
        # The NFD spelling of the bound purpose is the same purpose.
        nfd = unicodedata.normalize("NFD", PURPOSE)
        assert nfd != PURPOSE
        assert (await c.call("search", search_args("q") | {"purpose_ref": nfd}))["ok"]


async def test_a_tool_outside_the_context_is_unknown(server: HttpServer, kit: HostKit) -> None:
    async with signed_client(server.url, kit, "host-a", host_context(tenant="grant"),
                             tools=("search", "get")) as c:
        for tool, args in (("capture", capture_args("Not granted.")), ("forget", forget_args("mem_unknownrecord")),
                           ("nope", {})):
            err = await protocol_error(c, tool, args, c.meta())
            assert (err.code, err.message) == (UNKNOWN_CODE, UNKNOWN_MESSAGE), tool
        assert (await c.call("search", search_args("granted")))["ok"]


async def test_a_cli_signed_context_is_accepted(server: HttpServer, kit: HostKit, offline_env: dict[str, str]
                                                ) -> None:
    host = host_context(tenant="cli")
    argv = [sys.executable, "-m", "engram_memory.server.cli", "host", "sign-context",
            "--key", str(kit.root / "host-a.private.pem"), "--tenant", host.tenant, "--workspace", host.workspace,
            "--principal", host.principal, "--agent-id", host.agent_id, "--purpose-ref", host.purpose_ref,
            "--session", host.session, "--tools", "search,get"]
    done = subprocess.run(argv, env=offline_env, capture_output=True, text=True, timeout=60, check=True)
    token = done.stdout.strip()
    async with signed_client(server.url, kit, "host-a", host) as c:
        assert (await envelope_of(c, "search", search_args("cli"), {CONTEXT_META_KEY: token}))["ok"]


# ---- confirmations ------------------------------------------------------------------------------


async def test_withdraw_and_forget_need_a_confirmation(server: HttpServer, kit: HostKit) -> None:
    async with signed_client(server.url, kit, "host-a", host_context(tenant="noconf")) as c:
        record_id = await admit(c, "A record that only a confirmed forget removes.")
        candidate_id = await candidate(c, "A candidate that only a confirmed withdraw removes.")
        await assert_context_refused(c, "forget", forget_args(record_id), c.meta())
        await assert_context_refused(c, "withdraw", withdraw_args(candidate_id), c.meta())
        await assert_context_refused(c, "forget", forget_args(record_id), c.meta() | {CONFIRMATION_META_KEY: None})
        await still_there(c, record_id)
        # Nothing changed: the confirmed calls now succeed on both targets.
        assert (await c.call("withdraw", withdraw_args(candidate_id)))["ok"]
        assert (await c.call("forget", forget_args(record_id)))["ok"]


async def test_bad_confirmations_fail_the_gate_and_change_nothing(server: HttpServer, kit: HostKit) -> None:
    host = host_context(tenant="gate")
    async with signed_client(server.url, kit, "host-a", host) as c:
        a = await admit(c, "Record A guarded by a confirmation.")
        b = await admit(c, "Record B guarded by a confirmation.")
        args_a = forget_args(a)
        args_b = forget_args(b)
        signer = c.signer
        now = time.time()
        bad: dict[str, tuple[dict[str, Any], str]] = {
            "expired": (args_a, signer.confirmation("forget", host, args_a, now=now - 100, ttl_s=60)),
            "late": (args_a, signer.confirmation("forget", host, args_a, now=now - 40, ttl_s=120)),
            "another target": (args_b, signer.confirmation("forget", host, args_a)),
            "target claim only": (args_a, signer.confirmation("forget", host, args_a, target=b)),
            "another capability": (args_a, signer.confirmation("withdraw", host, args_a)),
            "other arguments": (args_a | {"reason_ref": "reason:other"}, signer.confirmation("forget", host, args_a)),
            "other principal": (args_a, signer.confirmation("forget", host_context(tenant="gate", principal="eve"),
                                                            args_a)),
            "other host's key": (args_a, kit.signer("host-b").confirmation("forget", host, args_a)),
            "wrong audience": (args_a, kit.signer("host-a", audience="another-server").confirmation(
                "forget", host, args_a)),
            "lifetime over 300 s": (args_a, signer.confirmation("forget", host, args_a, ttl_s=301)),
            "garbage": (args_a, "not.a.jwt"),
        }
        for label, (arguments, confirmation) in bad.items():
            meta = c.meta() | {CONFIRMATION_META_KEY: confirmation}
            envelope = await envelope_of(c, "forget", arguments, meta)
            assert error_code(envelope) == "gate_failed", (label, envelope)
            assert envelope["error"]["retriable"] is False
            await still_there(c, a)
            await still_there(c, b)
        # A refused confirmation was not spent: used properly, the same shape works once...
        confirmation = signer.confirmation("forget", host, args_a)
        first = await envelope_of(c, "forget", args_a, c.meta() | {CONFIRMATION_META_KEY: confirmation})
        assert first["ok"], first
        # ...and the same confirmation on a second identical call (with a new context) fails the gate
        # before the engine could answer the idempotent replay.
        again = await envelope_of(c, "forget", args_a, c.meta() | {CONFIRMATION_META_KEY: confirmation})
        assert error_code(again) == "gate_failed"
        assert error_code(await c.call("get", get_args(a))) == "NOT_FOUND"
        await still_there(c, b)


async def test_a_tool_in_the_confirm_claim_needs_a_confirmation(server: HttpServer, kit: HostKit) -> None:
    host = host_context(tenant="confirm-claim")
    async with signed_client(server.url, kit, "host-a", host, confirm=("capture",)) as c:
        args = capture_args("A capture the host wants confirmed.")
        await assert_context_refused(c, "capture", args, c.meta())
        wrong = c.signer.confirmation("capture", host, capture_args("Some other capture."))
        assert error_code(await envelope_of(c, "capture", args, c.meta() | {CONFIRMATION_META_KEY: wrong})) == (
            "gate_failed")
        confirmation = c.signer.confirmation("capture", host, args)
        assert jwt.decode(confirmation, options={"verify_signature": False})["target"] == ""
        assert (await envelope_of(c, "capture", args, c.meta() | {CONFIRMATION_META_KEY: confirmation}))["ok"]
        # Without capture in the confirm claim, the same tool needs none.
        plain = await envelope_of(c, "capture", capture_args("Unconfirmed capture."), c.meta(confirm=[]))
        assert plain["ok"], plain


# ---- deadline -----------------------------------------------------------------------------------


async def test_a_passed_deadline_is_deadline_exceeded(server: HttpServer, kit: HostKit) -> None:
    async with signed_client(server.url, kit, "host-a", host_context(tenant="deadline")) as c:
        record_id = await admit(c, "A record outliving a late forget.")
        past = instant(time.time() - 5)
        for tool, args in (("search", search_args("late")), ("get", get_args(record_id))):
            envelope = await envelope_of(c, tool, args, c.meta(deadline=past))
            assert error_code(envelope) == "DEADLINE_EXCEEDED", tool
            assert envelope["error"]["retriable"] is True
        late_forget = forget_args(record_id)
        envelope = await envelope_of(c, "forget", late_forget, c.meta("forget", late_forget, deadline=past))
        assert error_code(envelope) == "DEADLINE_EXCEEDED"
        await still_there(c, record_id)
        future = instant(time.time() + 60)
        assert (await envelope_of(c, "get", get_args(record_id), c.meta(deadline=future)))["ok"]


# ---- isolation ----------------------------------------------------------------------------------


async def test_tenants_and_workspaces_are_isolated(server: HttpServer, kit: HostKit) -> None:
    text = "Isolation marker pelican: scopes never share records."
    async with signed_client(server.url, kit, "host-a", host_context(tenant="iso-a")) as a:
        record_id = await admit(a, text)
        assert record_id in search_ids(await a.call("search", search_args("isolation marker pelican")))
    for kid, host in (("host-a", host_context(tenant="iso-b")),
                      ("host-b", host_context(tenant="iso-b")),
                      ("host-a", host_context(tenant="iso-a", workspace="ws-2"))):
        async with signed_client(server.url, kit, kid, host) as other:
            assert error_code(await other.call("get", get_args(record_id))) == "NOT_FOUND", host
            assert search_ids(await other.call("search", search_args("isolation marker pelican"))) == []
            forgot = await other.call("forget", forget_args(record_id))
            assert error_code(forgot) == "NOT_FOUND"
    async with signed_client(server.url, kit, "host-a", host_context(tenant="iso-a")) as a:
        await still_there(a, record_id)


# ---- dedicated servers: rate limit, key rotation, audit -----------------------------------------


async def test_rate_limit_per_principal(kit: HostKit, tmp_path_factory: pytest.TempPathFactory,
                                        offline_env: dict[str, str]) -> None:
    data_dir = tmp_path_factory.mktemp("http-rate")
    with http_server(data_dir, kit, offline_env, extra=["--rate-limit", "1", "--rate-burst", "2"]) as srv:
        async with signed_client(srv.url, kit, "host-a", host_context(tenant="rate", principal="busy")) as busy, \
                signed_client(srv.url, kit, "host-a", host_context(tenant="rate", principal="calm")) as calm:
            # Warm both connections first (a call's cost is then a few ms, well under the 1 s refill).
            await busy.list_names()
            await calm.list_names()
            first = await busy.call("search", search_args("one"))
            second = await busy.call("search", search_args("two"))
            third = await busy.call("search", search_args("three"))
            assert first["ok"] and second["ok"], (first, second)
            assert error_code(third) == "RATE_LIMITED"
            assert third["error"]["retriable"] is True
            assert (await calm.call("search", search_args("other principal")))["ok"]
        async with signed_client(srv.url, kit, "host-a", host_context(tenant="rate-2", principal="busy")) as t2:
            assert (await t2.call("search", search_args("same principal, other tenant")))["ok"]


def rewrite_host_keys(kit: HostKit, keep: list[str]) -> None:
    """host-keys.toml with only the ``keep`` hosts (their keys and tokens unchanged)."""
    data = tomllib.loads(kit.host_keys.read_text())
    text = f'server_id = "{data["server_id"]}"\n'
    for entry in data["host"]:
        if entry["kid"] in keep:
            text += host_entry(entry["kid"], entry["public_key_pem"], entry["bearer_sha256"], entry["scopes"])
    tmp = kit.host_keys.with_name("host-keys.toml.new")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(kit.host_keys)


async def wait_status(url: str, token: str, want_401: bool, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = (await raw_post(url, [("Authorization", f"Bearer {token}")])).status_code
        if (status == 401) == want_401:
            return
        assert time.monotonic() < deadline, f"status stayed {status}"
        await anyio.sleep(0.1)


async def test_sighup_rotates_host_keys(tmp_path_factory: pytest.TempPathFactory,
                                        offline_env: dict[str, str]) -> None:
    rot = HostKit(tmp_path_factory.mktemp("rotkeys"))
    rot.add("host-a")
    host = host_context(tenant="rotation")
    with http_server(tmp_path_factory.mktemp("http-rot"), rot, offline_env) as srv:
        subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "host", "keygen", "--out", str(rot.root),
                        "--kid", "host-c", "--scope", "*/*"],
                       env=offline_env, capture_output=True, timeout=60, check=True)
        # Added to the file, but not yet loaded: still 401.
        assert (await raw_post(srv.url, [("Authorization", f"Bearer {rot.token('host-c')}")])).status_code == 401
        srv.reload_keys()
        await wait_status(srv.url, rot.token("host-c"), want_401=False)
        async with signed_client(srv.url, rot, "host-c", host) as c:
            assert (await c.call("search", search_args("after rotation")))["ok"]
        # A file that no longer parses keeps the loaded keys.
        good = rot.host_keys.read_text()
        rot.host_keys.write_text("server_id = [broken\n")
        srv.reload_keys()
        deadline = time.monotonic() + 15
        while "host keys not reloaded" not in srv.stderr():
            assert time.monotonic() < deadline, "the broken file was not noticed"
            await anyio.sleep(0.1)
        async with signed_client(srv.url, rot, "host-c", host) as c:
            assert (await c.call("search", search_args("broken file kept the keys")))["ok"]
        rot.host_keys.write_text(good)
        # Removing host-c and reloading makes it 401 again; host-a is unaffected.
        rewrite_host_keys(rot, keep=["host-a"])
        srv.reload_keys()
        await wait_status(srv.url, rot.token("host-c"), want_401=True)
        async with signed_client(srv.url, rot, "host-a", host) as a:
            assert (await a.call("search", search_args("host-a stays")))["ok"]


async def test_audit_rows_carry_identity_outcome_and_jti_but_no_arguments(
        kit: HostKit, tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str], backend: Backend) -> None:
    data_dir = tmp_path_factory.mktemp("http-audit")
    host = host_context(tenant="audit", principal="auditee", agent_id="agent-audit", session="sess-audit")
    secret_text = "Audit secret narwhal text never lands in the audit trail."
    query = "secret quokka query"
    sent: dict[str, tuple[str, str | None]] = {}  # context jti -> (tool, expected code)

    def jti_of(meta: dict[str, Any]) -> str:
        return str(jwt.decode(meta[CONTEXT_META_KEY], options={"verify_signature": False})["jti"])

    with http_server(data_dir, kit, offline_env, backend=backend) as srv:
        async with signed_client(srv.url, kit, "host-a", host) as c:
            cap_args = capture_args(secret_text)
            meta = c.meta()
            cap = await envelope_of(c, "capture", cap_args, meta)
            assert cap["ok"]
            sent[jti_of(meta)] = ("capture", None)
            meta = c.meta()
            assert (await envelope_of(c, "search", search_args(query), meta))["ok"]
            sent[jti_of(meta)] = ("search", None)
            meta = c.meta()
            assert error_code(await envelope_of(c, "get", get_args("mem_missingrecord"), meta)) == "NOT_FOUND"
            sent[jti_of(meta)] = ("get", "NOT_FOUND")
            wd_args = withdraw_args(cap["output"]["value"]["candidate_id"])
            meta = c.meta() | {CONFIRMATION_META_KEY: "not.a.jwt"}
            assert error_code(await envelope_of(c, "withdraw", wd_args, meta)) == "gate_failed"
            sent[jti_of(meta)] = ("withdraw", "gate_failed")
            meta = c.meta(deadline=instant(time.time() - 5))
            assert error_code(await envelope_of(c, "search", search_args(query), meta)) == "DEADLINE_EXCEEDED"
            sent[jti_of(meta)] = ("search", "DEADLINE_EXCEEDED")

    columns, table = backend.query("SELECT * FROM audit", data_dir)
    rows = [dict(zip(columns, r, strict=True)) for r in table]
    assert {"principal", "agent_id", "session", "tool", "ok", "code", "context_jti"} <= set(columns)
    by_jti = {r["context_jti"]: r for r in rows}
    assert len(by_jti) == len(rows) == len(sent)
    for jti, (tool, code) in sent.items():
        row = by_jti[jti]
        assert (row["principal"], row["agent_id"], row["session"]) == ("auditee", "agent-audit", "sess-audit")
        assert row["scope_ref"] == host.scope_ref
        assert (row["tool"], row["code"], row["ok"]) == (tool, code, code is None), row
        assert row["audit_id"].startswith("aud_")
    forbidden = [secret_text, "narwhal", "quokka", PURPOSE, cap_args["idempotency_key"], wd_args["idempotency_key"],
                 "reason:test", "doc:adr-7", "docs/adr-7.md", cap_args["evidence"]["evidence_digest"],
                 "mem_missingrecord", wd_args["candidate_id"]]
    for row in rows:
        for value in row.values():
            for text in forbidden:
                assert text not in str(value), (text, row)


def test_allow_remote_binds_beyond_loopback_and_warns_about_tls(kit: HostKit, tmp_path: Path,
                                                                offline_env: dict[str, str]) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--http", f"0.0.0.0:{port}", "--allow-remote",
            "--data-dir", str(tmp_path / "data"), "--host-keys", str(kit.host_keys), "--no-semantic"]
    proc = subprocess.Popen(argv, env=offline_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert out == b""
    assert b"TLS must terminate in front of this server" in err


async def test_sigterm_closes_the_engine(kit: HostKit, tmp_path_factory: pytest.TempPathFactory,
                                         offline_env: dict[str, str], backend: Backend) -> None:
    """A stop flushes the audit and removes the socket; it checkpoints DuckDB (no WAL left), and a
    PostgreSQL node leaves the store's list of live nodes (a forget then no longer waits for it)."""
    data_dir = tmp_path_factory.mktemp("http-stop")
    with http_server(data_dir, kit, offline_env, backend=backend) as srv:
        async with signed_client(srv.url, kit, "host-a", host_context(tenant="stop")) as c:
            assert (await c.call("capture", capture_args("Stopping cleanly keeps the audit row.")))["ok"]
        assert (data_dir / "engram.sock").exists()
        if backend.store is not None:
            assert backend.query("SELECT count(*) FROM nodes", data_dir)[1] == [(1,)]
    assert not (data_dir / "engram.sock").exists()
    assert not (data_dir / "engram.duckdb.wal").exists()
    assert backend.query("SELECT count(*) FROM audit WHERE tool LIKE '%capture'", data_dir)[1] == [(1,)]
    if backend.store is not None:
        assert not (data_dir / "engram.duckdb").exists()
        assert backend.query("SELECT count(*) FROM nodes", data_dir)[1] == [(0,)]
