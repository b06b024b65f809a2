"""One settings model: defaults declared once; flag > ENGRAM_* environment > TOML file > default."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram_memory.models.context import HostPolicy
from engram_memory.models.limits import CONFIRM_TTL_S, HNSW_THRESHOLD, RRF_K
from engram_memory.models.settings import EngineSettings
from engram_memory.models.states import FusionMethod
from engram_memory.server.config import KNOWN_KEYS, ConfigError, ServeConfig, ServeSettings, load_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("ENGRAM_") and name.upper() != "ENGRAM_CLOCK_MS":
            monkeypatch.delenv(name)


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engram.toml"
    path.write_text(text)
    return path


def test_engine_defaults_are_written_once() -> None:
    s = EngineSettings()
    assert s.fusion == FusionMethod.DBSF and type(s.fusion) is str  # plain string for receipts
    assert s.rrf_k == RRF_K == 60 and s.hnsw_threshold == HNSW_THRESHOLD == 50_000
    assert s.channels == ("lexical", "semantic") and s.fusion_weights == (0.5, 0.5)
    assert s.host_policy() == HostPolicy()
    serve = load_config({})
    assert serve.engine_settings() == EngineSettings(data_dir=serve.data_dir)
    assert serve.confirm_ttl_seconds == CONFIRM_TTL_S
    assert ServeConfig is ServeSettings
    assert set(EngineSettings.model_fields) < KNOWN_KEYS


def test_engine_settings_are_closed_and_frozen() -> None:
    with pytest.raises(ValueError):
        EngineSettings(unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        EngineSettings(fusion="none")  # type: ignore[arg-type]
    s = EngineSettings()
    with pytest.raises(ValueError):
        s.rrf_k = 3  # type: ignore[misc]


def test_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ENGRAM_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("ENGRAM_TENANT", "acme")
    monkeypatch.setenv("ENGRAM_TOOLS", "search, get")
    monkeypatch.setenv("ENGRAM_CONFIRM", '["capture"]')  # JSON works too
    monkeypatch.setenv("ENGRAM_SEMANTIC", "false")
    monkeypatch.setenv("ENGRAM_RRF_K", "20")
    monkeypatch.setenv("ENGRAM_FUSION", "rrf")
    monkeypatch.setenv("ENGRAM_FUSION_WEIGHTS", "0.3,0.7")
    monkeypatch.setenv("ENGRAM_CONFIRM_TTL_SECONDS", "12.5")
    cfg = load_config({})
    assert cfg.data_dir == tmp_path / "d" and cfg.tenant == "acme"
    assert cfg.tools == ("search", "get") and cfg.confirm == ("capture",)
    assert cfg.semantic is False and cfg.rrf_k == 20 and cfg.fusion == "rrf"
    assert cfg.fusion_weights == (0.3, 0.7) and cfg.confirm_ttl_seconds == 12.5


def test_environment_refusals_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_SEMANTIC", "perhaps")
    with pytest.raises(ConfigError, match="^semantic must be true or false$"):
        load_config({})
    monkeypatch.delenv("ENGRAM_SEMANTIC")
    monkeypatch.setenv("ENGRAM_RRF_K", "many")
    with pytest.raises(ConfigError, match="^rrf_k must be an integer$"):
        load_config({})
    monkeypatch.setenv("ENGRAM_RRF_K", "0")
    with pytest.raises(ConfigError, match="^rrf_k must be at least 1$"):
        load_config({})
    monkeypatch.delenv("ENGRAM_RRF_K")
    monkeypatch.setenv("ENGRAM_TOOLS", "search,admin")
    with pytest.raises(ConfigError, match="unknown tool"):
        load_config({})


def test_precedence_flag_env_file_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = toml(tmp_path, 'tenant = "file"\nworkspace = "file"\nprincipal = "file"\nrrf-k = 7\n')
    monkeypatch.setenv("ENGRAM_TENANT", "env")
    monkeypatch.setenv("ENGRAM_WORKSPACE", "env")
    cfg = load_config({"tenant": "flag", "workspace": None}, path)
    assert cfg.tenant == "flag"  # flag over environment over file
    assert cfg.workspace == "env"  # a None flag was not given: environment over file
    assert cfg.principal == "file"  # file over default
    assert cfg.rrf_k == 7
    assert cfg.agent_id is None and cfg.http is None and cfg.rate_limit == 50  # defaults


def test_file_and_flag_keys_are_closed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^unknown config key\(s\): bogus, tool$"):
        load_config({}, toml(tmp_path, 'tool = ["search"]\nbogus = 1\n'))
    with pytest.raises(ConfigError, match="^unknown config key: bogus$"):
        load_config({"bogus": 1})


def test_engine_keys_are_settable_from_the_file(tmp_path: Path) -> None:
    cfg = load_config({}, toml(tmp_path, 'channels = ["lexical"]\nhnsw_threshold = 10\nfusion_weights = [1, 0]\n'))
    assert cfg.channels == ("lexical",) and cfg.hnsw_threshold == 10 and cfg.fusion_weights == (1.0, 0.0)
    with pytest.raises(ConfigError) as info:
        load_config({}, toml(tmp_path, 'channels = ["graph"]\n'))
    assert "channels" in str(info.value) and "\n" not in str(info.value)


def test_serve_help_shows_model_defaults() -> None:
    from typer.testing import CliRunner

    from engram_memory.server.cli import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "RRF constant k." in out and f"({RRF_K})" in out
    assert "(<= 300)" in out and "(dbsf)" in out and "(scope_ref)" in out
