"""Issue 33: MCP clients (the official Python SDK) calling a user_oauth tool without the user's
connection (tests/credentials/run.sh, after the oauth phases: nobody is connected to drive).

- a 2025-11-25 session without elicitation: the CONNECTION_REQUIRED tool error carries the user's
  own connect URL (structured content and _meta); connecting through it makes the retry work;
- a 2025-11-25 session whose client declares elicitation: a URL-mode elicitation/create with the
  connect URL and an elicitation id, then the tool error naming the elicitation; retry works;
- 2026-07-28 (stateless): an input_required result whose URL elicitation the SDK hands to the
  callback, which connects; the SDK's retry works; a declined one answers the error, no loop.
The scripted browser signs in at the upstream's authorization server as the user the URL is for.
"""

import base64
import http.cookiejar
import json
import os
import re
import urllib.parse
import urllib.request

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

GW = os.environ["CTXGUARD_CREDS_GW"]
AS = os.environ["CTXGUARD_CREDS_AS"]
WORK = os.environ["CTXGUARD_CREDS_WORK"]
TOK = {k: os.environ[f"TOK_{k.upper()}"] for k in ("alice", "mallory", "carol", "bob")}
PAGE = base64.urlsafe_b64encode(json.dumps({"pageType": "invoice_table"}).encode()).decode().rstrip("=")
META = "io.ctxguard/connectionRequired"


def check(cond, what, detail=""):
    if not cond:
        raise SystemExit(f"FAIL: {what} {detail}")
    print(f"ok - {what}")


def record(obj):
    with open(os.path.join(WORK, "answers.jsonl"), "a") as f:
        f.write(json.dumps(obj, default=str) + "\n")


def browse(url, login):
    """Complete the authorization in a scripted browser signed in as `login`; the last page."""
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    page = browser.open(url, timeout=30)
    for _ in range(4):
        html = page.read().decode()
        form = re.search(r'<form method="post" action="([^"]+)">', html)
        if not form:
            return html
        fields = {"login": login} if "/login" in form.group(1) else {}
        page = browser.open(AS + form.group(1), data=urllib.parse.urlencode(fields).encode(), timeout=30)
    raise SystemExit("FAIL: the sign-in did not end")


def text(result):
    return " ".join(getattr(c, "text", "") for c in result.content)


def client_for(user, mode, elicitation_callback=None):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOK[user]}", "X-Ctxguard-Page": PAGE}, timeout=30)
    return http, Client(streamable_http_client(f"{GW}/mcp", http_client=http), mode=mode,
                        elicitation_callback=elicitation_callback)


async def main():
    # A session without elicitation: the URL in the tool error, mallory's own.
    http, client = client_for("mallory", "legacy")
    async with http, client:
        check(client.protocol_version == "2025-11-25", "a session client (2025-11-25)", client.protocol_version)
        r = await client.call_tool("drive__whoami", {})
        record(r.model_dump(by_alias=True))
        err = (r.structured_content or {}).get("error", {})
        check(r.is_error and err.get("code") == "CONNECTION_REQUIRED" and err.get("server") == "drive",
              "no connection: CONNECTION_REQUIRED naming the server", r)
        url = err.get("connectUrl", "")
        check(url.startswith(AS + "/") and (r.meta or {}).get(META, {}).get("connectUrl") == url,
              "the tool error carries the connect URL in structured content and _meta", r)
        r2 = await client.call_tool("drive__whoami", {})
        check(r2.structured_content["error"]["connectUrl"] != url, "each refusal mints its own single-use URL")
        html = await anyio.to_thread.run_sync(browse, url, "mallory")
        check("Connected" in html, "mallory connects through the URL she got", html[:300])
        check(text(await client.call_tool("drive__whoami", {})) == "you are mallory of acme",
              "mallory's retried call works, with her own token")

    # A session with URL elicitation: alice is asked to open the URL, connects, retries.
    seen = []

    async def connect_alice(context, params):
        seen.append(params)
        html = await anyio.to_thread.run_sync(browse, params.url, "alice")
        check("Connected" in html, "alice connects through the elicited URL")
        return types.ElicitResult(action="accept")

    http, client = client_for("alice", "legacy", connect_alice)
    async with http, client:
        r = await client.call_tool("drive__whoami", {})
        record(r.model_dump(by_alias=True))
        check(len(seen) == 1 and seen[0].mode == "url" and seen[0].url.startswith(AS + "/") and seen[0].elicitation_id,
              "a URL-mode elicitation with the connect URL and an elicitation id", seen)
        err = r.structured_content["error"]
        check(r.is_error and err["code"] == "CONNECTION_REQUIRED" and err["elicitationId"] == seen[0].elicitation_id
              and err["action"] == "accept" and "connectUrl" not in err,
              "then the tool error names the elicitation (the URL went to the client only)", r)
        check(text(await client.call_tool("drive__whoami", {})) == "you are alice of acme",
              "alice's retried call works, with her own token")

    # 2026-07-28: input_required; the SDK hands the URL elicitation to the callback and retries.
    seen.clear()

    async def connect_carol(context, params):
        seen.append(params)
        html = await anyio.to_thread.run_sync(browse, params.url, "carol")
        check("Connected" in html, "carol connects through the input request's URL")
        return types.ElicitResult(action="accept")

    http, client = client_for("carol", "auto", connect_carol)
    async with http, client:
        check(client.protocol_version == "2026-07-28", "a stateless client (2026-07-28)", client.protocol_version)
        r = await client.call_tool("drive__whoami", {})
        record(r.model_dump(by_alias=True))
        check(len(seen) == 1 and seen[0].mode == "url" and seen[0].url.startswith(AS + "/"),
              "input_required carries a URL elicitation of the connect URL", seen)
        check(not r.is_error and text(r) == "you are carol of globex", "the SDK's retry works, with carol's own token", r)

    async def decline(context, params):
        seen.append(params)
        return types.ElicitResult(action="decline")

    seen.clear()
    http, client = client_for("bob", "auto", decline)
    async with http, client:
        r = await client.call_tool("drive__whoami", {})
        record(r.model_dump(by_alias=True))
        err = (r.structured_content or {}).get("error", {})
        check(len(seen) == 1 and r.is_error and err.get("code") == "CONNECTION_REQUIRED" and err["connectUrl"].startswith(AS + "/"),
              "declined: the retry answers the tool error with the URL, no second round", r)

    # Nobody got anyone else's connection.
    http, client = client_for("bob", "legacy")
    async with http, client:
        r = await client.call_tool("drive__whoami", {})
        check(r.is_error and r.structured_content["error"]["code"] == "CONNECTION_REQUIRED", "bob still has none")


anyio.run(main)
