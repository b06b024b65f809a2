"""A server started without the semantic channel says so where an agent decides: its instructions
and the search tool's description (so the agent asks for "lexical" instead of retrying a
RANKING_UNAVAILABLE that the catalog calls retriable), over stdio and over HTTP."""

from __future__ import annotations

import pytest

from tests.conftest import mcp_server, search_args, serve_argv
from tests.http_fixtures import HostKit, host_context, http_server, signed_client

pytestmark = pytest.mark.anyio

BOTH = {"minimum_channels": "lexical_and_semantic", "network": "forbid"}


async def search_description(tools: list) -> str:
    return next(t.description for t in tools if t.name == "engram_memory_search")


async def test_stdio_without_the_semantic_channel_says_so(data_dir_factory, offline_env) -> None:
    data_dir = data_dir_factory("lexical-only") / "data"
    async with mcp_server(serve_argv(data_dir, extra=["--no-semantic"]), offline_env) as mcp:
        assert "lexical (BM25) channel only" in (mcp.init.instructions or "")
        description = await search_description((await mcp.session.list_tools()).tools)
        assert "NO SEMANTIC CHANNEL" in description and 'always ask minimum_channels "lexical"' in description
        refused = await mcp.call("search", search_args("q", capability_policy=BOTH))
        assert refused["error"]["code"] == "RANKING_UNAVAILABLE"
        assert (await mcp.call("search", search_args("q")))["ok"]
    # A server with the channel (the default) does not carry the sentence.
    async with mcp_server(serve_argv(data_dir_factory("with-semantic") / "data"), offline_env) as mcp:
        assert "channel only" not in (mcp.init.instructions or "")
        assert "NO SEMANTIC CHANNEL" not in await search_description((await mcp.session.list_tools()).tools)


async def test_http_without_the_semantic_channel_says_so(tmp_path, offline_env) -> None:
    kit = HostKit(tmp_path / "keys")
    kit.add("host-a")
    data = tmp_path / "data"
    with http_server(data, kit, offline_env) as srv:  # the fixture serves --no-semantic
        async with signed_client(srv.url, kit, "host-a", host_context()) as c:
            listed = await c.client.list_tools(meta=c.meta(), cache_mode="bypass")
            assert "NO SEMANTIC CHANNEL" in await search_description(listed.tools)
