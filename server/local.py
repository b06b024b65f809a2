"""Several local hosts, one memory: the data directory's owner socket and its signing key.

DuckDB lets one process own a data directory. The process that holds it (a stdio launch,
``engram-memory daemon`` or ``serve --http``) also serves the per-call signed-context mode
on ``DATA_DIR/engram.sock`` (mode 0600). A later stdio launch on the same directory relays
its host's calls there (:mod:`engram_memory.server.relay`), signing its own launch-bound
context per call with the directory's local host key: ``DATA_DIR/local-host.private.pem``
and ``local-host.token``, 0600 in a 0700 directory, so only the owner's user can sign.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from engram_memory.models.hostauth import (
    HostSigner,
    bearer_digest,
    load_private_key,
    new_bearer_token,
    new_private_key,
    private_pem,
)
from engram_memory.server.binding import KeyRing
from engram_memory.server.hostkeys import ANY_SCOPE, HostKey, HostKeys, write_owner_only

log = logging.getLogger("engram_memory.server")

SOCKET_NAME = "engram.sock"
KEY_NAME = "local-host.private.pem"
TOKEN_NAME = "local-host.token"
LOCAL_KID = "local-host"
LOCAL_AUDIENCE = "engram-local-socket"
# Over a Unix socket the URL's host only fills the Host header (checked against loopback names).
SOCKET_URL = "http://localhost:1/mcp"
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux, 104 on macOS


def socket_path(data_dir: Path) -> Path:
    return data_dir / SOCKET_NAME


@dataclass(frozen=True)
class LocalKey:
    signer: HostSigner
    token: str


def ensure_local_key(data_dir: Path) -> LocalKey:
    """The directory's local host key, created once by the owner (it holds the lock)."""
    key_path, token_path = data_dir / KEY_NAME, data_dir / TOKEN_NAME
    if not (key_path.exists() and token_path.exists()):
        write_owner_only(token_path, new_bearer_token().encode("ascii"))
        write_owner_only(key_path, private_pem(new_private_key()))
    return read_local_key(data_dir)


def read_local_key(data_dir: Path) -> LocalKey:
    """Raises OSError (absent, unreadable) or ValueError (damaged)."""
    key = load_private_key((data_dir / KEY_NAME).read_bytes())
    token = (data_dir / TOKEN_NAME).read_text(encoding="ascii").strip()
    return LocalKey(HostSigner(LOCAL_KID, key, LOCAL_AUDIENCE), token)


def local_ring(key: LocalKey) -> KeyRing:
    host = HostKey(
        LOCAL_KID,
        key.signer.key.public_key(),
        bytes.fromhex(bearer_digest(key.token).removeprefix("sha256:")),
        ANY_SCOPE,  # the owner's own user: every launch on this directory binds its own scope
    )
    return KeyRing(None, HostKeys(LOCAL_AUDIENCE, {LOCAL_KID: host}))


def bind_socket(path: Path) -> socket.socket:
    """Listen on ``path`` with mode 0600 from the first instant (the owner holds the lock,
    so a file already there is a dead owner's)."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise OSError(f"socket path too long for a Unix socket: {path}")
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the owning process decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def serve_socket(app: Any, path: Path, sock: socket.socket) -> None:
    """Serve ``app`` on the bound owner socket until cancelled, then stop uvicorn gracefully
    (a cancelled uvicorn logs its lifespan as a traceback); the socket file goes with it."""
    server = _QuietServer(
        uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=2)
    )
    stopped = anyio.Event()

    async def run() -> None:
        with anyio.CancelScope(shield=True):  # stopped by should_exit, never by cancellation
            try:
                await server.serve(sockets=[sock])
            finally:
                stopped.set()

    log.info("local hosts can share this memory through %s", path)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                await stopped.wait()
            finally:
                server.should_exit = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await stopped.wait()
                server.force_exit = True
    finally:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@asynccontextmanager
async def connect_owner(data_dir: Path, key: LocalKey) -> AsyncIterator[Client]:
    """An SDK client to the owner's socket, authenticated with the local bearer token."""
    transport = httpx2.AsyncHTTPTransport(uds=str(socket_path(data_dir)))
    http = httpx2.AsyncClient(
        transport=transport,
        headers={"Authorization": f"Bearer {key.token}"},
        timeout=httpx2.Timeout(30, read=330),  # a relayed confirmation may wait up to 300 s
    )
    async with http, Client(streamable_http_client(SOCKET_URL, http_client=http)) as client:
        yield client
