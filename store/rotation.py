"""``admin rotate-master-key``: every data key re-wrapped under a new master key (KeyStore.rotate;
on a PostgreSQL store, store/postgres/keys.py).

Run with the store closed to servers: the data dir's advisory lock is held throughout, so no
key is created or destroyed meanwhile."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from engram_memory.store.crypto import KeyStore
from engram_memory.store.refusals import STORE_BUSY, AdminRefusal


def rotate_master_key(data_dir: Path) -> int:
    """Returns the number of data keys re-wrapped."""
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AdminRefusal(STORE_BUSY, f"data dir {data_dir} is in use by a running server; stop it first") \
                from None
        return KeyStore(data_dir).rotate(data_dir)
    finally:
        os.close(fd)


def rotate_postgres(url: str, old_key: bytes, old_key_file: Path, new_key: bytes) -> int:
    """A PostgreSQL store's rotation (store/postgres/keys.py): every wrapped key re-wrapped in one
    transaction; the caller writes ``new_key`` to its file only if this returns."""
    from engram_memory.store.postgres.keys import rotate_master_key as rotate

    return rotate(url, old_key, old_key_file, new_key)
