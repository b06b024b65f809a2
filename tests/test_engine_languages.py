"""Per-language lexical analysis through a real engine (DuckDB + Tantivy, no model): each record is
analysed for its language, a query for every language of the scope, the receipt names each lexical
hit's analyzer, explain re-derives it, and rebuild-index re-analyses the records."""

from __future__ import annotations

from pathlib import Path

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.digests import receipt_digest
from engram_memory.retrieval import languages
from engram_memory.retrieval.lexical import LexicalDoc, query_terms
from engram_memory.store.host.explain import check_receipt, explain_with, parse_receipt, search_arguments
from engram_memory.store.maintenance.rebuild import rebuild_index
from tests.store_fixtures import PURPOSE, ctx
from tests.test_engine_lexical import admit, open_engine, search

# Short notes written for this test, one per language (the German one retells an XQuAD paragraph).
NOTES = {
    "de": "Die Broncos gewannen den Super Bowl, nachdem ihre Verteidigung den Quarterback der Panthers "
          "siebenmal zu Boden gebracht hatte; der Trainer lobte die Abwehr nach dem Spiel.",
    "zh": "北京是中华人民共和国的首都，也是全国的政治中心和文化中心，故宫位于城市的中心。",
    "th": "กรุงเทพมหานครเป็นเมืองหลวงและนครที่มีประชากรมากที่สุดของประเทศไทย ตั้งอยู่ริมแม่น้ำเจ้าพระยา",
    "es": "El equipo de bomberos llegó tarde al incendio porque el camión se averió en la carretera "
          "principal; el alcalde prometió comprar vehículos nuevos este año.",
    "en": "We adopted DuckDB as the single source of truth for lifecycle state, after the outage of March.",
}
QUESTIONS = {
    "de": "Wie oft wurde der Quarterback der Panthers zu Boden gebracht?",
    "zh": "中国的首都是哪个城市？",
    "th": "เมืองหลวงของประเทศไทยคืออะไร",
    "es": "¿Por qué llegaron tarde los bomberos al incendio?",
    "en": "what is the source of truth for lifecycle state",
}


def test_identification_and_analysis_per_language() -> None:
    for code, text in NOTES.items():
        assert languages.identify(text) == code, code
    assert languages.identify("ok") == "en" and languages.identify("Привет") == "ru"  # short: the script
    assert languages.identify("12345 --- !!!") == languages.DEFAULT_LANGUAGE
    # a German note quoting an English title is German (the language most of it is in)
    assert languages.identify("Der Vorstand hat gestern beschlossen, dass die Abteilung den Bericht 'Annual "
                              "Security Review' bis Freitag überarbeiten muss.") == "de"
    assert languages.segment("北京是首都 ok") == " 北京 京是 是首 首都  ok"
    assert query_terms("Die Häuser der Städte", code="de") == ["haus", "stadt"]  # stemmed, stop words, folded
    assert query_terms("中国的首都", code="zh") == ["中国", "国的", "的首", "首都"]
    assert LexicalDoc("r", {"primary": NOTES["th"]}).language == "th"


def test_each_language_answers_its_own_questions_and_receipts_name_the_analyzer(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "data")
    try:
        ids = {code: admit(engine, text, i) for i, (code, text) in enumerate(NOTES.items())}
        for code, question in QUESTIONS.items():
            value = search(engine, question)
            receipt = value["rank_receipt"]
            top = receipt["ranked"][0]
            assert top["record_id"] == ids[code], (code, receipt["ranked"])
            assert top["lexical"]["analyzer"] == languages.BY_CODE[code].name
            # the query was analysed for every language the scope holds, in ANALYSES order
            assert receipt["channels"][0]["analyzer"] == (
                "engram_en_stem_stop_v3|engram_de_stem_stop_fold_v1|engram_es_stem_stop_fold_v1|"
                "engram_zh_bigram_v1|engram_th_trigram_v1+qtf_sqrt")
        # one language's words do not match another's fields: "die" is a German stop word only
        assert [r["record_id"] for r in search(engine, "die")["rank_receipt"]["ranked"]] == []

        value = search(engine, QUESTIONS["zh"])
        receipt = parse_receipt(value)
        arguments = search_arguments(receipt, query=QUESTIONS["zh"], purpose_ref=PURPOSE)
        explained = explain_with(engine, receipt, arguments, ctx().scope_ref, None)
        assert explained.matched, explained.differences
        # a receipt naming another analyzer does not re-derive, and explain says which field differs
        forged = parse_receipt({**value["rank_receipt"], "ranked": [
            {**value["rank_receipt"]["ranked"][0],
             "lexical": {**value["rank_receipt"]["ranked"][0]["lexical"], "analyzer": "engram_ja_bigram_v1"}}]})
        differs = explain_with(engine, forged, arguments, ctx().scope_ref, None).differences
        assert any("lexical" in d and "engram_ja_bigram_v1" in d for d in differs), differs
        # without the store: a hit's analyzer must be one the channel names (the forger re-digested)
        assert check_receipt(receipt).problems == []
        resealed = dict(forged.rank_receipt)
        resealed["receipt_digest"] = receipt_digest("rank-receipt", resealed)
        assert check_receipt(parse_receipt(resealed)).problems == [
            "rank_receipt.ranked[0].lexical.analyzer engram_ja_bigram_v1 is not one the lexical channel names"]
        before = {q: canonical_bytes(search(engine, q)) for q in QUESTIONS.values()}
    finally:
        engine.close()
    report = rebuild_index(tmp_path / "data", verify=True, show_progress=False, semantic=False)
    assert report.differences == 0
    engine = open_engine(tmp_path / "data")
    try:
        assert {q: canonical_bytes(search(engine, q)) for q in QUESTIONS.values()} == before
    finally:
        engine.close()
