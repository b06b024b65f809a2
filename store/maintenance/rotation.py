"""``admin rotate-master-key``: every data key re-wrapped under a new master key (KeyStore.rotate;
on a PostgreSQL store, its backend's ``rotate_master_key``: store/backend.py ``SharedBackend``).

Run with the store closed to servers: the data dir's advisory lock is held throughout, so no
key is created or destroyed meanwhile."""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path

from engram_memory.retrieval._files import fsync_dir
from engram_memory.store.core.crypto import KeyStore
from engram_memory.store.core.refusals import STORE_BUSY, AdminRefusal


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


def rotate_postgres(url: str, old_key_file: Path, old_key: bytes, out: Path) -> int:
    """A PostgreSQL store's rotation (``SharedBackend.rotate_master_key``): every wrapped key re-wrapped in one
    transaction, under a new master key written to ``out``. Returns the number of data keys.

    The new key is on disk (created exclusively, fsynced) *before* the commit: written after it, a
    failed write would leave the store under a key nobody has. If the rotation does not commit the
    file is shredded, so a refusal leaves no file; only a crash in between can leave one, holding
    a key the store does not know (harmless: every command refuses it). Raises FileExistsError."""
    from engram_memory.store.core.crypto import shred, write_owner_only
    from engram_memory.store.opening import MASTER_KEY_BYTES, shared

    new_key = secrets.token_bytes(MASTER_KEY_BYTES)
    write_owner_only(out, new_key, exclusive=True)
    fsync_dir(out.absolute().parent)
    try:
        return shared(url).rotate_master_key(url, old_key, old_key_file, new_key)
    except BaseException:
        shred(out)
        raise
