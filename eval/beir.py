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


def _jsonl(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        header = next(reader)
        if [h.strip() for h in header[:3]] != ["query-id", "corpus-id", "score"]:
            raise ValueError(f"{path}: unexpected qrels header {header!r}")
        for row in reader:
            if not row:
                continue
            qid, did, score = row[0].strip(), row[1].strip(), int(row[2])
            qrels.setdefault(qid, {})[did] = score
    return qrels


def load_collection(path: Path | str, limit_docs: int | None = None) -> Collection:
    path = Path(path)
    docs = [Doc(str(d["_id"]), d.get("title") or "", d.get("text") or "") for d in _jsonl(path / "corpus.jsonl")]
    qrels = read_qrels(path / "qrels" / "test.tsv")
    queries = {str(q["_id"]): q["text"] for q in _jsonl(path / "queries.jsonl") if str(q["_id"]) in qrels}
    missing = set(qrels) - set(queries)
    if missing:
        raise ValueError(f"{path}: {len(missing)} judged queries have no text")
    col = Collection(path.name, docs, queries, {q: qrels[q] for q in queries}, source=path)
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
    return Collection(col.name, docs, queries, kept, limit_docs=limit_docs, source=col.source)


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
