"""End to end over streamable HTTP with per-call signed host contexts (the real server and SDK)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import capture_args, get_args, key, search_args
from tests.http_fixtures import HostKit, HttpServer, host_context, http_server, signed_client

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> HostKit:
    kit = HostKit(tmp_path_factory.mktemp("hostkeys"))
    kit.add("host-a")
    kit.add("host-b")
    return kit


@pytest.fixture(scope="module")
def server(kit: HostKit, tmp_path_factory: pytest.TempPathFactory, offline_env: dict[str, str]) -> Iterator[HttpServer]:
    data_dir: Path = tmp_path_factory.mktemp("http-data")
    with http_server(data_dir, kit, offline_env) as srv:
        yield srv


async def test_whole_lifecycle_under_a_signed_context(server: HttpServer, kit: HostKit) -> None:
    host = host_context(tenant="life", principal="pat")
    async with signed_client(server.url, kit, "host-a", host) as c:
        assert await c.list_names() == [f"engram_memory_{t}" for t in
                                        ("search", "get", "capture", "request_admission", "withdraw", "forget")]
        cap = await c.call("capture", capture_args("Signed contexts bind every HTTP call to one scope."))
        candidate_id = cap["output"]["value"]["candidate_id"]
        adm = await c.call("request_admission", {"candidate_id": candidate_id, "idempotency_key": key("adm")})
        record_id = adm["output"]["value"]["outcome"]["record_id"]
        found = await c.call("search", search_args("signed contexts scope"))
        assert record_id in [p["record"]["record_id"] for p in found["output"]["value"]["records"]]
        assert (await c.call("get", get_args(record_id)))["ok"]

        other = await c.call("capture", capture_args("A candidate that will be withdrawn."))
        withdrawn = await c.call("withdraw", {"candidate_id": other["output"]["value"]["candidate_id"],
                                              "idempotency_key": key("wd"), "reason_ref": "reason:test"})
        assert withdrawn["ok"], withdrawn
        forgot = await c.call("forget", {"record_id": record_id, "idempotency_key": key("fg"),
                                         "reason_ref": "reason:test"})
        assert forgot["ok"], forgot
        assert (await c.call("get", get_args(record_id)))["error"]["code"] == "NOT_FOUND"
