"""Signed host context and confirmations: the wire format a host uses to bind each call.

A host signs, per call, an EdDSA (Ed25519) JWT that names the scope, identity, purpose and
granted tools (``io.sentropic.engram/context`` in the request's ``_meta``), and for a
confirmed tool a second JWT binding the human's approval to one exact operation
(``io.sentropic.engram/confirmation``). Signing and verification are PyJWT's; this module
holds the claim shapes, the operation digest and the replay rule, once, for the server,
the host tooling and the benchmark alike.
"""

from __future__ import annotations

import hashlib
import heapq
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints, ValidationError

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.context import ALL_TOOLS, HOST_ID_PATTERN, TOOL_PREFIX, HostContext
from engram_memory.models.fields import Instant
from engram_memory.models.limits import CONFIRM_TTL_S, EXECUTION_WINDOW_S, OPAQUE_MAX_BYTES

CONTEXT_META_KEY = "io.sentropic.engram/context"
CONFIRMATION_META_KEY = "io.sentropic.engram/confirmation"
# Instead of a confirmation: the host cannot ask its human, the operator's queue decides; the value
# is how long the request may wait, in seconds (at most CONFIRM_TTL_S; store/host/approvals.py).
OPERATOR_APPROVAL_META_KEY = "io.sentropic.engram/operator-approval"
OPERATION_DOMAIN = b"engram-memory/operation/v1\x00"
ALGORITHM = "EdDSA"
MAX_TOKEN_LIFETIME_S = CONFIRM_TTL_S  # exp - iat, for contexts and confirmations alike
CLOCK_LEEWAY_S = 5  # host and server clocks on one machine or one LAN
MAX_TOKEN_CHARS = 8_192  # a context is a few hundred bytes; refuse before parsing anything bigger

HostId = Annotated[str, Strict(), StringConstraints(pattern=HOST_ID_PATTERN.pattern)]
Opaque = Annotated[str, Strict(), StringConstraints(min_length=1, max_length=OPAQUE_MAX_BYTES)]
ToolName = Annotated[str, Strict(), StringConstraints(pattern="^(" + "|".join(ALL_TOOLS) + ")$")]


class TokenRefused(Exception):
    """A context or confirmation that does not verify. Its text is for the server log only."""


class _Claims(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    aud: Opaque | None = None  # required for contexts, checked by PyJWT
    iat: Annotated[int, Strict()]
    exp: Annotated[int, Strict()]
    jti: Opaque
    nbf: Annotated[int, Strict()] | None = None


class ContextClaims(_Claims):
    tenant: HostId
    workspace: HostId
    principal: HostId
    agent_id: HostId
    session: Opaque
    purpose_ref: Opaque
    tools: list[ToolName]
    confirm: list[ToolName] = Field(default_factory=list)
    deadline: Instant | None = None

    def host(self) -> HostContext:
        return HostContext(
            tenant=self.tenant,
            workspace=self.workspace,
            principal=self.principal,
            agent_id=self.agent_id,
            purpose_ref=self.purpose_ref,
            session=self.session,
        )

    def deadline_ms(self) -> int | None:
        if self.deadline is None:
            return None
        moment = datetime.strptime(self.deadline, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)


class ConfirmationClaims(_Claims):
    capability: Opaque
    target: Annotated[str, Strict(), StringConstraints(max_length=OPAQUE_MAX_BYTES)]
    operation_digest: Annotated[str, Strict(), StringConstraints(pattern="^sha256:[0-9a-f]{64}$")]


def operation_digest(tool: str, host: HostContext, arguments: Mapping[str, Any]) -> str:
    """sha256 over the domain, one NUL, then the JCS of the operation (the issue's exact recipe)."""
    name = tool if tool.startswith(TOOL_PREFIX) else TOOL_PREFIX + tool
    body = {
        "tool": name,
        "tenant": host.tenant,
        "workspace": host.workspace,
        "principal": host.principal,
        "arguments": dict(arguments),
    }
    return "sha256:" + hashlib.sha256(OPERATION_DOMAIN + canonical_bytes(body)).hexdigest()


def confirmation_target(arguments: Mapping[str, Any]) -> str:
    """The id a confirmation is bound to: the record or candidate the call acts on ("" for capture)."""
    for key in ("record_id", "candidate_id"):
        value = arguments.get(key)
        if isinstance(value, str):
            return value
    return ""


# ---- keys ----------------------------------------------------------------------------------


def new_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("not an Ed25519 private key")
    return key


def load_public_key(pem: str) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(pem.encode("ascii"))
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def bearer_digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_bearer_token() -> str:
    return secrets.token_urlsafe(32)


# ---- signing (hosts) -----------------------------------------------------------------------


@dataclass(frozen=True)
class HostSigner:
    """A host's signing key: everything a host needs to bind calls to this server."""

    kid: str
    key: Ed25519PrivateKey
    audience: str

    def context(
        self,
        host: HostContext,
        tools: Sequence[str],
        confirm: Sequence[str] = (),
        *,
        ttl_s: int = 60,
        deadline: str | None = None,
        now: float | None = None,
        jti: str | None = None,
    ) -> str:
        iat = int(time.time() if now is None else now)
        claims: dict[str, Any] = {
            "tenant": host.tenant,
            "workspace": host.workspace,
            "principal": host.principal,
            "agent_id": host.agent_id,
            "session": host.session,
            "purpose_ref": host.purpose_ref,
            "tools": list(tools),
            "confirm": list(confirm),
            "aud": self.audience,
            "iat": iat,
            "exp": iat + ttl_s,
            "jti": jti or secrets.token_hex(16),
        }
        if deadline is not None:
            claims["deadline"] = deadline
        return self._sign(claims)

    def confirmation(
        self,
        tool: str,
        host: HostContext,
        arguments: Mapping[str, Any],
        *,
        ttl_s: int = 60,
        now: float | None = None,
        jti: str | None = None,
        target: str | None = None,
    ) -> str:
        iat = int(time.time() if now is None else now)
        claims = {
            "capability": tool.removeprefix(TOOL_PREFIX),
            "target": confirmation_target(arguments) if target is None else target,
            "operation_digest": operation_digest(tool, host, arguments),
            "aud": self.audience,
            "iat": iat,
            "exp": iat + ttl_s,
            "jti": jti or secrets.token_hex(16),
        }
        return self._sign(claims)

    def _sign(self, claims: dict[str, Any]) -> str:
        return jwt.encode(claims, self.key, algorithm=ALGORITHM, headers={"kid": self.kid})


# ---- verification (the server) ---------------------------------------------------------------


class ReplayCache:
    """Each (kid, jti) is accepted once until its token expires; thread-safe.

    Expired ids leave in expiry order (a heap), so a claim costs O(log n) however many
    contexts are live.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._by_expiry: list[tuple[int, str, str]] = []
        self._lock = threading.Lock()

    def claim(self, kid: str, jti: str, exp: int, now: float) -> bool:
        with self._lock:
            while self._by_expiry and self._by_expiry[0][0] + CLOCK_LEEWAY_S < now:
                _, old_kid, old_jti = heapq.heappop(self._by_expiry)
                self._seen.discard((old_kid, old_jti))
            if (kid, jti) in self._seen:
                return False
            self._seen.add((kid, jti))
            heapq.heappush(self._by_expiry, (exp, kid, jti))
            return True

    def __len__(self) -> int:
        return len(self._seen)


def read_token(token: object) -> tuple[str, str]:
    """(token, kid): the signing key named in the header (refused when absent or malformed)."""
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS or not token.isascii():
        raise TokenRefused("no token")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise TokenRefused(f"malformed header: {type(exc).__name__}") from None
    kid = header.get("kid")
    if header.get("alg") != ALGORITHM or not isinstance(kid, str) or not kid:
        raise TokenRefused("header must name alg EdDSA and a kid")
    return token, kid


def verify(token: str, key: Ed25519PublicKey, audience: str, now: float, kind: type[_Claims]) -> Any:
    """Signature, audience, lifetime and claim shape; returns the claims model."""
    try:
        raw = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            audience=audience,
            leeway=CLOCK_LEEWAY_S,
            options={"require": ["aud", "iat", "exp", "jti"], "verify_iat": True},
        )
    except jwt.PyJWTError as exc:
        raise TokenRefused(type(exc).__name__) from None
    if now > raw.get("exp", 0) + CLOCK_LEEWAY_S:  # PyJWT read its own clock; ours decides
        raise TokenRefused("expired")
    try:
        claims = kind.model_validate(raw)
    except ValidationError as exc:
        raise TokenRefused(f"claims: {exc.error_count()} invalid") from None
    if not 0 < claims.exp - claims.iat <= MAX_TOKEN_LIFETIME_S:
        raise TokenRefused(f"lifetime must be at most {MAX_TOKEN_LIFETIME_S} s")
    if claims.iat > now + CLOCK_LEEWAY_S:
        raise TokenRefused("issued in the future")
    return claims


def confirmation_fresh(claims: ConfirmationClaims, now: float) -> bool:
    """The call must arrive within the execution window after the approval was signed."""
    return now - claims.iat <= EXECUTION_WINDOW_S
