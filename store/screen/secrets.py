"""Secret screening for the default admission policy (TOOL_CONTRACT §4: secrets never become memory).

``find_secret(text)`` says whether one string carries secret material, and what kind (never the
value). ``strings_of(obj)`` walks any JSON structure and yields every string in it, so the
policy screens the whole candidate -- component texts, ids, refs, locators, citations, event
type, family refs, purpose, evidence -- without a list of fields to keep up to date.

The screen runs the rule families (store/screen/rules.py: token shapes, key/value assignments,
plain-language credentials, detect-secrets' detectors, and the benign-value filter they share),
credentials laid out in tables and configs (store/screen/secret_layouts.py), the statement judge
(store/screen/statements.py), and the learned screen beside them (store/screen/secret_model.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from engram_memory.store.screen.limits import MIN_SECRET_CHARS
from engram_memory.store.screen.rules import find_in_line, find_shape, names_a_statement
from engram_memory.store.screen.secret_layouts import find_in_layout
from engram_memory.store.screen.secret_model import load_model
from engram_memory.store.screen.statements import find_statement

__all__ = ["CLASSIFIER_KIND", "contains_secret", "find_rule_secret", "find_secret", "rule_findings", "rules_only",
           "strings_of"]

# ---- the screen -----------------------------------------------------------------------------------


# A provider's documentation example (AWS ends every example key so: AKIAIOSFODNN7EXAMPLE,
# wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY) in a text that says it is one (docs, an example, a sample,
# a tutorial, in the screen's languages) grants nothing: the rules read it as a placeholder. Without
# such words it is still screened: people paste the example as their own key.
_DOCUMENTED_EXAMPLE = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{4,40}EXAMPLE(?:KEY)?(?![A-Za-z0-9/+])")
_SAYS_EXAMPLE = re.compile(r"(?i)\bdoc|exampl|exempl|ejempl|esempi|beispiel|voorbeeld|sample|tutorial|例")


def find_rule_secret(text: str) -> str | None:
    """The kind of the first secret the rules find in ``text``, or None. Never returns the value."""
    return next(rule_findings(text), None)


def rule_findings(text: str) -> Iterator[str]:
    """What the rules find in ``text``, in order: token shapes and layouts over the whole text, then
    each line's first finding."""
    if not text or len(text) < MIN_SECRET_CHARS:
        return
    if "EXAMPLE" in text:
        masked = _DOCUMENTED_EXAMPLE.sub("<example>", text)
        if _SAYS_EXAMPLE.search(masked.replace("<example>", "")):
            text = masked
    found = find_shape(text) or find_in_layout(text)
    if found:
        yield found
    for line in text.splitlines() or [text]:
        if len(line) < MIN_SECRET_CHARS:
            continue
        found = find_in_line(line) or (names_a_statement(line) and find_statement(line)) or None
        if found:
            yield found


# The learned screen beside the rules (store/screen/secret_model.py): on unless a caller measuring the rules
# alone turns it off for its own context (``rules_only()``: eval-secrets' "rules alone" column).
_LEARNED: ContextVar[bool] = ContextVar("engram_learned_secret_screen", default=True)
CLASSIFIER_KIND = "classifier"


@contextmanager
def rules_only() -> Iterator[None]:
    """Within this block (this context only), ``find_secret`` is the rules alone."""
    token = _LEARNED.set(False)
    try:
        yield
    finally:
        _LEARNED.reset(token)


def find_secret(text: str) -> str | None:
    """The kind of the first secret in ``text`` (a rule's kind, or ``"classifier"`` when only the learned
    screen fires), or None. Never returns the value. The decision is: a rule fires (a statement rule
    only if the model does not overrule it: ``SecretModel.overrules``) OR the model's probability
    reaches the threshold shipped in its card."""
    findings = rule_findings(text)
    found = next(findings, None)
    if not _LEARNED.get() or not text or len(text) < MIN_SECRET_CHARS:
        return found
    model = load_model()
    if model is None:
        return found
    while found is not None and model.overrules(found, text):
        found = next(findings, None)  # a later line may hold what no model overrules
    if found is not None:
        return found
    return CLASSIFIER_KIND if model.fires(text) else None


def strings_of(obj: Any) -> Iterator[str]:
    """Every string in a JSON structure (object keys included), depth first."""
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str):
                    yield key
                stack.append(value)
        elif isinstance(node, (list, tuple)):
            stack.extend(node)


def contains_secret(texts: Iterable[str]) -> bool:
    return any(find_secret(text) for text in texts)
