"""The default host admission policy.

Accept a valid candidate, reject one whose text or citations carry secret-like content
(TOOL_CONTRACT §4). Detection uses the maintained ``detect-secrets`` plugins (minus the
entropy heuristics, which fire on ordinary prose) plus a few patterns for material it
does not cover (.env assignments, cookies, connection strings with credentials).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Literal

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

POLICY_ID = "engram-memory:default-admission"
POLICY_VERSION = "1"

Decision = Literal["accept", "reject", "adjudication_required"]

_EXTRA_PATTERNS = [
    # .env style assignment of a secret-named variable to a non-trivial value
    re.compile(
        r"\b[A-Z0-9_]*(SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|PRIVATE_?KEY|CREDENTIALS?)[A-Z0-9_]*"
        r"\s*=\s*[\"']?[^\s\"']{6,}"
    ),
    # URI with inline user:password credentials (databases, brokers, http)
    re.compile(r"(?i)\b[a-z][a-z0-9+.-]{1,20}://[^\s/:@]+:[^\s/@]+@[^\s/]+"),
    # ODBC / ADO style connection strings with a password
    re.compile(r"(?i)\b(password|pwd)\s*=\s*[^;\s]{3,}\s*;"),
    # provider API keys detect-secrets does not know (OpenAI project keys, Anthropic keys)
    re.compile(r"\bsk-(proj-|ant-[a-z0-9]+-)?[A-Za-z0-9_-]{20,}"),
    # session cookies and bearer tokens
    re.compile(r"(?i)\b(set-cookie|cookie)\s*:\s*\S+=\S{8,}"),
    re.compile(r"(?i)\bbearer\s+[a-z0-9._~+/=-]{16,}"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    # "password: value" in prose or YAML
    re.compile(
        r"(?i)\b(password|passwd|passphrase|secret|api[_ -]?key|access[_ -]?token|auth[_ -]?token)"
        r"\s*[:=]\s*[\"']?[^\s\"']{6,}"
    ),
]


def _texts(payload: dict[str, Any], evidence: dict[str, Any]) -> Iterable[str]:
    for component in payload["components"]:
        yield component["text"]
    for citation in payload["citations"]:
        yield citation["source_ref"]
        yield citation["locator"]["scheme"]
        yield citation["locator"]["value"]
    yield evidence["evidence_ref"]
    if "attestation" in evidence:
        yield evidence["attestation"]


# The rule-based detectors only: the entropy heuristics fire on ordinary prose, a public IP
# address is not a secret, and detect-secrets' filters (built for source files) cost 20x the
# scan. The detectors are built once and asked line by line -- what ``scan_line`` does with no
# filters, minus its per-call settings reload (a third of the policy's cost, measured).
# Verification (a network call) stays off: its filter is not in the default settings.
_PLUGINS: list[type[Any]] = list(get_mapping_from_secret_type_to_class().values())
_DETECTORS = tuple(
    cls()
    for cls in sorted(_PLUGINS, key=lambda c: c.__name__)
    if "Entropy" not in cls.__name__ and cls.__name__ != "IPPublicDetector"
)
_ADHOC = "adhoc-string-scan"  # the file name scan_line uses: the keyword detector's "other" rules


def contains_secret(texts: Iterable[str]) -> bool:
    texts = list(texts)
    if any(p.search(text) for text in texts for p in _EXTRA_PATTERNS):
        return True
    return any(
        detector.analyze_line(filename=_ADHOC, line=line, line_number=0)
        for text in texts
        for line in text.splitlines() or [text]
        for detector in _DETECTORS
    )


class DefaultAdmissionPolicy:
    policy_id = POLICY_ID
    policy_version = POLICY_VERSION

    def decide(self, payload: dict[str, Any], evidence: dict[str, Any]) -> Decision:
        return "reject" if contains_secret(_texts(payload, evidence)) else "accept"
