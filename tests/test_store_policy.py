"""The default admission policy's secret detector: what must be refused, and prose that must not be."""

from __future__ import annotations

import pytest

from engram_memory.store.screen.policy import contains_secret

SECRETS = [
    "DATABASE_PASSWORD=s3cr3tvalue",
    "export STRIPE_API_KEY=sk_live_abcdefghijklmnop",
    "postgres://admin:hunter2@db.internal:5432/app",
    "amqp://svc:Zx81-secret@broker:5672",
    "Server=x;Database=y;User Id=z;Password=abc123;",
    "Authorization: Bearer abcdefghijklmnopqrstuvwxyz123456",
    "Cookie: session=8f2a9c0e4b7d1f3a5c6e",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_1234567890abcdefghijklmnopqrstuvwxyzAB",
    "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
    "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH",
    "sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789",
    "password: correcthorsebattery",
    "-----BEGIN OPENSSH PRIVATE KEY-----",
    "token: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
]

PROSE = [
    "The password reset flow sends an email to the user.",
    "We decided to use DuckDB as the single source of truth.",
    "The API key rotation happens monthly, owned by the platform team.",
    "Set the token expiry to 30 minutes for the mobile client.",
    "The resolver at 8.8.8.8 answers DNS for the build agents.",
    "Commit 3f9a1c2 fixed the flaky retry test in the billing service.",
    "Connection strings live in the vault, never in the repository.",
]


@pytest.mark.parametrize("text", SECRETS)
def test_secret_like_content_is_detected(text: str) -> None:
    assert contains_secret([f"Notes from the incident. {text} Follow-up owed."])


@pytest.mark.parametrize("text", PROSE)
def test_ordinary_prose_is_not_flagged(text: str) -> None:
    assert not contains_secret([text])


def test_the_screen_keeps_no_strings_beyond_an_import_batch() -> None:
    """A process-wide cache of screened strings would answer a string another tenant sent sooner than a
    new one (a timing channel across tenants) and keep agent text in memory after forget: only a batch
    of one import caches, and only for the batch."""
    from engram_memory.store.screen import policy

    payload = {"components": [{"text": "we moved the standup to ten on Mondays"}]}
    assert policy.secret_kind(payload, {}) is None
    assert policy._batch_cache.get() is None
    with policy.screen_cache():
        assert policy.secret_kind(payload, {}) is None
        held = policy._batch_cache.get()
        assert held is not None and "we moved the standup to ten on Mondays" in held
    assert policy._batch_cache.get() is None
    assert not hasattr(policy, "_screen_short")
    # Nor the learned screen's features: no function of it holds a cache of the tokens it saw.
    from engram_memory.store.screen import secret_model

    assert policy.secret_kind({"components": [{"text": "wifi pass is pollitos1958"}]}, {}) is not None
    caching = [name for name, f in vars(secret_model).items() if callable(f) and hasattr(f, "cache_info")
               and f.cache_info().currsize and name != "load_model"]
    assert caching == []
