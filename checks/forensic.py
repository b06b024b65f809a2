"""Forensic scans of a data directory: is forgotten content anywhere on disk?

Two views, both reading only what is under the data directory:

* ``scan_files``: the raw bytes of every file (hidden ones, locks, temp files, the DuckDB file
  and its WAL included), searched for each needle.
* ``scan_duckdb``: every value of every DuckDB table, searched as stored, and every sealed blob
  (candidate envelopes, record bodies, embeddings) opened with every data key still under
  ``keys/`` -- the attacker who copies the whole directory holds ``master.key`` too, so content
  whose data key survives is readable, sealed or not.

Needles (``content_needles``) are the content's text, each distinctive token and its stemmed
form as the lexical index stores it (its language's analyzer), and the float32 vector bytes (as
embedded and unit-normalised as the vector index stores them).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np

from engram_memory.retrieval.languages import identify
from engram_memory.retrieval.lexical import query_terms
from engram_memory.retrieval.vectors import normalize_rows
from engram_memory.store.core.crypto import KEYS_DIR, KeyStore, key_files, open_sealed
from engram_memory.store.core.lifecycle import pending_context, record_context

KEY_PREFIX = "local:key-"


def content_needles(label: str, text: str, tokens: Iterable[str] = (),
                    vector: np.ndarray | None = None) -> dict[str, bytes]:
    """``{name: bytes}`` to look for: the text, each token raw and stemmed, the vector's bytes."""
    needles = {f"{label}:text": text.encode("utf-8")}
    # Stemmed as the lexical index stores the record: by the text's own language's analyzer (and by
    # English's, the analysis of an older index).
    codes = sorted({identify(text), "en"})
    for token in tokens:
        needles[f"{label}:token:{token}"] = token.encode("utf-8")
        for code in codes:
            for stem in query_terms(token, code=code):
                needles[f"{label}:stem:{stem}"] = stem.encode("utf-8")
    if vector is not None:
        row = np.asarray(vector, dtype="<f4").reshape(1, -1)
        needles[f"{label}:vector"] = row.tobytes()
        needles[f"{label}:vector-unit"] = normalize_rows(row).astype("<f4").tobytes()
    return needles


@dataclass
class Scan:
    """Where each needle was found (``{needle: [places]}``) and what the scan read."""

    files: int = 0
    size: int = 0  # bytes read (scan_files)
    values: int = 0  # DuckDB values read (scan_duckdb)
    opened: int = 0  # sealed blobs opened with a surviving key (scan_duckdb)
    seconds: float = 0.0
    hits: dict[str, list[str]] = field(default_factory=dict)

    def found(self, prefix: str = "") -> dict[str, list[str]]:
        return {k: v for k, v in self.hits.items() if k.startswith(prefix)}

    def check(self, place: str, data: bytes, needles: Mapping[str, bytes]) -> None:
        for name, needle in needles.items():
            if needle in data:
                self.hits.setdefault(name, []).append(place)


def scan_files(root: Path, needles: Mapping[str, bytes]) -> Scan:
    """Raw bytes of every file under ``root``, recursively (a file gone mid-scan holds nothing)."""
    scan, start = Scan(), time.perf_counter()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        scan.files += 1
        scan.size += len(data)
        scan.check(str(path.relative_to(root)), data, needles)
    scan.seconds = time.perf_counter() - start
    return scan


# Sealed columns: the row column that names the AES-GCM associated data, how the data is derived,
# and the SQL giving each such row's own data key.
SEALED = {
    ("candidates", "envelope"): ("candidate_id", pending_context, "SELECT candidate_id, key_ref FROM candidates"),
    ("records", "body"): ("record_id", record_context, "SELECT record_id, key_ref FROM records"),
    ("embeddings", "vector"): ("record_id", record_context, "SELECT record_id, key_ref FROM records"),
}


def surviving_keys(data_dir: Path) -> dict[str, bytes]:
    """Every data key still on disk, unwrapped with the master key found beside it."""
    keys = KeyStore(data_dir)
    out = {}
    for path in key_files(keys.dir):
        try:
            dek = keys.load(KEY_PREFIX + path.name)
        except Exception:  # noqa: BLE001 - an overwritten (half-destroyed) key opens nothing
            continue
        if dek is not None:
            out[KEY_PREFIX + path.name] = dek
    return out


def readable_leftovers(data_dir: Path, sealed: Mapping[str, tuple[bytes, bytes]]) -> dict[str, list[str]]:
    """For sealed blobs read before an operation (``{name: (blob, associated data)}``): the files
    that still hold a blob's ciphertext -- DuckDB's WAL and free blocks keep old versions that no
    query reaches -- while a surviving data key opens it. Ciphertext whose key is gone is noise."""
    deks = list(surviving_keys(data_dir).values())
    out: dict[str, list[str]] = {}
    for path in sorted(p for p in data_dir.rglob("*") if p.is_file()):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        for name, (blob, aad) in sealed.items():
            if blob in data and any(_opens(dek, blob, aad) for dek in deks):
                out.setdefault(name, []).append(str(path.relative_to(data_dir)))
    return out


def _opens(dek: bytes, blob: bytes, aad: bytes) -> bool:
    try:
        open_sealed(dek, blob, aad)
    except ValueError:
        return False
    return True


def scan_duckdb(data_dir: Path, needles: Mapping[str, bytes],
                con: duckdb.DuckDBPyConnection | None = None) -> Scan:
    """Every DuckDB value (a closed store is opened read-only; an open engine passes its own
    connection), and every sealed blob opened with the surviving data keys that could open it:
    its row's own key and every key no row references (each blob's associated data names its
    row, so a key that belongs to another row can never open it -- trying every key on every
    blob would cost keys x blobs)."""
    scan, start = Scan(), time.perf_counter()
    own = con is None
    if con is None:
        con = duckdb.connect(str(data_dir / "engram.duckdb"), read_only=True)
    try:
        deks = surviving_keys(data_dir)
        orphans = [deks[ref] for ref in orphan_keys(data_dir, con) if ref in deks]
        own_keys = {sealed: dict(con.execute(spec[2]).fetchall()) for sealed, spec in SEALED.items()}
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' ORDER BY 1").fetchall()]
        for table in tables:
            cur = con.execute(f'SELECT * FROM "{table}"')
            columns = [d[0] for d in cur.description]
            for row in cur.fetchall():
                values = dict(zip(columns, row, strict=True))
                for column, value in values.items():
                    if value is None:
                        continue
                    scan.values += 1
                    data = value if isinstance(value, bytes | bytearray) else str(value).encode("utf-8")
                    scan.check(f"duckdb:{table}.{column}", bytes(data), needles)
                    sealed = SEALED.get((table, column))
                    if sealed is None or not isinstance(value, bytes | bytearray):
                        continue
                    owner, aad_of, _ = sealed
                    own_ref = own_keys[(table, column)].get(values[owner])
                    for dek in ([deks[own_ref]] if own_ref in deks else []) + orphans:
                        try:
                            plain = open_sealed(dek, bytes(value), aad_of(values[owner]))
                        except ValueError:
                            continue
                        scan.opened += 1
                        scan.check(f"duckdb:{table}.{column} (opened with a surviving key)", plain, needles)
    finally:
        if own:
            con.close()
    scan.seconds = time.perf_counter() - start
    return scan


def orphan_keys(data_dir: Path, con: duckdb.DuckDBPyConnection | None = None) -> list[str]:
    """Key files no candidate or record references: each could open ciphertext left in DuckDB's
    free blocks or WAL (which no query reaches), so a complete destruction leaves none."""
    own = con is None
    if con is None:
        con = duckdb.connect(str(data_dir / "engram.duckdb"), read_only=True)
    try:
        referenced = {r[0] for r in con.execute(
            "SELECT key_ref FROM candidates WHERE key_ref IS NOT NULL"
            " UNION SELECT key_ref FROM records WHERE key_ref IS NOT NULL").fetchall()}
    finally:
        if own:
            con.close()
    return sorted(KEY_PREFIX + p.name for p in key_files(data_dir / KEYS_DIR) if KEY_PREFIX + p.name not in referenced)
