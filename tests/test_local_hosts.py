"""Several local stdio hosts on one data dir: the first owns it, the others relay to it.

Real `engram-memory serve` processes over the SDK's stdio client; the owner is SIGKILLed
mid-load and the relays must take over without losing or doubling a write.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import PURPOSE, Human, capture_args, get_args, key, search_args

pytestmark = pytest.mark.anyio

A = {"tenant": "tenant-a", "workspace": "ws-1", "principal": "alice", "agent_id": "agent-a", "purpose_ref": PURPOSE}
B = {**A, "principal": "bob", "agent_id": "agent-b"}  # same scope as A, another principal
C = {"tenant": "tenant-c", "workspace": "ws-9", "principal": "carol", "agent_id": "agent-c", "purpose_ref": PURPOSE}


def pids_serving(data_dir: Path, principal: str) -> list[int]:
    """The server processes launched for ``principal`` on ``data_dir`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and os.fsencode(data_dir) in argv and principal.encode() in argv:
            found.append(int(entry.name))
    return found


async def admit(mcp: Any, text: str, label: str) -> tuple[str, str]:
    cap = await mcp.call("capture", capture_args(text, key=key(label + "-cap")))
    assert cap["ok"], cap
    candidate_id = cap["output"]["value"]["candidate_id"]
    adm = await mcp.call("request_admission", {"candidate_id": candidate_id, "idempotency_key": key(label + "-adm")})
    assert adm["ok"], adm
    return candidate_id, adm["output"]["value"]["outcome"]["record_id"]


def found_ids(envelope: dict[str, Any]) -> list[str]:
    assert envelope["ok"], envelope
    return [p["record"]["record_id"] for p in envelope["output"]["value"]["records"]]


async def test_three_hosts_share_one_memory_each_in_its_scope(start_server: Any, data_dir_factory: Any) -> None:
    data_dir = data_dir_factory("shared") / "data"
    human_a, human_b, human_c = Human(), Human(), Human()
    async with start_server(data_dir, context=A, human=human_a, extra=["--no-semantic"]) as a:
        async with start_server(data_dir, context=B, human=human_b, extra=["--no-semantic"]) as b, \
                start_server(data_dir, context=C, human=human_c, extra=["--no-semantic"]) as c:
            assert "relaying" in b.stderr() and "relaying" in c.stderr()
            sock = data_dir / "engram.sock"
            assert stat.S_IMODE(sock.stat().st_mode) == 0o600
            for name in ("local-host.private.pem", "local-host.token"):
                assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600
            names = [t.name for t in (await b.session.list_tools()).tools]
            assert len(names) == 6

            _, r1 = await admit(a, "The owner admits a record about shared local memory.", "a1")
            assert r1 in found_ids(await b.call("search", search_args("shared local memory")))
            assert (await b.call("get", get_args(r1)))["ok"]
            assert r1 not in found_ids(await c.call("search", search_args("shared local memory")))
            assert (await c.call("get", get_args(r1)))["error"]["code"] == "NOT_FOUND"

            _, r2 = await admit(c, "Carol's relayed record lives in tenant c only.", "c1")
            assert r2 not in found_ids(await a.call("search", search_args("relayed record tenant")))
            assert (await a.call("get", get_args(r2)))["error"]["code"] == "NOT_FOUND"

            # A relayed forget is confirmed by the relaying host's human, nobody else's.
            human_b.answers.append("decline")
            args = {"record_id": r1, "idempotency_key": key("b-forget"), "reason_ref": "reason:test"}
            refused = await b.call("forget", args)
            assert refused["error"]["code"] == "gate_failed"
            assert len(human_b.prompts) == 1
            assert (await a.call("get", get_args(r1)))["ok"]  # nothing changed
            forgot = await c.call("forget", {**args, "record_id": r2, "idempotency_key": key("c-forget")})
            assert forgot["ok"], forgot
            assert len(human_c.prompts) == 1 and "forget" in human_c.prompts[0].message
            assert not human_a.prompts
            assert (await c.call("get", get_args(r2)))["error"]["code"] == "NOT_FOUND"

            # A bad purpose is refused by the relay as by the owner.
            err = await b.call_error("search", {**search_args("x"), "purpose_ref": "purpose:other"})
            assert err.error.code == -32603


async def test_owner_killed_mid_load_loses_nothing(start_server: Any, data_dir_factory: Any) -> None:
    data_dir = data_dir_factory("takeover") / "data"
    per_host = 12
    async with start_server(data_dir, context=A, extra=["--no-semantic"]):
        owner_pids = pids_serving(data_dir, "alice")
        assert len(owner_pids) == 1
        async with start_server(data_dir, context=B, extra=["--no-semantic"]) as b, \
                start_server(data_dir, context=C, extra=["--no-semantic"]) as c:
            done: dict[str, list[tuple[str, str, dict[str, Any]]]] = {"b": [], "c": []}

            async def load(name: str, mcp: Any) -> None:
                for i in range(per_host):
                    label = f"{name}-load-{i}"
                    args = capture_args(f"Takeover load record {label} keeps every write.", key=key(label))
                    cap = await mcp.call("capture", args)
                    assert cap["ok"], cap  # every call converges on a definitive answer
                    done[name].append((label, cap["output"]["value"]["candidate_id"], args))

            async def kill_owner() -> None:
                while len(done["b"]) + len(done["c"]) < 4:
                    await anyio.sleep(0.05)
                os.kill(owner_pids[0], signal.SIGKILL)

            async with anyio.create_task_group() as tg:
                tg.start_soon(load, "b", b)
                tg.start_soon(load, "c", c)
                tg.start_soon(kill_owner)

            logs = b.stderr() + c.stderr()
            assert "went away" in logs and "this launch owns" in logs  # one relay took the directory over
            for name, mcp in (("b", b), ("c", c)):
                assert len(done[name]) == per_host
                for label, candidate_id, args in done[name]:
                    replay = await mcp.call("capture", args)  # same key, same arguments
                    assert replay["ok"] and replay["output"]["value"]["candidate_id"] == candidate_id
                    assert replay["output"]["value"]["status"] == "duplicate_exact", label
                # Exactly once: admitting each candidate yields one record per capture.
                records = set()
                for label, candidate_id, _ in done[name]:
                    adm = await mcp.call("request_admission",
                                         {"candidate_id": candidate_id, "idempotency_key": key(label + "-adm")})
                    records.add(adm["output"]["value"]["outcome"]["record_id"])
                assert len(records) == per_host
                hits = found_ids(await mcp.call("search", search_args("Takeover load record", limit=50)))
                assert set(hits) == records


async def test_an_owner_that_does_not_answer_still_gets_a_handshake_and_clear_errors(
    start_server: Any, data_dir_factory: Any
) -> None:
    """The lock is held by something that serves no socket (here: this test): the launch still
    completes the handshake, says why in its instructions, answers STORE_UNAVAILABLE (retriable),
    and takes the directory over once it is free."""
    import fcntl

    data_dir = data_dir_factory("stuck") / "data"
    data_dir.mkdir(mode=0o700)
    fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        async with start_server(data_dir, context=A, extra=["--no-semantic"]) as a:
            assert "unavailable" in (a.init.instructions or "")
            answer = await a.call("search", search_args("anything"))
            assert answer["error"]["code"] == "STORE_UNAVAILABLE" and answer["error"]["retriable"] is True
            fcntl.flock(fd, fcntl.LOCK_UN)
            with anyio.fail_after(30):
                while not (await a.call("search", search_args("anything")))["ok"]:
                    await anyio.sleep(0.3)
            assert "this launch owns" in a.stderr()
    finally:
        os.close(fd)
