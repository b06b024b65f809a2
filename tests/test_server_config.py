"""Launch configuration: flags over a TOML file, closed keys, memory off by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram_memory.server.config import DAY_MS, ConfigError, default_data_dir, load_config

CTX = {"tenant": "acme", "workspace": "main", "principal": "alice", "agent_id": "agent-1",
       "purpose_ref": "purpose:ops"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engram.toml"
    path.write_text(text)
    return path


def test_memory_is_disabled_by_default() -> None:
    cfg = load_config({})
    assert not cfg.memory_enabled and cfg.tools == ()
    assert "missing: tenant" in (cfg.disabled_reason() or "")
    assert not load_config(CTX).memory_enabled  # a context without tools is still off
    assert not load_config({"tools": "search"}).memory_enabled  # tools without a context too
    on = load_config(CTX | {"tools": "search,get"})
    assert on.memory_enabled and on.tools == ("search", "get") and on.disabled_reason() is None


def test_default_data_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / "engram-memory"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    assert default_data_dir() == Path.home() / ".local" / "share" / "engram-memory"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_data_dir() == Path.home() / ".local" / "share" / "engram-memory"


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, """
tenant = "from-file"
workspace = "main"
principal = "alice"
agent-id = "agent-1"
purpose_ref = "purpose:ops"
tools = ["search", "get", "forget"]
confirm = ["capture"]
retention_ceiling_days = 30
allow_retain = true
consented_families = ["family:a"]
redacted_fields = ["scope_ref", "trust"]
fusion = "dbsf"
rrf_k = 20
data_dir = "~/mem"
""")
    cfg = load_config({"tenant": "from-flag", "tools": "search", "rrf_k": None}, path)
    assert cfg.tenant == "from-flag" and cfg.tools == ("search",)
    assert cfg.rrf_k == 20 and cfg.fusion == "dbsf" and cfg.agent_id == "agent-1"
    assert cfg.data_dir == Path.home() / "mem"
    policy = cfg.host_policy()
    assert policy.retention_ceiling_ms == 30 * DAY_MS and policy.allow_retain
    assert policy.consented_families == frozenset({"family:a"})
    assert policy.redacted_fields == ("scope_ref", "trust")
    assert cfg.host_context().scope_ref == "tenant:from-flag/workspace:main"


def test_policy_defaults_are_the_models() -> None:
    from engram_memory.models.context import HostPolicy

    assert load_config(CTX).host_policy() == HostPolicy()


@pytest.mark.parametrize(
    "flags,needle",
    [
        ({"tools": "search,admin"}, "unknown tool(s) in tools: admin"),
        ({"confirm": "forget"}, "always confirmed"),
        ({"fusion": "max"}, "fusion must be one of"),
        ({"http": "0.0.0.0:8765", "host_keys": "/k.toml"}, "not a loopback address; add --allow-remote"),
        ({"http": "127.0.0.1:8765"}, "--http needs --host-keys"),
        ({"http": "::1:8765", "host_keys": "/k.toml"}, "IPv6 as [::1]:PORT"),
        ({"http": "127.0.0.1:0", "host_keys": "/k.toml"}, "HOST:PORT"),
        (CTX | {"http": "127.0.0.1:8765", "host_keys": "/k.toml"}, "binds the context per call"),
        ({"rate_limit": -1}, "rate_limit"),
        ({"redacted_fields": "record_id"}, "record_id can never be redacted"),
        ({"rrf_k": 0}, "rrf_k"),
        ({"confirm_ttl_seconds": 301}, "confirm_ttl_seconds"),
        (CTX | {"tenant": "a/b"}, "invalid host tenant"),
        (CTX | {"purpose_ref": "p" * 513}, "512"),
    ],
)
def test_invalid_values_are_refused(flags: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(flags)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_file_keys_are_closed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config({}, write(tmp_path, 'tool = ["search"]\n'))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config({}, write(tmp_path, "tools = [\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_config({}, tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="true or false"):
        load_config({}, write(tmp_path, 'allow_retain = "yes"\n'))


def test_purpose_is_nfc_and_not_stripped() -> None:
    cfg = load_config(CTX | {"purpose_ref": " cafe\u0301 "})
    assert cfg.purpose_ref == " caf\u00e9 "


def test_only_a_first_launch_of_the_packaged_model_loads_it_before_opening_the_store(tmp_path: Path) -> None:
    """The model loads while the launch starts up only where it is known before the store is read."""
    on = CTX | {"tools": "search", "data_dir": str(tmp_path / "new")}
    assert load_config(on).prestarts_model()  # a store not created yet: the packaged model
    assert load_config(on | {"model": "all-MiniLM-L6-v2"}).prestarts_model()
    assert not load_config(on | {"semantic": False}).prestarts_model()
    assert not load_config(on | {"model_path": str(tmp_path)}).prestarts_model()  # preflight loads it
    assert not load_config(on | {"model": "multilingual-e5-small"}).prestarts_model()
    assert not load_config({"data_dir": str(tmp_path / "new")}).prestarts_model()  # memory off
    existing = tmp_path / "old"
    existing.mkdir()
    (existing / "engram.duckdb").write_bytes(b"")  # a store may remember another model
    assert not load_config(on | {"data_dir": str(existing)}).prestarts_model()
