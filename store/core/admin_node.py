"""The engine an admin command opens on a shared store (``--store URL``): a short-lived node of its own.

It takes no projections (its data dir is a temporary directory, removed afterwards: the admin
command only journals lifecycle events, and every serving node catches up from the journal,
as it does for another node's writes), loads no embedding model, and leaves the store's
``nodes`` table when it closes. It never acknowledges a cursor, so no forget waits for it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine


@contextmanager
def admin_engine(url: str, master_key_file: Path) -> Iterator[Engine]:
    with tempfile.TemporaryDirectory(prefix="engram-admin-") as tmp:
        engine = Engine.open(EngineSettings(data_dir=Path(tmp), store=url, master_key_file=master_key_file,
                                            semantic=False))
        try:
            yield engine
        finally:
            engine.close()
