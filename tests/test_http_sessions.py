"""An MCP session belongs to the host that opened it (issue 33 §2); request headers are logged
escaped (§3).

Two hosts, each with its own bearer, on one real ``serve --http``. Host A opens a session
through the SDK client; host B (its own bearer, its own signed context) presents A's
``mcp-session-id`` on POST, GET and DELETE, by raw requests and through B's own SDK client.
Every such request is answered exactly as for an unknown session (404, same body), and A's
session goes on serving A afterwards. Before the fix B was served inside A's session and B's
DELETE ended it (A's next call: ``-32600 Session not found``). The ``Origin`` and ``Host``
values the SDK logs reach the server's stderr with their control characters
escaped: before, a C1 byte went to the log as it came.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import search_args
from tests.http_fixtures import HostKit, HttpServer, SignedClient, host_context, http_server

pytestmark = pytest.mark.anyio

SESSION_HEADER = "mcp-session-id"
PROTOCOL_HEADER = "mcp-protocol-version"


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> HostKit:
    kit = HostKit(tmp_path_factory.mktemp("session-keys"))
    kit.add("host-a")
    kit.add("host-b")
    return kit


@pytest.fixture(scope="module")
def server(kit: HostKit, tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> Iterator[HttpServer]:
    data_dir: Path = tmp_path_factory.mktemp("session-data")
    with http_server(data_dir, kit, offline_env) as srv:
        yield srv


@asynccontextmanager
async def watched_client(url: str, kit: HostKit, kid: str, tenant: str, *,
                         use_session: str | None = None) -> AsyncIterator[tuple[SignedClient, dict[str, str]]]:
    """``kid``'s SDK client; ``seen`` holds the session id and protocol version its requests carry.
    With ``use_session``, every request after the opening one carries that session id instead
    of the client's own (another host's session, presented through the SDK)."""
    seen: dict[str, str] = {}

    async def on_request(request: httpx2.Request) -> None:
        own = request.headers.get(SESSION_HEADER)
        if own is not None and use_session is not None:
            request.headers[SESSION_HEADER] = use_session
        for name in (SESSION_HEADER, PROTOCOL_HEADER):
            if name in request.headers:
                seen[name] = request.headers[name]

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {kit.token(kid)}"},
                              timeout=httpx2.Timeout(30, read=60), event_hooks={"request": [on_request]})
    # legacy: the initialize handshake, whose answer opens a session (the 2026 era has none)
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        yield SignedClient(client, kit.signer(kid), host_context(tenant=tenant)), seen


def request_headers(kit: HostKit, kid: str, session: str, protocol: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {kit.token(kid)}", SESSION_HEADER: session, PROTOCOL_HEADER: protocol,
            "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def call_body(c: SignedClient, query: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "engram_memory_search", "arguments": search_args(query), "_meta": c.meta()}}


def shape(response: httpx2.Response) -> tuple[int, str, str | None, str | None]:
    return (response.status_code, response.text, response.headers.get("content-type"),
            response.headers.get(SESSION_HEADER))


async def test_another_hosts_bearer_meets_a_session_as_unknown(server: HttpServer, kit: HostKit) -> None:
    async with watched_client(server.url, kit, "host-a", "sess-a") as (a, seen_a):
        assert (await a.call("search", search_args("host a opens")))["ok"]
        session, protocol = seen_a[SESSION_HEADER], seen_a[PROTOCOL_HEADER]
        b = SignedClient(a.client, kit.signer("host-b"), host_context(tenant="sess-b"))  # B's signer only
        unknown = uuid.uuid4().hex
        async with httpx2.AsyncClient(timeout=10) as http:
            # The reference: an unknown session under B's bearer.
            reference = await http.post(server.url, headers=request_headers(kit, "host-b", unknown, protocol),
                                        json=call_body(b, "unknown session"))
            assert reference.status_code == 404
            answers = {
                "post": await http.post(server.url, headers=request_headers(kit, "host-b", session, protocol),
                                        json=call_body(b, "into a's session")),
                "get": await http.get(server.url, headers=request_headers(kit, "host-b", session, protocol)),
                "delete": await http.delete(server.url, headers=request_headers(kit, "host-b", session, protocol)),
            }
            for method, response in answers.items():
                assert shape(response) == shape(reference), method
            # The same requests on another unknown id answer the same for GET and DELETE too.
            for method in ("GET", "DELETE"):
                headers = request_headers(kit, "host-b", unknown, protocol)
                other = await http.request(method, server.url, headers=headers)
                assert shape(other) == shape(reference), method
        # A's session is untouched: A's SDK client goes on in it.
        assert (await a.call("search", search_args("host a still in its session")))["ok"]
        assert seen_a[SESSION_HEADER] == session
        assert "credential does not match" in server.stderr()


async def test_another_hosts_sdk_client_cannot_use_or_end_a_session(server: HttpServer, kit: HostKit) -> None:
    async with watched_client(server.url, kit, "host-a", "sdk-a") as (a, seen_a):
        assert (await a.call("search", search_args("host a opens")))["ok"]
        session = seen_a[SESSION_HEADER]
        failures: list[BaseException] = []
        try:
            # B's SDK client opens its own session, then presents A's on every later request
            # (its calls and, on leaving, its DELETE).
            async with watched_client(server.url, kit, "host-b", "sdk-b", use_session=session) as (b, seen_b):
                try:
                    await b.call("search", search_args("host b inside a's session"))
                except Exception as exc:  # the SDK's error for a 404 session
                    failures.append(exc)
                assert seen_b[SESSION_HEADER] == session
        except Exception as exc:  # the SDK may also fail on leaving (its DELETE answered 404)
            failures.append(exc)
        assert failures, "host B was served inside host A's session"
        # A is still served in its own session, and ends it itself.
        assert (await a.call("search", search_args("host a after b")))["ok"]
        assert seen_a[SESSION_HEADER] == session
    async with httpx2.AsyncClient(timeout=10) as http:  # A's DELETE on leaving ended it
        gone = await http.delete(server.url, headers=request_headers(kit, "host-a", session, seen_a[PROTOCOL_HEADER]))
    assert gone.status_code == 404


# ---- header values in the log (issue 33 §3) -------------------------------------------------------

# Bytes 0x80-0xFF pass uvicorn's parser in a header value and read as Latin-1: C1 controls (NEL,
# CSI) and, for U+2028's UTF-8, a C1 byte too. A tab passes as well.
HOSTILE = b"evil.example\x85FORGED LINE\x9b31m\te\xe2\x80\xa8x"
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # a newline and tab may end or pad a line


async def test_header_values_the_sdk_logs_are_escaped(server: HttpServer, kit: HostKit) -> None:
    bearer = f"Bearer {kit.token('host-a')}".encode()
    base = [(b"Authorization", bearer), (b"Accept", b"application/json, text/event-stream"),
            (b"Content-Type", b"application/json")]
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
    port = server.base.rsplit(":", 1)[1]
    async with httpx2.AsyncClient(timeout=10) as http:
        origin = await http.post(server.url, headers=[*base, (b"Origin", b"http://" + HOSTILE)], json=initialize)
        host = await http.post(server.url, headers=[*base, (b"Host", HOSTILE + b":" + port.encode())],
                               json=initialize)
        session = await http.post(server.url, headers=[*base, (b"mcp-session-id", HOSTILE)], json=initialize)
    assert (origin.status_code, host.status_code, session.status_code) == (403, 421, 404)
    log = server.stderr_path.read_bytes().decode("utf-8")
    for line in ("Invalid Origin header: http://evil.example\\x85FORGED LINE\\x9b31m\\x09e\u00e2\\x80\u00a8x",
                 "Invalid Host header: evil.example\\x85FORGED LINE\\x9b31m\\x09e\u00e2\\x80\u00a8x:" + port):
        assert line in log, line
    assert not UNSAFE.search(log), repr(UNSAFE.search(log))
    assert all(not line.startswith("FORGED") for line in log.splitlines())
