// The demo app in a real browser: Debian's chromium, headless, driven by Playwright.
// Run by tests/ui/run.sh, which starts PostgreSQL, a fresh demo database and the gateway in demo
// mode, and passes CTXGUARD_UI_URL. Every test opens a fresh browser context (its own session).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const BASE = process.env.CTXGUARD_UI_URL ?? "http://127.0.0.1:31920";
const SHOTS = process.env.CTXGUARD_UI_SCREENSHOTS;
// Demo Notes, the upstream that needs each user's own connection (run.sh starts it), and its log.
const UPSTREAM = process.env.CTXGUARD_UI_UPSTREAM_URL ?? "http://127.0.0.1:31921";
const UPSTREAM_LOG = process.env.CTXGUARD_UI_UPSTREAM_LOG;
const TIMEOUT = 15_000;

let browser;

before(async () => {
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    // Flags for a closed network and a root user (see the machine notes in the README).
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  if (SHOTS) mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  await browser?.close();
});

// A fresh session as `user`; fails the test on any script error or console error (a CSP
// violation included) once the test is over.
async function open(t, user = "alice") {
  const context = await browser.newContext({ viewport: { width: 1360, height: 900 }, baseURL: BASE });
  // The first user of the session; the switcher changes it from then on.
  await context.addInitScript((u) => {
    if (!sessionStorage.getItem("ctxguard-demo-user")) sessionStorage.setItem("ctxguard-demo-user", u);
  }, user);
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const problems = [];
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    // The browser logs every non-2xx response; the tests provoke those on purpose.
    if (m.type() === "error" && !/Failed to load resource/.test(m.text())) problems.push(`console: ${m.text()}`);
  });
  t.after(async () => {
    await context.close();
    assert.deepEqual(problems, [], "the page logged errors");
  });
  return page;
}

// Wait until the screen and the tool panel of the current URL are drawn.
async function ready(page, state = "1") {
  await page.waitForSelector(`body[data-ready="${state}"]`);
}

async function go(page, path) {
  await page.goto(path);
  await ready(page);
}

const visibleTools = (page) => page.$$eval("#tools-visible li", (li) => li.map((l) => l.dataset.tool));
const hiddenTools = (page) =>
  page.$$eval("#tools-hidden li", (li) => Object.fromEntries(li.map((l) => [l.dataset.tool, l.dataset.reason])));
const toolGroups = (page) => page.$$eval("#tools-visible section.ns-group", (sections) =>
  Object.fromEntries(sections.map((s) => [s.dataset.namespace, [...s.querySelectorAll("li")].map((l) => l.dataset.tool)])));
const pageContext = async (page) => JSON.parse(await page.textContent("#page-context"));

async function shot(page, name) {
  if (SHOTS) await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

// One element, cropped (small pictures for the README).
async function shotOf(locator, name) {
  if (SHOTS) await locator.screenshot({ path: join(SHOTS, `${name}.png`) });
}

// Click a Connect link (it opens the upstream's sign-in in a new tab), sign in there as `account`,
// allow, and wait for the gateway's callback page to say it is done; back to the app's tab.
async function connectAs(page, link, account) {
  const [signIn] = await Promise.all([page.context().waitForEvent("page"), link.click()]);
  signIn.setDefaultTimeout(TIMEOUT);
  await signIn.waitForLoadState();
  assert.equal(new URL(signIn.url()).origin, UPSTREAM);
  assert.match(await signIn.textContent("h1"), /Sign in to Demo Notes/);
  await signIn.selectOption("#user", account);
  await Promise.all([signIn.waitForURL((u) => u.href.startsWith(`${BASE}/v1/connections/callback?`)), signIn.click("#allow")]);
  assert.match(await signIn.textContent("body"), /Connected/);
  await signIn.close();
  await page.bringToFront();
}

// Requests made from inside the page (same origin), as a given demo user.
async function asUser(page, user, path, body) {
  return page.evaluate(async ({ user, path, body }) => {
    const post = (url, b, headers = {}) =>
      fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(b) });
    const { token } = await (await post("/demo/token", { user })).json();
    const res = await post(path, body, { authorization: `Bearer ${token}` });
    return { status: res.status, body: await res.json() };
  }, { user, path, body });
}

const invoicePage = (id) => ({ pageType: "invoice_detail", entity: { type: "invoice", id } });

async function invoiceStatus(page, user, id) {
  const r = await asUser(page, user, "/demo/page", { pageContext: invoicePage(id) });
  return r.body.data.invoice.status;
}

const approveAs = (page, user, callId, id) =>
  asUser(page, user, `/v1/approvals/${callId}`, { pageContext: invoicePage(id) });

// Ask a question through the chat panel; resolves when its turn has finished streaming.
async function ask(page, question) {
  const turns = await page.$$eval("#messages > li", (l) => l.length);
  const request = page.waitForRequest((r) => r.url().endsWith("/v1/chat") && r.method() === "POST");
  await page.fill("#chat-input", question);
  await page.click("#chat-send");
  const sent = JSON.parse((await request).postData());
  const turn = page.locator("#messages > li").nth(turns);
  await page.waitForFunction((n) => {
    const li = document.querySelectorAll("#messages > li")[n];
    return li && li.dataset.state !== "streaming";
  }, turns);
  const calls = await turn.locator(".call").evaluateAll((l) =>
    l.map((c) => ({ tool: c.dataset.tool, decision: c.dataset.decision, code: c.dataset.code })));
  return { sent, turn, calls, state: await turn.getAttribute("data-state"), answer: await turn.locator(".answer").textContent() };
}

describe("navigation", () => {
  test("table → detail → viewer and back: URL, screen, page context and tools follow the page", async (t) => {
    const page = await open(t);
    await go(page, "/invoices");
    assert.equal(await page.textContent("h1"), "Invoices");
    const rows = await page.$$eval("#invoice-table tbody tr", (r) => r.map((x) => x.dataset.id));
    assert.equal(rows.length, 12);
    let ctx = await pageContext(page);
    assert.equal(ctx.pageType, "invoice_table");
    assert.equal(ctx.entity, null);
    assert.deepEqual(ctx.pageState.visibleIds, rows, "the page state lists exactly the rows on screen");
    assert.ok((await visibleTools(page)).includes("invoice.list"));
    assert.equal((await hiddenTools(page))["invoice.get"], "wrong_page");
    await shot(page, "invoice-table");

    // Tabs and filters are page state: the URL, the screen and the context agree.
    await page.click('[data-tab="overdue"]');
    await ready(page);
    assert.match(page.url(), /\/invoices\?tab=overdue$/);
    const statuses = await page.$$eval("#invoice-table tbody tr .badge", (b) => b.map((x) => x.textContent));
    assert.ok(statuses.length > 0 && statuses.every((s) => s === "overdue"), `statuses: ${statuses}`);
    ctx = await pageContext(page);
    assert.equal(ctx.pageState.tab, "overdue");
    assert.equal(ctx.pageState.counts.shown, statuses.length);
    await page.selectOption("#vendor-filter", "acme_v4");
    await ready(page);
    assert.match(page.url(), /vendor=acme_v4/);
    assert.deepEqual((await pageContext(page)).pageState.filters, { vendor: "acme_v4" });
    const vendors = await page.$$eval("#invoice-table tbody tr td:nth-child(2)", (c) => c.map((x) => x.textContent));
    assert.ok(vendors.every((v) => v === "Tailspin Freight"), `vendors: ${vendors}`);

    await go(page, "/invoices");
    await page.click('#invoice-table a:text("ACME-2026-0003")');
    await ready(page);
    assert.match(page.url(), /\/invoices\/acme_inv3$/);
    assert.equal(await page.textContent("h1"), "Invoice ACME-2026-0003");
    ctx = await pageContext(page);
    assert.deepEqual(ctx.entity, { type: "invoice", id: "acme_inv3" });
    let tools = await visibleTools(page);
    assert.ok(tools.includes("invoice.get") && tools.includes("invoice.mark_paid"), `tools: ${tools}`);
    assert.equal((await hiddenTools(page))["invoice.list"], "wrong_page");
    // The panel groups the page's tools by namespace (issue 31), each with where the tool budget
    // puts it; this page is within the budget, so every tool is in the model's list or left out.
    const groups = await toolGroups(page);
    assert.deepEqual(Object.keys(groups), [...Object.keys(groups)].sort(), "namespaces in name order");
    assert.ok(groups.invoice?.includes("invoice.get") && groups.invoice.includes("invoice.mark_paid"), JSON.stringify(groups));
    assert.ok(Object.entries(groups).every(([ns, names]) => names.every((n) => n === ns || n.startsWith(`${ns}.`))),
      JSON.stringify(groups));
    assert.deepEqual(Object.values(groups).flat().sort(), [...tools].sort(), "every visible tool in one group");
    assert.match(await page.textContent("#tools-budget"), /within the budget of 30/);
    const budgets = await page.$$eval("#tools-visible li", (li) => li.map((l) => l.dataset.budget));
    assert.ok(budgets.every((b) => b === "offered" || b === "left_out"), `budgets: ${budgets}`);
    await shot(page, "invoice-detail");

    await page.click('a:text("Invoice ACME-2026-0003.pdf")');
    await ready(page);
    assert.match(page.url(), /\/documents\/acme_inv3_pdf$/);
    assert.equal((await pageContext(page)).pageType, "document_viewer");
    assert.match(await page.textContent("#page-text"), /Total 1,257\.00 EUR/);
    tools = await visibleTools(page);
    assert.ok(tools.includes("read_doc_pages") && !tools.includes("invoice.get"), `tools: ${tools}`);
    assert.equal((await hiddenTools(page))["invoice.get"], "wrong_page");

    await page.goBack();
    await ready(page);
    assert.match(page.url(), /\/invoices\/acme_inv3$/);
    assert.ok((await visibleTools(page)).includes("invoice.get"));
    await page.goBack();
    await ready(page);
    assert.match(page.url(), /\/invoices$/);
    assert.equal((await pageContext(page)).pageType, "invoice_table");
    assert.ok(!(await visibleTools(page)).includes("invoice.get"));
  });

  test("document viewer pages through a long document; matters and the library link to it", async (t) => {
    const page = await open(t);
    await go(page, "/documents");
    assert.ok((await page.$$eval("#document-table tbody tr", (r) => r.map((x) => x.dataset.id))).includes("acme_guide"));
    await shot(page, "document-library");
    await page.click('#matter-list a:text("Smith v. Jones")');
    await ready(page);
    assert.match(page.url(), /\/matters\/25e70284-6124-4a2b-9c89-abc123def456$/);
    const ctx = await pageContext(page);
    assert.deepEqual(ctx.entity, { type: "matter", id: "25e70284-6124-4a2b-9c89-abc123def456" });
    const docs = await page.$$eval("#matter-docs tbody tr", (r) => r.map((x) => x.dataset.id));
    assert.deepEqual(docs.sort(), ["smith_agreement", "smith_deposition"]);
    assert.deepEqual(ctx.pageState.visibleIds.sort(), docs);
    await shot(page, "matter-overview");

    await go(page, "/documents/acme_guide?page=41");
    assert.equal(await page.textContent("#page-no"), "Page 41 of 500");
    await page.click("#next-page");
    await ready(page);
    assert.match(page.url(), /page=42$/);
    assert.equal(await page.textContent("#page-no"), "Page 42 of 500");
    assert.deepEqual((await pageContext(page)).pageState.filters, { page: 42 });
    // The human viewer shows the page as it is; the assistant's reads are masked.
    assert.match(await page.textContent("#page-text"), /ivan\.petrov@orion-support\.example/);
    await shot(page, "document-viewer");
  });

  test("an address that is no page of the app has no context and no tools", async (t) => {
    const page = await open(t);
    const resp = await page.goto("/invoices/acme_inv3/edit");
    assert.equal(resp.status(), 404);
    await go(page, "/");
    assert.match(page.url(), /\/invoices$/);
  });
});

describe("assistant", () => {
  test("the answer grows as the model streams it, then stays the final answer", async (t) => {
    const page = await open(t);
    await go(page, "/vendors");
    // Every length the newest turn's answer has while it is still streaming.
    await page.evaluate(() => {
      window.answerLengths = [];
      new MutationObserver(() => {
        const li = [...document.querySelectorAll("#messages > li")].pop();
        if (!li || li.dataset.state !== "streaming") return;
        const n = li.querySelector(".answer")?.textContent.length ?? 0;
        if (n > 0 && window.answerLengths.at(-1) !== n) window.answerLengths.push(n);
      }).observe(document.getElementById("messages"), { subtree: true, childList: true, characterData: true });
    });
    const r = await ask(page, "what vendors do I have?");
    assert.equal(r.state, "done");
    const lengths = await page.evaluate(() => window.answerLengths);
    // Seen at many lengths before the turn was done, growing from a first few words: more than
    // the final `answer` events alone would give (eight words each, after the model finished).
    const words = r.answer.split(" ").length;
    assert.ok(new Set(lengths).size >= Math.min(8, words / 2), `${JSON.stringify(lengths)} for ${words} words`);
    assert.ok(lengths[0] < r.answer.length / 2, `${lengths[0]} of ${r.answer.length}`);
    for (const v of ["Northwind Traders", "Contoso Paper", "Tailspin Freight"]) assert.ok(r.answer.includes(v), r.answer);
  });

  test("seed 000's questions get tool-backed answers, streamed, with the page context of the page", async (t) => {
    const page = await open(t);
    const streamed = [];
    page.on("response", (r) => {
      if (r.url().endsWith("/v1/chat")) streamed.push(r.headers()["content-type"]);
    });

    await go(page, "/vendors");
    let r = await ask(page, "what vendors do I have?");
    assert.equal(r.sent.pageContext.pageType, "vendor_table");
    assert.equal(r.sent.pageContext.entity, null);
    assert.equal(r.sent.pageContext.pageState.visibleIds.length, 5);
    assert.deepEqual(r.calls, [{ tool: "vendor.list", decision: "allow", code: "" }]);
    assert.equal(r.state, "done");
    for (const v of ["Northwind Traders", "Contoso Paper", "Tailspin Freight"]) assert.ok(r.answer.includes(v), r.answer);
    await shot(page, "vendor-table");

    // Navigating changes the next turn's context and tools at once (seed 000 §7).
    await page.click('nav a:text("Invoices")');
    await ready(page);
    r = await ask(page, "which invoices are overdue?");
    assert.equal(r.sent.pageContext.pageType, "invoice_table");
    assert.deepEqual(r.calls.map((c) => [c.tool, c.decision]), [["invoice.list", "allow"]]);
    assert.match(r.answer, /ACME-2026-\d{4}/);
    assert.ok(!/Northwind Traders, Contoso Paper/.test(r.answer));

    await go(page, "/invoices/acme_inv3");
    r = await ask(page, "summarize this invoice");
    assert.deepEqual(r.sent.pageContext.entity, { type: "invoice", id: "acme_inv3" });
    const tools = r.calls.map((c) => c.tool);
    assert.ok(tools.includes("invoice.get"), `calls: ${tools}`);
    assert.ok(r.calls.every((c) => c.decision === "allow"), JSON.stringify(r.calls));
    assert.match(r.answer, /ACME-2026-0003/);
    assert.match(r.answer, /Tailspin Freight/);
    // The PDF text the assistant read is masked (the IBAN never reaches the answer).
    assert.ok(!r.answer.includes("DE89 3704"), r.answer);
    await shot(page, "invoice-detail-chat");

    await go(page, "/documents/acme_guide");
    r = await ask(page, "search for certificate rotation");
    assert.deepEqual(r.calls.map((c) => [c.tool, c.decision]), [["doc_local_search", "allow"]]);
    assert.match(r.answer, /«certificate» «rotation»/, "the answer quotes the matching pages");

    assert.ok(streamed.length >= 4 && streamed.every((c) => c.startsWith("text/event-stream")), `content types: ${streamed}`);
  });

  test("a question no visible tool answers is answered without inventing data", async (t) => {
    const page = await open(t);
    await go(page, "/vendors");
    const r = await ask(page, "summarize invoice acme_inv3");
    assert.ok(!r.calls.some((c) => c.tool === "invoice.get"), "invoice.get is not visible on the vendor table");
    assert.ok(!r.answer.includes("1,257") && !r.answer.includes("1257"), r.answer);
  });
});

describe("security", () => {
  test("spoofed requests are shown denied", async (t) => {
    const page = await open(t);
    await go(page, "/invoices/acme_inv3");
    // A call naming another invoice than the page's.
    await page.fill("#spoof-id", "acme_inv1");
    await page.click("#spoof-call");
    const first = page.locator("#probe-results > li").nth(0);
    await first.waitFor();
    assert.equal(await first.getAttribute("data-decision"), "deny");
    assert.equal(await first.getAttribute("data-code"), "ENTITY_MISMATCH");
    // The same call with the page's own id is allowed: the denial is about the id, not the tool.
    await page.fill("#spoof-id", "acme_inv3");
    await page.click("#spoof-call");
    const second = page.locator("#probe-results > li").nth(1);
    await second.waitFor();
    assert.equal(await second.getAttribute("data-decision"), "allow");
    // A page context naming another tenant's invoice.
    await page.click("#spoof-context");
    const third = page.locator("#probe-results > li").nth(2);
    await third.waitFor();
    assert.equal(await third.getAttribute("data-decision"), "deny");
    assert.equal(await third.getAttribute("data-code"), "INVALID_PAGE_CONTEXT");
    assert.ok(!(await third.textContent()).includes("Globex"), "the refusal does not reveal the other tenant's row");
    await shot(page, "spoof-denied");

    // Opening another tenant's invoice by URL: the database refuses the page itself.
    await page.goto("/invoices/glx_inv3");
    await ready(page, "error");
    assert.match(await page.textContent("#screen-error"), /INVALID_PAGE_CONTEXT/);
    assert.deepEqual(await visibleTools(page), []);

    // The same refusal for a document of another tenant in the viewer.
    await go(page, "/documents/acme_guide");
    await page.fill("#spoof-id", "glx_handbook");
    await page.click("#spoof-call");
    const doc = page.locator("#probe-results > li").last();
    await page.waitForFunction(() => document.querySelectorAll("#probe-results > li").length === 1);
    assert.equal(await doc.getAttribute("data-decision"), "deny");
    assert.equal(await doc.getAttribute("data-code"), "ENTITY_MISMATCH");
  });

  test("switching users switches tenant, data and tools", async (t) => {
    const page = await open(t);
    await go(page, "/vendors");
    const names = () => page.$$eval("#vendor-table tbody tr td:first-child", (c) => c.map((x) => x.textContent));
    assert.ok((await names()).includes("Northwind Traders"));
    await page.selectOption("#user", "carol");
    await ready(page);
    const carol = await names();
    assert.ok(carol.includes("Initech Supplies"), `carol sees ${carol}`);
    assert.ok(!carol.includes("Northwind Traders"), "no acme vendor for globex");
    const r = await ask(page, "what vendors do I have?");
    assert.ok(r.answer.includes("Initech Supplies") && !r.answer.includes("Northwind"), r.answer);
    await shot(page, "vendor-table-globex");

    // Carol on Acme's invoice: refused by the database, same message as a missing record.
    await go(page, "/invoices");
    await page.goto("/invoices/acme_inv3");
    await ready(page, "error");
    assert.match(await page.textContent("#screen-error"), /entity not found/);

    // Bob (viewer, Acme) sees the invoice but cannot be offered mark_paid: the role says why.
    await page.selectOption("#user", "bob");
    await ready(page);
    assert.equal(await page.textContent("h1"), "Invoice ACME-2026-0003");
    assert.ok((await visibleTools(page)).includes("invoice.get"));
    assert.equal((await hiddenTools(page))["invoice.mark_paid"], "missing_role");
  });

  test("four eyes: a manager approves a clerk's mark_paid above 1,000, the clerk runs it once", async (t) => {
    const page = await open(t);
    // Below the threshold (878): the clerk's call runs at once.
    await go(page, "/invoices/acme_inv2");
    assert.equal(await page.textContent("#invoice-fields .badge"), "overdue");
    assert.match(await page.getAttribute('#tools-visible li[data-tool="invoice.mark_paid"]', "data-conditions"),
      /approval_when demo\.mark_paid_needs_approval\(jsonb\); approver_roles ap_manager/);
    const small = await ask(page, "mark this invoice as paid");
    assert.deepEqual(small.calls, [{ tool: "invoice.mark_paid", decision: "allow", code: "" }]);
    assert.equal(await invoiceStatus(page, "alice", "acme_inv2"), "paid");

    // Above it (2,394): pending, and the clerk cannot run it herself.
    await go(page, "/invoices/acme_inv6");
    assert.equal(await page.textContent("#invoice-fields .badge"), "open");
    const r = await ask(page, "mark this invoice as paid");
    assert.deepEqual(r.calls, [{ tool: "invoice.mark_paid", decision: "pending", code: "APPROVAL_REQUIRED" }]);
    const card = page.locator(".approval").last();
    const callId = await card.getAttribute("data-call-id");
    assert.match(await card.textContent(), /role ap_manager/);
    await card.locator("button.approve").click();
    await page.waitForFunction((id) => document.querySelector(`.approval[data-call-id="${id}"]`)?.dataset.state !== "pending", callId);
    assert.equal(await card.getAttribute("data-state"), "not-granted");
    assert.equal(await invoiceStatus(page, "alice", "acme_inv6"), "open");
    // Nobody lists it for the clerk herself, nor for Bob (viewer, same tenant), nor Carol (other tenant).
    for (const [user, id] of [["alice", "acme_inv6"], ["bob", "acme_inv6"], ["carol", "glx_inv6"]]) {
      const list = await asUser(page, user, "/v1/approvals", { pageContext: invoicePage(id) });
      assert.deepEqual(list.body.approvals?.map((a) => a.call_id), [], `${user}: ${JSON.stringify(list.body)}`);
    }
    const bob = await approveAs(page, "bob", callId, "acme_inv6");
    assert.equal(bob.body.error?.code, "APPROVAL_INVALID", JSON.stringify(bob));
    await shot(page, "four-eyes-requested");

    // Maria (Acme, AP manager) sees it in her approvals panel and approves it (the demo switches
    // users in place, each keeping their own chat; any page of hers would do).
    await page.selectOption("#user", "maria");
    await ready(page);
    const item = page.locator(`#approvals-list li.decision[data-call-id="${callId}"]`);
    assert.match(await item.textContent(), /invoice\.mark_paid asked by alice on invoice acme_inv6/);
    await shot(page, "four-eyes-manager");
    await item.locator("button.grant").click();
    await page.waitForFunction((id) => document.querySelector(`li.decision[data-call-id="${id}"]`)?.dataset.state !== "pending", callId);
    assert.equal(await item.getAttribute("data-state"), "granted");
    // Granting ran nothing: the clerk runs it, under her own identity.
    assert.equal(await invoiceStatus(page, "maria", "acme_inv6"), "open");

    // Back to Alice: her card is still there; on the invoice's page, it runs once.
    await page.selectOption("#user", "alice");
    await ready(page);
    const again = page.locator(`.approval[data-call-id="${callId}"]`);
    await again.locator("button.approve").click();
    await page.waitForFunction((id) => !["pending", "not-granted"].includes(document.querySelector(`.approval[data-call-id="${id}"]`)?.dataset.state), callId);
    assert.equal(await again.getAttribute("data-state"), "done");
    assert.match(await again.textContent(), /"updated": 1/);
    await ready(page);
    assert.equal(await page.textContent("#invoice-fields .badge"), "paid");
    await shot(page, "four-eyes-ran");
    // Exactly once.
    const twice = await approveAs(page, "alice", callId, "acme_inv6");
    assert.equal(twice.body.error?.code, "APPROVAL_INVALID", JSON.stringify(twice));
  });

  test("four eyes: a manager rejects, and the call never runs", async (t) => {
    const page = await open(t);
    await go(page, "/invoices/acme_inv9");
    const r = await ask(page, "mark this invoice as paid");
    assert.equal(r.calls[0]?.decision, "pending");
    const callId = await page.locator(".approval").last().getAttribute("data-call-id");

    await page.selectOption("#user", "maria");
    await ready(page);
    const item = page.locator(`#approvals-list li.decision[data-call-id="${callId}"]`);
    await item.locator("input.reason").fill("vendor disputes the amount");
    await item.locator("button.reject").click();
    await page.waitForFunction((id) => document.querySelector(`li.decision[data-call-id="${id}"]`)?.dataset.state !== "pending", callId);
    assert.equal(await item.getAttribute("data-state"), "rejected");
    // Decided: no longer listed; approving it now is refused too.
    const listed = await asUser(page, "maria", "/v1/approvals", { pageContext: invoicePage("acme_inv9") });
    assert.ok(!listed.body.approvals.some((a) => a.call_id === callId), JSON.stringify(listed.body));
    const late = await approveAs(page, "maria", callId, "acme_inv9");
    assert.equal(late.body.error?.code, "APPROVAL_INVALID", JSON.stringify(late));

    await page.selectOption("#user", "alice");
    await ready(page);
    const card = page.locator(`.approval[data-call-id="${callId}"]`);
    await card.locator("button.approve").click();
    await page.waitForFunction((id) => document.querySelector(`.approval[data-call-id="${id}"]`)?.dataset.state !== "pending", callId);
    assert.equal(await card.getAttribute("data-state"), "not-granted");
    assert.equal(await invoiceStatus(page, "alice", "acme_inv9"), "open");
    await shot(page, "four-eyes-rejected");
  });

  // Issue 33, for real: Demo Notes (demo-upstream/, started by run.sh as server `notes`,
  // user_oauth) has its own authorization server; its tools answer for the user the access token
  // was issued to. Connecting goes through its sign-in page in another tab and the gateway's callback.
  test("a server needing the user's own account: Connect, sign in upstream, answers of that account, Disconnect", async (t) => {
    const alice = await open(t, "alice");
    await go(alice, "/vendors");
    await alice.waitForSelector("#connections-list li[data-server=notes][data-connected=false]");
    assert.equal(await alice.locator("#connections-list li[data-server=notes] button.connect-start").textContent(), "Connect notes");

    // Not connected: the call is refused before anything is forwarded, and the chat offers Connect.
    let r = await ask(alice, "what are my notes?");
    assert.equal(r.state, "done");
    assert.deepEqual(r.calls, [{ tool: "notes.my_notes", decision: "deny", code: "CONNECTION_REQUIRED" }]);
    let button = r.turn.locator(".connect[data-server=notes] a.connect-button");
    assert.equal(await button.textContent(), "Connect notes");
    assert.equal(await button.getAttribute("target"), "_blank");
    const href = new URL(await button.getAttribute("href"));
    assert.equal(href.origin + href.pathname, `${UPSTREAM}/authorize`);
    assert.equal(href.searchParams.get("code_challenge_method"), "S256");
    assert.equal(href.searchParams.get("redirect_uri"), `${BASE}/v1/connections/callback`);
    assert.ok(!r.answer.includes(href.searchParams.get("state")), "the model never sees the connect URL");
    await shotOf(r.turn, "connect-required");

    await connectAs(alice, button, "alice");
    await alice.waitForSelector("#connections-list li[data-server=notes][data-connected=true]");
    assert.equal(await alice.textContent("#connections-list li[data-server=notes] .connection-status"), "connected");
    await shotOf(alice.locator("#connections-box"), "connections-panel");

    r = await ask(alice, "what are my notes?");
    assert.deepEqual(r.calls, [{ tool: "notes.my_notes", decision: "allow", code: "" }]);
    assert.match(r.answer, /Notes of alice \(3 in Demo Notes\)/);
    assert.ok(r.answer.includes("Contoso Paper") && !r.answer.includes("Globex"), r.answer);
    // No token in the answer (Demo Notes' tokens are 43 base64url characters).
    assert.ok(!/[A-Za-z0-9_-]{40,}/.test(r.answer), r.answer);

    // Carol of Globex: alice's connection is not hers; she connects her own and gets her own notes.
    const carol = await open(t, "carol");
    await go(carol, "/vendors");
    await carol.waitForSelector("#connections-list li[data-server=notes][data-connected=false]");
    r = await ask(carol, "what are my notes?");
    assert.deepEqual(r.calls, [{ tool: "notes.my_notes", decision: "deny", code: "CONNECTION_REQUIRED" }]);
    await connectAs(carol, r.turn.locator(".connect[data-server=notes] a.connect-button"), "carol");
    await carol.waitForSelector("#connections-list li[data-server=notes][data-connected=true]");
    r = await ask(carol, "what are my notes?");
    assert.deepEqual(r.calls, [{ tool: "notes.my_notes", decision: "allow", code: "" }]);
    assert.match(r.answer, /Notes of carol \(2 in Demo Notes\)/);
    assert.ok(r.answer.includes("Globex offsite") && !r.answer.includes("Contoso") && !r.answer.includes("alice"), r.answer);
    // And alice still gets hers.
    r = await ask(alice, "what are my notes?");
    assert.match(r.answer, /Notes of alice/);
    assert.ok(!r.answer.includes("Globex"), r.answer);

    // Disconnect: deleted here, revoked at Demo Notes; the next call needs a connection again.
    await go(alice, "/vendors");
    await alice.locator("#connections-list li[data-server=notes] button.disconnect").click();
    await alice.waitForSelector("#connections-list li[data-server=notes][data-connected=false]");
    assert.equal(await alice.textContent("#connections-list li[data-server=notes] .connection-status"), "disconnected");
    if (UPSTREAM_LOG) assert.match(readFileSync(UPSTREAM_LOG, "utf8"), /revoke: refresh_token/);
    r = await ask(alice, "what are my notes?");
    assert.deepEqual(r.calls, [{ tool: "notes.my_notes", decision: "deny", code: "CONNECTION_REQUIRED" }]);
    assert.equal(await r.turn.locator(".connect[data-server=notes] a.connect-button").count(), 1);
    await go(alice, "/vendors");
    await alice.waitForSelector("#connections-list li[data-server=notes][data-connected=false]");
    // Carol's connection is untouched.
    r = await ask(carol, "what are my notes?");
    assert.deepEqual(r.calls, [{ tool: "notes.my_notes", decision: "allow", code: "" }]);
    assert.match(r.answer, /Notes of carol/);
    await go(carol, "/vendors");
    await carol.locator("#connections-list li[data-server=notes] button.disconnect").click();
    await carol.waitForSelector("#connections-list li[data-server=notes][data-connected=false]");

    // The upstream's log names users, never a code or a token.
    if (UPSTREAM_LOG) assert.ok(!/[A-Za-z0-9_-]{40,}/.test(readFileSync(UPSTREAM_LOG, "utf8")), "a token in the upstream's log");
  });

  // What the real flow cannot show: only the user's own (user_oauth) connections are listed (a
  // tenant's shared secret is not the user's to connect), each with its state, and a Connect from
  // the panel asks the gateway for a connect URL. The gateway's answers are stubbed here.
  test("the connections panel lists only the user's own connections", async (t) => {
    const page = await open(t);
    await page.route("**/v1/connections", (route) => route.fulfill({
      status: 200, contentType: "application/json",
      body: JSON.stringify({ connections: [
        { server: "drive", mode: "user_oauth", connected: true, expiresAt: null },
        { server: "crm", mode: "user_oauth", connected: false, expiresAt: null },
        { server: "ledgerapi", mode: "tenant_secret", connected: true, expiresAt: null },
      ] }),
    }));
    let started = null;
    await page.route("**/v1/connections/crm", (route) => {
      started = route.request().url();
      route.fulfill({ status: 422, contentType: "application/json", body: JSON.stringify({ error: { code: "UNPROCESSABLE", message: "stub" } }) });
    });
    await go(page, "/invoices");
    const items = page.locator("#connections-list li.connection");
    assert.deepEqual(await items.evaluateAll((l) => l.map((i) => [i.dataset.server, i.dataset.connected])),
      [["drive", "true"], ["crm", "false"]], "only the user's own (user_oauth) connections, with their state");
    assert.equal(await page.locator("#connections-list li[data-server=drive] button.disconnect").count(), 1);
    await page.locator("#connections-list li[data-server=crm] button.connect-start").click();
    await page.waitForFunction(() => /refused/.test(document.querySelector("#connections-list li[data-server=crm] .connection-status").textContent));
    assert.ok(started?.endsWith("/v1/connections/crm"), started);
  });
});
