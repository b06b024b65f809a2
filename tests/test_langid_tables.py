"""The language identifier's tables from the model cache: the same classifier as py3langid's own
model restricted by ``set_languages``, and a cache file that is not exactly what was written is
never used."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from engram_memory.retrieval import langid_tables
from engram_memory.retrieval.languages import IDENTIFIED

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "xquad"
VERSION = version("py3langid")


def _reference() -> object:
    """The classifier as py3langid builds it from its packaged model (what languages.py used before)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=False)
    model.set_languages(list(IDENTIFIED))
    model.nb_ptc = np.ascontiguousarray(model.nb_ptc, dtype=np.float32)
    return model


def _texts() -> list[str]:
    texts = ["Prefers PostgreSQL for ledgers", "la clave del wifi es pollitos1958", "Das Spiel endete 24:10."]
    for corpus in sorted(DATA.glob("*/corpus.jsonl")):
        with corpus.open(encoding="utf-8") as fh:
            texts += [json.loads(line)["text"][:240] for _, line in zip(range(25), fh, strict=False)]
    return texts


def test_the_cached_classifier_is_py3langids_own_restricted_one(tmp_path: Path) -> None:
    reference = _reference()
    built = langid_tables.identifier(VERSION, IDENTIFIED, tmp_path)  # written now
    cached = langid_tables.identifier(VERSION, IDENTIFIED, tmp_path)  # read back
    texts = _texts()
    assert len(texts) > 200
    for model in (built, cached):
        for name in ("nb_ptc", "nb_pc"):
            assert np.array_equal(getattr(model, name), getattr(reference, name)), name
        for name in ("nb_classes", "tk_nextmove", "tk_row", "tk_output"):
            assert getattr(model, name) == getattr(reference, name), name
        assert [model.classify(t) for t in texts] == [reference.classify(t) for t in texts]  # type: ignore[attr-defined]


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "other version", "other languages", "no manifest"])
def test_a_cache_that_is_not_what_was_written_is_written_again(tmp_path: Path, damage: str) -> None:
    langid_tables.identifier(VERSION, IDENTIFIED, tmp_path)
    folder = next(tmp_path.glob("py3langid-*"))
    table, manifest = folder / "ptc.npy", folder / "manifest.json"
    good = table.read_bytes()
    if damage == "flip a byte":
        raw = bytearray(good)
        raw[-5] ^= 0x01
        table.write_bytes(bytes(raw))
    elif damage == "truncate":
        table.write_bytes(good[: len(good) // 2])
    elif damage == "no manifest":
        manifest.unlink()
    else:
        meta = json.loads(manifest.read_text())
        meta["py3langid" if damage == "other version" else "languages"] = "something else"
        manifest.write_text(json.dumps(meta))
    assert langid_tables._read(folder, VERSION, IDENTIFIED) is None
    model = langid_tables.identifier(VERSION, IDENTIFIED, tmp_path)
    assert table.read_bytes() == good
    assert langid_tables._read(folder, VERSION, IDENTIFIED) is not None
    assert model.classify("Der Verein gewann das Spiel in der letzten Minute.")[0] == "de"


def test_a_cache_that_cannot_be_written_still_identifies(tmp_path: Path) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder would be")  # mkdir fails, even for root
    model = langid_tables.identifier(VERSION, IDENTIFIED, blocked)
    assert model.classify("Der Verein gewann das Spiel in der letzten Minute.")[0] == "de"
    assert blocked.read_text() == "a file where the cache folder would be"
