// ctxguard demo app: a screen-aware assistant beside an invoice/document app.
//
// No framework and no build step. A small router maps real URLs to page types; a store holds what
// a Redux store holds in seed 000's app (user, route, filters, tab, visible ids, counts). Every chat
// message carries the page context built from that store; the database decides everything else.
// All text from the server is rendered with textContent, never as HTML.

const USER_KEY = "ctxguard-demo-user";

const store = {
  user: null,        // {id, name, tenant, roles}
  token: null,
  tokenUntil: 0,
  route: null,       // {pageType, entity, query}
  pageState: {},     // what the screen shows: visibleIds, filters, tab, counts
  conversationId: crypto.randomUUID(),
  loadSeq: 0,
  tools: {},         // this page's tools by name, as GET /v1/tools describes them (conditions too)
  chats: new Map(),  // each demo user's chat so far ({nodes, conversationId}), kept across switches
};

// ---------------------------------------------------------------- DOM helpers

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const $ = (id) => document.getElementById(id);
const link = (href, ...children) => h("a", { href, "data-link": true }, ...children);
const money = (amount, currency) =>
  `${Number(amount).toLocaleString("en-US", { minimumFractionDigits: 2 })} ${currency || "EUR"}`;
const badge = (text, kind = text) => h("span", { class: `badge badge-${kind}` }, text);

// ---------------------------------------------------------------- routes

// URL → page context pieces. Unknown paths have no page type (the app shows "not found" and the
// assistant gets no context at all: fail closed).
function parseRoute(loc) {
  const q = new URLSearchParams(loc.search);
  const parts = loc.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  const [a, b] = parts;
  if (parts.length === 0) return { redirect: "/invoices" };
  if (a === "vendors" && !b) return { pageType: "vendor_table", entity: null, query: q };
  if (a === "invoices" && !b) return { pageType: "invoice_table", entity: null, query: q };
  if (a === "invoices" && b && parts.length === 2)
    return { pageType: "invoice_detail", entity: { type: "invoice", id: b }, query: q };
  if (a === "documents" && !b) return { pageType: "document_library", entity: null, query: q };
  if (a === "documents" && b && parts.length === 2)
    return { pageType: "document_viewer", entity: { type: "document", id: b }, query: q };
  if (a === "matters" && b && parts.length === 2)
    return { pageType: "matter_overview", entity: { type: "matter", id: b }, query: q };
  return { pageType: null, entity: null, query: q };
}

// The filters and tab a screen is opened with come from its URL (so they survive reload and
// back/forward); the visible ids and counts are filled in once the screen has rendered.
function initialPageState(route) {
  const q = route.query;
  switch (route.pageType) {
    case "invoice_table": {
      const filters = {};
      if (q.get("vendor")) filters.vendor = q.get("vendor");
      return { tab: q.get("tab") || "all", filters };
    }
    case "document_viewer":
      return { filters: { page: Math.max(1, parseInt(q.get("page") || "1", 10) || 1) } };
    default:
      return {};
  }
}

function pageContext() {
  const r = store.route;
  return { pageType: r.pageType, entity: r.entity, pageState: store.pageState };
}

function navigate(href, replace = false) {
  if (replace) history.replaceState(null, "", href);
  else history.pushState(null, "", href);
  load();
}

// ---------------------------------------------------------------- API

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function token() {
  if (store.token && Date.now() < store.tokenUntil) return store.token;
  const r = await fetch("/demo/token", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ user: store.user.id }),
  });
  const body = await r.json();
  if (!r.ok) throw new ApiError(r.status, body.error?.code, body.error?.message);
  store.token = body.token;
  store.tokenUntil = Date.now() + (body.expiresIn - 60) * 1000;
  return store.token;
}

async function api(path, body, accept = "application/json") {
  return fetch(path, {
    method: "POST",
    headers: {
      authorization: `Bearer ${await token()}`,
      "content-type": "application/json",
      accept,
    },
    body: JSON.stringify(body),
  });
}

async function apiJson(path, body) {
  const r = await api(path, body);
  const out = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, out.error?.code || `HTTP_${r.status}`, out.error?.message || r.statusText);
  return out;
}

// ---------------------------------------------------------------- screens

const screens = {
  vendor_table(data) {
    const rows = data.vendors.map((v) =>
      h("tr", { dataset: { id: v.id } },
        h("td", {}, link(`/invoices?vendor=${encodeURIComponent(v.id)}`, v.name)),
        h("td", {}, v.country), h("td", {}, v.email), h("td", { class: "num" }, v.unpaid)));
    return {
      title: "Vendors",
      body: [
        h("table", { class: "grid", id: "vendor-table" },
          h("thead", {}, h("tr", {}, h("th", {}, "Vendor"), h("th", {}, "Country"), h("th", {}, "Billing e-mail"), h("th", { class: "num" }, "Unpaid invoices"))),
          h("tbody", {}, rows)),
      ],
      state: { visibleIds: data.vendors.map((v) => v.id), counts: { vendors: data.vendors.length } },
    };
  },

  invoice_table(data) {
    const q = new URLSearchParams();
    if (data.vendor) q.set("vendor", data.vendor);
    const tabHref = (t) => {
      const p = new URLSearchParams(q);
      if (t !== "all") p.set("tab", t);
      const s = p.toString();
      return `/invoices${s ? `?${s}` : ""}`;
    };
    const tabs = h("div", { class: "tabs", role: "tablist" },
      ["all", "open", "overdue", "paid"].map((t) =>
        h("a", { href: tabHref(t), "data-link": true, role: "tab", class: t === data.tab ? "active" : "", "aria-selected": t === data.tab ? "true" : "false", dataset: { tab: t } },
          `${t[0].toUpperCase()}${t.slice(1)} `, h("span", { class: "count" }, data.tabs[t]))));
    const vendorFilter = h("select", {
      id: "vendor-filter",
      "aria-label": "Vendor",
      onchange: (e) => {
        const p = new URLSearchParams();
        if (e.target.value) p.set("vendor", e.target.value);
        if (data.tab !== "all") p.set("tab", data.tab);
        const s = p.toString();
        navigate(`/invoices${s ? `?${s}` : ""}`);
      },
    }, h("option", { value: "" }, "All vendors"),
    data.vendors.map((v) => h("option", { value: v.id, selected: v.id === data.vendor }, v.name)));
    const rows = data.invoices.map((i) =>
      h("tr", { dataset: { id: i.id } },
        h("td", {}, link(`/invoices/${encodeURIComponent(i.id)}`, i.number)),
        h("td", {}, i.vendor), h("td", { class: "num" }, money(i.amount, i.currency)),
        h("td", {}, badge(i.status)), h("td", {}, i.dueOn)));
    return {
      title: "Invoices",
      body: [
        h("div", { class: "toolbar" }, tabs, h("label", {}, "Vendor ", vendorFilter)),
        rows.length
          ? h("table", { class: "grid", id: "invoice-table" },
            h("thead", {}, h("tr", {}, h("th", {}, "Number"), h("th", {}, "Vendor"), h("th", { class: "num" }, "Amount"), h("th", {}, "Status"), h("th", {}, "Due"))),
            h("tbody", {}, rows))
          : h("p", { class: "muted" }, "No invoices match."),
      ],
      state: {
        tab: data.tab,
        filters: data.vendor ? { vendor: data.vendor } : {},
        visibleIds: data.invoices.map((i) => i.id),
        counts: { shown: data.invoices.length, ...data.tabs },
      },
    };
  },

  invoice_detail(data) {
    const inv = data.invoice;
    const field = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
    return {
      title: `Invoice ${inv.number}`,
      back: link("/invoices", "← Invoices"),
      body: [
        h("dl", { class: "fields", id: "invoice-fields" },
          field("Vendor", `${inv.vendor.name} (${inv.vendor.country})`),
          field("Amount", money(inv.amount, inv.currency)),
          field("Status", badge(inv.status)),
          field("Issued", inv.issued_on), field("Due", inv.due_on)),
        h("h3", {}, "Documents"),
        inv.documents.length
          ? h("ul", { class: "docs" }, inv.documents.map((d) =>
            h("li", {}, link(`/documents/${encodeURIComponent(d.doc_id)}`, d.title), " ", badge(d.status))))
          : h("p", { class: "muted" }, "No documents."),
      ],
      state: { visibleIds: inv.documents.map((d) => d.doc_id), counts: { documents: inv.documents.length } },
    };
  },

  document_viewer(data) {
    const d = data.document;
    const page = data.page?.page ?? 0;
    const back = d.entityType === "invoice"
      ? link(`/invoices/${encodeURIComponent(d.entityId)}`, "← Invoice")
      : d.entityType === "matter"
        ? link(`/matters/${encodeURIComponent(d.entityId)}`, "← Matter")
        : link("/documents", "← Documents");
    const go = (n) => `/documents/${encodeURIComponent(d.id)}?page=${n}`;
    return {
      title: d.title,
      back,
      body: [
        h("div", { class: "pager" },
          page > 1 ? h("a", { href: go(page - 1), "data-link": true, id: "prev-page" }, "‹ Previous") : h("span", { class: "muted" }, "‹ Previous"),
          h("span", { id: "page-no" }, d.pages ? `Page ${page} of ${d.pages}` : "No pages yet"),
          page < d.pages ? h("a", { href: go(page + 1), "data-link": true, id: "next-page" }, "Next ›") : h("span", { class: "muted" }, "Next ›"),
          badge(d.status)),
        data.page ? h("pre", { class: "paper", id: "page-text" }, data.page.text) : h("p", { class: "muted" }, "This document is still being processed."),
      ],
      state: { filters: { page: page || 1 }, visibleIds: [d.id], counts: { pages: d.pages } },
    };
  },

  matter_overview(data) {
    return {
      title: data.matter.name,
      back: link("/documents", "← Documents"),
      body: [
        h("h3", {}, "Documents of this matter"),
        h("table", { class: "grid", id: "matter-docs" },
          h("thead", {}, h("tr", {}, h("th", {}, "Document"), h("th", { class: "num" }, "Pages"), h("th", {}, "Status"))),
          h("tbody", {}, data.documents.map((d) =>
            h("tr", { dataset: { id: d.id } },
              h("td", {}, link(`/documents/${encodeURIComponent(d.id)}`, d.title)),
              h("td", { class: "num" }, d.pages), h("td", {}, badge(d.status)))))),
      ],
      state: { visibleIds: data.documents.map((d) => d.id), counts: { documents: data.documents.length } },
    };
  },

  document_library(data) {
    const owner = (d) => d.entityType === "invoice"
      ? link(`/invoices/${encodeURIComponent(d.entityId)}`, `invoice ${d.entityId}`)
      : d.entityType === "matter"
        ? link(`/matters/${encodeURIComponent(d.entityId)}`, data.matters.find((m) => m.id === d.entityId)?.name || "matter")
        : "—";
    return {
      title: "Documents",
      body: [
        h("h3", {}, "Matters"),
        data.matters.length
          ? h("ul", { class: "docs", id: "matter-list" }, data.matters.map((m) => h("li", {}, link(`/matters/${encodeURIComponent(m.id)}`, m.name))))
          : h("p", { class: "muted" }, "No matters."),
        h("h3", {}, "All documents"),
        h("table", { class: "grid", id: "document-table" },
          h("thead", {}, h("tr", {}, h("th", {}, "Document"), h("th", {}, "Belongs to"), h("th", { class: "num" }, "Pages"), h("th", {}, "Status"))),
          h("tbody", {}, data.documents.map((d) =>
            h("tr", { dataset: { id: d.id } },
              h("td", {}, link(`/documents/${encodeURIComponent(d.id)}`, d.title)),
              h("td", {}, owner(d)), h("td", { class: "num" }, d.pages), h("td", {}, badge(d.status)))))),
      ],
      state: { visibleIds: data.documents.map((d) => d.id), counts: { documents: data.documents.length, matters: data.matters.length } },
    };
  },
};

// Seed 000's questions, offered per page (any question can be typed).
const SUGGESTIONS = {
  vendor_table: ["what vendors do I have?"],
  invoice_table: ["which invoices are overdue?", "list open invoices"],
  invoice_detail: ["summarize this invoice", "mark this invoice as paid"],
  document_viewer: ["search for certificate rotation", "read pages 1 to 2"],
  matter_overview: ["what documents are in this matter?"],
  document_library: ["what documents do we have?"],
};

// Requests a compromised model or a tampered client would send, per page.
const PROBES = {
  invoice_detail: { tool: "invoice.get", param: "invoice_id", other: { acme: "acme_inv1", globex: "glx_inv1" } },
  document_viewer: { tool: "read_doc_metadata", param: "doc_id", other: { acme: "smith_agreement", globex: "acme_guide" } },
};

// ---------------------------------------------------------------- loading a page

async function load() {
  const seq = ++store.loadSeq;
  delete document.body.dataset.ready;
  const route = parseRoute(location);
  if (route.redirect) return navigate(route.redirect, true);
  store.route = route;
  store.pageState = initialPageState(route);
  for (const a of document.querySelectorAll("[data-nav]"))
    a.classList.toggle("active", a.dataset.nav === route.pageType ||
      (a.dataset.nav === "invoice_table" && route.pageType === "invoice_detail") ||
      (a.dataset.nav === "document_library" && ["document_viewer", "matter_overview"].includes(route.pageType)));
  const screen = $("screen");
  document.body.dataset.pageType = route.pageType || "none";
  renderSuggestions(route.pageType);
  if (!route.pageType) {
    screen.replaceChildren(h("h1", {}, "Not found"), h("p", { class: "muted" }, "No screen lives at this address."));
    renderNoContext("No page context: this address is not a page of the app, so the assistant has no tools.");
    document.body.dataset.ready = "error";
    return;
  }
  screen.replaceChildren(h("p", { class: "muted" }, "Loading…"));
  let out;
  try {
    out = await apiJson("/demo/page", { pageContext: pageContext() });
  } catch (e) {
    if (seq !== store.loadSeq) return;
    screen.replaceChildren(h("h1", {}, "Not available"),
      h("p", { class: "error", id: "screen-error" }, h("code", {}, e.code || "ERROR"), " ", e.message));
    renderNoContext("The database refused this page context, so the assistant has no tools here.");
    document.body.dataset.ready = "error";
    return;
  }
  if (seq !== store.loadSeq) return;
  const view = screens[route.pageType](out.data);
  store.pageState = { ...store.pageState, ...view.state };
  screen.replaceChildren(
    view.back ? h("p", { class: "back" }, view.back) : "",
    h("h1", {}, view.title),
    ...view.body);
  document.title = `${view.title} · ctxguard demo`;
  await renderTools(seq);
  await renderApprovals(seq);
  await renderConnections(seq);
  renderProbes();
  if (seq === store.loadSeq) document.body.dataset.ready = "1";
}

function renderNoContext(text) {
  $("page-desc").textContent = text;
  $("page-context").textContent = "(none)";
  $("tools-visible").replaceChildren();
  $("tools-budget").textContent = "";
  $("tools-hidden").replaceChildren();
  $("probes").replaceChildren();
  $("approvals-list").replaceChildren();
  $("connections-list").replaceChildren();
}

async function renderTools(seq) {
  $("page-context").textContent = JSON.stringify(pageContext(), null, 2);
  let out;
  try {
    out = await apiJson("/v1/tools", { pageContext: pageContext() });
  } catch (e) {
    renderNoContext(`${e.code}: ${e.message}`);
    return;
  }
  if (seq !== store.loadSeq) return;
  $("page-desc").textContent = out.page?.description || "";
  store.tools = Object.fromEntries(out.tools.map((t) => [t.name, t]));
  const flag = (t) => [
    t.readOnly === false ? badge("writes", "write") : badge("read-only", "ro"),
    t.requiresApproval ? badge("needs approval", "approval") : null,
    !t.requiresApproval && /approval_when/.test(t.conditions || "") ? badge("may need approval", "approval") : null,
    approverRoles(t.name) ? badge(`four eyes: ${approverRoles(t.name)}`, "approval") : null,
  ];
  // The visible tools grouped by namespace (in the order the namespaces come, by name), each
  // with where the tool budget puts it: in the model's list, or reachable through find_tools.
  const budget = out.budget || {};
  $("tools-budget").textContent = budget.compact
    ? `${budget.visibleTools} tools here, over the budget of ${budget.limit}: the assistant sees ` +
      `${(budget.offered || []).length - 1} of them and finds the others with find_tools.`
    : `${budget.visibleTools ?? ""} tools here, within the budget of ${budget.limit ?? ""}.`;
  const standing = (t) => t.budget === "find_tools" ? badge("via find_tools", "find")
    : t.budget === "left_out" ? badge("not offered", "left-out") : null;
  const visible = out.tools.filter((t) => t.visible);
  const about = Object.fromEntries((out.namespaces || []).map((n) => [n.name, n]));
  const groups = new Map();
  for (const t of visible) {
    const ns = t.namespace || t.name;
    if (!groups.has(ns)) groups.set(ns, []);
    groups.get(ns).push(t);
  }
  $("tools-visible").replaceChildren(...[...groups.keys()].sort().map((ns) =>
    h("section", { class: "ns-group", dataset: { namespace: ns }, title: about[ns]?.description || "" },
      h("h4", {}, h("code", {}, ns), about[ns]?.title ? ` ${about[ns].title}` : "", " ",
        h("span", { class: "muted" }, `(${groups.get(ns).length})`)),
      h("ul", { class: "tools" }, ...groups.get(ns).map((t) =>
        h("li", { dataset: { tool: t.name, budget: t.budget || "", conditions: t.conditions || "" }, title: [t.description, t.conditions].filter(Boolean).join("\n") },
          h("code", {}, t.name), " ", flag(t), " ", standing(t)))))));
  $("tools-hidden").replaceChildren(...out.tools.filter((t) => !t.visible).map((t) =>
    h("li", { dataset: { tool: t.name, reason: t.reason } }, h("code", {}, t.name), " ", h("span", { class: "reason" }, t.reason))));
}

function renderSuggestions(pageType) {
  $("suggestions").replaceChildren(...(SUGGESTIONS[pageType] || []).map((s) =>
    h("button", { type: "button", class: "chip", onclick: () => send(s) }, s)));
}

// ---------------------------------------------------------------- chat (streamed)

async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: JSON.parse(data.join("\n")) };
    }
  }
}

function toolCallRow(c) {
  return h("li", { class: `call call-${c.decision}`, dataset: { tool: c.tool, decision: c.decision, code: c.code || "" } },
    h("code", {}, c.tool), " ", h("span", { class: "args" }, JSON.stringify(c.arguments)), " → ",
    badge(c.decision), c.code ? [" ", h("code", { class: "code" }, c.code)] : null);
}

// The roles a tool's policy names as approvers (four eyes), from its conditions; "" if none.
function approverRoles(tool) {
  return (store.tools[tool]?.conditions || "").match(/approver_roles ([^;]+)/)?.[1] || "";
}

// The requester's card for a call waiting for an approval. Without approver roles the user's own
// click runs it (once); with them (four eyes) someone else holding one of the roles grants or
// rejects it first (the approvals panel), and the requester's click then runs it, once.
function approvalCard(c) {
  const approvers = approverRoles(c.tool);
  const waiting = approvers ? `waiting for a user with role ${approvers} to approve; run it here once approved`
    : "waiting for your approval";
  const status = h("span", { class: "approval-status" }, waiting);
  const button = h("button", {
    type: "button",
    class: "approve",
    onclick: async () => {
      button.disabled = true;
      status.textContent = "running…";
      const refused = (code) => {
        if (approvers && code === "APPROVAL_INVALID") {
          // Not granted (yet), rejected or expired: the database does not say which.
          status.textContent = `not run: ${code} (not approved yet, rejected, or expired)`;
          card.dataset.state = "not-granted";
          button.disabled = false;
        } else {
          status.textContent = `refused: ${code}`;
          card.dataset.state = "refused";
        }
      };
      try {
        const env = await apiJson(`/v1/approvals/${encodeURIComponent(c.callId)}`, { pageContext: pageContext() });
        if (env.status === "ok") {
          status.textContent = "approved: ran once";
          card.dataset.state = "done";
          card.append(h("pre", { class: "result" }, JSON.stringify(env.result, null, 2)));
          load();
        } else {
          refused(env.error?.code);
        }
      } catch (e) {
        refused(e.code);
      }
    },
  }, approvers ? `Run ${c.tool}` : `Approve ${c.tool}`);
  const card = h("div", { class: "approval", dataset: { callId: c.callId, state: "pending", fourEyes: approvers ? "1" : "" } },
    h("strong", {}, c.tool), " ", h("span", { class: "args" }, JSON.stringify(c.arguments)), " ", button, " ", status);
  return card;
}

// ---------------------------------------------------------------- approvals (four eyes)

// What the signed-in user may approve or reject: other users' calls, of this tenant, whose policy
// names one of the user's roles as approvers (ctxguard.pending_approvals(), arguments masked).
async function renderApprovals(seq) {
  let out;
  try {
    out = await apiJson("/v1/approvals", { pageContext: pageContext() });
  } catch (e) {
    $("approvals-list").replaceChildren(h("li", { class: "muted" }, `${e.code}: ${e.message}`));
    return;
  }
  if (seq !== store.loadSeq) return;
  const list = out.approvals || [];
  $("approvals-box").dataset.count = String(list.length);
  $("approvals-list").replaceChildren(...(list.length ? list.map(decisionItem)
    : [h("li", { class: "muted empty" }, "Nothing is waiting for your approval.")]));
}

function decisionItem(a) {
  const status = h("span", { class: "decision-status" }, "");
  const reason = h("input", { class: "reason", placeholder: "reason (optional)", maxlength: "500", "aria-label": "Reason" });
  const decide = async (path, body, done) => {
    for (const b of item.querySelectorAll("button")) b.disabled = true;
    try {
      const env = await apiJson(path, { pageContext: pageContext(), ...body });
      if (env.status === done) {
        item.dataset.state = done;
        status.textContent = done === "granted" ? `approved: ${a.requested_by} can now run it, once` : "rejected";
      } else {
        item.dataset.state = "refused";
        status.textContent = `refused: ${env.error?.code}`;
      }
    } catch (e) {
      item.dataset.state = "refused";
      status.textContent = `refused: ${e.code}`;
    }
  };
  const id = encodeURIComponent(a.call_id);
  const item = h("li", { class: "decision", dataset: { callId: a.call_id, tool: a.tool, state: "pending" } },
    h("div", {}, h("strong", {}, a.tool), " asked by ", h("code", {}, a.requested_by),
      a.entity_id ? [" on ", h("code", {}, `${a.entity_type} ${a.entity_id}`)] : null),
    h("div", { class: "args" }, JSON.stringify(a.args)),
    h("div", {},
      h("button", { type: "button", class: "grant", onclick: () => decide(`/v1/approvals/${id}`, {}, "granted") }, "Approve"), " ",
      reason, " ",
      h("button", { type: "button", class: "reject", onclick: () => decide(`/v1/approvals/${id}/reject`, { reason: reason.value || undefined }, "rejected") }, "Reject"),
      " ", status));
  return item;
}

async function send(text) {
  const message = text.trim();
  if (!message || !store.route?.pageType) return;
  const input = $("chat-input");
  input.value = "";
  const calls = h("ul", { class: "calls" });
  const answer = h("div", { class: "answer" });
  const approvals = h("div", { class: "approvals" });
  const where = store.route.entity ? `${store.route.pageType} · ${store.route.entity.type} ${store.route.entity.id}` : store.route.pageType;
  const item = h("li", { class: "turn", dataset: { state: "streaming", pageType: store.route.pageType } },
    h("div", { class: "question" }, message), h("div", { class: "where" }, `sent from ${where}`), calls, approvals, answer);
  $("messages").append(item);
  item.scrollIntoView({ block: "end" });
  $("chat-send").disabled = true;
  try {
    const r = await api("/v1/chat", { message, pageContext: pageContext(), conversationId: store.conversationId }, "text/event-stream");
    if (!r.ok || !(r.headers.get("content-type") || "").includes("text/event-stream")) {
      const body = await r.json().catch(() => ({}));
      throw new ApiError(r.status, body.error?.code || `HTTP_${r.status}`, body.error?.message || r.statusText);
    }
    // `answer_delta`s show the answer as the model writes it (already cleaned by the gateway);
    // `answer_reset` drops what they showed (the model went on to call tools); the `answer`
    // events that follow are the final answer, which replaces them.
    let final = false;
    for await (const { event, data } of sseEvents(r)) {
      if (event === "tool_call") {
        calls.append(toolCallRow(data));
        if (data.decision === "pending" && data.callId) approvals.append(approvalCard(data));
      } else if (event === "answer_delta") {
        answer.textContent += data.delta;
      } else if (event === "answer_reset") {
        answer.textContent = "";
      } else if (event === "connection_required") {
        approvals.append(connectCard(data));
      } else if (event === "answer") {
        if (!final) answer.textContent = "";
        final = true;
        answer.textContent += data.text;
      } else if (event === "done") {
        item.dataset.state = "done";
      } else if (event === "error") {
        throw new ApiError(0, data.error?.code, data.error?.message);
      }
    }
  } catch (e) {
    item.dataset.state = "error";
    answer.replaceChildren(h("span", { class: "error" }, h("code", {}, e.code || "ERROR"), " ", e.message));
  } finally {
    // A stream that ends without `done` (a dropped connection) is not shown as finished.
    if (item.dataset.state === "streaming") item.dataset.state = "incomplete";
    $("chat-send").disabled = false;
  }
}

// ---------------------------------------------------------------- connections (issue 33)

// A tool's server needs the user's own account (the chat stream's `connection_required` event:
// {server, connectUrl}). The URL, minted for this user only, opens the upstream's sign-in; the
// model never sees it. After connecting, asking again works.
function connectCard({ server, connectUrl }) {
  const card = h("div", { class: "connect", dataset: { server, state: "required" } },
    h("span", {}, `${server} needs your own account.`), " ");
  if (connectUrl) {
    card.append(h("a", {
      class: "connect-button", href: connectUrl, target: "_blank", rel: "noopener noreferrer",
      onclick: () => { card.dataset.state = "opened"; setTimeout(() => renderConnections(store.loadSeq), 3000); },
    }, `Connect ${server}`));
  } else {
    card.append(h("span", { class: "muted" }, "(its sign-in is not reachable right now)"));
  }
  return card;
}

// The user's connections (POST /v1/connections: servers with credentials of their own or their
// tenant's), each user_oauth one with Connect or Disconnect.
async function renderConnections(seq) {
  let out;
  try {
    out = await apiJson("/v1/connections", { pageContext: pageContext() });
  } catch (e) {
    $("connections-list").replaceChildren(h("li", { class: "muted" }, `${e.code}: ${e.message}`));
    return;
  }
  if (seq !== store.loadSeq) return;
  const list = (out.connections || []).filter((c) => c.mode === "user_oauth");
  $("connections-list").replaceChildren(...(list.length ? list.map(connectionItem)
    : [h("li", { class: "muted empty" }, "No server here needs an account of your own.")]));
}

function connectionItem(c) {
  const status = h("span", { class: "connection-status" }, c.connected ? "connected" : "not connected");
  const item = h("li", { class: "connection", dataset: { server: c.server, connected: String(!!c.connected) } },
    h("code", {}, c.server), " ", status, " ");
  const server = encodeURIComponent(c.server);
  if (c.connected) {
    item.append(h("button", {
      type: "button", class: "disconnect",
      onclick: async (e) => {
        e.target.disabled = true;
        try {
          const env = await apiJson(`/v1/connections/${server}/disconnect`, { pageContext: pageContext() });
          if (env.disconnected) {
            item.dataset.connected = "false";
            status.textContent = "disconnected";
            e.target.remove();
          }
        } catch (err) {
          status.textContent = `refused: ${err.code}`;
        }
      },
    }, "Disconnect"));
  } else {
    item.append(h("button", {
      type: "button", class: "connect-start",
      onclick: async () => {
        try {
          const env = await apiJson(`/v1/connections/${server}`, { pageContext: pageContext() });
          window.open(env.authorizeUrl, "_blank", "noopener");
        } catch (err) {
          status.textContent = `refused: ${err.code}`;
        }
      },
    }, `Connect ${c.server}`));
  }
  return item;
}

// ---------------------------------------------------------------- probes ("try to break it")

function probeResult(label, decision, code, message) {
  $("probe-results").append(h("li", { class: `probe-result call-${decision}`, dataset: { decision, code: code || "" } },
    h("div", {}, label), badge(decision), " ", h("code", { class: "code" }, code || ""), " ", h("span", { class: "muted" }, message || "")));
}

function renderProbes() {
  const r = store.route;
  const box = $("probes");
  box.replaceChildren();
  const probe = PROBES[r.pageType];
  if (!probe) {
    box.append(h("p", { class: "muted" }, "Open an invoice or a document to try spoofing its id."));
    return;
  }
  const other = probe.other[store.user.tenant] || "";
  const idInput = h("input", { id: "spoof-id", value: other === r.entity.id ? `${other}x` : other, "aria-label": "Spoofed id" });
  box.append(h("form", {
    class: "probe-form",
    onsubmit: async (e) => {
      e.preventDefault();
      const label = `${probe.tool}(${probe.param}: "${idInput.value}") on ${r.entity.type} ${r.entity.id}`;
      try {
        const out = await apiJson("/internal/mcp/execute", {
          tool_name: probe.tool, arguments: { [probe.param]: idInput.value }, pageContext: pageContext(),
        });
        probeResult(label, out.status === "ok" ? "allow" : "deny", out.error?.code, out.error?.message);
      } catch (err) {
        probeResult(label, "deny", err.code, err.message);
      }
    },
  }, h("label", {}, `Call ${probe.tool} with ${probe.param} = `, idInput), " ",
  h("button", { type: "submit", id: "spoof-call" }, "Send spoofed call")));

  const foreign = { acme: { invoice: "glx_inv3", document: "glx_handbook" }, globex: { invoice: "acme_inv3", document: "acme_guide" } };
  const otherTenantId = foreign[store.user.tenant]?.[r.entity.type];
  if (otherTenantId) {
    box.append(h("button", {
      type: "button",
      id: "spoof-context",
      onclick: async () => {
        const label = `chat with a tampered page context: ${r.entity.type} ${otherTenantId} (another tenant's)`;
        const ctx = { ...pageContext(), entity: { type: r.entity.type, id: otherTenantId } };
        const resp = await api("/v1/chat", { message: "summarize this", pageContext: ctx });
        const body = await resp.json().catch(() => ({}));
        if (resp.ok) probeResult(label, "allow", "", "");
        else probeResult(label, "deny", body.error?.code, body.error?.message);
      },
    }, `Tamper the page context with another tenant's ${r.entity.type}`));
  }
}

// ---------------------------------------------------------------- users

// Each demo user keeps their own chat (and the approval cards in it) across switches, as if each
// had the app open in a window of their own.
async function setUser(id, users) {
  if (store.user) store.chats.set(store.user.id, { nodes: [...$("messages").childNodes], conversationId: store.conversationId });
  store.user = users.find((u) => u.id === id) || users[0];
  store.token = null;
  const kept = store.chats.get(store.user.id);
  store.conversationId = kept?.conversationId || crypto.randomUUID();
  sessionStorage.setItem(USER_KEY, store.user.id);
  $("user").value = store.user.id;
  document.body.dataset.tenant = store.user.tenant;
  $("messages").replaceChildren(...(kept?.nodes || []));
  $("probe-results").replaceChildren();
}

async function main() {
  const { users } = await (await fetch("/demo/users")).json();
  $("user").replaceChildren(...users.map((u) => h("option", { value: u.id }, u.name)));
  await setUser(sessionStorage.getItem(USER_KEY) || users[0].id, users);
  $("user").addEventListener("change", async (e) => {
    await setUser(e.target.value, users);
    load();
  });
  document.addEventListener("click", (e) => {
    const a = e.target.closest("a[data-link]");
    if (!a || e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    navigate(a.getAttribute("href"));
  });
  window.addEventListener("popstate", load);
  // Connecting happens in another tab (the upstream's sign-in, then the gateway's callback page):
  // coming back to this one shows the connections as they are now.
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && store.route?.pageType) renderConnections(store.loadSeq);
  });
  $("chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    send($("chat-input").value);
  });
  load();
}

main();
