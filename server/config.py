"""Launch configuration: command-line flags over the same keys read from a TOML file.

The launch config is the host's side of the contract (TOOL_CONTRACT §0): it binds the
invocation context (tenant, workspace, principal, agent_id, purpose) and grants tools.
Nothing here is visible to, or settable by, the agent.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.canonical import CanonicalizationError, nfc, utf8_len
from models.context import ALL_TOOLS, CONFIRMABLE, HostContext, HostPolicy

CONTEXT_KEYS = ("tenant", "workspace", "principal", "agent_id", "purpose_ref")
FUSIONS = ("rrf", "dbsf", "convex")
TRANSPORTS = ("stdio", "http")
# The launch-bound context has no per-call authentication: serving it beyond loopback
# would hand this principal's memory to anyone who can reach the port.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_CONFIRM_TTL_S = 300.0  # TOOL_CONTRACT §0: a confirmation lives at most 300 s
DAY_MS = 86_400_000

_STR_KEYS = ("tenant", "workspace", "principal", "agent_id", "purpose_ref", "fusion", "transport", "host")
_PATH_KEYS = ("data_dir", "model_path")
_INT_KEYS = ("rrf_k", "port", "retention_ceiling_days")
_FLOAT_KEYS = ("confirm_ttl_seconds",)
_BOOL_KEYS = ("allow_retain", "semantic")
_LIST_KEYS = ("tools", "confirm", "consented_families", "redacted_fields")
KNOWN_KEYS = frozenset(_STR_KEYS + _PATH_KEYS + _INT_KEYS + _FLOAT_KEYS + _BOOL_KEYS + _LIST_KEYS)


class ConfigError(ValueError):
    """The launch configuration is unusable; the message is one line for the operator."""


def default_data_dir() -> Path:
    xdg = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says a relative value must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "engram-memory"


@dataclass(frozen=True)
class ServeConfig:
    data_dir: Path = field(default_factory=default_data_dir)
    tenant: str | None = None
    workspace: str | None = None
    principal: str | None = None
    agent_id: str | None = None
    purpose_ref: str | None = None
    tools: tuple[str, ...] = ()  # default none: memory disabled
    confirm: tuple[str, ...] = ()
    model_path: Path | None = None
    semantic: bool = True  # false: lexical channel only (no embedding model is loaded)
    fusion: str = "convex"  # the evaluated default (eval/RESULTS.md)
    rrf_k: int = 60
    retention_ceiling_days: int | None = None
    allow_retain: bool = False
    consented_families: tuple[str, ...] = ()
    redacted_fields: tuple[str, ...] | None = None  # None: HostPolicy's default
    confirm_ttl_seconds: float = MAX_CONFIRM_TTL_S
    transport: str = "stdio"
    host: str = "127.0.0.1"
    port: int = 8765

    @property
    def context_bound(self) -> bool:
        return all(getattr(self, k) for k in CONTEXT_KEYS)

    @property
    def memory_enabled(self) -> bool:
        """Disabled by default: the host must both bind a context and grant tools."""
        return self.context_bound and bool(self.tools)

    def host_context(self) -> HostContext:
        if not self.context_bound:
            raise ConfigError("no invocation context is bound")
        try:
            return HostContext(
                tenant=self.tenant or "",
                workspace=self.workspace or "",
                principal=self.principal or "",
                agent_id=self.agent_id or "",
                purpose_ref=self.purpose_ref or "",
                session=self.transport,  # launch-bound: one host session per served transport
            )
        except ValueError as exc:  # HostContext names the offending field, never a value
            raise ConfigError(str(exc)) from None

    def host_policy(self) -> HostPolicy:
        extra: dict[str, Any] = {}
        if self.redacted_fields is not None:
            extra["redacted_fields"] = self.redacted_fields
        return HostPolicy(
            retention_ceiling_ms=None
            if self.retention_ceiling_days is None
            else self.retention_ceiling_days * DAY_MS,
            allow_retain=self.allow_retain,
            consented_families=frozenset(self.consented_families),
            **extra,
        )

    def disabled_reason(self) -> str | None:
        """Why memory is off, for the operator's log (None when it is on)."""
        if self.memory_enabled:
            return None
        missing = [k for k in CONTEXT_KEYS if not getattr(self, k)]
        if missing:
            return "no invocation context bound (missing: " + ", ".join(missing) + ")"
        return "no tool granted (--tools)"


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    # Keys may be written with dashes, like the flags.
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_config(flags: Mapping[str, Any], config_file: Path | None = None) -> ServeConfig:
    """Merge the file's keys with the flags (a flag given as None was not given) and validate."""
    merged: dict[str, Any] = read_config_file(config_file) if config_file is not None else {}
    unknown = sorted(set(merged) - KNOWN_KEYS)
    if unknown:
        raise ConfigError("unknown config key(s): " + ", ".join(unknown))
    merged.update({k: v for k, v in flags.items() if v is not None})
    return _build(merged)


def _build(raw: Mapping[str, Any]) -> ServeConfig:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _STR_KEYS:
            values[key] = _string(key, value)
        elif key in _PATH_KEYS:
            values[key] = Path(_string(key, str(value) if isinstance(value, Path) else value)).expanduser()
        elif key in _INT_KEYS:
            values[key] = _integer(key, value)
        elif key in _FLOAT_KEYS:
            values[key] = _number(key, value)
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ConfigError(f"{key} must be true or false")
            values[key] = value
        elif key in _LIST_KEYS:
            values[key] = _string_list(key, value)
        else:
            raise ConfigError(f"unknown config key: {key}")
    cfg = ServeConfig(**values)
    _validate(cfg)
    return cfg


def _validate(cfg: ServeConfig) -> None:
    bad = sorted(set(cfg.tools) - set(ALL_TOOLS))
    if bad:
        raise ConfigError("unknown tool(s) in tools: " + ", ".join(bad) + "; choose from " + ",".join(ALL_TOOLS))
    bad = sorted(set(cfg.confirm) - CONFIRMABLE)
    if bad:
        raise ConfigError(
            "confirm accepts only capture,request_admission (withdraw and forget are always confirmed); got "
            + ", ".join(bad)
        )
    if cfg.fusion not in FUSIONS:
        raise ConfigError("fusion must be one of " + ", ".join(FUSIONS))
    if cfg.transport not in TRANSPORTS:
        raise ConfigError("transport must be one of " + ", ".join(TRANSPORTS))
    if cfg.rrf_k < 1:
        raise ConfigError("rrf_k must be at least 1")
    if cfg.retention_ceiling_days is not None and cfg.retention_ceiling_days < 1:
        raise ConfigError("retention_ceiling_days must be at least 1")
    if not 0 < cfg.confirm_ttl_seconds <= MAX_CONFIRM_TTL_S:
        raise ConfigError("confirm_ttl_seconds must be in (0, 300]")
    if not 1 <= cfg.port <= 65535:
        raise ConfigError("port must be in 1..65535")
    if cfg.transport == "http" and cfg.host not in LOOPBACK_HOSTS:
        raise ConfigError("http serves a launch-bound context: host must be a loopback address")
    if cfg.redacted_fields is not None and "record_id" in cfg.redacted_fields:
        raise ConfigError("record_id can never be redacted")
    if cfg.purpose_ref:
        try:
            size = utf8_len(cfg.purpose_ref)
        except CanonicalizationError:
            raise ConfigError("purpose_ref is not valid Unicode") from None
        if size > 512:
            raise ConfigError("purpose_ref must be at most 512 UTF-8 bytes")
    if cfg.context_bound:
        cfg.host_context()  # raises ConfigError on an unsafe host identifier


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string")
    try:
        return nfc(value.strip()) if key != "purpose_ref" else nfc(value)
    except CanonicalizationError:
        raise ConfigError(f"{key} is not valid Unicode") from None


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{key} must be an integer")
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ConfigError(f"{key} must be an integer") from None
    if not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer")
    return value


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key} must be a number")
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{key} must be a number") from None


def _string_list(key: str, value: Any) -> tuple[str, ...]:
    """A TOML array of strings, or one comma-separated string (the flag form)."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ConfigError(f"{key} must be a list of strings or a comma-separated string")
    out: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in out:
            out.append(nfc(item))
    return tuple(out)
