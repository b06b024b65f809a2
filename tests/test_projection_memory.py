"""Issue 39 §3: scope projections held within a memory budget (``projection_memory``).

A node loads a scope's projections on first use and evicts the least recently used scopes to stay
under the budget; an evicted scope is reopened from its projection files (DuckDB data dir, or a
PostgreSQL node's own files, level with the shared journal). The same state, query and instant
give the same bytes whether the scope was resident or reloaded -- on both backends, with the real
model, HNSW serving the larger scope (its exact rescoring reads hnswlib's own vectors: §3's "not
held twice").
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from engram_memory.models.canonical import canonical_bytes
from engram_memory.models.settings import EngineSettings, parse_bytes
from engram_memory.store.core.engine import Engine
from tests.conftest import REPO, SERVER_PYTHON, Backend, store_backend
from tests.store_fixtures import PURPOSE, T0, admission_args, call, capture_args, ctx

HYBRID = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}
TEXTS = [
    "The cat sat on the mat near the window all afternoon.",
    "Quarterly tax filings are due on the fifteenth of April.",
    "We picked PostgreSQL replicas for the reporting workload.",
    "A kitten naps on a rug in the sunshine.",
    "The release train leaves every second Tuesday.",
    "Our cat prefers the sunny windowsill to the sofa.",
]
# tenant -> how many of TEXTS it holds: "big" crosses the HNSW threshold below, the others stay exact
SCOPES = {"big": 6, "small": 2, "third": 3}
QUERIES = ["feline resting in the sun", "tax deadline", "cat window"]


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    with store_backend(request.param, request, tmp_path_factory.mktemp("store-key")) as chosen:
        yield chosen


def open_engine(backend: Backend, data_dir: Path, budget: str | None) -> Engine:
    settings = EngineSettings(data_dir=data_dir, store=backend.store, master_key_file=backend.master_key_file,
                              hnsw_threshold=5, projection_memory=budget)
    engine = Engine.open(settings, clock=lambda: T0)
    assert engine.wait_semantic(180), "packaged model failed to load"
    return engine


def fill(engine: Engine) -> None:
    for tenant, n in SCOPES.items():
        c = ctx(tenant=tenant)
        for i, text in enumerate(TEXTS[:n]):
            cap = call(engine, "capture", c, capture_args(text, key=f"capture-{tenant}-key-{i:06d}"))
            admit = admission_args(cap["candidate_id"], key=f"admission-{tenant}-key-{i:06d}")
            out = call(engine, "request_admission", c, admit)
            assert out["outcome"]["status"] == "accepted", out


def answers(engine: Engine, tenant: str) -> list[bytes]:
    c = ctx(tenant=tenant)
    return [canonical_bytes(call(engine, "search", c, {"query": q, "purpose_ref": PURPOSE,
                                                       "capability_policy": HYBRID})) for q in QUERIES]


def test_answers_are_byte_identical_resident_or_reloaded(backend: Backend, tmp_path: Path) -> None:
    # The reference: no budget, every scope stays resident.
    plain = open_engine(backend, tmp_path / "node-a", None)
    try:
        fill(plain)
        resident = {tenant: answers(plain, tenant) for tenant in SCOPES}
        assert plain.projections.evictions == 0
        assert sorted(plain.projections.resident_scopes()) == sorted(ctx(tenant=t).scope_ref for t in SCOPES)
        assert plain.projections.vectors(ctx(tenant="big").scope_ref).kind == "hnsw"
        assert plain.projections.vectors(ctx(tenant="small").scope_ref).kind == "exact"
    finally:
        plain.close()
    # The same store under a 1 MiB budget: every scope costs more, so only the one in use stays.
    # (DuckDB: the same data dir reopened; PostgreSQL: a second node, its projections built from
    # the shared store's stored embeddings, nothing embedded again.)
    data_dir = tmp_path / ("node-a" if backend.store is None else "node-b")
    tight = open_engine(backend, data_dir, "1MiB")
    try:
        assert tight.projections.memory_budget == 1 << 20
        for round_ in range(2):  # first use loads each scope; the second round reloads evicted ones
            for tenant in SCOPES:
                assert answers(tight, tenant) == resident[tenant], (round_, tenant)
                assert tight.projections.resident_scopes() == [ctx(tenant=tenant).scope_ref]
        assert tight.projections.evictions >= 2 * len(SCOPES) - 1
        # Reloaded on the next read; and a read of a resident scope after a write elsewhere too.
        assert answers(tight, "big") == resident["big"]
        assert answers(tight, "big") == resident["big"]
        assert tight.projections.vectors(ctx(tenant="big").scope_ref).kind == "hnsw"
    finally:
        tight.close()


def test_memory_sizes_are_parsed_with_units() -> None:
    assert parse_bytes("projection_memory", "512MiB") == 512 << 20
    assert parse_bytes("projection_memory", "2GiB") == 2 << 30
    assert parse_bytes("projection_memory", "64KiB") == 64 << 10
    assert parse_bytes("projection_memory", "4096B") == 4096
    assert parse_bytes("projection_memory", 1 << 20) == 1 << 20  # a TOML integer: bytes
    for wrong in ("512", "512mb", "0.5GiB", "MiB", "-1MiB"):
        with pytest.raises(ValueError, match="projection_memory must be a whole number with a unit"):
            parse_bytes("projection_memory", wrong)


@pytest.mark.parametrize(("given", "message"), [
    (["--projection-memory", "512"], "projection_memory must be a whole number with a unit (B, KiB, MiB, GiB)"),
    (["--projection-memory", "12XB"], "projection_memory must be a whole number with a unit"),
    (["--projection-memory", "64KiB"], "projection_memory must be at least 1MiB"),
])
def test_a_bad_budget_is_one_line_and_exit_2(tmp_path: Path, given: list[str], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([SERVER_PYTHON, "-m", "engram_memory.server.cli", "serve", "--data-dir",
                           str(tmp_path / "d"), *given], env=env, capture_output=True, text=True, timeout=60,
                          cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert not (tmp_path / "d").exists()  # a refused launch creates nothing


def test_the_budget_comes_from_the_environment_and_the_toml_file(tmp_path: Path, monkeypatch) -> None:
    from engram_memory.server.config import ConfigError, load_config

    config = tmp_path / "engram.toml"
    config.write_text('projection-memory = "256MiB"\n')
    assert load_config({}, config).projection_memory == 256 << 20
    monkeypatch.setenv("ENGRAM_PROJECTION_MEMORY", "1GiB")
    assert load_config({}, config).projection_memory == 1 << 30
    assert load_config({"projection_memory": "512MiB"}, config).projection_memory == 512 << 20
    monkeypatch.setenv("ENGRAM_PROJECTION_MEMORY", "lots")
    with pytest.raises(ConfigError, match="projection_memory must be a whole number"):
        load_config({}, config)


def test_bench_scopes_layout() -> None:
    from engram_memory.eval.bench_scopes import scope_sizes

    full = scope_sizes(1000, 200_000)  # the node: a 20,000-record and a 200-record scope
    assert len(full) == 1000 and sum(full) == 200_000 and full[:2] == [20_000, 200]
    small = scope_sizes(100, 20_000)
    assert len(small) == 100 and sum(small) == 20_000 and small[0] == 5_000


@pytest.mark.parametrize(("given", "message"), [
    (["--scopes", "2"], "--scopes takes a whole number >= 3"),
    (["--scopes", "10", "--projection-memory", "12"], "--projection-memory must be a whole number with a unit"),
    (["--scopes", "10", "--records", "20"], "--records must be at least 4 x --scopes"),
])
def test_bench_scopes_refuses_bad_options_in_one_line(tmp_path: Path, given: list[str], message: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([SERVER_PYTHON, "-m", "engram_memory.server.cli", "bench", "--out", str(tmp_path / "o"),
                           *given], env=env, capture_output=True, text=True, timeout=60, cwd=str(REPO),
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
