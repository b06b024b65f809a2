"""Throwaway databases on a PostgreSQL server, for the harnesses that need a store of their own
(the crash harness, bench-http, the tests): created next to an admin URL whose role may CREATE
DATABASE, dropped afterwards. Not used by a serving node."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import psycopg


def reachable(url: str, timeout_s: int = 10) -> bool:
    """Whether a session opens on ``url`` (a harness checks its admin URL before it starts)."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=timeout_s) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def create_database(admin_url: str, prefix: str) -> str:
    """A fresh, empty database next to ``admin_url``'s; its URL."""
    name = f"{prefix}_{secrets.token_hex(6)}".lower()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    return urlsplit(admin_url)._replace(path="/" + name).geturl()


def drop_database(admin_url: str, url: str) -> None:
    """Drop the database ``url`` names (its sessions are ended first; absent is fine)."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@contextmanager
def fresh_database(admin_url: str, prefix: str) -> Iterator[str]:
    url = create_database(admin_url, prefix)
    try:
        yield url
    finally:
        drop_database(admin_url, url)


def backend_pids(url: str) -> list[int]:
    """The server processes serving ``url``'s database (other than this connection's)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return [int(p) for (p,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]


def sessions_of(conn: psycopg.Connection, application_name: str) -> int:
    """How many sessions of the database carry this application_name (a node names its own)."""
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND application_name = %s", [application_name]).fetchone()
    return int(row[0]) if row is not None else 0
