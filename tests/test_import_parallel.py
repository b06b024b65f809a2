"""What a large import runs beside its own thread (issue 40 §3): the secrets screen on a second
process (store/screen/parallel.py) and the next batch's data keys on a thread
(store/core/keyreserve.py). Both must give exactly what this process would, and leave nothing
behind. Real worker process, real key files."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from engram_memory.store.core.crypto import KeyStore, key_files
from engram_memory.store.core.keyreserve import KeyReserve
from engram_memory.store.host.transfer import _answered, _chunks
from engram_memory.store.screen import parallel
from engram_memory.store.screen.secrets import find_secret, rules_only

TEXTS = [
    "The staging cluster is called heron",
    "Her database password is Tr0ub4dor&3-horse-staple",
    "la clave del wifi de la casa es pollitos1958",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "Leads the billing team",
    "Zürich, 東京, \u2028 and a lone \ud800 surrogate",
    "ok",  # too short to send
]


def test_the_worker_answers_what_this_process_would() -> None:
    worker = parallel.Prescreen()
    try:
        answers = worker.submit(TEXTS + TEXTS).result(timeout=120)
        with rules_only():
            rules = worker.submit(TEXTS).result(timeout=120)
    finally:
        worker.close()
    assert "ok" not in answers and worker.sent == 2 * (len(TEXTS) - 1)  # each text once a request
    assert answers == {t: find_secret(t) for t in TEXTS if len(t) >= 4}
    assert any(answers.values()) and not all(answers.values())  # secrets found, prose passed
    with rules_only():
        assert rules == {t: find_secret(t) for t in TEXTS if len(t) >= 4}


def test_a_dead_worker_leaves_the_screening_to_this_process() -> None:
    worker = parallel.Prescreen()
    try:
        worker.submit(TEXTS[:1]).result(timeout=120)
        os.kill(worker._proc.pid, signal.SIGKILL)
        worker._proc.wait()
        worker._reader.join(timeout=30)
        late = worker.submit(TEXTS)
        assert _answered(late) is None  # the caller screens every text itself
    finally:
        worker.close()


def test_small_imports_start_no_worker() -> None:
    with parallel.prescreen(parallel.PARALLEL_FROM - 1) as worker:
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
