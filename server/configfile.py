"""An operator's TOML file (the config file, the host-keys file) and :class:`ConfigError`, the
one-line refusal of an unusable launch configuration. Imports nothing of server/: config.py and
hostkeys.py both build on it."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The launch configuration is unusable; the message is one line for the operator."""


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file the operator wrote; ``what`` names it in the one-line refusals."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror}") from None
