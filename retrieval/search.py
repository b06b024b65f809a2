"""The two read paths: ranked search and direct get, with receipts, paging and packet budgets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tantivy

from models.canonical import canonical_bytes
from models.context import HostContext
from models.digests import digest_bytes, receipt_digest
from models.errors import EngramError
from retrieval import paging
from retrieval.packets import packet_bytes, redact
from retrieval.ranking import RankedHit, rank
from store.lifecycle import authorization_receipt

if TYPE_CHECKING:
    from store.engine import Engine

PROFILE_VERSION = "1.0.0"
CHANNEL_DEPTH = 1000  # hits taken from each channel before fusion
RESULT_BOUND = 1_048_576  # mirrors the argument bound: the largest result we put on the wire
DEFAULT_POLICY = {"minimum_channels": "lexical", "network": "forbid"}
ELIGIBLE_SQL = (
    "state = 'accepted_current' AND valid_t <= ? AND (valid_t_end IS NULL OR valid_t_end >= ?)"
    " AND (expires_at_ms IS NULL OR expires_at_ms > ?)"
)


def _expire(engine: Engine, scope_ref: str, now: int) -> None:
    expired = engine.lifecycle.expire_due(scope_ref, now)
    if expired:
        engine.projections.remove(scope_ref, expired, _projection_cursor(engine, scope_ref))


def _projection_cursor(engine: Engine, scope_ref: str) -> int:
    return engine.db.projection_cursor(scope_ref)


def _eligible(engine: Engine, scope_ref: str, ids: list[str], valid_as_of: int, now: int) -> set[str]:
    if not ids:
        return set()
    rows = engine.db.all(
        f"SELECT record_id FROM records WHERE scope_ref = ? AND record_id IN (SELECT unnest(?::VARCHAR[]))"
        f" AND {ELIGIBLE_SQL}",
        [scope_ref, ids, valid_as_of, valid_as_of, now],
    )
    return {r[0] for r in rows}


def _load_page(engine: Engine, scope_ref: str, record_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Decrypt the records of one page with a single query."""
    if not record_ids:
        return {}
    rows = engine.db.all(
        "SELECT record_id, key_ref, body FROM records WHERE scope_ref = ? AND body IS NOT NULL"
        " AND record_id IN (SELECT unnest(?::VARCHAR[]))",
        [scope_ref, record_ids],
    )
    loaded = {rid: engine.lifecycle.load_record(rid, key_ref, body) for rid, key_ref, body in rows}
    return {rid: record for rid, record in loaded.items() if record is not None}


def _channel_receipts(engine: Engine, scope_ref: str, semantic: bool) -> list[dict[str, Any]]:
    lexical = engine.projections.lexical(scope_ref)
    semantic = semantic and "semantic" in engine.config.channels
    receipts: list[dict[str, Any]] = [
        {
            "channel": "lexical",
            "contributed": "lexical" in engine.config.channels,
            "engine": "tantivy",
            "engine_version": getattr(tantivy, "__version__", "0.27.0"),
            "index_kind": "bm25",
            "index_cursor": lexical.cursor or "0",
        }
    ]
    sem: dict[str, Any] = {
        "channel": "semantic",
        "contributed": semantic,
        "engine": "none",
        "engine_version": "0",
        "index_kind": "none",
        "index_cursor": "0",
    }
    if semantic:
        vectors = engine.projections.vectors(scope_ref)
        kind = vectors.kind
        if kind == "hnsw":
            import hnswlib

            sem.update(engine="hnswlib", engine_version=getattr(hnswlib, "__version__", "0.8.0"))
        else:
            import numpy

            sem.update(engine="numpy", engine_version=numpy.__version__)
        sem.update(index_kind=kind, index_cursor=vectors.cursor or "0")
    if engine.embedder is not None:
        sem["model_id"] = engine.embedder.model_id
        if engine.embedder.model_digest is not None:  # unknown for a missing model: omitted, never null
            sem["model_digest"] = engine.embedder.model_digest
    receipts.append(sem)
    return receipts


def _profile_config(engine: Engine, profile: str, receipts: list[dict[str, Any]], fused: bool) -> str:
    config: dict[str, Any] = {
        "profile": profile,
        "profile_version": PROFILE_VERSION,
        "channel_depth": CHANNEL_DEPTH,
        "lexical": engine.projections.lexical_description(),
        "fusion": engine.fusion.describe(fused),
        "channels": list(engine.config.channels),
    }
    sem = receipts[1]
    if sem["contributed"]:
        config["semantic"] = {"model_id": sem["model_id"], "model_digest": sem["model_digest"],
                              "hnsw_threshold": engine.projections.hnsw_threshold}
    return receipt_digest("recall-profile-config", config, "profile_config_digest")


def _ranked_entry(hit: RankedHit, rank_no: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"record_id": hit.record_id, "rank": rank_no, "score": hit.score}
    for channel, (channel_rank, raw) in hit.channels.items():
        entry[channel] = {"rank": channel_rank, "score": raw}
    return entry


def search(engine: Engine, ctx: HostContext, args: dict[str, Any]) -> dict[str, Any]:
    now = engine.clock()
    scope = ctx.scope_ref
    _expire(engine, scope, now)
    policy = args.get("capability_policy", DEFAULT_POLICY)  # network "allow" grants nothing
    # A host that ranks without the semantic channel never switches profile mid-paging.
    semantic = "semantic" in engine.config.channels and engine.semantic_ready()
    if policy["minimum_channels"] == "lexical_and_semantic" and not semantic:
        raise EngramError("RANKING_UNAVAILABLE")  # never a silent fallback
    profile = "hybrid_v1" if semantic else "lexical_v1"
    limit = args.get("limit", 10)
    max_packet_bytes = args.get("max_packet_bytes", 65_536)
    request_digest = receipt_digest(
        "recall-request",
        {"query": args["query"], "purpose_ref": args["purpose_ref"], "profile": profile, "limit": limit,
         "max_packet_bytes": max_packet_bytes, "capability_policy": policy},
        "request_digest",
    )
    system_as_of = str(_projection_cursor(engine, scope))
    valid_as_of, offset = now, 0
    pin = None
    if "page_cursor" in args:
        pin = paging.decode(engine.keys.server_secret, scope, args["page_cursor"])
        if pin.request_digest != request_digest or pin.profile != profile or pin.system_as_of != system_as_of:
            raise EngramError("STALE_PAGE", "cursor from another query or an older state")
        valid_as_of, offset = pin.valid_as_of, pin.offset

    enabled = engine.config.channels
    channels: dict[str, list[tuple[str, float]]] = {}
    if "lexical" in enabled:
        channels["lexical"] = engine.projections.lexical(scope).search(args["query"], CHANNEL_DEPTH)
    if semantic and "semantic" in enabled:
        qvec = engine.embedder.encode([args["query"]])[0]
        channels["semantic"] = engine.projections.vectors(scope).search(qvec, CHANNEL_DEPTH)
    candidates = sorted({rid for hits in channels.values() for rid, _ in hits})
    eligible = _eligible(engine, scope, candidates, valid_as_of, now)
    channels = {name: [h for h in hits if h[0] in eligible] for name, hits in channels.items()}
    ranked = rank(channels, engine.fusion) if channels else []
    ordered_ids = [h.record_id for h in ranked]
    ordered_digest = receipt_digest("recall-ordered", {"ordered_ids": ordered_ids})
    if pin is not None and pin.ordered_ids_digest != ordered_digest:
        raise EngramError("STALE_PAGE", "ranking changed under the pin")

    packets: list[dict[str, Any]] = []
    encoded: list[bytes] = []  # each packet's canonical bytes, reused for the response digest
    total = 0
    page = ranked[offset:offset + limit]
    records = _load_page(engine, scope, [h.record_id for h in page])
    for hit in page:
        record = records.get(hit.record_id)
        if record is None:
            continue
        packet = {
            **redact(record, engine.config.policy.redacted_fields, engine.config.policy.policy_version),
            "score": hit.score,
            "rank": offset + len(packets) + 1,
        }
        packet_jcs = canonical_bytes(packet)
        if total + len(packet_jcs) > max_packet_bytes:
            if not packets:
                raise EngramError("PROJECTION_OVERSIZED")
            break
        packets.append(packet)
        encoded.append(packet_jcs)
        total += len(packet_jcs)
    shown = ranked[offset:offset + len(packets)]
    receipts = _channel_receipts(engine, scope, semantic)
    receipt: dict[str, Any] = {
        "request_digest": request_digest,
        "profile": profile,
        "profile_version": PROFILE_VERSION,
        "profile_config_digest": _profile_config(engine, profile, receipts, len(channels) > 1),
        "valid_as_of": valid_as_of,
        "system_as_of": system_as_of,
        "candidate_count": len(eligible),
        "candidate_ids_digest": receipt_digest("recall-candidates", {"candidate_ids": sorted(eligible)}),
        "ordered_ids_digest": ordered_digest,
        "channels": receipts,
        "fusion": engine.fusion.describe(len(channels) > 1),
        "ranked": [_ranked_entry(h, p["rank"]) for h, p in zip(shown, packets, strict=True)],
        "issued_at": _instant(now),
    }
    receipt["receipt_digest"] = receipt_digest("rank-receipt", receipt)
    value: dict[str, Any] = {"records": packets, "rank_receipt": receipt}
    next_offset = offset + len(packets)
    if next_offset < len(ordered_ids):
        value["next_page_cursor"] = paging.encode(
            engine.keys.server_secret,
            scope,
            paging.PagePin(request_digest, profile, valid_as_of, system_as_of, next_offset, ordered_digest),
        )
    body = _response_body(value, encoded)
    if len(body) + RESPONSE_DIGEST_BYTES > RESULT_BOUND:
        raise EngramError("RESULT_TOO_LARGE")
    value["response_digest"] = digest_bytes("recall-packet", body)
    return value


RESPONSE_DIGEST_BYTES = len(',"response_digest":"sha256:"') + 64


def _response_body(value: dict[str, Any], encoded_records: list[bytes]) -> bytes:
    """JCS of {next_page_cursor?, rank_receipt, records}, reusing the packets' bytes.

    The keys are ASCII, so their UTF-16 order is this byte order; the result equals
    canonical_bytes(value) (tested) without serialising every packet twice."""
    parts = [b"{"]
    if "next_page_cursor" in value:
        parts += [b'"next_page_cursor":', canonical_bytes(value["next_page_cursor"]), b","]
    parts += [b'"rank_receipt":', canonical_bytes(value["rank_receipt"]), b',"records":[',
              b",".join(encoded_records), b"]}"]
    return b"".join(parts)


def _instant(ms: int) -> str:
    from store.timeutil import to_instant

    return to_instant(ms)


def get_record(engine: Engine, ctx: HostContext, args: dict[str, Any]) -> dict[str, Any]:
    now = engine.clock()
    scope, rid = ctx.scope_ref, args["record_id"]
    _expire(engine, scope, now)
    # Unknown, foreign-scope and ineligible ids all take this one query and answer NOT_FOUND.
    row = engine.db.one(
        f"SELECT key_ref, body FROM records WHERE record_id = ? AND scope_ref = ? AND {ELIGIBLE_SQL}",
        [rid, scope, now, now, now],
    )
    record = engine.lifecycle.load_record(rid, row[0], row[1]) if row else None
    if record is None:
        raise EngramError("NOT_FOUND")
    packet = redact(record, engine.config.policy.redacted_fields, engine.config.policy.policy_version)
    if packet_bytes(packet) > args.get("max_packet_bytes", 65_536):
        raise EngramError("PROJECTION_OVERSIZED")
    cursor = str(_projection_cursor(engine, scope))
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
        "checked_at": _instant(now),
    }
    read_receipt["receipt_digest"] = receipt_digest("read-receipt", read_receipt)
    value = {**packet, "read_receipt": read_receipt}
    value["packet_digest"] = receipt_digest("get-packet", value, "packet_digest")
    return value
