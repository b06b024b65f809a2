"""Data keys made a batch ahead, on a thread: an import's next batch finds its keys ready.

Making a key is mostly the kernel's work (DuckDB: a new file in one of 256 directories, then one
sync of the file system for the batch; PostgreSQL: one committed row each), a sixth of an
imported item's time on the 2-core machine (py-spy of a 5,000-item import). A thread does it
while the import's own thread screens, digests and writes the batch before; the system calls
release the GIL, so the two run on both cores.

Nothing changes for a crash: a key is durable before a commit names it (``create_many`` waits
for the thread, whose own ``create_many`` syncs before it returns), and a key made but never named is an
orphan like one a crash leaves between ``create_many`` and the commit -- swept at the next open.
``close`` destroys the keys left unused.
"""

from __future__ import annotations

import threading

from engram_memory.store.backend import KeyRing


class KeyReserve:
    """Keys of ``ring`` handed out by ``create_many``, which then makes the next batch's on a thread."""

    def __init__(self, ring: KeyRing) -> None:
        self._ring = ring
        self._spare: list[tuple[str, bytes]] = []
        self._thread: threading.Thread | None = None
        self._ahead = 0

    def ahead(self, count: int) -> None:
        """The next ``create_many`` but one will want about ``count`` keys (the next batch's size)."""
        self._ahead = count

    def _make(self, count: int) -> None:
        try:
            self._spare.extend(self._ring.create_many(count))
        except Exception:  # disk full and the like: the next create_many meets it again, in its caller
            pass

    def _wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def create_many(self, count: int) -> list[tuple[str, bytes]]:
        """``count`` durable keys: the spare ones first, the rest made now; then the next batch's
        start being made on the thread."""
        self._wait()
        taken, self._spare = self._spare[:count], self._spare[count:]
        if len(taken) < count:
            taken += self._ring.create_many(count - len(taken))
        wanted, self._ahead = self._ahead - len(self._spare), 0
        if wanted > 0:
            self._thread = threading.Thread(target=self._make, args=(wanted,), name="engram-key-reserve")
            self._thread.start()
        return taken

    def close(self) -> None:
        """The keys made and never used are destroyed."""
        self._wait()
        spare, self._spare = self._spare, []
        for key_ref, _dek in spare:
            self._ring.destroy(key_ref)
