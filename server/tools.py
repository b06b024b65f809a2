"""The tool registry: names, descriptions, annotations and schemas as tools/list shows them.

Descriptions teach the discipline of TOOL_CONTRACT §1, §3, §4 at the point of use; the
schemas come from models.schema (generated from the pydantic models, never written twice).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import mcp_types as types

from engram_memory.models.context import ALL_TOOLS, ALWAYS_CONFIRMED, TOOL_PREFIX
from engram_memory.models.limits import IDEMPOTENCY_KEY_MAX_BYTES, IDEMPOTENCY_KEY_MIN_BYTES, TURN_TYPES
from engram_memory.models.schema import input_schema, output_schema

# Said once, appended to every description: how to read a result.
_RESULT_RULES = (
    " Results are envelopes: act on error.code and error.retriable, never on error.message;"
    " retriable true: back off and retry. A JSON-RPC error (-32602, -32603) is not a memory answer:"
    " stop and report to the host operator."
)
_MUTATION_RULES = (
    f" One idempotency_key ({IDEMPOTENCY_KEY_MIN_BYTES}..{IDEMPOTENCY_KEY_MAX_BYTES} bytes) per logical operation:"
    " retrying with the same key and"
    " identical arguments is a safe replay; reusing it for anything else is DIGEST_CONFLICT."
    " MUTATION_OUTCOME_UNKNOWN: it may have been applied; retry with the same key until definitive."
)
# A server started without the semantic channel (semantic = false) says so where the agent
# decides: lexical_and_semantic is RANKING_UNAVAILABLE there for good, though retriable by the catalog.
_LEXICAL_ONLY = (
    " THIS SERVER HAS NO SEMANTIC CHANNEL (the host runs it lexical-only): always ask minimum_channels"
    " \"lexical\"; \"lexical_and_semantic\" answers RANKING_UNAVAILABLE here every time, so never retry it."
)
LEXICAL_ONLY_INSTRUCTIONS = (
    " This server searches with its lexical (BM25) channel only: ask search for minimum_channels"
    " \"lexical\"; \"lexical_and_semantic\" is RANKING_UNAVAILABLE here and retrying does not help."
)
_CONFIRMED = (
    " The host asks the human to confirm before it runs; you cannot confirm it yourself."
    " gate_failed means it is not (yet) approved. If your client cannot show the host's confirmation,"
    " the request waits for a human to approve it at the host (engram-memory admin approve, or the"
    " console): tell the user, and once it is approved retry the same call with the same idempotency_key"
    " and arguments; it answers the approved outcome (replayed true). gate_failed after that means denied"
    " or expired: report it, do not loop."
)

DESCRIPTIONS: dict[str, str] = {
    "search": (
        "Find current, admitted memories: decisions with their grounds, verified facts with a citable"
        " source, conventions, recurring problems and their fix, hand-over facts. Returns record packets"
        " with citations, scores and a rank receipt. Search BEFORE you capture: if an equivalent record"
        " exists, cite its record_id instead of capturing again. Only accepted, current records are"
        " returned; pending candidates never are. purpose_ref must be the purpose your host gave you."
        " Channels: the lexical (BM25) channel always ranks; the semantic channel ranks too whenever the"
        " model is ready, also under minimum_channels \"lexical\" (a minimum, not a limit: the receipt's"
        " profile and channels say which ran), and minimum_channels \"lexical_and_semantic\" answers"
        " RANKING_UNAVAILABLE instead of ranking without it. A record only the semantic channel found is"
        " returned only at or above the receipt's semantic_floor cosine, so an empty records list means"
        " no match: nothing with a query word and nothing close. The top hits are then reordered"
        " by conversation structure (the receipt's fusion.rerank), for conversation turns only (records"
        " whose primary_event.type_ref is one of the receipt's turn_types): a turn whose text has a line"
        " starting \"Name: \" ranks higher when the query names Name, and turns rise with their"
        " neighbours in primary_event.at order when they match. STALE_PAGE: search again without page_cursor;"
        " RESULT_TOO_LARGE or PROJECTION_OVERSIZED: lower limit or adjust max_packet_bytes."
    ),
    "get": (
        "Read one known current record by record_id (copy it exactly from search or admission), with a"
        " read receipt; no ranking. purpose_ref must be the purpose your host gave you. NOT_FOUND means"
        " unknown, out of scope or no longer current, indistinguishable by design: treat the record as"
        " unavailable and do not probe other ids."
    ),
    "capture": (
        "Submit durable, reusable knowledge worth finding again in a later session or by another agent"
        " (a decision with its grounds, a verified fact with a citable source, a convention, a recurring"
        " difficulty and its fix, a hand-over fact) as an encrypted PENDING candidate. Not for"
        " in-progress state, chat transcripts, raw tool output, task-local notes or speculation. NEVER"
        " store secrets: credentials, tokens, API or signing keys, passwords, connection strings, .env"
        " values, session cookies. Search first. Every component cites at least one citation; each"
        " citation carries a sha256 content_digest of the cited content. A candidate is not a record:"
        " it cannot be searched or read, and its candidate_id is not a record_id; ask for admission with"
        " request_admission. Omit retention unless instructed. A replay of the same key and content"
        " returns duplicate_exact. A conversation turn worth keeping is one record: its speaker as"
        " \"Name: words\" in the primary component, the turn's time as primary_event.at and a turn type"
        " as primary_event.type_ref{turn_types}; any other type_ref is a note, never treated as a turn."
    ),
    "request_admission": (
        "Ask the host's admission policy to decide on a pending candidate returned by capture."
        " Admission is requested, never assumed: read outcome.status and replayed, not field presence."
        " accepted carries the record_id; rejected and pending_adjudication are normal outcomes, not"
        " errors: do not loop on them. POLICY_STALE is retriable with the same idempotency_key."
    ),
    "withdraw": (
        "End one of your pending candidates (wrong, superseded before admission, or no longer wanted);"
        " its encrypted content becomes unreadable. reason_ref is an opaque reference, not a free-text"
        " account of the memory. NOT_FOUND: the candidate is not pending in your scope."
    ),
    "forget": (
        "Permanently make an admitted record ineligible (tombstone): it leaves search and get for good"
        " and cannot be restored; a later capture whose effective payload digest matches the forgotten"
        " record's is held at pending_adjudication (similar wording alone is not). Use only"
        " when the record is wrong or must be erased. reason_ref is an opaque reference, not a"
        " free-text account of the memory. NOT_FOUND: no such current record in your scope."
    ),
}

TITLES: dict[str, str] = {
    "search": "Search memory",
    "get": "Read a memory record",
    "capture": "Capture a memory candidate",
    "request_admission": "Request admission of a candidate",
    "withdraw": "Withdraw a pending candidate",
    "forget": "Forget a memory record",
}

READ_ONLY = frozenset({"search", "get"})
DESTRUCTIVE = frozenset({"withdraw", "forget"})
MUTATING = frozenset(ALL_TOOLS) - READ_ONLY


def instructions(semantic: bool) -> str:
    """The server's instructions; a lexical-only server says so."""
    return INSTRUCTIONS + ("" if semantic else LEXICAL_ONLY_INSTRUCTIONS)


INSTRUCTIONS = (
    "Engram memory: governed long-term memory shared across sessions and agents. Keep here only"
    " durable, reusable knowledge (decisions with grounds, verified facts with a citable source,"
    " conventions, recurring difficulties and fixes, hand-over facts); never provisional state,"
    " transcripts, raw tool output, task-local notes or speculation, and never secrets, credentials,"
    " tokens, keys, passwords, connection strings, .env values or cookies. Search before capture and"
    " cite an existing record_id rather than duplicating it. Capture creates a pending, unsearchable"
    " candidate; admission is requested with request_admission, never assumed, and a candidate_id is"
    " not a record_id. Withdraw and forget (and any tool the host marks) need the human's"
    " confirmation through the host; when your client cannot ask, a human can approve the request at"
    " the host, and you then retry the same call with the same idempotency_key. Use one idempotency_key"
    " per logical operation and retry a retriable failure with the same key and arguments. Act on"
    " error.code and error.retriable, never on the message. Tenant, workspace, identity and"
    " confirmation come from the host, never from arguments; a JSON-RPC error means stop and report"
    " to the host operator."
)


@dataclass(frozen=True)
class ToolEntry:
    tool: str  # the short name ("search"), as models/ and store/ know it
    definition: types.Tool

    @property
    def name(self) -> str:
        return self.definition.name


def _annotations(tool: str) -> types.ToolAnnotations:
    read_only = tool in READ_ONLY
    return types.ToolAnnotations(
        title=TITLES[tool],
        read_only_hint=read_only,
        destructive_hint=None if read_only else tool in DESTRUCTIVE,
        # Reads are idempotent by nature; every mutation is keyed (idempotency_key replay).
        idempotent_hint=True,
        open_world_hint=False,
    )


def describe(tool: str, confirmed: bool, semantic: bool = True, turn_types: tuple[str, ...] = TURN_TYPES) -> str:
    text = DESCRIPTIONS[tool]
    if tool == "capture":  # the host's own turn types, named where the agent captures
        text = text.replace("{turn_types}", " (" + " or ".join(turn_types) + ")" if turn_types else "")
    if tool == "search" and not semantic:
        text += _LEXICAL_ONLY
    if tool in MUTATING:
        text += _MUTATION_RULES
    if confirmed:
        text += _CONFIRMED
    return text + _RESULT_RULES


class ToolRegistry:
    """Only the granted tools exist: an ungranted one is absent, not listed-then-refused."""

    def __init__(self, enabled: Iterable[str], confirmed: frozenset[str], semantic: bool = True,
                 turn_types: tuple[str, ...] = TURN_TYPES) -> None:
        confirmed = confirmed | ALWAYS_CONFIRMED
        self._by_name: dict[str, ToolEntry] = {}
        for tool in ALL_TOOLS:  # contract order, whatever the config order
            if tool not in enabled:
                continue
            definition = types.Tool(
                name=TOOL_PREFIX + tool,
                title=TITLES[tool],
                description=describe(tool, tool in confirmed, semantic, turn_types),
                input_schema=input_schema(tool),
                output_schema=output_schema(tool),
                annotations=_annotations(tool),
            )
            self._by_name[definition.name] = ToolEntry(tool, definition)

    def resolve(self, name: str) -> ToolEntry | None:
        return self._by_name.get(name)

    def definitions(self) -> list[types.Tool]:
        return [e.definition for e in self._by_name.values()]
