"""The default host admission policy.

Accept a valid candidate, reject one that carries secret-like content anywhere (TOOL_CONTRACT §4:
secrets never become memory). EVERY string of the candidate is screened -- component texts and
ids, citation ids, source refs and locators, the primary event's type_ref, family refs,
purpose_ref, the evidence ref and attestation, whatever the payload holds -- by walking the
whole structure (store/screen/secrets.py), not by listing fields. Digest fields are screened too: a
``sha256:<hex>`` never matches.

A secret is a normal outcome (``rejected``), never an error: the rejected candidate's sealed
envelope is dropped with its key, and no record id is ever minted for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import chain
from typing import Any, Literal

from engram_memory.store.screen import lazy
from engram_memory.store.screen.limits import MIN_SECRET_CHARS

__all__ = ["POLICY_ID", "POLICY_VERSION", "DefaultAdmissionPolicy", "contains_secret", "secret_kind"]

POLICY_ID = "engram-memory:default-admission"
# Bumped to "2" when every string of the candidate became screened, to "3" when credentials stated
# in prose in four languages became secrets (store/screen/statements.py), to "4" when the learned screen
# (store/screen/secret_model.py) joined the rules (issue 36): the version is bound into every
# admission decision receipt (tests/golden pins them) and into eval store keys.
POLICY_VERSION = "4"

Decision = Literal["accept", "reject", "adjudication_required"]


def contains_secret(texts: Iterable[str]) -> bool:
    """True when any of ``texts`` carries secret-like content."""
    find_secret = lazy.secrets().find_secret
    return any(find_secret(text) for text in texts)


def _texts(payload: dict[str, Any], evidence: dict[str, Any]) -> Iterator[str]:
    """Every string the candidate carries: what the policy screens (``contains_secret(_texts(...))``
    is its verdict)."""
    strings_of = lazy.secrets().strings_of
    return chain(strings_of(payload), strings_of(evidence))


# The screen is a pure function of the text, and most strings of a candidate are field names and
# constants every candidate repeats ("citations", "make-ineligible", a purpose_ref): an import screens
# ~45 strings an item, ~3 of them new. Its batches screen short strings once (``screen_cache()``).
# The cache lives for one batch only: one kept by the process would answer a string another tenant
# sent sooner than a new one (a timing channel across tenants) and hold agent-written text in memory
# after it was forgotten.
SCREEN_CACHED_CHARS = 256
_batch_cache: ContextVar[dict[str, str | None] | None] = ContextVar("engram_screen_cache", default=None)


@contextmanager
def screen_cache(known: Mapping[str, str | None] | None = None) -> Iterator[None]:
    """Within the block, a short string is screened once (an import batch of one operator's file).
    ``known``: this batch's texts already screened (on the import's second process,
    store/host/import_worker.py), answered from here whatever their length. Inside a block that
    has a cache already, the outer one serves."""
    if known is None and _batch_cache.get() is not None:
        yield
        return
    token = _batch_cache.set(dict(known) if known else {})
    try:
        yield
    finally:
        _batch_cache.reset(token)


# A digest field's value (``sha256:`` and 64 hex digits) never matches (see above): not screened
# again at ~1 ms each (an import item carries two new ones).
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_UNKNOWN = object()


def needs_screening(text: str) -> bool:
    """False for a text the screen passes without looking: too short to hold a secret, or a digest."""
    return len(text) >= MIN_SECRET_CHARS and not (len(text) == 71 and _DIGEST.fullmatch(text))


def _screen(text: str) -> str | None:
    if not needs_screening(text):
        return None
    cache = _batch_cache.get()
    if cache is not None:
        found = cache.get(text, _UNKNOWN)
        if found is not _UNKNOWN:
            return found  # type: ignore[return-value]
    kind = lazy.secrets().find_secret(text)
    if cache is not None and len(text) <= SCREEN_CACHED_CHARS:
        cache[text] = kind
    return kind


def secret_kind(payload: dict[str, Any], evidence: dict[str, Any]) -> str | None:
    """The kind of the first secret anywhere in a candidate (never the value), or None: a rule's kind, or
    ``"classifier"`` when only the learned screen fired (reported as ``secret:classifier``)."""
    for text in _texts(payload, evidence):
        kind = _screen(text)
        if kind is not None:
            return kind
    return None


class DefaultAdmissionPolicy:
    policy_id = POLICY_ID
    policy_version = POLICY_VERSION

    def decide(self, payload: dict[str, Any], evidence: dict[str, Any]) -> Decision:
        return "reject" if secret_kind(payload, evidence) is not None else "accept"
