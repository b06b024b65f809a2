"""Master key files of a PostgreSQL store: written once, owner-only, never overwritten."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engram_memory.store.core.crypto import write_owner_only
from engram_memory.store.opening import MASTER_KEY_BYTES


@contextmanager
def new_key_file(path: Path) -> Iterator[bytes]:
    """A fresh master key, at ``path`` only if the block succeeds (a store that refused it leaves no
    file behind). Raises FileExistsError when ``path`` exists."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # e.g. ~/.config/engram-memory on a new machine
    key = secrets.token_bytes(MASTER_KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    write_owner_only(tmp, key, exclusive=True)
    try:
        yield key
        os.link(tmp, path)  # fails if the path appeared meanwhile: never overwrites
    finally:
        tmp.unlink(missing_ok=True)
