"""Streamable HTTP for hosts that sign each call: the SDK's app behind a bearer check.

``/mcp`` is the SDK's streamable HTTP app; every request to it must carry
``Authorization: Bearer <token>`` matching a host in the key ring (compared in constant
time), or it is answered 401 before any MCP processing. An MCP session belongs to the host
(bearer kid) that opened it: the authenticated host is handed to the SDK as the request's
user, and the SDK's session manager answers a POST, GET or DELETE for that session under any
other host's bearer exactly as for an unknown session (404), leaving the session untouched. ``/healthz`` answers without
authentication and says only that the process is alive. The same app serves TCP (``--http``)
and the data directory's Unix socket (local hosts, :mod:`engram_memory.server.local`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from engram_memory.server.binding import BEARER_KID_SCOPE_KEY, KeyRing

log = logging.getLogger("engram_memory.server")

MCP_PATH = "/mcp"
HEALTH_PATH = "/healthz"


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


class BearerAuth:
    """ASGI middleware: a request reaches MCP only with a known host's bearer token."""

    def __init__(self, app: ASGIApp, ring: KeyRing) -> None:
        self.app = app
        self.ring = ring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        kid = self._authenticate(scope)
        if kid is None:
            response = PlainTextResponse(
                "unauthorized\n", status_code=401, headers={"WWW-Authenticate": 'Bearer realm="engram-memory"'}
            )
            await response(scope, receive, send)
            return
        scope[BEARER_KID_SCOPE_KEY] = kid  # the dispatcher binds the signed context to this host
        scope["user"] = session_owner(kid)  # the SDK binds each session to the host that opened it
        await self.app(scope, receive, send)

    def _authenticate(self, scope: Scope) -> str | None:
        values = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
        if len(values) != 1:
            return None
        scheme, _, token = values[0].partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return None
        try:
            text = token.decode("ascii").strip()
        except UnicodeDecodeError:
            return None
        return self.ring.keys.host_for_bearer(text)


def session_owner(kid: str) -> AuthenticatedUser:
    """The host as the SDK's session manager compares it: a session opened by one kid answers
    404 to every other kid. The bearer itself is not kept (``token`` stays empty)."""
    return AuthenticatedUser(AccessToken(token="", client_id=kid, scopes=[]))


def signed_http_app(server: Server[Any], ring: KeyRing, *, bind_host: str, remote: bool,
                    extra_routes: Sequence[Route] = ()) -> ASGIApp:
    """The SDK's streamable HTTP app at /mcp, /healthz beside it, the bearer check in front
    (``extra_routes``: the owner socket's host-only backup route, server/admin/socket_routes.py)."""
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False) if remote else None
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        host=bind_host,
        transport_security=security,
        custom_starlette_routes=[Route(HEALTH_PATH, healthz, methods=["GET"]), *extra_routes],
    )
    return BearerAuth(app, ring)


def http_url(host: str, port: int) -> str:
    """A URL for logs and clients; IPv6 literals are bracketed."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


def listen_socket(host: str, port: int) -> socket.socket:
    """The TCP listener, bound before anything else happens at launch: an address in use is one
    line naming it (``OSError`` with a readable ``strerror``), and no data dir is created first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds its own
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock
