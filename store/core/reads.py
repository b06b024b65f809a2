"""The read path: ranked search and direct get, over the scope views and the projections.

Eligibility is a lookup in the scope's view (store/core/live.py), not a query; only the returned
page is loaded and decrypted (cached afterwards). Everything here runs under the engine's read
lock, so reads run together and each sees one cursor; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from engram_memory.models.context import HostContext, HostPolicy
from engram_memory.models.digests import digest_bytes, receipt_digest
from engram_memory.models.errors import EngramError
from engram_memory.models.limits import CHANNEL_DEPTH, RESULT_BOUND
from engram_memory.retrieval import paging
from engram_memory.retrieval.embedder import foreign_language
from engram_memory.retrieval.lexical import LexicalResult
from engram_memory.retrieval.packets import core_bytes, ranked_packet_bytes, redact
from engram_memory.retrieval.projections import Projections
from engram_memory.retrieval.ranking import FusionConfig, Ranking, floored, rank
from engram_memory.retrieval.receipts import (
    PROFILE_VERSION,
    RESPONSE_DIGEST_BYTES,
    ChannelState,
    channel_receipts,
    profile_config_digest,
    ranked_entry,
    response_body,
)
from engram_memory.retrieval.rerank import HeadFacts, RerankConfig, rerank, speaker_labels
from engram_memory.store.core.authz import authorization_receipt
from engram_memory.store.core.lifecycle import event_type, primary_text
from engram_memory.store.core.live import ScopeView, ScopeViews
from engram_memory.store.core.timeutil import to_instant


def search_request_digest(args: Mapping[str, Any], profile: str) -> str:
    """The rank receipt's request_digest: what was asked (the query and its bounds), under which
    profile (a capability_policy's network "allow" grants nothing, but it is part of the ask)."""
    return receipt_digest(
        "recall-request",
        {"query": args["query"], "purpose_ref": args["purpose_ref"], "profile": profile, "limit": args["limit"],
         "max_packet_bytes": args["max_packet_bytes"], "capability_policy": args["capability_policy"]},
        "request_digest",
    )


@dataclass(frozen=True)
class SearchPlan:
    """What the engine decided before taking the read lock."""

    semantic: bool  # the semantic channel ranks this search
    query_vector: np.ndarray | Future[np.ndarray] | None  # or still being encoded beside the lexical channel

    def vector(self) -> np.ndarray | None:
        found = self.query_vector
        return found.result() if isinstance(found, Future) else found


@dataclass
class ReadPath:
    projections: Projections
    fusion: FusionConfig
    policy: HostPolicy
    channels: tuple[str, ...]
    model_identity: Callable[[], tuple[str | None, str | None, str | None]]  # (model_id, model_digest, runtime)
    view: Callable[[str], ScopeView]
    load_page: Callable[[str, Sequence[str]], dict[str, dict[str, Any]]]
    server_secret: bytes
    cache: ScopeViews  # holds each cached record's redacted core and its canonical bytes
    rerank: RerankConfig | None = None  # search's second stage (retrieval/rerank.py); None: off
    channel_depth: int = CHANNEL_DEPTH  # hits taken from each channel; a depth study varies it

    def _core(self, record: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """The record's redacted packet core (record, redacted_fields, redaction digest) and
        its canonical bytes, computed once per cached record."""
        rid = record["record_id"]
        core = self.cache.core(rid)
        if core is None:
            redacted = redact(record, self.policy.redacted_fields, self.policy.policy_version)
            core = (redacted, core_bytes(redacted))
            self.cache.remember_core(rid, core)
        return core

    # -- search ----------------------------------------------------------------------------

    def search(self, ctx: HostContext, args: dict[str, Any], now: int, plan: SearchPlan) -> dict[str, Any]:
        scope = ctx.scope_ref
        view = self.view(scope)
        # ``args`` is the input model's plain form: every default is already filled in.
        semantic = plan.semantic
        profile = "hybrid_v1" if semantic else "lexical_v1"
        limit = args["limit"]
        max_packet_bytes = args["max_packet_bytes"]
        request_digest = search_request_digest(args, profile)
        system_as_of = str(view.projection_cursor)
        valid_as_of, offset = now, 0
        pin = None
        if "page_cursor" in args:
            pin = paging.decode(self.server_secret, scope, args["page_cursor"])
            if pin.request_digest != request_digest or pin.profile != profile or pin.system_as_of != system_as_of:
                raise EngramError("STALE_PAGE", "cursor from another query or an older state")
            valid_as_of, offset = pin.valid_as_of, pin.offset

        hits: dict[str, list[tuple[str, float]]] = {}
        lexical = None
        if "lexical" in self.channels:
            lexical = self.projections.lexical(scope).search_analyzed(args["query"], self.channel_depth)
            hits["lexical"] = lexical.hits
        query_vector = plan.vector() if semantic else None
        if query_vector is not None:
            hits["semantic"] = self.projections.vectors(scope).search(query_vector, self.channel_depth)
        eligible = view.eligible(set().union(*(map(itemgetter(0), found) for found in hits.values())), valid_as_of, now)
        hits = {name: [h for h in found if h[0] in eligible] for name, found in hits.items()}
        coverage = lexical.coverage if lexical is not None else 1.0
        # a query in a language the model was not trained for: its semantic weight is scaled down
        foreign = foreign_language(self.model_identity()[0], args["query"]) if len(hits) > 1 else None
        ranking = rank(hits, self.fusion, coverage, foreign is not None)
        # Every ranking, fused or one channel's (lexical_v1 while the model loads or without it).
        stage = self.rerank if hits else None
        if stage is not None:
            ranking = self._rerank(scope, view, args["query"], ranking, stage)
        ordered_ids = ranking.ids
        ordered_digest = receipt_digest("recall-ordered", {"ordered_ids": ordered_ids})
        if pin is not None and pin.ordered_ids_digest != ordered_digest:
            raise EngramError("STALE_PAGE", "ranking changed under the pin")

        packets: list[dict[str, Any]] = []
        encoded: list[bytes] = []  # each packet's canonical bytes, reused for the response digest
        total = 0
        page = ranking.hits(offset, offset + limit)
        records = self.load_page(scope, [h.record_id for h in page])
        for hit in page:
            record = records.get(hit.record_id)
            if record is None:
                continue
            core, core_jcs = self._core(record)
            rank_no = offset + len(packets) + 1
            packet = {**core, "score": hit.score, "rank": rank_no}
            packet_jcs = ranked_packet_bytes(core_jcs, hit.score, rank_no)
            if total + len(packet_jcs) > max_packet_bytes:
                if not packets:
                    raise EngramError("PROJECTION_OVERSIZED")
                break
            packets.append(packet)
            encoded.append(packet_jcs)
            total += len(packet_jcs)
        shown = page[:len(packets)]
        receipts = channel_receipts(self._channel_state(scope, semantic, lexical))
        fused = len(hits) > 1
        fusion = self.fusion.describe(fused, floored(hits))
        if stage is not None:
            fusion["rerank"] = stage.describe()
        receipt: dict[str, Any] = {
            "request_digest": request_digest,
            "profile": profile,
            "profile_version": PROFILE_VERSION,
            "profile_config_digest": profile_config_digest(
                profile=profile, channel_depth=self.channel_depth, lexical=self.projections.lexical_description(),
                fusion=fusion, channels=self.channels, semantic_receipt=receipts[1],
                hnsw_threshold=self.projections.hnsw_threshold, foreign_scale=self.fusion.foreign_scale,
            ),
            "valid_as_of": valid_as_of,
            "system_as_of": system_as_of,
            "candidate_count": len(eligible),
            "candidate_ids_digest": receipt_digest("recall-candidates", {"candidate_ids": sorted(eligible)}),
            "ordered_ids_digest": ordered_digest,
            "channels": receipts,
            "fusion": fusion,
            "ranked": [ranked_entry(h, p["rank"], lexical.analyzers if lexical is not None else None)
                       for h, p in zip(shown, packets, strict=True)],
            "issued_at": to_instant(now),
        }
        if fused and hits["lexical"] and self.fusion.lexical_scale(coverage) < 1.0:  # it scaled lexical hits
            fusion["lexical_coverage"] = coverage
        if fused and hits["semantic"] and foreign is not None:  # it scaled semantic hits
            fusion["semantic_language"] = foreign
        receipt["receipt_digest"] = receipt_digest("rank-receipt", receipt)
        value: dict[str, Any] = {"records": packets, "rank_receipt": receipt}
        next_offset = offset + len(packets)
        if next_offset < len(ordered_ids):
            value["next_page_cursor"] = paging.encode(
                self.server_secret,
                scope,
                paging.PagePin(request_digest, profile, valid_as_of, system_as_of, next_offset, ordered_digest),
            )
        body = response_body(value, encoded)
        if len(body) + RESPONSE_DIGEST_BYTES > RESULT_BOUND:
            raise EngramError("RESULT_TOO_LARGE")
        value["response_digest"] = digest_bytes("recall-packet", body)
        return value

    def _rerank(self, scope: str, view: ScopeView, query: str, ranking: Ranking, stage: RerankConfig) -> Ranking:
        """The ranking's head reordered by its records' speaker labels and event-order neighbours."""
        head = [rid for rid, _ in ranking.fused[: stage.head]]
        # A speaker is named on conversation turns only (a note's "Postgres:" line is a topic), and
        # the view knows which records are turns: a document's body is never decrypted for this.
        live = view.live
        turns = [rid for rid in head if (window := live.get(rid)) is not None and window.turn]
        if not turns:  # no labels, no neighbours' scores: every feature is 0 and the order is the fused one
            return ranking
        labels = self.cache.labels(turns)
        missing = [rid for rid in turns if rid not in labels]
        if missing:  # decrypted once per record; its labels outlive the body cache
            fresh = {rid: speaker_labels(primary_text(r)) if stage.is_turn(event_type(r)) else frozenset()
                     for rid, r in self.load_page(scope, missing).items()}
            self.cache.remember_labels(fresh)
            labels.update(fresh)
        facts = {rid: HeadFacts(labels.get(rid, frozenset()), view.timeline.neighbours(rid)) for rid in head}
        return Ranking(rerank(query, ranking.fused, facts, stage), ranking.channels)

    def _channel_state(self, scope: str, semantic: bool, lexical: LexicalResult | None = None) -> ChannelState:
        semantic = semantic and "semantic" in self.channels
        vectors = self.projections.vectors(scope) if semantic else None
        model_id, model_digest, model_runtime = self.model_identity()
        return ChannelState(
            lexical_enabled="lexical" in self.channels,
            lexical_cursor=self.projections.lexical(scope).cursor,
            semantic=semantic,
            vector_kind=vectors.kind if vectors is not None else None,
            vector_cursor=vectors.cursor if vectors is not None else None,
            model_id=model_id,
            model_digest=model_digest,
            model_runtime=model_runtime,
            **({"lexical_analyzer": lexical.analyzer} if lexical is not None else {}),
        )

    # -- get -------------------------------------------------------------------------------

    def get(self, ctx: HostContext, args: dict[str, Any], now: int) -> dict[str, Any]:
        scope, rid = ctx.scope_ref, args["record_id"]
        view = self.view(scope)
        # Unknown, foreign-scope and ineligible ids all take this one lookup and answer NOT_FOUND.
        record = self.load_page(scope, [rid]).get(rid) if view.eligible((rid,), now, now) else None
        if record is None:
            raise EngramError("NOT_FOUND")
        packet, packet_jcs = self._core(record)
        if len(packet_jcs) + 2 > args["max_packet_bytes"]:  # the core's bytes plus its braces
            raise EngramError("PROJECTION_OVERSIZED")
        cursor = str(view.projection_cursor)
        auth = authorization_receipt(ctx, "recall_current", {"record_id": rid})
        read_receipt: dict[str, Any] = {
            "record_id": rid,
            "record_digest": record["record_digest"],
            "valid_as_of": now,
            "system_as_of": cursor,
            "validated_through_cursor": cursor,
            "authorization_receipt_digest": auth,
            "revalidation_receipt_digest": receipt_digest(
                "revalidation-packet",
                {"eligible_record_ids": [rid], "removed": [], "cursor": cursor, "authorization_receipt_digest": auth},
            ),
            "checked_at": to_instant(now),
        }
        read_receipt["receipt_digest"] = receipt_digest("read-receipt", read_receipt)
        value = {**packet, "read_receipt": read_receipt}
        value["packet_digest"] = receipt_digest("get-packet", value, "packet_digest")
        return value
