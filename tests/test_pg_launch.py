"""Selecting and starting the PostgreSQL backend (issue 22 §2), through the real command line.

`admin init-store` creates the schema and a master key file once; every launch mistake (a URL
with a password, a key that is not the store's, a key file that is no key, a store never
initialised) is one line and exit 2 before anything is served, and never prints a password.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import psycopg

BOUND = ["--tenant", "t", "--workspace", "w", "--principal", "p", "--agent-id", "a",
         "--purpose-ref", "purpose:x", "--tools", "search", "--no-semantic"]


def run(*argv: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["engram-memory", *map(str, argv)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def one_line(done: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert done.returncode == code, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("engram-memory: error: ") and text in done.stderr, done.stderr


def test_init_store_once_then_refuses_without_writing_a_file(pg_database: str, tmp_path: Path) -> None:
    key = tmp_path / "config" / "engram-memory" / "master.key"  # a folder a new machine does not have yet
    done = run("admin", "init-store", "--store", pg_database, "--master-key-out", key)
    assert done.returncode == 0, done.stderr
    assert key.stat().st_size == 32 and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    with psycopg.connect(pg_database) as conn:
        assert conn.execute("SELECT count(*) FROM store_identity").fetchone() == (1,)

    again = run("admin", "init-store", "--store", pg_database, "--master-key-out", tmp_path / "second.key")
    one_line(again, 1, "already initialised")
    assert not (tmp_path / "second.key").exists()
    assert sorted(p.name for p in key.parent.iterdir()) == ["master.key"]  # no temp file left either
    # An existing key file is never overwritten (and the store is not touched).
    before = key.read_bytes()
    one_line(run("admin", "init-store", "--store", pg_database, "--master-key-out", key), 2, "already exists")
    assert key.read_bytes() == before


def test_launch_mistakes_are_one_line_and_exit_2(pg_database: str, tmp_path: Path) -> None:
    key = tmp_path / "master.key"
    # A store never initialised: nothing to serve.
    one_line(run("serve", "--store", pg_database, "--master-key-file", tmp_path / "absent.key", *BOUND), 2,
             "cannot read the master key file")
    (tmp_path / "other.key").write_bytes(os.urandom(32))
    one_line(run("serve", "--store", pg_database, "--master-key-file", tmp_path / "other.key",
                 "--data-dir", tmp_path / "n0", *BOUND), 2, "not initialised")
    assert run("admin", "init-store", "--store", pg_database, "--master-key-out", key).returncode == 0

    wrong = run("serve", "--store", pg_database, "--master-key-file", tmp_path / "other.key",
                "--data-dir", tmp_path / "n1", *BOUND)
    one_line(wrong, 2, f"the master key file {tmp_path / 'other.key'} is not this store's master key")

    (tmp_path / "short.key").write_bytes(b"0123456789")
    one_line(run("serve", "--store", pg_database, "--master-key-file", tmp_path / "short.key", *BOUND), 2,
             "does not hold a 32-byte key")

    secret = "hunter2-s3cret"
    for url in (pg_database.replace("://", f"://engram:{secret}@", 1).replace("@engram@", "@", 1),
                pg_database + f"?password={secret}"):
        done = run("serve", "--store", url, "--master-key-file", key, *BOUND)
        one_line(done, 2, "carries a password")
        assert secret not in done.stderr and secret not in done.stdout
    done = run("serve", *BOUND, env={"ENGRAM_STORE": pg_database + f"?password={secret}",
                                     "ENGRAM_MASTER_KEY_FILE": str(key)})
    one_line(done, 2, "carries a password")
    assert secret not in done.stderr

    one_line(run("serve", "--store", pg_database, *BOUND), 2, "--store needs --master-key-file")
    one_line(run("serve", "--master-key-file", key, *BOUND), 2, "applies to a PostgreSQL store only")


def test_rebuild_index_rebuilds_one_nodes_projections_from_the_store(pg_database: str, tmp_path: Path) -> None:
    key = tmp_path / "master.key"
    assert run("admin", "init-store", "--store", pg_database, "--master-key-out", key).returncode == 0
    done = run("rebuild-index", "--store", pg_database, "--master-key-file", key, "--data-dir", tmp_path / "node")
    assert done.returncode == 0, done.stderr
    assert "nothing to rebuild" in done.stdout
    one_line(run("rebuild-index", "--store", pg_database, "--data-dir", tmp_path / "node"), 2,
             "--store needs --master-key-file")
    one_line(run("rebuild-index", "--store", pg_database, "--master-key-file", key, "--data-dir", tmp_path / "node",
                 "--tenant", "acme", "--workspace", "nope"), 2, "no scope acme/nope")


def test_a_node_directory_caches_one_store(pg_url: str, tmp_path: Path) -> None:
    """A node dir pointed at another store (re-initialised, or replaced under the same URL) discards
    the projections it built from the first one instead of serving them as the new store's."""
    from engram_memory.models.settings import EngineSettings
    from engram_memory.store.core.engine import Engine
    from tests.conftest import fresh_database
    from tests.store_fixtures import T0, admission_args, call, capture_args, ctx

    node = tmp_path / "node"
    with fresh_database(pg_url) as first, fresh_database(pg_url) as second:
        for n, url in enumerate((first, second)):
            assert run("admin", "init-store", "--store", url, "--master-key-out", tmp_path / f"{n}.key").returncode == 0
        engine = Engine.open(EngineSettings(data_dir=node, store=first, master_key_file=tmp_path / "0.key",
                                            semantic=False), clock=lambda: T0)
        cid = call(engine, "capture", ctx(), capture_args("Zorblax rollout notes", key="cap-key-000000001"))
        call(engine, "request_admission", ctx(), admission_args(cid["candidate_id"], key="adm-key-000000001"))
        engine.close()
        assert any((node / "projections").iterdir())
        first_id = (node / "store.id").read_text()

        engine = Engine.open(EngineSettings(data_dir=node, store=second, master_key_file=tmp_path / "1.key",
                                            semantic=False), clock=lambda: T0)
        try:
            assert (node / "store.id").read_text() != first_id
            assert not (node / "projections").exists() or not any((node / "projections").iterdir())
            found = call(engine, "search", ctx(), {"query": "Zorblax rollout", "purpose_ref": "purpose:test",
                                                    "capability_policy": {"minimum_channels": "lexical",
                                                                          "network": "forbid"}})
            assert found["records"] == []
        finally:
            engine.close()
