"""Fusion of ranked channels into one deterministic ranking. Pure functions, no I/O.

Every channel is a list of ``(record_id, score)`` already ordered by (-score, record_id) with
unique ids; that order defines ``rank_c(d)`` (1-based). A record missing from a channel gets
nothing from it. Channels are visited in sorted name order and sums use Python floats, so the
same input always produces the same bits. Output: ``(record_id, fused)`` sorted by
(-fused, record_id).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from engram_memory.models.limits import RRF_K

Ranked = list[tuple[str, float]]
Channels = Mapping[str, Ranked]


def check_channel(name: str, hits: Ranked) -> None:
    """Refuse a channel that is not a canonical ranked list (the receipt would not re-derive)."""
    seen: set[str] = set()
    prev: tuple[float, str] | None = None
    for rid, score in hits:
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"channel {name!r}: record ids must be non-empty strings")
        if not isinstance(score, int | float) or not math.isfinite(score):
            raise ValueError(f"channel {name!r}: scores must be finite numbers")
        if rid in seen:
            raise ValueError(f"channel {name!r}: duplicate record id {rid!r}")
        key = (-float(score), rid)
        if prev is not None and key < prev:
            raise ValueError(f"channel {name!r}: not sorted by (-score, record_id)")
        seen.add(rid)
        prev = key


def channel_ranks(channels: Channels) -> dict[str, dict[str, int]]:
    """``{record_id: {channel: rank}}`` (1-based), the per-channel ranks a rank receipt lists."""
    out: dict[str, dict[str, int]] = {}
    for name in sorted(channels):
        check_channel(name, channels[name])
        for rank, (rid, _score) in enumerate(channels[name], start=1):
            out.setdefault(rid, {})[name] = rank
    return out


def rrf(channels: Channels, k: float = RRF_K, weights: Mapping[str, float] | None = None, *,
        checked: bool = True) -> Ranked:
    """Reciprocal rank fusion (Cormack et al., SIGIR 2009).

    ``fused(d) = Σ_c w_c / (k + rank_c(d))`` with ``rank_c`` starting at 1 and ``w_c = 1`` unless
    ``weights`` is given. ``k = 60`` is the classic constant (Qdrant's k=2 ≈ a sharper head).
    """
    if not (isinstance(k, int | float) and math.isfinite(k) and k >= 0):
        raise ValueError("k must be a finite number >= 0")
    w = _weights(channels, weights)
    fused: dict[str, float] = {}
    for name in sorted(channels):
        if checked:
            check_channel(name, channels[name])
        for rank, (rid, _score) in enumerate(channels[name], start=1):
            fused[rid] = fused.get(rid, 0.0) + w[name] / (k + rank)
    return _ordered(fused)


def dbsf(channels: Channels, weights: Mapping[str, float] | None = None, *, checked: bool = True) -> Ranked:
    """Distribution-based score fusion, as Qdrant's server computes ``fusion: dbsf``.

    Per channel, with ``μ`` the mean and ``σ`` the sample standard deviation (n - 1) of its
    scores: ``n_c(d) = (s - (μ - 3σ)) / 6σ``, *not* clipped to [0, 1] -- over deep lists the tail
    sets ``μ`` and ``σ`` and the heads of both channels lie above ``μ + 3σ``; clipping them to
    1.0 ties them and lets ``record_id`` order the top (it cost 0.24 nDCG@10 on SciFact,
    ``eval/RESULTS.md``). One hit, or all scores equal, gives every hit ``0.5``.
    ``fused(d) = Σ_c w_c · n_c(d)``, ``w_c = 1`` by default.
    """
    w = _weights(channels, weights)
    slot: dict[str, int] = {}  # record id -> its place in ``total``, in order of first appearance
    parts: list[tuple[list[int], np.ndarray]] = []
    for name in sorted(channels):
        hits = channels[name]
        if checked:
            check_channel(name, hits)
        if not hits:
            continue
        scores = [float(s) for _rid, s in hits]
        low, span = dbsf_bounds(scores)
        # Element-wise float64 arithmetic: the same IEEE operations, in the same order, as a loop of
        # Python floats, so every fused score keeps its bits (tests/test_retrieval_fusion.py checks both).
        norm = np.full(len(scores), 0.5) if span == 0.0 else (np.array(scores) - low) / span
        at = [slot.setdefault(rid, len(slot)) for rid, _s in hits]
        parts.append((at, w[name] * norm))
    total = np.zeros(len(slot))
    for at, contribution in parts:
        total[at] += contribution  # ids are unique within a channel: one addition per slot
    return _ordered_arrays(list(slot), total)


def dbsf_bounds(scores: list[float]) -> tuple[float, float]:
    """DBSF's ``(μ - 3σ, 6σ)`` of one channel's scores: σ the sample deviation, 0 for one score."""
    mean = math.fsum(scores) / len(scores)
    sigma = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / (len(scores) - 1)) if len(scores) > 1 else 0.0
    return mean - 3.0 * sigma, 6.0 * sigma


def convex(channels: Channels, weights: Mapping[str, float], *, checked: bool = True) -> Ranked:
    """Convex combination of min-max normalised scores (Bruch et al., TOIS 2023; Weaviate RSF).

    ``n_c(d) = (s - min_c) / (max_c - min_c)``, or ``1.0`` for every hit when ``max_c = min_c``;
    ``fused(d) = Σ_c w_c · n_c(d)``. Every channel needs a weight; they need not sum to 1.

    ``checked=False`` skips ``check_channel`` for lists the indexes produced (sorted, unique by
    construction): the check walks every hit, a third of the fusion's cost at depth 1000.
    """
    w = _weights(channels, weights)
    fused: dict[str, float] = {}
    for name in sorted(channels):
        hits = channels[name]
        if checked:
            check_channel(name, hits)
        if not hits:
            continue
        top, bottom = float(hits[0][1]), float(hits[-1][1])  # lists are sorted by -score
        span = top - bottom
        for rid, s in hits:
            norm = 1.0 if span == 0.0 else (float(s) - bottom) / span
            fused[rid] = fused.get(rid, 0.0) + w[name] * norm
    return _ordered(fused)


def _weights(channels: Channels, weights: Mapping[str, float] | None) -> dict[str, float]:
    if weights is None:
        return {name: 1.0 for name in channels}
    missing = sorted(set(channels) - set(weights))
    if missing:
        raise ValueError(f"no weight for channels {missing}")
    out = {name: float(weights[name]) for name in channels}
    if any(not (math.isfinite(v) and v >= 0.0) for v in out.values()):
        raise ValueError("weights must be finite and >= 0")
    return out


def _ordered(fused: dict[str, float]) -> Ranked:
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


def _ordered_arrays(ids: list[str], fused: np.ndarray) -> Ranked:
    """``_ordered`` for scores in an array: a stable sort on -score, then each run of equal scores
    (rare: the same scores in every channel) put in record-id order in Python."""
    order = np.argsort(-fused, kind="stable")
    ranked = fused[order]
    ties = np.flatnonzero(ranked[1:] == ranked[:-1]).tolist()
    order_list = order.tolist()
    scores = ranked.tolist()
    k = 0
    while k < len(ties):  # ties[k] .. ties[m - 1] consecutive: positions ties[k] .. ties[m - 1] + 1 are equal
        m = k + 1
        while m < len(ties) and ties[m] == ties[m - 1] + 1:
            m += 1
        lo, hi = ties[k], ties[m - 1] + 2
        order_list[lo:hi] = sorted(order_list[lo:hi], key=ids.__getitem__)
        k = m
    return [(ids[k], score) for k, score in zip(order_list, scores, strict=True)]
