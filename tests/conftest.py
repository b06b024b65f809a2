"""Shared fixtures: temp data dirs, an offline env, and a REAL `engram-memory serve` subprocess
driven by the MCP SDK's own stdio client (no mock of anything of ours), on either store backend
(``backend``: DuckDB in the data dir, or a real PostgreSQL database made by `admin init-store`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError

REPO = Path(__file__).resolve().parents[1]
PURPOSE = "purpose:e2e-tests-caf\u00e9"  # composed: an NFD spelling must match too
CONTEXT = {
    "tenant": "tenant-a",
    "workspace": "ws-1",
    "principal": "alice@example.test",
    "agent_id": "agent-7",
    "purpose_ref": PURPOSE,
}
ALL = "search,get,capture,request_admission,withdraw,forget"
# The interpreter that runs the servers under test: this one, or (tests/test_wheel.py) the one of a
# fresh venv the built wheel was installed into, so the same tests run against what users install.
SERVER_PYTHON = os.environ.get("ENGRAM_TEST_SERVER_PYTHON") or sys.executable


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def offline_env() -> dict[str, str]:
    """The environment every server subprocess gets: offline, nothing from the hub."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    return env


@pytest.fixture(scope="session")
def data_dir_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Fresh data dirs under one session temp root (a server never shares one by accident)."""

    def make(name: str = "data") -> Path:
        return tmp_path_factory.mktemp(name)

    return make


@dataclass(frozen=True)
class Backend:
    """The store a server subprocess opens: DuckDB in its data dir (``store`` None, the default), or
    a PostgreSQL database made by the real ``admin init-store`` with its master key file."""

    name: str
    store: str | None = None
    master_key_file: Path | None = None

    def args(self) -> list[str]:
        """The launch options that select this store (none for DuckDB: its argv is today's)."""
        if self.store is None:
            return []
        return ["--store", self.store, "--master-key-file", str(self.master_key_file)]

    def query(self, sql: str, data_dir: Path | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Column names and rows of a read-only query on the store a stopped server used: the DuckDB
        file in ``data_dir``, or the PostgreSQL database (read directly: opening a store is a node's
        open, with its epoch bump and heartbeat, which an inspection must not be)."""
        if self.store is None:
            import duckdb

            assert data_dir is not None, "a DuckDB store lives in a data dir"
            with duckdb.connect(str(data_dir / "engram.duckdb"), read_only=True) as con:
                cur = con.execute(sql)
                return [d[0] for d in cur.description or []], cur.fetchall()
        import psycopg

        with psycopg.connect(self.store, autocommit=True) as conn:
            pg = conn.execute(sql.encode())
            return [d.name for d in pg.description or []], pg.fetchall()


DUCKDB = Backend("duckdb")


def serve_argv(data_dir: Path, *, tools: str | None = ALL, context: dict[str, str] | None = None,
               extra: list[str] | None = None, backend: Backend = DUCKDB) -> list[str]:
    """`python -m engram_memory.server.cli serve ...` for a context (None: CONTEXT; {}: none bound)."""
    argv = [SERVER_PYTHON, "-m", "engram_memory.server.cli", "serve", "--data-dir", str(data_dir),
            "--log-level", "DEBUG"]
    for key, value in (CONTEXT if context is None else context).items():
        argv += ["--" + key.replace("_", "-"), value]
    if tools is not None:
        argv += ["--tools", tools]
    return argv + backend.args() + (extra or [])


# ---- elicitation: the "human" behind the host -------------------------------------------------


@dataclass
class Human:
    """Answers confirmations from a script of answers; records every prompt it was shown."""

    answers: list[str] = field(default_factory=list)  # accept | decline | cancel | false | error | sleep:N
    default: str = "accept"
    prompts: list[types.ElicitRequestParams] = field(default_factory=list)

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        self.prompts.append(params)
        answer = self.answers.pop(0) if self.answers else self.default
        if answer.startswith("sleep:"):
            await anyio.sleep(float(answer.split(":", 1)[1]))
            answer = "accept"
        if answer == "accept":
            return types.ElicitResult(action="accept", content={"confirm": True})
        if answer == "false":
            return types.ElicitResult(action="accept", content={"confirm": False})
        if answer == "error":
            return types.ErrorData(code=types.INVALID_REQUEST, message="no human here")
        return types.ElicitResult(action=answer)  # decline | cancel


@dataclass
class Mcp:
    """One live session with a server subprocess."""

    session: ClientSession
    init: types.InitializeResult
    human: Human | None
    stderr_path: Path

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call a tool; check the envelope invariants every result must keep; return the envelope."""
        result = await self.session.call_tool(tool if tool.startswith("engram_") else "engram_memory_" + tool,
                                              arguments)
        return check_result(result)

    async def call_error(self, tool: str, arguments: dict[str, Any]) -> MCPError:
        name = tool if tool.startswith("engram_") else "engram_memory_" + tool
        with pytest.raises(MCPError) as info:
            await self.session.call_tool(name, arguments)
        return info.value

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def check_result(result: types.CallToolResult) -> dict[str, Any]:
    envelope = result.structured_content
    assert isinstance(envelope, dict)
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent)
    assert json.loads(result.content[0].text) == envelope  # identical text copy
    assert result.is_error is (not envelope["ok"])
    assert envelope["redactionClass"] == "high"
    assert envelope["auditId"].startswith("aud_") and len(envelope["auditId"]) == 30
    return envelope


@asynccontextmanager
async def mcp_server(
    argv: list[str], env: dict[str, str], *, human: Human | None = None, log_dir: Path | None = None
) -> AsyncIterator[Mcp]:
    """Start `engram-memory serve` as a subprocess and open an initialized ClientSession to it.

    ``human`` None: the client declares no elicitation capability.
    """
    log_dir = log_dir or Path(argv[argv.index("--data-dir") + 1]).parent
    stderr_path = log_dir / f"server-{time.monotonic_ns()}.stderr"
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(REPO))
    with stderr_path.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write, elicitation_callback=human) as session:
                init = await session.initialize()
                yield Mcp(session, init, human, stderr_path)


@pytest.fixture(scope="session")
def start_server(offline_env: dict[str, str]) -> Callable[..., Any]:
    """`async with start_server(data_dir, human=..., tools=..., context=..., extra=[...]) as mcp:`"""

    def start(data_dir: Path, *, human: Human | None = None, tools: str | None = ALL,
              context: dict[str, str] | None = None, extra: list[str] | None = None,
              backend: Backend = DUCKDB) -> Any:
        argv = serve_argv(data_dir, tools=tools, context=context, extra=extra, backend=backend)
        return mcp_server(argv, offline_env, human=human)

    return start


# ---- arguments ------------------------------------------------------------------------------


def sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def capture_args(text: str, *, key: str | None = None, purpose: str = PURPOSE, at: int | None = None
                 ) -> dict[str, Any]:
    """A valid capture: one cited decision component, valid from ``at`` (default a minute ago)."""
    now = int(time.time() * 1000) - 60_000 if at is None else at
    return {
        "idempotency_key": key or "capture-" + hashlib.sha256(text.encode()).hexdigest()[:24],
        "payload": {
            "schema_version": 2,
            "purpose_ref": purpose,
            "valid_time": {"t": now},
            "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["s1"]}],
            "primary_component_id": "c1",
            "primary_event": {"at": now, "type_ref": "event:decided", "citation_id": "s1"},
            "citations": [
                {
                    "citation_id": "s1",
                    "source_ref": "doc:adr-7",
                    "locator": {"scheme": "path", "value": "docs/adr-7.md#L3"},
                    "content_digest": sha(text),
                }
            ],
        },
        "evidence": {"evidence_ref": "ev:1", "evidence_digest": sha("evidence:" + text), "citation_ids": ["s1"]},
    }


def search_args(query: str, **extra: Any) -> dict[str, Any]:
    return {"query": query, "purpose_ref": PURPOSE, **extra}


def get_args(record_id: str) -> dict[str, Any]:
    return {"record_id": record_id, "purpose_ref": PURPOSE}


def key(label: str) -> str:
    """A unique idempotency key (>= 16 bytes) per logical operation."""
    return f"{label}-{time.monotonic_ns():020d}"


# --- PostgreSQL (issue 22): a real server, never a mock --------------------------------------------


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """The admin URL of a real PostgreSQL: ENGRAM_TEST_PG_URL (.ci/run sets it), else a throwaway
    cluster `.ci/pg start` runs for this session. No skip: a PostgreSQL that cannot start is an error."""
    url = os.environ.get("ENGRAM_TEST_PG_URL")
    if url:
        yield url
        return
    started = subprocess.run(["bash", str(REPO / ".ci" / "pg"), "start"], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.fail(f"PostgreSQL did not start (.ci/pg start): {started.stderr.strip()}", pytrace=False)
    env = dict(line.removeprefix("export ").split("=", 1) for line in started.stdout.split("\n") if line)
    try:
        yield env["ENGRAM_TEST_PG_URL"]
    finally:
        subprocess.run(["bash", str(REPO / ".ci" / "pg"), "stop", env["ENGRAM_TEST_PG_DIR"]], check=False)


@contextmanager
def fresh_database(pg_url: str, prefix: str = "test") -> Iterator[str]:
    """A fresh, empty database (CREATE DATABASE over the admin URL; dropped afterwards): its URL."""
    import psycopg

    from engram_memory.store.postgres.databases import fresh_database as fresh

    try:
        with fresh(pg_url, prefix) as url:
            yield url
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at ENGRAM_TEST_PG_URL is unreachable: {exc}", pytrace=False)


@pytest.fixture
def pg_database(pg_url: str) -> Iterator[str]:
    """A fresh, empty database for one test (CREATE DATABASE over the admin URL; dropped afterwards)."""
    with fresh_database(pg_url) as url:
        yield url


@contextmanager
def store_backend(name: str, request: pytest.FixtureRequest, key_dir: Path) -> Iterator[Backend]:
    """DUCKDB, or a fresh PostgreSQL database initialised by the real ``engram-memory admin init-store``
    (its master key file written under ``key_dir``)."""
    if name == "duckdb":
        yield DUCKDB
        return
    assert name == "postgres", name
    pg_url = request.getfixturevalue("pg_url")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with fresh_database(pg_url) as url:
        key_file = key_dir / "master.key"
        done = subprocess.run([SERVER_PYTHON, "-m", "engram_memory.server.cli", "admin", "init-store",
                               "--store", url, "--master-key-out", str(key_file)],
                              env=env, capture_output=True, text=True, timeout=120, cwd=str(REPO))
        assert done.returncode == 0, done.stderr
        chosen = Backend("postgres", url, key_file)
        yield chosen
        # init-store leaves the epoch at 0 and every node's open bumps it: a test that never opened
        # this store (its server silently on DuckDB) must not pass as a PostgreSQL run.
        _, epoch = chosen.query("SELECT value FROM meta WHERE key = 'storage_epoch'")
        assert epoch and int(epoch[0][0]) >= 1, "no node ever opened the PostgreSQL store of this test"


BACKENDS = ["duckdb", "postgres"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    """Each store backend in turn, fresh for one test (issue 22: the same contract on both)."""
    with store_backend(request.param, request, tmp_path_factory.mktemp("store-key")) as chosen:
        yield chosen


# -- where the suite's time goes, per file (CI prints it; with xdist the controller sums the workers') --

_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FILE_SECONDS:
        return
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"slowest test files (setup + call + teardown; {total:.0f} s in all)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {100 * seconds / total:4.1f}%  {path}")
