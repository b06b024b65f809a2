"""`engram-memory host ...` (keygen, sign-context, sign-confirmation) and the host-keys file."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from engram_memory.models.context import HostContext
from engram_memory.models.hostauth import (
    ConfirmationClaims,
    ContextClaims,
    bearer_digest,
    load_private_key,
    load_public_key,
    new_private_key,
    operation_digest,
    public_pem,
    verify,
)
from engram_memory.server.config import ConfigError
from engram_memory.server.hostkeys import HostKey, HostKeys, host_entry, keygen, load_host_keys, parse_scopes

CLI = [sys.executable, "-m", "engram_memory.server.cli", "host"]


def host_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=60)


def assert_one_line_refusal(done: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, nothing on stdout, exactly one line on stderr and no traceback."""
    assert done.returncode == 2, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("engram-memory: error: ")
    assert "Traceback" not in done.stderr
    return lines[0]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- keygen -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keydir(tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> Path:
    """host-a made by the real CLI (shared by the signing tests, which never change it)."""
    out = tmp_path_factory.mktemp("cli-keys") / "keys"
    done = host_cli("keygen", "--out", str(out), "--kid", "host-a", "--scope", "t-1/*", "--scope", "t-2/ws-1",
                    env=offline_env)
    assert done.returncode == 0, done.stderr
    return out


def test_keygen_writes_owner_only_files_and_a_parsable_host_keys(keydir: Path) -> None:
    files = [keydir / "host-a.private.pem", keydir / "host-a.token", keydir / "host-keys.toml"]
    for path in files:
        assert mode(path) == 0o600, path
    assert mode(keydir) == 0o700
    assert sorted(p.name for p in keydir.iterdir()) == sorted(p.name for p in files)  # no temp file left
    data = tomllib.loads((keydir / "host-keys.toml").read_text())
    assert data["server_id"] == "engram-local"
    [entry] = data["host"]
    assert set(entry) == {"kid", "public_key_pem", "bearer_sha256", "scopes"}
    assert entry["kid"] == "host-a"
    assert entry["scopes"] == ["t-1/*", "t-2/ws-1"]
    token = (keydir / "host-a.token").read_text().strip()
    assert entry["bearer_sha256"] == bearer_digest(token)
    private = load_private_key((keydir / "host-a.private.pem").read_bytes())
    assert entry["public_key_pem"].strip() == public_pem(private).strip()
    keys = load_host_keys(keydir / "host-keys.toml")
    assert keys.server_id == "engram-local" and list(keys.hosts) == ["host-a"]


def test_keygen_appends_a_second_kid_and_refuses_a_duplicate(tmp_path: Path, offline_env: dict[str, str]) -> None:
    out = tmp_path / "keys"
    first = host_cli("keygen", "--out", str(out), "--kid", "host-a", "--scope", "*/*", "--server-id", "engram-team",
                     env=offline_env)
    assert first.returncode == 0, first.stderr
    assert "Traceback" not in first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    second = host_cli("keygen", "--out", str(out), "--kid", "host-b", "--scope", "acme/eng", env=offline_env)
    assert second.returncode == 0, second.stderr
    data = tomllib.loads((out / "host-keys.toml").read_text())
    assert data["server_id"] == "engram-team"  # an existing file keeps its audience
    assert [h["kid"] for h in data["host"]] == ["host-a", "host-b"]
    assert (out / "host-a.private.pem").read_bytes() == before["host-a.private.pem"]
    assert (out / "host-a.token").read_bytes() == before["host-a.token"]
    assert mode(out / "host-keys.toml") == 0o600
    assert mode(out / "host-b.private.pem") == mode(out / "host-b.token") == 0o600
    a, b = data["host"]
    assert a["public_key_pem"] != b["public_key_pem"] and a["bearer_sha256"] != b["bearer_sha256"]
    keys = load_host_keys(out / "host-keys.toml")
    assert keys.host_for_bearer((out / "host-b.token").read_text().strip()) == "host-b"

    after_two = {p.name: p.read_bytes() for p in out.iterdir()}
    dup = host_cli("keygen", "--out", str(out), "--kid", "host-a", "--scope", "*/*", env=offline_env)
    line = assert_one_line_refusal(dup)
    assert "host-a" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == after_two  # nothing overwritten


@pytest.mark.parametrize("kid", ["-dash-first", "has space", "x" * 129, "slash/kid"])
def test_keygen_refuses_a_bad_kid(tmp_path: Path, offline_env: dict[str, str], kid: str) -> None:
    out = tmp_path / "keys"
    assert_one_line_refusal(host_cli("keygen", "--out", str(out), "--kid", kid, "--scope", "*/*", env=offline_env))
    assert not (out / "host-keys.toml").exists()


# ---- sign-context / sign-confirmation ---------------------------------------------------------


def public_key_of(keydir: Path, kid: str = "host-a") -> Ed25519PublicKey:
    entry = next(h for h in tomllib.loads((keydir / "host-keys.toml").read_text())["host"] if h["kid"] == kid)
    return load_public_key(entry["public_key_pem"])


CONTEXT_FLAGS = ["--tenant", "t-1", "--workspace", "ws-9", "--principal", "pat@example.test",
                 "--agent-id", "agent-3", "--purpose-ref", "purpose:cli-test"]


def test_sign_context_prints_a_verifiable_context(keydir: Path, offline_env: dict[str, str]) -> None:
    deadline = "2031-12-03T12:00:00.000Z"
    done = host_cli("sign-context", "--key", str(keydir / "host-a.private.pem"), *CONTEXT_FLAGS,
                    "--tools", "search,get,forget", "--confirm", "capture", "--session", "s-42",
                    "--ttl", "120", "--deadline", deadline, env=offline_env)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert done.stdout == token + "\n"
    assert jwt.get_unverified_header(token) == {"alg": "EdDSA", "kid": "host-a", "typ": "JWT"}
    claims: ContextClaims = verify(token, public_key_of(keydir), "engram-local", time.time(), ContextClaims)
    assert (claims.tenant, claims.workspace, claims.principal, claims.agent_id) == (
        "t-1", "ws-9", "pat@example.test", "agent-3")
    assert (claims.session, claims.purpose_ref) == ("s-42", "purpose:cli-test")
    assert claims.tools == ["search", "get", "forget"] and claims.confirm == ["capture"]
    assert claims.deadline == deadline
    assert claims.exp - claims.iat == 120
    assert abs(claims.iat - time.time()) < 60
    assert claims.aud == "engram-local"
    # A second token is a different, single-use context.
    again = host_cli("sign-context", "--key", str(keydir / "host-a.private.pem"), *CONTEXT_FLAGS,
                     "--tools", "search", env=offline_env)
    other: ContextClaims = verify(again.stdout.strip(), public_key_of(keydir), "engram-local", time.time(),
                                  ContextClaims)
    assert other.jti != claims.jti
    assert other.exp - other.iat == 60 and other.session == "script" and other.confirm == []


def test_sign_context_takes_the_audience_from_the_host_keys_file(tmp_path: Path, offline_env: dict[str, str]
                                                                 ) -> None:
    keygen(tmp_path, "host-x", ["*/*"], server_id="engram-team")
    key = str(tmp_path / "host-x.private.pem")
    public = load_public_key(public_pem(load_private_key((tmp_path / "host-x.private.pem").read_bytes())))
    token = host_cli("sign-context", "--key", key, *CONTEXT_FLAGS, "--tools", "search", env=offline_env).stdout.strip()
    assert verify(token, public, "engram-team", time.time(), ContextClaims).aud == "engram-team"
    with pytest.raises(Exception, match="InvalidAudience"):
        verify(token, public, "engram-local", time.time(), ContextClaims)
    explicit = host_cli("sign-context", "--key", key, *CONTEXT_FLAGS, "--tools", "search", "--audience", "elsewhere",
                        env=offline_env).stdout.strip()
    assert verify(explicit, public, "elsewhere", time.time(), ContextClaims).aud == "elsewhere"


@pytest.mark.parametrize(
    ("tool", "arguments", "target"),
    [
        ("forget", {"record_id": "mem_abc", "idempotency_key": "fg-0000000000000001", "reason_ref": "reason:x"},
         "mem_abc"),
        ("engram_memory_withdraw", {"candidate_id": "candidate_" + "a" * 64, "idempotency_key": "wd-000000000001",
                                    "reason_ref": "reason:y"}, "candidate_" + "a" * 64),
        ("capture", {"idempotency_key": "cap-00000000000001", "payload": {"purpose_ref": "purpose:caf\u00e9"}}, ""),
    ],
)
def test_sign_confirmation_binds_the_exact_operation(keydir: Path, offline_env: dict[str, str], tool: str,
                                                     arguments: dict[str, object], target: str) -> None:
    done = host_cli("sign-confirmation", "--key", str(keydir / "host-a.private.pem"), "--tool", tool,
                    "--arguments", json.dumps(arguments), "--tenant", "t-1", "--workspace", "ws-9",
                    "--principal", "pat@example.test", "--ttl", "45", env=offline_env)
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert jwt.get_unverified_header(token)["kid"] == "host-a"
    claims: ConfirmationClaims = verify(token, public_key_of(keydir), "engram-local", time.time(),
                                        ConfirmationClaims)
    short = tool.removeprefix("engram_memory_")
    assert claims.capability == short
    assert claims.target == target
    assert claims.exp - claims.iat == 45
    # The digest covers tool, tenant, workspace, principal and arguments only (not agent, session, purpose).
    host = HostContext("t-1", "ws-9", "pat@example.test", "any-agent", "purpose:any", "any-session")
    assert claims.operation_digest == operation_digest(short, host, arguments)
    assert claims.operation_digest == operation_digest("engram_memory_" + short, host, arguments)
    other_principal = HostContext("t-1", "ws-9", "eve", "any-agent", "purpose:any")
    assert claims.operation_digest != operation_digest(short, other_principal, arguments)
    assert claims.operation_digest != operation_digest(short, host, {**arguments, "idempotency_key": "z" * 16})


@pytest.mark.parametrize(
    "args",
    [
        ["sign-confirmation", "--tool", "nope", "--arguments", "{}"],
        ["sign-confirmation", "--tool", "forget", "--arguments", "{not json"],
        ["sign-confirmation", "--tool", "forget", "--arguments", "[1, 2]"],
        ["sign-confirmation", "--tool", "forget", "--arguments", "{}", "--ttl", "301"],
        ["sign-context", "--tools", "search,nope", "--agent-id", "a", "--purpose-ref", "p"],
        ["sign-context", "--tools", "search", "--ttl", "0", "--agent-id", "a", "--purpose-ref", "p"],
        ["sign-context", "--tools", "search", "--agent-id", "bad agent", "--purpose-ref", "p"],
    ],
)
def test_signing_refusals_are_one_line(keydir: Path, offline_env: dict[str, str], args: list[str]) -> None:
    scope = ["--tenant", "t-1", "--workspace", "ws-9", "--principal", "pat"]
    done = host_cli(*args, "--key", str(keydir / "host-a.private.pem"), *scope, env=offline_env)
    assert_one_line_refusal(done)


def test_signing_with_a_missing_or_foreign_key_is_one_line(tmp_path: Path, offline_env: dict[str, str]) -> None:
    flags = [*CONTEXT_FLAGS, "--tools", "search"]
    assert_one_line_refusal(host_cli("sign-context", "--key", str(tmp_path / "absent.private.pem"), *flags,
                                     env=offline_env))
    ec_key = ec.generate_private_key(ec.SECP256R1())
    pem = tmp_path / "ec.private.pem"
    pem.write_bytes(ec_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))
    line = assert_one_line_refusal(host_cli("sign-context", "--key", str(pem), *flags, env=offline_env))
    assert "BEGIN" not in line


# ---- load_host_keys refusals ------------------------------------------------------------------


def valid_entry(kid: str = "host-a", digest: str | None = None) -> str:
    return host_entry(kid, public_pem(new_private_key()), digest or bearer_digest("token-" + kid), ["*/*"])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "host-keys.toml"
    path.write_text(text)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_host_keys(path)
    message = str(info.value)
    assert "\n" not in message and message
    assert "BEGIN PUBLIC KEY" not in message and "token-" not in message
    return message


def test_a_valid_file_loads(tmp_path: Path) -> None:
    keys = load_host_keys(write(tmp_path, 'server_id = "srv"\n' + valid_entry("host-a") + valid_entry("host-b")))
    assert keys.server_id == "srv"
    assert sorted(keys.hosts) == ["host-a", "host-b"]
    empty = load_host_keys(write(tmp_path, 'server_id = "srv"\n'))
    assert empty.hosts == {}


def test_missing_file_is_refused(tmp_path: Path) -> None:
    assert "not found" in refusal(tmp_path / "absent.toml")


def test_bad_toml_is_refused(tmp_path: Path) -> None:
    assert "not valid TOML" in refusal(write(tmp_path, 'server_id = "srv"\n[[host]\nkid = \n'))


def test_unknown_top_level_key_is_refused(tmp_path: Path) -> None:
    assert "unknown key(s): extra" in refusal(write(tmp_path, 'server_id = "srv"\nextra = 1\n' + valid_entry()))


def test_unknown_or_missing_host_key_is_refused(tmp_path: Path) -> None:
    extra = valid_entry().rstrip("\n") + '\nnote = "x"\n'
    wanted = "exactly kid, public_key_pem, bearer_sha256 and scopes"
    assert wanted in refusal(write(tmp_path, 'server_id = "s"\n' + extra))
    missing = '\n[[host]]\nkid = "host-a"\nbearer_sha256 = "' + bearer_digest("t") + '"\n'
    assert "exactly kid" in refusal(write(tmp_path, 'server_id = "s"\n' + missing))


def test_missing_server_id_is_refused(tmp_path: Path) -> None:
    assert "server_id" in refusal(write(tmp_path, valid_entry()))
    assert "server_id" in refusal(write(tmp_path, 'server_id = ""\n' + valid_entry()))


@pytest.mark.parametrize("digest", ["sha256:" + "A" * 64, "sha256:" + "0" * 63, "md5:" + "0" * 64, "0" * 64])
def test_bad_bearer_digest_is_refused(tmp_path: Path, digest: str) -> None:
    assert "bearer_sha256" in refusal(write(tmp_path, 'server_id = "s"\n' + valid_entry(digest=digest)))


def test_non_ed25519_key_is_refused(tmp_path: Path) -> None:
    ec_pem = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")
    entry = host_entry("host-a", ec_pem, bearer_digest("t"), ["*/*"])
    assert "not an Ed25519 public key" in refusal(write(tmp_path, 'server_id = "s"\n' + entry))
    garbage = host_entry("host-a", "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----", bearer_digest("t"),
                         ["*/*"])
    assert "not an Ed25519 public key" in refusal(write(tmp_path, 'server_id = "s"\n' + garbage))


def test_duplicate_kid_is_refused(tmp_path: Path) -> None:
    assert "appears twice" in refusal(write(tmp_path, 'server_id = "s"\n' + valid_entry("a") + valid_entry("a")))


def test_bad_kid_is_refused(tmp_path: Path) -> None:
    assert "kid must be" in refusal(write(tmp_path, 'server_id = "s"\n' + valid_entry("bad kid")))


def test_host_must_be_an_array_of_tables(tmp_path: Path) -> None:
    assert "array of tables" in refusal(write(tmp_path, 'server_id = "s"\nhost = "host-a"\n'))


# ---- bearer lookup ------------------------------------------------------------------------------


def test_host_for_bearer(tmp_path: Path) -> None:
    keygen(tmp_path, "host-a", ["*/*"])
    keygen(tmp_path, "host-b", ["acme/*"])
    keys: HostKeys = load_host_keys(tmp_path / "host-keys.toml")
    token_a = (tmp_path / "host-a.token").read_text().strip()
    token_b = (tmp_path / "host-b.token").read_text().strip()
    assert keys.host_for_bearer(token_a) == "host-a"
    assert keys.host_for_bearer(token_b) == "host-b"
    for wrong in ("", "wrong", token_a + "x", token_a[:-1], " " + token_a, bearer_digest(token_a), token_a + token_b):
        assert keys.host_for_bearer(wrong) is None, wrong
    assert HostKeys("srv", {}).host_for_bearer(token_a) is None


@pytest.mark.parametrize("server_id", ['x"y', "a\n[[host]]", ""])
def test_keygen_refuses_a_bad_server_id_before_writing_anything(tmp_path: Path, offline_env: dict[str, str],
                                                               server_id: str) -> None:
    out = tmp_path / "keys"
    done = host_cli("keygen", "--out", str(out), "--kid", "host-a", "--scope", "*/*", "--server-id", server_id,
                    env=offline_env)
    assert "server_id" in assert_one_line_refusal(done)
    assert not out.exists() or not any(out.iterdir())


# ---- scopes: what a host key may bind ------------------------------------------------------------


def test_an_entry_without_scopes_is_refused(tmp_path: Path) -> None:
    bare = '\n[[host]]\nkid = "host-a"\npublic_key_pem = """' + public_pem(new_private_key()).strip() + \
        '"""\nbearer_sha256 = "' + bearer_digest("t") + '"\n'
    line = refusal(write(tmp_path, 'server_id = "s"\n' + bare))
    assert "host #1 has no scopes" in line and "*/*" in line


@pytest.mark.parametrize("scopes", ["[]", '"acme/*"', '["acme"]', '["acme/eng/x"]', '["ac*/eng"]', '["/eng"]',
                                    '["acme/ eng"]', "[1]"])
def test_bad_scopes_are_refused(tmp_path: Path, scopes: str) -> None:
    entry = valid_entry().replace('scopes = ["*/*"]', f"scopes = {scopes}")
    line = refusal(write(tmp_path, 'server_id = "s"\n' + entry))
    assert "(host-a): " in line and "scope" in line and "TENANT/WORKSPACE" in line


def test_scope_patterns_match_whole_segments() -> None:
    keygen_scopes = parse_scopes(["acme/eng", "globex/*", "acme/eng"])
    assert [str(p) for p in keygen_scopes] == ["acme/eng", "globex/*"]  # duplicates collapse, order kept
    host = HostKey("h", new_private_key().public_key(), b"\0" * 32, keygen_scopes)
    assert host.binds("acme", "eng") and host.binds("globex", "anything")
    assert not host.binds("acme", "ops") and not host.binds("acme", "eng2") and not host.binds("acmex", "eng")
    wild = HostKey("w", new_private_key().public_key(), b"\0" * 32, parse_scopes(["*/*"]))
    assert wild.binds("any", "thing")
    per_workspace = HostKey("p", new_private_key().public_key(), b"\0" * 32, parse_scopes(["*/shared"]))
    assert per_workspace.binds("a", "shared") and not per_workspace.binds("shared", "a")


def test_keygen_needs_a_scope(tmp_path: Path, offline_env: dict[str, str]) -> None:
    out = tmp_path / "keys"
    line = assert_one_line_refusal(host_cli("keygen", "--out", str(out), "--kid", "host-a", env=offline_env))
    assert "--scope" in line
    bad = host_cli("keygen", "--out", str(out), "--kid", "host-a", "--scope", "acme", env=offline_env)
    assert "scope must be" in assert_one_line_refusal(bad)
    assert not out.exists() or not any(out.iterdir())


def test_sign_context_refuses_a_scope_outside_the_keys_entry(keydir: Path, offline_env: dict[str, str]) -> None:
    key = str(keydir / "host-a.private.pem")
    common = ["--principal", "p", "--agent-id", "a", "--purpose-ref", "purpose:x", "--tools", "search"]
    for tenant, workspace in (("t-1", "anything"), ("t-2", "ws-1")):
        ok = host_cli("sign-context", "--key", key, "--tenant", tenant, "--workspace", workspace, *common,
                      env=offline_env)
        assert ok.returncode == 0, ok.stderr
    line = assert_one_line_refusal(host_cli("sign-context", "--key", key, "--tenant", "t-2", "--workspace", "ws-2",
                                            *common, env=offline_env))
    assert "may not bind t-2/ws-2" in line and "t-1/*, t-2/ws-1" in line
    confirm = host_cli("sign-confirmation", "--key", key, "--tool", "forget", "--arguments", "{}", "--tenant", "x",
                       "--workspace", "y", "--principal", "p", env=offline_env)
    assert "may not bind x/y" in assert_one_line_refusal(confirm)


def test_keygen_warns_inside_a_git_tree_that_does_not_ignore_it(tmp_path: Path, offline_env: dict[str, str]
                                                                ) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    exposed = host_cli("keygen", "--out", str(tmp_path / "keys"), "--kid", "h", "--scope", "*/*", env=offline_env)
    assert exposed.returncode == 0
    assert "warning:" in exposed.stderr and "not ignored" in exposed.stderr
    (tmp_path / ".gitignore").write_text("secret-keys/\n")
    ignored = host_cli("keygen", "--out", str(tmp_path / "secret-keys"), "--kid", "h", "--scope", "*/*",
                       env=offline_env)
    assert ignored.returncode == 0 and ignored.stderr == ""
    outside = host_cli("keygen", "--out", str(tmp_path.parent / (tmp_path.name + "-elsewhere")), "--kid", "h",
                       "--scope", "*/*", env=offline_env)
    assert outside.returncode == 0 and outside.stderr == ""
