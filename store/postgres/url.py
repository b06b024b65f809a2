"""The store URL rules, checked before anything connects (pure: nothing here opens a connection).

A password never travels in argv, TOML or logs: libpq finds it in PGPASSWORD, ~/.pgpass or a service
file. A URL that carries one is refused, and no message here ever repeats the URL."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SCHEMES = ("postgresql://", "postgres://")
PASSWORD_REFUSED = (
    "the store URL carries a password; give it through PGPASSWORD, ~/.pgpass or a libpq service file instead"
)
# psycopg is the `postgres` extra: a default install serves DuckDB only, and a PostgreSQL URL says what to add.
DRIVER_MISSING = "PostgreSQL support is not installed: pip install 'engram-memory[postgres]'"
NOT_POSTGRES = "the store URL is not a PostgreSQL URL (postgresql://USER@HOST:PORT/DB)"


def check_store_url(text: str) -> str:
    """Return `text` unchanged when it is a password-free libpq URL; else ValueError (URL not echoed)."""
    if not isinstance(text, str) or not text.startswith(SCHEMES):  # libpq: lower-case schemes only
        raise ValueError(NOT_POSTGRES)
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise ValueError(DRIVER_MISSING) from None
    try:
        # libpq's own parser: what it accepts is what a connection would use, query parameters included.
        params = conninfo_to_dict(text)
    except psycopg.Error:
        # libpq's message quotes the offending part, which may be the password: not repeated.
        raise ValueError(NOT_POSTGRES + ": libpq cannot parse it") from None
    if "password" in params:
        raise ValueError(PASSWORD_REFUSED)
    return text


def redact_url(text: str) -> str:
    """The URL with any password replaced by `***`, for logs (anything unparseable is withheld whole)."""
    try:
        parts = urlsplit(text)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hosts = netloc.rpartition("@")
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{hosts}"
        query = urlencode(
            [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)],
            safe="/*",
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return "<unparseable store URL withheld>"
