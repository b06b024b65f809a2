#!/usr/bin/env python3
"""A minimal host for engram-memory's HTTP mode: sign a context per call, walk the lifecycle.

Set up (keys, then a server) and run::

    engram-memory host keygen --out ~/.config/engram-memory/keys --kid host-a --scope example/demo
    engram-memory serve --http 127.0.0.1:8765 --data-dir data --host-keys ~/.config/engram-memory/keys/host-keys.toml &
    python examples/host.py --url http://127.0.0.1:8765/mcp --kid host-a --host-keys-dir ~/.config/engram-memory/keys

What a host does, and this script shows:

* it authenticates every HTTP request with its bearer token (``keys/host-a.token``);
* it binds every ``tools/list`` and ``tools/call`` to one tenant, workspace, principal, agent,
  session and purpose with a fresh EdDSA JWT signed by its private key
  (``_meta["io.sentropic.engram/context"]``; each token is accepted once);
* for withdraw and forget it also signs a confirmation bound to the exact operation
  (``_meta["io.sentropic.engram/confirmation"]``) -- after asking its human, which this
  script cannot do, so it says where that would happen and proceeds.

Only the installed package (and its dependencies: the MCP SDK, httpx2) is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, cast

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from engram_memory.models.context import ALL_TOOLS, HostContext
from engram_memory.models.hostauth import CONFIRMATION_META_KEY, CONTEXT_META_KEY, HostSigner, load_private_key

TOOL_PREFIX = "engram_memory_"
PURPOSE = "purpose:example-host"


def sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


class ExampleHost:
    """One host session: every call gets a freshly signed context (and, when needed, confirmation)."""

    def __init__(self, client: Client, signer: HostSigner, host: HostContext) -> None:
        self.client = client
        self.signer = signer
        self.host = host

    def meta(self, tool: str | None = None, arguments: dict[str, Any] | None = None) -> types.RequestParamsMeta:
        meta: dict[str, Any] = {CONTEXT_META_KEY: self.signer.context(self.host, ALL_TOOLS)}
        if tool is not None and arguments is not None:
            # A real host shows its human exactly what will happen here and signs only on a yes.
            meta[CONFIRMATION_META_KEY] = self.signer.confirmation(tool, self.host, arguments)
        return cast(types.RequestParamsMeta, meta)  # _meta is open: our keys ride beside progress_token

    async def list_tools(self) -> list[str]:
        result = await self.client.list_tools(meta=self.meta(), cache_mode="bypass")
        return [tool.name for tool in result.tools]

    async def call(self, tool: str, arguments: dict[str, Any], *, confirm: bool = False) -> dict[str, Any]:
        meta = self.meta(tool, arguments) if confirm else self.meta()
        result = await self.client.call_tool(TOOL_PREFIX + tool, arguments, meta=meta)
        if not isinstance(result, types.CallToolResult) or not isinstance(result.structured_content, dict):
            raise RuntimeError(f"{tool}: unexpected result {result!r}")
        return result.structured_content


def capture_arguments(text: str, run: str) -> dict[str, Any]:
    """A valid capture: one cited decision, valid from a minute ago, with its source's digest."""
    now_ms = int(time.time() * 1000) - 60_000
    return {
        "idempotency_key": f"example-capture-{run}-{hashlib.sha256(text.encode()).hexdigest()[:16]}",
        "payload": {
            "schema_version": 2,
            "purpose_ref": PURPOSE,
            "valid_time": {"t": now_ms},
            "components": [{"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["s1"]}],
            "primary_component_id": "c1",
            "primary_event": {"at": now_ms, "type_ref": "event:decided", "citation_id": "s1"},
            "citations": [{
                "citation_id": "s1",
                "source_ref": "doc:adr-12",
                "locator": {"scheme": "path", "value": "docs/adr-12.md#L1"},
                "content_digest": sha256(text),
            }],
        },
        "evidence": {"evidence_ref": "ev:adr-12", "evidence_digest": sha256("evidence:" + text),
                     "citation_ids": ["s1"]},
    }


def step(number: int, title: str, detail: str) -> None:
    print(f"[{number}] {title}: {detail}", flush=True)


def expect_ok(tool: str, envelope: dict[str, Any]) -> dict[str, Any]:
    if not envelope.get("ok"):
        raise RuntimeError(f"{tool} failed: {json.dumps(envelope.get('error'))}")
    value: dict[str, Any] = envelope["output"]["value"]
    return value


async def lifecycle(host: ExampleHost) -> None:
    run = time.strftime("%Y%m%dT%H%M%S") + f"-{time.monotonic_ns() % 1_000_000:06d}"
    text = f"We chose PostgreSQL for the billing service (example host run {run})."

    names = await host.list_tools()
    step(1, "list tools", ", ".join(names))

    captured = expect_ok("capture", await host.call("capture", capture_arguments(text, run)))
    candidate_id = captured["candidate_id"]
    step(2, "capture", f"{captured['status']} candidate {candidate_id}")

    admission = expect_ok("request_admission", await host.call(
        "request_admission", {"candidate_id": candidate_id, "idempotency_key": f"example-admit-{run}"}))
    outcome = admission["outcome"]
    if outcome["status"] != "accepted":
        raise RuntimeError(f"admission was {outcome['status']}, not accepted")
    record_id = outcome["record_id"]
    step(3, "request_admission", f"{outcome['status']} record {record_id}")

    found = expect_ok("search", await host.call("search", {"query": "PostgreSQL billing service",
                                                           "purpose_ref": PURPOSE, "limit": 5}))
    ids = [packet["record"]["record_id"] for packet in found["records"]]
    if record_id not in ids:
        raise RuntimeError(f"search did not find {record_id}: {ids}")
    step(4, "search", f"{len(ids)} record(s), ours at rank {ids.index(record_id) + 1}")

    got = expect_ok("get", await host.call("get", {"record_id": record_id, "purpose_ref": PURPOSE}))
    step(5, "get", f"{got['record']['record_id']}: {got['record']['components'][0]['text']!r}")

    other = expect_ok("capture", await host.call(
        "capture", capture_arguments(f"A draft note that will be withdrawn (run {run}).", run)))
    print("    (a real host asks its human to confirm the withdraw here, then signs the confirmation)")
    withdraw_args = {"candidate_id": other["candidate_id"], "idempotency_key": f"example-withdraw-{run}",
                     "reason_ref": "reason:example-draft"}
    withdrawn = expect_ok("withdraw", await host.call("withdraw", withdraw_args, confirm=True))
    step(6, "capture + withdraw", f"candidate {other['candidate_id']} {withdrawn['receipt']['from_state']} -> "
         f"{withdrawn['receipt']['to_state']}, key_destruction {withdrawn['key_destruction']}")

    print("    (a real host asks its human to confirm the forget here, then signs the confirmation)")
    forget_args = {"record_id": record_id, "idempotency_key": f"example-forget-{run}",
                   "reason_ref": "reason:example-cleanup"}
    forgot = expect_ok("forget", await host.call("forget", forget_args, confirm=True))
    step(7, "forget", f"{record_id} {forgot['receipt']['from_state']} -> {forgot['receipt']['to_state']}, "
         f"projection_invalidation {forgot['projection_invalidation']}")

    after = await host.call("get", {"record_id": record_id, "purpose_ref": PURPOSE})
    code = "ok" if after.get("ok") else after["error"]["code"]
    if code != "NOT_FOUND":
        raise RuntimeError(f"get after forget answered {code}, expected NOT_FOUND")
    step(8, "get after forget", code)
    print("lifecycle complete", flush=True)


async def main_async(args: argparse.Namespace) -> None:
    keys_dir: Path = args.host_keys_dir
    with (keys_dir / "host-keys.toml").open("rb") as fh:
        server_id = tomllib.load(fh)["server_id"]  # the audience our tokens are signed for
    key = load_private_key((keys_dir / f"{args.kid}.private.pem").read_bytes())
    token = (keys_dir / f"{args.kid}.token").read_text().strip()
    signer = HostSigner(args.kid, key, server_id)
    host = HostContext(tenant=args.tenant, workspace=args.workspace, principal=args.principal,
                       agent_id=args.agent_id, purpose_ref=PURPOSE, session=f"example-{time.time_ns()}")
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=120))
    async with http, Client(streamable_http_client(args.url, http_client=http)) as client:
        await lifecycle(ExampleHost(client, signer, host))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", required=True, help="the server's MCP endpoint, e.g. http://127.0.0.1:8765/mcp")
    parser.add_argument("--host-keys-dir", type=Path, required=True,
                        help="directory written by `engram-memory host keygen --out DIR`")
    parser.add_argument("--kid", required=True, help="this host's key name (DIR/KID.private.pem, DIR/KID.token)")
    parser.add_argument("--tenant", default="example")
    parser.add_argument("--workspace", default="demo")
    parser.add_argument("--principal", default="example-user")
    parser.add_argument("--agent-id", default="example-agent")
    args = parser.parse_args(argv)
    try:
        asyncio.run(main_async(args))
    except Exception as exc:  # noqa: BLE001 -- one line for whoever runs the example
        hint = ""
        if "Trusted invocation context unavailable" in leaf(exc):
            hint = (f" (is {args.tenant}/{args.workspace} among the scopes of host {args.kid} in the server's"
                    " host-keys.toml, and is this key's file the one the server loaded?)")
        print(f"example host: error: {leaf(exc)}{hint}", file=sys.stderr)
        return 1
    return 0


def leaf(exc: BaseException) -> str:
    """The innermost errors of (nested) exception groups, as one line."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(leaf(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
