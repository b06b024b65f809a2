"""Small file helpers shared by the projections: atomic replace, JSON sidecars, digests."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def fsync_dir(path: Path) -> None:
    # The rename is only durable once the directory entry is flushed.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` via a temp file in the same directory, fsync, then ``os.replace``.

    Readers see the old bytes or the new bytes, never a torn file; the old inode is
    unlinked, so no file in the directory keeps the replaced content.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def replace_from_path(path: Path, write_to: Callable[[Path], None]) -> None:
    """Like ``atomic_write`` for libraries that insist on writing a file by name (hnswlib)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write_to(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def write_json(path: Path, value: Any) -> None:
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    atomic_write(path, lambda fh: fh.write(data))


def read_json(path: Path) -> Any:
    with open(path, "rb") as fh:
        return json.loads(fh.read().decode("utf-8"))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()
