"""Rank-receipt parts, built from data alone: channel receipts, the profile digest, ranked entries
and the response body. The store gathers the state (cursors, index kinds, model identity) and
passes it in; nothing here reads an index or a database."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import hnswlib
import numpy
import tantivy

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.digests import receipt_digest
from engram_memory.retrieval.embedder import model_languages
from engram_memory.retrieval.lexical import RANKING_NAME
from engram_memory.retrieval.ranking import RankedHit

PROFILE_VERSION = "1.0.0"
# Each channel's engine name and version, as the receipt names them.
LEXICAL_ENGINE = ("tantivy", getattr(tantivy, "__version__", "0.27.0"))
VECTOR_ENGINES = {
    "hnsw": ("hnswlib", getattr(hnswlib, "__version__", "0.8.0")),
    "exact": ("numpy", numpy.__version__),
}
RESPONSE_DIGEST_BYTES = len(',"response_digest":"sha256:"') + 64


@dataclass(frozen=True)
class ChannelState:
    """What the receipt says of the channels at the read's cursor."""

    lexical_enabled: bool
    lexical_cursor: str | None
    semantic: bool  # the semantic channel ranked this search
    vector_kind: str | None  # "exact" | "hnsw" (None when semantic is False)
    vector_cursor: str | None
    model_id: str | None  # None: no embedder configured
    model_digest: str | None  # None: unknown (missing model) -- omitted, never null
    model_runtime: str | None = None  # what ran the model's forward pass (None: not loaded)
    lexical_analyzer: str = RANKING_NAME  # the query's analyzers (one per language of the scope)


def channel_receipts(state: ChannelState) -> list[dict[str, Any]]:
    engine, version = LEXICAL_ENGINE
    receipts: list[dict[str, Any]] = [
        {
            "channel": "lexical",
            "contributed": state.lexical_enabled,
            "engine": engine,
            "engine_version": version,
            "index_kind": "bm25",
            "index_cursor": state.lexical_cursor or "0",
            "analyzer": state.lexical_analyzer,  # re-deriving a ranking needs the same tokens and query weights
        }
    ]
    sem: dict[str, Any] = {
        "channel": "semantic",
        "contributed": state.semantic,
        "engine": "none",
        "engine_version": "0",
        "index_kind": "none",
        "index_cursor": "0",
    }
    if state.semantic and state.vector_kind is not None:
        engine, version = VECTOR_ENGINES[state.vector_kind]
        sem.update(engine=engine, engine_version=version, index_kind=state.vector_kind,
                   index_cursor=state.vector_cursor or "0")
    if state.model_id is not None:
        sem["model_id"] = state.model_id
        if state.model_digest is not None:
            sem["model_digest"] = state.model_digest
    if state.semantic and state.model_runtime is not None:
        sem["model_runtime"] = state.model_runtime  # the query vector's runtime: part of what ranked
    receipts.append(sem)
    return receipts


def profile_config_digest(
    *,
    profile: str,
    channel_depth: int,
    lexical: Mapping[str, Any],
    fusion: Mapping[str, Any],
    channels: Sequence[str],
    semantic_receipt: Mapping[str, Any],
    hnsw_threshold: int,
    foreign_scale: float = 1.0,
) -> str:
    config: dict[str, Any] = {
        "profile": profile,
        "profile_version": PROFILE_VERSION,
        "channel_depth": channel_depth,
        "lexical": dict(lexical),
        "fusion": dict(fusion),
        "channels": list(channels),
    }
    if semantic_receipt["contributed"]:
        config["semantic"] = {"model_id": semantic_receipt["model_id"],
                              "model_digest": semantic_receipt["model_digest"],
                              "hnsw_threshold": hnsw_threshold}
        if "model_runtime" in semantic_receipt:
            config["semantic"]["model_runtime"] = semantic_receipt["model_runtime"]
        trained = model_languages(semantic_receipt["model_id"])
        if trained is not None:  # a query in another language scales its weight (retrieval/ranking.py)
            config["semantic"]["languages"] = trained
            config["semantic"]["foreign_scale"] = foreign_scale
    return receipt_digest("recall-profile-config", config, "profile_config_digest")


def ranked_entry(hit: RankedHit, rank_no: int, analyzers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A receipt's entry; a lexical hit names the analyzer of its language (``analyzers``: id -> name)."""
    entry: dict[str, Any] = {"record_id": hit.record_id, "rank": rank_no, "score": hit.score}
    for channel, (channel_rank, raw) in hit.channels.items():
        entry[channel] = {"rank": channel_rank, "score": raw}
        if channel == "lexical" and analyzers and hit.record_id in analyzers:
            entry[channel]["analyzer"] = analyzers[hit.record_id]
    return entry


def response_body(value: Mapping[str, Any], encoded_records: Sequence[bytes]) -> bytes:
    """JCS of {next_page_cursor?, rank_receipt, records}, reusing the packets' bytes.

    The keys are ASCII, so their UTF-16 order is this byte order; the result equals
    canonical_bytes(value) (tested) without serialising every packet twice."""
    parts = [b"{"]
    if "next_page_cursor" in value:
        parts += [b'"next_page_cursor":', canonical_bytes(value["next_page_cursor"]), b","]
    parts += [b'"rank_receipt":', canonical_bytes(value["rank_receipt"]), b',"records":[',
              b",".join(encoded_records), b"]}"]
    return b"".join(parts)
