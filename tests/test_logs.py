"""Log lines stay one line each whatever a request carried (issue 33 §3, server/logs.py)."""

from __future__ import annotations

import io
import logging

from engram_memory.server.logs import FORMAT, EscapingFormatter, escaped


def test_controls_separators_and_bidi_overrides_are_escaped() -> None:
    assert escaped("plain text: é ü 中 ✓") == "plain text: é ü 中 ✓"
    assert escaped("a\nb\rc\td\x00e\x1b[31mf\x7fg") == "a\\x0ab\\x0dc\\x09d\\x00e\\x1b[31mf\\x7fg"
    assert escaped("\x85\x9b\u2028\u2029\u202e\u2066\u200f") == "\\x85\\x9b\\u2028\\u2029\\u202e\\u2066\\u200f"


def test_the_formatter_escapes_the_message_and_leaves_the_record() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(EscapingFormatter(FORMAT))
    logger = logging.getLogger("engram-test-logs")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning("Invalid Origin header: %s", "http://x\n2026-01-01 00:00:00 INFO forged")
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert text.count("\n") == 1
    assert text.endswith("Invalid Origin header: http://x\\x0a2026-01-01 00:00:00 INFO forged\n")
