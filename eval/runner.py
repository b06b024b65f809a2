"""Run judged queries through the real search path (validated arguments, paging, receipts).

The search tool returns at most 50 records a page, so a depth-100 run pages with
``next_page_cursor``. Each page's rank receipt lists ``ranked`` entries (record id, rank,
fused score, per-channel rank and raw score); the run is read from those receipts, never from
engine internals, so what is scored is what an agent would have been shown.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from engram_memory.eval.beir import truncate_utf8
from engram_memory.eval.ingest import PURPOSE, host_context, validated
from engram_memory.models.errors import EngramError
from engram_memory.models.tools import to_plain

DEPTH = 100  # Recall@100 / MAP@100
PAGE_LIMIT = 50  # the tool's `limit` maximum
# Large enough for 50 full records of any BEIR doc, small enough that packets + the receipt
# stay under the engine's 1 MiB result bound.
MAX_PACKET_BYTES = 786_432


@dataclass
class RunResult:
    channels: str
    run: dict[str, list[tuple[str, float]]]  # qid -> [(doc_id, fused score)] in engine order
    latency_s: dict[str, float]  # qid -> wall time of the first page (what an agent waits for)
    receipt: dict[str, Any]  # profile, fusion and channel receipts of one query (they are per-run constant)
    truncated_queries: int = 0
    empty_queries: list[str] = field(default_factory=list)
    unknown_records: int = 0  # ranked ids not in the doc map (should be 0)
    restarted_queries: int = 0  # paging hit STALE_PAGE and the query was re-run from page 1


def _summary(receipt: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "profile": receipt["profile"],
        "profile_version": receipt["profile_version"],
        "profile_config_digest": receipt["profile_config_digest"],
        "fusion": receipt["fusion"],
        "channels": [{k: c.get(k) for k in ("channel", "contributed", "engine", "index_kind", "model_id")}
                     for c in receipt["channels"]],
    }


def contributed(receipt: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(c["channel"] for c in receipt["channels"] if c["contributed"])


def search_depth(engine: Any, ctx: Any, query: str, depth: int = DEPTH) -> tuple[list[dict[str, Any]], float,
                                                                                 dict[str, Any]]:
    """Page through one query's ranking until ``depth`` ranked entries; returns (entries, first-page s, receipt)."""
    args: dict[str, Any] = {"query": query, "purpose_ref": PURPOSE, "limit": min(PAGE_LIMIT, depth),
                            "max_packet_bytes": MAX_PACKET_BYTES}
    entries: list[dict[str, Any]] = []
    first_page_s = 0.0
    receipt: dict[str, Any] = {}
    while len(entries) < depth:
        t = time.perf_counter()
        value = to_plain(engine.search(ctx, validated("search", args)))
        if not entries:
            first_page_s = time.perf_counter() - t
            receipt = value["rank_receipt"]
        entries.extend(value["rank_receipt"]["ranked"])
        cursor = value.get("next_page_cursor")
        if cursor is None or not value["rank_receipt"]["ranked"]:
            break
        args = {**args, "page_cursor": cursor}
    return entries[:depth], first_page_s, receipt


def run_queries(
    engine: Any,
    dataset: str,
    queries: Mapping[str, str],
    record_to_doc: Mapping[str, str],
    channels: str,
    depth: int = DEPTH,
    progress: bool = True,
) -> RunResult:
    ctx = host_context(dataset)
    result = RunResult(channels, {}, {}, {})
    for qid, text in tqdm(queries.items(), desc=f"{channels:>8} {dataset}", unit="q", file=sys.stderr,
                          disable=not progress, dynamic_ncols=True):
        query = truncate_utf8(text)
        result.truncated_queries += query != text
        if not query.strip():
            result.empty_queries.append(qid)
            result.run[qid] = []
            continue
        try:
            entries, first_s, receipt = search_depth(engine, ctx, query, depth)
        except EngramError as exc:
            if exc.code != "STALE_PAGE":
                raise RuntimeError(f"search failed for query {qid!r}: {exc}") from exc
            # The ranking changed between pages (e.g. the model finished loading): an agent
            # would start over, and so do we, once.
            result.restarted_queries += 1
            entries, first_s, receipt = search_depth(engine, ctx, query, depth)
        if not result.receipt and receipt:
            result.receipt = _summary(receipt)
        hits = []
        for e in entries:
            doc = record_to_doc.get(e["record_id"])
            if doc is None:
                result.unknown_records += 1
                continue
            hits.append((doc, float(e["score"])))
        result.run[qid] = hits
        result.latency_s[qid] = first_s
    return result
