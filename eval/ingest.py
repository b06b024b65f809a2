"""Ingest a BEIR collection through the real engine: capture, then admission, as the host.

One BEIR document is one capture. Two mappings are supported so their indexing can be compared:

* ``single`` -- one ``context`` component, text = title + "\\n" + text (the primary component).
* ``split``  -- the title as the primary component and the text as a second component, both
  ``context``; documents without a title (Medline) get the single mapping.

Both map to the same embedding text (the engine joins component texts with "\\n"), so the
semantic channel is identical and only the lexical document differs.

The store is cached under ``cache_root/<dataset>-<mapping>-<limit>-<fingerprint>``: the
fingerprint hashes the selected documents, the harness' mapping version and the engine's
admission policy id@version, so an edited corpus, another subset or another policy can never
be served from a stale store. A store is reused only if
its ``manifest.json`` -- written after ingest *and* embedding completed -- matches; anything
else is wiped and rebuilt. Embeddings live in the store's DuckDB keyed by record and model
digest, so reusing the store skips re-embedding (and a new model re-embeds by itself).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm import tqdm

from engram_memory.eval.beir import Collection, Doc, truncate_utf8
from engram_memory.models.context import HostContext
from engram_memory.models.limits import ENCODE_THREADS, TEXT_MAX_BYTES, TURN_TYPES
from engram_memory.models.settings import DEFAULT_MODEL, Channel
from engram_memory.models.tools import parse_input, to_plain

INGEST_VERSION = 3  # bump when the doc -> capture mapping changes: it keys the cache (3: turns are typed)
MAPPINGS = ("single", "split")
CHANNEL_SETS: dict[str, tuple[Channel, ...]] = {
    "lexical": ("lexical",),
    "semantic": ("semantic",),
    "hybrid": ("lexical", "semantic"),
}
PURPOSE = "purpose:eval"
VALID_FROM_MS = 1_577_836_800_000  # 2020-01-01T00:00:00Z: every record is valid "now"
TURN_TYPE = TURN_TYPES[0]  # how the harness, as a host, marks a conversation turn
EMBED_TIMEOUT_S = 600.0


def host_context(dataset: str) -> HostContext:
    """The harness is the host: one tenant, one workspace per collection."""
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in dataset)[:100] or "collection"
    return HostContext(tenant="eval", workspace=safe, principal="harness", agent_id="eval-harness",
                       purpose_ref=PURPOSE)


def _sha(data: str) -> str:
    return "sha256:" + hashlib.sha256(data.encode("utf-8")).hexdigest()


def doc_text(doc: Doc) -> str:
    return f"{doc.title}\n{doc.text}" if doc.title else doc.text


# LoCoMo's session line ("session 3, 7:55 pm on 9 June, 2023"): when the conversation happened.
_SESSION_TIME = re.compile(r"(\d{1,2}:\d{2}\s*[ap]m) on (\d{1,2} [A-Za-z]+),? (\d{4})", re.IGNORECASE)


def event_at(doc: Doc, position: int) -> int:
    """A document's ``primary_event.at``: the instant its title names (a LoCoMo session line) plus
    its corpus position in milliseconds, so a conversation's turns keep their order; a document
    whose title names no time (SciFact, Cranfield, Medline) gets the one shared VALID_FROM_MS, so
    a collection of documents has no event order (retrieval/rerank.py's neighbours are none)."""
    m = _SESSION_TIME.search(doc.title)
    if m is None:
        return VALID_FROM_MS
    try:
        when = datetime.strptime(" ".join(m.groups()).upper(), "%I:%M %p %d %B %Y").replace(tzinfo=UTC)
    except ValueError:
        return VALID_FROM_MS
    return int(when.timestamp()) * 1000 + position


def is_turn(doc: Doc) -> bool:
    """A LoCoMo dialogue turn (its title names its session's time), as a host would mark one."""
    return _SESSION_TIME.search(doc.title) is not None


def capture_args(dataset: str, doc: Doc, mapping: str = "single", at: int = VALID_FROM_MS) -> dict[str, Any]:
    """A valid capture for one document (plain dict, the shape models.tools.to_plain produces);
    ``at`` is its event time (``event_at``). A dialogue turn is typed as one (``event:turn``, the
    engine's default turn type), as the README tells a host to capture conversations."""
    if mapping not in MAPPINGS:
        raise ValueError(f"unknown mapping {mapping!r}")
    body = truncate_utf8(doc_text(doc) or doc.doc_id, TEXT_MAX_BYTES)  # Text needs >= 1 byte
    if mapping == "split" and doc.title and doc.text:
        components = [
            {"component_id": "title", "kind": "context", "text": truncate_utf8(doc.title, TEXT_MAX_BYTES),
             "citation_ids": ["s1"]},
            {"component_id": "body", "kind": "context", "text": truncate_utf8(doc.text, TEXT_MAX_BYTES),
             "citation_ids": ["s1"]},
        ]
        primary = "title"
    else:
        components = [{"component_id": "doc", "kind": "context", "text": body, "citation_ids": ["s1"]}]
        primary = "doc"
    source_ref = f"beir:{dataset}:{doc.doc_id}"
    payload = {
        "schema_version": 2,
        "purpose_ref": PURPOSE,
        "valid_time": {"t": VALID_FROM_MS},
        "components": components,
        "primary_component_id": primary,
        "primary_event": {"at": at, "type_ref": TURN_TYPE if is_turn(doc) else "event:published",
                          "citation_id": "s1"},
        "citations": [
            {
                "citation_id": "s1",
                "source_ref": source_ref,
                "locator": {"scheme": "beir-doc-id", "value": doc.doc_id},
                "content_digest": _sha(body),
            }
        ],
    }
    # Content in the key: a retried ingest replays exactly, an edited doc is a new capture.
    key = hashlib.sha256(f"{INGEST_VERSION}\0{mapping}\0{source_ref}\0{at}\0{body}".encode()).hexdigest()[:40]
    return {
        "idempotency_key": f"eval-capture-{key}",
        "payload": payload,
        "evidence": {"evidence_ref": source_ref, "evidence_digest": _sha("evidence\0" + body),
                     "citation_ids": ["s1"]},
    }


def admission_args(candidate_id: str) -> dict[str, Any]:
    return {"candidate_id": candidate_id, "idempotency_key": "eval-admit-" + candidate_id[-40:]}


def validated(tool: str, args: dict[str, Any]) -> Any:
    """The input model the server's own parser makes of the arguments (what an agent could send)."""
    return parse_input(tool, args)


@dataclass
class IngestResult:
    store_dir: Path
    doc_to_record: dict[str, str]
    rejected: list[str]  # doc ids the admission policy did not accept
    reused: bool
    seconds: float = 0.0
    capture_s: list[float] = field(default_factory=list)  # per-op latencies (fresh ingest only)
    admit_s: list[float] = field(default_factory=list)

    @property
    def record_to_doc(self) -> dict[str, str]:
        return {r: d for d, r in self.doc_to_record.items()}


def admission_policy_ref() -> str:
    """The engine's admission policy id and version: which docs are admitted depends on it."""
    from engram_memory.store.screen.policy import POLICY_ID, POLICY_VERSION

    return f"{POLICY_ID}@{POLICY_VERSION}"


def store_key(col: Collection, mapping: str) -> str:
    """The cached store's folder name; a run with another model than the default has its own store
    (a store keeps the model it was created with: store/core/embedding_model.py)."""
    key = f"{INGEST_VERSION}\0{mapping}\0{admission_policy_ref()}\0{col.fingerprint}"
    if _MODEL.get("model", DEFAULT_MODEL) != DEFAULT_MODEL:
        key += f"\0{_MODEL['model']}"
    fp = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{col.name}-{mapping}-{col.limit_docs or 'all'}-{fp}"


# A PostgreSQL store every engine of this run opens (set_store): the store dir then holds only
# the node's projections and the manifest. Empty: DuckDB in the store dir.
_STORE: dict[str, Any] = {}


def set_store(url: str, master_key_file: Path) -> None:
    _STORE.update(store=url, master_key_file=master_key_file)


def set_model(name: str) -> None:
    """The embedding model every engine of this run loads (EngineSettings.model; unset: the default).
    Vectors are keyed by the model's digest: a store cached for another model re-embeds by itself."""
    _MODEL.update(model=name)


_MODEL: dict[str, Any] = {}  # the run's embedding model (set_model); empty: the engine's default


def store_options() -> dict[str, Any]:
    """The store every engine of this run opens (``store``, ``master_key_file``; empty: DuckDB)."""
    return dict(_STORE)


def engine_config(store_dir: Path, channels: str = "hybrid", **overrides: Any) -> Any:
    from engram_memory.models.settings import EngineSettings

    overrides = {**_STORE, **_MODEL, **overrides}
    if _TORCH_THREADS:
        overrides = {"encode_threads": _TORCH_THREADS[0], **overrides}
    # A channel scored alone is the channel's own ranking (the rows beside bm25s and LanceDB's);
    # the rerank stage runs on the hybrid, as the engine ships.
    overrides = {"rerank": channels == "hybrid", **overrides}
    return EngineSettings(data_dir=store_dir, channels=CHANNEL_SETS[channels], **overrides)


@contextmanager
def open_engine(store_dir: Path, channels: str = "hybrid", **overrides: Any) -> Iterator[Any]:
    """An engine whose ranking uses only ``channels`` (EngineSettings.channels), ready to search."""
    from engram_memory.store.core.engine import Engine

    engine = Engine.open(engine_config(store_dir, channels, **overrides))
    try:
        if engine.embedder is not None and CHANNEL_SETS[channels] != ("lexical",):
            wait_embedder(engine)
            # Embeds whatever was admitted while the model was loading (a lexical-only ingest,
            # a new model digest), here rather than inside the first timed search.
            engine.wait_semantic(None)
        yield engine
    finally:
        engine.close()


_TORCH_THREADS: list[int] = []  # the count set_torch_threads chose, passed to every engine


def set_torch_threads(threads: int | None) -> int:
    """The model's intra-op threads (None: the engine's default, EngineSettings.encode_threads);
    returns the count in effect. Engines opened afterwards get it (ONNX Runtime per session; torch,
    process-wide, when the reference runtime is loaded: the default install has no torch).

    On a 2-core box shared with other work, one thread per core makes a single-query encode spin:
    we measured ~400 ms instead of ~12-15 ms with one thread while another process held a core.
    Results record the count.
    """
    count = int(threads) if threads is not None else ENCODE_THREADS
    _TORCH_THREADS[:] = [count]
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(count)
    return count


def wait_embedder(engine: Any, timeout: float = EMBED_TIMEOUT_S) -> None:
    engine.embedder.wait(timeout)
    if engine.embedder.state != "ready":
        raise RuntimeError(f"embedding model not ready (state {engine.embedder.state!r})")


def _manifest(col: Collection, mapping: str) -> dict[str, Any]:
    manifest = {"ingest_version": INGEST_VERSION, "dataset": col.name, "mapping": mapping,
                "limit_docs": col.limit_docs, "fingerprint": col.fingerprint, "docs": len(col.docs),
                "admission_policy": admission_policy_ref()}
    if _STORE:  # a cache built on one store is never reused on another (DuckDB manifests unchanged)
        from engram_memory.store.opening import shared

        manifest["store"] = shared(_STORE["store"]).redact_url(_STORE["store"])
    return manifest


def load_or_ingest(
    col: Collection,
    cache_root: Path,
    mapping: str = "single",
    batch_size: int = 256,
    progress: bool = True,
    announce: Callable[[str], None] | None = None,
    **engine_overrides: Any,
) -> IngestResult:
    """Reuse the cached store for exactly these documents, or build it (see module doc).

    ``announce`` gets a status line before the slow silent part (opening the store and loading
    the embedding model, before the ingest bar can move).
    """
    say = announce or (lambda _message: None)
    store_dir = Path(cache_root) / store_key(col, mapping)
    manifest_path = store_dir / "manifest.json"
    expected = _manifest(col, mapping)
    semantic = engine_overrides.get("semantic", True)
    model = "loading the embedding model" if semantic else "lexical only"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if {k: manifest.get(k) for k in expected} == expected:
            say(f"reusing the store {store_dir} (no ingest); {model}")
            # Opening runs recover(): a changed model digest is re-embedded there, not served stale.
            with open_engine(store_dir, "hybrid", **engine_overrides):
                pass
            return IngestResult(store_dir, manifest["doc_to_record"], manifest["rejected"], reused=True)
    shutil.rmtree(store_dir, ignore_errors=True)  # partial or foreign: never resume into it
    store_dir.mkdir(parents=True)
    say(f"new store {store_dir}: {model}, then ingesting {len(col.docs):,} docs (capture + admission)")
    with open_engine(store_dir, "hybrid", **engine_overrides) as engine:
        result = ingest(engine, col, mapping, store_dir, batch_size, progress)
    manifest_path.write_text(json.dumps({**expected, "doc_to_record": result.doc_to_record,
                                         "rejected": result.rejected}, indent=1))
    return result


def ingest(
    engine: Any,
    col: Collection,
    mapping: str,
    store_dir: Path,
    batch_size: int = 256,
    progress: bool = True,
) -> IngestResult:
    """Capture + admit every document; projection updates (index commit, embedding) once per batch."""
    ctx = host_context(col.name)
    doc_to_record: dict[str, str] = {}
    rejected: list[str] = []
    capture_s: list[float] = []
    admit_s: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(total=len(col.docs), desc=f"ingest {col.name}", unit="doc", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    for start in range(0, len(col.docs), batch_size):
        chunk: Sequence[Doc] = col.docs[start:start + batch_size]
        # Each batch is admitted as it goes, but the Tantivy commit and the embedding of the
        # admitted records happen once at the batch exit (Engine.batch), so the bar stalls there.
        with engine.batch():
            for position, doc in enumerate(chunk, start=start):
                args = validated("capture", capture_args(col.name, doc, mapping, event_at(doc, position)))
                t = time.perf_counter()
                cap = to_plain(engine.capture(ctx, args))
                capture_s.append(time.perf_counter() - t)
                t = time.perf_counter()
                adm = to_plain(engine.request_admission(ctx, validated("request_admission",
                                                                       admission_args(cap["candidate_id"]))))
                admit_s.append(time.perf_counter() - t)
                outcome = adm.get("outcome", adm)
                if outcome.get("status") == "accepted" or (outcome.get("record_id") and
                                                           outcome.get("status") == "duplicate_exact"):
                    doc_to_record[doc.doc_id] = outcome["record_id"]
                else:
                    rejected.append(doc.doc_id)
                bar.update(1)
            bar.set_postfix_str("indexing + embedding batch")
        bar.set_postfix_str("")
    bar.close()
    return IngestResult(store_dir, doc_to_record, rejected, reused=False, seconds=time.perf_counter() - t0,
                        capture_s=capture_s, admit_s=admit_s)
