"""Handing freed heap back to the operating system.

glibc keeps what Python objects, DuckDB scans and ONNX Runtime's activations freed in its arenas,
and a resident set only ever grows: a 10k store's first scope load left ~36 MiB behind, 64 SciFact
abstracts encoded eight at a time ~190 MiB (with ONNX Runtime's own arena off, retrieval/onnx_runtime.py).
``malloc_trim(0)`` returns it (2-12 ms); it runs after such steps, never on a search's path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to hand back this way
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_heap() -> None:
    """Return the heap's free pages to the OS (glibc), or do nothing."""
    if _TRIM is not None:
        _TRIM(0)
