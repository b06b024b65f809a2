"""End to end over stdio: a German, a Thai, a Spanish and a Chinese memory each answer their own
language's questions. A real `engram-memory serve` subprocess per memory (real DuckDB and Tantivy,
``--no-semantic``: the lexical channel alone, which is what per-language analysis changes), driven
by the MCP SDK's ClientSession.

Fixtures (tests/data/multilingual.json): German and Thai paragraphs and questions from XQuAD
(../shared/data/xquad, CC BY-SA 4.0); Spanish and Chinese notes and questions written for this test
(the XQuAD folders here have no Spanish or Chinese).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engram_memory.retrieval import languages
from tests.conftest import search_args
from tests.test_e2e_retrieval import LEXICAL_ONLY, admit

pytestmark = pytest.mark.anyio

FIXTURES = json.loads((Path(__file__).parent / "data" / "multilingual.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("language", ["de", "th", "es", "zh"])
async def test_a_memory_answers_its_own_languages_questions(start_server, data_dir_factory, language: str) -> None:
    fixture: dict[str, Any] = FIXTURES["languages"][language]
    async with start_server(data_dir_factory(f"lang-{language}"), extra=LEXICAL_ONLY) as mcp:
        ids = {name: await admit(mcp, text) for name, text in fixture["notes"].items()}
        analyzer = languages.BY_CODE[language].name
        for item in fixture["questions"]:
            found = await mcp.call("search", search_args(item["question"], limit=3))
            assert found["ok"], found
            value = found["output"]["value"]
            ranked = value["rank_receipt"]["ranked"]
            assert ranked and ranked[0]["record_id"] == ids[item["answer"]], (item, ranked)
            assert ranked[0]["lexical"]["analyzer"] == analyzer
            assert value["rank_receipt"]["channels"][0]["analyzer"] == f"{analyzer}+qtf_sqrt"
            assert value["records"][0]["record"]["components"][0]["text"] == fixture["notes"][item["answer"]]
