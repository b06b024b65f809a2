"""The secrets screen, imported when a text is first screened.

Importing it compiles ~450 regular expressions and loads detect-secrets (with requests): ~0.3 s a
process. A process that never screens -- `admin verify`, `explain`, `export`, `backup`, a server
that only searches -- does not pay it; a server warms it in the background once it is serving
(``warm``), so its first capture does not wait for it either.
"""

from __future__ import annotations

import threading
from types import ModuleType


def secrets() -> ModuleType:
    """``store/screen/secrets.py``, imported now if no one has yet (the import lock makes this safe
    from any thread)."""
    from engram_memory.store.screen import secrets as module

    return module


def warm() -> None:
    """Import the screen on a background thread: a server's first capture finds it compiled. Not a
    daemon: a server stopped at once waits for the import (at most its ~0.3 s) instead of tearing the
    interpreter down under it."""
    threading.Thread(target=secrets, name="engram-screen-warm").start()
