"""Turn per-channel hit lists into one deterministic ranking with per-channel evidence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engram_memory.models.limits import RRF_K
from engram_memory.models.states import NO_FUSION, FusionMethod
from engram_memory.retrieval import fusion as fusion_fns


@dataclass(frozen=True)
class FusionConfig:
    method: str = FusionMethod.CONVEX.value
    k: int = RRF_K
    weights: Mapping[str, float] = field(default_factory=lambda: {"lexical": 0.5, "semantic": 0.5})

    def describe(self, fused: bool) -> dict[str, Any]:
        if not fused:
            return {"method": NO_FUSION}
        if self.method == FusionMethod.RRF:
            return {"method": FusionMethod.RRF.value, "k": self.k}
        return {"method": self.method, "weights": {"lexical": self.weights["lexical"],
                                                   "semantic": self.weights["semantic"]}}


@dataclass(frozen=True)
class RankedHit:
    record_id: str
    score: float
    channels: dict[str, tuple[int, float]]  # channel -> (rank from 1, raw score)


@dataclass
class Ranking:
    """The fused order of every hit; per-channel evidence is built only for the hits shown."""

    fused: list[tuple[str, float]]  # (record_id, fused score), sorted (-score, record_id)
    channels: Mapping[str, list[tuple[str, float]]]
    _positions: list[tuple[str, dict[str, tuple[int, float]]]] | None = None

    @property
    def ids(self) -> list[str]:
        return [rid for rid, _ in self.fused]

    def __len__(self) -> int:
        return len(self.fused)

    def hits(self, start: int, stop: int) -> list[RankedHit]:
        if self._positions is None:
            self._positions = [
                (name, {rid: (i + 1, score) for i, (rid, score) in enumerate(found)})
                for name, found in sorted(self.channels.items())
            ]
        return [
            RankedHit(rid, float(score), {n: p[rid] for n, p in self._positions if rid in p})
            for rid, score in self.fused[start:stop]
        ]


def rank(channels: Mapping[str, list[tuple[str, float]]], config: FusionConfig) -> Ranking:
    """Fuse the contributing channels; a single channel keeps its own order and raw score.

    Every input list is already sorted (-score, record_id) with unique ids -- the indexes return
    them so -- and the output is sorted the same way.
    """
    if not channels:
        return Ranking([], channels)
    if len(channels) == 1:
        (_name, fused), = channels.items()
    elif config.method == FusionMethod.RRF:
        fused = fusion_fns.rrf(channels, k=config.k, checked=False)
    elif config.method == FusionMethod.DBSF:
        fused = fusion_fns.dbsf(channels, weights=dict(config.weights), checked=False)
    elif config.method == FusionMethod.CONVEX:
        fused = fusion_fns.convex(channels, weights=dict(config.weights), checked=False)
    else:
        raise ValueError(f"unknown fusion method {config.method}")
    return Ranking(list(fused), channels)
