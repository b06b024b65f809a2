"""HTTP mode fixtures: host keys, a real `serve --http` process, and a signing SDK client.

Shared by the HTTP end-to-end, isolation and local-host tests (and mirrored, without pytest,
by eval/bench_http.py and examples/host.py).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from engram_memory.models.context import ALL_TOOLS, HostContext
from engram_memory.models.hostauth import (
    CONFIRMATION_META_KEY,
    CONTEXT_META_KEY,
    HostSigner,
    load_private_key,
)
from engram_memory.server.hostkeys import keygen
from tests.conftest import DUCKDB, PURPOSE, Backend, check_result

ALL_TOOL_NAMES: tuple[str, ...] = ALL_TOOLS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class HostKit:
    """A directory of host keys made by the real keygen (``host-keys.toml`` + per-host files)."""

    root: Path
    server_id: str = "engram-local"

    def add(self, kid: str, scopes: Sequence[str] = ("*/*",)) -> None:
        keygen(self.root, kid, scopes, self.server_id)

    @property
    def host_keys(self) -> Path:
        return self.root / "host-keys.toml"

    def signer(self, kid: str, audience: str | None = None) -> HostSigner:
        key = load_private_key((self.root / f"{kid}.private.pem").read_bytes())
        return HostSigner(kid, key, audience or self.server_id)

    def token(self, kid: str) -> str:
        return (self.root / f"{kid}.token").read_text().strip()


def host_context(tenant: str = "tenant-a", workspace: str = "ws-1", principal: str = "alice",
                 agent_id: str = "agent-7", session: str = "sess-1", purpose: str = PURPOSE) -> HostContext:
    return HostContext(tenant, workspace, principal, agent_id, purpose, session)


@dataclass
class HttpServer:
    url: str
    base: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def reload_keys(self) -> None:
        self.proc.send_signal(signal.SIGHUP)


def wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, "server exited early"
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "server did not become healthy"
        time.sleep(0.1)


@contextmanager
def http_server(data_dir: Path, kit: HostKit, env: dict[str, str], extra: Sequence[str] = (),
                backend: Backend = DUCKDB) -> Iterator[HttpServer]:
    """A real ``engram-memory serve --http`` process (lexical only: fast to start) on ``backend``'s store."""
    port = free_port()
    argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--http", f"127.0.0.1:{port}",
            "--data-dir", str(data_dir), "--host-keys", str(kit.host_keys), "--no-semantic",
            "--log-level", "DEBUG", *backend.args(), *extra]
    err_path = data_dir.parent / f"{data_dir.name}-http-{port}.stderr"
    with err_path.open("w") as err:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        yield HttpServer(base + "/mcp", base, proc, data_dir, err_path)
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert out == b"", "stdout stays silent over HTTP"
    # SIGTERM is a graceful stop that closes the engine (uvicorn used to re-raise it: exit 143)
    assert proc.returncode == 0, f"serve --http exited {proc.returncode} on SIGTERM"


@dataclass
class SignedClient:
    """One host's SDK client: every call gets a fresh signed context (and confirmation)."""

    client: Client
    signer: HostSigner
    host: HostContext
    tools: Sequence[str] = ALL_TOOL_NAMES
    confirm: Sequence[str] = ()
    sent: list[str] = field(default_factory=list)  # context tokens sent, for replay tests

    def context(self, **kw: Any) -> str:
        token = self.signer.context(self.host, kw.pop("tools", self.tools), kw.pop("confirm", self.confirm), **kw)
        self.sent.append(token)
        return token

    def meta(self, tool: str | None = None, arguments: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {CONTEXT_META_KEY: self.context(**kw)}
        if tool is not None and arguments is not None:
            meta[CONFIRMATION_META_KEY] = self.signer.confirmation(tool, self.host, arguments)
        return meta

    async def list_names(self, meta: dict[str, Any] | None = None) -> list[str]:
        result = await self.client.list_tools(meta=self.meta() if meta is None else meta, cache_mode="bypass")
        return [t.name for t in result.tools]

    async def raw(self, tool: str, arguments: dict[str, Any], meta: dict[str, Any]) -> types.CallToolResult:
        result = await self.client.call_tool("engram_memory_" + tool, arguments, meta=meta)
        assert isinstance(result, types.CallToolResult)
        return result

    async def call(self, tool: str, arguments: dict[str, Any], *, confirmed: bool | None = None) -> dict[str, Any]:
        """The envelope of a call with a fresh context; withdraw/forget get a fresh confirmation."""
        needs = confirmed if confirmed is not None else tool in ("withdraw", "forget", *self.confirm)
        meta = self.meta(tool, arguments) if needs else self.meta()
        return check_result(await self.raw(tool, arguments, meta))


@asynccontextmanager
async def signed_client(url: str, kit: HostKit, kid: str, host: HostContext, *,
                        token: str | None = None, **kw: Any) -> AsyncIterator[SignedClient]:
    bearer = kit.token(kid) if token is None else token
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=httpx2.Timeout(30, read=300))
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        signed = SignedClient(client, kit.signer(kid), host, **kw)
        # A signed listing first: the SDK client then knows the tools' output schemas and does
        # not list again (unsigned) before each result.
        await signed.list_names()
        yield signed
