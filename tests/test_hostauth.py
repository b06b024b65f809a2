"""Signed host contexts and confirmations: claim shapes, the operation digest, refusals."""

from __future__ import annotations

import hashlib
import time

import jwt
import pytest
import rfc8785

from engram_memory.models.context import HostContext
from engram_memory.models.hostauth import (
    CLOCK_LEEWAY_S,
    ConfirmationClaims,
    ContextClaims,
    HostSigner,
    ReplayCache,
    TokenRefused,
    new_private_key,
    operation_digest,
    read_token,
    verify,
)

HOST = HostContext("t1", "w1", "alice", "agent-1", "purpose:x", "sess")
KEY = new_private_key()
SIGNER = HostSigner("host-a", KEY, "engram-local")


def test_replay_cache_accepts_each_id_once_until_it_expires() -> None:
    cache = ReplayCache()
    assert cache.claim("h", "j1", exp=100, now=50)
    assert not cache.claim("h", "j1", exp=100, now=60)  # replay
    assert cache.claim("other-host", "j1", exp=100, now=60)  # ids are per host
    assert cache.claim("h", "j2", exp=200, now=60)
    # Once j1 has expired (plus leeway) it is forgotten: its token is refused as expired anyway.
    assert cache.claim("h", "j3", exp=300, now=100 + CLOCK_LEEWAY_S + 1)
    assert len(cache) == 2  # j2 and j3 remain


def test_operation_digest_is_the_issue_recipe() -> None:
    args = {"record_id": "mem_abc", "idempotency_key": "k" * 16, "reason_ref": "reason:x"}
    body = {"tool": "engram_memory_forget", "tenant": "t1", "workspace": "w1", "principal": "alice",
            "arguments": args}
    expected = "sha256:" + hashlib.sha256(b"engram-memory/operation/v1\x00" + rfc8785.dumps(body)).hexdigest()
    assert operation_digest("forget", HOST, args) == expected
    assert operation_digest("engram_memory_forget", HOST, args) == expected
    assert operation_digest("forget", HOST, {**args, "reason_ref": "reason:y"}) != expected


def test_a_signed_context_verifies_into_its_claims() -> None:
    now = time.time()
    token, kid = read_token(SIGNER.context(HOST, ["search", "get"], ["capture"], deadline="2030-01-01T00:00:00.000Z"))
    claims = verify(token, KEY.public_key(), "engram-local", now, ContextClaims)
    assert kid == "host-a" and claims.host() == HOST and claims.tools == ["search", "get"]
    assert claims.deadline_ms() == 1_893_456_000_000
    conf = verify(SIGNER.confirmation("forget", HOST, {"record_id": "mem_x"}), KEY.public_key(), "engram-local",
                  now, ConfirmationClaims)
    assert conf.capability == "forget" and conf.target == "mem_x"


@pytest.mark.parametrize("case", ["audience", "lifetime", "expired", "future", "other-key", "extra-claim",
                                  "hs256", "none", "no-kid", "bad-tool", "bad-tenant"])
def test_refusals(case: str) -> None:
    now = time.time()
    key, audience = KEY.public_key(), "engram-local"
    if case == "audience":
        token = SIGNER.context(HOST, ["search"])
        audience = "another-server"
    elif case == "lifetime":
        token = SIGNER.context(HOST, ["search"], ttl_s=301)
    elif case == "expired":
        token = SIGNER.context(HOST, ["search"], now=now - 400)
    elif case == "future":
        token = SIGNER.context(HOST, ["search"], now=now + 120)
    elif case == "other-key":
        token = HostSigner("host-a", new_private_key(), "engram-local").context(HOST, ["search"])
    else:
        claims = {"tenant": "t1", "workspace": "w1", "principal": "p", "agent_id": "a", "session": "s",
                  "purpose_ref": "purpose:x", "tools": ["search"], "aud": "engram-local", "iat": int(now),
                  "exp": int(now) + 60, "jti": "j"}
        headers: dict[str, str] = {"kid": "host-a"}
        algorithm = "EdDSA"
        signing_key: object = KEY
        if case == "extra-claim":
            claims["tenants"] = ["t2"]
        elif case == "bad-tool":
            claims["tools"] = ["admin"]
        elif case == "bad-tenant":
            claims["tenant"] = "a/b"
        elif case == "hs256":
            algorithm, signing_key = "HS256", "shared-secret-of-at-least-32-bytes!!"
        elif case == "none":
            algorithm, signing_key = "none", None
        elif case == "no-kid":
            headers = {}
        token = jwt.encode(claims, signing_key, algorithm=algorithm, headers=headers)  # type: ignore[arg-type]
    with pytest.raises(TokenRefused):
        token, _ = read_token(token)
        verify(token, key, audience, now, ContextClaims)
