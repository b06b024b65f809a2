"""py3langid's classifier restricted to the languages we identify, loaded from the model cache.

py3langid ships its model LZMA-compressed (4.6 MB); decompressing it costs ~0.8 s in every process
that identifies a language (a server's first non-English record or query, each admin command that
re-analyses records). The tables the restricted classifier uses (55 MB: the float32 feature table
of the ``IDENTIFIED`` languages and the tokenizer's automaton) are written once to the model cache
(retrieval/onnx_runtime.py ``cache_root``) as plain ``.npy`` files with a manifest naming each
one's dtype, shape and SHA-256, the py3langid version and the languages; a missing, partial or
corrupt table, or one of another version or language set, is written again. Loading them takes
0.1-0.2 s, the checksums included: identification is pinned (a record's language decides its
analysis), so a cache file is never trusted unchecked.
"""

from __future__ import annotations

import hashlib
import json
import logging
from array import array
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.retrieval._files import atomic_write, write_json
from engram_memory.retrieval.onnx_runtime import cache_root, locked

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
TABLES = ("ptc", "pc", "classes", "nextmove", "row", "out")


def _folder(version: str, languages: Sequence[str], root: Path | None) -> Path:
    tag = hashlib.sha256(",".join(languages).encode()).hexdigest()[:16]
    return (root or cache_root()) / f"py3langid-{version}-{tag}"


def _from_package(languages: Sequence[str]) -> dict[str, np.ndarray]:
    """The restricted tables from py3langid's own (compressed) model file."""
    from py3langid.langid import MODEL_DIR, MODEL_FILE
    from py3langid.modelio import load_model

    path = Path(MODEL_FILE) if Path(MODEL_FILE).is_absolute() else MODEL_DIR / MODEL_FILE
    ptc, pc, classes, nextmove, row, out = load_model(path)
    wanted = set(languages)
    keep = [i for i, c in enumerate(classes) if c in wanted]
    return {
        # the restricted table is a strided float16 view: one contiguous float32 copy makes the
        # classifier's lookup several times faster
        "ptc": np.ascontiguousarray(np.asarray(ptc)[:, keep], dtype=np.float32),
        "pc": np.asarray(pc)[keep],
        "classes": np.asarray([classes[i] for i in keep]),
        "nextmove": np.frombuffer(nextmove, dtype=f"u{nextmove.itemsize}"),
        "row": np.frombuffer(row, dtype=f"u{row.itemsize}"),
        "out": np.asarray(out, dtype=np.int32),
    }


def _fingerprint(table: np.ndarray) -> dict[str, Any]:
    return {"dtype": table.dtype.str, "shape": list(table.shape),
            "sha256": hashlib.sha256(table.data.cast("B")).hexdigest()}


def _read(folder: Path, version: str, languages: Sequence[str]) -> dict[str, np.ndarray] | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("py3langid") != version or manifest.get("languages") != list(languages):
            return None
        tables = {name: np.load(folder / f"{name}.npy", allow_pickle=False) for name in TABLES}
        if any(manifest["tables"][name] != _fingerprint(table) for name, table in tables.items()):
            return None
        return tables
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(folder: Path, version: str, languages: Sequence[str], tables: dict[str, np.ndarray]) -> None:
    for name, table in tables.items():
        atomic_write(folder / f"{name}.npy", partial(np.save, arr=table, allow_pickle=False))
    write_json(folder / MANIFEST, {"py3langid": version, "languages": list(languages),
                                   "tables": {name: _fingerprint(table) for name, table in tables.items()}})


def tables(version: str, languages: Sequence[str], root: Path | None = None) -> dict[str, np.ndarray]:
    """The restricted tables: from the cache when it holds valid ones, else built and cached (a
    cache that cannot be written is only logged: identification goes on from the package)."""
    folder = _folder(version, languages, root)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with locked(folder):
            cached = _read(folder, version, languages)
            if cached is not None:
                return cached
            built = _from_package(languages)
            _write(folder, version, languages, built)
            return built
    except OSError as exc:
        log.warning("the language identifier's tables could not be cached (%s)", exc.strerror or exc)
        return _from_package(languages)


def _stdlib_array(table: np.ndarray) -> array[int]:
    """The unsigned table as the ``array`` py3langid's automaton indexes."""
    out = array({1: "B", 2: "H", 4: "I", 8: "Q"}[table.itemsize])
    out.frombytes(table.data.cast("B"))
    return out


def identifier(version: str, languages: Sequence[str], root: Path | None = None) -> Any:
    """A py3langid ``LanguageIdentifier`` over exactly ``languages`` (raw scores, as ``classify`` ranks)."""
    from py3langid.langid import LanguageIdentifier

    t = tables(version, languages, root)
    nextmove, row = _stdlib_array(t["nextmove"]), _stdlib_array(t["row"])
    return LanguageIdentifier(t["ptc"], t["pc"], t["classes"].tolist(), nextmove, t["out"].tolist(),
                              norm_probs=False, tk_row=row)
