"""The memory inspector in a real browser: Debian's chromium driven headless by Playwright,
against one worker serving the API and the page, on the real broker.

A user with memories (one of them hostile HTML) is searched, a memory's versions and
lineage opened, back to its source messages, one memory deleted through the page and seen
gone; the `context` an agent is handed for a typed query is shown (its prompt block, its
items and what replaced them); hostile text shows literally and runs nothing; a wrong key
gets an error, not data. The pure functions of the page (Prometheus parsing, quantiles,
change events, jobs, context rows) are checked in the same browser. Every wait is
Playwright's auto-waiting or a polled barrier. A screenshot lands in
``.artifacts/inspector.png``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from memstream.client import AsyncMemoryClient, MemstreamAPIError
from memstream.web.keys_topic import create_key
from tests.integration.conftest import free_port, remembered, running, until

pytestmark = pytest.mark.integration
ADMIN = "admin-key-inspector-0123456789abcdef"
PORT = free_port()
BASE = f"http://127.0.0.1:{PORT}"
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / ".artifacts" / "inspector.png"
HOSTILE = "<img src=x onerror=alert(1)><script>alert(2)</script>"
EXPECT_MS = 20_000  # a delete is a job of the user: the pipeline applies it


def _required(what: str) -> None:
    """Fail where integration tests are required (the README's test command), else skip."""
    if os.environ.get("MEMSTREAM_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"{what} (scripts/bootstrap.sh --test installs it)")
    pytest.skip(what)


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        _required("Debian's chromium is not installed")
    assert found is not None
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(kafka_bootstrap, tmp_path_factory):
    """One worker with the API on, a tenant whose user ana has memories, a tenant key."""
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        _required("playwright (pip install -e '.[dev]') is not installed")
    exe = chromium_path()
    tenant = "inspect"
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("insp"), extract_enabled=True,
                       web_enabled=True, web_port=PORT, admin_key=ADMIN) as h:
        async with AsyncMemoryClient(BASE, ADMIN, tenant_id=tenant,
                                     bootstrap_servers=h.settings.bootstrap_servers,
                                     topic_prefix=h.settings.topic_prefix) as c:
            await until(lambda: c.tools(), "the API to answer", timeout=120)
            async def ana() -> None:  # an update: Lisbon's version 2 says Porto
                await remembered(h, c, tenant, "ana", "s1", [
                    "Remember this: I live in Lisbon", "I am allergic to penicillin",
                    f"Remember this: my nickname is {HOSTILE}"])
                await remembered(h, c, tenant, "ana", "s2", ["I moved from Lisbon to Porto"])

            await asyncio.gather(ana(), remembered(h, c, tenant, "bo", "s1", [
                "Remember this: I live in Oslo", "I am allergic to nuts"]))
        key, _ = await create_key(h.settings, tenant, "inspector test")
        async with AsyncMemoryClient(BASE, key, tenant_id=tenant) as tc:
            async def accepted() -> bool | None:
                try:
                    return True if await tc.get_all(user_id="ana") else None
                except MemstreamAPIError:
                    return None  # the worker has not read the key yet

            await until(accepted, "the tenant key to be accepted")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=exe, headless=True,
                                               args=["--no-sandbox"])
            yield {"h": h, "tenant": tenant, "key": key, "browser": browser}
            await browser.close()


class Watched:
    """A page with every dialog, page error, CSP report and request URL recorded."""

    def __init__(self, page) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.console: list[str] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("console", lambda m: self.console.append(m.text))
        page.on("request", lambda r: self.requests.append((r.url, r.headers)))

    async def _dialog(self, dialog) -> None:  # Playwright awaits an async handler
        self.dialogs.append(dialog.message)
        await dialog.dismiss()

    def csp_reports(self) -> list[str]:
        return [m for m in self.console if "Content Security Policy" in m]


async def open_page(world, key: str, user: str = "ana") -> Watched:
    from playwright.async_api import expect

    context = await world["browser"].new_context(viewport={"width": 1280, "height": 900})
    w = Watched(await context.new_page())
    await w.page.goto(f"{BASE}/inspector")
    await w.page.fill("#key", key)
    await w.page.fill("#tenant", world["tenant"])
    await w.page.fill("#user", user)
    await w.page.click("#open")
    await expect(w.page.locator("#status")).not_to_have_text("loading…", timeout=EXPECT_MS)
    return w


async def test_search_history_source_delete_and_hostile_text(world):
    from playwright.async_api import expect

    w = await open_page(world, ADMIN)
    page = w.page
    await expect(page.locator("#main")).to_be_visible()
    memories = page.locator("#memories tbody tr")
    await expect(memories).to_have_count(3)  # Porto (Lisbon's version 2), allergy, nickname
    # hostile memory text shows literally, as text: no element made of it, nothing ran
    await expect(page.locator("#memories")).to_contain_text(f"my nickname is {HOSTILE}")
    for table in ("#memories", "#changes"):
        assert await page.locator(f"{table} img, {table} script").count() == 0

    await page.fill("#query", "where do I live?")
    await page.click("#search")
    results = page.locator("#results tbody tr")
    await expect(results.first).to_contain_text("Lives in Porto")
    score = float(await results.first.locator("td.score").inner_text())
    assert 0 < score <= 3  # three components in [0, 1], weights 1/1/1
    components = await results.first.locator("td").all_inner_texts()
    assert all(0 <= float(x) <= 1 for x in components[3:6])  # recency, importance, relevance

    await results.first.locator("button.open-memory").click()
    versions = page.locator("#versions tbody tr")
    await expect(versions).to_have_count(2)
    await expect(versions.nth(0)).to_have_attribute("data-status", "superseded")
    await expect(versions.nth(1)).to_have_attribute("data-status", "active")
    await expect(versions.nth(0).locator("td.content")).to_have_text("Lives in Lisbon")
    await expect(versions.nth(1).locator("td.lineage")).to_have_text("extraction")
    await versions.nth(1).locator("button.source").click()
    await expect(page.locator("#source-messages")).to_contain_text(
        "I moved from Lisbon to Porto")
    await expect(page.locator("#source-range")).to_contain_text("session s2")

    jobs = page.locator("#jobs tbody tr")
    # each extraction job with what triggered it (the version records carry it)
    triggered = re.compile(r"extraction: (threshold|explicit|session_end|idle)")
    await expect(jobs.filter(has_text=triggered)).not_to_have_count(0)

    # delete the allergy through the page; the pipeline applies it, the list refreshes
    await memories.filter(has_text="Allergic to penicillin").locator("button").click()
    await expect(page.locator("#detail-id")).not_to_be_empty()
    await page.fill("#delete-reason", "support ticket: not allergic")
    await page.click("#delete")
    await expect(page.locator("#action-status")).to_contain_text("done", timeout=EXPECT_MS)
    await expect(memories).to_have_count(2)
    await expect(page.locator("#memories")).not_to_contain_text("Allergic to penicillin")
    await expect(versions.first).to_have_attribute("data-status", "deleted")
    await expect(jobs.filter(has_text="1 delete")).to_have_count(1)
    await expect(page.locator("#changes tbody tr").first).to_contain_text("delete")
    assert await page.locator("#chart-days svg rect.bar.op-delete").count() == 1

    SCREENSHOT.parent.mkdir(exist_ok=True)
    await page.screenshot(path=str(SCREENSHOT), full_page=True)
    print(f"inspector screenshot: {SCREENSHOT}")
    assert w.dialogs == [] and w.errors == [] and w.csp_reports() == []
    api = [(u, hd) for u, hd in w.requests if "/v1/" in u]
    assert api and all(hd.get("x-api-key") == ADMIN for _, hd in api)
    assert not [u for u, _ in w.requests if ADMIN in u]  # the key is never in a URL
    await page.context.close()


async def test_rollback_undo_and_forget_through_the_page(world):
    from playwright.async_api import expect

    w = await open_page(world, world["key"], user="bo")  # a tenant key may correct too
    page, done = w.page, w.page.locator("#action-status")
    memories = page.locator("#memories tbody tr")
    await expect(memories).to_have_count(2)
    await memories.filter(has_text="Lives in Oslo").locator("button").click()
    await page.click("#delete")
    await expect(done).to_contain_text("Deleting the memory: done", timeout=EXPECT_MS)
    await expect(memories).to_have_count(1)

    versions = page.locator("#versions tbody tr")
    await versions.first.locator("button.rollback").click()  # restore version 1
    await expect(done).to_contain_text("Rolling back to version 1: done", timeout=EXPECT_MS)
    await expect(memories.filter(has_text="Lives in Oslo")).to_have_count(1)
    await expect(versions).to_have_count(2)
    await expect(versions.nth(1)).to_have_attribute("data-status", "active")
    await expect(versions.nth(1).locator("td.lineage")).to_have_text("rollback")

    # undo a job from the jobs table: the deletion of the allergy, restored
    await memories.filter(has_text="Allergic to nuts").locator("button").click()
    await page.click("#delete")
    await expect(done).to_contain_text(re.compile(r"Deleting the memory: done \(job \w+"),
                                       timeout=EXPECT_MS)
    await expect(memories).to_have_count(1)
    job = re.search(r"\(job (\w+)", await done.inner_text()).group(1)  # type: ignore[union-attr]
    deletion = page.locator(f'#jobs tbody tr[data-job^="{job}"]')
    await expect(deletion).to_contain_text("1 delete")
    await deletion.locator("button.undo").click()
    await expect(done).to_contain_text(re.compile(r"Undoing job \S+: done"), timeout=EXPECT_MS)
    await expect(memories).to_have_count(2)
    await expect(memories.filter(has_text="Allergic to nuts")).to_have_count(1)

    forget = page.locator("#forget")
    await page.fill("#forget-confirm", "b")
    await expect(forget).to_be_disabled()  # the user id typed in full, or nothing
    await page.fill("#forget-reason", "ticket 42")
    await page.fill("#forget-confirm", "bo")
    await forget.click()
    await expect(done).to_contain_text("Forgetting user bo: done", timeout=EXPECT_MS)
    await expect(memories).to_have_count(0)
    await expect(page.locator("#changes tbody tr")).to_have_count(0)
    assert w.dialogs == [] and w.errors == [] and w.csp_reports() == []
    await page.context.close()


async def test_the_context_view_shows_what_the_agent_is_handed(world):
    """The `context` answer for a query typed by the operator: the prompt block as text,
    exactly as the API returned it, and a row per item (kind, date, score, text, whether it
    is still true and what replaced it, the block line it became); hostile memory text
    stays text there too."""
    from playwright.async_api import expect

    w = await open_page(world, ADMIN)
    page = w.page
    await expect(page.locator("#context-result")).to_be_hidden()

    async def ask(query: str) -> dict:
        await page.fill("#context-query", query)
        await page.fill("#context-budget", "4000")
        async with page.expect_response(lambda r: r.url.endswith("/context")) as answer:
            await page.click("#context")
        resp = await answer.value
        assert resp.status == 200 and resp.request.headers.get("x-api-key") == ADMIN
        assert '"record_hits":false' in (resp.request.post_data or "").replace(" ", "")
        return await resp.json()

    ctx = await ask("where do I live?")
    await expect(page.locator("#context-result")).to_be_visible()
    block = page.locator("#prompt-block")
    await expect(block).to_contain_text("Lives in Porto")
    assert await block.text_content() == ctx["prompt_block"]  # as the agent reads it
    rows = page.locator("#context-items tbody tr")
    await expect(rows).to_have_count(len(ctx["items"]))
    assert ctx["items"], ctx
    for n, item in enumerate(ctx["items"]):
        row = rows.nth(n)
        await expect(row).to_have_attribute("data-kind", item["kind"])
        await expect(row).to_contain_text(item["content"])
        shown = float(await row.locator("td.score").inner_text())
        assert abs(shown - item["score"]) <= 0.0005 + 1e-9, (shown, item)
        if item.get("stale") == "superseded" and item.get("superseded_by"):
            await expect(row).to_have_attribute("data-stale", "superseded")
            when = datetime.fromtimestamp(item["valid_to"], UTC).date().isoformat()
            await expect(row.locator("td.still")).to_contain_text(
                f"replaced {when} by: {item['superseded_by']['content']}")
        if item.get("line"):
            await expect(row.locator("td.line")).to_have_text(item["line"])
            assert item["line"] in ctx["prompt_block"].splitlines()
    live = page.locator('#context-items tbody tr[data-kind="memory"]').filter(
        has_text="Lives in Porto")
    await expect(live).to_have_count(1)
    await expect(live.locator("td.still")).to_have_text("live")
    # the Lisbon turn, said before the move: never shown as current
    for n, item in enumerate(ctx["items"]):
        if item["kind"] == "turn" and "I live in Lisbon" in item["content"]:
            assert item.get("stale") in (None, "superseded"), item
            if "stale" in item:  # the API says whether it is still true: the page shows it
                assert item["stale"] == "superseded", item
                await expect(rows.nth(n).locator("td.still")).to_contain_text("replaced")
    # a memory of the block opens its history
    await live.locator("button.open-memory").click()
    await expect(page.locator("#versions tbody tr")).to_have_count(2)

    ctx = await ask("what is my nickname?")
    await expect(rows).to_have_count(len(ctx["items"]))
    section = page.locator("#context-section")
    await expect(section).to_contain_text(HOSTILE)  # literally, as text
    assert HOSTILE in (await block.text_content() or "")
    assert await section.locator("img, script").count() == 0
    assert w.dialogs == [] and w.errors == [] and w.csp_reports() == []
    await page.context.close()


async def test_a_wrong_key_shows_an_error_not_data(world):
    from playwright.async_api import expect

    w = await open_page(world, ADMIN)
    await expect(w.page.locator("#memories tbody tr")).not_to_have_count(0)
    await w.page.fill("#key", "not-a-key")
    await w.page.click("#open")
    await expect(w.page.locator("#status")).to_contain_text("401")
    await expect(w.page.locator("#status")).to_have_attribute("data-kind", "error")
    await expect(w.page.locator("#main")).to_be_hidden()
    assert await w.page.locator("#memories tbody tr").count() == 0  # the earlier data too
    await w.page.context.close()


async def test_metrics_show_or_say_why_not(world):
    """The admin key sees the worker's metrics when it has /metrics (charts, p50/p99), else
    the page says there are none; a tenant key is told which key metrics need."""
    from playwright.async_api import expect

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{BASE}/metrics", headers={"X-API-Key": ADMIN}) as resp:
            admin_status = resp.status
        async with http.get(f"{BASE}/metrics", headers={"X-API-Key": world["key"]}) as resp:
            tenant_status = resp.status
        async with http.get(f"{BASE}/v1/metrics/summary",
                            headers={"X-API-Key": ADMIN}) as resp:
            summary_status = resp.status
    w = await open_page(world, ADMIN)
    note = w.page.locator("#metrics-status")
    if admin_status == 200:
        await expect(note).to_contain_text("from this worker's /metrics")
        await expect(w.page.locator("#chart-latency .quantiles")).to_contain_text("p50")
        await expect(w.page.locator("#chart-ops svg")).to_be_visible()
        governance = w.page.locator("#governance")
        if summary_status == 200:  # the health figures of SPEC §8
            await expect(governance).to_contain_text("hit rate")
            await expect(governance).to_contain_text("user deletion rate")
        else:
            await expect(governance).to_be_hidden()
    else:
        assert admin_status == 404
        await expect(note).to_have_text("this worker serves no /metrics")
    await w.page.context.close()
    w = await open_page(world, world["key"])
    await expect(w.page.locator("#memories tbody tr")).not_to_have_count(0)
    expected = {401: "metrics need the admin or metrics key", 403:
                "metrics need the admin or metrics key", 404: "this worker serves no /metrics"}
    await expect(w.page.locator("#metrics-status")).to_have_text(expected[tenant_status])
    await w.page.context.close()


PROMETHEUS = """# HELP memstream_retrieval_latency_seconds retrieval latency
# TYPE memstream_retrieval_latency_seconds histogram
memstream_retrieval_latency_seconds_bucket{le="0.01"} 50
memstream_retrieval_latency_seconds_bucket{le="0.1"} 90
memstream_retrieval_latency_seconds_bucket{le="1.0"} 100
memstream_retrieval_latency_seconds_bucket{le="+Inf"} 100
memstream_retrieval_latency_seconds_count 100
memstream_memory_changes_total{op="add",kind="extraction"} 3
memstream_memory_changes_total{op="add",kind="rollback"} 1
memstream_memory_changes_total{op="delete",kind="deletion"} 2
memstream_jobs_total{trigger="threshold"} 4
memstream_jobs_total{trigger="say \\"hi\\""} 1
"""


async def test_the_pages_pure_functions(world):
    """Parsing, quantiles, change events, per-day counts and jobs, run in the browser."""
    context = await world["browser"].new_context()
    page = await context.new_page()
    await page.goto(f"{BASE}/inspector")
    got = await page.evaluate("""async (text) => {
      const L = await import("/inspector/logic.js");
      const s = L.parsePrometheus(text);
      const b = L.histogramBuckets(s, "memstream_retrieval_latency_seconds");
      const day = 86400 * 20000;  // 2024-10-04
      const lin = (job, kind, closed) => ({job_id: job, kind, reason: "", closed_by_job: closed});
      const log = [
        {memory_id: "m1", version: 2, status: "active", valid_from: day + 50, valid_to: null,
         lineage: lin("j2", "extraction", null)},
        {memory_id: "m1", version: 1, status: "superseded", valid_from: day + 10,
         valid_to: day + 50, lineage: lin("j1", "extraction", "j2")},
        {memory_id: "m2", version: 1, status: "deleted", valid_from: day + 20,
         valid_to: day + 86400, lineage: lin("j1", "extraction", "j3")},
      ];
      const ev = L.changeEvents(log);
      const jobs = L.jobsOf(ev, {j3: {kind: "deletion", actor: "admin"}});
      const ctx = {
        memories: [{memory_id: "m9", recency: 0.9, importance_score: 0.7, relevance: 0.55}],
        items: [
          {kind: "memory", id: "m9", content: "Lives in Munich", score: 0.3,
           event_time: day + 86400, session_id: "s2", message_ids: ["a"], role: null,
           context: null, stale: null, valid_to: null, superseded_by: null,
           line: "- (2024-10-05) Lives in Munich"},
          {kind: "turn", id: "t1", content: "I live in Berlin", score: 0.2, event_time: day,
           session_id: "s1", message_ids: ["b"], role: "user",
           context: {role: "assistant", content: "Where do you live?"},
           stale: "superseded", valid_to: day + 86400,
           superseded_by: {memory_id: "m9", content: "Lives in Munich", event_time: day + 86400},
           line: null},
          {kind: "turn", id: "t2", content: "I eat meat", score: 0.1, event_time: day,
           session_id: "s1", message_ids: ["c"], role: "user", context: null,
           stale: "deleted", valid_to: day + 2 * 86400, superseded_by: null},
          {kind: "turn", id: "t3", content: "hello", score: 0.05, event_time: day,
           session_id: "s1", message_ids: ["d"], role: "user", context: null},
        ],
      };
      return {
        rows_ctx: L.contextRows(ctx).map((r) => [r.label, r.note, r.why, r.line, r.stale,
          r.replacedBy]),
        expired: L.staleNote({stale: "expired", valid_to: day}),
        unknown: L.staleNote({stale: "superseded"}),
        ops: L.sumBy(s, "memstream_memory_changes_total", "op"),
        triggers: L.sumBy(s, "memstream_jobs_total", "trigger"),
        buckets: b.map((x) => [x.le === Infinity ? "inf" : x.le, x.count]),
        p50: L.quantile(b, 0.5), p95: L.quantile(b, 0.95), p99: L.quantile(b, 0.99),
        bars: L.bucketBars(b).map((x) => x.value),
        empty: Number.isNaN(L.quantile([], 0.5)),
        days: L.perDay(ev),
        jobs: jobs.map((j) => [j.job, j.kind, j.ops, j.memories.size, j.actor]),
        rows: log.map(L.rowOp),
      };
    }""", PROMETHEUS)
    await context.close()
    assert got["ops"] == {"add": 4, "delete": 2}
    assert got["triggers"] == {"threshold": 4, 'say "hi"': 1}
    assert got["buckets"] == [[0.01, 50], [0.1, 90], [1, 100], ["inf", 100]]
    assert got["p50"] == pytest.approx(0.01)
    assert got["p95"] == pytest.approx(0.55)  # halfway through the (0.1, 1] bucket
    assert got["p99"] == pytest.approx(0.91)
    assert got["bars"] == [50, 40, 10, 0] and got["empty"]
    assert got["days"] == [{"label": "2024-10-04", "parts": {"add": 2, "update": 1}},
                           {"label": "2024-10-05", "parts": {"delete": 1}}]
    assert got["jobs"] == [["j3", "deletion", {"delete": 1}, 1, "admin"],
                           ["j2", "extraction", {"update": 1}, 1, ""],
                           ["j1", "extraction", {"add": 2}, 2, ""]]
    assert got["rows"] == ["update", "supersede", "delete"]
    assert got["rows_ctx"] == [
        ["memory", "", "live memory: recency 0.90, importance 0.70, relevance 0.55",
         "- (2024-10-05) Lives in Munich", "", ""],
        ["turn [user]", "replaced 2024-10-05 by: Lives in Munich",
         "said in session s1; after [assistant] Where do you live?", "", "superseded", "m9"],
        ["turn [user]", "deleted 2024-10-06", "said in session s1", "", "deleted", ""],
        ["turn [user]", "", "said in session s1", "", "", ""],  # no staleness fields
    ]
    assert got["expired"] == "expired 2024-10-04" and got["unknown"] == "replaced"
