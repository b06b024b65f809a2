"""Take the README's console screenshots (docs/console/*.png) of a demo store.

    python docs/console/screenshots.py

Writes a demo store (two tenants, a week of admissions, forgets and an operator's rejection,
candidates held for adjudication, audit rows as the dispatcher writes them) into a temporary
directory, starts a real `engram-memory console` on it (with the embedding model, so the search
page shows a hybrid ranking), and drives Debian's Chromium through Playwright.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from engram_memory.models.settings import EngineSettings  # noqa: E402
from engram_memory.store.core.engine import AuditEvent, Engine  # noqa: E402
from engram_memory.store.host.adjudicate import adjudicate_with  # noqa: E402
from tests.store_fixtures import call, capture_args, ctx  # noqa: E402

OUT = Path(__file__).resolve().parent
DAY = 86_400_000
NOW = int(time.time() * 1000)
TEXTS = [
    "We adopted DuckDB for the lifecycle store: one file, one writer, transactions",
    "Tantivy ranks the lexical channel with BM25 over the primary text and citations",
    "The billing service moved from Python to Rust in March for its p99 latency",
    "Nightly backups run at 02:00 UTC and are restored weekly on a staging host",
    "The embedding model is all-MiniLM-L6-v2, run on ONNX Runtime with one thread",
    "Release candidates are tagged on Thursdays and shipped the following Monday",
    "The search API pages with an HMAC-sealed cursor that pins the ranking",
    "On-call hands over at 09:00 local time with a written summary in the channel",
    "PostgreSQL is the shared store for multi-node deployments since issue 22",
    "Secrets never enter memory: admission screens every capture for credentials",
    "The staging cluster runs three nodes behind one load balancer",
    "Forgetting destroys the record's data key, so every copy becomes unreadable",
    "Customer exports are written as JSON lines, one record per line",
]


class Demo:
    def __init__(self, data_dir: Path) -> None:
        self.at = NOW - 7 * DAY
        self.engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False), clock=lambda: self.at)
        self.n = 0

    def audited(self, tool: str, c: Any, args: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        value = call(self.engine, tool, c, args)
        self.engine.record_audit(c, AuditEvent(f"demo-{self.n:05d}", tool, True, None, args.get("idempotency_key")))
        return value

    def admit(self, text: str, c: Any | None = None) -> str:
        c = c or ctx()
        cap = self.audited("capture", c, capture_args(text, key=f"demo-capture-{self.n:06d}"))
        adm = self.audited("request_admission", c, {"candidate_id": cap["candidate_id"],
                                                    "idempotency_key": f"demo-admit-{self.n:08d}"})
        return str(adm["outcome"].get("record_id", cap["candidate_id"]))

    def forget_and_recapture(self, rid: str, text: str) -> str:
        c = ctx()
        self.audited("forget", c, {"record_id": rid, "idempotency_key": f"demo-forget-{self.n:07d}",
                                   "reason_ref": "reason:user-request"})
        cap = self.audited("capture", c, capture_args(text, key=f"demo-again-{self.n:08d}"))
        self.audited("request_admission", c, {"candidate_id": cap["candidate_id"],
                                              "idempotency_key": f"demo-again-adm-{self.n:05d}"})
        return str(cap["candidate_id"])


def build(data_dir: Path) -> dict[str, Any]:
    demo = Demo(data_dir)
    try:
        ids = [demo.admit(t) for t in TEXTS[:6]]
        demo.at += DAY
        ids += [demo.admit(t) for t in TEXTS[6:9]]
        demo.at += DAY
        held = demo.forget_and_recapture(ids[3], TEXTS[3])
        demo.at += 2 * DAY
        ids += [demo.admit(t) for t in TEXTS[9:11]]
        adjudicate_with(demo.engine, str(data_dir), held, False, "the backup schedule changed; not current",
                        demo.at)
        demo.at += DAY
        ids.append(demo.admit(TEXTS[11]))
        demo.audited("forget", ctx(), {"record_id": ids[5], "idempotency_key": "demo-forget-release-0001",
                                       "reason_ref": "reason:obsolete"})
        demo.at += DAY
        ids.append(demo.admit(TEXTS[12]))
        held = demo.forget_and_recapture(ids[2], TEXTS[2])
        demo.audited("capture", ctx(principal="bob"), capture_args("The design review moved to Wednesdays",
                                                                   key="demo-pending-00001"))
        for text in ("Globex ships payroll on Fridays", "Globex's VPN rotates certificates monthly"):
            demo.admit(text, ctx("globex", "ops"))
        demo.engine.audit.flush()
        return {"records": ids, "held": held}
    finally:
        demo.engine.close()


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        made = build(data_dir)
        from engram_memory.store.maintenance.backup import backup_offline, new_backup_key

        backup_offline(data_dir, Path(tmp) / "engram.tar", new_backup_key())  # the journal page names it
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "engram_memory.server.cli", "console", "--data-dir",
                                 str(data_dir), "--bind", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True,
                                cwd=str(REPO))
        try:
            assert proc.stdout is not None
            login = proc.stdout.readline().strip()
            base = f"http://127.0.0.1:{port}"
            scope = base + "/scope/acme/main"
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(login)
                page.screenshot(path=str(OUT / "scopes.png"), full_page=True)
                page.goto(scope + "/candidates")
                page.locator(f"#cand-{made['held']} button[name=reveal]").click()
                page.screenshot(path=str(OUT / "candidates.png"), full_page=True)
                rid = made["records"][0]
                page.goto(scope + f"/records/{rid}")
                page.screenshot(path=str(OUT / "record.png"), full_page=True)
                page.locator("#op-forget input[name=reason]").fill("the user asked us to forget it")
                page.locator("#op-forget button").click()
                page.screenshot(path=str(OUT / "confirm-forget.png"), full_page=True)
                page.goto(scope + "/journal")
                page.screenshot(path=str(OUT / "journal.png"))  # the first screenful: the status and the last events
                page.goto(scope + "/audit")
                page.screenshot(path=str(OUT / "audit.png"))
                deadline = time.monotonic() + 180
                while True:  # the model loads and embeds every record in the background
                    page.goto(scope + "/search?q=which+store+keeps+memory+records")
                    if "hybrid_v1" in page.inner_text("main") or time.monotonic() > deadline:
                        break
                    time.sleep(2)
                page.screenshot(path=str(OUT / "search.png"), full_page=True)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print("wrote", ", ".join(sorted(p.name for p in OUT.glob("*.png"))))


if __name__ == "__main__":
    main()
