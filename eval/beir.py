"""BEIR-format collection loader: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``.

Only queries that have test judgments are kept (SciFact's queries.jsonl also holds the 809
training queries). ``--limit-docs`` builds a deterministic subset that still has complete
judgments for the queries it keeps, so subset scores are meaningful (see ``subset``).
"""

from __future__ import annotations

import csv
import hashlib
import json
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engram_memory.models.limits import QUERY_MAX_BYTES


@dataclass(frozen=True)
class Doc:
    doc_id: str
    title: str
    text: str


@dataclass
class Collection:
    name: str
    docs: list[Doc]  # corpus file order
    queries: dict[str, str]  # query id -> text, judged test queries only, file order
    qrels: dict[str, dict[str, int]]  # query id -> doc id -> grade (> 0 relevant)
    limit_docs: int | None = None
    source: Path | None = None
    warnings: list[str] = field(default_factory=list)  # one line each: kept, but worth saying
    _fingerprint: str | None = field(default=None, repr=False)

    @property
    def fingerprint(self) -> str:
        """SHA-256 over the selected documents' ids and text, in order.

        Keys the ingest cache: a changed corpus (an edited doc, another subset) gets another
        store, so a cached index can never be served for different documents.
        """
        if self._fingerprint is None:
            h = hashlib.sha256()
            for d in self.docs:
                h.update(json.dumps([d.doc_id, d.title, d.text], ensure_ascii=False).encode("utf-8"))
                h.update(b"\n")
            self._fingerprint = h.hexdigest()
        return self._fingerprint


LAYOUT = ('a BEIR collection is a folder with corpus.jsonl ({"_id", "title", "text"} a line), '
          'queries.jsonl ({"_id", "text"} a line) and qrels/test.tsv (query-id<TAB>corpus-id<TAB>score); '
          'a clone has one at eval/sample')
CORPUS, QUERIES, QRELS = "corpus.jsonl", "queries.jsonl", "qrels/test.tsv"
QRELS_HEADER = ["query-id", "corpus-id", "score"]


class CollectionError(ValueError):
    """A collection that cannot be scored: ``detail`` names the file (and line) and what is wrong.

    ``str()`` is one line, ``"<folder>: <detail>"``; the CLI prints ``--dataset <folder>: <detail>``.
    """

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


def _short(value: object, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def check_layout(path: Path | str, folders: bool = False) -> Path:
    """The folder exists and has the three BEIR files; says what is missing (one line) otherwise.

    A folder that holds collections in sub-folders (``data/scifact``, ``data/locomo/locomo-26``) is
    named as such, with the collections it holds: ``--dataset`` takes one collection (or, with
    ``folders``, a folder whose sub-folders are collections: ``eval`` takes those, see
    :func:`collection_folders`).
    """
    path = Path(path)
    if not path.exists():
        raise CollectionError(path, "does not exist")
    if not path.is_dir():
        raise CollectionError(path, f"is a file, not a folder ({LAYOUT})")
    missing = [name for name in (CORPUS, QUERIES, QRELS) if not (path / name).is_file()]
    if not missing:
        return path
    if len(missing) == 3:
        inside = sorted(str(p.relative_to(path)) for p in path.glob("*/") if (p / CORPUS).is_file())
        inside += sorted(str(p.relative_to(path)) for p in path.glob("*/*/") if (p / CORPUS).is_file())
        if inside:
            shown = ", ".join(inside[:6]) + (", ..." if len(inside) > 6 else "")
            if not folders:
                raise CollectionError(path, f"is a folder of {len(inside)} collections ({shown}), not a "
                                            f"collection: pass one of them, e.g. --dataset {path / inside[0]}")
            raise CollectionError(path, f"holds collections only in sub-sub-folders ({shown}): pass one of them, "
                                        f"or a folder whose sub-folders are collections, e.g. --dataset "
                                        f"{path / Path(inside[0]).parent}")
    listed = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " or " + missing[-1]
    raise CollectionError(path, f"not a BEIR collection: no {listed} ({LAYOUT})")


def collection_folders(path: Path | str) -> list[Path]:
    """The collections a folder of collections holds: its sub-folders with any BEIR file, by name.

    Empty when ``path`` is itself a collection (it has one of the three files) or holds none; a
    sub-folder with only some of the files is still listed, so loading it names what it lacks.
    Sub-folders with none of the files (and hidden ones) are not collections and are left out.
    """
    path = Path(path)
    if not path.is_dir() or any((path / name).exists() for name in (CORPUS, QUERIES, QRELS)):
        return []
    return sorted((p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")
                   and any((p / name).exists() for name in (CORPUS, QUERIES, QRELS))), key=lambda p: p.name)


def _jsonl(root: Path, name: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) per non-blank line; a line that is not a JSON object with an ``_id`` is refused."""
    with (root / name).open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise CollectionError(root, f"{name} line {lineno}: not UTF-8 ({exc.reason} at byte "
                                            f"{exc.start})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CollectionError(root, f"{name} line {lineno}: not valid JSON ({exc.msg}, column "
                                            f"{exc.colno})") from None
            if not isinstance(obj, dict):
                raise CollectionError(root, f"{name} line {lineno}: expected a JSON object, got "
                                            f"{type(obj).__name__}")
            if obj.get("_id") in (None, ""):
                raise CollectionError(root, f"{name} line {lineno}: no \"_id\"")
            if not isinstance(obj["_id"], str | int) or isinstance(obj["_id"], bool):
                raise CollectionError(root, f"{name} line {lineno}: \"_id\" must be a string, got "
                                            f"{_short(obj['_id'])}")
            yield lineno, obj


def _field(root: Path, name: str, lineno: int, obj: dict, key: str, required: bool) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        what = "no" if value is None else f"a {type(value).__name__} for"
        raise CollectionError(root, f"{name} line {lineno}: {what} \"{key}\" (needs a string)")
    return value


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """``query id -> doc id -> grade`` of a BEIR qrels file (header query-id, corpus-id, score)."""
    return _read_qrels(path)[0]


def _read_qrels(path: Path, root: Path | None = None) -> tuple[dict[str, dict[str, int]],
                                                               dict[tuple[str, str], int]]:
    """The judgments and the line of each (for messages)."""
    root = root or path.parent.parent
    name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    qrels: dict[str, dict[str, int]] = {}
    lines: dict[tuple[str, str], int] = {}
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        try:
            header = next(reader, None)
            if header is None:
                raise CollectionError(root, f"{name} is empty (needs the header query-id<TAB>corpus-id<TAB>score)")
            if [h.strip() for h in header[:3]] != QRELS_HEADER:
                raise CollectionError(root, f"{name} line 1: header {_short(chr(9).join(header), 60)}; expected "
                                            "query-id<TAB>corpus-id<TAB>score")
            for row in reader:
                lineno = reader.line_num
                if not row or not "".join(row).strip():
                    continue
                if len(row) < 3:
                    raise CollectionError(root, f"{name} line {lineno}: {len(row)} tab-separated field(s); expected "
                                                "query-id<TAB>corpus-id<TAB>score")
                qid, did, raw = row[0].strip(), row[1].strip(), row[2].strip()
                if not qid or not did:
                    raise CollectionError(root, f"{name} line {lineno}: empty query-id or corpus-id")
                try:
                    grade = int(raw)
                except ValueError:
                    raise CollectionError(root, f"{name} line {lineno}: score {_short(raw)} is not an "
                                                "integer") from None
                qrels.setdefault(qid, {})[did] = grade
                lines.setdefault((qid, did), lineno)
        except UnicodeDecodeError as exc:
            raise CollectionError(root, f"{name}: not UTF-8 ({exc.reason})") from None
        except csv.Error as exc:
            raise CollectionError(root, f"{name} line {reader.line_num}: {exc}") from None
    return qrels, lines


def load_collection(path: Path | str, limit_docs: int | None = None) -> Collection:
    """Read and check a BEIR collection; every problem is a one-line :class:`CollectionError`.

    Refused: a missing file, a line that is not JSON (with its line number), a duplicate id, a
    judged query without text, a judgment file that judges nothing relevant or whose relevant
    documents are all absent from the corpus. Judged documents absent from the corpus while
    others are present are kept (they count as unretrievable) and listed in ``warnings``.
    """
    path = check_layout(path)
    docs: list[Doc] = []
    seen: dict[str, int] = {}
    for lineno, d in _jsonl(path, CORPUS):
        doc_id = str(d["_id"])
        if doc_id in seen:
            raise CollectionError(path, f"{CORPUS} line {lineno}: duplicate _id {_short(doc_id)} (first on line "
                                        f"{seen[doc_id]})")
        seen[doc_id] = lineno
        docs.append(Doc(doc_id, _field(path, CORPUS, lineno, d, "title", False),
                        _field(path, CORPUS, lineno, d, "text", False)))
    if not docs:
        raise CollectionError(path, f"{CORPUS} holds no documents")
    qrels, qrel_lines = _read_qrels(path / QRELS, path)
    if not any(g > 0 for judged in qrels.values() for g in judged.values()):
        raise CollectionError(path, f"{QRELS} judges no document relevant (needs rows with score > 0)")
    queries: dict[str, str] = {}
    query_lines: dict[str, int] = {}
    for lineno, q in _jsonl(path, QUERIES):
        qid = str(q["_id"])
        if qid in query_lines:
            raise CollectionError(path, f"{QUERIES} line {lineno}: duplicate _id {_short(qid)} (first on line "
                                        f"{query_lines[qid]})")
        query_lines[qid] = lineno
        if qid in qrels:
            queries[qid] = _field(path, QUERIES, lineno, q, "text", True)
    missing = [q for q in qrels if q not in query_lines]
    if missing:
        first = min(qrel_lines[(missing[0], d)] for d in qrels[missing[0]])
        what = "1 query" if len(missing) == 1 else f"{len(missing)} queries"
        raise CollectionError(path, f"{QRELS} judges {what} that {QUERIES} does not have "
                                    f"(e.g. query-id {_short(missing[0])} on line {first})")
    relevant = {(qid, did) for qid, judged in qrels.items() for did, g in judged.items() if g > 0}
    absent = sorted((pair for pair in relevant if pair[1] not in seen), key=lambda pair: qrel_lines[pair])
    warnings: list[str] = []
    if absent:
        example = f"e.g. {_short(absent[0][1])} on line {qrel_lines[absent[0]]}"
        if len(absent) == len(relevant):
            raise CollectionError(path, f"{QRELS} references nothing in {CORPUS}: none of its {len(relevant)} "
                                        f"relevant corpus-ids is a document _id ({example})")
        warnings.append(f"{QRELS}: {len(absent)} of {len(relevant)} relevant judgments name documents {CORPUS} "
                        f"does not have ({example}); they count as never retrieved")
    col = Collection(path.name, docs, queries, {q: qrels[q] for q in queries}, source=path, warnings=warnings)
    if limit_docs is not None and limit_docs < len(docs):
        col = subset(col, limit_docs)
    return col


def subset(col: Collection, limit_docs: int) -> Collection:
    """A deterministic ``limit_docs`` subset with complete judgments for the queries it keeps.

    Walk the judged queries in file order and take a query's relevant docs whenever they all fit
    in half the budget; then fill the rest with unjudged docs in corpus order (distractors). Keep
    exactly the queries whose relevant docs are all in the subset, so no kept query is scored
    against judgments it cannot possibly satisfy. Corpus order is preserved.
    """
    if limit_docs < 1:
        raise ValueError("limit_docs must be >= 1")
    known = {d.doc_id for d in col.docs}
    chosen: set[str] = set()
    for qid in col.queries:
        rel = {d for d, g in col.qrels[qid].items() if g > 0 and d in known}
        if rel and len(chosen | rel) <= limit_docs // 2:
            chosen |= rel
    for d in col.docs:
        if len(chosen) >= limit_docs:
            break
        chosen.add(d.doc_id)
    docs = [d for d in col.docs if d.doc_id in chosen]
    kept: dict[str, dict[str, int]] = {}
    for qid in col.queries:
        rel = {d for d, g in col.qrels[qid].items() if g > 0}
        if rel and rel <= chosen:
            kept[qid] = {d: g for d, g in col.qrels[qid].items() if d in chosen}
    queries = {q: col.queries[q] for q in kept}
    return Collection(col.name, docs, queries, kept, limit_docs=limit_docs, source=col.source,
                      warnings=col.warnings)


def truncate_utf8(text: str, max_bytes: int = QUERY_MAX_BYTES) -> str:
    """NFC-normalise, then cut to at most ``max_bytes`` UTF-8 bytes on a character boundary.

    The engine measures the bound after NFC, and NFC can change a string's length, so cut
    the normalised form and re-check (normalising a cut string can, rarely, regrow it).
    """
    limit = max_bytes
    while True:
        text = unicodedata.normalize("NFC", text)
        raw = text.encode("utf-8")
        if len(raw) <= max_bytes:
            return text
        text = raw[:limit].decode("utf-8", errors="ignore")  # errors="ignore" drops a split character
        limit -= 1
