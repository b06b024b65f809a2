"""A large import's second process, a batch ahead: while this process writes batch *i*, the worker
checks batch *i + 1*'s items against the contract (``import_checks._check_args``: the idempotency key,
the capture's validation, the payload digest) and screens their texts for secrets
(store/screen/secrets.py ``find_secret``) -- a third and a quarter of an imported item's time on
the importing thread before (py-spy of a 5,000-item import).

Both are pure functions of the item, run by the same code, so the worker's answers are the ones
this process would compute: an item's plain capture arguments (or the reason it is invalid) and a
text's kind. This process uses them as its own -- the texts through the batch's screen cache
(``policy.screen_cache``), so the decision is still made here, item by item -- and computes
itself whatever it was not given (an item or text not sent, a worker that could not start or
died).

The worker is ``python -m engram_memory.store.host.import_worker``, JSON lines over its stdin
and stdout -- not multiprocessing, whose spawned child would run the importing program's main
module again (a script without a ``__main__`` guard would import twice).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Collection, Iterator
from concurrent.futures import Future
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import IO, Any

from engram_memory.store.screen import lazy

# Below this many items the second interpreter (~1 s to start and load the screen) costs more
# than it saves.
PARALLEL_FROM = 2000
# An item's check, as the worker sends it: its plain capture arguments, admission key and payload
# digest, or why it is invalid (the report's reason); None for an item not sent.
Check = tuple[dict[str, Any], str, str] | str | None


@dataclass
class Answer:
    """The worker's answer for one batch."""

    checks: list[Check]  # by item, in the batch's order
    screened: dict[str, str | None]  # text -> kind (None: no secret)


class ImportWorker:
    """One worker process answering the batches it is sent, in the order sent."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONIOENCODING": "utf-8"})
        self._waiting: deque[Future[Answer]] = deque()
        self._lock = threading.Lock()
        self._broken = False
        self._closing = False
        self.sent = 0  # items sent (the tests see the worker did the work)
        # Two threads: a request (~0.5 MB) fills the pipe while the worker is still on the one
        # before, and writing it from the importing thread blocked that thread (~9% of its time,
        # py-spy); reading on a thread keeps a large answer from blocking both processes.
        self._lines: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        assert self._proc.stdout is not None and self._proc.stdin is not None
        self._writer = threading.Thread(target=self._write, args=(self._proc.stdin,), name="engram-import-send",
                                        daemon=True)
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), name="engram-import-answers",
                                        daemon=True)
        self._writer.start()
        self._reader.start()

    def submit(self, scope_ref: str, args: list[bytes | None], present: Collection[str] = ()) -> Future[Answer]:
        """Check and screen a batch: each item's capture arguments as compact JSON (an ``Item``'s
        own bytes), None for one not to send. ``present``: payload digests of records the scope
        holds (the worker keeps them: an item with one of those is counted, never screened). A
        failed future if the worker is gone."""
        future: Future[Answer] = Future()
        items = b",".join(b"null" if a is None else a for a in args)
        line = b'{"scope":%s,"learned":%s,"present":%s,"items":[%s]}\n' % (
            json.dumps(scope_ref).encode(), b"true" if lazy.secrets()._LEARNED.get() else b"false",
            json.dumps(sorted(present)).encode(), items)
        with self._lock:
            if self._broken or self._closing:
                future.set_exception(RuntimeError("the import worker is not running"))
                return future
            self._waiting.append(future)  # answers come in the order the lines are written
            self._lines.put(line)
        self.sent += sum(a is not None for a in args)
        return future

    def _write(self, stdin: IO[bytes]) -> None:
        while (line := self._lines.get()) is not None:
            if self._closing:
                continue  # the import is over: what was not sent yet is never answered
            try:
                stdin.write(line)
                stdin.flush()
            except OSError:
                self._fail()
        try:
            stdin.close()
        except OSError:
            pass

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            with self._lock:
                future = self._waiting.popleft()
            try:
                answer = json.loads(line)
                future.set_result(Answer([_check(c) for c in answer["checks"]], answer["screened"]))
            except (ValueError, TypeError, KeyError) as exc:
                future.set_exception(exc)
        self._fail()

    def _fail(self) -> None:
        with self._lock:
            self._broken = True
            waiting, self._waiting = list(self._waiting), deque()
        for future in waiting:
            if not future.done():
                future.set_exception(RuntimeError("the import worker stopped"))

    def close(self) -> None:
        """End the worker: lines not yet sent are dropped, the batch it is on (~1 s) is finished,
        then its stdin closes and it exits."""
        with self._lock:
            self._closing = True
        self._lines.put(None)
        self._writer.join(timeout=30)  # (a worker that stopped reading is killed below, which frees it)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._writer.join()
        self._reader.join()


def _check(sent: Any) -> Check:
    return tuple(sent) if isinstance(sent, list) else sent


@contextmanager
def import_worker(items: int) -> Iterator[ImportWorker | None]:
    """A worker for an import of ``items`` items, or None where one would not pay."""
    if items < PARALLEL_FROM or len(os.sched_getaffinity(0)) < 2:
        yield None
        return
    try:
        worker = ImportWorker()
    except OSError:  # no process to be had: everything is done here
        yield None
        return
    try:
        yield worker
    finally:
        worker.close()


def _serve() -> None:
    """The worker: one batch a line in, its checks and its texts' kinds a line out."""
    # A Ctrl-C at the terminal reaches the whole process group: the importing process acts on it
    # (it says how far it got); this one ends when its stdin closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from engram_memory.store.host.import_checks import _check_args
    from engram_memory.store.screen.policy import needs_screening

    secrets = lazy.secrets()
    present: set[str] = set()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        present.update(request["present"])
        checks: list[Any] = []
        texts: dict[str, None] = {}
        for args in request["items"]:
            if args is None:
                checks.append(None)
                continue
            checked = _check_args(request["scope"], args)
            checks.append(checked if isinstance(checked, str) else list(checked))
            if not isinstance(checked, str) and checked[2] in present:
                continue  # already a record: the importing process counts it and screens nothing
            # (not a digest: ~1 ms each to screen, two new ones an item, and never a secret)
            texts.update((t, None) for t in secrets.strings_of(args) if needs_screening(t))
        with nullcontext() if request["learned"] else secrets.rules_only():
            screened = {text: secrets.find_secret(text) for text in texts}
        sys.stdout.write(json.dumps({"checks": checks, "screened": screened}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
