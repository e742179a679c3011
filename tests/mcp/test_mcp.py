"""ctxguard's /mcp driven by the official MCP Python SDK, with MCPServer upstreams (tests/mcp/run.sh).

The gateway, the database and the upstream servers are real; nothing here is mocked.
"""

import base64
import json
import os
import pwd
import subprocess
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError

GW = os.environ["CTXGUARD_MCP_URL"]
WORK = Path(os.environ["CTXGUARD_MCP_WORK"])
ALICE, BOB, CAROL = os.environ["TOK_ALICE"], os.environ["TOK_BOB"], os.environ["TOK_CAROL"]
DANA = os.environ["TOK_DANA"]  # only the two-session page test uses her
VENDORS = {"pageType": "vendor_table"}
INV3 = {"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}
INV4 = {"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv4"}}
TABLE = {"pageType": "invoice_table", "pageState": {"tab": "open"}}
GLX3 = {"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv3"}}

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def page_header(page):
    """The documented header; base64url so any page (also non-ASCII) fits in a header."""
    raw = json.dumps(page).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@asynccontextmanager
async def connect(token, page=None, mode="legacy", on_message=None):
    headers = {"Authorization": f"Bearer {token}"}
    if page is not None:
        headers["X-Ctxguard-Page"] = page_header(page)
    http = httpx2.AsyncClient(headers=headers, timeout=20)
    async with http:
        client = Client(streamable_http_client(f"{GW}/mcp", http_client=http), mode=mode, message_handler=on_message)
        async with client:
            yield client, http


async def names(client):
    return {t.name for t in (await client.list_tools()).tools}


def error_code(result):
    assert result.is_error, result
    return result.structured_content["error"]["code"]


def upstream_calls(server):
    path = WORK / server / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def admin_sql(sql):
    out = subprocess.run(["psql", "-X", "-qAt", "-v", "ON_ERROR_STOP=1", os.environ["CTXGUARD_ADMIN_PSQL"]],
                         input=sql, check=True, capture_output=True, text=True)
    return out.stdout.strip()


# --- raw HTTP (what no SDK sends) --------------------------------------------------------------

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602


def hdrs(token, page=None, sid=None, **extra):
    h = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
         "Authorization": f"Bearer {token}", "MCP-Protocol-Version": "2025-11-25"}
    if page is not None:
        h["X-Ctxguard-Page"] = page_header(page)
    if sid is not None:
        h["Mcp-Session-Id"] = sid
    h.update(extra)
    return h


def answer(r):
    """The JSON-RPC answer in a response: a JSON body, or the SSE event carrying it."""
    if r.headers.get("content-type", "").startswith("application/json"):
        return r.json()
    for line in r.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            msg = json.loads(line[5:])
            if "id" in msg:
                return msg
    raise AssertionError(f"no JSON-RPC answer in {r.status_code} {r.text!r}")


async def open_session(http, token, page=None):
    r = await http.post(f"{GW}/mcp", json=INIT, headers=hdrs(token, page))
    assert r.status_code == 200, r.text
    sid = r.headers["mcp-session-id"]
    r = await http.post(f"{GW}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                        headers=hdrs(token, page, sid))
    assert r.status_code == 202, r.text
    return sid


async def list_raw(http, token, sid, page=None):
    return await http.post(f"{GW}/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                           headers=hdrs(token, page, sid))


def metric(name):
    text = httpx2.get(f"{GW}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{"))


# --- sessions belong to their user ------------------------------------------------------------

async def test_a_session_answers_only_the_user_who_opened_it():
    async with httpx2.AsyncClient(timeout=20) as http:
        sid = await open_session(http, ALICE, INV3)
        assert (await list_raw(http, ALICE, sid)).status_code == 200
        for other in (BOB, CAROL):  # the same tenant's other user, another tenant's
            r = await list_raw(http, other, sid)
            assert r.status_code == 404 and r.json()["error"]["data"]["code"] == "SESSION_NOT_FOUND"
            r = await http.get(f"{GW}/mcp", headers=hdrs(other, sid=sid))
            assert r.status_code == 404, "no one else can open the session's stream"
            r = await http.delete(f"{GW}/mcp", headers=hdrs(other, sid=sid))
            assert r.status_code == 404, "nor end it"
            r = await http.post(f"{GW}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                                headers=hdrs(other, INV4, sid))
            assert r.status_code == 404
        # Untouched: still alice's, on her page.
        r = await list_raw(http, ALICE, sid)
        assert r.status_code == 200 and "invoice__get" in {t["name"] for t in answer(r)["result"]["tools"]}
        # The same 404 as for an id that never existed, and for hers once ended.
        assert (await list_raw(http, ALICE, "f" * 64)).status_code == 404
        r = await http.delete(f"{GW}/mcp", headers=hdrs(ALICE, sid=sid))
        assert r.status_code in (200, 202), r.text
        assert (await http.delete(f"{GW}/mcp", headers=hdrs(ALICE, sid=sid))).status_code == 404
        assert (await list_raw(http, ALICE, sid)).status_code == 404
    assert sid not in (WORK / "gateway.log").read_text(), "session ids never reach the logs"


async def test_origin_and_host_are_checked_with_json_refusals():
    async with httpx2.AsyncClient(timeout=20) as http:
        r = await http.post(f"{GW}/mcp", json=INIT, headers=hdrs(ALICE, Origin="http://evil.example.com"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "ORIGIN_NOT_ALLOWED"
        r = await http.post(f"{GW}/mcp", json=INIT, headers=hdrs(ALICE, Host="evil.example.com"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "HOST_NOT_ALLOWED"
        # Refused before authentication: no token needed to be told.
        r = await http.post(f"{GW}/mcp", json=INIT, headers={"Origin": "null", "Content-Type": "application/json"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "ORIGIN_NOT_ALLOWED"
        # Positive controls: the configured origin, and no origin (a non-browser client).
        for extra in ({"Origin": "http://app.test:8080"}, {}):
            r = await http.post(f"{GW}/mcp", json=INIT, headers=hdrs(ALICE, **extra))
            assert r.status_code == 200, (extra, r.text)
            await http.delete(f"{GW}/mcp", headers=hdrs(ALICE, sid=r.headers["mcp-session-id"]))


async def test_metadata_and_challenge_come_from_the_public_url():
    public = os.environ["CTXGUARD_MCP_PUBLIC_URL"]
    async with httpx2.AsyncClient(timeout=20) as http:
        r = await http.post(f"{GW}/mcp", json=INIT, headers={**hdrs("x"), "Host": "localhost"})
        challenge = r.headers["www-authenticate"]
        assert f'resource_metadata="{public}/.well-known/oauth-protected-resource/mcp"' in challenge
        meta = (await http.get(f"{GW}/.well-known/oauth-protected-resource/mcp")).json()
        assert meta["resource"] == f"{public}/mcp"
        assert meta["resource_documentation"].startswith(("http://", "https://"))
        root = (await http.get(f"{GW}/.well-known/oauth-protected-resource")).json()
        assert root["resource"] == public, "the root metadata describes the origin it is served for"


# --- JSON-RPC errors per the spec ----------------------------------------------------------------

@pytest.mark.parametrize("body,status,code", [
    (b"{not json", 400, PARSE_ERROR),
    (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', 400, INVALID_REQUEST),
    (b'{"jsonrpc":"2.0","id":1}', 400, INVALID_REQUEST),
    (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', 400, INVALID_REQUEST),
    (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{}}', 200, INVALID_PARAMS),
    (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":42}}', 200, INVALID_PARAMS),
    (b'{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"cursor":7}}', 200, INVALID_PARAMS),
])
async def test_malformed_messages_get_their_json_rpc_codes(body, status, code):
    async with httpx2.AsyncClient(timeout=20) as http:
        sid = await open_session(http, ALICE, INV3)
        r = await http.post(f"{GW}/mcp", content=body, headers=hdrs(ALICE, sid=sid))
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code
        await http.delete(f"{GW}/mcp", headers=hdrs(ALICE, sid=sid))


async def test_bad_cursors_and_unknown_methods_are_refused_in_the_session():
    async with httpx2.AsyncClient(timeout=20) as http:
        sid = await open_session(http, ALICE, INV3)
        r = await http.post(f"{GW}/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "tools/list",
                                               "params": {"cursor": "not-a-cursor"}}, headers=hdrs(ALICE, sid=sid))
        assert answer(r)["error"]["code"] == INVALID_PARAMS
        r = await http.post(f"{GW}/mcp", json={"jsonrpc": "2.0", "id": 4, "method": "no/such"},
                            headers=hdrs(ALICE, sid=sid))
        assert answer(r)["error"]["code"] == METHOD_NOT_FOUND
        # Positive control: the same session lists.
        assert "result" in answer(await list_raw(http, ALICE, sid))
        await http.delete(f"{GW}/mcp", headers=hdrs(ALICE, sid=sid))


async def test_the_2025_03_26_revision_with_batches_is_not_offered():
    async with httpx2.AsyncClient(timeout=20) as http:
        init = json.loads(json.dumps(INIT))
        init["params"]["protocolVersion"] = "2025-03-26"
        h = hdrs(ALICE)
        del h["MCP-Protocol-Version"]
        r = await http.post(f"{GW}/mcp", json=init, headers=h)
        assert r.status_code == 200, r.text
        assert answer(r)["result"]["protocolVersion"] != "2025-03-26"
        await http.delete(f"{GW}/mcp", headers=hdrs(ALICE, sid=r.headers["mcp-session-id"]))


# --- every listed name can be called -------------------------------------------------------------

async def test_a_catalog_name_with_double_underscores_is_listed_and_callable():
    async with connect(ALICE, VENDORS) as (client, _):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "vendor__report__daily" in tools, "vendor.report__daily on the wire"
        assert tools["vendor__report__daily"].title == "Daily vendor report", "the catalog's title"
        r = await client.call_tool("vendor__report__daily", {})
        assert not r.is_error, r
        # The same call by its catalog name; a name that is no tool's wire form is not found.
        assert not (await client.call_tool("vendor.report__daily", {})).is_error
        assert error_code(await client.call_tool("vendor__report__nightly", {})) == "TOOL_NOT_FOUND"
    audit = admin_sql("SELECT count(*) FROM ctxguard.audit_log WHERE tool = 'vendor.report__daily' AND decision = 'allow'")
    assert int(audit) >= 2


def test_register_tool_refuses_a_name_that_looks_like_another_on_the_wire():
    out = subprocess.run(
        ["psql", "-X", "-qAt", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose", os.environ["CTXGUARD_ADMIN_PSQL"]],
        input=r"""\set VERBOSITY verbose
SELECT ctxguard.register_tool('vendor.report.daily', 'Collides with vendor.report__daily on the wire.',
    '{"type": "object"}', 'demo.vendor_list(jsonb)', '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}');""",
        capture_output=True, text=True)
    assert out.returncode != 0
    assert "42710" in out.stderr, out.stderr
    assert admin_sql("SELECT count(*) FROM ctxguard.tools WHERE name = 'vendor.report.daily'") == "0"


# --- pages without fights --------------------------------------------------------------------------

async def test_two_sessions_of_one_user_keep_their_own_pages_without_a_storm():
    watches = [list_changed_watch() for _ in range(3)]
    async with connect(DANA, INV3, on_message=watches[0][1]) as (a, a_http), \
            connect(DANA, INV4, on_message=watches[1][1]) as (b, _):
        for _ in range(3):  # clients that re-list on every change would flip a shared page here
            assert (await a.call_tool("invoice__get", {})).structured_content["id"] == "acme_inv3"
            assert (await b.call_tool("invoice__get", {})).structured_content["id"] == "acme_inv4"
            await names(a), await names(b)
        sent = metric("ctxguard_mcp_list_changed_total")
        # A moves to another screen: A alone is told, once; B keeps its page.
        a_http.headers["X-Ctxguard-Page"] = page_header(TABLE)
        assert "invoice__list" in await names(a)
        with anyio.fail_after(10):
            await watches[0][0].wait()
        assert "invoice__list" in await names(a), "re-listing after the notification"
        assert (await b.call_tool("invoice__get", {})).structured_content["id"] == "acme_inv4"
        assert not watches[1][0].is_set()
        assert metric("ctxguard_mcp_list_changed_total") - sent == 1
        # The app moves the user's shared page: only a session without its own page follows it.
        async with connect(DANA, None, on_message=watches[2][1]) as (c, _):
            assert await names(c) == set()
            async with httpx2.AsyncClient() as app:
                r = await app.put(f"{GW}/v1/context", json=VENDORS, headers={"Authorization": f"Bearer {DANA}"})
                assert r.status_code == 200
            with anyio.fail_after(10):
                await watches[2][0].wait()
            assert "vendor__list" in await names(c)
        assert metric("ctxguard_mcp_list_changed_total") - sent == 2, "a and b were not told"
        assert not watches[1][0].is_set()
        assert "invoice__list" in await names(a) and "invoice__get" in await names(b)


# --- sessions stay while their stream is open ------------------------------------------------------

async def test_a_streaming_session_outlives_the_idle_timeout_and_an_expired_one_reinitializes():
    async with httpx2.AsyncClient(timeout=30) as http:
        kept = await open_session(http, ALICE, INV3)
        lines = []
        keepalive = anyio.Event()

        async def read_stream():
            async with http.stream("GET", f"{GW}/mcp", headers=hdrs(ALICE, sid=kept)) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    lines.append(line)
                    if line.startswith(":"):
                        keepalive.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_stream)
            with anyio.fail_after(10):
                await keepalive.wait()  # keep-alive comments flow on the open stream
            idle = await open_session(http, ALICE, INV3)  # opened after `kept` was last used
            # Wait for the server to end the idle session (the event: its expiry, seen in
            # /metrics); a check that finds it still alive counts as use and the wait goes on.
            deadline = time.monotonic() + 30
            while True:
                expired = metric("ctxguard_mcp_sessions_expired_total")
                while metric("ctxguard_mcp_sessions_expired_total") == expired:
                    assert time.monotonic() < deadline, "the idle session never expired"
                    await anyio.sleep(0.1)
                if (await list_raw(http, ALICE, idle)).status_code == 404:
                    break
            r = await list_raw(http, ALICE, kept)
            assert r.status_code == 200, "the session with an open stream is alive"
            tg.cancel_scope.cancel()
    # The expired session's client starts over cleanly.
    async with connect(ALICE, INV3) as (client, _):
        assert "invoice__get" in await names(client)


# --- the binary ----------------------------------------------------------------------------------

@pytest.mark.parametrize("flag,expect", [("--help", "Usage:"), ("--version", "ctxguard-gateway ")])
def test_help_and_version_need_no_configuration(flag, expect):
    out = subprocess.run([os.environ["CTXGUARD_GATEWAY_BIN"], flag], env={"PATH": os.environ["PATH"]},
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    assert expect in out.stdout


# --- authentication -------------------------------------------------------------------------

@pytest.mark.parametrize("token", [None, "not-a-jwt", os.environ["TOK_FORGED"], os.environ["TOK_EXPIRED"]])
async def test_bad_tokens_get_401_with_a_bearer_challenge(token):
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    async with httpx2.AsyncClient() as http:
        r = await http.post(f"{GW}/mcp", json=body, headers=headers)
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer ")
        assert "resource_metadata=" in r.headers["www-authenticate"]
        assert ('error="invalid_token"' in r.headers["www-authenticate"]) == (token is not None)
        meta = (await http.get(f"{GW}/.well-known/oauth-protected-resource/mcp")).json()
        assert meta["resource"].endswith("/mcp") and meta["bearer_methods_supported"] == ["header"]


async def test_the_sdk_client_fails_to_connect_with_a_forged_token():
    # What the README promises: 401 with the UNAUTHENTICATED code, before any session exists.
    async with httpx2.AsyncClient() as http:
        r = await http.post(f"{GW}/mcp", json=INIT, headers=hdrs(os.environ["TOK_FORGED"]))
        assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
    # The SDK surfaces the refused initialize as its MCP error (inside its task group's).
    with pytest.raises(ExceptionGroup) as refused:
        async with connect(os.environ["TOK_FORGED"], INV3):
            pass
    assert refused.group_contains(MCPError)


# --- tools/list = Gate A --------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_initialize_and_list_follow_the_page(mode):
    async with connect(ALICE, INV3, mode=mode) as (client, _):
        if mode == "legacy":
            assert "invoice_detail" in client.instructions and "One invoice" in client.instructions
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"invoice__get", "invoice__mark_paid", "scans__read_scan", "notes__lookup_note"} <= set(tools)
        assert not {"invoice__list", "vendor__list"} & set(tools), "tools of other pages are not listed"
        # The entity id is bound by the database, so the client never sees the parameter.
        assert "invoice_id" not in tools["invoice__get"].input_schema.get("properties", {})
        assert "invoice_id" not in tools["scans__read_scan"].input_schema.get("properties", {})
        get, mark_paid, scan = tools["invoice__get"], tools["invoice__mark_paid"], tools["scans__read_scan"]
        assert get.annotations.read_only_hint is True and get.annotations.destructive_hint is False
        assert get.annotations.idempotent_hint is True and get.annotations.open_world_hint is False
        # A write that is not "destructive": no promise either way (the client's default applies).
        assert mark_paid.annotations.read_only_hint is False and mark_paid.annotations.destructive_hint is None
        assert mark_paid.annotations.idempotent_hint is None
        assert scan.annotations.open_world_hint is True, "upstream tools reach an open world"
        assert get.title == "Invoice: get" and mark_paid.title == "Invoice: mark paid"


async def test_without_a_page_nothing_is_listed_and_nothing_runs():
    # Pages are remembered per user, so this is a user no other test gives a page.
    async with connect(os.environ["TOK_NEWCOMER"], None) as (client, _):
        assert (await client.list_tools()).tools == []
        r = await client.call_tool("invoice__get", {"invoice_id": "acme_inv3"})
        assert error_code(r) == "CONTEXT_MISSING"


async def test_an_invalid_page_is_refused_and_changes_nothing():
    async with connect(ALICE, INV3) as (client, http):
        assert "invoice__get" in await names(client)
        for bad in ({"pageType": "no_such_page"}, GLX3, {"pageType": "invoice_detail"}):
            http.headers["X-Ctxguard-Page"] = page_header(bad)
            with pytest.raises(MCPError) as refused:
                await client.list_tools()
            assert refused.value.code == INVALID_PARAMS
            assert refused.value.data == {"code": "INVALID_PAGE_CONTEXT"}
        # A header that is no page context at all: the same error.
        http.headers["X-Ctxguard-Page"] = "%%%"
        with pytest.raises(MCPError) as refused:
            await client.list_tools()
        assert (refused.value.code, refused.value.data) == (INVALID_PARAMS, {"code": "INVALID_PAGE_CONTEXT"})
        del http.headers["X-Ctxguard-Page"]
        assert "invoice__get" in await names(client), "the user's page is still the last valid one"
        assert (await client.call_tool("invoice__get", {})).structured_content["id"] == "acme_inv3"


# --- tools/call = Gate B --------------------------------------------------------------------

async def test_calls_bind_the_entity_and_denials_carry_codes():
    async with connect(ALICE, INV3) as (client, _):
        ok = await client.call_tool("invoice__get", {})
        assert not ok.is_error
        assert ok.structured_content["id"] == "acme_inv3"
        spoofed = await client.call_tool("invoice__get", {"invoice_id": "acme_inv4"})
        assert error_code(spoofed) == "ENTITY_MISMATCH"
        other_tenant = await client.call_tool("invoice.get", {"invoice_id": "glx_inv3"})
        assert error_code(other_tenant) == "ENTITY_MISMATCH"
        assert error_code(await client.call_tool("invoice__list", {})) == "TOOL_NOT_VISIBLE"
        assert error_code(await client.call_tool("no__such_tool", {})) == "TOOL_NOT_FOUND"
        pending = await client.call_tool("invoice__mark_paid", {})
        assert error_code(pending) == "APPROVAL_REQUIRED"
        assert pending.structured_content["error"]["call_id"]


async def test_another_tenants_entity_cannot_become_the_page():
    async with connect(CAROL, INV3) as (client, _):
        with pytest.raises(MCPError) as refused:
            await client.list_tools()
        assert refused.value.code == INVALID_PARAMS
        assert refused.value.data == {"code": "INVALID_PAGE_CONTEXT"}
        assert "acme_inv3" not in refused.value.message


# --- notifications/tools/list_changed ------------------------------------------------------

def list_changed_watch():
    """An event set by `notifications/tools/list_changed`, and the message handler that sets it."""
    changed = anyio.Event()

    async def on_message(msg):
        if isinstance(msg, types.ToolListChangedNotification):
            changed.set()

    return changed, on_message


async def test_list_changed_after_a_page_change_on_a_session():
    changed, on_message = list_changed_watch()
    async with connect(CAROL, {"pageType": "invoice_table"}, on_message=on_message) as (client, http):
        before = await names(client)
        assert "invoice__list" in before and "invoice__get" not in before
        # No wait for the client's GET stream: a notification sent before it opens is kept for it.
        http.headers["X-Ctxguard-Page"] = page_header(GLX3)
        after = await names(client)
        assert "invoice__get" in after and "invoice__list" not in after
        with anyio.fail_after(10):
            await changed.wait()


async def test_list_changed_when_the_app_sets_the_page_out_of_band():
    changed, on_message = list_changed_watch()
    async with httpx2.AsyncClient() as app:
        async def put(page):
            return await app.put(f"{GW}/v1/context", json=page, headers={"Authorization": f"Bearer {BOB}"})

        assert (await put(VENDORS)).status_code == 200
        # A session without a page header of its own follows the user's shared page.
        async with connect(BOB, None, on_message=on_message) as (client, _):
            assert "vendor__list" in await names(client)
            r = await put(INV4)
            assert r.status_code == 200, r.text
            bad = await put(GLX3)
            assert bad.status_code == 422, "another tenant's invoice cannot become bob's page"
            assert bad.json()["error"]["code"] == "INVALID_PAGE_CONTEXT"
            with anyio.fail_after(10):
                await changed.wait()
            assert "invoice__get" in await names(client)
            r = await client.call_tool("invoice__get", {})
            assert r.structured_content["id"] == "acme_inv4"


async def test_list_changed_on_a_2026_subscription_stream():
    async with connect(ALICE, TABLE, mode="auto") as (client, http):
        assert client.protocol_version == "2026-07-28", "the SDK negotiates the stateless protocol"
        assert "invoice__list" in await names(client)
        async with client.listen(tools_list_changed=True) as sub:
            assert sub.honored.tools_list_changed
            # Without sessions a header page is the request's alone: the stream follows the user's
            # shared page, which the app sets.
            async with httpx2.AsyncClient() as app:
                for page in (INV4, INV3):
                    r = await app.put(f"{GW}/v1/context", json=page, headers={"Authorization": f"Bearer {ALICE}"})
                    assert r.status_code == 200, r.text
            with anyio.fail_after(10):
                event = await anext(aiter(sub))
            assert isinstance(event, ToolsListChanged)
        http.headers["X-Ctxguard-Page"] = page_header(INV3)
        assert "invoice__get" in await names(client)


# --- upstream MCP servers --------------------------------------------------------------------

async def test_upstream_tools_appear_only_with_a_policy():
    async with connect(ALICE, INV3) as (client, _):
        listed = await names(client)
    assert "scans__read_scan" in listed
    # untagged_search has no invoice_id to bind, so the server policy does not fit it: invisible.
    assert "scans__untagged_search" not in listed
    reason = admin_sql(f"""BEGIN; SELECT ctxguard.set_context('{ALICE}', '{json.dumps(INV3)}') \\g /dev/null
        SELECT reason FROM ctxguard.explain_tools() WHERE name = 'scans.untagged_search'; COMMIT;""")
    assert reason == "missing_policy"


async def test_forwarded_calls_are_bound_masked_and_carry_the_servers_own_token():
    before = len(upstream_calls("scans"))
    async with connect(ALICE, INV3) as (client, _):
        r = await client.call_tool("scans__read_scan", {"page": 2})
        assert not r.is_error, r
        text = r.content[0].text
        assert "acme_inv3" in text and "page 2" in text
        assert "4111 1111 1111 1111" not in text and "jane.doe@example.com" not in text, "results are masked"
        spoofed = await client.call_tool("scans__read_scan", {"invoice_id": "acme_inv4"})
        assert error_code(spoofed) == "ENTITY_MISMATCH"
    calls = upstream_calls("scans")[before:]
    assert calls == [{"tool": "read_scan", "args": {"invoice_id": "acme_inv3", "page": 2}}], "only the bound call reached upstream"
    auth = (WORK / "scans" / "auth.log").read_text().splitlines()
    assert auth and all(a == "Bearer server-secret-for-scans" for a in auth), "upstream sees its own token only"
    assert not any(ALICE in a for a in auth)
    audit = admin_sql("SELECT string_agg(decision, ',' ORDER BY id) FROM ctxguard.audit_log WHERE tool = 'scans.read_scan'")
    assert "authorized,allow" in audit and "deny" in audit


async def test_stdio_upstream_and_per_server_rbac():
    async with connect(ALICE, TABLE) as (client, _):
        assert "notes__lookup_note" in await names(client), "notes: default deny, allowed to ap_clerk"
        r = await client.call_tool("notes__lookup_note", {"topic": "acme"})
        assert not r.is_error and "call the vendor" in r.content[0].text
    async with connect(BOB, TABLE) as (client, _):
        assert "notes__lookup_note" not in await names(client), "bob (viewer) may not use notes"
        assert error_code(await client.call_tool("notes__lookup_note", {"topic": "x"})) == "TOOL_NOT_VISIBLE"
    assert all(c["args"]["topic"] != "x" for c in upstream_calls("notes"))


async def test_a_dead_upstream_does_not_break_the_others():
    async with connect(ALICE, INV3) as (client, _):
        listed = await names(client)
        assert not any(n.startswith(("dead__", "ghost__")) for n in listed), "never-connected servers have no tools"
        # flaky was discovered while up and stopped since: its call fails, then it is excluded.
        assert "flaky__read_scan" in listed
        assert error_code(await client.call_tool("flaky__read_scan", {})) == "TOOL_ERROR"
        listed = await names(client)
        assert "flaky__read_scan" not in listed, "a failed server is excluded"
        assert "scans__read_scan" in listed and "invoice__get" in listed, "the others keep working"
        assert not (await client.call_tool("scans__read_scan", {})).is_error
    log = (WORK / "gateway.log").read_text()
    assert "MCP server excluded" in log


# --- ranking that upstream text cannot game --------------------------------------------------

UPSTREAM = ("scans", "flaky", "dead", "notes", "snoop", "stuffer", "ghost")


async def test_keyword_stuffed_upstream_tools_cannot_push_out_the_pages_own():
    message = "get this invoice, mark the invoice paid, read the invoice document metadata and pages"
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"}, timeout=20) as http:
        r = await http.post(f"{GW}/v1/tools", json={"pageContext": INV3, "message": message})
        assert r.status_code == 200, r.text
        tools = {t["name"]: t for t in r.json()["tools"]}
        chat = await http.post(f"{GW}/v1/chat", json={"pageContext": INV3, "message": message})
        assert chat.status_code == 200, chat.text
    stuffed = [n for n, t in tools.items() if n.startswith("stuffer.") and t["visible"]]
    assert len(stuffed) == 30, "thirty visible upstream tools, more than the list has room for"
    own = {n for n, t in tools.items() if t["visible"] and n.split(".")[0] not in UPSTREAM}
    assert {"invoice.get", "invoice.mark_paid", "read_doc_metadata"} <= own
    offered = {n for n, t in tools.items() if t["offered"]}
    assert own <= offered, f"the page's own tools are all offered: missing {own - offered}"
    assert len(offered) <= 24, "CTXGUARD_MAX_TOOLS"
    assert len([n for n in offered if n.startswith("stuffer.")]) <= 8, "ctxguard.max_offered_tools_per_server"
    left_out = {tools[n]["leftOut"] for n in stuffed if not tools[n]["offered"]}
    assert left_out and left_out <= {"server_cap", "top_k", "page_tools_first"}, left_out
    assert all(t["offered"] is None and t["leftOut"] is None for t in tools.values() if not t["visible"])
    # The model is offered the same list.
    assert own <= set(chat.json()["visibleTools"])
    # And explain_tools says the same in SQL.
    reasons = admin_sql(f"""BEGIN; SELECT ctxguard.set_context('{ALICE}', '{json.dumps(INV3)}') \\g /dev/null
        SELECT string_agg(DISTINCT left_out, ',' ORDER BY left_out) FROM ctxguard.explain_tools('{message}', 24)
         WHERE name LIKE 'stuffer.%'; COMMIT;""")
    assert set(reasons.split(",")) == left_out


# --- generations follow the database -----------------------------------------------------------

async def test_an_mcp_session_keeps_working_across_several_generation_lifetimes():
    admin_sql("""INSERT INTO ctxguard.tenant_limits (tenant_id, generation_ttl) VALUES ('globex', 2)
                 ON CONFLICT (tenant_id) DO UPDATE SET generation_ttl = 2""")
    started = admin_sql("SELECT now()")
    try:
        async with connect(CAROL, GLX3) as (client, _):
            # Eight calls 0.8 s apart: more than three lifetimes of 2 s.
            for _ in range(8):
                r = await client.call_tool("invoice__get", {})
                assert not r.is_error, r
                await anyio.sleep(0.8)
            # A generation the database refuses anyway (expired behind the gateway's back) is
            # renewed once and the call retried.
            admin_sql("UPDATE ctxguard.generations SET expires_at = now() - interval '1 second' "
                      "WHERE tenant_id = 'globex' AND user_id = 'carol'")
            r = await client.call_tool("invoice__get", {})
            assert not r.is_error, r
        generations = admin_sql(f"""SELECT count(DISTINCT generation) FROM ctxguard.audit_log
            WHERE tenant_id = 'globex' AND user_id = 'carol' AND tool = 'invoice.get' AND at >= '{started}'""")
        assert int(generations) >= 4, generations
    finally:
        admin_sql("UPDATE ctxguard.tenant_limits SET generation_ttl = NULL WHERE tenant_id = 'globex'")


# --- secrets stay in the gateway -------------------------------------------------------------

SECRETS = [s for s in os.environ["CTXGUARD_SECRETS"].split(",") if s]
CANARY = "snoop-canary-7f3e9c"


def snoop_report(name, timeout=20.0):
    path = WORK / name / "report.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.1)
    return json.loads(path.read_text())


def uid_of(status):
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def assert_the_probe_works(report):
    """The same reads on a process of the server's own user that did not protect itself succeed."""
    control = report["control"]
    assert CANARY in control["environ"]["ok"]
    assert control["mem"].get("canary") is True, control["mem"]
    assert control["attach"] == {"ok": "attached"}


def assert_nothing_of_the_gateway(report):
    parent = report["parent"]
    assert parent["environ"] == {"error": "EACCES"}, parent["environ"]
    assert "error" in parent["mem"], "the gateway's memory is unreadable"
    assert parent["attach"] == {"error": "EPERM"}
    cmdline = parent["cmdline"]["ok"]
    assert "ctxguard-gateway" in cmdline, "the probe looked at the gateway"
    for secret in SECRETS:
        assert secret not in cmdline, "a secret given on the command line is still there"
    # Its own environment: PATH and its registry env (none here); nothing of the gateway's.
    assert set(report["own_environ"]) <= {"PATH", "LC_CTYPE"}, report["own_environ"]
    for secret in SECRETS:
        assert all(secret not in v for v in report["own_environ"].values())
    assert report["pgid"] == report["pid"], "a stdio server leads its own process group"


def test_a_stdio_server_of_the_gateways_user_cannot_read_its_secrets():
    report = snoop_report("snoop")
    assert report["uid"] != 0, "the gateway under test runs as an ordinary user"
    assert uid_of(report["parent_status"]["ok"]) == report["uid"], "same user as the gateway"
    assert_the_probe_works(report)
    assert_nothing_of_the_gateway(report)
    # Seen by root (who may read anything), the gateway's environment no longer holds its secrets:
    # they left it once read, whether they came as variables or files.
    if os.getuid() == 0:
        environ = Path(f"/proc/{report['ppid']}/environ").read_bytes().decode("latin-1")
        assert "CTXGUARD_LISTEN=" in environ
        for secret in SECRETS:
            assert secret not in environ


def pid_alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_gone(pid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"stdio server {pid} outlived the gateway"
        time.sleep(0.1)


@pytest.mark.skipif(os.getuid() != 0, reason="granting the gateway CAP_SETUID/CAP_SETGID needs root")
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_stdio_server_as_another_user_reaches_nothing_and_ends_with_the_gateway(how):
    user = os.environ["CTXGUARD_STDIO_USER"]
    report_path = WORK / "snoop-runas" / "report.json"
    report_path.unlink(missing_ok=True)
    caps = "+setuid,+setgid,+kill"
    gw_user = os.environ["CTXGUARD_GW_USER"]
    env = {
        "PATH": os.environ["PATH"],
        "CTXGUARD_DATABASE_URL": os.environ["CTXGUARD_RUNAS_DATABASE_URL"],
        "CTXGUARD_LISTEN": f"127.0.0.1:{os.environ['CTXGUARD_RUNAS_PORT']}",
        "CTXGUARD_PROVIDER": "offline",
        "CTXGUARD_MCP_STDIO_USER": user,
        "CTXGUARD_MCP_CONNECT_TIMEOUT_MS": "15000",
    }
    with open(WORK / f"gateway-runas-{how}.log", "wb") as log:
        gw = subprocess.Popen(
            ["setpriv", f"--reuid={gw_user}", f"--regid={gw_user}", "--init-groups",
             f"--inh-caps={caps}", f"--ambient-caps={caps}", "--", os.environ["CTXGUARD_GATEWAY_BIN"]],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            report = snoop_report("snoop-runas")
            status = Path(f"/proc/{report['pid']}/status").read_text()
        finally:
            if how == "SIGTERM":
                gw.terminate()
            else:
                gw.kill()
            gw.wait(timeout=20)
    assert report["uid"] == pwd.getpwnam(user).pw_uid != uid_of(report["parent_status"]["ok"])
    assert_the_probe_works(report)
    assert_nothing_of_the_gateway(report)
    # None of the gateway's capabilities or groups passed to the server.
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    for cap in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(fields[cap], 16) == 0, (cap, fields[cap])
    assert fields["Groups"].split() in ([], [str(pwd.getpwnam(user).pw_gid)]), fields["Groups"]
    # Gone with the gateway: ended by its shutdown, or by the parent-death signal when it was killed.
    wait_gone(report["pid"])


# --- progressive disclosure: the compact list over the tool budget (issue 31) -----------------
# A second gateway (tests/mcp/run.sh) keeps the default budget, 30 tools: the invoice page (its own
# tools, scans, notes and stuffer's thirty) is over it, the vendor table is not.

COMPACT = os.environ["CTXGUARD_MCP_COMPACT_URL"]


@asynccontextmanager
async def connect_compact(token, page, mode="auto"):
    """The SDK client on the compact gateway; `auto` is the SDK's default (2026-07-28, stateless)."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}", "X-Ctxguard-Page": page_header(page)},
                              timeout=20)
    async with http:
        async with Client(streamable_http_client(f"{COMPACT}/mcp", http_client=http), mode=mode) as client:
            yield client


def dumped(tools):
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_compact_list_over_the_budget_with_the_python_sdk(mode):
    async with connect_compact(ALICE, INV3, mode) as client:
        tools = (await client.list_tools()).tools
        again = (await client.list_tools()).tools
    names = [t.name for t in tools]
    assert names[-1] == "find_tools" and names.count("find_tools") == 1, names
    assert len(names) <= 16, f"half the budget and find_tools: {names}"
    assert names[0] in ("invoice__get", "invoice__mark_paid"), "the entity's own tools come first"
    assert not any(n.split("__")[0] in UPSTREAM for n in names), "upstream tools are found, never listed"
    assert dumped(tools) == dumped(again), "deterministic"
    find = tools[-1]
    assert "stuffer (30)" in find.description and "scans (" in find.description, find.description
    assert find.annotations.read_only_hint is True and find.annotations.open_world_hint is False
    assert set(find.input_schema["properties"]) == {"query", "namespace"}
    # Within the budget nothing changes: the full list, no search.
    async with connect_compact(ALICE, VENDORS, mode) as client:
        names = [t.name for t in (await client.list_tools()).tools]
    assert "vendor__list" in names and "find_tools" not in names


async def test_compact_found_tools_are_called_directly_and_gate_b_decides():
    before = len(upstream_calls("scans"))
    async with connect_compact(ALICE, INV3) as client:
        # The page's own matching tools come first (five at most): a server's tools are searched by
        # naming its namespace.
        r = await client.call_tool("find_tools", {"query": "read the scanned invoice page", "namespace": "scans"})
        assert not r.is_error, r
        found = {t["name"]: t for t in r.structured_content["tools"]}
        assert "scans__read_scan" in found, found.keys()
        assert json.loads(r.content[0].text) == r.structured_content
        scan = found["scans__read_scan"]
        assert "invoice_id" not in scan["inputSchema"].get("properties", {}), "bound parameters stay hidden"
        assert scan["annotations"]["openWorldHint"] is True
        # Called by name though it is not listed: Gate B decides (binding the page's invoice).
        ok = await client.call_tool("scans__read_scan", {"page": 3})
        assert not ok.is_error and "acme_inv3" in ok.content[0].text
        spoofed = await client.call_tool("scans__read_scan", {"invoice_id": "acme_inv4"})
        assert error_code(spoofed) == "ENTITY_MISMATCH"
        # A visible tool never found or listed: still Gate B's (here: allowed).
        meta = await client.call_tool("read_doc_metadata", {"doc_id": "acme_inv3_pdf"})
        assert not meta.is_error, meta
        # Hidden tools are never found, by name or by their description, and stay refused.
        for query in ("scans untagged_search", "untagged search of every scan", "invoice list of the company"):
            r = await client.call_tool("find_tools", {"query": query})
            assert not {"scans__untagged_search", "invoice__list"} & {t["name"] for t in r.structured_content["tools"]}
        assert error_code(await client.call_tool("invoice__list", {})) == "TOOL_NOT_VISIBLE"
        # Its arguments are checked first.
        assert error_code(await client.call_tool("find_tools", {"query": "x" * 600})) == "INVALID_ARGUMENT"
        assert error_code(await client.call_tool("find_tools", {"namespace": "scans"})) == "INVALID_ARGUMENT"
        narrowed = await client.call_tool("find_tools", {"query": "invoice scan page", "namespace": "scans"})
        assert {t["name"].split("__")[0] for t in narrowed.structured_content["tools"]} == {"scans"}
        # Nothing was remembered: the list is what it was.
        assert [t.name for t in (await client.list_tools()).tools][-1] == "find_tools"
    calls = upstream_calls("scans")[before:]
    assert calls == [{"tool": "read_scan", "args": {"invoice_id": "acme_inv3", "page": 3}}]


async def test_compact_list_is_the_same_across_stateless_requests_and_follows_token_and_page():
    lists = []
    for _ in range(2):
        async with connect_compact(ALICE, INV3) as client:
            lists.append(dumped((await client.list_tools()).tools))
    assert lists[0] == lists[1]
    # Another user (a viewer: no mark_paid, and notes is not his) gets his own list for the same page.
    async with connect_compact(BOB, INV3) as client:
        bob = {t.name: t for t in (await client.list_tools()).tools}
    assert "invoice__mark_paid" not in bob and "find_tools" in bob, bob.keys()
    find = next(t for t in lists[0] if t["name"] == "find_tools")
    assert "notes (" in find["description"]
    assert "notes (" not in bob["find_tools"].description, "bob may not use notes: its namespace is not named to him"


def test_compact_list_with_the_typescript_sdk_client():
    out = subprocess.run([os.environ["CTXGUARD_NODE"], str(Path(__file__).parent / "ts_client.mjs"), COMPACT, ALICE,
                          page_header(INV3)], check=True, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CTXGUARD_TS_SDK": os.environ["CTXGUARD_TS_SDK"]})
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["session"], "the TypeScript SDK speaks 2025-11-25, with a session"
    assert seen["names"][-1] == "find_tools" and not any(n.split("__")[0] in UPSTREAM for n in seen["names"]), seen
    assert seen["same"], "the list is the same before and after a search"
    assert "stuffer (30)" in seen["findDescription"]
    assert "scans__read_scan" in seen["found"] and seen["foundHasSchema"], seen
    assert seen["called"] and not seen["called"]["isError"] and "acme_inv3" in seen["called"]["text"], seen
    assert "scans__untagged_search" not in seen["ghost"]
