"""The secrets screen on a second process, a batch ahead: a large import's texts are screened there
while this process writes the batch before (``admin import``, store/host/transfer.py).

The screen is a pure function of a text (store/screen/secrets.py ``find_secret``), so a text
screened on the other process gets the very kind this one would give it; this process then finds
it in the batch's screen cache (``policy.screen_cache``) and decides the item as before. A text
not sent or not answered (the worker could not start, or died) is screened here, as without the
worker. The screen was a quarter of an imported item's time (py-spy of a 5,000-item import): on
two cores it now runs beside the rest instead of in it.

The worker is ``python -m engram_memory.store.screen.parallel``, talking JSON lines over its stdin
and stdout -- not multiprocessing, whose spawned child would run the importing program's main
module again (a script without a ``__main__`` guard would import twice).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import IO

from engram_memory.store.screen import lazy

# Below this many items the second interpreter (~1 s to start and load the screen) costs more
# than it saves.
PARALLEL_FROM = 2000
# Texts the screen answers at once without work (too short, a digest): not sent.
_MIN_CHARS = 4


class Prescreen:
    """One worker process screening the texts it is sent, answering in the order sent."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
        self._waiting: deque[tuple[list[str], Future[dict[str, str | None]]]] = deque()
        self._lock = threading.Lock()
        self._broken = False
        self.sent = 0  # texts sent (the tests see the worker did the screening)
        # A reader thread: a large request written while the worker writes a large answer would
        # otherwise block both processes.
        assert self._proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), name="engram-prescreen",
                                         daemon=True)
        self._reader.start()

    def submit(self, texts: Iterable[str]) -> Future[dict[str, str | None]]:
        """The kinds of ``texts`` (each sent once), answered as ``text -> kind``; a failed future if
        the worker is gone (the caller screens those texts itself)."""
        unique = list(dict.fromkeys(t for t in texts if len(t) >= _MIN_CHARS))
        future: Future[dict[str, str | None]] = Future()
        line = json.dumps({"texts": unique, "learned": lazy.secrets()._LEARNED.get()}) + "\n"
        with self._lock:
            if self._broken or self._proc.stdin is None:
                future.set_exception(RuntimeError("the screen worker is not running"))
                return future
            self._waiting.append((unique, future))
        try:
            self._proc.stdin.write(line.encode("utf-8"))
            self._proc.stdin.flush()
        except OSError:
            self._fail()
        self.sent += len(unique)
        return future

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            with self._lock:
                texts, future = self._waiting.popleft()
            try:
                kinds = json.loads(line)
                future.set_result(dict(zip(texts, kinds, strict=True)))
            except (ValueError, TypeError) as exc:
                future.set_exception(exc)
        self._fail()

    def _fail(self) -> None:
        with self._lock:
            self._broken = True
            waiting, self._waiting = list(self._waiting), deque()
        for _texts, future in waiting:
            if not future.done():
                future.set_exception(RuntimeError("the screen worker stopped"))

    def close(self) -> None:
        """End the worker: what it is screening is finished (at most a batch, ~1 s), then it exits."""
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join()


@contextmanager
def prescreen(items: int) -> Iterator[Prescreen | None]:
    """A worker for an import of ``items`` items, or None where one would not pay."""
    if items < PARALLEL_FROM or len(os.sched_getaffinity(0)) < 2:
        yield None
        return
    try:
        worker = Prescreen()
    except OSError:  # no process to be had: screen here
        yield None
        return
    try:
        yield worker
    finally:
        worker.close()


def _serve() -> None:
    """The worker: one JSON request a line in, the kinds (a list, in order) a line out."""
    # A Ctrl-C at the terminal reaches the whole process group: the importing process acts on it
    # (it says how far it got); this one ends when its stdin closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    secrets = lazy.secrets()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        texts = request["texts"]
        if request["learned"]:
            kinds = [secrets.find_secret(text) for text in texts]
        else:
            with secrets.rules_only():
                kinds = [secrets.find_secret(text) for text in texts]
        sys.stdout.write(json.dumps(kinds) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
