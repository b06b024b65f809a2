"""The data directory's advisory lock: one engram-memory process owns a directory at a time."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from engram_memory.store.backend import StoreBusyError

LOCK_FILE = ".lock"


def lock_data_dir(data_dir: Path) -> int:
    """Create the directory (owner-only) and take its lock; returns the fd that holds it.

    Raises StoreBusyError when another process holds it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o700)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise StoreBusyError(f"data directory {data_dir} is in use by another engram-memory process") from exc
    return fd
