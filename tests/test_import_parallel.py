"""What a large import runs beside its own thread (issue 40 §3): the items' checks and the secrets
screen on a second process (store/host/import_worker.py) and the next batch's data keys on a
thread (store/core/keyreserve.py). Both must give exactly what this process would, and leave
nothing behind. Real worker process, real key files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engram_memory.store.core.crypto import KeyStore, key_files
from engram_memory.store.core.keyreserve import KeyReserve
from engram_memory.store.host import import_worker
from engram_memory.store.host.transfer import Item, _answered, _check_args, _chunks
from engram_memory.store.screen.policy import needs_screening
from engram_memory.store.screen.secrets import find_secret, rules_only, strings_of
from tests.store_fixtures import capture_args

PASSWORD_TEXT = "Her database password is Tr0ub4dor&3-horse-staple"
TEXTS = [
    "The staging cluster is called heron",
    PASSWORD_TEXT,
    "la clave del wifi de la casa es pollitos1958",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "Leads the billing team",
    "Zürich, 東京, \u2028 and a lone \ud800 surrogate",
    "ok",  # too short to send
]


SCOPE = "acme/import-test"


def _batch() -> list[Item]:
    """Items as an import reads them: valid ones carrying the texts, an invalid one, a lone
    surrogate, one with no arguments at all."""
    def args(text: str) -> dict[str, Any]:
        made = capture_args(text.encode("utf-8", "replace").decode())  # (its digests need valid text)
        made["payload"]["components"][0]["text"] = text
        return {"payload": made["payload"], "evidence": made["evidence"]}

    items = [Item(f"item {i}", args(text)) for i, text in enumerate(TEXTS)]
    items.append(Item("no evidence", {"payload": args(TEXTS[0])["payload"]}))
    items.append(Item("not an item", None, "INVALID_SCHEMA: not an object"))
    return items


def test_the_worker_answers_what_this_process_would() -> None:
    items = _batch()
    worker = import_worker.ImportWorker()
    try:
        answer = worker.submit(SCOPE, [item._args for item in items]).result(timeout=120)
        with rules_only():
            rules = worker.submit(SCOPE, [item._args for item in items]).result(timeout=120)
    finally:
        worker.close()
    assert worker.sent == 2 * (len(items) - 1)  # the item without arguments is never sent
    expected = [None if item.args is None else _check_args(SCOPE, item.args) for item in items]
    assert answer.checks == expected == rules.checks
    assert sum(isinstance(c, str) for c in expected) == 2 and isinstance(expected[0], tuple)  # two invalid
    texts = {t for item in items if item.args for t in strings_of(item.args) if needs_screening(t)}
    assert answer.screened == {t: find_secret(t) for t in texts}
    assert any(answer.screened.values()) and not all(answer.screened.values())  # secrets found, prose passed
    with rules_only():
        assert rules.screened == {t: find_secret(t) for t in texts}


def test_the_worker_screens_nothing_of_an_item_the_scope_holds() -> None:
    """A re-run of an interrupted import: the items already recorded are checked (their digest is
    how this process knows them) but not screened, on the worker as here."""
    items = _batch()
    held = [item for item in items if item.args and PASSWORD_TEXT in str(item.args)]
    assert len(held) == 1
    digest = _check_args(SCOPE, held[0].args)[2]
    worker = import_worker.ImportWorker()
    try:
        answer = worker.submit(SCOPE, [item._args for item in items], present=[digest]).result(timeout=120)
        again = worker.submit(SCOPE, [held[0]._args]).result(timeout=120)  # the worker kept the digest
    finally:
        worker.close()
    assert answer.checks == [None if item.args is None else _check_args(SCOPE, item.args) for item in items]
    assert not [t for t in answer.screened if PASSWORD_TEXT in t]
    assert answer.screened and any(answer.screened.values())  # the other items' texts were screened
    assert again.checks[0][2] == digest and not again.screened


def test_a_dead_worker_leaves_the_work_to_this_process() -> None:
    worker = import_worker.ImportWorker()
    try:
        worker.submit(SCOPE, [_batch()[0]._args]).result(timeout=120)
        os.kill(worker._proc.pid, signal.SIGKILL)
        worker._proc.wait()
        worker._reader.join(timeout=30)
        late = worker.submit(SCOPE, [item._args for item in _batch()])
        assert _answered(late) is None  # the caller checks and screens every item itself
    finally:
        worker.close()


def test_small_imports_start_no_worker() -> None:
    with import_worker.import_worker(import_worker.PARALLEL_FROM - 1) as worker:
        assert worker is None


def test_batches_cover_every_item_once_growing_to_the_batch_size() -> None:
    from engram_memory.store.host import transfer

    for total in (1, 49, 50, 51, 1999, 2000, 2001, 5000, 12345):
        chunks = _chunks(total)
        covered = [i for chunk in chunks for part in chunk for i in range(part.start, part.stop)]
        assert covered == list(range(total))
        sizes = [part.stop - part.start for chunk in chunks for part in chunk]
        assert sizes[0] == min(total, transfer.FIRST_BATCH) and max(sizes) <= transfer.BATCH
        assert all(part.stop <= (part.start // transfer.INDEX_EVERY + 1) * transfer.INDEX_EVERY
                   for chunk in chunks for part in chunk)  # no batch crosses an indexing chunk


def test_keys_made_ahead_are_durable_files_and_the_unused_are_destroyed(tmp_path: Path) -> None:
    ring = KeyStore(tmp_path)
    reserve = KeyReserve(ring)
    first = reserve.create_many(3)  # none spare yet: made now
    assert len(first) == 3 and len(key_files(ring.dir)) == 3
    reserve.ahead(5)
    second = reserve.create_many(2)  # made now, then 5 more on the thread
    third = reserve.create_many(4)  # 4 of the 5 made ahead
    refs = [ref for ref, _ in first + second + third]
    assert len(set(refs)) == 9
    for ref, dek in first + second + third:
        assert ring.load(ref) == dek  # each one on disk, under the master key
    assert len(key_files(ring.dir)) == 10  # one made ahead and not used yet
    reserve.close()
    assert sorted(p.name for p in key_files(ring.dir)) == sorted(ref.removeprefix("local:key-") for ref in refs)


@pytest.mark.parametrize("count", [0, 1])
def test_a_reserve_never_used_leaves_no_key(tmp_path: Path, count: int) -> None:
    ring = KeyStore(tmp_path)
    reserve = KeyReserve(ring)
    reserve.ahead(4)
    reserve.create_many(count)
    reserve.close()
    assert len(key_files(ring.dir)) == count


def _graph(path: Path, total: int) -> Path:
    path.write_text("".join(json.dumps({"type": "entity", "name": f"Entity {e}", "entityType": "note",
                                        "observations": [f"Observation {e}-{k} about ledger {e * 10 + k}"
                                                         for k in range(10)]}) + "\n"
                            for e in range(total // 10)))
    return path


def _group(pgid: int) -> list[str]:
    """The command lines of the processes of a process group (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getpgid(int(entry.name)) == pgid:
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return found


def _group_gone(pgid: int, timeout: float = 60) -> bool:
    """True once no process of the group is left (the importer and its worker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_an_interrupted_import_leaves_no_worker_behind(tmp_path: Path, how: str) -> None:
    """A Ctrl-C at a terminal reaches the whole process group: the import still says how far it got
    (exit 130, no traceback) and its worker ends with it. A SIGKILL of the importer alone closes the
    worker's stdin: the worker ends too."""
    graph = _graph(tmp_path / "memory.jsonl", import_worker.PARALLEL_FROM + 1000)
    proc = subprocess.Popen([sys.executable, "-m", "engram_memory.server.cli", "admin", "import", "--scope",
                             "acme/main", "--from", str(graph), "--data-dir", str(tmp_path / "store")],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("engram-memory: importing: ") and not line.startswith("engram-memory: importing: 0/"):
            break
    workers = [c for c in _group(proc.pid) if "engram_memory.store.host.import_worker" in c]
    assert len(workers) == 1, _group(proc.pid)  # the import runs with its worker
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err)
        assert "interrupted after" in err.strip().splitlines()[-1], err
    else:
        proc.kill()
        proc.communicate(timeout=60)
    assert _group_gone(proc.pid), _group(proc.pid)
