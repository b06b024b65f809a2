"""Fast checks of the eval harness pieces (no embedding model, no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_memory.eval.beir import Collection, Doc, load_collection, subset, truncate_utf8
from engram_memory.eval.ingest import admission_args, capture_args, store_key, validated
from engram_memory.eval.metrics import METRICS, score, write_trec
from engram_memory.models.settings import EngineSettings
from engram_memory.models.tools import to_plain


def _write_beir(root: Path, docs: list[tuple[str, str, str]], queries: dict[str, str],
                qrels: list[tuple[str, str, int]]) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": x}) + "\n" for i, t, x in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()), encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels), encoding="utf-8")
    return root


def test_truncate_utf8_cuts_on_a_character_boundary() -> None:
    text = "é" * 5000  # 2 bytes each: 10,000 bytes
    cut = truncate_utf8(text, 8192)
    assert len(cut.encode("utf-8")) <= 8192
    assert cut == "é" * 4096
    odd = "a" + "€" * 4000  # 'a' + 3-byte chars: the limit falls inside a character
    cut = truncate_utf8(odd, 8192)
    assert len(cut.encode("utf-8")) <= 8192 and cut.encode("utf-8").decode("utf-8") == cut
    assert truncate_utf8("short") == "short"
    assert truncate_utf8("e\u0301") == "\u00e9"  # NFC first: the engine bounds the NFC form


def test_loader_keeps_only_judged_queries(tmp_path: Path) -> None:
    root = _write_beir(tmp_path / "mini", [("d1", "T1", "alpha"), ("d2", "", "beta")],
                       {"q1": "alpha?", "q2": "unjudged"}, [("q1", "d1", 1)])
    col = load_collection(root)
    assert [d.doc_id for d in col.docs] == ["d1", "d2"]
    assert col.queries == {"q1": "alpha?"} and col.qrels == {"q1": {"d1": 1}}


def test_subset_keeps_complete_judgments_and_is_deterministic() -> None:
    docs = [Doc(f"d{i}", "", f"text {i}") for i in range(20)]
    qrels = {"q1": {"d3": 1, "d15": 1}, "q2": {"d7": 2}, "q3": {"d1": 1, "d2": 1, "d4": 1, "d5": 1}}
    col = Collection("c", docs, {"q1": "a", "q2": "b", "q3": "c"}, qrels)
    sub = subset(col, 6)
    ids = {d.doc_id for d in sub.docs}
    assert len(ids) == 6
    for q, judged in sub.qrels.items():
        assert {d for d, g in judged.items() if g > 0} <= ids, q
    assert set(sub.queries) == {"q1", "q2"}  # q3's four relevant docs do not fit in half the budget
    assert [d.doc_id for d in sub.docs] == [d.doc_id for d in subset(col, 6).docs]
    assert sub.fingerprint != col.fingerprint


def test_cache_key_changes_with_content_and_mapping() -> None:
    a = Collection("c", [Doc("d1", "t", "x")], {}, {})
    b = Collection("c", [Doc("d1", "t", "x changed")], {}, {})
    assert store_key(a, "single") != store_key(b, "single")
    assert store_key(a, "single") != store_key(a, "split")
    assert store_key(a, "single") == store_key(Collection("c", [Doc("d1", "t", "x")], {}, {}), "single")


@pytest.mark.parametrize("mapping", ["single", "split"])
def test_capture_args_pass_the_server_parser(mapping: str) -> None:
    doc = Doc("4983", "A title.", "Body text " * 50)
    args = to_plain(validated("capture", capture_args("scifact", doc, mapping)))
    payload = args["payload"]
    assert payload["citations"][0]["source_ref"] == "beir:scifact:4983"
    texts = [c["text"] for c in payload["components"]]
    assert "\n".join(texts) == "A title.\n" + doc.text  # same embedding text in both mappings
    assert len(texts) == (2 if mapping == "split" else 1)
    untitled = to_plain(validated("capture", capture_args("medline", Doc("7", "", "only text"), mapping)))
    assert [c["text"] for c in untitled["payload"]["components"]] == ["only text"]
    validated("request_admission", admission_args("candidate_" + "a" * 64))


def test_idempotency_key_tracks_content() -> None:
    k1 = capture_args("c", Doc("d", "t", "x"))["idempotency_key"]
    assert k1 == capture_args("c", Doc("d", "t", "x"))["idempotency_key"]
    assert k1 != capture_args("c", Doc("d", "t", "y"))["idempotency_key"]


def test_metrics_follow_the_engine_order_not_tied_scores(tmp_path: Path) -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    # Every score tied: only the order can say that "a" is first for q1.
    run = {"q1": [("a", 0.5), ("x", 0.5)], "q2": [("x", 0.5), ("y", 0.5), ("b", 0.5)]}
    s = score(run, qrels)
    assert set(s) == set(METRICS)
    assert s["mrr@10"] == pytest.approx((1 + 1 / 3) / 2)
    assert s["recall@100"] == 1.0
    empty = score({"q1": [("a", 1.0)]}, qrels)  # q2 has no hits: counted as zero, not dropped
    assert empty["mrr@10"] == pytest.approx(0.5)
    write_trec(tmp_path / "r.trec", run, "tag")
    lines = (tmp_path / "r.trec").read_text().splitlines()
    assert lines[0].split() == ["q1", "Q0", "a", "1", "0.5", "tag"] and len(lines) == 5


def test_the_harness_types_a_locomo_turn_as_a_turn_and_a_document_as_a_note() -> None:
    """As a host, the harness marks LoCoMo turns (a title naming the session's time) with the engine's
    turn type, so the rerank stage treats them as turns, and documents with another type."""
    turn = Doc("D1:3", "session 1, 1:56 pm on 8 May, 2023", "Caroline: I went to a LGBTQ support group yesterday.")
    abstract = Doc("4983", "Microstructural development of human newborn cerebral white matter", "Alterations ...")
    turn_types = EngineSettings().turn_types  # the setting's default

    def event(dataset: str, doc: Doc) -> dict[str, str]:
        return to_plain(validated("capture", capture_args(dataset, doc)))["payload"]["primary_event"]

    assert event("locomo-26", turn)["type_ref"] in turn_types
    assert event("scifact", abstract)["type_ref"] not in turn_types
