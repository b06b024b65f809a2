"""Helpers shared by the tests/test_retrieval_*.py modules (no conftest: another owner has it)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # never reach for the hub, whatever the caller's env says
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def files_containing(root: Path, needles: Iterable[bytes]) -> dict[str, list[str]]:
    """``{needle: [relative paths]}`` for every file under ``root`` (hidden ones too) holding it."""
    needles = list(needles)
    hits: dict[str, list[str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for needle in needles:
            if needle in data:
                hits.setdefault(needle.decode("latin-1"), []).append(str(path.relative_to(root)))
    return hits


@pytest.fixture(scope="session")
def real_embedder():
    """The packaged MiniLM, loaded once per test process through the module-level cache."""
    from retrieval.embedder import shared_embedder

    embedder = shared_embedder()
    assert embedder.wait(180), f"packaged model did not load: {embedder.error}"
    return embedder
