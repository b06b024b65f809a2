"""The host-keys file: which hosts may call this server, and how each proves it.

TOML, exactly::

    server_id = "engram-local"            # the JWT audience this server accepts
    [[host]]
    kid = "host-a"                        # names the signing key in JWT headers
    public_key_pem = \"\"\"-----BEGIN PUBLIC KEY-----...\"\"\"
    bearer_sha256 = "sha256:<64 hex>"     # sha256 of the host's bearer token (UTF-8)
    scopes = ["acme/eng", "acme/*"]       # the TENANT/WORKSPACE scopes this host may bind

``scopes`` is required and never empty: ``*`` stands for a whole segment, and a host that may
bind everything says so with ``"*/*"``. A context naming a scope outside its host's list is
refused like any untrusted context. The server re-reads the file on SIGHUP; a file that no
longer parses keeps the previous keys.
"""

from __future__ import annotations

import hmac
import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from engram_memory.models.context import HOST_ID_PATTERN
from engram_memory.models.hostauth import (
    bearer_digest,
    load_public_key,
    new_bearer_token,
    new_private_key,
    private_pem,
    public_pem,
)
from engram_memory.server.configfile import ConfigError, read_toml

DEFAULT_SERVER_ID = "engram-local"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST_KEYS = frozenset({"kid", "public_key_pem", "bearer_sha256", "scopes"})
WILDCARD = "*"
SCOPE_HELP = ('TENANT/WORKSPACE, each a name (A-Z a-z 0-9 . _ : @ -, starting with a letter or digit)'
              ' or * for any; "*/*" binds every scope')


@dataclass(frozen=True)
class ScopePattern:
    """``TENANT/WORKSPACE`` where ``*`` stands for a whole segment (never part of one)."""

    tenant: str
    workspace: str

    @classmethod
    def parse(cls, text: str) -> ScopePattern:
        """Raises ValueError (without echoing the text) unless it is exactly two valid segments."""
        parts = text.split("/") if isinstance(text, str) else []
        if len(parts) != 2 or not all(p == WILDCARD or HOST_ID_PATTERN.match(p) for p in parts):
            raise ValueError("a scope must be " + SCOPE_HELP)
        return cls(parts[0], parts[1])

    def matches(self, tenant: str, workspace: str) -> bool:
        return self.tenant in (WILDCARD, tenant) and self.workspace in (WILDCARD, workspace)

    def __str__(self) -> str:
        return f"{self.tenant}/{self.workspace}"


def parse_scopes(texts: Iterable[str]) -> tuple[ScopePattern, ...]:
    """Every pattern checked; duplicates collapse, the order is kept."""
    out: list[ScopePattern] = []
    for text in texts:
        pattern = ScopePattern.parse(text)
        if pattern not in out:
            out.append(pattern)
    return tuple(out)


ANY_SCOPE = (ScopePattern(WILDCARD, WILDCARD),)  # the data dir's own local key (server/local.py)


@dataclass(frozen=True)
class HostKey:
    kid: str
    public_key: Ed25519PublicKey
    bearer_sha256: bytes  # the 32 raw digest bytes
    scopes: tuple[ScopePattern, ...]  # never empty

    def binds(self, tenant: str, workspace: str) -> bool:
        """May this host sign a context (or a confirmation) for tenant/workspace?"""
        return any(p.matches(tenant, workspace) for p in self.scopes)


@dataclass(frozen=True)
class HostKeys:
    server_id: str
    hosts: dict[str, HostKey]

    def host_for_bearer(self, token: str) -> str | None:
        """The kid whose bearer digest matches; every entry is compared, in constant time."""
        presented = bytes.fromhex(bearer_digest(token).removeprefix("sha256:"))
        found: str | None = None
        for host in self.hosts.values():
            if hmac.compare_digest(presented, host.bearer_sha256):
                found = host.kid
        return found


def load_host_keys(path: Path) -> HostKeys:
    """Parse and check the file; every refusal is one line naming the problem, never a key."""
    data = read_toml(path, "host-keys file")
    unknown = sorted(set(data) - {"server_id", "host"})
    if unknown:
        raise ConfigError(f"host-keys file {path}: unknown key(s): " + ", ".join(unknown))
    server_id = data.get("server_id")
    if not isinstance(server_id, str) or not server_id:
        raise ConfigError(f"host-keys file {path}: server_id must be a non-empty string")
    entries = data.get("host", [])
    if not isinstance(entries, list):
        raise ConfigError(f"host-keys file {path}: host must be an array of tables ([[host]])")
    hosts: dict[str, HostKey] = {}
    for number, entry in enumerate(entries, 1):
        where = f"host-keys file {path}: host #{number}"
        if isinstance(entry, dict) and set(entry) == _HOST_KEYS - {"scopes"}:
            raise ConfigError(f"{where} has no scopes: list the TENANT/WORKSPACE scopes its host may bind,"
                              ' e.g. scopes = ["acme/*"] ("*/*" for every scope)')
        if not isinstance(entry, dict) or set(entry) != _HOST_KEYS:
            raise ConfigError(f"{where} must have exactly kid, public_key_pem, bearer_sha256 and scopes")
        kid, pem, digest = entry["kid"], entry["public_key_pem"], entry["bearer_sha256"]
        if not isinstance(kid, str) or not HOST_ID_PATTERN.match(kid):
            raise ConfigError(f"{where}: kid must be 1-128 of A-Z a-z 0-9 . _ : @ -")
        if kid in hosts:
            raise ConfigError(f"{where}: kid {kid} appears twice")
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise ConfigError(f"{where} ({kid}): bearer_sha256 must be sha256:<64 lowercase hex>")
        try:
            public_key = load_public_key(pem) if isinstance(pem, str) else None
        except ValueError:
            public_key = None
        if public_key is None:
            raise ConfigError(f"{where} ({kid}): public_key_pem is not an Ed25519 public key in PEM")
        scopes = entry["scopes"]
        if not isinstance(scopes, list) or not scopes or not all(isinstance(t, str) for t in scopes):
            raise ConfigError(f"{where} ({kid}): scopes must be a non-empty list of " + SCOPE_HELP)
        try:
            patterns = parse_scopes(scopes)
        except ValueError as exc:
            raise ConfigError(f"{where} ({kid}): {exc}") from None
        hosts[kid] = HostKey(kid, public_key, bytes.fromhex(digest.removeprefix("sha256:")), patterns)
    return HostKeys(server_id, hosts)


# ---- keygen (host tooling) -------------------------------------------------------------------


def write_owner_only(path: Path, data: bytes) -> None:
    """Create (or replace) a file readable by its owner only, never briefly wider."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def host_entry(kid: str, public_key_pem: str, bearer_sha256: str, scopes: Sequence[str]) -> str:
    listed = ", ".join(f'"{t}"' for t in scopes)
    return (
        f'\n[[host]]\nkid = "{kid}"\npublic_key_pem = """{public_key_pem.strip()}"""\n'
        f'bearer_sha256 = "{bearer_sha256}"\nscopes = [{listed}]\n'
    )


@dataclass(frozen=True)
class Keygen:
    private_key: Path
    token: Path
    host_keys: Path


def keygen(out_dir: Path, kid: str, scopes: Sequence[str], server_id: str = DEFAULT_SERVER_ID) -> Keygen:
    """Write ``NAME.private.pem`` and ``NAME.token`` (0600) and add the host, bound to ``scopes``,
    to ``host-keys.toml``."""
    if not scopes:
        raise ConfigError("give at least one --scope TENANT/WORKSPACE (\"*/*\" for every scope)")
    try:
        patterns = parse_scopes(scopes)
    except ValueError as exc:
        raise ConfigError(f"--scope: {exc}") from None
    if not HOST_ID_PATTERN.match(kid):
        raise ConfigError("kid must be 1-128 of A-Z a-z 0-9 . _ : @ - (starting with a letter or digit)")
    if not HOST_ID_PATTERN.match(server_id):
        raise ConfigError("server_id must be 1-128 of A-Z a-z 0-9 . _ : @ - (starting with a letter or digit)")
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys_path = out_dir / "host-keys.toml"
    if keys_path.exists():
        existing = load_host_keys(keys_path)
        if kid in existing.hosts:
            raise ConfigError(f"{keys_path} already has a host {kid}; pick another --kid")
        text = keys_path.read_text(encoding="utf-8")
    else:
        text = f'server_id = "{server_id}"\n'
    key = new_private_key()
    token = new_bearer_token()
    text = text.rstrip("\n") + "\n" + host_entry(kid, public_pem(key), bearer_digest(token),
                                                  [str(p) for p in patterns])
    tomllib.loads(text)  # what we are about to write parses, before any file is written
    priv, tok = out_dir / f"{kid}.private.pem", out_dir / f"{kid}.token"
    write_owner_only(priv, private_pem(key))
    write_owner_only(tok, token.encode("ascii") + b"\n")
    write_owner_only(keys_path, text.encode("utf-8"))
    return Keygen(priv, tok, keys_path)
