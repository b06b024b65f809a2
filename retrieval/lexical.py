"""Lexical channel: one Tantivy BM25 index per tenant/workspace scope directory.

Determinism and purge rules (see ENVIRONMENT_NOTES §3, LANDSCAPE §2.2/§4.1):

* One writer thread and documents added in ``record_id`` order, so builds are reproducible.
* Tantivy's BM25 statistics count deleted-but-unmerged documents, and tantivy-py 0.27 exposes
  no merge call. So any delete, or an upsert that changes an indexed document, *rewrites* the
  index: ``delete_all_documents`` plus the surviving documents (read back from the doc store)
  in one commit, then merge threads are drained and old files garbage-collected (repeated until
  only the segments named in meta.json are left on disk). The result is
  a single segment with no tombstones -- the same index a fresh build would produce -- and no
  file in the directory holds the removed text any more.
* Adds of new ids are plain commits; segment count does not change scores (global stats).
* Ties are broken in Python on ``record_id``; tantivy's own tie order follows doc addresses.
* Queries are built from the analyzer's tokens, never ``parse_query`` (which raises on user text).
* Each record is analysed for its language (``retrieval/languages.py``) into that language's own
  fields; a query is analysed for every language the index holds, each against its own fields.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any

import tantivy

from engram_memory.retrieval import languages
from engram_memory.retrieval._files import read_json, write_json

log = logging.getLogger(__name__)

FIELDS: tuple[str, ...] = ("primary", "decision", "evidence", "context", "citations")
ID_FIELD = "id"
# The query side: how a term repeated in the query weighs (query_term_weight). The rank receipt names
# the analyzers and the weighting together (ranking_name), so a receipt re-derives with the same scores.
QUERY_WEIGHTING = "qtf_sqrt"
TOKENIZER_NAME = languages.BY_CODE["en"].name  # English: the default analysis (an empty scope's)
RANKING_NAME = f"{TOKENIZER_NAME}+{QUERY_WEIGHTING}"
TOKENIZER_DESCRIPTION = languages.BY_CODE["en"].description()
STOPWORDS = languages.STOPWORDS_EN
# A record's language and its original fields (JSON), kept so the index can rewrite itself.
LANG_FIELD = "lang"
LANG_NO = "lang_no"
SOURCE_FIELD = "src"
INDEX_OPTION = "freq"  # BM25 needs term frequencies only; positions would just grow the index
SIDECAR = "engram_projection.json"
SIDECAR_FORMAT = 1
MAX_LIMIT = 2000
TANTIVY_VERSION = version("tantivy")
BM25 = {"k1": 1.2, "b": 0.75}  # fixed inside tantivy (src/query/bm25.rs)
GC_ATTEMPTS = 8
_SEGMENT_FILE = re.compile(r"[0-9a-f]{32}\.[a-z]+")  # tantivy segment files: <uuid hex>.<component>


class LexicalIndexError(RuntimeError):
    """The lexical projection cannot be opened or used (locked, incompatible, closed, engine panic)."""


@dataclass(frozen=True)
class LexicalConfig:
    """Per-field BM25 boosts and engine knobs. The defaults are the reference profile (§10.4)."""

    primary: float = 3.0
    decision: float = 2.0
    evidence: float = 1.5
    context: float = 1.0
    citations: float = 0.5
    max_query_terms: int = 1024  # bounds the query tree for 8 KB-of-text queries
    writer_heap_bytes: int = 32_000_000

    def __post_init__(self) -> None:
        weights = self.weights()
        if any(not (w >= 0.0 and w < float("inf")) for w in weights.values()):
            raise ValueError("field weights must be finite and >= 0")
        if not any(w > 0.0 for w in weights.values()):
            raise ValueError("at least one field weight must be > 0")
        if self.max_query_terms < 1:
            raise ValueError("max_query_terms must be >= 1")

    def weights(self) -> dict[str, float]:
        return {f: float(getattr(self, f)) for f in FIELDS}

    def describe(self) -> dict[str, Any]:
        """What a rank receipt needs to name this channel's scoring."""
        return {
            "engine": "tantivy",
            "engine_version": TANTIVY_VERSION,
            "tokenizer": TOKENIZER_NAME,
            "tokenizer_description": TOKENIZER_DESCRIPTION,
            **languages.describe(),
            "query_weighting": QUERY_WEIGHTING,
            "bm25": dict(BM25),
            "field_weights": self.weights(),
            "max_query_terms": self.max_query_terms,
        }


REFERENCE_PROFILE = LexicalConfig()


@dataclass(frozen=True)
class LexicalResult:
    """A lexical search: the ranked hits, each hit's analyzer, the languages the query was
    analysed for, and its coverage (the share of its terms found in the scope, see ``_coverage``)."""

    hits: list[tuple[str, float]]
    analyzers: dict[str, str]  # record id -> the analyzer name of its language
    languages: list[str]
    coverage: float

    @property
    def analyzer(self) -> str:
        """What the channel receipt names: the query's analyzers and its term weighting."""
        return "|".join(languages.BY_CODE[code].name for code in self.languages) + f"+{QUERY_WEIGHTING}"


@dataclass(frozen=True)
class LexicalDoc:
    """One accepted record as the lexical channel sees it; missing fields are empty.

    ``language`` is the analysis code of its text (``retrieval/languages.py``), identified from the
    fields when not given (a document read back from the index carries the one it was given)."""

    record_id: str
    fields: Mapping[str, str]
    language: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.record_id, str) or not self.record_id:
            raise ValueError("record_id must be a non-empty string")
        unknown = set(self.fields) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown lexical fields: {sorted(unknown)}")
        normalised: dict[str, str] = {}
        for name in FIELDS:
            value = self.fields.get(name, "")
            if not isinstance(value, str):
                raise TypeError(f"field {name!r} must be a string")
            value.encode("utf-8")  # lone surrogates cannot cross into Rust: refuse them here
            normalised[name] = value
        self.record_id.encode("utf-8")
        object.__setattr__(self, "fields", MappingProxyType(normalised))
        if not self.language:
            object.__setattr__(self, "language", languages.identify("\n".join(v for v in normalised.values() if v)))
        elif self.language not in languages.BY_CODE:
            raise ValueError(f"unknown language {self.language!r}")


def build_analyzer(code: str = "en") -> tantivy.TextAnalyzer:
    """The index and query analyzer of one language (English: ``en_stem`` plus NLTK's stop words)."""
    return languages.BY_CODE[code].build()


_ANALYZERS: dict[str, tantivy.TextAnalyzer] = {}


def _analyzer(code: str) -> tantivy.TextAnalyzer:
    found = _ANALYZERS.get(code)
    if found is None:
        found = _ANALYZERS[code] = build_analyzer(code)
    return found


def field_name(name: str, code: str) -> str:
    """The indexed field holding ``name`` of a record in language ``code``."""
    return f"{name}_{code}"


def query_term_counts(text: str, max_terms: int = REFERENCE_PROFILE.max_query_terms,
                      code: str = "en") -> dict[str, int]:
    """Tokens of ``text`` analysed for language ``code`` -> times each occurs (first ``max_terms``
    distinct by appearance), sorted."""
    if not isinstance(text, str):
        raise TypeError("query must be a string")
    safe = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates -> '?', dropped
    seen: dict[str, int] = {}
    for token in _analyzer(code).analyze(languages.segment(safe)):
        if token in seen:
            seen[token] += 1
        elif len(seen) < max_terms:
            seen[token] = 1
    return dict(sorted(seen.items()))


def query_terms(text: str, max_terms: int = REFERENCE_PROFILE.max_query_terms, code: str = "en") -> list[str]:
    """Distinct tokens of ``text`` analysed for language ``code`` (first ``max_terms`` by appearance), sorted."""
    return list(query_term_counts(text, max_terms, code))


def query_term_weight(count: int) -> float:
    """A query term's boost from the times it occurs in the query: sqrt(count).

    A long, paragraph-like query restates its topic and wraps it in instructions; weighing every
    distinct term once lets the instruction words count as much as the topic. bm25s counts every
    repeat (weight = count), which over-weighs repeats in short queries (medline -0.021). The square
    root sits between: studies/lexical-long-queries.md.
    """
    return math.sqrt(count)


# A record id ("mem_" + base32 of a 32-byte digest) is also kept as four u64 fast-field words,
# so a search reads the ids of its hits column-wise instead of fetching every stored document
# (measured at 10k records: ~8 us a stored fetch, ~10 of the channel's ~12 ms at depth 1000).
ID_WORDS = tuple(f"id_w{i}" for i in range(4))
_RECORD_ID = re.compile(r"^mem_[a-z2-7]{52}$")
ID_CACHE_MAX = 1 << 18  # ids remembered per index (~40 MB at the cap; cleared past it)


def id_words(record_id: str) -> tuple[int, int, int, int] | None:
    """The four words of a record id, or None for an id of another shape (stored fetch then)."""
    if not _RECORD_ID.match(record_id):
        return None
    raw = base64.b32decode(record_id[4:].upper() + "====")
    return struct.unpack(">4Q", raw)


def id_from_words(words: Sequence[int]) -> str:
    return "mem_" + base64.b32encode(struct.pack(">4Q", *words)).decode("ascii").rstrip("=").lower()


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field(ID_FIELD, stored=True, tokenizer_name="raw", index_option="basic")
    for word in ID_WORDS:
        sb.add_unsigned_field(word, fast=True)
    sb.add_text_field(LANG_FIELD, stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_unsigned_field(LANG_NO, fast=True)
    # The original fields, stored: the index must be able to rewrite itself without the store (see
    # module doc). The analysed fields (one set per language) are indexed only.
    sb.add_bytes_field(SOURCE_FIELD, stored=True, indexed=False, fast=False)
    for analysis in languages.ANALYSES:
        for name in FIELDS:
            sb.add_text_field(field_name(name, analysis.code), stored=False, tokenizer_name=analysis.name,
                              index_option=INDEX_OPTION)
    return sb.build()


def _is_panic(exc: BaseException) -> bool:
    # pyo3's PanicException derives from BaseException; only that one is translated.
    return type(exc).__name__ == "PanicException"


class LexicalIndex:
    """BM25 over one scope directory. Thread-safe; one instance (one writer) per directory."""

    def __init__(self, path: Path, index: tantivy.Index, config: LexicalConfig) -> None:
        self._path = path
        self._index = index
        self._config = config
        self._lock = threading.RLock()
        self._ids_by_words: dict[tuple[int, ...], str] = {}  # words -> id, a pure function's memo
        self._closed = False
        self._writer: tantivy.IndexWriter | None = self._new_writer()
        self._cursor = self._read_cursor()
        self._index.reload()
        # No merge runs before the first commit: a segment file meta.json does not name is a
        # leftover (a crash mid-merge, a purge that could not finish) and may hold removed text.
        self._remove_stale_segments()

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path, config: LexicalConfig = REFERENCE_PROFILE) -> LexicalIndex:
        """Open the index in ``path``, creating it if missing."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        try:
            index = tantivy.Index(_schema(), path=str(path), reuse=True)
        except ValueError as exc:
            raise LexicalIndexError("directory holds an incompatible lexical index") from exc
        for analysis in languages.ANALYSES:
            index.register_tokenizer(analysis.name, analysis.build())
        index.config_reader(reload_policy="Manual")  # we reload after each commit; no async surprises
        return cls(path, index, config)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            writer, self._writer = self._writer, None
            if writer is not None:
                try:
                    writer.wait_merging_threads()  # consumes the writer and releases the lock file
                except Exception:
                    log.exception("lexical merge threads failed while closing %s", self._path)

    def __enter__(self) -> LexicalIndex:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def config(self) -> LexicalConfig:
        return self._config

    # -- journal cursor ----------------------------------------------------------------------

    @property
    def cursor(self) -> str | None:
        """The journal cursor this projection reflects (set by the store); None = nothing applied."""
        return self._cursor

    def set_cursor(self, cursor: str) -> None:
        if not isinstance(cursor, str):
            raise TypeError("cursor must be a string")
        with self._lock:
            self._live_writer()
            self._write_cursor(cursor)

    # -- writes ------------------------------------------------------------------------------

    def upsert(self, docs: Sequence[LexicalDoc]) -> None:
        """Insert or replace documents (the last one wins for a repeated id).

        New ids are added in one commit. Replacing a document whose text changed rewrites
        the index so the old text and its statistics disappear; unchanged ones are skipped.
        """
        batch = {d.record_id: d for d in docs}
        if not batch:
            return
        with self._lock:
            self._live_writer()
            searcher = self._index.searcher()
            existing = [rid for rid in batch if searcher.doc_freq(ID_FIELD, rid) > 0]
            if existing:
                current = self._stored(searcher, existing)
                for rid in existing:
                    if current.get(rid) == batch[rid]:
                        del batch[rid]
                if not batch:
                    return
                if any(rid in current for rid in batch):
                    live = self._stored(searcher)
                    live.update(batch)
                    self._rewrite(live)
                    return
            self._guarded(lambda w: [w.add_document(_to_document(batch[rid])) for rid in sorted(batch)])

    def delete(self, record_ids: Sequence[str]) -> None:
        """Remove documents and physically purge them (rewrite + merge drain + GC)."""
        if isinstance(record_ids, str):
            raise TypeError("delete takes a sequence of record ids, not a string")
        with self._lock:
            self._live_writer()
            searcher = self._index.searcher()
            doomed = {rid for rid in record_ids if searcher.doc_freq(ID_FIELD, rid) > 0}
            if not doomed:
                return
            live = self._stored(searcher)
            for rid in doomed:
                live.pop(rid, None)
            self._rewrite(live)

    def rebuild(self, docs: Iterable[LexicalDoc]) -> None:
        """Replace the whole content with ``docs`` in one commit (the canonical build)."""
        with self._lock:
            self._live_writer()
            self._rewrite({d.record_id: d for d in docs})

    def clear(self) -> None:
        """Drop every document and forget the cursor."""
        with self._lock:
            self._live_writer()
            self._rewrite({})
            self._write_cursor(None)

    # -- reads -------------------------------------------------------------------------------

    def count(self) -> int:
        with self._lock:
            self._live_writer()
            return int(self._index.searcher().num_docs)

    def contains(self, record_id: str) -> bool:
        with self._lock:
            self._live_writer()
            return self._index.searcher().doc_freq(ID_FIELD, record_id) > 0

    def describe(self) -> dict[str, Any]:
        """Engine, scoring profile, size and cursor: what a rank receipt names for this channel."""
        return {**self._config.describe(), "count": self.count(), "cursor": self._cursor}

    def query_terms(self, text: str) -> list[str]:
        return query_terms(text, self._config.max_query_terms)

    def languages(self) -> list[str]:
        """The analysis codes of the languages the index holds records in, in ``ANALYSES`` order."""
        with self._lock:
            self._live_writer()
            return self._languages(self._index.searcher())

    def search(self, query: str, limit: int) -> list[tuple[str, float]]:
        """Top ``limit`` (clamped to [1, 2000]) hits as ``(record_id, bm25)``, by (-score, record_id)."""
        return self.search_analyzed(query, limit).hits

    def search_analyzed(self, query: str, limit: int) -> LexicalResult:
        """``search`` with what the receipt names: each hit's analysis and the query's coverage.

        The query is analysed for every language the scope holds records in, and each language's
        terms are looked up in that language's fields only. The score is
        Σ_languages Σ_terms Σ_fields weight_f · BM25_f(term), each field with its own statistics.
        Ties at the cut are resolved on ``record_id``: we keep fetching until the hit after the
        cut scores strictly lower, so the answer never depends on tantivy's doc addresses.
        """
        limit = max(1, min(int(limit), MAX_LIMIT))
        with self._lock:
            self._live_writer()
            searcher = self._index.searcher()
            present = self._languages(searcher)
            codes = present or [languages.DEFAULT_LANGUAGE]
            terms = {code: query_term_counts(query, self._config.max_query_terms, code) for code in codes}
            terms = {code: found for code, found in terms.items() if found}
            total = int(searcher.num_docs)
            if not terms or total == 0:
                return LexicalResult([], {}, codes, 0.0)
            coverage = self._coverage(searcher, terms)
            q = self._build_query(terms)
            fetch = min(limit + 1, total)
            while True:
                hits = self._search(searcher, q, fetch)
                if len(hits) < fetch or fetch >= total or hits[limit - 1][0] > hits[-1][0]:
                    break
                fetch = min(fetch * 2, total)
            if len(hits) > limit:  # below the cut's score nothing can rank: no id to spell for it
                cut = hits[limit - 1][0]
                hits = [hit for hit in hits if hit[0] >= cut]
            addrs = [addr for _score, addr in hits]
            ids = self._hit_ids(searcher, addrs)
            numbers = searcher.fast_field_values(LANG_NO, addrs) if addrs else []
            ranked = sorted(
                ((rid, float(score)) for rid, (score, _addr) in zip(ids, hits, strict=True)),
                key=lambda hit: (-hit[1], hit[0]),
            )[:limit]
            names = {rid: languages.ANALYSES[int(no or 0)].name for rid, no in zip(ids, numbers, strict=True)}
            return LexicalResult(ranked, {rid: names[rid] for rid, _ in ranked}, codes, coverage)

    @staticmethod
    def _languages(searcher: tantivy.Searcher) -> list[str]:
        return [a.code for a in languages.ANALYSES if searcher.doc_freq(LANG_FIELD, a.code) > 0]

    def _coverage(self, searcher: tantivy.Searcher, terms: Mapping[str, Mapping[str, int]]) -> float:
        """The largest share, over the scope's languages, of the query's terms (analysed for that
        language) that some record of it holds: 1.0 when every query word is found, 0.0 when none."""
        fields = [name for name, weight in self._config.weights().items() if weight > 0.0]
        best = 0.0
        for code, counts in terms.items():
            found = sum(1 for term in counts
                        if any(searcher.doc_freq(field_name(f, code), term) > 0 for f in fields))
            best = max(best, found / len(counts))
        return best

    def _hit_ids(self, searcher: tantivy.Searcher, addrs: list[Any]) -> list[str]:
        columns = [searcher.fast_field_values(word, addrs) for word in ID_WORDS]
        known = self._ids_by_words  # base32 in Python costs ~15 us an id: spell each one once
        out = []
        for addr, words in zip(addrs, zip(*columns, strict=True), strict=True):
            rid = known.get(words)
            if rid is None:
                if None in words:  # an id of another shape: read the stored document
                    rid = searcher.doc(addr)[ID_FIELD][0]
                else:
                    if len(known) >= ID_CACHE_MAX:
                        known.clear()
                    rid = known[words] = id_from_words(words)
            out.append(rid)
        return out

    # -- internals ---------------------------------------------------------------------------

    def _new_writer(self) -> tantivy.IndexWriter:
        try:
            return self._index.writer(self._config.writer_heap_bytes, 1)  # 1 thread: reproducible
        except ValueError as exc:
            raise LexicalIndexError("lexical index is locked by another writer") from exc

    def _live_writer(self) -> tantivy.IndexWriter:
        if self._closed or self._writer is None:
            raise LexicalIndexError("lexical index is closed")
        return self._writer

    def _build_query(self, terms: Mapping[str, Mapping[str, int]]) -> tantivy.Query:
        schema = self._index.schema
        clauses = [
            (
                tantivy.Occur.Should,
                tantivy.Query.boost_query(
                    tantivy.Query.term_query(schema, field_name(name, code), term, index_option=INDEX_OPTION),
                    weight * query_term_weight(count),
                ),
            )
            for code, counts in terms.items()
            for name, weight in self._config.weights().items()
            if weight > 0.0
            for term, count in counts.items()
        ]
        return tantivy.Query.boolean_query(clauses)

    @staticmethod
    def _search(searcher: tantivy.Searcher, q: tantivy.Query, limit: int) -> list[tuple[float, Any]]:
        try:
            return list(searcher.search(q, limit=limit, count=False).hits)
        except BaseException as exc:
            if _is_panic(exc):
                raise LexicalIndexError("tantivy search panicked") from exc
            raise

    def _stored(self, searcher: tantivy.Searcher, ids: Sequence[str] | None = None) -> dict[str, LexicalDoc]:
        """Read documents back from tantivy's doc store (all of them, or the given ids)."""
        if ids is None:
            q = tantivy.Query.all_query()
            n = int(searcher.num_docs)
        else:
            q = tantivy.Query.term_set_query(self._index.schema, ID_FIELD, list(ids))
            n = len(ids)
        if n == 0:
            return {}
        out: dict[str, LexicalDoc] = {}
        for _score, addr in self._search(searcher, q, n):
            stored = searcher.doc(addr).to_dict()
            rid = stored[ID_FIELD][0]
            out[rid] = LexicalDoc(rid, json.loads(bytes(stored[SOURCE_FIELD][0]).decode("utf-8")),
                                  stored[LANG_FIELD][0])
        return out

    def _rewrite(self, docs: Mapping[str, LexicalDoc]) -> None:
        def write(w: tantivy.IndexWriter) -> None:
            w.delete_all_documents()
            for rid in sorted(docs):
                w.add_document(_to_document(docs[rid]))

        self._guarded(write)
        # A merge running in the background may still write files that contain removed text:
        # drain the merge threads (this consumes the writer), then collect every unused file.
        writer, self._writer = self._writer, None
        assert writer is not None
        writer.wait_merging_threads()
        self._writer = self._new_writer()
        self._collect_garbage()

    def _collect_garbage(self) -> None:
        # Observed: the first GC after draining can keep the output of a merge that was discarded
        # by the rewrite (about 1 run in 3); a second pass removes it. Retry a few times, then
        # unlink what is left ourselves (the merge threads are drained: no segment file outside
        # meta.json is in use, and tantivy only collects the files it created), and fail loudly
        # rather than claim a purge when a file still cannot be removed.
        assert self._writer is not None
        for attempt in range(GC_ATTEMPTS):
            self._writer.garbage_collect_files()
            if not self._stale_segment_files():
                return
            time.sleep(0.005 * attempt)
        if self._remove_stale_segments():
            raise LexicalIndexError("old segment files survived garbage collection")

    def _remove_stale_segments(self) -> list[str]:
        """Unlink segment files meta.json does not name; returns those that could not be removed."""
        left = []
        for name in self._stale_segment_files():
            try:
                (self._path / name).unlink(missing_ok=True)
            except OSError:
                log.warning("stale segment file %s in %s cannot be removed", name, self._path)
                left.append(name)
        return left

    def _stale_segment_files(self) -> list[str]:
        meta = read_json(self._path / "meta.json")
        live = {segment["segment_id"].replace("-", "") for segment in meta.get("segments", [])}
        return sorted(
            p.name for p in self._path.iterdir() if _SEGMENT_FILE.fullmatch(p.name) and p.name[:32] not in live
        )

    def _guarded(self, write: Any) -> None:
        """Run ``write(writer)`` and commit; on any failure roll the uncommitted work back."""
        writer = self._live_writer()
        try:
            write(writer)
            writer.commit()
        except BaseException as exc:
            try:
                writer.rollback()
            except BaseException:  # a panicked writer cannot roll back; the commit never happened
                log.exception("lexical writer rollback failed in %s", self._path)
            if _is_panic(exc):
                raise LexicalIndexError("tantivy writer panicked") from exc
            raise
        self._index.reload()

    def _read_cursor(self) -> str | None:
        return read_cursor(self._path)

    def _write_cursor(self, cursor: str | None) -> None:
        write_json(self._path / SIDECAR, {"format": SIDECAR_FORMAT, "cursor": cursor})
        self._cursor = cursor


def read_cursor(path: Path) -> str | None:
    """The journal cursor the lexical index in ``path`` reflects, read from its sidecar file alone
    (the index need not be open); None: nothing applied, or unknown."""
    sidecar = path / SIDECAR
    if not sidecar.exists():
        return None
    try:
        data = read_json(sidecar)
        cursor = data["cursor"]
        if data.get("format") != SIDECAR_FORMAT or not (cursor is None or isinstance(cursor, str)):
            raise ValueError("unexpected sidecar content")
        return cursor
    except (OSError, ValueError, KeyError, TypeError):
        # An unreadable cursor means "unknown": the store replays from the start.
        log.warning("lexical projection sidecar unreadable in %s; cursor reset", path)
        return None


def _to_document(doc: LexicalDoc) -> tantivy.Document:
    values = {field_name(name, doc.language): languages.segment(text) for name, text in doc.fields.items() if text}
    document = tantivy.Document(**{ID_FIELD: doc.record_id, LANG_FIELD: doc.language}, **values)
    document.add_unsigned(LANG_NO, languages.LANGUAGE_NO[doc.language])
    document.add_bytes(SOURCE_FIELD, json.dumps(dict(doc.fields), ensure_ascii=False,
                                                separators=(",", ":")).encode("utf-8"))
    words = id_words(doc.record_id)
    if words is not None:
        for name, word in zip(ID_WORDS, words, strict=True):
            document.add_unsigned(name, word)  # explicit u64: a keyword int above 2**63 turns f64
    return document
