"""A second stage over the ranking's head: who said a record, and how its neighbours in time scored.

It runs on the fused hybrid and on a single channel's ranking alike (lexical_v1, while the model
loads or without it); the evaluation scores each channel alone without it.

On conversational memory the hybrid's top 30 holds most answers but orders them poorly
(studies/rerank-study.md, issue 12): the lexical channel cannot tell a turn *spoken by* Caroline
("Caroline: I went to a support group") from one that *addresses* her ("Thanks, Caroline!"), and
a turn's meaning often sits in the turn before it. Two facts a record carries fix much of that:

* ``speaker`` (0 or 1): the record is a conversation turn, a line of its primary text starts with
  a chat-transcript label ("Name: ", at most 40 characters before the colon), the query names that
  label as a word, and at least SPEAKER_MIN_RECORDS head records carry it;
* ``neighbour``: for a conversation turn with a speaker label, when the query names a speaker and
  the head's turns carry at least two (a dialogue, not one person's journal), the best fused score of the turns just
  before and just after it in event order (``primary_event.at``, ties broken by record id); a turn
  whose neighbour shares its instant has none on that side.

A record is a conversation turn only when its host says so: its ``primary_event.type_ref`` is one
of the turn types (``RerankConfig.turn_types``, the ``turn_types`` setting; ``event:turn`` by
default). Text is never guessed at: agent notes are full of "Postgres: ..." or "Decision: ..."
lines that are topics, not speakers, and a note captured after another need not be about the
same thing. Notes take neither feature, and the timeline holds turns only.

Each feature is z-scored over the head and the head is reordered by
``fused + σ_fused · Σ w · z(feature)`` -- the same order as ``z(fused) + Σ w · z(feature)``, kept in
the fused score's units. Records below the head keep their fused score and order. A feature that
is constant over the head (no label named, no event order) has z = 0 and changes nothing, so the
stage is inert on collections without speakers or time. Pure functions over Python floats: the
same head, facts and query give the same bits.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engram_memory.models.limits import RERANK_HEAD, RERANK_WEIGHTS, SPEAKER_MIN_RECORDS, TURN_TYPES

FEATURES = ("neighbour", "speaker")  # sorted: the receipt lists the weights in this order
_LABEL = re.compile(r"^([^:\n]{1,40}):[ \t]", re.MULTILINE)


@dataclass(frozen=True)
class RerankConfig:
    head: int = RERANK_HEAD
    weights: Mapping[str, float] = field(default_factory=lambda: dict(RERANK_WEIGHTS))
    turn_types: frozenset[str] = frozenset(TURN_TYPES)

    def describe(self) -> dict[str, Any]:
        """What the receipt names (under ``fusion.rerank``) so the order can be re-derived."""
        return {"head": self.head, "weights": {name: self.weights[name] for name in FEATURES},
                "turn_types": sorted(self.turn_types)}

    def is_turn(self, type_ref: str | None) -> bool:
        return type_ref is not None and type_ref in self.turn_types


@dataclass(frozen=True)
class HeadFacts:
    """What the stage needs of one head record: its speaker labels and its event-order neighbours."""

    labels: frozenset[str] = frozenset()
    neighbours: tuple[str, ...] = ()  # the records just before and just after it, when they exist


class Timeline:
    """The records of a scope in event order, (at, record_id), kept sorted as records come and go."""

    def __init__(self, events: Mapping[str, int] | None = None) -> None:
        self._items = sorted((at, rid) for rid, at in (events or {}).items())
        self._at = dict(events or {})

    def __len__(self) -> int:
        return len(self._items)

    def add(self, record_id: str, at: int) -> None:
        if record_id in self._at:
            self.remove(record_id)
        bisect.insort(self._items, (at, record_id))
        self._at[record_id] = at

    def remove(self, record_id: str) -> None:
        at = self._at.pop(record_id, None)
        if at is not None:
            del self._items[bisect.bisect_left(self._items, (at, record_id))]

    def neighbours(self, record_id: str) -> tuple[str, ...]:
        """The records just before and just after it, each only when its instant differs."""
        at = self._at.get(record_id)
        if at is None:
            return ()
        items, i = self._items, bisect.bisect_left(self._items, (at, record_id))
        out = []
        if i > 0 and items[i - 1][0] < at:
            out.append(items[i - 1][1])
        if i + 1 < len(items) and items[i + 1][0] > at:
            out.append(items[i + 1][1])
        return tuple(out)


def speaker_labels(text: str) -> frozenset[str]:
    """The chat-transcript labels of a text: every line that starts "Label: "."""
    return frozenset(m.group(1).strip() for m in _LABEL.finditer(text) if m.group(1).strip())


def names_label(query: str, label: str) -> bool:
    """True when the query holds the label as a whole word (case-sensitive: a name)."""
    return re.search(rf"(?<!\w){re.escape(label)}(?!\w)", query) is not None


def _moments(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation, summed exactly (the same bits every run)."""
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def _z(values: Sequence[float]) -> list[float]:
    mean, sd = _moments(values)
    return [(v - mean) / sd if sd > 0.0 else 0.0 for v in values]


def features(query: str, head: Sequence[tuple[str, float]], facts: Mapping[str, HeadFacts],
             fused: Mapping[str, float]) -> dict[str, list[float]]:
    """Each feature's raw value for every head record, in head order."""
    empty = HeadFacts()
    named = [frozenset(label for label in facts.get(rid, empty).labels if names_label(query, label))
             for rid, _score in head]
    counts = Counter(label for labels in named for label in labels)
    speaker = [1.0 if any(counts[label] >= SPEAKER_MIN_RECORDS for label in labels) else 0.0 for labels in named]
    # Only a conversation turn (facts carry labels for turns only) takes its neighbours' scores, and
    # only when the query asks about a speaker of a dialogue: one person's turns (a dictated
    # journal) are no question-and-answer, and a query naming nobody is not about the conversation.
    head_facts = [facts.get(rid, empty) for rid, _score in head]
    dialogue = len({label for fact in head_facts for label in fact.labels}) >= 2 and any(speaker)
    neighbour = [max((fused.get(n, 0.0) for n in fact.neighbours), default=0.0) if dialogue and fact.labels else 0.0
                 for fact in head_facts]
    return {"neighbour": neighbour, "speaker": speaker}


def rerank(query: str, ranked: Sequence[tuple[str, float]], facts: Mapping[str, HeadFacts],
           config: RerankConfig) -> list[tuple[str, float]]:
    """``ranked`` (sorted -score, record_id) with its head reordered; the tail is unchanged."""
    head = list(ranked[: config.head])
    if len(head) < 2:
        return list(ranked)
    spread = _moments([s for _rid, s in head])[1] or 1.0
    values = features(query, head, facts, dict(ranked))
    zs = {name: _z(values[name]) for name in FEATURES if config.weights[name]}
    moved = [
        (rid, s + spread * math.fsum(config.weights[name] * z[i] for name, z in zs.items()))
        for i, (rid, s) in enumerate(head)
    ]
    moved.sort(key=lambda hit: (-hit[1], hit[0]))
    return moved + list(ranked[config.head:])
