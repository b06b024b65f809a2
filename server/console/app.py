"""The operator console: server-rendered pages over an engine the console holds open.

Security, all in this module: a one-time login token (printed at start) opens one session; every
other page without a session answers 401; the session cookie is HttpOnly and SameSite=Strict;
each session has a CSRF token that every form carries and every POST must present (403 and
nothing done otherwise), and a POST whose ``Origin`` names another site is refused (403) before
anything else; every response carries a strict Content-Security-Policy (no script at
all: the pages are plain HTML forms) and refuses framing, caching and referrers to other sites. A console
bound to one scope (``scopes``) answers 404 for every other scope, as for an unknown one.

What the pages read and do lives in the store (store/console/console_reads.py, store/console/console_ops.py);
engine calls run in a worker thread, one at a time (one operator, one console).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.datastructures import FormData, Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engram_memory.server.console.plot import activity_svg
from engram_memory.store.console import console_ops, console_reads
from engram_memory.store.core.refusals import AdminRefusal, AdminUsageError

HERE = Path(__file__).parent
COOKIE = "engram_console"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self';"
       " frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
HEADERS = {
    "content-security-policy": CSP,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # No referrer leaves the console (the login URL carries the token). Not "no-referrer": under it
    # a browser sends "Origin: null" on the console's own form POSTs, which the Origin check refuses.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
PUBLIC = ("/login", "/static/")
SAFE_METHODS = ("GET", "HEAD")  # every other method (the forms' POSTs) must come from this console's origin
T = TypeVar("T")


@dataclass
class Confirmation:
    """An operation shown to the operator with its digest, awaiting their confirmation."""

    operation: str
    request: dict[str, Any]
    digest: str
    scope_ref: str
    session: str
    expires: float


@dataclass
class ConsoleState:
    engine: Any
    where: str  # the store, as the pages name it
    scopes: tuple[str, ...] | None  # the scopes this console may show; None: every scope of the store
    login_token: str | None = field(default_factory=lambda: secrets.token_urlsafe(32))
    sessions: dict[str, str] = field(default_factory=dict)  # session id -> its CSRF token
    confirmations: dict[str, Confirmation] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: Callable[[], float] = time.monotonic
    # The Host headers answered (the bound address's names); None: any (--allow-remote). A page
    # fetched through a rebound DNS name carries another Host and is refused before anything else.
    hosts: frozenset[str] | None = None

    def visible(self) -> list[str]:
        known = self.engine.scopes()
        return [s for s in known if self.scopes is None or s in self.scopes]


class Guard:
    """ASGI middleware: security headers on every response; a session for every page but the
    login and the static files (401 otherwise)."""

    def __init__(self, app: ASGIApp, state: ConsoleState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.decode().lower() not in HEADERS]
                headers += [(k.encode(), v.encode()) for k, v in HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        host = Request(scope).headers.get("host", "")
        if self.state.hosts is not None and host not in self.state.hosts:
            await templates.TemplateResponse(Request(scope), "message.html", {
                "title": "Wrong host", "message": "Open the console at the address it printed."},
                status_code=421)(scope, receive, send_with_headers)
            return
        if scope.get("method") not in SAFE_METHODS and not same_origin(Request(scope).headers):
            await templates.TemplateResponse(Request(scope), "message.html", {
                "title": "403", "message": "This request came from another site; nothing was done."},
                status_code=403)(scope, receive, send_with_headers)
            return
        path = scope.get("path", "")
        if not path.startswith(PUBLIC) and session_of(self.state, Request(scope)) is None:
            await templates.TemplateResponse(Request(scope), "unauthorized.html", {}, status_code=401)(
                scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


def same_origin(headers: Headers) -> bool:
    """A POST's ``Origin``, when the browser sent one, names this console as the request reached
    it (its ``Host``; ``http`` or, behind a TLS front, ``https``). ``null`` is another origin."""
    origin = headers.get("origin")
    if origin is None:
        return True
    host = headers.get("host", "")
    return bool(host) and origin in (f"http://{host}", f"https://{host}")


def loopback_hosts(host: str, port: int) -> frozenset[str]:
    """The Host header values a loopback console answers: its address, by number or by name."""
    from engram_memory.server.config import LOOPBACK_HOSTS

    names = {host, *LOOPBACK_HOSTS} if host in LOOPBACK_HOSTS else {host}
    return frozenset(f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names)


def session_of(state: ConsoleState, request: Request) -> str | None:
    sid = request.cookies.get(COOKIE)
    return sid if sid is not None and sid in state.sessions else None


templates = Jinja2Templates(directory=str(HERE / "templates"))  # autoescapes .html


def create_app(state: ConsoleState) -> ASGIApp:
    """The console's ASGI app over ``state`` (its engine already open)."""
    console = _Console(state)
    routes = [
        Route("/login", console.login),
        Route("/", console.home),
        Route("/scope/{tenant}/{workspace}", console.scope_page),
        Route("/scope/{tenant}/{workspace}/candidates", console.candidates),
        Route("/scope/{tenant}/{workspace}/candidates/{cid}/reveal", console.reveal, methods=["POST"]),
        Route("/scope/{tenant}/{workspace}/candidates/{cid}/adjudicate", console.adjudicate, methods=["POST"]),
        Route("/scope/{tenant}/{workspace}/approvals", console.approvals),
        Route("/scope/{tenant}/{workspace}/records", console.records),
        Route("/scope/{tenant}/{workspace}/records/{rid}", console.record),
        Route("/scope/{tenant}/{workspace}/confirm", console.confirm, methods=["POST"]),
        Route("/scope/{tenant}/{workspace}/execute", console.execute, methods=["POST"]),
        Route("/scope/{tenant}/{workspace}/journal", console.journal),
        Route("/scope/{tenant}/{workspace}/audit", console.audit),
        Route("/scope/{tenant}/{workspace}/search", console.search),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: console.http_error})
    return Guard(app, state)


class _Console:
    def __init__(self, state: ConsoleState) -> None:
        self.state = state

    # -- plumbing --------------------------------------------------------------------------

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """An engine call in a worker thread, one at a time."""
        def locked() -> T:
            with self.state.lock, console_reads.held(self.state.engine):
                return fn(*args)
        return await anyio.to_thread.run_sync(locked)

    def page(self, request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
        sid = session_of(self.state, request)
        base = {"csrf": self.state.sessions.get(sid, "") if sid else "", "where": self.state.where,
                "bound": self.state.scopes is not None}
        return templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return self.page(request, "message.html", {"title": f"{exc.status_code}", "message": exc.detail},
                         status_code=exc.status_code)

    async def form(self, request: Request) -> FormData:
        """The POSTed form, once its CSRF token matches the session's (403 otherwise)."""
        sid = session_of(self.state, request)
        form = await request.form()
        sent = form.get("csrf")
        expected = self.state.sessions.get(sid or "", "")
        if not isinstance(sent, str) or not expected or not hmac.compare_digest(sent.encode(), expected.encode()):
            raise HTTPException(403, "The form's CSRF token is missing or wrong; nothing was done.")
        return form

    async def scope_ref(self, request: Request) -> str:
        """The path's scope, if this console may show it (404 otherwise, as for an unknown one)."""
        ref = console_reads.scope_ref_of(f"{request.path_params['tenant']}/{request.path_params['workspace']}")
        if ref not in await self.call(self.state.visible):
            raise HTTPException(404, "No such scope.")
        return ref

    # -- login -----------------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        token = request.query_params.get("token", "")
        expected = self.state.login_token
        if expected is None or not hmac.compare_digest(token.encode(), expected.encode()):
            return self.page(request, "message.html", {"title": "Login refused", "message":
                             "This login link is invalid or was used already. Restart the console for a new one."},
                             status_code=401)
        self.state.login_token = None  # one time
        sid = secrets.token_urlsafe(32)
        self.state.sessions[sid] = secrets.token_urlsafe(32)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, sid, httponly=True, samesite="strict", path="/")
        return response

    # -- pages -----------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        def read() -> list[dict[str, Any]]:
            out = []
            for ref in self.state.visible():
                summary = console_reads.scope_summary(self.state.engine, ref)
                summary["plot"] = activity_svg(console_reads.activity(self.state.engine, ref))
                out.append(summary)
            return out
        return self.page(request, "home.html", {"scopes": await self.call(read)})

    async def scope_page(self, request: Request) -> Response:
        ref = await self.scope_ref(request)

        def read() -> dict[str, Any]:
            engine = self.state.engine
            return {"summary": console_reads.scope_summary(engine, ref),
                    "plot": activity_svg(console_reads.activity(engine, ref)),
                    "status": console_reads.journal_status(engine, ref)}
        return self.page(request, "scope.html", {"scope": console_reads.scope_pair(ref), **await self.call(read)})

    async def candidates(self, request: Request, revealed: dict[str, Any] | None = None,
                         message: str | None = None, status_code: int = 200) -> Response:
        ref = await self.scope_ref(request)
        rows = await self.call(console_reads.pending_candidates, self.state.engine, ref)
        return self.page(request, "candidates.html", {"scope": console_reads.scope_pair(ref), "candidates": rows,
                                                      "revealed": revealed, "message": message},
                         status_code=status_code)

    async def reveal(self, request: Request) -> Response:
        ref = await self.scope_ref(request)
        await self.form(request)
        cid = request.path_params["cid"]
        sid = session_of(self.state, request) or ""
        payload = await self.call(console_reads.reveal_candidate, self.state.engine, ref, cid, _session_tag(sid))
        if payload is None:
            raise HTTPException(404, "No such pending candidate in this scope.")
        return await self.candidates(request, revealed={"candidate_id": cid, "payload": payload})

    async def adjudicate(self, request: Request) -> Response:
        ref = await self.scope_ref(request)
        form = await self.form(request)
        cid = request.path_params["cid"]
        decision = form.get("decision")
        if decision not in ("accept", "reject"):
            raise HTTPException(400, "Say accept or reject.")
        from engram_memory.store.host.adjudicate import adjudicate_with

        def run() -> dict[str, Any]:
            pending = {c["candidate_id"] for c in console_reads.pending_candidates(self.state.engine, ref)}
            if cid not in pending:  # a candidate of another scope is never decided from this one
                raise AdminUsageError("no such pending candidate in this scope")
            return adjudicate_with(self.state.engine, self.state.where, cid, decision == "accept",
                                   str(form.get("reason", "")), self.state.engine.clock())
        try:
            result = await self.call(run)
        except (AdminUsageError, AdminRefusal) as exc:
            return await self.candidates(request, message=_refusal(exc), status_code=_status(exc))
        return self.page(request, "result.html", {"scope": console_reads.scope_pair(ref), "operation": "adjudicate",
                                                  "rows": result_rows(result)})

    async def approvals(self, request: Request) -> Response:
        """Requests awaiting the operator's approval (clients without elicitation): who asks, what,
        the record's text, the operation digest, its age; approve or deny behind the confirm page."""
        ref = await self.scope_ref(request)
        rows = await self.call(console_reads.approval_requests, self.state.engine, ref)
        return self.page(request, "approvals.html", {"scope": console_reads.scope_pair(ref), "scope_ref": ref,
                                                     "requests": rows})

    async def records(self, request: Request) -> Response:
        ref = await self.scope_ref(request)
        state = request.query_params.get("state") or None
        if state is not None and state not in console_reads.RECORD_STATES:
            raise HTTPException(400, "No such state.")
        rows = await self.call(console_reads.records, self.state.engine, ref, state)
        return self.page(request, "records.html", {"scope": console_reads.scope_pair(ref), "records": rows,
                                                   "state": state, "states": console_reads.RECORD_STATES})

    async def record(self, request: Request) -> Response:
        ref = await self.scope_ref(request)
        detail = await self.call(console_reads.record_detail, self.state.engine, ref, request.path_params["rid"])
        if detail is None:
            raise HTTPException(404, "No such record in this scope.")
        return self.page(request, "record.html", {"scope": console_reads.scope_pair(ref), "record": detail,
                                                  "operations": console_ops.legal_operations(detail["state"])})

    async def journal(self, request: Request) -> Response:
        ref = await self.scope_ref(request)

        def read() -> dict[str, Any]:
            engine = self.state.engine
            return {"status": console_reads.journal_status(engine, ref), "events": console_reads.journal(engine, ref)}
        return self.page(request, "journal.html", {"scope": console_reads.scope_pair(ref), "scope_ref": ref,
                                                   **await self.call(read)})

    async def audit(self, request: Request) -> Response:
        ref = await self.scope_ref(request)
        rows = await self.call(console_reads.audit, self.state.engine, ref)
        return self.page(request, "audit.html", {"scope": console_reads.scope_pair(ref), "rows": rows})

    async def search(self, request: Request) -> Response:
        ref = await self.scope_ref(request)
        query = request.query_params.get("q", "").strip()
        explained, error = None, None
        if query:
            from engram_memory.models.errors import EngramError

            try:
                explained = await self.call(console_reads.explain_search, self.state.engine, ref, query)
            except EngramError as exc:
                error = exc.code
            except ValueError:  # the query itself breaks the search input's bounds
                error = "INVALID_SCHEMA"
        return self.page(request, "search.html", {"scope": console_reads.scope_pair(ref), "query": query,
                                                  "explained": explained, "error": error})

    # -- confirmed operations --------------------------------------------------------------

    async def confirm(self, request: Request) -> Response:
        """Step one: the exact request and its digest, and a form that confirms exactly that."""
        ref = await self.scope_ref(request)
        form = await self.form(request)
        operation = str(form.get("operation", ""))
        fields = {k: v for k, v in form.items() if isinstance(v, str) and k not in ("csrf", "operation")}
        if operation in ("revoke_trust", "approve", "deny"):
            fields["scope_ref"] = ref

        def prepare() -> Confirmation:
            request_ = console_ops.build(operation, fields)
            self._in_scope(ref, operation, request_)
            sid = session_of(self.state, request) or ""
            return Confirmation(operation, request_, console_ops.digest(operation, request_), ref, sid,
                                self.state.clock() + console_ops.CONFIRM_TTL_S)
        try:
            pending = await self.call(prepare)
        except (AdminUsageError, AdminRefusal) as exc:
            raise HTTPException(_status(exc), _refusal(exc)) from None
        nonce = secrets.token_urlsafe(24)
        self._expire()
        self.state.confirmations[nonce] = pending
        return self.page(request, "confirm.html", {"scope": console_reads.scope_pair(ref), "nonce": nonce,
                                                   "pending": pending, "ttl": console_ops.CONFIRM_TTL_S})

    async def execute(self, request: Request) -> Response:
        """Step two: run the confirmed request if its digest, recomputed now, is the one shown."""
        ref = await self.scope_ref(request)
        form = await self.form(request)
        self._expire()
        pending = self.state.confirmations.pop(str(form.get("nonce", "")), None)
        sid = session_of(self.state, request)
        if pending is None or pending.session != sid or pending.scope_ref != ref:
            raise HTTPException(409, "This confirmation is unknown, used or expired; start the operation again.")
        sent = str(form.get("digest", ""))

        def run() -> dict[str, Any]:
            now_digest = console_ops.digest(pending.operation, pending.request)
            if not (hmac.compare_digest(sent, pending.digest) and hmac.compare_digest(now_digest, pending.digest)):
                raise AdminRefusal("DIGEST_CONFLICT", "the confirmed digest is not this operation's; nothing was done")
            self._in_scope(ref, pending.operation, pending.request)
            return console_ops.run(self.state.engine, pending.operation, pending.request,
                                   self.state.engine.clock(), _session_tag(sid or ""))
        try:
            result = await self.call(run)
        except (AdminUsageError, AdminRefusal) as exc:
            raise HTTPException(_status(exc), _refusal(exc)) from None
        return self.page(request, "result.html", {"scope": console_reads.scope_pair(ref),
                                                  "operation": pending.operation, "digest": pending.digest,
                                                  "rows": result_rows(result)})

    def _in_scope(self, ref: str, operation: str, request: dict[str, Any]) -> None:
        """Every record an operation names belongs to the page's scope (a bound console never
        reaches another scope's record, not even to be told it exists)."""
        if operation == "revoke_trust":
            if request["scope_ref"] != ref:
                raise AdminUsageError("revoke trust runs on this page's scope only")
            return
        if operation in ("approve", "deny"):
            from engram_memory.store.host.approvals import find

            found = find(self.state.engine, request["request_id"])
            if request["scope_ref"] != ref or found is None or found.scope_ref != ref:
                raise AdminUsageError(f"no request {request['request_id']} awaits approval in this scope")
            return
        for name in ("record_id", "by"):
            if name in request and console_reads.record_scope(self.state.engine, request[name]) != ref:
                raise AdminUsageError(f"no record {request[name]} in this scope")

    def _expire(self) -> None:
        now = self.state.clock()
        for nonce in [n for n, c in self.state.confirmations.items() if c.expires <= now]:
            del self.state.confirmations[nonce]


def result_rows(value: Any, key: str = "") -> list[tuple[str, str]]:
    """An operation's result as (dotted key, value) rows for a table: nested objects by path."""
    if isinstance(value, dict):
        return [row for k, v in value.items() for row in result_rows(v, f"{key}.{k}" if key else str(k))]
    if isinstance(value, list):
        return [row for i, v in enumerate(value) for row in result_rows(v, f"{key}[{i}]")] or [(key, "[]")]
    return [(key, "true" if value is True else "false" if value is False else str(value))]


def _session_tag(sid: str) -> str:
    """The audit row's session: a tag of the console session, never its cookie."""
    import hashlib

    return "console-" + hashlib.sha256(sid.encode()).hexdigest()[:12]


def _refusal(exc: Exception) -> str:
    return f"{exc.code}: {exc}" if isinstance(exc, AdminRefusal) else str(exc)


def _status(exc: Exception) -> int:
    return 409 if isinstance(exc, AdminRefusal) else 400
