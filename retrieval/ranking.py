"""Turn per-channel hit lists into one deterministic ranking with per-channel evidence."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engram_memory.models.limits import LEXICAL_COVERAGE_FULL, RRF_K, SEMANTIC_FLOOR, SEMANTIC_FOREIGN_SCALE
from engram_memory.models.states import DEFAULT_FUSION, DEFAULT_FUSION_WEIGHTS, NO_FUSION, FusionMethod
from engram_memory.retrieval import fusion as fusion_fns


@dataclass(frozen=True)
class FusionConfig:
    method: str = DEFAULT_FUSION.value
    k: int = RRF_K
    weights: Mapping[str, float] = field(default_factory=lambda: {"lexical": DEFAULT_FUSION_WEIGHTS[0],
                                                                  "semantic": DEFAULT_FUSION_WEIGHTS[1]})
    semantic_floor: float = SEMANTIC_FLOOR
    coverage_full: float = LEXICAL_COVERAGE_FULL
    foreign_scale: float = SEMANTIC_FOREIGN_SCALE

    def lexical_scale(self, coverage: float) -> float:
        """How much of its weight the lexical channel keeps for a query of this coverage."""
        return 1.0 if coverage >= self.coverage_full else max(0.0, coverage) / self.coverage_full

    def semantic_scale(self, foreign: bool) -> float:
        """How much of its weight the semantic channel keeps: all of it, unless the query is in a
        language the embedding model was not trained for (``foreign``)."""
        return self.foreign_scale if foreign else 1.0

    def describe(self, fused: bool, floored: bool = False) -> dict[str, Any]:
        """What the receipt names: the method and its parameters, and the floor when it applied
        (the search adds the query's ``lexical_coverage`` when it scaled the lexical weight down, and
        its ``semantic_language`` when it scaled the semantic weight down)."""
        out: dict[str, Any]
        if not fused:
            out = {"method": NO_FUSION}
        elif self.method == FusionMethod.RRF:
            out = {"method": FusionMethod.RRF.value, "k": self.k}
        else:
            out = {"method": self.method, "weights": {"lexical": self.weights["lexical"],
                                                      "semantic": self.weights["semantic"]}}
        if floored:
            out["semantic_floor"] = self.semantic_floor
        return out


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
    _positions: list[tuple[str, list[str], list[tuple[str, float]]]] | None = None

    @property
    def ids(self) -> list[str]:
        return [rid for rid, _ in self.fused]

    def __len__(self) -> int:
        return len(self.fused)

    def hits(self, start: int, stop: int) -> list[RankedHit]:
        if self._positions is None:  # each channel's ids, searched in C for the few hits shown
            self._positions = [(name, [rid for rid, _ in found], found)
                               for name, found in sorted(self.channels.items())]
        out = []
        for rid, score in self.fused[start:stop]:
            evidence = {}
            for name, ids, found in self._positions:
                try:
                    i = ids.index(rid)
                except ValueError:  # this channel did not find it
                    continue
                evidence[name] = (i + 1, found[i][1])
            out.append(RankedHit(rid, float(score), evidence))
        return out


def rank(channels: Mapping[str, list[tuple[str, float]]], config: FusionConfig,
         lexical_coverage: float = 1.0, semantic_foreign: bool = False) -> Ranking:
    """Fuse the contributing channels; a single channel keeps its own order and raw score.

    Fusion across languages: when the query's lexical coverage (the share of its terms found in the
    scope) is below ``config.coverage_full``, the lexical channel's weight is scaled by
    ``coverage / coverage_full`` -- a question in another language than the memory matches it on a
    few names and numbers only, and those must not pull the semantic ranking down. The mirror: when
    the query is in a language the embedding model was not trained for (``semantic_foreign``), the
    semantic channel's weight is scaled by ``config.foreign_scale`` -- its nearest records are noise
    that must not pull a good lexical ranking down.

    Every input list is already sorted (-score, record_id) with unique ids -- the indexes return
    them so -- and the output is sorted the same way. Then a hit only the semantic channel found
    whose cosine is below ``config.semantic_floor`` is dropped (the fused scores of the others do
    not move): nothing lexical and nothing close means "no match", an empty answer.
    """
    if not channels:
        return Ranking([], channels)
    if len(channels) == 1:
        (_name, fused), = channels.items()
    elif config.method == FusionMethod.RRF:
        lexical, semantic = config.lexical_scale(lexical_coverage), config.semantic_scale(semantic_foreign)
        weights = None if lexical == semantic == 1.0 else {"lexical": lexical, "semantic": semantic}
        fused = fusion_fns.rrf(channels, k=config.k, checked=False, weights=weights)
    elif config.method == FusionMethod.DBSF:
        fused = fusion_fns.dbsf(channels, weights=_scaled(config, lexical_coverage, semantic_foreign), checked=False)
    elif config.method == FusionMethod.CONVEX:
        fused = fusion_fns.convex(channels, weights=_scaled(config, lexical_coverage, semantic_foreign), checked=False)
    else:
        raise ValueError(f"unknown fusion method {config.method}")
    weak = weak_semantic(channels, config.semantic_floor)
    return Ranking([hit for hit in fused if hit[0] not in weak] if weak else list(fused), channels)


def _scaled(config: FusionConfig, coverage: float, foreign: bool) -> dict[str, float]:
    weights = dict(config.weights)
    weights["lexical"] = weights["lexical"] * config.lexical_scale(coverage)
    weights["semantic"] = weights["semantic"] * config.semantic_scale(foreign)
    return weights


def floored(channels: Mapping[str, object]) -> bool:
    """The floor applies when both channels ranked (the receipt names it exactly then)."""
    return "lexical" in channels and "semantic" in channels


def weak_semantic(channels: Mapping[str, list[tuple[str, float]]], floor: float) -> set[str]:
    """Ids only the semantic channel found, with a cosine below ``floor``.

    Only when the lexical channel ranked too: "found by no query word" needs it to have looked
    (a semantic-only configuration, as the evaluation scores the channel alone, is not floored).
    """
    semantic = channels.get("semantic", ())
    if not floored(channels) or not semantic or semantic[-1][1] >= floor:  # the last is the lowest
        return set()
    lexical = {rid for rid, _ in channels.get("lexical", ())}
    return {rid for rid, score in semantic if score < floor and rid not in lexical}
