"""The host's allow receipt for an operation (TOOL_CONTRACT §0: the host authorizes every call)."""

from __future__ import annotations

from typing import Any

from engram_memory.models.context import HostContext
from engram_memory.models.digests import DOMAIN_PREFIX, digest, receipt_digest

AUTHZ_POLICY_VERSION = "engram-memory:launch-bound:v1"


def authorization_receipt(ctx: HostContext, operation: str, resource: dict[str, Any]) -> str:
    """The launch-bound host's allow receipt: deterministic, binds scope, principal and agent."""
    resource_digest = digest(
        f"{DOMAIN_PREFIX}/authorization-resource/v1\0", {"operation": operation, "resource": resource}
    )
    return receipt_digest(
        "authorization-allowed",
        {
            "allowed": True,
            "operation": operation,
            "resource_digest": resource_digest,
            "scope_ref": ctx.scope_ref,
            "principal": ctx.principal,
            "agent_id": ctx.agent_id,
            "policy_version": AUTHZ_POLICY_VERSION,
        },
    )
