"""`engram-memory rebuild-index` as a new operator meets it: the real CLI in a subprocess.

A user error is one `engram-memory: error: ...` line on stderr, nothing on stdout, exit code 2,
no traceback, and nothing created or touched (directory listings compared before and after).
The stores are real: written by real `serve --no-semantic` subprocesses (so the data dir also
holds the server's own files), or opened by the engine for an empty store.

Only the two successful rebuilds load the packaged embedding model (~15-20 s each); every
refusal is decided before it is imported.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from tests.conftest import CONTEXT, REPO, capture_args, key, mcp_server, serve_argv

SCOPES = [("tenant-a", "ws-1"), ("tenant-b", "ws-2")]
SERVER_FILES = ("engram.sock", "local-host.private.pem", "local-host.token")


def rebuild(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "rebuild-index", *args], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))


def listing(root: Path) -> list[tuple[str, int, int]]:
    """Every entry under ``root`` (dotfiles included): path, size and mtime of files."""
    out = []
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        regular = path.is_file() and not path.is_symlink()
        out.append((str(path.relative_to(root)), st.st_size if regular else 0, st.st_mtime_ns if regular else 0))
    return out


def assert_refused(proc: subprocess.CompletedProcess[str], message: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr == f"engram-memory: error: {message}\n"


def refused_untouched(root: Path, args: list[str], env: dict[str, str], message: str) -> None:
    """Run a refused rebuild and check that nothing under ``root`` was created or changed."""
    before = listing(root)
    assert_refused(rebuild(args, env), message)
    assert listing(root) == before


# ---- stores ---------------------------------------------------------------------------------


async def _fill(data_dir: Path, env: dict[str, str]) -> None:
    """One admitted record per scope, each through its own real server (one context each)."""
    for tenant, workspace in SCOPES:
        context = CONTEXT | {"tenant": tenant, "workspace": workspace}
        argv = serve_argv(data_dir, context=context, extra=["--no-semantic"])
        async with mcp_server(argv, env, log_dir=data_dir.parent) as mcp:
            cap = await mcp.call("capture", capture_args(f"The {tenant} team keeps {workspace} notes in DuckDB."))
            assert cap["ok"], cap
            adm = await mcp.call("request_admission", {"candidate_id": cap["output"]["value"]["candidate_id"],
                                                       "idempotency_key": key("admit")})
            assert adm["ok"] and adm["output"]["value"]["outcome"]["status"] == "accepted", adm


@pytest.fixture(scope="module")
def store(data_dir_factory: Callable[[str], Path], offline_env: dict[str, str]) -> Path:
    """A real store with two scopes, and a server's leftovers: its local host key and a stale
    socket (as an owner that was killed leaves it)."""
    data_dir = data_dir_factory("maint-store") / "data"
    anyio.run(_fill, data_dir, offline_env)
    stale = data_dir / "engram.sock"
    if not stale.exists():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(str(stale))  # closed without unlink: a socket file nobody answers
    for name in SERVER_FILES:
        assert (data_dir / name).exists(), name
    return data_dir


@pytest.fixture
def empty_store(tmp_path: Path) -> Path:
    """A store no one has written to yet: engram.duckdb with no scope."""
    data_dir = tmp_path / "data"
    Engine.open(EngineSettings(data_dir=data_dir, semantic=False)).close()
    return data_dir


# ---- the data dir -----------------------------------------------------------------------------


@pytest.mark.parametrize("json_out", [[], ["--json"]])
def test_a_mistyped_data_dir_is_refused_and_nothing_is_created(tmp_path: Path, offline_env, json_out) -> None:
    typo = tmp_path / "dtaa"
    refused_untouched(tmp_path, ["--data-dir", str(typo), *json_out], offline_env,
                      f"no engram-memory store at {typo} (the directory does not exist)")
    deeper = tmp_path / "no" / "such" / "dir"
    refused_untouched(tmp_path, ["--data-dir", str(deeper), *json_out], offline_env,
                      f"no engram-memory store at {deeper} (the directory does not exist)")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_without_a_store_is_refused_and_left_alone(tmp_path: Path, offline_env) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    refused_untouched(tmp_path, ["--data-dir", str(empty)], offline_env,
                      f"no engram-memory store at {empty} (no engram.duckdb)")
    assert list(empty.iterdir()) == []
    # Someone's project folder, with a stray socket-like name in it: still not a store.
    other = tmp_path / "project"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    (other / "engram.sock").write_text("")
    refused_untouched(tmp_path, ["--data-dir", str(other), "--verify"], offline_env,
                      f"no engram-memory store at {other} (no engram.duckdb)")


def test_a_file_as_data_dir_is_one_line_not_a_traceback(tmp_path: Path, offline_env) -> None:
    file = tmp_path / "engram.duckdb"
    file.write_text("not a directory\n")
    refused_untouched(tmp_path, ["--data-dir", str(file)], offline_env,
                      f"no engram-memory store at {file} (not a directory)")
    assert file.read_text() == "not a directory\n"


def test_a_foreign_engram_duckdb_is_not_a_store(tmp_path: Path, offline_env) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "engram.duckdb").write_bytes(b"not a database\n" * 64)
    refused_untouched(tmp_path, ["--data-dir", str(data_dir)], offline_env,
                      f"no engram-memory store at {data_dir} (engram.duckdb is not a DuckDB database)")


# ---- options, all checked before any work ------------------------------------------------------


@pytest.mark.parametrize("scope", [["--tenant", "tenant-a"], ["--workspace", "ws-1"]])
def test_tenant_and_workspace_go_together(tmp_path: Path, offline_env, scope: list[str]) -> None:
    # Checked before the data dir: the missing one is not even looked at.
    refused_untouched(tmp_path, ["--data-dir", str(tmp_path / "missing"), *scope], offline_env,
                      "--tenant and --workspace go together")


def test_a_tenant_that_cannot_name_a_scope_is_refused(store: Path, offline_env) -> None:
    refused_untouched(store, ["--data-dir", str(store), "--tenant", "tenant-a/ws-1", "--workspace", "ws-1"],
                      offline_env,
                      "--tenant 'tenant-a/ws-1' is not a valid name (letters, digits and . _ : @ -,"
                      " starting with a letter or digit, at most 128 characters)")


def test_a_missing_model_path_is_refused_before_any_work(store: Path, tmp_path: Path, offline_env) -> None:
    missing = tmp_path / "models" / "minilm"
    refused_untouched(store, ["--data-dir", str(store), "--model-path", str(missing)], offline_env,
                      f"--model-path {missing} does not exist (omit it to use the packaged model)")
    # Before the data dir too: options first.
    refused_untouched(tmp_path, ["--data-dir", str(tmp_path / "nowhere"), "--model-path", str(missing)],
                      offline_env, f"--model-path {missing} does not exist (omit it to use the packaged model)")
    not_a_model = tmp_path / "downloads"
    not_a_model.mkdir()
    refused_untouched(store, ["--data-dir", str(store), "--model-path", str(not_a_model)], offline_env,
                      f"--model-path {not_a_model} is not a sentence-transformers model directory (no modules.json"
                      " or config.json)")


# ---- scopes -------------------------------------------------------------------------------------


def test_an_unknown_scope_is_refused_naming_the_known_ones(store: Path, offline_env) -> None:
    known = "known scopes: tenant-a/ws-1, tenant-b/ws-2"
    refused_untouched(store, ["--data-dir", str(store), "--tenant", "tenant-x", "--workspace", "ws-9"],
                      offline_env, f"no scope tenant-x/ws-9 in the store at {store} ({known})")
    # A known tenant in another tenant's workspace is no scope either.
    refused_untouched(store, ["--data-dir", str(store), "--tenant", "tenant-a", "--workspace", "ws-2", "--json"],
                      offline_env, f"no scope tenant-a/ws-2 in the store at {store} ({known})")


def test_a_store_without_scopes(empty_store: Path, offline_env) -> None:
    refused_untouched(empty_store, ["--data-dir", str(empty_store), "--tenant", "acme", "--workspace", "main"],
                      offline_env, f"no scope acme/main in the store at {empty_store} (known scopes: none)")
    done = rebuild(["--data-dir", str(empty_store)], offline_env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout == f"no scopes in the store at {empty_store}: nothing to rebuild\n"
    done = rebuild(["--data-dir", str(empty_store), "--json"], offline_env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert json.loads(done.stdout) == {"scopes": [], "differences": 0}


# ---- a busy data dir ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_data_dir_a_server_owns_stays_refused(data_dir_factory, offline_env) -> None:
    data_dir = data_dir_factory("maint-busy") / "data"
    argv = serve_argv(data_dir, extra=["--no-semantic"])
    async with mcp_server(argv, offline_env, log_dir=data_dir.parent):
        assert (data_dir / "engram.sock").exists()
        busy = await anyio.to_thread.run_sync(lambda: rebuild(["--data-dir", str(data_dir), "--json"], offline_env))
        # A refusal, as every host command words it: its code, exit 1 (admin verify says the same).
        assert (busy.returncode, busy.stdout) == (1, ""), busy
        assert busy.stderr == (f"engram-memory: error: STORE_BUSY: data dir {data_dir} is in use by a running"
                               " server; stop it first\n")
        verify = await anyio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-m", "engram_memory.server.cli", "admin", "verify", "--data-dir", str(data_dir)],
            env=offline_env, capture_output=True, text=True, timeout=120))
        assert verify.returncode == 1 and verify.stderr.startswith("engram-memory: error: STORE_BUSY: "), verify


# ---- the successful rebuild: the operator's own names ---------------------------------------


def test_rebuild_reports_scopes_by_tenant_and_workspace(store: Path, offline_env) -> None:
    done = rebuild(["--data-dir", str(store), "--verify"], offline_env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stdout.splitlines() == [
        "scope tenant tenant-a / workspace ws-1: 1 records, 1 vectors — verify: identical",
        "scope tenant tenant-b / workspace ws-2: 1 records, 1 vectors — verify: identical",
    ]
    for name in SERVER_FILES:  # the server's files are left as they were
        assert (store / name).exists(), name


def test_rebuild_json_names_the_scopes_and_keeps_its_keys(store: Path, offline_env) -> None:
    done = rebuild(["--data-dir", str(store), "--json"], offline_env)
    assert done.returncode == 0, (done.stdout, done.stderr)
    report: dict[str, Any] = json.loads(done.stdout)  # stdout is the JSON alone (progress: stderr)
    assert report["differences"] == 0
    scopes = report["scopes"]
    assert [(s["tenant"], s["workspace"]) for s in scopes] == SCOPES
    for scope in scopes:
        assert set(scope) == {"tenant", "workspace", "scope_dir", "records", "vectors", "differences"}
        assert (scope["records"], scope["vectors"], scope["differences"]) == (1, 1, [])
        assert len(scope["scope_dir"]) == 32 and (store / "projections" / scope["scope_dir"]).is_dir()
