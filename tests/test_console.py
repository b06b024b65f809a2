"""The operator console (`engram-memory console`), driven in a real browser.

Playwright drives the machine's Chromium (Debian's package, found on PATH; nothing is
downloaded) against real `engram-memory console` processes on real DuckDB stores written by the
engine. A few fast checks run the app in-process with Starlette's TestClient (headers, cookie
flags, CSRF) and the command's refusals run as subprocesses.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engram_memory.models.settings import EngineSettings
from engram_memory.store.core.engine import Engine
from engram_memory.store.core.ledger import intent_hash
from tests.conftest import REPO
from tests.store_fixtures import T0, call, capture_args, ctx
from tests.test_admin_cli import MARKER, fill_engine

OTHER_MARKER = "globex-walrus-5521"  # only the second tenant's record holds it
NEW_TEXT = f"We moved the lifecycle store from DuckDB to PostgreSQL {MARKER}"
OTHER_TEXT = f"Globex ships its payroll on Fridays {OTHER_MARKER}"


# ---- stores and consoles ------------------------------------------------------------------------


def admit(engine: Engine, c: Any, text: str, key: str) -> str:
    cap = call(engine, "capture", c, capture_args(text, key=f"capture-{key}"))
    adm = call(engine, "request_admission", c, {"candidate_id": cap["candidate_id"], "idempotency_key": f"admit-{key}"})
    return str(adm["outcome"]["record_id"])


def build_store(data_dir: Path) -> dict[str, Any]:
    """acme/main: four records (two forgotten, then captured again: two candidates held for
    adjudication), a newer record, a plain pending candidate; globex/ops: one record of its own."""
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False), clock=lambda: T0)
    try:
        out = fill_engine(engine, held=2)
        out["new"] = admit(engine, ctx(), NEW_TEXT, "newer-record-0001")
        out["other"] = admit(engine, ctx("globex", "ops"), OTHER_TEXT, "globex-record-001")
        return out
    finally:
        engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def console_argv(data_dir: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "engram_memory.server.cli", "console", "--data-dir", str(data_dir),
            "--no-semantic", "--bind", f"127.0.0.1:{port}", *extra]


class Console:
    """A running `engram-memory console` and the login link it printed."""

    def __init__(self, data_dir: Path, env: dict[str, str], *extra: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(console_argv(data_dir, self.port, *extra), env=env, cwd=str(REPO),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the one line: printed once the store is open
        assert line.startswith(f"{self.base}/login?token="), (line, self.proc.stderr and self.proc.stderr.read())
        self.login_url = line.strip()
        deadline = time.monotonic() + 30
        while True:  # uvicorn accepts right after the line; wait for it to answer
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        return err


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    data_dir = tmp_path_factory.mktemp("console") / "data"
    return data_dir, build_store(data_dir)


@pytest.fixture(scope="module")
def console(store: tuple[Path, dict[str, Any]], offline_env: dict[str, str]) -> Iterator[Console]:
    running = Console(store[0], offline_env)
    try:
        yield running
    finally:
        err = running.stop()
        assert "Traceback" not in err, err


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright import sync_api  # the test extra; a missing browser fails here, never skips

    chromium = shutil.which("chromium")
    assert chromium is not None, "no chromium on PATH (apt-get install -y chromium; .ci/run does)"
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def page(browser: Any, console: Console) -> Iterator[Any]:
    """A browser tab logged in to the module's console (its login link works once: here)."""
    context = browser.new_context()
    tab = context.new_page()
    tab.goto(console.login_url)
    assert tab.url == console.base + "/"
    try:
        yield tab
    finally:
        context.close()


def scope_url(console: Console, path: str = "", scope: str = "acme/main") -> str:
    return f"{console.base}/scope/{scope}{path}"


def main_text(page: Any) -> str:
    return str(page.inner_text("main"))


def result_rows(page: Any) -> dict[str, str]:
    """The operation's result table (``#result``): dotted key -> value."""
    table = page.locator("#result")
    return dict(zip(table.locator("th").all_inner_texts(), table.locator("td").all_inner_texts(), strict=True))


def shows(page: Any, name: str, value: str) -> bool:
    """Does the result table hold a field ``name`` (at any depth) with ``value``?"""
    return any(key.rsplit(".", 1)[-1] == name and v == value for key, v in result_rows(page).items())


# ---- sessions ---------------------------------------------------------------------------------


def test_every_page_needs_the_one_time_login(browser: Any, console: Console, page: Any) -> None:
    stranger = browser.new_context()
    try:
        tab = stranger.new_page()
        for path in ("/", "/scope/acme/main", "/scope/acme/main/records", "/scope/acme/main/search?q=DuckDB"):
            response = tab.goto(console.base + path)
            assert response.status == 401, path
            assert "Log in first" in tab.inner_text("main") and MARKER not in tab.content()
        # the link was used by the module's tab: it opens nothing a second time
        response = tab.goto(console.login_url)
        assert response.status == 401 and not stranger.cookies()
    finally:
        stranger.close()
    # the logged-in tab: its session cookie is HttpOnly and SameSite=Strict; the pages show the store
    (cookie,) = page.context.cookies()
    assert cookie["name"] == "engram_console" and cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    response = page.goto(console.base + "/")
    assert response.status == 200
    csp = response.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    text = main_text(page)
    assert "acme/main" in text and "globex/ops" in text and "accepted_current" in text
    assert page.locator("figure.plot svg rect").count() > 0  # the activity plot


# ---- adjudication -----------------------------------------------------------------------------


def test_a_held_candidate_is_revealed_on_request_and_accepted(page: Any, console: Console,
                                                              store: tuple[Path, dict[str, Any]]) -> None:
    held = store[1]["held"][0]
    page.goto(scope_url(console, "/candidates"))
    section = page.locator(f"#cand-{held}")
    assert "held for adjudication" in section.inner_text()
    assert MARKER not in page.content()  # no content before the reveal
    section.get_by_role("button", name="Reveal content (audited)").click()
    assert "Backups run nightly at two" in page.inner_text("section.revealed")
    page.goto(scope_url(console, "/audit"))
    assert re.search(r"operator\s+console\s+console-[0-9a-f]{12}\s+console_reveal\s+ok", main_text(page))

    page.goto(scope_url(console, "/search?q=nightly+backups"))
    assert "Backups run nightly" not in main_text(page)  # forgotten, held: not searchable yet
    page.goto(scope_url(console, "/candidates"))
    section = page.locator(f"#cand-{held}")
    section.locator("input[name=reason]").fill("the team confirmed backups still run nightly")
    section.get_by_role("button", name="Accept").click()
    assert shows(page, "status", "accepted") and shows(page, "decision", "accept")
    page.goto(scope_url(console, "/candidates"))
    assert page.locator(f"#cand-{held}").count() == 0
    page.goto(scope_url(console, "/search?q=nightly+backups"))
    assert "Backups run nightly at two" in page.inner_text("#ranked")


def test_a_reason_that_carries_a_secret_is_refused(page: Any, console: Console,
                                                  store: tuple[Path, dict[str, Any]]) -> None:
    held = store[1]["held"][1]
    page.goto(scope_url(console, "/candidates"))
    section = page.locator(f"#cand-{held}")
    section.locator("input[name=reason]").fill("password=hunter2hunter2 was in it")
    section.get_by_role("button", name="Reject").click()
    assert "looks like it carries a secret" in main_text(page)
    assert page.locator(f"#cand-{held}").count() == 1  # still pending


# ---- forget, confirmed --------------------------------------------------------------------------


def test_forget_shows_the_request_digest_and_runs_only_once_confirmed(
        page: Any, console: Console, store: tuple[Path, dict[str, Any]]) -> None:
    rid = store[1]["records"][1]  # "Tantivy ranks the lexical channel"
    page.goto(scope_url(console, "/search?q=Tantivy+lexical"))
    assert rid[:16] in page.inner_text("#ranked")
    page.goto(scope_url(console, f"/records/{rid}"))
    assert page.inner_text("#state") == "accepted_current" and "doc:adr-7" in main_text(page)
    form = page.locator("#op-forget")
    form.locator("input[name=reason]").fill("the user asked to forget it")
    form.get_by_role("button").click()
    # the confirmation page: the exact forget request and its digest (the store's intent hash)
    rows = dict(zip(page.locator("main table th").all_inner_texts(), page.locator("main table td").all_inner_texts(),
                    strict=True))
    assert rows["record_id"] == rid and rows["reason_ref"] == "the user asked to forget it"
    digest = page.inner_text("#digest")
    assert digest == intent_hash("forget", {"record_id": rid, "idempotency_key": rows["idempotency_key"],
                                            "reason_ref": rows["reason_ref"]})
    other_tab = page.context.new_page()
    other_tab.goto(scope_url(console, f"/records/{rid}"))
    assert other_tab.inner_text("#state") == "accepted_current"  # nothing happened before the confirmation
    confirmation = {name: page.locator(f"form.op input[name={name}]").get_attribute("value")
                    for name in ("csrf", "nonce", "digest")}
    page.get_by_role("button", name="Confirm forget").click()
    assert shows(page, "to_state", "tombstoned") and shows(page, "from_state", "accepted_current")
    assert shows(page, "projection_invalidation", "complete")
    other_tab.goto(scope_url(console, f"/records/{rid}"))
    assert other_tab.inner_text("#state") == "tombstoned" and "content is gone" in main_text(other_tab)
    other_tab.goto(scope_url(console, "/search?q=Tantivy+lexical"))
    assert other_tab.locator("#no-results").count() == 1
    other_tab.close()
    # the same confirmation cannot run twice
    again = page.request.post(scope_url(console, "/execute"), form=confirmation)
    assert again.status == 409 and "unknown, used or expired" in again.text()


def test_a_forged_or_missing_csrf_token_is_refused_and_changes_nothing(
        page: Any, console: Console, store: tuple[Path, dict[str, Any]]) -> None:
    rid = store[1]["records"][0]
    page.goto(scope_url(console, f"/records/{rid}"))
    real = page.locator("#op-forget input[name=csrf]").get_attribute("value")
    fields = {"operation": "forget", "record_id": rid, "reason": "forged"}
    for form in ({**fields, "csrf": "forged-" + real}, fields):
        response = page.request.post(scope_url(console, "/confirm"), form=form)
        assert response.status == 403 and "CSRF" in response.text()
        response = page.request.post(scope_url(console, "/execute"), form={**form, "nonce": "x", "digest": "y"})
        assert response.status == 403
    held = store[1]["held"][1]
    response = page.request.post(scope_url(console, f"/candidates/{held}/adjudicate"),
                                 form={"csrf": "forged", "decision": "accept", "reason": "forged"})
    assert response.status == 403
    page.goto(scope_url(console, f"/records/{rid}"))
    assert page.inner_text("#state") == "accepted_current"
    page.goto(scope_url(console, "/candidates"))
    assert page.locator(f"#cand-{held}").count() == 1
    page.goto(scope_url(console, "/journal"))
    assert "forged" not in main_text(page) and page.inner_text("#chain") == "verifies"


def test_a_post_from_another_origin_is_refused_and_changes_nothing(
        page: Any, console: Console, store: tuple[Path, dict[str, Any]]) -> None:
    """Issue 33 §3: besides the CSRF token and SameSite=Strict, a POST whose Origin is not the
    console's own is refused before anything runs (no Origin, as some clients send, still passes)."""
    rid = store[1]["records"][0]
    page.goto(scope_url(console, f"/records/{rid}"))
    csrf = page.locator("#op-forget input[name=csrf]").get_attribute("value")
    form = {"operation": "forget", "record_id": rid, "reason": "cross-site", "csrf": csrf}
    for origin in ("http://evil.example", "null", f"https://127.0.0.1:{console.port + 1}",
                   f"http://localhost:{console.port}", console.base + "/"):
        response = page.request.post(scope_url(console, "/confirm"), form=form, headers={"Origin": origin})
        assert response.status == 403, origin
        assert "another site; nothing was done" in response.text() and "Confirm: forget" not in response.text()
    # The console's own origin (what the browser's forms send) and no Origin at all pass.
    for headers in ({"Origin": console.base}, {}):
        confirmed = page.request.post(scope_url(console, "/confirm"), form=form, headers=headers)
        assert confirmed.status == 200 and "Confirm: forget" in confirmed.text()
    nonce = re.search(r'name="nonce" value="([^"]+)"', confirmed.text())
    digest = re.search(r'name="digest" value="([^"]+)"', confirmed.text())
    assert nonce is not None and digest is not None
    run = {"csrf": csrf, "nonce": nonce.group(1), "digest": digest.group(1)}
    refused = page.request.post(scope_url(console, "/execute"), form=run, headers={"Origin": "http://evil.example"})
    assert refused.status == 403
    page.goto(scope_url(console, f"/records/{rid}"))
    assert page.inner_text("#state") == "accepted_current"
    page.goto(scope_url(console, "/journal"))
    assert "cross-site" not in main_text(page)


# ---- the host operations (store/host/hostops.py) -----------------------------------------------------


def test_supersede_shows_its_digest_and_changes_the_search(page: Any, console: Console,
                                                            store: tuple[Path, dict[str, Any]]) -> None:
    from engram_memory.store.host import hostops

    old, new = store[1]["records"][0], store[1]["new"]
    page.goto(scope_url(console, "/search?q=DuckDB+lifecycle"))
    ranked = page.inner_text("#ranked")
    assert old[:16] in ranked and new[:16] in ranked
    page.goto(scope_url(console, f"/records/{old}"))
    form = page.locator("#op-supersede")
    form.locator("input[name=by]").fill(new)
    form.locator("input[name=reason]").fill("we moved to PostgreSQL")
    form.get_by_role("button").click()
    assert page.inner_text("#digest") == hostops.operation_digest(
        {"operation": "supersede", "record_id": old, "by": new, "reason": "we moved to PostgreSQL"})
    page.get_by_role("button", name="Confirm supersede").click()
    assert shows(page, "to_state", "historical")
    page.goto(scope_url(console, "/search?q=DuckDB+lifecycle"))
    ranked = page.inner_text("#ranked")
    assert old[:16] not in ranked and new[:16] in ranked
    page.goto(scope_url(console, f"/records/{old}"))
    assert page.inner_text("#state") == "historical"


def confirm_operation(page: Any, form_id: str, fields: dict[str, str]) -> dict[str, str]:
    """Fill an operation's form on a record page, review it, confirm it; returns the result's rows."""
    form = page.locator(form_id)
    for name, value in fields.items():
        if name == "current":
            form.locator("select[name=current]").select_option(value)
        else:
            form.locator(f"input[name={name}]").fill(value)
    form.get_by_role("button").click()
    assert page.inner_text("#digest").startswith("sha256:")
    page.locator("#confirm").click()
    return result_rows(page)


def test_dispute_then_resolve_takes_a_record_out_of_search_and_back(page: Any, console: Console,
                                                                     store: tuple[Path, dict[str, Any]]) -> None:
    rid = store[1]["new"]
    page.goto(scope_url(console, f"/records/{rid}"))
    assert forms(page) == ["op-dispute", "op-forget", "op-supersede"]  # no resolve: nothing is disputed
    assert "accepted_disputed" in confirm_operation(page, "#op-dispute", {"reason": "contested"}).values()
    page.goto(scope_url(console, "/search?q=PostgreSQL+lifecycle"))
    assert page.locator("#no-results").count() == 1
    page.goto(scope_url(console, f"/records/{rid}"))
    assert page.inner_text("#state") == "accepted_disputed"
    assert forms(page) == ["op-forget", "op-resolve", "op-supersede"]  # disputed: not again
    result = confirm_operation(page, "#op-resolve", {"current": "current", "reason": "checked: still true"})
    assert result["receipt.to_state"] == "accepted_current", result
    page.goto(scope_url(console, "/search?q=PostgreSQL+lifecycle"))
    assert rid[:16] in page.inner_text("#ranked")
    page.goto(scope_url(console, f"/records/{rid}"))
    history = main_text(page)
    assert "contested" in history and "checked: still true" in history


def forms(page: Any) -> list[str]:
    """The ids of the operation forms a record page offers, sorted."""
    return sorted(str(f.get_attribute("id")) for f in page.locator("form.op").all())


def test_the_records_list_shows_each_text_and_filters_by_state(page: Any, console: Console,
                                                                store: tuple[Path, dict[str, Any]]) -> None:
    page.goto(scope_url(console, "/records"))
    rows = page.locator("main table tr").all_inner_texts()
    new_row = next(r for r in rows if store[1]["new"] in r)
    assert NEW_TEXT[:40] in new_row  # the primary component's text, first 120 characters
    forgotten = store[1]["records"][-1]  # fill_engine forgot it
    assert "(forgotten: key destroyed)" in next(r for r in rows if forgotten in r)
    page.goto(scope_url(console, "/records?state=tombstoned"))
    listed = main_text(page)
    assert forgotten in listed and store[1]["new"] not in listed
    page.goto(scope_url(console, f"/records/{forgotten}"))
    assert forms(page) == [] and "No operation applies to a record in state tombstoned" in main_text(page)


def test_the_scope_page_says_what_the_two_cursors_mean(page: Any, console: Console) -> None:
    page.goto(scope_url(console))
    text = main_text(page)
    assert "the last of them the search indexes have applied" in text and "search reflects every change" in text


def test_the_activity_plot_ticks_are_whole_numbers() -> None:
    from engram_memory.server.console.plot import activity_svg

    for peak, expected in ((1, ["0", "1"]), (3, ["0", "1", "2", "3"]), (10, ["0", "3", "6", "9", "12"])):
        svg = activity_svg({"days": ["2026-01-01", "2026-01-02"], "series": {"admitted": [peak, 0]}})
        assert [t["text"] for t in svg["ticks"]] == expected, peak
        plot_h = svg["base"] - svg["top"]  # the axis tops at the last tick: a bar's height is to that scale
        assert max(b["h"] for b in svg["bars"]) == round(plot_h * peak / int(expected[-1]), 1)


def test_revoke_trust_in_process(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from engram_memory.server.console.app import ConsoleState, create_app

    made = build_store(tmp_path / "data")
    engine = Engine.open(EngineSettings(data_dir=tmp_path / "data", semantic=False))
    try:
        state = ConsoleState(engine, "test", None)
        client = TestClient(create_app(state), base_url="http://127.0.0.1:8766", follow_redirects=False)
        client.get(f"/login?token={state.login_token}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/scope/acme/main").text)
        assert csrf is not None
        form = {"csrf": csrf.group(1), "operation": "revoke_trust", "source_ref": "doc:adr-7", "reason": "retracted"}
        review = client.post("/scope/acme/main/confirm", data=form)
        assert review.status_code == 200 and "doc:adr-7" in review.text
        fields = dict(re.findall(r'name="(nonce|digest)" value="([^"]+)"', review.text))
        done = client.post("/scope/acme/main/execute", data={"csrf": csrf.group(1), **fields})
        assert done.status_code == 200, done.text
        scope = "tenant:acme/workspace:main"
        assert engine.db.record_state(scope, made["new"]).state == "trust_invalid"
        assert engine.db.record_state("tenant:globex/workspace:ops", made["other"]).state == "accepted_current"
    finally:
        engine.close()


# ---- a console bound to one scope ---------------------------------------------------------------


def test_a_console_bound_to_one_scope_never_shows_another(browser: Any, store: tuple[Path, dict[str, Any]],
                                                          offline_env: dict[str, str], console: Console,
                                                          page: Any) -> None:
    data_dir, made = store
    other = made["other"]
    page.goto(console.base + "/")  # the module's console lets go of the store first
    console.stop()
    bound = Console(data_dir, offline_env, "--scope", "acme/main")
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(bound.login_url)
        seen = []
        for path in ("/", "/scope/acme/main", "/scope/acme/main/records", "/scope/acme/main/journal",
                     "/scope/acme/main/audit", f"/scope/acme/main/search?q={OTHER_MARKER}",
                     "/scope/acme/main/search?q=Globex+payroll+Fridays"):
            response = tab.goto(bound.base + path)
            assert response.status == 200, path
            if "search" in path:  # the query is echoed in its input box: the results must not hold it
                assert tab.locator("#no-results").count() == 1
                seen.append(tab.inner_text("main"))
            else:
                seen.append(tab.content())
        assert "bound to one scope" in seen[0] and seen[0].count('<section class="scope">') == 1
        for html in seen:
            assert "globex" not in html.lower() and OTHER_MARKER not in html and other not in html
        for path in ("/scope/globex/ops", "/scope/globex/ops/records", f"/scope/globex/ops/records/{other}",
                     "/scope/globex/ops/candidates", f"/scope/acme/main/records/{other}"):
            response = tab.goto(bound.base + path)
            assert response.status == 404, path
            assert OTHER_MARKER not in tab.content() and "Payroll" not in tab.content()
        # nor can an operation reach it through the bound scope
        tab.goto(bound.base + f"/scope/acme/main/records/{made['new']}")
        csrf = tab.locator("#op-forget input[name=csrf]").get_attribute("value")
        response = tab.request.post(bound.base + "/scope/acme/main/confirm",
                                    form={"csrf": csrf, "operation": "forget", "record_id": other, "reason": "x"})
        assert response.status == 400 and OTHER_MARKER not in response.text()
    finally:
        context.close()
        assert "Traceback" not in bound.stop()
    # the other tenant's record is untouched
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        assert [r["record_id"] for r in engine.live_records("tenant:globex/workspace:ops")] == [other]
    finally:
        engine.close()


# ---- requests awaiting the operator's approval (issue 37) ------------------------------------------


def park_forget(engine: Engine, c: Any, record_id: str, key: str) -> tuple[dict[str, Any], str]:
    """The agent's forget from a client without elicitation, as the server parks it (store/host/approvals.py)."""
    from engram_memory.models.errors import EngramError
    from engram_memory.models.tools import parse_input
    from engram_memory.store.host.approvals import admit_or_park

    args = {"record_id": record_id, "idempotency_key": key, "reason_ref": "reason:user-request"}
    with pytest.raises(EngramError) as refused:
        admit_or_park(engine, c, "forget", parse_input("forget", args))
    assert refused.value.code == "gate_failed"
    return args, refused.value.detail.rsplit(" ", 1)[-1]


def test_approvals_are_listed_confirmed_and_decided_in_their_own_scope_only(
        browser: Any, tmp_path: Path, offline_env: dict[str, str]) -> None:
    from engram_memory.models.tools import parse_input
    from engram_memory.store.host.approvals import admit_or_park

    data_dir = tmp_path / "data"
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))  # the wall clock: TTLs run
    try:
        kept = admit(engine, ctx(), "Harbour lights are checked every dusk", "approval-kept-001")
        gone = admit(engine, ctx(), "The old pier lamp was removed last year", "approval-gone-001")
        other = admit(engine, ctx("globex", "ops"), OTHER_TEXT, "approval-other-01")
        gone_args, gone_id = park_forget(engine, ctx(), gone, "forget-gone-000001")
        kept_args, kept_id = park_forget(engine, ctx(), kept, "forget-kept-000001")
        _, other_id = park_forget(engine, ctx("globex", "ops"), other, "forget-other-00001")
    finally:
        engine.close()
    bound = Console(data_dir, offline_env, "--scope", "acme/main")
    context = browser.new_context()
    try:
        tab = context.new_page()
        tab.goto(bound.login_url)
        base = bound.base + "/scope/acme/main"
        tab.goto(base + "/approvals")
        text = main_text(tab)
        # who asks, what, the record's text, the operation digest, its age; never the other scope's
        assert gone_id in text and kept_id in text and other_id not in text and OTHER_MARKER not in tab.content()
        section = tab.locator(f"#req-{gone_id}")
        assert "agent-1" in section.inner_text() and "alice" in section.inner_text()
        assert "engram_memory_forget" in section.inner_text() and gone in section.inner_text()
        assert section.locator(".target-text").inner_text() == "The old pier lamp was removed last year"
        assert section.locator(".digest").inner_text() == intent_hash("forget", gone_args)
        assert "s ago" in section.inner_text()
        # approve, behind the confirmation page
        section.locator("input[name=reason]").fill("the user asked to forget it")
        section.get_by_role("button", name="Review approve…").click()
        assert "Confirm: approve" in main_text(tab)
        tab.locator("#confirm").click()
        assert shows(tab, "status", "approved") and shows(tab, "outcome", "ok")
        tab.goto(base + f"/records/{gone}")
        assert tab.inner_text("#state") == "tombstoned"
        # deny
        tab.goto(base + "/approvals")
        section = tab.locator(f"#req-{kept_id}")
        section.locator("input[name=reason]").fill("keep this one")
        section.get_by_role("button", name="Review deny…").click()
        tab.locator("#confirm").click()
        assert shows(tab, "status", "denied")
        tab.goto(base + "/approvals")
        assert "No request awaits approval" in main_text(tab)
        # another scope's request is never decided through this one
        tab.goto(base + f"/records/{kept}")
        csrf = tab.locator("#op-forget input[name=csrf]").get_attribute("value")
        response = tab.request.post(base + "/confirm", form={"csrf": csrf, "operation": "approve",
                                                             "request_id": other_id, "reason": "x"})
        assert response.status == 400 and OTHER_MARKER not in response.text()
        assert tab.goto(bound.base + "/scope/globex/ops/approvals").status == 404
    finally:
        context.close()
        assert "Traceback" not in bound.stop()
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        # the agent's retries: the approved forget replays its outcome, the denied one stays refused
        model = parse_input("forget", gone_args)
        admit_or_park(engine, ctx(), "forget", model)
        replayed = call(engine, "forget", ctx(), gone_args)
        assert replayed["replayed"] is True and replayed["receipt"]["to_state"] == "tombstoned"
        from engram_memory.models.errors import EngramError

        with pytest.raises(EngramError) as refused:
            admit_or_park(engine, ctx(), "forget", parse_input("forget", kept_args))
        assert refused.value.code == "gate_failed"
        assert [r["record_id"] for r in engine.live_records("tenant:acme/workspace:main")] == [kept]
        assert [r["record_id"] for r in engine.live_records("tenant:globex/workspace:ops")] == [other]
    finally:
        engine.close()


# ---- a PostgreSQL store ---------------------------------------------------------------------------


def test_a_console_on_a_postgresql_store(browser: Any, tmp_path: Path, pg_database: str,
                                         offline_env: dict[str, str]) -> None:
    """The store migrated to PostgreSQL: the console joins it as an admin node, bound to one scope."""
    duck, key = tmp_path / "duck", tmp_path / "master.key"
    made = build_store(duck)
    migrated = subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "admin", "migrate", "--from",
                               str(duck), "--to", pg_database, "--master-key-out", str(key)], env=offline_env,
                              cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert migrated.returncode == 0, migrated.stderr
    port = free_port()
    argv = [sys.executable, "-m", "engram_memory.server.cli", "console", "--store", pg_database,
            "--master-key-file", str(key), "--scope", "acme/main", "--bind", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, env=offline_env, cwd=str(REPO), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    context = browser.new_context()
    try:
        assert proc.stdout is not None
        login = proc.stdout.readline().strip()
        assert login.startswith(f"http://127.0.0.1:{port}/login?token="), proc.stderr and proc.stderr.read()
        tab = context.new_page()
        tab.goto(login)
        text = main_text(tab)
        assert "acme/main" in text and "globex" not in tab.content().lower()
        assert "the PostgreSQL store" in tab.inner_text("header")
        base = f"http://127.0.0.1:{port}/scope/acme/main"
        held = made["held"][0]
        tab.goto(base + "/candidates")
        section = tab.locator(f"#cand-{held}")
        section.locator("input[name=reason]").fill("checked on the shared store")
        section.get_by_role("button", name="Accept").click()
        assert shows(tab, "status", "accepted")
        tab.goto(base + "/search?q=nightly+backups")
        assert "Backups run nightly at two" in tab.inner_text("#ranked")
        rid = made["records"][0]
        tab.goto(base + f"/records/{rid}")
        tab.locator("#op-forget input[name=reason]").fill("asked to forget")
        tab.locator("#op-forget button").click()
        tab.locator("#confirm").click()
        assert shows(tab, "to_state", "tombstoned")
        tab.goto(base + "/journal")
        assert tab.inner_text("#chain") == "verifies"
        assert tab.goto(f"http://127.0.0.1:{port}/scope/globex/ops").status == 404
    finally:
        context.close()
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err, err
    verify = subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "admin", "verify", "--store",
                             pg_database, "--master-key-file", str(key), "--json"], env=offline_env, cwd=str(REPO),
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr


# ---- fast checks: the app in-process, the command's refusals ------------------------------------


def test_headers_cookie_flags_and_csrf_in_process(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from engram_memory.server.console.app import ConsoleState, create_app, loopback_hosts

    made = build_store(tmp_path / "data")
    engine = Engine.open(EngineSettings(data_dir=tmp_path / "data", semantic=False))
    try:
        state = ConsoleState(engine, "test", None, hosts=loopback_hosts("127.0.0.1", 8766))
        token = state.login_token
        client = TestClient(create_app(state), base_url="http://127.0.0.1:8766", follow_redirects=False)
        refused = client.get("/scope/acme/main")
        assert refused.status_code == 401
        for response in (refused, client.get("/static/console.css")):
            headers = response.headers
            assert headers["content-security-policy"].startswith("default-src 'self'; script-src 'self';")
            assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "same-origin"
        assert client.get("/login?token=wrong").status_code == 401
        # a name rebound to 127.0.0.1 by some web page carries its own Host: refused before the login
        assert client.get(f"/login?token={token}", headers={"host": "rebound.example:8766"}).status_code == 421
        assert client.get("/", headers={"host": "localhost:8766"}).status_code == 401  # a loopback name
        login = client.get(f"/login?token={token}")
        assert login.status_code == 303 and login.headers["location"] == "/"
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Path=/" in cookie
        assert client.get(f"/login?token={token}").status_code == 401  # one time
        page = client.get("/scope/acme/main").text
        assert "<script" not in page and " style=" not in page  # nothing the CSP would have to allow
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        rid = made["records"][0]
        form = {"operation": "dispute", "record_id": rid, "reason": "stale"}
        assert client.post("/scope/acme/main/confirm", data=form).status_code == 403
        assert client.post("/scope/acme/main/confirm", data={**form, "csrf": csrf.group(1) + "x"}).status_code == 403
        forget = client.post("/scope/acme/main/confirm", data={**form, "operation": "forget", "csrf": csrf.group(1)})
        assert forget.status_code == 200 and "Confirm: forget" in forget.text
        assert engine.db.record_state("tenant:acme/workspace:main", rid).state == "accepted_current"
        # a host operation: reviewed with its digest
        dispute = client.post("/scope/acme/main/confirm", data={**form, "csrf": csrf.group(1)})
        assert dispute.status_code == 200 and "Confirm: dispute" in dispute.text, dispute.text
        too_long = client.post("/scope/acme/main/confirm", data={**form, "operation": "forget", "csrf": csrf.group(1),
                                                                 "reason": "é" * 300})
        assert too_long.status_code == 400 and "512" in too_long.text
        # every page waits for the engine's own writer, as the semantic backfill (on the store's own
        # connection, which refuses a second caller: a page read during the backfill once failed)
        import threading

        held, done = threading.Event(), threading.Event()

        def writer() -> None:
            with engine._rw.write():
                held.set()
                engine.db.con.execute("SELECT sum(i * i) FROM range(300000000) t(i)").fetchall()
                done.set()
        thread = threading.Thread(target=writer)
        thread.start()
        held.wait()
        assert client.get("/").status_code == 200 and done.is_set()
        thread.join()
    finally:
        engine.close()


def test_the_journal_page_names_the_last_backup(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from engram_memory.server.console.app import ConsoleState, create_app
    from engram_memory.store.maintenance.backup import backup_offline, new_backup_key

    data_dir = tmp_path / "data"
    build_store(data_dir)
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        state = ConsoleState(engine, "test", None)
        client = TestClient(create_app(state), base_url="http://127.0.0.1:8766", follow_redirects=False)
        client.get(f"/login?token={state.login_token}")
        assert "none noted" in client.get("/scope/acme/main/journal").text
    finally:
        engine.close()
    manifest = backup_offline(data_dir, tmp_path / "b.tar", new_backup_key())
    engine = Engine.open(EngineSettings(data_dir=data_dir, semantic=False))
    try:
        state = ConsoleState(engine, "test", None)
        client = TestClient(create_app(state), base_url="http://127.0.0.1:8766", follow_redirects=False)
        client.get(f"/login?token={state.login_token}")
        page = client.get("/scope/acme/main/journal").text
        head = manifest["heads"]["tenant:acme/workspace:main"]["cursor"]
        assert manifest["created_at"] in page and str(tmp_path / "b.tar") in page
        assert f"this scope's journal at cursor {head}" in page and manifest["key_id"] in page
    finally:
        engine.close()


def run_console(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engram_memory.server.cli", "console", *args], env=env,
                          cwd=str(REPO), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def test_refusals_are_one_line(tmp_path: Path, offline_env: dict[str, str]) -> None:
    data_dir = tmp_path / "data"
    build_store(data_dir)
    remote = run_console(["--data-dir", str(data_dir), "--bind", "0.0.0.0:8766"], offline_env)
    assert remote.returncode == 2 and remote.stdout == ""
    assert remote.stderr == ("engram-memory: error: --bind 0.0.0.0:8766 is not a loopback address;"
                             " add --allow-remote to bind it\n")
    missing = run_console(["--data-dir", str(tmp_path / "none"), "--bind", f"127.0.0.1:{free_port()}"], offline_env)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and not (tmp_path / "none").exists()
    unknown = run_console(["--data-dir", str(data_dir), "--scope", "nobody/here", "--no-semantic",
                           "--bind", f"127.0.0.1:{free_port()}"], offline_env)
    assert unknown.returncode == 2 and "no scope nobody/here" in unknown.stderr and unknown.stdout == ""
    running = Console(data_dir, offline_env)
    try:
        busy = run_console(["--data-dir", str(data_dir), "--no-semantic", "--bind", f"127.0.0.1:{free_port()}"],
                           offline_env)
        assert busy.returncode == 1 and busy.stdout == ""
        assert busy.stderr == f"engram-memory: error: STORE_BUSY: data dir {data_dir} is in use by a running server;" \
                              " stop it first\n"
    finally:
        running.stop()
