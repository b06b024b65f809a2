"""A second stage over the ranking's head: who said a record, and how its neighbours in time scored.

It runs on the fused hybrid and on a single channel's ranking alike (lexical_v1, while the model
loads or without it); the evaluation scores each channel alone without it.

On conversational memory the hybrid's top 30 holds most answers but orders them poorly
(eval/rerank-study.md, issue 12): the lexical channel cannot tell a turn *spoken by* Caroline
("Caroline: I went to a support group") from one that *addresses* her ("Thanks, Caroline!"), and
a turn's meaning often sits in the turn before it. Two facts a record carries fix much of that:

* ``speaker`` (0 or 1): a line of the record's primary text starts with a chat-transcript label
  ("Name: ", at most 40 characters before the colon), the query names that label as a word, and
  at least SPEAKER_MIN_RECORDS head records carry it (a speaker says several things; a document's
  "Vitamin D: ..." topic line labels one record);
* ``neighbour``: for a conversation turn (a record with a speaker label), the best fused score of
  the records just before and just after it in event order (``primary_event.at``, ties broken by
  record id); a record whose neighbour shares its instant has none on that side, so a batch
  captured at one instant (a document collection) has no order. Other memories take none: records
  captured one after another need not be about the same thing.

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

from engram_memory.models.limits import RERANK_HEAD, RERANK_WEIGHTS, SPEAKER_MIN_RECORDS

FEATURES = ("neighbour", "speaker")  # sorted: the receipt lists the weights in this order
_LABEL = re.compile(r"^([^:\n]{1,40}):[ \t]", re.MULTILINE)


@dataclass(frozen=True)
class RerankConfig:
    head: int = RERANK_HEAD
    weights: Mapping[str, float] = field(default_factory=lambda: dict(RERANK_WEIGHTS))

    def describe(self) -> dict[str, Any]:
        """What the receipt names (under ``fusion.rerank``) so the order can be re-derived."""
        return {"head": self.head, "weights": {name: self.weights[name] for name in FEATURES}}


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
    # Only a conversation turn (a record with a speaker label) takes its neighbours' scores: other
    # memories captured one after another need not be about the same thing.
    neighbour = [max((fused.get(n, 0.0) for n in fact.neighbours), default=0.0) if fact.labels else 0.0
                 for fact in (facts.get(rid, empty) for rid, _score in head)]
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
