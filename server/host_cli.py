"""``engram-memory host ...``: key generation and token signing for hosts and scripts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from engram_memory.models.context import ALL_TOOLS, HostContext
from engram_memory.models.hostauth import HostSigner, load_private_key
from engram_memory.server.config import ConfigError
from engram_memory.server.hostkeys import DEFAULT_SERVER_ID, HostKey, HostKeys, keygen, load_host_keys

host_app = typer.Typer(
    name="host",
    help="Host tooling for HTTP mode: keys, signed contexts and confirmations.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _fail(message: str) -> typer.Exit:
    sys.stderr.write(f"engram-memory: error: {message}\n")
    return typer.Exit(code=2)


def _signer(key: Path, kid: str | None, host_keys: Path | None, audience: str | None
            ) -> tuple[HostSigner, HostKey | None]:
    """The signing key, and its host-keys entry when one is at hand (``--host-keys``, or the
    ``host-keys.toml`` beside the key): the audience and the scopes come from it."""
    try:
        private = load_private_key(key.read_bytes())
    except FileNotFoundError:
        raise _fail(f"key file not found: {key}") from None
    except (ValueError, TypeError):
        raise _fail(f"{key} is not an Ed25519 private key in PEM") from None
    name = kid or key.name.removesuffix(".private.pem")
    if host_keys is None:
        sibling = key.parent / "host-keys.toml"
        host_keys = sibling if sibling.exists() else None
    keys: HostKeys | None = None
    if host_keys is not None:
        try:
            keys = load_host_keys(host_keys)
        except ConfigError as exc:
            raise _fail(str(exc)) from None
    if audience is None:
        audience = keys.server_id if keys else DEFAULT_SERVER_ID
    return HostSigner(name, private, audience), keys.hosts.get(name) if keys else None


def _check_scope(entry: HostKey | None, tenant: str, workspace: str) -> None:
    """Refuse to sign what the server would refuse: a scope outside the key's entry."""
    if entry is not None and not entry.binds(tenant, workspace):
        allowed = ", ".join(str(p) for p in entry.scopes)
        raise _fail(f"host {entry.kid} may not bind {tenant}/{workspace}; its scopes are: {allowed}")


def _git_exposure(directory: Path, file: Path) -> Path | None:
    """The git work tree that would track ``file`` (inside it and not ignored), or None."""
    git = shutil.which("git")
    if git is None:
        return None
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([git, "-C", str(directory), *args], capture_output=True, text=True, check=False)
    top = run("rev-parse", "--show-toplevel")
    if top.returncode != 0:
        return None
    ignored = run("check-ignore", "-q", "--", str(file.resolve()))
    return Path(top.stdout.strip()) if ignored.returncode == 1 else None


def _context(tenant: str, workspace: str, principal: str, agent_id: str, session: str, purpose_ref: str) -> HostContext:
    try:
        return HostContext(tenant, workspace, principal, agent_id, purpose_ref, session)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _tools(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = sorted(set(names) - set(ALL_TOOLS))
    if bad:
        raise _fail("unknown tool(s): " + ", ".join(bad) + "; choose from " + ",".join(ALL_TOOLS))
    return names


KeyOpt = Annotated[Path, typer.Option("--key", help="The host's NAME.private.pem.")]
KidOpt = Annotated[str | None, typer.Option("--kid", help="Key id (default: from the key file name).")]
KeysOpt = Annotated[
    Path | None, typer.Option("--host-keys", help="host-keys.toml for the audience (default: beside --key).")
]
AudOpt = Annotated[str | None, typer.Option("--audience", help="Server id (default: the host-keys file's).")]
TtlOpt = Annotated[int, typer.Option("--ttl", help="Seconds until exp (at most 300).")]


@host_app.command("keygen")
def keygen_cmd(
    out: Annotated[Path, typer.Option("--out", help="Directory for the key, token and host-keys.toml.")],
    kid: Annotated[str, typer.Option("--kid", help="Name of the host's key (the JWT kid).")],
    scope: Annotated[
        list[str] | None,
        typer.Option("--scope", help='A TENANT/WORKSPACE this host may bind (repeat; * for a whole segment,'
                     ' "*/*" for every scope). At least one.'),
    ] = None,
    server_id: Annotated[
        str, typer.Option("--server-id", help="Audience written when host-keys.toml is created.")
    ] = DEFAULT_SERVER_ID,
) -> None:
    """Write DIR/NAME.private.pem and DIR/NAME.token (0600) and add the host, bound to its scopes,
    to DIR/host-keys.toml."""
    try:
        made = keygen(out, kid, scope or [], server_id)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    tree = _git_exposure(out, made.private_key)
    if tree is not None:
        sys.stderr.write(
            f"engram-memory: warning: {out} is inside the git work tree {tree} and not ignored: the private key"
            " and bearer token could be committed; add it to .gitignore or keep keys outside the tree\n")
    print(f"private key  {made.private_key}")
    print(f"bearer token {made.token}")
    print(f"host keys    {made.host_keys}  (serve --host-keys {made.host_keys}; SIGHUP reloads it)")


@host_app.command("sign-context")
def sign_context_cmd(
    key: KeyOpt,
    tenant: Annotated[str, typer.Option()],
    workspace: Annotated[str, typer.Option()],
    principal: Annotated[str, typer.Option()],
    agent_id: Annotated[str, typer.Option("--agent-id")],
    purpose_ref: Annotated[str, typer.Option("--purpose-ref")],
    tools: Annotated[str, typer.Option(help="Enabled tools, comma-separated.")],
    session: Annotated[str, typer.Option(help="Host session id.")] = "script",
    confirm: Annotated[str, typer.Option(help="Tools that also need a signed confirmation.")] = "",
    deadline: Annotated[str | None, typer.Option(help="Instant, e.g. 2026-12-03T12:00:00.000Z.")] = None,
    kid: KidOpt = None,
    host_keys: KeysOpt = None,
    audience: AudOpt = None,
    ttl: TtlOpt = 60,
) -> None:
    """Print a context JWT for _meta["io.sentropic.engram/context"] (single use)."""
    if not 0 < ttl <= 300:
        raise _fail("--ttl must be in 1..300")
    signer, entry = _signer(key, kid, host_keys, audience)
    host = _context(tenant, workspace, principal, agent_id, session, purpose_ref)
    _check_scope(entry, tenant, workspace)
    print(signer.context(host, _tools(tools), _tools(confirm), ttl_s=ttl, deadline=deadline))


@host_app.command("sign-confirmation")
def sign_confirmation_cmd(
    key: KeyOpt,
    tool: Annotated[str, typer.Option(help="The confirmed tool, e.g. forget.")],
    arguments: Annotated[str, typer.Option(help="The exact call arguments as JSON.")],
    tenant: Annotated[str, typer.Option()],
    workspace: Annotated[str, typer.Option()],
    principal: Annotated[str, typer.Option()],
    kid: KidOpt = None,
    host_keys: KeysOpt = None,
    audience: AudOpt = None,
    ttl: TtlOpt = 60,
) -> None:
    """Print a confirmation JWT for _meta["io.sentropic.engram/confirmation"] (use within 30 s)."""
    if not 0 < ttl <= 300:
        raise _fail("--ttl must be in 1..300")
    name = tool.removeprefix("engram_memory_")
    if name not in ALL_TOOLS:
        raise _fail(f"unknown tool {tool}")
    try:
        args = json.loads(arguments)
    except ValueError:
        raise _fail("--arguments is not valid JSON") from None
    if not isinstance(args, dict):
        raise _fail("--arguments must be a JSON object")
    signer, entry = _signer(key, kid, host_keys, audience)
    # agent, session and purpose are not part of the operation digest
    host = _context(tenant, workspace, principal, "host", "script", "purpose:confirmation")
    _check_scope(entry, tenant, workspace)
    print(signer.confirmation(name, host, args, ttl_s=ttl))
