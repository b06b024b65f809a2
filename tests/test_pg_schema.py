"""The PostgreSQL schema and its migrations ledger, on a real PostgreSQL (tests/conftest.py: pg_database),
and the store URL rules (pure)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from engram_memory.store.postgres import schema
from engram_memory.store.postgres.schema import MIGRATIONS, migrate, migration_digest
from engram_memory.store.postgres.url import check_store_url, redact_url

TABLES = {
    "schema_migrations", "meta", "scopes", "journal", "candidates", "records", "embeddings",
    "tombstoned_payloads", "idempotency", "audit", "data_keys", "nodes", "replay", "store_identity", "node_cursors",
    "approvals",
}


def tables(conn: psycopg.Connection) -> set[str]:
    rows = conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'").fetchall()
    return {name for (name,) in rows}


def ledger(conn: psycopg.Connection) -> list[tuple[int, str, str]]:
    return conn.execute("SELECT version, digest, applied_at FROM schema_migrations ORDER BY version").fetchall()


def column_types(conn: psycopg.Connection, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s", [table]
    ).fetchall()
    return dict(rows)


def test_migrate_creates_every_table_and_records_each_migration(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn:
        assert tables(conn) == set()
        conn.commit()
        migrate(conn)
        assert tables(conn) == TABLES
        assert [(v, d) for v, d, _ in ledger(conn)] == [(v, migration_digest(sql)) for v, _, sql in MIGRATIONS]
        # migrate committed: another connection sees the schema
    with psycopg.connect(pg_database) as other:
        assert tables(other) == TABLES


def test_column_types_keep_bodies_byte_exact_and_cursors_signed(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn:
        migrate(conn)
        journal = column_types(conn, "journal")
        assert journal["body"] == "text"  # never jsonb: the hash is over these exact bytes
        assert journal["cursor"] == "bigint"
        assert column_types(conn, "candidates")["envelope"] == "bytea"
        assert column_types(conn, "records")["event_at"] == "bigint"
        assert column_types(conn, "records")["body"] == "bytea"
        assert column_types(conn, "audit")["context_jti"] == "text"
        assert column_types(conn, "data_keys") == {
            "key_ref": "text", "wrapped": "bytea", "created_at": "timestamp with time zone"}
        assert "heartbeat_at" in column_types(conn, "nodes")
        assert set(column_types(conn, "replay")) == {"kid", "jti", "exp"}
        assert "master_key_fingerprint" in column_types(conn, "store_identity")
        # a body comes back byte for byte, key order and spacing included
        body = '{"z":1,"a":[2,1],"m":"caf\u00e9"}'
        conn.execute(
            "INSERT INTO journal VALUES ('s', 1, 'e1', 'capture', %s, 'sha256:x')", [body]
        )
        assert conn.execute("SELECT body FROM journal").fetchone() == (body,)
        # no unsigned type: the CHECK keeps a cursor from going negative
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO scopes VALUES ('s', -1, 'h', 0)")


def test_rerunning_migrate_is_a_no_op(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn:
        migrate(conn)
        first = ledger(conn)
        conn.execute("INSERT INTO meta VALUES ('k', 'v')")
        conn.commit()
        migrate(conn)
        migrate(conn)
        assert ledger(conn) == first  # same versions, same applied_at: nothing re-applied
        assert conn.execute("SELECT value FROM meta").fetchall() == [("v",)]


def test_nodes_starting_at_once_apply_each_migration_exactly_once(pg_database: str) -> None:
    nodes = 4
    barrier = threading.Barrier(nodes)
    errors: list[BaseException] = []

    def node() -> None:
        try:
            with psycopg.connect(pg_database) as conn:
                barrier.wait()
                migrate(conn)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=node) for _ in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with psycopg.connect(pg_database) as conn:
        rows = conn.execute("SELECT version, count(*) FROM schema_migrations GROUP BY version ORDER BY 1").fetchall()
        assert rows == [(v, 1) for v, _, _ in MIGRATIONS]
        assert tables(conn) == TABLES


def test_tampered_ledger_digest_is_refused(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn:
        migrate(conn)
        conn.execute("UPDATE schema_migrations SET digest = %s WHERE version = 1", ["sha256:" + "0" * 64])
        conn.commit()
        with pytest.raises(RuntimeError, match="MIGRATION_LEDGER_INVALID"):
            migrate(conn)


def test_a_failing_migration_leaves_nothing_behind(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = [*MIGRATIONS, (99, "broken", "CREATE TABLE half_done (x INT); SELECT no_such_column FROM meta;")]
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    with psycopg.connect(pg_database) as conn:
        with pytest.raises(psycopg.errors.UndefinedColumn):
            migrate(conn)
        conn.rollback()
        assert tables(conn) == set()  # one transaction: not even the earlier migrations stayed


def test_migrate_refuses_a_connection_inside_a_transaction(pg_database: str) -> None:
    with psycopg.connect(pg_database) as conn:
        conn.execute("SELECT 1")
        with pytest.raises(RuntimeError, match="no transaction open"):
            migrate(conn)


# --- the store URL (pure) ---------------------------------------------------------------------------

PASSWORD = "Hunter2-s3cret"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://engram@127.0.0.1:55432/engram",
        "postgres://engram@db.internal/engram",
        "postgresql://engram@[::1]:5432/engram?sslmode=verify-full&connect_timeout=5",
        "postgresql:///engram?host=/var/run/postgresql",
        "postgresql://%2Fvar%2Frun%2Fpostgresql/engram",
        "postgresql://engram@h1:5432,h2:5433/engram?target_session_attrs=read-write",
        "postgresql://engram@127.0.0.1/engram?service=engram",
    ],
)
def test_password_free_postgres_urls_are_accepted(url: str) -> None:
    assert check_store_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://engram:{PASSWORD}@127.0.0.1:5432/engram",
        f"postgres://engram:{PASSWORD}@db/engram",
        f"postgresql://engram@127.0.0.1/engram?password={PASSWORD}",
        f"postgresql://engram@127.0.0.1/engram?sslmode=require&password={PASSWORD}",
    ],
)
def test_a_url_with_a_password_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(ValueError, match="carries a password") as info:
        check_store_url(url)
    message = str(info.value)
    assert PASSWORD not in message and url not in message and "\n" not in message
    assert info.value.__context__ is None  # raised afresh: no chained libpq error carries the URL


@pytest.mark.parametrize(
    "url",
    [
        "",
        "mysql://engram@127.0.0.1/engram",
        f"host=127.0.0.1 user=engram password={PASSWORD}",
        "engram.duckdb",
        "POSTGRESQL://engram@127.0.0.1/engram",  # libpq takes lower-case schemes only
        f"postgresql://engram@127.0.0.1/engram?no_such_option={PASSWORD}",
        f"postgresql://engram:{PASSWORD}@127.0.0.1:notaport/engram",
    ],
)
def test_what_is_not_a_postgres_url_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(ValueError) as info:
        check_store_url(url)
    message = str(info.value)
    assert PASSWORD not in message and (not url or url not in message) and "\n" not in message
    assert info.value.__suppress_context__ or info.value.__context__ is None


def test_redact_url_hides_every_password() -> None:
    assert redact_url(f"postgresql://engram:{PASSWORD}@db:5432/engram?sslmode=require") == (
        "postgresql://engram:***@db:5432/engram?sslmode=require"
    )
    assert redact_url(f"postgresql://engram@db/engram?password={PASSWORD}&sslmode=require") == (
        "postgresql://engram@db/engram?password=***&sslmode=require"
    )
    plain = "postgresql://engram@127.0.0.1:55432/engram"
    assert redact_url(plain) == plain
