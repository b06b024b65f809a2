"""Export a scope's current records to a JSON Lines file, and import such a file -- or the official
MCP memory server's knowledge graph (``memory.json``) -- through capture and admission.

Export (``admin export``) writes a header line, then one line per current record, in journal order:
the record's id, state, digests, capture instant and cursor, the evidence digest its trust receipt
names, and its payload (every field of a capture payload: components, citations, valid time,
retention, reconciliation). Never a key, a key reference or a sealed body. Forgotten, expired,
withdrawn, rejected and pending items are not records of the scope's present: none is written.

Import (``admin import``) reads the whole file first (a malformed file changes nothing), then sends
every item through the engine's own ``capture`` and ``request_admission`` with a host context of
the scope, as an agent's memory would go: the admission policy decides (a secret is rejected,
content forgotten in the scope waits for an operator). Idempotency keys are derived from each
item's content, so importing a file twice changes nothing the second time; an item whose payload
is already a current record of the scope is not captured again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from engram_memory.models.canonical import CanonicalizationError, canonical_bytes, canonical_text
from engram_memory.models.context import HostContext
from engram_memory.models.digests import payload_digest
from engram_memory.models.errors import EngramError
from engram_memory.models.states import RecordState
from engram_memory.models.tools import CaptureInput, Payload, RequestAdmissionInput, parse_input
from engram_memory.store.core.keyreserve import KeyReserve
from engram_memory.store.core.lifecycle import BatchItem, BatchOutcome
from engram_memory.store.core.refusals import AdminUsageError
from engram_memory.store.host.import_checks import UNPAIRED, _check_args, _refusal
from engram_memory.store.host.import_worker import Answer, Check, ImportWorker, import_worker
from engram_memory.store.screen.policy import screen_cache, secret_kind
from engram_memory.store.screen.secrets import find_secret

EXPORT_FORMAT = "engram-memory-export"
EXPORT_VERSION = 1
GRAPH_FORMAT = "mcp-memory-graph"
PAYLOAD_FIELDS = tuple(Payload.model_fields)  # what a record carries of its capture payload
# The host context every import captures under: one principal, so its idempotency ledger entries
# (keyed by scope and principal) make a second import of the same items a replay.
IMPORT_PRINCIPAL = "admin-import"
IMPORT_PURPOSE = "purpose:import"
# A knowledge graph has no time: its items are valid from the epoch, a constant, so an item's
# payload -- and the idempotency key derived from it -- is the same at every import.
GRAPH_VALID_FROM = 0
GRAPH_SOURCE = "memory-graph"
MAX_LISTED = 200  # items named per outcome in a report (the counts are always whole)
# An import indexes what it admitted every this many items (one projection update each): memory
# stays bounded on a large file, and an interrupted import has indexed all but the last chunk.
INDEX_EVERY = 2000
# An import commits this many items in one transaction (their screen and decision still one by one):
# one commit, one journal append and one sync of the new data keys per batch instead of per item.
BATCH = 500
# The store's cache during an import (DuckDB's memory_limit): it would otherwise keep every block the
# import wrote, ~12 MiB per 1,000 items (a 50,000-item import peaked at 775 MiB).
IMPORT_STORE_CACHE_MIB = 64
FIRST_BATCH = 50  # the first batch of an import; each next one as large as all before it, up to BATCH


def import_context(scope_ref: str) -> HostContext:
    from engram_memory.models.context import scope_names

    names = scope_names(scope_ref)
    assert names is not None, scope_ref
    tenant, workspace = names
    return HostContext(tenant=tenant, workspace=workspace, principal=IMPORT_PRINCIPAL, agent_id=IMPORT_PRINCIPAL,
                       purpose_ref=IMPORT_PURPOSE, session="admin-import")


def _sha(data: str | bytes) -> str:  # (a str with an unpaired surrogate: UnicodeEncodeError)
    return "sha256:" + hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


# -- export -------------------------------------------------------------------------------------


def export_lines(engine: Any, scope_ref: str, scope: str, now_instant: str) -> list[dict[str, Any]]:
    """The header and one line per current record of the scope, oldest capture first."""
    records = sorted(engine.live_records(scope_ref), key=lambda r: (int(r["recorded_cursor"]), r["record_id"]))
    header = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "scope": scope, "exported_at": now_instant,
              "records": len(records)}
    return [header, *({
        "record_id": r["record_id"],
        "state": RecordState.ACCEPTED_CURRENT.value,
        "record_digest": r["record_digest"],
        "payload_digest": r["payload_digest"],
        "recorded_at": r["recorded_at"],
        "recorded_cursor": r["recorded_cursor"],
        "evidence_digest": r["trust"]["evidence_digest"],
        "payload": {name: r[name] for name in PAYLOAD_FIELDS if name in r},
    } for r in records)]


def write_lines(path: Path, lines: list[dict[str, Any]]) -> int:
    """Write the lines (canonical JSON, one per line) to a new file, 0600: it holds memory content
    in the clear. Written beside it and renamed, so a failure leaves no half file; returns its size."""
    tmp = path.with_name(f".{path.name}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            for line in lines:
                out.write(canonical_bytes(line) + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.link(tmp, path)  # never replaces a file that appeared meanwhile
    finally:
        tmp.unlink(missing_ok=True)
    return path.stat().st_size


# -- reading an import file ---------------------------------------------------------------------


class Item:
    """One thing to capture: where it came from (never its content) and its capture arguments,
    or why it cannot be one (an item the contract refuses; the file itself is well formed).

    The arguments are held as compact JSON (UTF-8; ASCII-escaped where a string holds an unpaired
    surrogate, so any string round-trips exactly) and decoded when asked for: a whole file's items
    are read before the import, and as dicts 50,000 of them took ~150 MiB. The label may be given
    as a function, called the first time a report names the item (a graph item's names each the
    secrets screen: ~1 s for 5,000 entities that no report mentions)."""

    __slots__ = ("_args", "_label", "problem")

    def __init__(self, label: str | Callable[[], str], args: dict[str, Any] | None = None,
                 problem: str | None = None) -> None:
        self._label = label
        self.problem = problem
        self._args = None if args is None else _compact(args)

    @property
    def label(self) -> str:
        if not isinstance(self._label, str):
            self._label = self._label()
        return self._label

    @property
    def args(self) -> dict[str, Any] | None:
        return None if self._args is None else dict(json.loads(self._args))

    def __repr__(self) -> str:
        return f"Item({self.label!r}, problem={self.problem!r})"


def _compact(args: dict[str, Any]) -> bytes:
    """``args`` as compact JSON: orjson's, unless json writes it differently -- an unpaired
    surrogate or an integer past 64 bits (orjson refuses them) or a NaN or infinity (a file's
    ``NaN``, which orjson would write as ``null``)."""
    try:
        out = orjson.dumps(args)
    except orjson.JSONEncodeError:
        out = b"null"
    if b"null" in out:
        return json.dumps(args, separators=(",", ":")).encode("ascii")
    # A copy: each bytes object orjson returns keeps ~4 KiB of the heap behind it however short
    # it is (50,000 items held 200 MiB more than json's bytes of the same length).
    return bytes(memoryview(out))


MAX_LINE_BYTES = 4 * 1024 * 1024  # one line of a JSON Lines file (a capture's arguments are at most 1 MiB)
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # one JSON object spread over lines (a pretty-printed read_graph)
BOM = b"\xef\xbb\xbf"
READ_EVERY = 10_000  # lines read between two progress reports while a file is read
DIGEST_MISMATCH = "DIGEST_MISMATCH: the payload does not match its payload_digest"


def open_regular(path: Path) -> BinaryIO:
    """The file for reading, if it is a regular file: a directory, a device (/dev/zero) or a FIFO
    is refused in one line before anything is read (a FIFO is opened without blocking)."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise AdminUsageError(f"{path} is a directory, not a file to import")
        if not stat.S_ISREG(mode):
            raise AdminUsageError(f"{path} is not a regular file (a device, FIFO or socket): import reads files only")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise AdminUsageError(f"cannot read {path}: no such file") from None
    except OSError as exc:
        raise AdminUsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between the two looks
        os.close(fd)
        raise AdminUsageError(f"{path} is not a regular file (a device, FIFO or socket): import reads files only")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _decode(path: Path, number: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AdminUsageError(f"{path} line {number} is not UTF-8 text") from None


def _raw_lines(path: Path, fh: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(number, bytes) of each line, split on "\n" only (U+2028, U+2029 and U+0085 are text, as in
    JSON); a leading BOM dropped; a line longer than MAX_LINE_BYTES refused."""
    number = 0
    while raw := fh.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise AdminUsageError(f"{path} line {number} is longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB"
                                  " (expected one JSON object per line)")
        yield number, raw.removeprefix(BOM) if number == 1 else raw


def _lines(path: Path, reading: Callable[[int], None]) -> Iterator[tuple[int, Any]]:
    """(number, value) of each non-blank line, streamed (``reading`` hears every READ_EVERY lines).
    A file whose first line is not JSON but whose whole text is one JSON object (pretty-printed, as
    read_graph answers) is that one object."""
    with open_regular(path) as fh:
        first = True
        for number, raw in _raw_lines(path, fh):
            if number % READ_EVERY == 0:
                reading(number)
            if not raw.strip():
                continue
            text = _decode(path, number, raw)
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                whole = _whole(fh) if first else None
                if whole is None:
                    raise AdminUsageError(f"{path} line {number} is not JSON (expected one JSON object per line,"
                                          " or one JSON object)") from None
                yield number, whole
                return
            first = False
            yield number, value


def _whole(fh: BinaryIO) -> dict[str, Any] | None:
    """The whole file as one JSON object, or None when it is not one (at most MAX_DOCUMENT_BYTES)."""
    fh.seek(0)
    data = fh.read(MAX_DOCUMENT_BYTES + 1)
    if len(data) > MAX_DOCUMENT_BYTES:
        return None
    try:
        value = json.loads(data.removeprefix(BOM).decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class Source:
    """What an import file holds, read and checked whole before anything is imported."""

    format: str
    items: list[Item]
    scope: str | None = None  # an export's header scope (TENANT/WORKSPACE)
    notes: list[str] = field(default_factory=list)  # what --allow-partial let through


def read_items(path: Path, *, allow_partial: bool = False,
               reading: Callable[[int], None] = lambda lines: None) -> Source:
    """The file's format and its items, detected by content; raises AdminUsageError (naming the
    first bad line) for a file that is neither format, before anything is imported. An export is
    checked whole: the header's record count and every line's payload_digest (``allow_partial``:
    a mismatching line becomes an invalid item, a short file a note)."""
    lines = _lines(path, reading)
    first = next(lines, None)
    if first is None:
        raise AdminUsageError(f"{path} holds no items")
    first_number, head = first
    if isinstance(head, dict) and ("entities" in head or "relations" in head) and "type" not in head:
        if next(lines, None) is not None:
            raise AdminUsageError(f"{path}: a whole graph ({{\"entities\": ...}}) must be the file's only JSON value")
        return Source(GRAPH_FORMAT, _graph_object(path, head))  # a whole graph, as read_graph answers it
    if isinstance(head, dict) and "format" in head:
        if head.get("format") != EXPORT_FORMAT or head.get("version") != EXPORT_VERSION:
            raise AdminUsageError(f"{path} line {first_number}: not an {EXPORT_FORMAT} version {EXPORT_VERSION}"
                                  " header")
        return _export_source(path, first_number, head, lines, allow_partial)
    if isinstance(head, dict) and head.get("type") in ("entity", "relation"):
        items = _graph_line(path, first_number, head)
        for n, obj in lines:
            items.extend(_graph_line(path, n, obj))
        return Source(GRAPH_FORMAT, items)
    raise AdminUsageError(f"{path} line {first_number}: neither an {EXPORT_FORMAT} header nor a memory graph"
                          ' line ({"type": "entity"|"relation", ...})')


def _export_source(path: Path, number: int, head: dict[str, Any], lines: Iterator[tuple[int, Any]],
                   allow_partial: bool) -> Source:
    from engram_memory.models.context import scope_names

    scope, count = head.get("scope"), head.get("records")
    scope_ref = None
    if isinstance(scope, str):
        tenant, _sep, workspace = scope.partition("/")
        scope_ref = f"tenant:{tenant}/workspace:{workspace}"
    if scope_ref is None or scope_names(scope_ref) is None or type(count) is not int or count < 0:
        raise AdminUsageError(f"{path} line {number}: the header names no scope (TENANT/WORKSPACE) or no record"
                              " count")
    partial = " (--allow-partial imports the lines that check)"
    items, notes = [], []
    for n, obj in lines:
        item = _export_item(path, n, obj, scope_ref)
        if item.problem == DIGEST_MISMATCH and not allow_partial:
            raise AdminUsageError(f"{path} {item.label}: the payload does not match its payload_digest (edited or"
                                  f" damaged); nothing imported{partial}")
        items.append(item)
    if len(items) != count:
        short = f"{path}: the header says {count} record(s), the file holds {len(items)}" + \
            (" (truncated?)" if len(items) < count else "")
        if not allow_partial:
            raise AdminUsageError(f"{short}; nothing imported{partial}")
        notes.append(short)
    return Source(f"{EXPORT_FORMAT}/{EXPORT_VERSION}", items, scope, notes)


def _export_item(path: Path, number: int, obj: Any, scope_ref: str) -> Item:
    """One exported record; DIGEST_MISMATCH when its payload is not the one its payload_digest
    names (bound to the export's scope, as the source store computed it)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("payload"), dict):
        raise AdminUsageError(f"{path} line {number}: not an exported record (an object with a payload)")
    record_id = obj.get("record_id")
    label = f"line {number}" + (f" ({record_id})" if isinstance(record_id, str) and len(record_id) < 128 else "")
    payload = obj["payload"]
    try:
        if payload_digest({**payload, "scope_ref": scope_ref}) != obj.get("payload_digest"):
            return Item(label, problem=DIGEST_MISMATCH)
    except (ValueError, TypeError, RecursionError) as exc:
        return Item(label, problem=UNPAIRED if isinstance(exc, CanonicalizationError) else DIGEST_MISMATCH)
    if obj.get("state", RecordState.ACCEPTED_CURRENT.value) != RecordState.ACCEPTED_CURRENT.value:
        return Item(label, problem="not a current record")
    evidence_digest = obj.get("evidence_digest")
    if not isinstance(evidence_digest, str):
        evidence_digest = _sha(canonical_text(payload))
    primary = payload.get("primary_event")
    citation = primary.get("citation_id") if isinstance(primary, dict) else None
    evidence = {"evidence_ref": f"import:{EXPORT_FORMAT}" + (f":{record_id}" if isinstance(record_id, str) else ""),
                "evidence_digest": evidence_digest, "citation_ids": [citation]}
    return Item(label, {"payload": payload, "evidence": evidence})


def _name(text: str) -> str:
    """An entity name as a report shows it: withheld when it looks like a secret itself."""
    return "(name withheld)" if find_secret(text) else repr(text[:80])


def _observation_label(number: int, shown: Callable[[], str], k: int) -> Callable[[], str]:
    return lambda: f"line {number} entity {shown()} observation {k}"


def _graph_capture(text: str, type_ref: str, source_ref: str, evidence_of: dict[str, Any]) -> dict[str, Any]:
    payload = {
        "schema_version": 2,
        "purpose_ref": IMPORT_PURPOSE,
        "valid_time": {"t": GRAPH_VALID_FROM},
        "components": [{"component_id": "c1", "kind": "context", "text": text, "citation_ids": ["s1"]}],
        "primary_component_id": "c1",
        "primary_event": {"at": GRAPH_VALID_FROM, "type_ref": type_ref, "citation_id": "s1"},
        "citations": [{"citation_id": "s1", "source_ref": source_ref,
                       "locator": {"scheme": GRAPH_SOURCE, "value": evidence_of["type"]},
                       "content_digest": _sha(text)}],
        "retention": {"derivative_rule": "make-ineligible"},
        "reconciliation": {"family_refs": []},
    }
    evidence = {"evidence_ref": f"import:{GRAPH_SOURCE}", "evidence_digest": _sha(canonical_text(evidence_of)),
                "citation_ids": ["s1"]}
    return {"payload": payload, "evidence": evidence}


def _strings(obj: dict[str, Any], names: tuple[str, ...]) -> bool:
    return all(isinstance(obj.get(name), str) for name in names)


def _graph_item(label: Callable[[], str], text: str, type_ref: str, source_ref: str,
                evidence_of: dict[str, Any]) -> Item:
    """One graph item; invalid (as in an export) when its text is not valid Unicode (an unpaired
    surrogate from a JSON escape: no digest of it can be taken)."""
    try:
        return Item(label, _graph_capture(text, type_ref, source_ref, evidence_of))
    except (UnicodeEncodeError, CanonicalizationError):
        return Item(label, problem=UNPAIRED)


def _graph_line(path: Path, number: int, obj: Any) -> list[Item]:
    """An entity: one record per observation ("NAME (TYPE): OBSERVATION"), or one record
    ("NAME (TYPE)") when it has none; a relation: one record "FROM RELATION TO"."""
    kind = obj.get("type") if isinstance(obj, dict) else None
    if kind == "entity" and _strings(obj, ("name", "entityType")) and isinstance(obj.get("observations"), list) \
            and all(isinstance(o, str) for o in obj["observations"]):
        name, etype, observations = obj["name"], obj["entityType"], obj["observations"]
        type_ref, source_ref = f"{GRAPH_SOURCE}:entity:{etype}", f"{GRAPH_SOURCE}:entity:{name}"
        shown = functools.cache(lambda: _name(name))  # screened once, if a report names an item
        if not observations:
            return [_graph_item(lambda: f"line {number} entity {shown()}", f"{name} ({etype})", type_ref, source_ref,
                                {"type": "entity", "name": name, "entityType": etype})]
        return [_graph_item(_observation_label(number, shown, k),
                            f"{name} ({etype}): {text}", type_ref, source_ref,
                            {"type": "entity", "name": name, "entityType": etype, "observation": text})
                for k, text in enumerate(observations, 1)]
    if kind == "relation" and _strings(obj, ("from", "to", "relationType")):
        a, rel, b = obj["from"], obj["relationType"], obj["to"]
        return [_graph_item(lambda: f"line {number} relation {_name(a)} -> {_name(b)}", f"{a} {rel} {b}",
                            f"{GRAPH_SOURCE}:relation:{rel}", f"{GRAPH_SOURCE}:relation:{a}",
                            {"type": "relation", "from": a, "to": b, "relationType": rel})]
    raise AdminUsageError(f"{path} line {number}: not a memory graph entity (type, name, entityType, observations)"
                          " or relation (type, from, to, relationType)")


def _graph_object(path: Path, obj: dict[str, Any]) -> list[Item]:
    entities, relations = obj.get("entities", []), obj.get("relations", [])
    if not isinstance(entities, list) or not isinstance(relations, list):
        raise AdminUsageError(f"{path}: a graph's entities and relations must be lists")
    items = [i for e in entities for i in _graph_line(path, 1, {**e, "type": "entity"} if isinstance(e, dict) else e)]
    return items + [i for r in relations
                    for i in _graph_line(path, 1, {**r, "type": "relation"} if isinstance(r, dict) else r)]


# -- importing ----------------------------------------------------------------------------------


@dataclass
class ImportReport:
    scope_ref: str
    format: str
    items: int = 0
    imported: int = 0
    already_present: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)  # item, reason (the policy's code)
    pending: list[dict[str, str]] = field(default_factory=list)  # item, candidate_id
    invalid: list[dict[str, str]] = field(default_factory=list)  # item, reason (an error code and where)
    record_ids: list[str] = field(default_factory=list)  # the records this import admitted
    changed: bool = False  # whether anything was written to the store
    notes: list[str] = field(default_factory=list)  # what the operator should know (--allow-partial, scope)

    def counts(self) -> dict[str, int]:
        return {"items": self.items, "imported": self.imported, "already_present": self.already_present,
                "rejected": len(self.rejected), "pending_adjudication": len(self.pending),
                "invalid": len(self.invalid)}

    def as_dict(self) -> dict[str, Any]:
        return {"format": self.format, "counts": self.counts(), "store_changed": self.changed,
                "rejected": self.rejected[:MAX_LISTED], "pending_adjudication": self.pending[:MAX_LISTED],
                "invalid": self.invalid[:MAX_LISTED], "record_ids": self.record_ids, "notes": self.notes}


def import_items(engine: Any, scope_ref: str, fmt: str, items: list[Item],
                 advance: Callable[[], None] = lambda: None,
                 phase: Callable[[str], None] = lambda message: None) -> ImportReport:
    """Capture and request admission of every item, in file order, as the scope's import principal:
    BATCH items to a transaction (Engine.capture_and_admit; each item still screened and decided on
    its own), the admitted records indexed together every INDEX_EVERY items (``phase`` hears of
    each indexing; ``advance`` of each item once its batch is committed)."""
    report = ImportReport(scope_ref, fmt, items=len(items))
    ctx = import_context(scope_ref)
    engine.db.bound_memory(IMPORT_STORE_CACHE_MIB)
    # The digests alone: decrypting and sorting every current body (as live_records does) ran
    # DuckDB out of the bounded memory once the scope held ~40,000 records.
    present = engine.live_payload_digests(scope_ref)
    chunks = _chunks(len(items))
    slices = [s for chunk in chunks for s in chunk]
    keys = KeyReserve(engine.keys)
    with import_worker(len(items)) as worker, closing(keys):
        # The worker checks and screens batch i + 1, and a thread makes its data keys, while this
        # process writes batch i.
        # (the first batch tells the worker what the scope holds: a re-run of an interrupted import
        # screened every item again only for this process to find it present)
        answers = [_submit(worker, scope_ref, items[slices[0]], present)] if worker else []
        at = 0
        for chunk in chunks:
            before = len(report.record_ids)
            with engine.batch():  # the chunk's admitted records are indexed together when it ends
                for part in chunk:
                    batch = items[part]
                    at += 1
                    if at < len(slices):
                        keys.ahead(len(items[slices[at]]))
                        if worker is not None:
                            answers.append(_submit(worker, scope_ref, items[slices[at]]))
                    answer = _answered(answers.pop(0)) if answers else None
                    with screen_cache(answer.screened if answer else None):
                        _import_batch(engine, ctx, batch, present, report, keys, answer.checks if answer else None)
                    for _item in batch:
                        advance()
            if len(report.record_ids) > before:
                phase(f"indexing {len(report.record_ids) - before} imported record(s)")
    return report


def _chunks(total: int) -> list[list[slice]]:
    """The import's batches, by indexing chunk: INDEX_EVERY items a chunk, and within it batches
    that start small (the first items show, and an interruption stops, soon) and grow to BATCH."""
    chunks = []
    for start in range(0, total, INDEX_EVERY):
        end, first, parts = min(total, start + INDEX_EVERY), start, []
        while first < end:
            size = min(BATCH, max(FIRST_BATCH, first))
            parts.append(slice(first, min(end, first + size)))
            first += size
        chunks.append(parts)
    return chunks


def _submit(worker: ImportWorker, scope_ref: str, batch: list[Item], present: Collection[str] = ()) -> Future[Answer]:
    return worker.submit(scope_ref, [item._args for item in batch], present)


def _answered(pending: Future[Answer]) -> Answer | None:
    """The worker's answer, or None (this process does the batch's checks and screening) if it failed."""
    try:
        return pending.result()
    except Exception:  # a worker that died or answered nonsense: the work is done here
        return None


@dataclass
class _Ready:
    """An item that passed the contract's checks: its capture arguments (plain, with their
    idempotency key), its admission's key, and the payload digest its record will have."""

    item: Item
    plain: dict[str, Any]
    admit_key: str
    digest: str


def _checked(ctx: HostContext, item: Item, report: ImportReport, check: Check = None) -> _Ready | None:
    """The item ready to import, or None once it is reported invalid (``check``: the import
    worker's answer for it; computed here when None)."""
    if check is None:
        raw = item.args
        if raw is None:
            report.invalid.append({"item": item.label, "reason": item.problem or "invalid"})
            return None
        check = _check_args(ctx.scope_ref, raw)
    if isinstance(check, str):
        report.invalid.append({"item": item.label, "reason": check})
        return None
    plain, admit_key, digest = check
    return _Ready(item, plain, admit_key, digest)


def _import_batch(engine: Any, ctx: HostContext, batch: list[Item], present: set[str],
                  report: ImportReport, keys: KeyReserve | None = None, checks: list[Check] | None = None) -> None:
    """One transaction for the batch's new items; an item the batch cannot answer (a replay of an
    earlier import's, or a payload an earlier item of the batch carries too) goes one by one
    after it, exactly as before batches. ``checks``: the import worker's, by item."""
    ready: list[_Ready] = []
    one_by_one: list[_Ready] = []
    digests: set[str] = set()
    for index, item in enumerate(batch):
        checked = _checked(ctx, item, report, checks[index] if checks else None)
        if checked is None:
            continue
        if checked.digest in present:
            report.already_present += 1  # the same payload is a current record of the scope already
        elif checked.digest in digests:
            one_by_one.append(checked)  # decided once the first is (present then, if admitted)
        else:
            digests.add(checked.digest)
            ready.append(checked)
    try:
        outcomes = engine.capture_and_admit(ctx, [BatchItem(r.plain, r.admit_key) for r in ready], keys) \
            if ready else []
    except EngramError:  # the batch as a whole failed (nothing committed): each item on its own says why
        outcomes = [BatchOutcome(deferred=True) for _ in ready]
    for r, outcome in zip(ready, outcomes, strict=True):
        if outcome.deferred:
            one_by_one.append(r)
        elif outcome.error is not None:
            report.invalid.append({"item": r.item.label, "reason": _refusal(outcome.error)})
        else:
            assert outcome.capture is not None and outcome.admission is not None
            _account(report, present, r, outcome.capture["status"], outcome.admission["replayed"],
                     outcome.admission["outcome"])
    for r in one_by_one:
        _import_one(engine, ctx, r, present, report)


def _import_one(engine: Any, ctx: HostContext, r: _Ready, present: set[str], report: ImportReport) -> None:
    if r.digest in present:
        report.already_present += 1
        return
    try:
        capture = parse_input("capture", r.plain)  # the arguments checked already: the same model
        assert isinstance(capture, CaptureInput)
        captured = engine.capture(ctx, capture)
        admitted = engine.request_admission(
            ctx, RequestAdmissionInput(candidate_id=captured.candidate_id, idempotency_key=r.admit_key))
    except EngramError as exc:  # the host policy's refusals (retention, families) and the like
        report.invalid.append({"item": r.item.label, "reason": _refusal(exc)})
        return
    outcome = admitted.outcome
    _account(report, present, r, captured.status, admitted.replayed,
             {"status": outcome.status, "record_id": getattr(outcome, "record_id", None),
              "candidate_id": getattr(outcome, "candidate_id", None)})


def _account(report: ImportReport, present: set[str], r: _Ready, capture_status: str, replayed: bool,
             outcome: dict[str, Any]) -> None:
    """An item's answers in the report (the same whether its batch or it alone was sent)."""
    status = outcome["status"]
    fresh = not replayed and status != "duplicate_exact"
    report.changed = report.changed or capture_status == "committed_pending" or fresh
    if status == "accepted" and fresh:
        report.imported += 1
        report.record_ids.append(str(outcome["record_id"]))
        present.add(r.digest)
    elif status in ("accepted", "duplicate_exact"):
        report.already_present += 1
    elif status == "rejected":
        kind = secret_kind(r.plain["payload"], r.plain["evidence"])
        report.rejected.append({"item": r.item.label, "reason": f"secret:{kind}" if kind else "rejected"})
    else:
        report.pending.append({"item": r.item.label, "candidate_id": str(outcome["candidate_id"])})
