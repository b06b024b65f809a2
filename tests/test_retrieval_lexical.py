"""retrieval.lexical: BM25 over one scope directory -- robustness, ties, purge, determinism."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import tantivy

from engram_memory.retrieval.lexical import (
    FIELDS,
    MAX_LIMIT,
    REFERENCE_PROFILE,
    SIDECAR,
    LexicalConfig,
    LexicalDoc,
    LexicalIndex,
    LexicalIndexError,
    query_term_counts,
    query_terms,
)
from tests.retrieval_fixtures import files_containing

MARKER = "zqxmarkerrunning"  # unique; stems to "zqxmarkerrun"
MARKER_STEM = "zqxmarkerrun"


def doc(rid: str, **fields: str) -> LexicalDoc:
    return LexicalDoc(rid, fields)


@pytest.fixture
def index(tmp_path: Path):
    ix = LexicalIndex.open(tmp_path / "lex")
    yield ix
    ix.close()


def corpus(n: int, seed: int) -> list[LexicalDoc]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(120)] + ["running", "runs", "cat", "cats", "decision", "tantivy"]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    docs = []
    for i in range(n):
        fields = {f: " ".join(rng.choices(vocab, weights, k=rng.randint(0, 12))) for f in FIELDS}
        docs.append(LexicalDoc(f"mem_{i:05d}", fields))
    return docs


QUERIES = ["w1", "w2 w3", "cat running", "w0 w5 w9 w50", "decision tantivy w7", "runs", "w119 w118"]


def test_fields_are_weighted_and_stemmed(index: LexicalIndex) -> None:
    index.upsert([doc("ctx", context="the cat is running"), doc("pri", primary="cats run")])
    hits = index.search("CAT runs", 10)
    assert [rid for rid, _ in hits] == ["pri", "ctx"]  # primary 3.0 beats context 1.0
    assert all(type(score) is float and score > 0 for _, score in hits)
    assert index.count() == 2 and index.contains("pri") and not index.contains("nope")


def test_weights_are_configurable(tmp_path: Path) -> None:
    cfg = LexicalConfig(primary=0.5, context=10.0)
    with LexicalIndex.open(tmp_path / "lex", cfg) as ix:
        ix.upsert([doc("ctx", context="cat"), doc("pri", primary="cat")])
        assert [rid for rid, _ in ix.search("cat", 5)] == ["ctx", "pri"]
    assert REFERENCE_PROFILE.weights() == {
        "primary": 3.0, "decision": 2.0, "evidence": 1.5, "context": 1.0, "citations": 0.5,
    }
    assert REFERENCE_PROFILE.describe()["bm25"] == {"k1": 1.2, "b": 0.75}
    with LexicalIndex.open(tmp_path / "ref") as ix:
        info = ix.describe()
        assert info["engine"] == "tantivy" and info["count"] == 0 and info["cursor"] is None
    with pytest.raises(ValueError):
        LexicalConfig(primary=0, decision=0, evidence=0, context=0, citations=0)
    with pytest.raises(ValueError):
        LexicalConfig(primary=float("nan"))


HOSTILE = [
    "AND", "OR NOT", '"', '"unterminated', ")", "foo)", "(((", "*", "?", "~", "^2", ":", "field:value",
    "-", "+", "\\", "/", "!", "&&", "||", "the of a an", "", "   ", "\x00", "\ud800 lone surrogate",
    "😀🎉", "中文检索测试", "日本語", "Ünïcödé ćäfé", "x" * 8192, "cat " * 2048, " ".join(f"t{i}" for i in range(3000)),
]


@pytest.mark.parametrize("query", HOSTILE, ids=range(len(HOSTILE)))
def test_search_never_crashes_on_user_text(index: LexicalIndex, query: str) -> None:
    index.upsert([doc("a", primary="the cat of the house"), doc("b", context="中文检索测试 and more", decision="foo")])
    hits = index.search(query, 10)
    assert isinstance(hits, list) and len(hits) <= 10


def test_token_edge_cases(index: LexicalIndex) -> None:
    index.upsert([doc("cjk", primary="中文检索测试"), doc("en", primary="the cat")])
    assert [rid for rid, _ in index.search("中文检索测试", 5)] == ["cjk"]
    assert index.search("😀", 5) == [] and index.search("", 5) == [] and index.search("!!!", 5) == []
    # English stop words are dropped from documents and queries alike (studies/lexical-study.md)
    assert index.search("THE", 5) == [] and query_terms("What did you do when the cat ran?") == ["cat", "ran"]
    assert [rid for rid, _ in index.search("the CATS", 5)] == ["en"]
    assert query_terms("Running runs RUN") == ["run"]  # deduplicated, stemmed, sorted
    assert len(query_terms(" ".join(f"t{i}" for i in range(5000)))) == REFERENCE_PROFILE.max_query_terms


def test_a_repeated_query_term_weighs_the_square_root_of_its_count(index: LexicalIndex) -> None:
    assert query_term_counts("backup the backups, then BACKUP again") == {"backup": 3}
    index.upsert([doc("a", context="backup tape"), doc("b", context="restore tape")])
    once = dict(index.search("backup tape", 5))
    thrice = dict(index.search("backup backup backup tape", 5))
    # only the repeated term's contribution grows, by sqrt(3): b (tape only) keeps its score
    assert thrice["b"] == pytest.approx(once["b"])
    backup_once = once["a"] - once["b"]
    assert thrice["a"] - thrice["b"] == pytest.approx(backup_once * 3 ** 0.5, rel=1e-4)
    # the max_query_terms cap counts distinct terms; repeats of a kept term still count
    assert query_term_counts("a1 b2 a1 c3 a1", 2) == {"a1": 3, "b2": 1}


def test_limit_is_clamped(index: LexicalIndex) -> None:
    index.upsert([doc(f"d{i:04d}", primary="identical words") for i in range(2100)])
    assert len(index.search("identical", 0)) == 1
    assert len(index.search("identical", -5)) == 1
    assert len(index.search("identical", 10**9)) == MAX_LIMIT


def test_ties_break_on_record_id_at_the_cut(tmp_path: Path) -> None:
    ids = [f"r{i:03d}" for i in range(12)]
    shuffled = ids[:]
    random.Random(3).shuffle(shuffled)
    results = []
    for name, order in (("a", ids), ("b", shuffled), ("c", list(reversed(ids)))):
        with LexicalIndex.open(tmp_path / name) as ix:
            for rid in order:  # one commit per doc: doc addresses differ between builds
                ix.upsert([doc(rid, primary="identical text")])
            ix.upsert([doc("zz-better", primary="identical text identical")])
            # below the tie: fetched when the cut is widened, never ranked above it
            ix.upsert([doc(f"a-lower{i}", primary="identical text and a longer tail of words") for i in range(6)])
            results.append(ix.search("identical", 5))
    assert results[0] == results[1] == results[2]
    assert [rid for rid, _ in results[0]] == ["zz-better", "r000", "r001", "r002", "r003"]


@pytest.mark.parametrize("trial", range(4))  # a merge racing the rewrite left files ~1 run in 3
def test_delete_physically_purges_text_and_terms(tmp_path: Path, trial: int) -> None:
    path = tmp_path / "lex"
    ix = LexicalIndex.open(path)
    for i in range(20):  # many commits -> many segments and background merges
        ix.upsert([doc(f"keep{i:02d}", primary=f"ordinary text number w{i}", context="shared words")])
    ix.upsert([doc("secret", primary=f"a {MARKER} note", evidence=f"{MARKER} again", citations=MARKER)])
    ix.upsert([doc("keep99", primary="more ordinary text")])
    before_segments = {p.name for p in path.iterdir() if not p.name.startswith(".") and p.suffix != ".json"}
    assert files_containing(path, [MARKER.encode()])  # positive control: the needle is findable
    assert _terms_on_disk(path, "zqx")  # ... and so are its terms

    ix.delete(["secret"])

    assert not ix.contains("secret") and ix.count() == 21
    assert files_containing(path, [MARKER.encode(), MARKER_STEM.encode()]) == {}
    assert _terms_on_disk(path, "zqx") == {}
    after_segments = {p.name for p in path.iterdir() if not p.name.startswith(".") and p.suffix != ".json"}
    assert before_segments.isdisjoint(after_segments)  # every file that held the doc is gone
    assert len({name.split(".")[0] for name in after_segments}) == 1  # one merged segment
    assert ix.search(MARKER, 5) == []
    assert [rid for rid, _ in ix.search("w7", 5)] == ["keep07"]
    ix.delete(["secret", "never-existed"])  # idempotent
    with pytest.raises(TypeError):
        ix.delete("keep01")
    ix.close()


def test_replacing_a_document_purges_its_old_text(tmp_path: Path) -> None:
    path = tmp_path / "lex"
    with LexicalIndex.open(path) as ix:
        ix.upsert([doc("r1", primary=f"old {MARKER}"), doc("r2", primary="bystander")])
        ix.upsert([doc("r1", primary="new text")])
        assert files_containing(path, [MARKER.encode(), MARKER_STEM.encode()]) == {}
        assert _terms_on_disk(path, "zqx") == {}
        assert [rid for rid, _ in ix.search("new", 5)] == ["r1"]


def test_unchanged_upsert_is_a_no_op(index: LexicalIndex) -> None:
    index.upsert([doc("r1", primary="alpha"), doc("r2", primary="beta")])
    files = sorted(p.name for p in index.path.iterdir())
    index.upsert([doc("r1", primary="alpha")])  # a journal replay must not rewrite the index
    assert sorted(p.name for p in index.path.iterdir()) == files


def test_incremental_equals_rebuilt_ranking_and_scores(tmp_path: Path) -> None:
    docs = corpus(160, seed=11)
    rng = random.Random(5)
    live: dict[str, LexicalDoc] = {}
    inc = LexicalIndex.open(tmp_path / "incremental")
    order = docs[:]
    rng.shuffle(order)
    for start in range(0, len(order), 8):  # many small commits
        batch = order[start : start + 7]
        inc.upsert(batch)
        live.update({d.record_id: d for d in batch})
        if start % 40 == 0:  # interleave deletes and in-place updates
            doomed = rng.sample(sorted(live), 3)
            inc.delete(doomed)
            for rid in doomed:
                del live[rid]
            rid = rng.choice(sorted(live))
            changed = LexicalDoc(rid, {"primary": "cat running decision", "context": live[rid].fields["context"]})
            inc.upsert([changed])
            live[rid] = changed
    extra = corpus(170, seed=12)[160:]  # a tail of pure adds: several segments, no rewrite
    for d in extra:
        inc.upsert([d])
        live[d.record_id] = d

    with LexicalIndex.open(tmp_path / "rebuilt") as fresh:
        fresh.rebuild(live.values())
        assert inc.count() == fresh.count() == len(live)
        for q in QUERIES:
            for limit in (1, 5, 50, 2000):
                got, want = inc.search(q, limit), fresh.search(q, limit)
                assert got == want, (q, limit)  # same ids, same order, bit-identical float scores
                assert got == sorted(got, key=lambda h: (-h[1], h[0]))
    inc.close()


def test_bm25_statistics_exclude_deleted_documents(tmp_path: Path) -> None:
    with LexicalIndex.open(tmp_path / "a") as a, LexicalIndex.open(tmp_path / "b") as b:
        a.upsert([doc("x", primary="cat"), doc("y", primary="cat dog"), doc("z", primary="cat cat")])
        a.delete(["z"])
        b.upsert([doc("x", primary="cat"), doc("y", primary="cat dog")])
        assert a.search("cat dog", 10) == b.search("cat dog", 10)


def test_cursor_sidecar_survives_reopen_and_gc(tmp_path: Path) -> None:
    path = tmp_path / "lex"
    with LexicalIndex.open(path) as ix:
        assert ix.cursor is None
        ix.set_cursor("42")
        ix.upsert([doc("a", primary="one")])
        ix.delete(["a"])  # rewrite + garbage collection must leave our sidecar alone
        assert (path / SIDECAR).exists()
    with LexicalIndex.open(path) as ix:
        assert ix.cursor == "42" and ix.count() == 0
        ix.upsert([doc("b", primary="two")])
        ix.clear()
        assert ix.cursor is None and ix.count() == 0 and ix.search("two", 5) == []
    (path / SIDECAR).write_text("{not json")
    with LexicalIndex.open(path) as ix:
        assert ix.cursor is None  # unreadable cursor = unknown: the store replays


def test_one_writer_per_directory_and_closed_index(tmp_path: Path) -> None:
    ix = LexicalIndex.open(tmp_path / "lex")
    with pytest.raises(LexicalIndexError):
        LexicalIndex.open(tmp_path / "lex")
    ix.close()
    ix.close()  # idempotent
    with pytest.raises(LexicalIndexError):
        ix.search("x", 1)
    with LexicalIndex.open(tmp_path / "lex") as again:  # the lock is released on close
        assert again.count() == 0


def test_document_validation() -> None:
    with pytest.raises(ValueError):
        LexicalDoc("r", {"title": "unknown field"})
    with pytest.raises(ValueError):
        LexicalDoc("", {"primary": "x"})
    with pytest.raises(TypeError):
        LexicalDoc("r", {"primary": 3})  # type: ignore[dict-item]
    with pytest.raises(UnicodeEncodeError):
        LexicalDoc("r", {"primary": "\ud800"})
    d = LexicalDoc("r", {"primary": "x"})
    assert dict(d.fields) == {"primary": "x", "decision": "", "evidence": "", "context": "", "citations": ""}
    assert d == LexicalDoc("r", {"primary": "x", "context": ""})


def _terms_on_disk(path: Path, prefix: str) -> dict[str, list]:
    """Read the term dictionaries through a fresh reader of the files now in ``path``."""
    from engram_memory.retrieval.languages import ANALYSES
    from engram_memory.retrieval.lexical import field_name

    index = tantivy.Index.open(str(path))
    for analysis in ANALYSES:
        index.register_tokenizer(analysis.name, analysis.build())
    searcher = index.searcher()
    found = {}
    for analysis in ANALYSES:  # every language's fields
        for name in FIELDS:
            terms = searcher.terms_with_prefix(field_name(name, analysis.code), prefix)
            if terms:
                found[field_name(name, analysis.code)] = terms
    return found
