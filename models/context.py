"""The host-bound invocation context and host policy: never part of tool arguments."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engram_memory.models.digests import receipt_digest

# Host identifiers become part of scope_ref and directory names: keep them to a safe alphabet.
HOST_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")

ALL_TOOLS = ("search", "get", "capture", "request_admission", "withdraw", "forget")
TOOL_PREFIX = "engram_memory_"
ALWAYS_CONFIRMED = frozenset({"withdraw", "forget"})
CONFIRMABLE = frozenset({"capture", "request_admission"})


@dataclass(frozen=True)
class HostContext:
    tenant: str
    workspace: str
    principal: str
    agent_id: str
    purpose_ref: str
    session: str = "stdio"

    def __post_init__(self) -> None:
        for name in ("tenant", "workspace", "principal", "agent_id"):
            if not HOST_ID_PATTERN.match(getattr(self, name)):
                raise ValueError(f"invalid host {name}")

    @property
    def scope_ref(self) -> str:
        return f"tenant:{self.tenant}/workspace:{self.workspace}"

    @property
    def source_ref(self) -> str:
        """Principal-scoped constant feeding candidate_id (same for every retry)."""
        return receipt_digest(
            "connector-source",
            {"tenant": self.tenant, "workspace": self.workspace, "principal": self.principal},
        )


@dataclass(frozen=True)
class HostPolicy:
    """What the host allows at capture and how records are redacted for the agent."""

    retention_ceiling_ms: int | None = None  # None: no ceiling
    allow_retain: bool = False
    consented_families: frozenset[str] = field(default_factory=frozenset)
    # top-level record fields omitted from packets; record_id can never be redacted
    redacted_fields: tuple[str, ...] = ("scope_ref",)
    policy_version: str = "engram-memory:host-policy:v1"


def scope_names(scope_ref: str) -> tuple[str, str] | None:
    """``tenant:T/workspace:W`` -> (T, W); None for anything else. Host ids never contain '/'."""
    tenant, sep, workspace = scope_ref.partition("/")
    if sep and tenant.startswith("tenant:") and workspace.startswith("workspace:"):
        return tenant.removeprefix("tenant:"), workspace.removeprefix("workspace:")
    return None
