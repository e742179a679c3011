#!/usr/bin/env python3
"""A realistic bench catalog for the reachability benchmark (bench/reachability.sh): about 1,000
DBA tools over 100 page types of a business app, and two upstream MCP servers of 100 tools each.

bench/scale_setup.sql's synthetic tools ("List the notes of the records shown on this page
(synthetic tool 42)") are too alike to write requests against, so this writes tools as a product
team would: 10 domains of 5 record kinds each; every record kind has a table page (`<kind>_table`)
and a detail page (`<kind>_detail`, entity `<kind>`). Visible on a page:
  - the kind's own tools: 8 on its table page, 10 on its detail page (bound to the entity there);
  - the domain's 6 tools, on all 10 of the domain's pages;
  - 40 app-wide tools, on every page;
  - upstream server `chat` (100 tools) on domains 0-6, server `drive` (100 tools) on domains 3-9.
So a page sees 54-56 of the DBA's tools and 100 or 200 upstream ones: far over the 24 offered.

Writes JSON to stdout: {"pages": {page_type: {"entity": kind|null, "tools": [names]}},
"tools": [{"name", "description", "server", "entity_type", "params"}]}. Deterministic.
"""
import json
import sys

# domain -> [(kind, plural, label, fields, party)]
DOMAINS = {
    "payables": [("invoice", "invoices", "supplier invoice", "amount due, due date and payment status", "vendor"),
                 ("vendor", "vendors", "vendor", "bank details, payment terms and tax id", "vendor contact"),
                 ("payment", "payments", "outgoing payment", "amount, value date and remittance reference", "payee"),
                 ("expense", "expenses", "employee expense claim", "amount, category and receipt", "employee"),
                 ("credit_note", "credit_notes", "credit note", "amount, reason and linked invoice", "vendor")],
    "sales": [("customer", "customers", "customer account", "industry, owner and lifetime revenue", "account owner"),
              ("quote", "quotes", "sales quote", "line items, discount and expiry date", "customer"),
              ("order", "orders", "sales order", "line items, totals and delivery date", "customer"),
              ("lead", "leads", "sales lead", "source, score and stage", "lead"),
              ("opportunity", "opportunities", "sales opportunity", "stage, value and close date", "account owner")],
    "inventory": [("product", "products", "product", "sku, price and stock level", "product manager"),
                  ("warehouse", "warehouses", "warehouse", "address, capacity and bins", "warehouse manager"),
                  ("stock_move", "stock_moves", "stock transfer", "quantities, source and destination", "warehouse manager"),
                  ("supplier_item", "supplier_items", "supplier catalogue item", "supplier price and lead time", "supplier"),
                  ("batch", "batches", "production batch", "lot number, expiry and quality status", "quality lead")],
    "hr": [("employee", "employees", "employee record", "job title, manager and contract", "employee"),
           ("leave_request", "leave_requests", "leave request", "dates, type and approval status", "employee"),
           ("job_opening", "job_openings", "job opening", "title, team and salary band", "hiring manager"),
           ("candidate", "candidates", "job candidate", "resume, stage and interview scores", "candidate"),
           ("review", "reviews", "performance review", "ratings, goals and comments", "employee")],
    "support": [("ticket", "tickets", "support ticket", "priority, status and assignee", "requester"),
                ("article", "articles", "help center article", "title, body and audience", "author"),
                ("sla_policy", "sla_policies", "service level policy", "response and resolution targets", "support lead"),
                ("macro", "macros", "reply macro", "text, actions and usage count", "support lead"),
                ("survey", "surveys", "satisfaction survey", "questions, responses and score", "requester")],
    "projects": [("project", "projects", "project", "budget, timeline and members", "project owner"),
                 ("task", "tasks", "task", "assignee, due date and status", "assignee"),
                 ("milestone", "milestones", "milestone", "target date and deliverables", "project owner"),
                 ("timesheet", "timesheets", "timesheet", "hours, project and week", "employee"),
                 ("risk", "risks", "project risk", "likelihood, impact and mitigation", "risk owner")],
    "legal": [("contract", "contracts", "contract", "parties, term and renewal date", "counterparty"),
              ("matter", "matters", "legal matter", "client, court and deadlines", "lead counsel"),
              ("nda", "ndas", "non-disclosure agreement", "parties, scope and expiry", "counterparty"),
              ("policy_doc", "policy_docs", "company policy document", "owner, version and review date", "policy owner"),
              ("claim", "claims", "insurance claim", "incident, amount and status", "claimant")],
    "marketing": [("campaign", "campaigns", "marketing campaign", "channel, budget and audience", "campaign owner"),
                  ("newsletter", "newsletters", "newsletter issue", "subject, segment and send time", "editor"),
                  ("segment", "segments", "audience segment", "rules and member count", "marketer"),
                  ("landing_page", "landing_pages", "landing page", "url, copy and conversion rate", "marketer"),
                  ("event", "events", "marketing event", "venue, date and registrations", "event manager")],
    "it": [("device", "devices", "company laptop or phone", "serial number, owner and warranty", "owner"),
           ("license", "licenses", "software license", "seats, vendor and renewal", "it admin"),
           ("incident", "incidents", "it incident", "severity, service and timeline", "on-call engineer"),
           ("change_request", "change_requests", "change request", "risk, window and approvers", "change manager"),
           ("access_request", "access_requests", "access request", "system, role and justification", "requester")],
    "finance": [("budget", "budgets", "department budget", "lines, owner and fiscal year", "budget owner"),
                ("journal_entry", "journal_entries", "journal entry", "debit and credit lines and period", "accountant"),
                ("bank_account", "bank_accounts", "bank account", "iban, balance and statements", "treasurer"),
                ("asset", "assets", "fixed asset", "cost, depreciation and location", "asset owner"),
                ("tax_return", "tax_returns", "tax return", "period, jurisdiction and amounts", "tax manager")],
}

# Detail page tools (bound to the entity): (suffix, description template).
DETAIL = [
    ("get", "Get this {label} with its {fields}."),
    ("update", "Update fields of this {label}, such as its {fields}."),
    ("add_note", "Add an internal note to this {label}; notes are visible to colleagues only."),
    ("history", "Show the change history of this {label}: who changed what and when."),
    ("attachments", "List the files attached to this {label}."),
    ("email_party", "Email the {party} of this {label}, with a link to it."),
    ("assign", "Assign this {label} to a colleague, who is notified."),
    ("archive", "Archive this {label}; it leaves the default lists but can be restored."),
    ("duplicate", "Create a copy of this {label} as a new draft."),
    ("related", "List the records linked to this {label}."),
]
# Table page tools: (suffix, description template).
TABLE = [
    ("search", "Search the {plural_label} by keyword and filters."),
    ("create", "Create a new {label}."),
    ("export_csv", "Export the {plural_label} in the current view as a CSV file."),
    ("count", "Count the {plural_label} matching the current filters, grouped by status."),
    ("bulk_update", "Change a field on every selected {label} at once."),
    ("import", "Import {plural_label} from a spreadsheet upload."),
    ("saved_views", "List the saved filters and views of this table."),
    ("stale", "Find {plural_label} not touched in 30 days or more."),
]
DOMAIN_TOOLS = [
    ("dashboard", "Show the {domain} dashboard with its key figures for this month."),
    ("report", "Build a {domain} report for a date range, as a table or chart."),
    ("settings", "Read the {domain} module settings, such as numbering and defaults."),
    ("audit_log", "List recent actions in the {domain} module and who took them."),
    ("approvals_queue", "List the {domain} items waiting for your approval."),
    ("forecast", "Project the {domain} figures for the next quarter from past trends."),
]
GLOBAL = [
    ("app.global_search", "Search all records in the app by keyword."),
    ("app.my_profile", "Show your user profile: name, roles, team and time zone."),
    ("app.notifications", "List your unread notifications."),
    ("app.mark_notifications_read", "Mark all your notifications as read."),
    ("app.recent_items", "List the records you opened recently."),
    ("app.favorites", "List the records you starred as favorites."),
    ("app.add_favorite", "Star the record on this page as a favorite."),
    ("app.help_search", "Search the product documentation and how-to guides."),
    ("app.contact_support", "Open a conversation with the app's support team."),
    ("app.keyboard_shortcuts", "List the keyboard shortcuts of the app."),
    ("app.change_language", "Change the language of the app's interface."),
    ("app.change_timezone", "Change your time zone for dates and reminders."),
    ("app.theme", "Switch between the light and dark color theme."),
    ("app.whats_new", "Show the release notes of the latest app version."),
    ("app.feedback", "Send product feedback or a feature idea to the product team."),
    ("app.print_page", "Prepare a printable version of this page."),
    ("app.share_link", "Copy a shareable link to this page for a colleague."),
    ("app.team_directory", "Look up a colleague's email, phone and team."),
    ("app.org_chart", "Show the organisation chart around a person."),
    ("app.calendar_today", "List your meetings and deadlines for today."),
    ("app.create_reminder", "Set a reminder for yourself at a date and time."),
    ("app.list_reminders", "List your upcoming reminders."),
    ("app.todo_list", "Show your personal to-do list."),
    ("app.add_todo", "Add an item to your personal to-do list."),
    ("app.delegate_access", "Let a colleague act on your behalf while you are away."),
    ("app.out_of_office", "Turn your out-of-office status on or off."),
    ("app.api_tokens", "List your personal API tokens and when they were last used."),
    ("app.sessions", "List your signed-in devices and sessions."),
    ("app.sign_out_everywhere", "Sign out of every other device and session."),
    ("app.two_factor", "Show whether two-factor authentication is on for your account."),
    ("app.usage_stats", "Show how much of the plan's seats and storage the company uses."),
    ("app.billing_plan", "Show the company's subscription plan and next renewal."),
    ("app.currency_convert", "Convert an amount between currencies at today's rate."),
    ("app.holiday_calendar", "List the public holidays of an office location."),
    ("app.office_locations", "List the company's offices with addresses."),
    ("app.announcements", "Show company-wide announcements."),
    ("app.bookmark_page", "Bookmark this page in the sidebar."),
    ("app.translate_text", "Translate a short text into another language."),
    ("app.summarize_page", "Summarize what is shown on this page."),
    ("app.undo_last", "Undo your last change in the app, if still possible."),
]
CHAT_OBJECTS = [
    ("channel", "channels", "a chat channel"), ("message", "messages", "a chat message"),
    ("thread", "threads", "a reply thread"), ("reaction", "reactions", "an emoji reaction on a message"),
    ("status", "statuses", "your chat status"), ("reminder", "reminders", "a chat reminder"),
    ("call", "calls", "a voice or video call"), ("upload", "uploads", "a file shared in chat"),
    ("bookmark", "bookmarks", "a channel bookmark"), ("pin", "pins", "a pinned message"),
    ("user_group", "user_groups", "a user group that can be mentioned"), ("emoji", "emojis", "a custom emoji"),
    ("workflow", "workflows", "an automated chat workflow"), ("poll", "polls", "a poll in a channel"),
    ("scheduled", "scheduled_messages", "a message scheduled for later"), ("dm", "dms", "a direct conversation"),
    ("invite", "invites", "an invitation to the workspace"), ("topic", "topics", "a channel's topic"),
    ("canvas", "canvases", "a shared canvas document"), ("huddle", "huddles", "a quick audio huddle"),
]
DRIVE_OBJECTS = [
    ("file", "files", "a file in the drive"), ("folder", "folders", "a folder"),
    ("shared_drive", "shared_drives", "a team shared drive"), ("permission", "permissions", "a sharing permission"),
    ("comment", "comments", "a comment on a file"), ("revision", "revisions", "a saved version of a file"),
    ("shortcut", "shortcuts", "a shortcut to a file"), ("label", "labels", "a file label"),
    ("sheet", "sheets", "a spreadsheet"), ("doc", "docs", "a text document"),
    ("slides", "slide_decks", "a presentation"), ("trash", "trashed_files", "a file in the trash"),
    ("star", "starred_files", "a starred file"), ("upload_session", "upload_sessions", "a large file upload"),
    ("link", "links", "a public download link"), ("owner", "owners", "the owner of a file"),
    ("activity", "activities", "recent activity on files"), ("quota", "quotas", "storage quota"),
    ("template", "templates", "a document template"), ("form", "forms", "an online form"),
]
VERBS = [("list", "List {plural} ({what_plural})."), ("get", "Get the details of {what}."),
         ("create", "Create {what}."), ("update", "Change {what}."), ("delete", "Delete {what}.")]


def words(kind):
    return kind.replace("_", " ")


def main():
    tools, pages = [], {}
    for d, (domain, kinds) in enumerate(DOMAINS.items()):
        domain_tools = []
        for suffix, desc in DOMAIN_TOOLS:
            name = f"{domain}.{suffix}"
            tools.append({"name": name, "description": desc.format(domain=domain), "server": None,
                          "entity_type": None, "params": ["date_range"] if suffix in ("report", "forecast") else []})
            domain_tools.append(name)
        for kind, plural, label, fields, party in kinds:
            plural_label = label + "s" if not label.endswith("y") else label[:-1] + "ies"
            if label == "company laptop or phone":
                plural_label = "company laptops and phones"
            fmt = dict(label=label, plural_label=plural_label, fields=fields, party=party)
            detail, table = [], []
            for suffix, desc in DETAIL:
                name = f"{kind}.{suffix}"
                tools.append({"name": name, "description": desc.format(**fmt), "server": None,
                              "entity_type": kind, "params": [f"{kind}_id"]})
                detail.append(name)
            for suffix, desc in TABLE:
                name = f"{plural}.{suffix}"
                tools.append({"name": name, "description": desc.format(**fmt), "server": None,
                              "entity_type": None, "params": ["query"] if suffix == "search" else []})
                table.append(name)
            upstream = (["chat"] if d <= 6 else []) + (["drive"] if d >= 3 else [])
            common = domain_tools + [g for g, _ in GLOBAL]
            pages[f"{kind}_table"] = {"entity": None, "domain": domain, "tools": table + common, "servers": upstream}
            pages[f"{kind}_detail"] = {"entity": kind, "domain": domain, "tools": detail + common, "servers": upstream}
    for name, desc in GLOBAL:
        tools.append({"name": name, "description": desc, "server": None, "entity_type": None, "params": []})
    for server, objects in (("chat", CHAT_OBJECTS), ("drive", DRIVE_OBJECTS)):
        for obj, plural, what in objects:
            what_plural = what.replace("a ", "", 1).replace("an ", "", 1)
            for verb, desc in VERBS:
                tools.append({"name": f"{server}.{verb}_{obj}", "server": server, "entity_type": None,
                              "description": desc.format(plural=words(plural), what=what, what_plural=what_plural),
                              "params": []})
    names = [t["name"] for t in tools]
    assert len(names) == len(set(names)), "duplicate tool names"
    for p in pages.values():
        p["tools"] += [t["name"] for t in tools if t["server"] in p["servers"]]
    json.dump({"pages": pages, "tools": tools}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
