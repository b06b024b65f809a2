"""Engine-level search and get over real DuckDB + Tantivy, lexical channel only (no model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.errors import EngramError
from engram_memory.models.outputs import validate_output
from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from engram_memory.store.maintenance.rebuild import rebuild_index
from tests.retrieval_fixtures import disk_files
from tests.store_fixtures import PURPOSE, RERANK, T0, admission_args, call, capture_args, ctx, forget_args

DOCS = [
    "We adopted DuckDB as the single source of truth for lifecycle state.",
    "Tantivy provides the BM25 lexical channel; ties break on record id.",
    "The billing service retries webhooks three times with exponential backoff.",
    "Deploys to staging happen every weekday at noon after the test suite passes.",
    "Our convention: every ADR cites the incident that motivated it.",
]


def open_engine(path: Path, **kw) -> Engine:
    return Engine.open(EngineSettings(data_dir=path, semantic=False, **kw), clock=lambda: T0)


def admit(engine: Engine, text: str, n: int, c=None, **extra) -> str:
    c = c or ctx()
    cap = call(engine, "capture", c, capture_args(text, key=f"capture-key-{n:06d}", **extra))
    validate_output("capture", cap)
    out = call(engine, "request_admission", c, admission_args(cap["candidate_id"], key=f"admit-key-{n:08d}"))
    validate_output("request_admission", out)
    return out["outcome"]["record_id"]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = open_engine(tmp_path / "data")
    yield e
    e.close()


def search(engine: Engine, query: str, c=None, **kw) -> dict:
    value = call(engine, "search", c or ctx(), {"query": query, "purpose_ref": PURPOSE, **kw})
    validate_output("search", value)  # every value the engine emits is on-contract
    return value


def test_search_finds_ranks_and_receipts(engine: Engine) -> None:
    ids = [admit(engine, t, i) for i, t in enumerate(DOCS)]
    value = search(engine, "which lexical channel breaks ties")
    assert value["records"][0]["record"]["record_id"] == ids[1]
    assert [p["rank"] for p in value["records"]] == list(range(1, len(value["records"]) + 1))
    scores = [p["score"] for p in value["records"]]
    assert scores == sorted(scores, reverse=True)
    receipt = value["rank_receipt"]
    assert receipt["profile"] == "lexical_v1" and receipt["fusion"] == {"method": "none", "rerank": RERANK}
    lexical, semantic = receipt["channels"]
    assert lexical["engine"] == "tantivy" and lexical["contributed"] and lexical["index_cursor"] == "10"
    assert lexical["analyzer"] == "engram_en_stem_stop_v3+qtf_sqrt"
    assert semantic["contributed"] is False
    assert [r["record_id"] for r in receipt["ranked"]] == [p["record"]["record_id"] for p in value["records"]]
    assert receipt["ranked"][0]["lexical"]["rank"] == 1
    assert receipt["ranked"][0]["lexical"]["analyzer"] == "engram_en_stem_stop_v3"  # the hit's language
    assert "scope_ref" not in value["records"][0]["record"]  # host redaction default
    assert value["records"][0]["redacted_fields"] == ["/scope_ref"]


def test_search_is_byte_identical_when_repeated(engine: Engine) -> None:
    for i, t in enumerate(DOCS):
        admit(engine, t, i)
    assert canonical_bytes(search(engine, "service state")) == canonical_bytes(search(engine, "service state"))


def test_hostile_query_text_never_crashes(engine: Engine) -> None:
    admit(engine, DOCS[0], 0)
    for q in ["AND", "foo)", '"', "*", "(((", "OR NOT", "\u00e9\u65e5\U0001f600", "a" * 8000, "- + ~ ^ :"]:
        assert search(engine, q)["records"] is not None


def test_search_and_get_are_scope_isolated(engine: Engine) -> None:
    rid = admit(engine, DOCS[2], 0)
    other = ctx(tenant="globex")
    assert search(engine, "billing webhooks", c=other)["records"] == []
    assert search(engine, "billing webhooks", c=other)["rank_receipt"]["candidate_count"] == 0
    with pytest.raises(EngramError) as foreign:
        call(engine, "get", other, {"record_id": rid, "purpose_ref": PURPOSE})
    with pytest.raises(EngramError) as unknown:
        call(engine, "get", other, {"record_id": "mem_" + "a" * 52, "purpose_ref": PURPOSE})
    assert foreign.value.code == unknown.value.code == "NOT_FOUND"
    got = call(engine, "get", ctx(), {"record_id": rid, "purpose_ref": PURPOSE})
    validate_output("get", got)
    assert got["record"]["record_id"] == rid and got["read_receipt"]["record_id"] == rid


def test_paging_yields_each_record_once_and_rejects_stale_cursors(engine: Engine) -> None:
    for i, t in enumerate(DOCS):
        admit(engine, t, i)
    seen, cursor, pages = [], None, 0
    while True:
        kw = {"limit": 2, **({"page_cursor": cursor} if cursor else {})}
        page = search(engine, "the service state test record", **kw)
        seen += [p["record"]["record_id"] for p in page["records"]]
        pages += 1
        cursor = page.get("next_page_cursor")
        if not cursor:
            break
    assert len(seen) == len(set(seen)) == len(search(engine, "the service state test record", limit=50)["records"])
    assert pages >= 2
    first = search(engine, "the service state test record", limit=1)
    good = first["next_page_cursor"]
    for bad_kw in (
        {"query": "another query"},
        {"limit": 2},
    ):
        with pytest.raises(EngramError) as err:
            call(engine, "search", ctx(), {"query": "the service state test record", "purpose_ref": PURPOSE, "limit": 1,
                                  "page_cursor": good, **bad_kw})
        assert err.value.code == "STALE_PAGE"
    forged = good[:-3] + ("AAA" if not good.endswith("AAA") else "BBB")
    with pytest.raises(EngramError) as err:
        search(engine, "the service state test record", limit=1, page_cursor=forged)
    assert err.value.code == "STALE_PAGE"
    with pytest.raises(EngramError) as err:
        search(engine, "the service state test record", limit=1, page_cursor=good, c=ctx(tenant="globex"))
    assert err.value.code == "STALE_PAGE"
    admit(engine, "A new record changes the scope.", 99)
    with pytest.raises(EngramError) as err:
        search(engine, "the service state test record", limit=1, page_cursor=good)
    assert err.value.code == "STALE_PAGE"


def test_packet_budget(engine: Engine) -> None:
    admit(engine, "budget " + "x" * 5000, 0)
    admit(engine, "budget small", 1)
    with pytest.raises(EngramError) as err:
        search(engine, "budget xxx", max_packet_bytes=4096)
    # the big record ranks first only if it matches better; either way the budget holds
    value = search(engine, "budget small", max_packet_bytes=4096)
    total = sum(len(canonical_bytes(p)) for p in value["records"])
    assert total <= 4096 and value["records"]
    assert err.value.code == "PROJECTION_OVERSIZED" or total <= 4096
    with pytest.raises(EngramError) as err:
        call(engine, "get", ctx(), {"record_id": admit(engine, "huge " + "y" * 6000, 2), "purpose_ref": PURPOSE,
                           "max_packet_bytes": 4096})
    assert err.value.code == "PROJECTION_OVERSIZED"


def test_semantic_required_without_model_is_ranking_unavailable(engine: Engine) -> None:
    admit(engine, DOCS[0], 0)
    with pytest.raises(EngramError) as err:
        search(engine, "duckdb", capability_policy={"minimum_channels": "lexical_and_semantic", "network": "allow"})
    assert err.value.code == "RANKING_UNAVAILABLE" and err.value.retriable


def test_visibility_window_and_expiry(engine: Engine) -> None:
    future = admit(engine, "future fact", 0, valid_time={"t": T0 + 10_000})
    bounded = admit(engine, "past fact", 1, valid_time={"t": T0 - 20_000, "t_end": T0 - 10_000})
    expiring = admit(engine, "expiring fact", 2,
                     retention={"derivative_rule": "make-ineligible", "expires_at": "2026-05-28T20:26:41.000Z"})
    assert {p["record"]["record_id"] for p in search(engine, "fact")["records"]} == {expiring}
    for rid in (future, bounded):
        with pytest.raises(EngramError):
            call(engine, "get", ctx(), {"record_id": rid, "purpose_ref": PURPOSE})
    engine.clock = lambda: T0 + 2_000  # past expires_at
    assert search(engine, "fact")["records"] == []
    with pytest.raises(EngramError) as err:
        call(engine, "get", ctx(), {"record_id": expiring, "purpose_ref": PURPOSE})
    assert err.value.code == "NOT_FOUND"


def _projection_bytes(path: Path) -> bytes:
    return b"".join(data for _, data in disk_files(path / "projections"))


def test_forget_purges_lexical_projection(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "d")
    try:
        rid = admit(engine, "The zqxjkvorbital marker deployment decision.", 0)
        admit(engine, "Another record that stays.", 1)
        engine.settle()  # admissions are projected in groups: put them on disk before looking
        assert b"zqxjkvorbit" in _projection_bytes(tmp_path / "d")
        out = call(engine, "forget", ctx(), forget_args(rid))
        validate_output("forget", out)
        assert out["projection_invalidation"] == "complete" and out["coverage_receipt_digest"].startswith("sha256:")
        assert search(engine, "zqxjkvorbital")["records"] == []
        assert call(engine, "forget", ctx(), forget_args(rid)) == {**out, "replayed": True}
    finally:
        engine.close()
    assert b"zqxjkvorbit" not in _projection_bytes(tmp_path / "d")


def _build(path: Path) -> Engine:
    engine = open_engine(path)
    ids = [admit(engine, t, i) for i, t in enumerate(DOCS)]
    call(engine, "forget", ctx(), forget_args(ids[3]))
    return engine


def test_determinism_across_stores_restart_and_rebuild(tmp_path: Path) -> None:
    queries = ["service", "record state truth", "ADR incident convention"]
    a = _build(tmp_path / "a")
    first = [canonical_bytes(search(a, q)) for q in queries]
    a.close()
    b = _build(tmp_path / "b")
    assert [canonical_bytes(search(b, q)) for q in queries] == first
    b.close()
    a = open_engine(tmp_path / "a")  # restart
    assert [canonical_bytes(search(a, q)) for q in queries] == first
    a.close()
    report = rebuild_index(tmp_path / "a", verify=True, show_progress=False, semantic=False)
    assert report.differences == 0 and report.scopes[0].records == 4
    a = open_engine(tmp_path / "a")
    assert [canonical_bytes(search(a, q)) for q in queries] == first
    a.close()


def test_redaction_policy_is_configurable(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "r", redacted_fields=("scope_ref", "citations", "trust"))
    try:
        admit(engine, DOCS[0], 0)
        packet = search(engine, "duckdb")["records"][0]
        assert packet["redacted_fields"] == ["/citations", "/scope_ref", "/trust"]
        assert "citations" not in packet["record"] and "components" in packet["record"]
    finally:
        engine.close()


def test_lost_projection_is_rebuilt_on_next_use(tmp_path: Path) -> None:
    import shutil

    engine = open_engine(tmp_path / "p")
    rid = admit(engine, DOCS[1], 0)
    engine.close()
    shutil.rmtree(tmp_path / "p" / "projections")  # a crash that lost the derived data
    engine = open_engine(tmp_path / "p")
    try:
        assert [p["record"]["record_id"] for p in search(engine, "tantivy ties")["records"]] == [rid]
    finally:
        engine.close()


def test_response_digest_binds_the_canonical_value(engine: Engine) -> None:
    from engram_memory.models.digests import receipt_digest

    for i, t in enumerate(DOCS):
        admit(engine, t, i)
    for kw in ({}, {"limit": 2}):
        value = search(engine, "the service state record", **kw)
        body = {k: v for k, v in value.items() if k != "response_digest"}
        assert value["response_digest"] == receipt_digest("recall-packet", body, "packet_digest")


def test_an_index_of_the_earlier_format_is_rebuilt_on_open(tmp_path: Path) -> None:
    """A lexical index written before the id fast fields cannot be opened with today's schema:
    it is derived data, so the store rebuilds it from DuckDB and answers the same bytes."""
    import shutil

    import tantivy

    from engram_memory.retrieval import lexical

    engine = open_engine(tmp_path / "data")
    ids = [admit(engine, t, i) for i, t in enumerate(DOCS)]
    before = canonical_bytes(search(engine, "duckdb journal"))
    lexical_dir = engine.projections.scope_dir(ctx().scope_ref) / "lexical"
    engine.close()

    shutil.rmtree(lexical_dir)
    lexical_dir.mkdir()
    sb = tantivy.SchemaBuilder()  # the schema as it was: text fields only
    sb.add_text_field(lexical.ID_FIELD, stored=True, tokenizer_name="raw", index_option="basic")
    for name in lexical.FIELDS:
        sb.add_text_field(name, stored=True, tokenizer_name=lexical.TOKENIZER_NAME, index_option=lexical.INDEX_OPTION)
    old = tantivy.Index(sb.build(), path=str(lexical_dir))
    old.register_tokenizer(lexical.TOKENIZER_NAME, lexical.build_analyzer())  # (v2 had no CJK bigrams)
    writer = old.writer(15_000_000, 1)
    writer.add_document(tantivy.Document(id=ids[0], primary="stale text"))
    writer.commit()
    writer.wait_merging_threads()
    del writer, old

    engine = open_engine(tmp_path / "data")
    try:
        assert canonical_bytes(search(engine, "duckdb journal")) == before
    finally:
        engine.close()
