"""Host keys bound to scopes: a host signs contexts only for the TENANT/WORKSPACE patterns the
operator listed for it (host-keys.toml ``scopes``), through a real ``serve --http`` and the SDK."""

from __future__ import annotations

import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import duckdb
import pytest

from engram_memory.models.hostauth import CONFIRMATION_META_KEY
from engram_memory.server.hostkeys import host_entry
from tests.conftest import capture_args, get_args, key, search_args
from tests.http_fixtures import HostKit, HttpServer, SignedClient, host_context, http_server, signed_client
from tests.test_e2e_http import admit, assert_context_refused, forget_args, search_ids, still_there

pytestmark = pytest.mark.anyio

SCOPES = {"host-a": ["acme/*"], "host-b": ["globex/eng"], "host-w": ["*/*"]}
OWN = {"host-a": ("acme", "eng"), "host-b": ("globex", "eng"), "host-w": ("initech", "ops")}


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> HostKit:
    kit = HostKit(tmp_path_factory.mktemp("scope-keys"))
    for kid, scopes in SCOPES.items():
        kit.add(kid, scopes)
    return kit


@pytest.fixture(scope="module")
def server(kit: HostKit, tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]
           ) -> Iterator[HttpServer]:
    with http_server(tmp_path_factory.mktemp("scope-data"), kit, offline_env) as srv:
        yield srv


def journal(data_dir: Path) -> dict[str, int]:
    """Events per scope, read from the DuckDB file once the server has stopped."""
    con = duckdb.connect(str(data_dir / "engram.duckdb"), read_only=True)
    try:
        return dict(con.execute("SELECT scope_ref, count(*) FROM journal GROUP BY 1 ORDER BY 1").fetchall())
    finally:
        con.close()


async def cross_attempts(c: SignedClient, record_id: str, candidate_id: str) -> None:
    """Every tool under a context outside the host's scopes: -32603, and nothing is listed."""
    assert await c.list_names() == []
    await assert_context_refused(c, "search", search_args("scope marker"), c.meta())
    await assert_context_refused(c, "get", get_args(record_id), c.meta())
    await assert_context_refused(c, "capture", capture_args("A capture in a scope I was not given."), c.meta())
    await assert_context_refused(c, "request_admission", {"candidate_id": candidate_id,
                                                          "idempotency_key": key("adm")}, c.meta())
    forget = forget_args(record_id)
    await assert_context_refused(c, "forget", forget, c.meta("forget", forget))
    withdraw = {"candidate_id": candidate_id, "idempotency_key": key("wd"), "reason_ref": "reason:x"}
    await assert_context_refused(c, "withdraw", withdraw, c.meta("withdraw", withdraw))


async def test_hosts_bind_only_their_scopes(kit: HostKit, tmp_path_factory: pytest.TempPathFactory,
                                            offline_env: dict[str, str]) -> None:
    data_dir = tmp_path_factory.mktemp("scope-iso")
    made: dict[str, tuple[str, str]] = {}
    with http_server(data_dir, kit, offline_env) as srv:
        for kid, (tenant, workspace) in OWN.items():
            async with signed_client(srv.url, kit, kid, host_context(tenant=tenant, workspace=workspace)) as c:
                record_id = await admit(c, f"Scope marker heron for {kid}.")
                pending = await c.call("capture", capture_args(f"A pending candidate of {kid}."))
                made[kid] = (record_id, pending["output"]["value"]["candidate_id"])
                assert search_ids(await c.call("search", search_args("scope marker heron"))) == [record_id]
        # host-a and host-b each try the other's scope; the wildcard host is refused nothing.
        for kid, target in (("host-a", "host-b"), ("host-b", "host-a"), ("host-b", "host-w"),
                            ("host-a", "host-w")):
            tenant, workspace = OWN[target]
            async with signed_client(srv.url, kit, kid, host_context(tenant=tenant, workspace=workspace)) as c:
                await cross_attempts(c, *made[target])
        # Same tenant, a workspace host-b was not given.
        async with signed_client(srv.url, kit, "host-b", host_context(tenant="globex", workspace="ops")) as c:
            await cross_attempts(c, *made["host-b"])
        for kid, (tenant, workspace) in OWN.items():
            async with signed_client(srv.url, kit, kid, host_context(tenant=tenant, workspace=workspace)) as c:
                await still_there(c, made[kid][0])
        for target in ("host-a", "host-b"):
            tenant, workspace = OWN[target]
            async with signed_client(srv.url, kit, "host-w", host_context(tenant=tenant, workspace=workspace)) as w:
                await still_there(w, made[target][0])
        assert "scope outside host host-a's scopes" in srv.stderr()  # the reason is in the log only
    # Three captures and one admission per host, nothing else: the refused calls wrote nothing.
    assert journal(data_dir) == {f"tenant:{t}/workspace:{w}": 3 for t, w in OWN.values()}


async def test_sighup_narrowing_a_hosts_scopes_applies_to_the_next_call(
        server: HttpServer, kit: HostKit) -> None:
    ops = host_context(tenant="acme", workspace="ops")
    async with signed_client(server.url, kit, "host-a", ops) as c:
        assert (await c.call("search", search_args("before narrowing")))["ok"]
        record_id = await admit(c, "A record host-a may forget only while it holds acme/ops.")
        forget = forget_args(record_id)
        # Signed while the scope was granted; presented after it was withdrawn.
        confirmation = c.signer.confirmation("forget", c.host, forget)
        rewrite_scopes(kit, {"host-a": ["acme/eng"]})
        reloads = server.stderr().count("host keys reloaded")
        server.reload_keys()
        await wait_for(lambda: server.stderr().count("host keys reloaded") > reloads)
        await assert_context_refused(c, "search", search_args("after narrowing"), c.meta())
        await assert_context_refused(c, "forget", forget, c.meta() | {CONFIRMATION_META_KEY: confirmation})
        assert await c.list_names() == []
    async with signed_client(server.url, kit, "host-a", host_context(tenant="acme", workspace="eng")) as c:
        assert (await c.call("search", search_args("still granted")))["ok"]
    async with signed_client(server.url, kit, "host-w", ops) as w:
        await still_there(w, record_id)  # the refused forget changed nothing
    rewrite_scopes(kit, SCOPES)
    server.reload_keys()


def rewrite_scopes(kit: HostKit, scopes: dict[str, list[str]]) -> None:
    data: dict[str, Any] = tomllib.loads(kit.host_keys.read_text())
    text = f'server_id = "{data["server_id"]}"\n'
    for entry in data["host"]:
        text += host_entry(entry["kid"], entry["public_key_pem"], entry["bearer_sha256"],
                           scopes.get(entry["kid"], entry["scopes"]))
    tmp = kit.host_keys.with_name("host-keys.toml.new")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.replace(kit.host_keys)


async def wait_for(condition: Any, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await anyio.sleep(0.05)
