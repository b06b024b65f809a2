"""The host-only requests the owner of a data dir answers on its socket: an online backup, the
host lifecycle operations (dispute, resolve, supersede, revoke trust, rewind), and the operator's
decisions on requests awaiting approval (store/host/approvals.py: list, approve, deny).

Not MCP tools and not on any TCP listener: the routes exist only on ``DATA_DIR/engram.sock``
(mode 0600, owner-only directory), behind the same bearer check as the socket's /mcp, whose
token only the data dir's user can read. DuckDB lets no second process read the store while
a server holds it, so the owner copies it (store/maintenance/backup.py ``snapshot``, under its engine's
write lock) and streams the tar back; the CLI writes it (``engram-memory admin backup``). A
host operation is applied by the owner in process (store/host/hostops.py, under its engine's write
lock), so its projections follow at once; the CLI prints the answer (server/admin/lifecycle.py).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import anyio
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

BACKUP_PATH = "/admin/backup"
HOSTOP_PATH = "/admin/hostop"
APPROVALS_PATH = "/admin/approvals"
# How the owner answers a host operation it did not apply (the CLI maps them back).
REFUSED_STATUS, USAGE_STATUS = 409, 422


def admin_routes(engine: Any) -> list[Route]:
    from engram_memory.store.maintenance.backup import snapshot

    data_dir = Path(engine.config.data_dir)

    async def backup(request: Request) -> Response:
        try:
            body = await request.json()
            key = bytes.fromhex(body["backup_key"])
            if len(key) != 32:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return PlainTextResponse("bad request\n", status_code=400)
        fd, name = tempfile.mkstemp(prefix=".backup-out-", dir=data_dir)
        os.close(fd)
        tmp = Path(name)
        try:
            await anyio.to_thread.run_sync(snapshot, engine, key, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return FileResponse(tmp, media_type="application/x-tar",
                            background=BackgroundTask(_unlink, tmp))

    def json_operation(apply: Any) -> Any:
        """A route that applies a JSON object body on a worker thread (``apply(body)``) and answers its
        result, an operator refusal, or a usage mistake, as the admin commands expect."""
        async def route(request: Request) -> Response:
            from engram_memory.store.core.refusals import AdminRefusal, AdminUsageError

            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise ValueError
            except ValueError:
                return PlainTextResponse("bad request\n", status_code=400)
            try:
                result = await anyio.to_thread.run_sync(apply, body)
            except AdminRefusal as exc:
                return JSONResponse({"code": exc.code, "message": str(exc)}, status_code=REFUSED_STATUS)
            except AdminUsageError as exc:
                return JSONResponse({"message": str(exc)}, status_code=USAGE_STATUS)
            return JSONResponse(result)
        return route

    def hostop(body: dict[str, Any]) -> Any:
        from engram_memory.store.host.hostops import apply_operation

        return apply_operation(engine, body, engine.clock())

    return [Route(BACKUP_PATH, backup, methods=["POST"]),
            Route(HOSTOP_PATH, json_operation(hostop), methods=["POST"]),
            Route(APPROVALS_PATH, json_operation(lambda body: approval_request(engine, body)), methods=["POST"])]


def approval_request(engine: Any, body: dict[str, Any]) -> dict[str, Any]:
    """``{"action": "list", "scope_ref"?}`` or ``{"action": "approve"|"deny", "request_id", "reason"}``
    on an open engine: the owner's (through its socket), or one the command opened itself."""
    from engram_memory.store.core.refusals import AdminUsageError
    from engram_memory.store.host import approvals

    action = body.get("action")
    scope_ref = body.get("scope_ref")
    if scope_ref is not None and not isinstance(scope_ref, str):
        raise AdminUsageError("scope_ref must be a string")
    if action == "list":
        return {"requests": approvals.pending(engine, scope_ref, engine.clock())}
    request_id, reason = body.get("request_id"), body.get("reason")
    if action not in ("approve", "deny") or not isinstance(request_id, str) or not isinstance(reason, str):
        raise AdminUsageError("an approval request names an action, a request id and a reason")
    return approvals.decide(engine, request_id, action == "approve", reason, engine.clock(), scope_ref)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class OwnerUnreachable(RuntimeError):
    """The process holding the data dir does not answer on its socket."""


def _owner_client(data_dir: Path) -> Any:
    """An HTTP client on the owner's socket, with the data dir's local bearer token."""
    import httpx2

    from engram_memory.server.local import read_local_key, socket_path

    try:
        token = read_local_key(data_dir).token
    except (OSError, ValueError):
        raise OwnerUnreachable("its local host key is unreadable") from None
    transport = httpx2.HTTPTransport(uds=str(socket_path(data_dir)))
    return httpx2.Client(transport=transport, headers={"Authorization": f"Bearer {token}"},
                         timeout=httpx2.Timeout(30, read=600))


def request_hostop(data_dir: Path, operation: dict[str, Any], path: str = HOSTOP_PATH) -> dict[str, Any]:
    """Ask the owner of ``data_dir`` to apply a host operation (or, on ``APPROVALS_PATH``, an
    approval request); its answer, or the refusal (AdminRefusal) or mistake (AdminUsageError) it
    answered."""
    import httpx2

    from engram_memory.store.core.refusals import AdminRefusal, AdminUsageError

    try:
        with _owner_client(data_dir) as client:
            response = client.post("http://localhost" + path, json=operation)
    except httpx2.TransportError as exc:
        raise OwnerUnreachable(f"its socket does not answer ({type(exc).__name__})") from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise OwnerUnreachable(f"it answered HTTP {response.status_code}")
    if response.status_code == REFUSED_STATUS:
        raise AdminRefusal(str(answer["code"]), str(answer["message"]))
    if response.status_code == USAGE_STATUS:
        raise AdminUsageError(str(answer["message"]))
    if response.status_code != 200:
        raise OwnerUnreachable(f"it answered HTTP {response.status_code}")
    return answer


def request_backup(data_dir: Path, backup_key: bytes, out: Path) -> None:
    """Ask the owner of ``data_dir`` for a backup and write it to ``out`` (0600)."""
    import httpx2

    try:
        with _owner_client(data_dir) as client, \
                client.stream("POST", "http://localhost" + BACKUP_PATH,
                              json={"backup_key": backup_key.hex()}) as response:
            if response.status_code != 200:
                raise OwnerUnreachable(f"it answered HTTP {response.status_code}")
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                for chunk in response.iter_bytes(1 << 20):
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
    except httpx2.TransportError as exc:
        raise OwnerUnreachable(f"its socket does not answer ({type(exc).__name__})") from None
