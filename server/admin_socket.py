"""The one host-only request the owner of a data dir answers on its socket: an online backup.

Not an MCP tool and not on any TCP listener: the route exists only on ``DATA_DIR/engram.sock``
(mode 0600, owner-only directory), behind the same bearer check as the socket's /mcp, whose
token only the data dir's user can read. DuckDB lets no second process read the store while
a server holds it, so the owner copies it (store/backup.py ``snapshot``, under its engine's
write lock) and streams the tar back; the CLI writes it (``engram-memory admin backup``).
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
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route

BACKUP_PATH = "/admin/backup"


def admin_routes(engine: Any) -> list[Route]:
    from engram_memory.store.backup import snapshot

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

    return [Route(BACKUP_PATH, backup, methods=["POST"])]


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class OwnerUnreachable(RuntimeError):
    """The process holding the data dir does not answer on its socket."""


def request_backup(data_dir: Path, backup_key: bytes, out: Path) -> None:
    """Ask the owner of ``data_dir`` for a backup and write it to ``out`` (0600)."""
    import httpx2

    from engram_memory.server.local import read_local_key, socket_path

    try:
        token = read_local_key(data_dir).token
    except (OSError, ValueError):
        raise OwnerUnreachable("its local host key is unreadable") from None
    transport = httpx2.HTTPTransport(uds=str(socket_path(data_dir)))
    try:
        with httpx2.Client(transport=transport, headers={"Authorization": f"Bearer {token}"},
                           timeout=httpx2.Timeout(30, read=600)) as client, \
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
