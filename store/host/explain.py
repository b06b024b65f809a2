"""Receipts anyone can check: ``admin explain`` and ``admin check-receipt``.

``explain`` re-derives a search's rank receipt from the store as of the receipt's cursor: the
scope's records current at ``system_as_of`` (replayed from the journal), their projections rebuilt
in a temporary directory (the stored, sealed embeddings: nothing is re-embedded but the query),
and the search path itself (store/core/reads.py ``ReadPath.search``) run over them at the receipt's
instant. Then every field of the receipt is compared with the re-derived one. A record named by
the receipt that has been forgotten since cannot be re-derived: it is reported by id alone.

``check_receipt`` needs no store: the digests a receipt (or a whole search response) carries are
recomputed from its own content, so an edited score, order or digest is caught.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.context import HostContext
from engram_memory.models.digests import digest_bytes, receipt_digest
from engram_memory.models.errors import EngramError
from engram_memory.models.states import NO_FUSION
from engram_memory.models.tools import parse_input, to_plain
from engram_memory.retrieval import paging
from engram_memory.retrieval.embedder import MODEL_LANGUAGES, foreign_language
from engram_memory.retrieval.languages import identify
from engram_memory.retrieval.lexical import LexicalDoc
from engram_memory.retrieval.projections import Projections
from engram_memory.store.core.crypto import open_sealed
from engram_memory.store.core.lifecycle import lexical_fields, record_context
from engram_memory.store.core.live import ScopeView, ScopeViews
from engram_memory.store.core.reads import ReadPath, SearchPlan, search_request_digest
from engram_memory.store.core.refusals import AdminUsageError
from engram_memory.store.core.timeutil import from_instant

HYBRID = "hybrid_v1"
REQUEST_OPTIONS = "the query, --purpose-ref, --limit, --max-packet-bytes and --minimum-channels"


# -- reading a receipt file ------------------------------------------------------------------------


@dataclass(frozen=True)
class Receipt:
    """A rank receipt, with the search response around it and the call's arguments when given."""

    rank_receipt: dict[str, Any]
    value: dict[str, Any] | None  # the search tool's whole ``value`` (None: the receipt alone)
    arguments: dict[str, Any]  # what the file carried of the call's arguments (the query, ...)

    @property
    def offset(self) -> int:
        """Where the receipt's page starts in the ranking (its first rank - 1)."""
        ranked = self.rank_receipt["ranked"]
        return int(ranked[0]["rank"]) - 1 if ranked else 0


def read_receipt(path: Path) -> Receipt:
    """A receipt file: the search ``value``, its ``rank_receipt``, the tool's envelope
    (``{"ok": true, "output": {"value": ...}}``) or ``{"arguments": {...}, "value": {...}}``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdminUsageError(f"--receipt {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AdminUsageError(f"--receipt {path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise AdminUsageError(f"--receipt {path} is not JSON ({exc.msg}, line {exc.lineno})") from None
    return parse_receipt(doc, str(path))


def parse_receipt(doc: Any, where: str = "the receipt") -> Receipt:
    arguments: dict[str, Any] = {}
    if isinstance(doc, dict) and isinstance(doc.get("output"), dict):
        doc = doc["output"].get("value")
    if isinstance(doc, dict) and isinstance(doc.get("value"), dict):
        if isinstance(doc.get("arguments"), dict):
            arguments = dict(doc["arguments"])
        doc = doc["value"]
    if isinstance(doc, dict) and isinstance(doc.get("rank_receipt"), dict):
        value, receipt = doc, doc["rank_receipt"]
    else:
        value, receipt = None, doc
    needed = ("request_digest", "profile", "system_as_of", "valid_as_of", "issued_at", "ranked", "channels",
              "fusion", "receipt_digest")
    if not isinstance(receipt, dict) or any(k not in receipt for k in needed):
        raise AdminUsageError(f"{where} holds no rank receipt (a search response's value, or its rank_receipt)")
    if not isinstance(receipt["ranked"], list) or not all(isinstance(e, dict) for e in receipt["ranked"]):
        raise AdminUsageError(f"{where}: rank_receipt.ranked is not a list of entries")
    names = [str(c.get("channel")) for c in receipt["channels"] if isinstance(c, dict)] \
        if isinstance(receipt["channels"], list) else []
    if sorted(names) != ["lexical", "semantic"]:
        raise AdminUsageError(f"{where}: rank_receipt.channels does not list the lexical and semantic channels")
    if not all(isinstance(e.get("record_id"), str) and isinstance(e.get("rank"), int) for e in receipt["ranked"]):
        raise AdminUsageError(f"{where}: an entry of rank_receipt.ranked lacks its record_id or rank")
    try:
        int(receipt["system_as_of"]), int(receipt["valid_as_of"]), from_instant(receipt["issued_at"])
    except (TypeError, ValueError):
        raise AdminUsageError(f"{where}: rank_receipt's system_as_of, valid_as_of or issued_at is malformed") from None
    return Receipt(receipt, value, arguments)


def given_arguments(receipt: Receipt, **given: Any) -> dict[str, Any]:
    """The search's arguments (the file's, then the options given), validated like the tool's
    input, every default filled in; the page_cursor is dropped (explain pins its own page)."""
    args = dict(receipt.arguments)
    args.update({k: v for k, v in given.items() if v is not None})
    args.pop("page_cursor", None)
    if "query" not in args:
        raise AdminUsageError("the receipt does not carry the query: give it with --query TEXT")
    if "purpose_ref" not in args:
        raise AdminUsageError("the receipt does not carry the purpose: give it with --purpose-ref REF")
    try:
        return to_plain(parse_input("search", args))
    except EngramError:
        raise AdminUsageError(f"these are not valid search arguments ({REQUEST_OPTIONS})") from None


def search_arguments(receipt: Receipt, **given: Any) -> dict[str, Any]:
    """``given_arguments``, checked against the receipt's request_digest: explain re-runs exactly
    the search the receipt answered, so a mismatch is the operator's mistake."""
    plain = given_arguments(receipt, **given)
    if search_request_digest(plain, receipt.rank_receipt["profile"]) != receipt.rank_receipt["request_digest"]:
        raise AdminUsageError(f"{REQUEST_OPTIONS} do not match the receipt's request_digest"
                              " (they must be the search's own)")
    return plain


# -- the store-less check --------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceiptCheck:
    checked: list[str]  # the fields recomputed from the receipt's content
    problems: list[str]  # one line per field that disagrees, naming it


def check_receipt(receipt: Receipt, arguments: Mapping[str, Any] | None = None) -> ReceiptCheck:
    """Recompute what the receipt's own content determines; name each field that disagrees."""
    r, problems = receipt.rank_receipt, []
    checked = ["receipt_digest", "ranks"] + (["request_digest"] if arguments is not None else [])
    if receipt_digest("rank-receipt", r) != r["receipt_digest"]:
        problems.append("rank_receipt.receipt_digest does not digest the receipt's content")
    if arguments is not None and search_request_digest(arguments, r["profile"]) != r["request_digest"]:
        problems.append("rank_receipt.request_digest does not digest the query and its arguments")
    ranked = r["ranked"]
    start = receipt.offset + 1
    for i, entry in enumerate(ranked):
        if entry.get("rank") != start + i:
            problems.append(f"rank_receipt.ranked[{i}].rank is {entry.get('rank')}, not {start + i}")
    semantic: dict[str, Any] = next((c for c in r["channels"] if c.get("channel") == "semantic"), {})
    if (r["profile"] == HYBRID) != bool(semantic.get("contributed")):
        problems.append(f"rank_receipt.profile {r['profile']} disagrees with the semantic channel's 'contributed'")
    for channel in ("lexical", "semantic"):
        found = [(i, e[channel]) for i, e in enumerate(ranked) if isinstance(e.get(channel), dict)]
        ranks = [c.get("rank") for _, c in found]
        if len(set(ranks)) != len(ranks):
            problems.append(f"rank_receipt.ranked: two entries share a {channel} rank")
        by_rank = sorted((c.get("rank", 0), -float(c.get("score", 0)), i) for i, c in found)
        for (_, s1, _), (_, s2, i2) in zip(by_rank, by_rank[1:], strict=False):
            if s2 < s1:  # a channel ranks by its own score, highest first
                problems.append(f"rank_receipt.ranked[{i2}].{channel}: its score is above a better-ranked entry's")
    # A lexical hit's analyzer is one the query was analysed with (the channel names them all).
    lexical_receipt: dict[str, Any] = next((c for c in r["channels"] if c.get("channel") == "lexical"), {})
    query_analyzers = str(lexical_receipt.get("analyzer", "")).rpartition("+")[0].split("|")
    checked.append("analyzers")
    for i, entry in enumerate(ranked):
        hit = entry.get("lexical")
        if isinstance(hit, dict) and "analyzer" in hit and hit["analyzer"] not in query_analyzers:
            problems.append(f"rank_receipt.ranked[{i}].lexical.analyzer {hit['analyzer']} is not one the"
                            " lexical channel names")
    # The semantic weight was scaled down exactly when the query is in a language the receipt's model
    # was not trained for (retrieval/embedder.py MODEL_LANGUAGES), and the fusion block names it then.
    checked.append("semantic_language")
    problems += _check_semantic_language(r, semantic, arguments)
    # The page shows the whole ranking when it starts it and nothing follows (no next page, or
    # every candidate ranked): then its ids are the ordered ids.
    whole = start == 1 and (r.get("candidate_count") == len(ranked) if receipt.value is None
                            else "next_page_cursor" not in receipt.value)
    if whole:
        checked.append("ordered_ids_digest")
        ids = [e.get("record_id") for e in ranked]
        if receipt_digest("recall-ordered", {"ordered_ids": ids}) != r["ordered_ids_digest"]:
            problems.append("rank_receipt.ordered_ids_digest does not digest the ranked record ids")
        if r.get("candidate_count") == len(ids):
            checked.append("candidate_ids_digest")
        if r.get("candidate_count") == len(ids) and receipt_digest(
                "recall-candidates", {"candidate_ids": sorted(ids)}) != r["candidate_ids_digest"]:
            problems.append("rank_receipt.candidate_ids_digest does not digest the ranked record ids")
    if receipt.value is not None:
        checked += ["records", "response_digest"]
        problems += _check_value(receipt.value, ranked)
    return ReceiptCheck(checked, problems)


def _check_semantic_language(r: Mapping[str, Any], semantic: Mapping[str, Any],
                             arguments: Mapping[str, Any] | None) -> list[str]:
    named = r["fusion"].get("semantic_language")
    trained = MODEL_LANGUAGES.get(str(semantic.get("model_id", "")))
    if named is not None and (trained is None or named in trained):
        return [f"rank_receipt.fusion.semantic_language {named} is a language the semantic channel's model reads"]
    if arguments is None or r["profile"] != HYBRID:
        return []
    fused = r["fusion"].get("method") != NO_FUSION
    expected = foreign_language(semantic.get("model_id"), str(arguments["query"])) if fused else None
    # a semantic hit shown means the channel's hits were scaled; with none shown, it may have had some
    shown = any(isinstance(e.get("semantic"), dict) for e in r["ranked"])
    if named != expected and (shown or named is not None):
        return [f"rank_receipt.fusion.semantic_language is {named or '(absent)'}; the query's language is"
                f" {identify(str(arguments['query']))}"]
    return []


def _check_value(value: dict[str, Any], ranked: list[dict[str, Any]]) -> list[str]:
    problems = []
    records = value.get("records", [])
    if len(records) != len(ranked):
        problems.append(f"records: {len(records)} packets for {len(ranked)} ranked entries")
    for i, (packet, entry) in enumerate(zip(records, ranked, strict=False)):
        record = packet.get("record") if isinstance(packet.get("record"), dict) else {}
        if record.get("record_id") != entry.get("record_id"):
            problems.append(f"records[{i}].record.record_id is not rank_receipt.ranked[{i}].record_id")
        for key in ("rank", "score"):
            if packet.get(key) != entry.get(key):
                problems.append(f"records[{i}].{key} is not rank_receipt.ranked[{i}].{key}")
    digest = value.get("response_digest")
    if isinstance(digest, str) and digest.startswith("sha256:"):
        body = canonical_bytes({k: v for k, v in value.items() if k != "response_digest"})
        if digest_bytes("recall-packet", body) != digest:
            problems.append("response_digest does not digest the response's content")
    return problems


# -- re-derivation ---------------------------------------------------------------------------------


@dataclass
class Explanation:
    scope_ref: str
    cursor: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # per ranked position, both sides
    differences: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)  # named by the receipt, forgotten since

    @property
    def matched(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {"scope_ref": self.scope_ref, "system_as_of": str(self.cursor), "matched": self.matched,
                "ranked": self.rows, "differences": self.differences, "forgotten": self.forgotten}


def infer_scope(engine: Any, receipt: Receipt) -> str | None:
    """The scope of the records the receipt ranks (a receipt does not name its scope)."""
    ids = [e["record_id"] for e in receipt.rank_receipt["ranked"] if isinstance(e.get("record_id"), str)]
    scopes = {r.scope_ref for r in engine.db.load_records(ids)} if ids else set()
    if len(scopes) == 1:
        return scopes.pop()
    known = engine.scopes()
    return known[0] if not scopes and len(known) == 1 else None


def records_at(engine: Any, scope_ref: str, cursor: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The scope's current records as of ``cursor`` (replayed from the journal), decrypted, and the
    ids of those current then whose content is gone since (forgotten: their keys are destroyed)."""
    live: dict[str, None] = {}
    for change in engine.db.journal_changes(scope_ref, 0, cursor):
        if change.current:  # accepted, or back to current (a resolve, a rewind)
            live[change.record_id] = None
        else:  # tombstoned, expired, disputed, superseded, trust revoked: out of the projections
            live.pop(change.record_id, None)
    records = {}
    for sealed in engine.db.load_records(list(live)):
        if sealed.scope_ref == scope_ref and sealed.body is not None:
            record = engine.lifecycle.load_record(sealed.record_id, sealed.key_ref, sealed.body)
            if record is not None:
                records[sealed.record_id] = record
    return records, sorted(rid for rid in live if rid not in records)


def stored_vectors(engine: Any, ids: list[str], model_digest: str | None) -> tuple[list[str], np.ndarray]:
    """The stored embeddings of ``ids`` for the model (sealed with each record's key), in id order."""
    sealed = engine.db.embeddings_of(ids, model_digest)
    out_ids, rows = [], []
    for rid in sorted(sealed):
        key_ref, blob = sealed[rid]
        dek = engine.keys.load(key_ref)
        if dek is not None:
            out_ids.append(rid)
            rows.append(np.frombuffer(open_sealed(dek, blob, record_context(rid)), dtype=np.float32))
    return out_ids, (np.vstack(rows) if rows else np.zeros((0, engine.projections.dim), np.float32))


def explain_on(engine: Any, receipt: Receipt, arguments: dict[str, Any], scope_ref: str | None) -> Explanation:
    """``explain_with`` on an engine an admin command opened (without the model): the scope named
    or inferred; the settings' embedding model loaded only when the receipt's semantic channel
    ranked, and named from its files when the receipt names it without having ranked with it."""
    ids = [e["record_id"] for e in receipt.rank_receipt["ranked"] if isinstance(e.get("record_id"), str)]
    if ids and not engine.db.load_records(ids):  # (a forgotten record keeps its row: its id is known)
        raise AdminUsageError(f"none of the {len(ids)} record(s) the receipt ranks is in this store: it is"
                              " a receipt of another store (name that store's --data-dir or --store)")
    if scope_ref is None:
        scope_ref = infer_scope(engine, receipt)
        if scope_ref is None:
            raise AdminUsageError("the receipt does not say which scope it ranked:"
                                  " name it with --scope TENANT/WORKSPACE")
    elif scope_ref not in engine.scopes():
        raise AdminUsageError(f"the store has no scope {scope_ref}")
    embedder = None
    from engram_memory.retrieval.embedder import model_directory

    model_path = model_directory(engine.config.model, engine.config.model_path)
    runtime = engine.config.embedder_runtime
    semantic = next(c for c in receipt.rank_receipt["channels"] if c.get("channel") == "semantic")
    if receipt.rank_receipt["profile"] == HYBRID:  # the query is embedded: the model is loaded
        from engram_memory.retrieval.embedder import shared_embedder

        # The runtime the receipt names ("torch-2.13.0", "onnxruntime-..."), else the given one.
        if str(semantic.get("model_runtime", "")).startswith("torch"):
            runtime = "torch"
        embedder = shared_embedder(model_path, None, runtime)
    elif "model_id" in semantic:  # named only (it was loading): its identity comes from the files
        from engram_memory.retrieval.embedder import Embedder

        embedder = Embedder(model_path, None, runtime)
    return explain_with(engine, receipt, arguments, scope_ref, embedder)


def explain_with(engine: Any, receipt: Receipt, arguments: dict[str, Any], scope_ref: str,
                 embedder: Any = None) -> Explanation:
    """Re-derive ``receipt`` on an open engine (its store, its settings); ``embedder`` encodes the
    query when the receipt's semantic channel ranked (it is waited for), and names the model when
    the receipt does. The response around the receipt, when the file carries it, is held to the
    receipt first (as ``check_receipt`` does): packets reordered under an intact receipt differ."""
    out = _rederive(engine, receipt, arguments, scope_ref, embedder)
    if receipt.value is not None:
        out.differences[:0] = _check_value(receipt.value, receipt.rank_receipt["ranked"])
    return out


def _rederive(engine: Any, receipt: Receipt, arguments: dict[str, Any], scope_ref: str,
              embedder: Any) -> Explanation:
    r = receipt.rank_receipt
    cursor = int(r["system_as_of"])
    out = Explanation(scope_ref, cursor)
    head = engine.db.projection_cursor(scope_ref)
    if cursor > head:
        out.differences.append(f"system_as_of {cursor} is past the scope's journal (cursor {head})")
        return out
    records, gone = records_at(engine, scope_ref, cursor)
    named = [e.get("record_id") for e in r["ranked"]]
    out.forgotten = [rid for rid in named if rid in gone]
    if out.forgotten:
        out.differences += [f"record {rid} has been forgotten since cursor {cursor}: the ranking can no longer"
                            " be re-derived" for rid in out.forgotten]
        return out
    semantic = next(c for c in r["channels"] if c["channel"] == "semantic")
    ranked_semantically = r["profile"] == HYBRID
    if ("model_id" in semantic or ranked_semantically) and embedder is None:
        out.differences.append("the receipt names an embedding model, and none is configured here")
        return out
    if ranked_semantically and not embedder.wait(600):
        out.differences.append("the receipt's semantic channel ranked, and the embedding model could not be loaded")
        return out
    with tempfile.TemporaryDirectory(prefix="engram-explain-") as tmp:
        projections = Projections(Path(tmp), dim=engine.projections.dim,
                                  hnsw_threshold=engine.projections.hnsw_threshold,
                                  lexical_config=engine.projections.lexical_config)
        try:
            rederived = _search(engine, receipt, arguments, scope_ref, records, projections,
                                embedder if "model_id" in semantic or ranked_semantically else None)
        finally:
            projections.close()
    if isinstance(rederived, str):
        out.differences.append(rederived)
        return out
    _compare(receipt, rederived, out)
    if gone and out.differences:  # the corpus it ranked in held records that are gone now
        out.differences += [f"record {rid}, current at cursor {cursor}, has been forgotten since: the scores"
                            " it shaped can no longer be re-derived" for rid in gone]
    return out


def _search(engine: Any, receipt: Receipt, arguments: dict[str, Any], scope_ref: str,
            records: dict[str, dict[str, Any]], projections: Projections, embedder: Any) -> dict[str, Any] | str:
    """The search path over projections rebuilt as of the receipt: the re-derived value, or why none."""
    r = receipt.rank_receipt
    cursor = int(r["system_as_of"])
    semantic = r["profile"] == HYBRID
    vectors = stored_vectors(engine, sorted(records), embedder.model_digest) if semantic else None
    docs = [LexicalDoc(rid, lexical_fields(records[rid])) for rid in sorted(records)]
    projections.rebuild(scope_ref, docs, vectors, cursor)
    view = ScopeView(cursor, {rid: engine._window(record) for rid, record in records.items()})
    path = ReadPath(
        projections=projections,
        fusion=engine.fusion,
        policy=engine.policy,
        channels=tuple(engine.config.channels),
        model_identity=(lambda: (embedder.model_id, embedder.model_digest, embedder.runtime))
        if embedder is not None else (lambda: (None, None, None)),
        view=lambda _scope: view,
        load_page=lambda _scope, ids: {rid: records[rid] for rid in ids if rid in records},
        server_secret=engine.keys.server_secret,
        cache=ScopeViews(),
        rerank=engine.turns if engine.config.rerank else None,
    )
    tenant, _, workspace = scope_ref.partition("/")
    ctx = HostContext(tenant=tenant.removeprefix("tenant:"), workspace=workspace.removeprefix("workspace:"),
                      principal="explain", agent_id="explain", purpose_ref=arguments["purpose_ref"])
    args = dict(arguments)
    if receipt.offset:  # a later page: pinned to the receipt's ranking, as the agent's cursor pinned it
        pin = paging.PagePin(r["request_digest"], r["profile"], int(r["valid_as_of"]), str(cursor),
                             receipt.offset, r["ordered_ids_digest"])
        args["page_cursor"] = paging.encode(engine.keys.server_secret, scope_ref, pin)
    query_vector = embedder.encode([arguments["query"]], kind="query")[0] if semantic else None
    now = from_instant(r["issued_at"])
    plan = SearchPlan(semantic, query_vector)
    try:
        return path.search(ctx, args, now, plan)
    except EngramError as exc:
        if exc.code != "STALE_PAGE":
            return f"the re-derived search answers {exc.code}, not this receipt"
    # The re-derived ranking is not the one the page was cut from: pin the page to it instead.
    args.pop("page_cursor")
    first = path.search(ctx, args, int(r["valid_as_of"]), plan)["rank_receipt"]
    pin = paging.PagePin(r["request_digest"], r["profile"], int(r["valid_as_of"]), str(cursor),
                         receipt.offset, first["ordered_ids_digest"])
    args["page_cursor"] = paging.encode(engine.keys.server_secret, scope_ref, pin)
    try:
        return path.search(ctx, args, now, plan)
    except EngramError as exc:
        return f"the re-derived search answers {exc.code}, not this receipt"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def _compare(receipt: Receipt, value: dict[str, Any], out: Explanation) -> None:
    mine, theirs = receipt.rank_receipt, value["rank_receipt"]
    diffs = out.differences
    for key in sorted(set(mine) | set(theirs)):
        if key in ("ranked", "channels"):
            continue
        if mine.get(key) != theirs.get(key):
            diffs.append(f"{key}: receipt {_short(mine.get(key, '(absent)'))},"
                         f" re-derived {_short(theirs.get(key, '(absent)'))}")
    channels = {c.get("channel"): c for c in theirs["channels"]}
    for channel in mine["channels"]:
        again = channels.get(channel.get("channel"), {})
        for key in sorted(set(channel) | set(again)):
            if channel.get(key) != again.get(key):
                diffs.append(f"channels.{channel.get('channel')}.{key}: receipt {_short(channel.get(key, '(absent)'))},"
                             f" re-derived {_short(again.get(key, '(absent)'))}")
    got = theirs["ranked"]
    for i in range(max(len(mine["ranked"]), len(got))):
        a = mine["ranked"][i] if i < len(mine["ranked"]) else None
        b = got[i] if i < len(got) else None
        rank = (a or b or {}).get("rank")
        row = {"rank": rank, "record_id": (a or {}).get("record_id"), "rederived_record_id": (b or {}).get("record_id"),
               "score": (a or {}).get("score"), "rederived_score": (b or {}).get("score"), "matched": a == b}
        out.rows.append({k: v for k, v in row.items() if v is not None})  # a side that has no such rank: absent
        if a is None or b is None:
            diffs.append(f"rank {rank}: receipt {a['record_id'] if a else '(none)'},"
                         f" re-derived {b['record_id'] if b else '(none)'}")
            continue
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diffs.append(f"rank {rank} {key}: receipt {_short(a.get(key, '(absent)'))},"
                             f" re-derived {_short(b.get(key, '(absent)'))}")
    if receipt.value is not None:
        for key in ("next_page_cursor", "response_digest"):
            if key in receipt.value and receipt.value.get(key) != value.get(key):
                diffs.append(f"{key}: the response's differs from the re-derived one")
