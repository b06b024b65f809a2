"""Helpers shared by the tests/test_retrieval_*.py modules (no conftest: another owner has it)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the hub, whatever the caller's env says
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def disk_files(root: Path) -> Iterator[tuple[Path, bytes]]:
    """``(path, bytes)`` of every file now under ``root`` (hidden ones too), in path order.

    A live Tantivy index writes meta files through short-lived ``.tmpXXXX`` files from its merge
    threads, so a file listed here can be renamed away before it is read. A file that is gone
    holds nothing on disk any more, so it is skipped rather than failing the scan.
    """
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            yield path, path.read_bytes()
        except FileNotFoundError:
            continue


def files_containing(root: Path, needles: Iterable[bytes]) -> dict[str, list[str]]:
    """``{needle: [relative paths]}`` for every file under ``root`` (hidden ones too) holding it."""
    needles = list(needles)
    hits: dict[str, list[str]] = {}
    for path, data in disk_files(root):
        for needle in needles:
            if needle in data:
                hits.setdefault(needle.decode("latin-1"), []).append(str(path.relative_to(root)))
    return hits


@pytest.fixture(scope="session")
def real_embedder():
    """The packaged MiniLM, loaded once per test process through the module-level cache."""
    from engram_memory.retrieval.embedder import shared_embedder

    embedder = shared_embedder()
    assert embedder.wait(180), f"packaged model did not load: {embedder.error}"
    return embedder
