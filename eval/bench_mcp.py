"""What a host sees: search latency through the real stdio server, driven by the MCP SDK client.

The bench closes its engine, starts ``python -m engram_memory.server.cli serve`` on the bench
store with the bench's own host context (tenant, workspace, principal, agent and purpose of
``eval/ingest.py``), the tools ``search,get`` and the in-process engine's fusion, waits until a
``lexical_and_semantic`` search succeeds (the model loads in the background), then times:

* hybrid searches at limit 10 with exactly the in-process arguments;
* the cheapest tool calls: ``get`` of an unknown well-formed ``mem_`` id (a NOT_FOUND envelope)
  and ``get`` of a malformed id (refused by validation); the cheaper p50 is "the cheapest call";
* an MCP ``ping`` (no tool: the protocol floor), for reference only;
* the server's memory: resident set once it is ready (idle, the model loaded), and its peak
  after the searches (``VmHWM``);
* ingest as a host does it (``ingest``): one ``capture`` and one ``request_admission`` per
  document, then one hybrid search -- the time until every document is searchable by both
  channels (a search projects what admissions left waiting: store/core/projector.py).

Each call is timed from ``call_tool`` to its parsed result, as a host's agent loop waits for it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engram_memory.eval.bench_parts import HYBRID_POLICY, pcts, search_args

TOOL_PREFIX = "engram_memory_"
READY_TIMEOUT_S = 600.0
START_ATTEMPTS = 4  # a server refused with "data dir in use" is started again after a pause
UNKNOWN_ID = "mem_" + base64.b32encode(hashlib.sha256(b"engram-bench-unknown").digest()).decode().rstrip("=").lower()


def serve_argv(store: Path, ctx: Any, fusion: str | None = None, tools: str = "search,get") -> list[str]:
    argv = [sys.executable, "-m", "engram_memory.server.cli", "serve", "--data-dir", str(store),
            "--tenant", ctx.tenant, "--workspace", ctx.workspace, "--principal", ctx.principal,
            "--agent-id", ctx.agent_id, "--purpose-ref", ctx.purpose_ref, "--tools", tools]
    if fusion:
        argv += ["--fusion", fusion]
    if "capture" in tools:  # the ingest times the engine, not the per-principal rate limit (50 calls/s)
        argv += ["--rate-limit", "0"]
    return argv


def server_env(threads: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    if threads is not None:  # the in-process run's torch threads (torch reads it at import)
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _envelope(result: Any) -> dict[str, Any]:
    env = getattr(result, "structured_content", None)
    if env is None:
        env = getattr(result, "structuredContent", None)
    if env is None:
        env = json.loads(result.content[0].text)
    return env


class McpBenchError(RuntimeError):
    pass


def mcp_bench(store: Path, ctx: Any, queries: Sequence[str], log_path: Path, *, limit: int,
              fusion: str | None = None, threads: int | None = None, calls: int | None = None,
              ready_timeout: float = READY_TIMEOUT_S, warmup: int = 5,
              ingest: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Start the server on ``store``, time searches and the cheapest calls (and ``ingest``: capture
    arguments of new documents), stop it. Blocking."""
    import anyio

    argv = serve_argv(store, ctx, fusion, "search,get,capture,request_admission" if ingest else "search,get")
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            res = anyio.run(_run, argv, server_env(threads), ctx, list(queries), log_path, limit,
                            calls or len(queries), ready_timeout, warmup, list(ingest))
            res["start_attempts"] = attempt
            return res
        except Exception as exc:  # noqa: BLE001 -- reported as one line by the caller
            said = log_tail(log_path)
            if "in use by another" in said and attempt < START_ATTEMPTS:
                time.sleep(2.0 * attempt)  # the bench's own engine may still be letting go of the store
                continue
            raise McpBenchError(leaf_message(exc) + (f"; the server said: {said}" if said else "")) from exc
    raise AssertionError("unreachable")


def leaf_message(exc: BaseException) -> str:
    """The innermost errors of (nested) exception groups, as one line."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(leaf_message(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def log_tail(path: Path) -> str:
    """The server's last stderr line that reads like an error (or its last line)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if "error" in ln.lower() and "Loading weights" not in ln]
    return (errors or lines or [""])[-1][:400]


def _server_pid() -> int | None:
    """The stdio server: this process's child running ``serve`` (the SDK does not expose it)."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if fields[1] == me and b"serve" in cmdline:
            return int(stat.parent.name)
    return None


def memory_mib(pid: int | None) -> dict[str, float]:
    """Resident set now and its peak (``VmRSS``, ``VmHWM`` of /proc/PID/status), in MiB."""
    out: dict[str, float] = {}
    if pid is None:
        return out
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out["rss_mib" if name == "VmRSS" else "peak_rss_mib"] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


async def _run(argv: list[str], env: dict[str, str], ctx: Any, queries: list[str], log_path: Path, limit: int,
               calls: int, ready_timeout: float, warmup: int, ingest: list[dict[str, Any]]) -> dict[str, Any]:
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.shared.exceptions import MCPError

    res: dict[str, Any] = {"argv": [Path(argv[0]).name, *argv[1:]], "server_log": log_path.name}
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    t_spawn = time.perf_counter()

    async def call(session: ClientSession, tool: str, args: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """One round trip; a protocol-level refusal (MCPError) is a round trip too."""
        t = time.perf_counter()
        try:
            result = await session.call_tool(TOOL_PREFIX + tool, args)
        except MCPError as exc:
            dt = time.perf_counter() - t
            return dt, {"ok": False, "error": {"code": f"MCPError {getattr(exc, 'code', '')}".strip(),
                                               "message": str(exc)}}
        dt = time.perf_counter() - t
        return dt, _envelope(result)

    with log_path.open("w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                res["initialize_s"] = time.perf_counter() - t_spawn

                # The model loads in the background: hybrid is refused (RANKING_UNAVAILABLE) until then.
                probe = search_args(queries[0], ctx.purpose_ref, limit, hybrid=True)
                deadline = time.monotonic() + ready_timeout
                refusals = 0
                while True:
                    _, env_ = await call(session, "search", probe)
                    if env_.get("ok"):
                        break
                    code = (env_.get("error") or {}).get("code")
                    # RANKING_UNAVAILABLE: the model is loading; STORE_UNAVAILABLE: the bench's own
                    # engine is still letting go of the store and the server is taking it over.
                    if code not in ("RANKING_UNAVAILABLE", "STORE_UNAVAILABLE"):
                        raise McpBenchError(f"server search failed: {code}: {(env_.get('error') or {}).get('message')}")
                    if time.monotonic() > deadline:
                        raise McpBenchError(f"embedding model not ready after {ready_timeout:.0f} s (see {log_path})")
                    refusals += 1
                    await anyio.sleep(0.25)
                res["ready_s"] = time.perf_counter() - t_spawn
                res["ready_refusals"] = refusals
                pid = _server_pid()
                res["server_idle"] = memory_mib(pid)  # the model loaded, one search answered

                # Hybrid searches, the in-process arguments.
                for q in queries[:warmup]:
                    await call(session, "search", search_args(q, ctx.purpose_ref, limit, hybrid=True))
                samples, failed = [], 0
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for q in queries:
                    dt, env_ = await call(session, "search", search_args(q, ctx.purpose_ref, limit, hybrid=True))
                    samples.append(dt)
                    failed += not env_.get("ok")
                if failed:
                    raise McpBenchError(f"{failed} of {len(queries)} MCP hybrid searches failed")
                res["hybrid"] = pcts(samples)
                # The client's own CPU (this process, every thread) per search: the SDK's parsing and
                # validation of the response, or anything else this process burns meanwhile.
                res["client_cpu_ms_per_search"] = (time.process_time() - cpu0) * 1e3 / len(queries)
                res["client_wall_ms_per_search"] = (time.perf_counter() - wall0) * 1e3 / len(queries)
                res["profile"] = (((env_.get("output") or {}).get("value") or {}).get("rank_receipt") or {}).get(
                    "profile")

                # Cheapest tool calls: NOT_FOUND, and a validation refusal.
                cheap: dict[str, list[float]] = {"get_not_found": [], "get_invalid": []}
                codes: dict[str, Any] = {}
                for name, args in (("get_not_found", {"record_id": UNKNOWN_ID, "purpose_ref": ctx.purpose_ref}),
                                   ("get_invalid", {"record_id": "not-an-id", "purpose_ref": ctx.purpose_ref})):
                    for i in range(warmup + calls):
                        dt, env_ = await call(session, "get", args)
                        if i >= warmup:
                            cheap[name].append(dt)
                        codes[name] = "ok" if env_.get("ok") else (env_.get("error") or {}).get("code")
                for name, samples_ in cheap.items():
                    if samples_:
                        res[name] = {**pcts(samples_), "code": codes.get(name)}
                ping = []
                for i in range(warmup + calls):
                    t = time.perf_counter()
                    await session.send_ping()
                    if i >= warmup:
                        ping.append(time.perf_counter() - t)
                res["ping"] = pcts(ping)
                res["server_after_searches"] = memory_mib(pid)
                if ingest:
                    try:
                        res["ingest"] = await _ingest(call, session, ctx, ingest, limit)
                    except McpBenchError as exc:  # the searches' figures stand without it
                        res["ingest"] = {"error": str(exc)}
                    res["server_after_ingest"] = memory_mib(pid)
    candidates = {name: res[name] for name in ("get_not_found", "get_invalid") if res.get(name)}
    if candidates:
        name = min(candidates, key=lambda k: candidates[k]["p50"])
        res["cheapest"] = {"call": name, **candidates[name]}
    res["policy"] = dict(HYBRID_POLICY)
    return res


async def _ingest(call: Any, session: Any, ctx: Any, captures: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """Each document captured and admitted through the tools, then one hybrid search: until it
    answers, not every document is searchable by both channels."""
    from engram_memory.eval.ingest import admission_args

    captured: list[float] = []
    admissions: list[float] = []
    record_ids: list[str] = []
    t0 = time.perf_counter()
    for args in captures:
        dt, cap = await call(session, "capture", args)
        captured.append(dt)
        if not cap.get("ok"):
            raise McpBenchError(f"capture failed: {(cap.get('error') or {}).get('code')}")
        candidate = cap["output"]["value"]["candidate_id"]
        dt, adm = await call(session, "request_admission", admission_args(candidate))
        if not adm.get("ok") or adm["output"]["value"]["outcome"]["status"] != "accepted":
            raise McpBenchError(f"admission failed: {adm.get('error') or adm['output']['value']['outcome']}")
        admissions.append(dt)
        record_ids.append(adm["output"]["value"]["outcome"]["record_id"])
    query = captures[-1]["payload"]["components"][0]["text"][:200]
    last, found = await call(session, "search", search_args(query, ctx.purpose_ref, limit, hybrid=True))
    seconds = time.perf_counter() - t0
    if not found.get("ok"):
        raise McpBenchError(f"search after ingest failed: {(found.get('error') or {}).get('code')}")
    return {"documents": len(captures), "seconds": seconds, "docs_per_s": len(captures) / seconds,
            "capture": pcts(captured), "admission": pcts(admissions), "final_search_ms": last * 1e3,
            "record_ids": record_ids}
