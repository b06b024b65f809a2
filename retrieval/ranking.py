"""Turn per-channel hit lists into one deterministic ranking with per-channel evidence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from retrieval import fusion as fusion_fns

FUSION_METHODS = ("rrf", "dbsf", "convex")


@dataclass(frozen=True)
class FusionConfig:
    method: str = "rrf"
    k: int = 60
    weights: Mapping[str, float] = field(default_factory=lambda: {"lexical": 0.5, "semantic": 0.5})

    def describe(self, fused: bool) -> dict[str, Any]:
        if not fused:
            return {"method": "none"}
        if self.method == "rrf":
            return {"method": "rrf", "k": self.k}
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
    elif config.method == "rrf":
        fused = fusion_fns.rrf(channels, k=config.k)
    elif config.method == "dbsf":
        fused = fusion_fns.dbsf(channels, weights=dict(config.weights))
    elif config.method == "convex":
        fused = fusion_fns.convex(channels, weights=dict(config.weights))
    else:
        raise ValueError(f"unknown fusion method {config.method}")
    by_name = sorted(positions.items())
    return [RankedHit(rid, float(score), {n: p[rid] for n, p in by_name if rid in p}) for rid, score in fused]
