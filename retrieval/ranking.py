"""Turn per-channel hit lists into one deterministic ranking with per-channel evidence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engram_memory.models.limits import RRF_K
from engram_memory.models.states import NO_FUSION, FusionMethod
from engram_memory.retrieval import fusion as fusion_fns

FUSION_METHODS = tuple(m.value for m in FusionMethod)


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


def rank(channels: Mapping[str, list[tuple[str, float]]], config: FusionConfig) -> list[RankedHit]:
    """Fuse the contributing channels; a single channel keeps its own order and raw score.

    Every input list is already sorted (-score, record_id); the output is sorted the same way.
    """
    positions = {
        name: {rid: (i + 1, score) for i, (rid, score) in enumerate(hits)} for name, hits in channels.items()
    }
    if len(channels) == 1:
        (name, hits), = channels.items()
        fused = hits
    elif config.method == FusionMethod.RRF:
        fused = fusion_fns.rrf(channels, k=config.k)
    elif config.method == FusionMethod.DBSF:
        fused = fusion_fns.dbsf(channels, weights=dict(config.weights))
    elif config.method == FusionMethod.CONVEX:
        fused = fusion_fns.convex(channels, weights=dict(config.weights))
    else:
        raise ValueError(f"unknown fusion method {config.method}")
    by_name = sorted(positions.items())
    return [RankedHit(rid, float(score), {n: p[rid] for n, p in by_name if rid in p}) for rid, score in fused]
