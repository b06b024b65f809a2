"""stderr logging for the server and the console: one line per record, whatever a request carried.

Libraries log values taken from requests (the SDK logs a refused ``Host`` or ``Origin`` header and
an unknown ``mcp-session-id``; uvicorn lets bytes 0x80-0xFF through in header values, which read
as C1 controls such as NEL or CSI). Every message is written with its control, line-separator and
bidirectional-override characters escaped (``\\x85``, ``\\u2028``), so no request can start a
forged log line or drive the terminal. A traceback appended to a record keeps its own lines.
"""

from __future__ import annotations

import logging
import re
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# C0 and C1 controls and DEL, the Unicode line and paragraph separators, bidi marks and overrides.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _code(match: re.Match[str]) -> str:
    point = ord(match.group())
    return f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}"


def escaped(text: str) -> str:
    """``text`` with every character that could break or disguise a log line written as an escape."""
    return _UNSAFE.sub(_code, text)


class EscapingFormatter(logging.Formatter):
    """A formatter whose ``%(message)s`` is escaped (the record itself is left as it was)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        message = record.message
        record.message = escaped(message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


def setup_stderr_logging(level: int) -> None:
    """The process's logging: records at ``level`` and above to stderr, one escaped line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
