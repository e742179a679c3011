"""OpenTelemetry (issue 32): a gateway exporting OTLP to a real receiver on loopback
(otlp_receiver.py, on the OpenTelemetry project's `opentelemetry-proto`). A chat turn and an MCP
tools/call forwarded upstream arrive as spans with the right parents and attributes; an incoming
`traceparent` (HTTP header, MCP `_meta`) is continued and passed upstream; the audit rows carry the
trace id; a malformed `traceparent` starts a new trace; nothing secret is in what was exported.

The gateway is stopped (SIGTERM) before the spans are read: its exit flushes the exporter, so no
test waits on a clock for spans to arrive.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest

from test_mcp import ALICE, INV3, INIT, WORK, admin_sql, answer, hdrs

RECEIVER_PORT, GW_PORT = (int(p) for p in os.environ["CTXGUARD_OTEL_PORTS"].split(","))
GW = f"http://127.0.0.1:{GW_PORT}"
OUT = WORK / "otlp"
# The W3C example ids: what a caller's tracing would send.
CHAT_TRACE, CHAT_PARENT = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
MCP_TRACE, MCP_PARENT = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
LIST_TRACE, LIST_PARENT = "a3ce929d0e0e47364bf92f3577b34da6", "0ba902b700f067aa"
MALFORMED = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"
OTLP_SECRET = "otlp-collector-secret-5e1f"
ARGUMENT_VALUE = 987654321
QUESTION = "get this invoice please quokka-question-marker"
PAGE_MARKER = "wombat-page-marker"


def wait_port(port, proc, log):
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, Path(log).read_text()
            time.sleep(0.1)


def spans_by_trace(spans, trace):
    return {s["name"]: s for s in spans if s["trace_id"] == trace}


@pytest.fixture(scope="module")
def traced():
    """Run the scenario against a tracing gateway, stop it, and return what was exported."""
    subprocess.run(["rm", "-rf", str(OUT)], check=True)
    OUT.mkdir(parents=True)
    receiver = subprocess.Popen([sys.executable, str(Path(__file__).with_name("otlp_receiver.py")),
                                 str(RECEIVER_PORT), str(OUT)],
                                stdout=open(OUT / "receiver.log", "wb"), stderr=subprocess.STDOUT)
    wait_port(RECEIVER_PORT, receiver, OUT / "receiver.log")
    env = {
        "PATH": os.environ["PATH"],
        "CTXGUARD_DATABASE_URL": os.environ["CTXGUARD_MCP_DATABASE_URL"],
        "CTXGUARD_LISTEN": f"127.0.0.1:{GW_PORT}",
        "CTXGUARD_PROVIDER": "offline",
        "CTXGUARD_MCP_DISCOVER": "false",
        "CTXGUARD_MCP_CONNECT_TIMEOUT_MS": "15000",
        "CTXGUARD_TOOL_BUDGET": "1000",
        "SCANS_TOKEN_FILE": str(WORK / "scans_token"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{RECEIVER_PORT}",
        "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer%20{OTLP_SECRET}",
        "OTEL_SERVICE_NAME": "ctxguard-telemetry-test",
    }
    run_as = []
    if os.getuid() == 0:
        user = os.environ["CTXGUARD_GW_USER"]
        run_as = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
    log = OUT / "gateway.log"
    gw = subprocess.Popen(run_as + [os.environ["CTXGUARD_GATEWAY_BIN"]], env=env,
                          stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    seen = {}
    try:
        wait_port(GW_PORT, gw, log)
        with httpx2.Client(headers={"Authorization": f"Bearer {ALICE}"}, timeout=30) as http:
            page = dict(INV3, pageState={"tab": PAGE_MARKER})
            r = http.post(f"{GW}/v1/chat", json={"pageContext": page, "message": QUESTION},
                          headers={"traceparent": f"00-{CHAT_TRACE}-{CHAT_PARENT}-01",
                                   "tracestate": "vendor=opaque"})
            assert r.status_code == 200, r.text
            seen["chat"] = r.json()
            seen["chat_request_id"] = r.headers["x-request-id"]
            r = http.post(f"{GW}/v1/chat", json={"pageContext": INV3, "message": QUESTION},
                          headers={"traceparent": MALFORMED})
            assert r.status_code == 200, r.text
            seen["malformed_request_id"] = r.headers["x-request-id"]
            # A caller that names its request keeps its id on the audit rows (as before).
            r = http.post(f"{GW}/v1/chat", json={"pageContext": INV3, "message": QUESTION},
                          headers={"x-request-id": "caller-named-telemetry-1"})
            assert r.status_code == 200, r.text
            seen["named_request_id"] = r.headers["x-request-id"]
        with httpx2.Client(timeout=30) as http:
            r = http.post(f"{GW}/mcp", json=INIT, headers=hdrs(ALICE, INV3))
            assert r.status_code == 200, r.text
            sid = seen["sid"] = r.headers["mcp-session-id"]
            r = http.post(f"{GW}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                          headers=hdrs(ALICE, INV3, sid))
            assert r.status_code == 202, r.text
            call = {"jsonrpc": "2.0", "id": 77, "method": "tools/call",
                    "params": {"name": "scans__read_scan", "arguments": {"page": ARGUMENT_VALUE},
                               "_meta": {"traceparent": f"00-{MCP_TRACE}-{MCP_PARENT}-01"}}}
            r = http.post(f"{GW}/mcp", json=call, headers=hdrs(ALICE, INV3, sid))
            assert r.status_code == 200, r.text
            result = answer(r)["result"]
            assert not result.get("isError"), result
            seen["mcp"] = r.text
            # Without `_meta`, the HTTP header's traceparent is continued.
            listing = {"jsonrpc": "2.0", "id": "list-1", "method": "tools/list"}
            r = http.post(f"{GW}/mcp", json=listing, headers=hdrs(
                ALICE, INV3, sid, traceparent=f"00-{LIST_TRACE}-{LIST_PARENT}-01"))
            assert r.status_code == 200 and answer(r)["result"]["tools"], r.text
    finally:
        gw.terminate()
        gw.wait(timeout=30)
        receiver.terminate()
        receiver.wait(timeout=10)
    spans = [json.loads(line) for line in (OUT / "spans.jsonl").read_text().splitlines()]
    return spans, seen, log.read_text()


def test_a_chat_turn_continues_the_callers_trace_with_its_spans_nested(traced):
    spans, seen, _ = traced
    t = spans_by_trace(spans, CHAT_TRACE)
    server = t["POST /v1/chat"]
    assert server["parent_span_id"] == CHAT_PARENT and server["kind"] == 2  # SERVER
    assert server["trace_state"] == "vendor=opaque"
    assert server["attributes"]["http.response.status_code"] == 200
    assert server["resource"]["service.name"] == "ctxguard-telemetry-test"
    turn = t["invoke_agent ctxguard"]
    assert turn["parent_span_id"] == server["span_id"]
    assert turn["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert turn["attributes"]["gen_ai.conversation.id"] == seen["chat"]["conversationId"]
    gate_a = t["gate_a open_turn"]
    assert gate_a["parent_span_id"] == turn["span_id"] and gate_a["kind"] == 3  # CLIENT
    models = [s for s in spans if s["trace_id"] == CHAT_TRACE and s["attributes"].get("gen_ai.operation.name") == "chat"]
    assert len(models) == seen["chat"]["steps"] >= 2
    for m in models:
        assert m["parent_span_id"] == turn["span_id"] and m["kind"] == 3
        assert m["attributes"]["gen_ai.provider.name"] == "ctxguard.offline"
        assert "gen_ai.request.model" in m["attributes"]
    tools = [s for s in spans if s["trace_id"] == CHAT_TRACE and s["name"].startswith("execute_tool ")]
    calls = seen["chat"]["toolCalls"]
    assert calls and len(tools) == len(calls)
    for s, c in zip(sorted(tools, key=lambda s: s["start"]), calls):
        a = s["attributes"]
        assert s["parent_span_id"] == turn["span_id"]
        assert (a["gen_ai.tool.name"], a["gen_ai.tool.call.id"], a["ctxguard.decision"]) == (c["tool"], c["id"], c["decision"])
        assert a.get("ctxguard.code") == c["code"]
        gate_b = [g for g in spans if g["parent_span_id"] == s["span_id"] and g["name"] == "gate_b call_tool"]
        assert len(gate_b) == 1
    # The trace joins the audit: the response names it, and every row of the turn carries it.
    assert seen["chat_request_id"] == CHAT_TRACE
    audited = admin_sql(f"SELECT string_agg(DISTINCT tool, ',') FROM ctxguard.audit_log WHERE trace_id = '{CHAT_TRACE}'")
    assert set(audited.split(",")) == {c["tool"] for c in calls}


def test_an_mcp_tools_call_continues_meta_traceparent_and_passes_it_upstream(traced):
    spans, seen, _ = traced
    t = spans_by_trace(spans, MCP_TRACE)
    server = t["tools/call scans__read_scan"]
    a = server["attributes"]
    assert server["parent_span_id"] == MCP_PARENT and server["kind"] == 2
    assert (a["mcp.method.name"], a["jsonrpc.request.id"], a["gen_ai.tool.name"]) == ("tools/call", "77", "scans__read_scan")
    assert a["ctxguard.decision"] == "allow"
    assert len(a["mcp.session.id"]) == 32 and a["mcp.session.id"] != seen["sid"]
    gate_b = t["gate_b call_tool"]
    assert gate_b["parent_span_id"] == server["span_id"]
    client = t["tools/call read_scan"]
    assert client["parent_span_id"] == server["span_id"] and client["kind"] == 3
    assert client["attributes"]["ctxguard.mcp.server"] == "scans"
    # The upstream server got the client span's context in `_meta`.
    traced_calls = (WORK / "scans" / "traceparents.jsonl").read_text().splitlines()
    sent = [c for c in map(json.loads, traced_calls) if c["args"].get("page") == ARGUMENT_VALUE]
    assert [c["traceparent"] for c in sent] == [f"00-{MCP_TRACE}-{client['span_id']}-01"]
    rows = admin_sql(f"SELECT string_agg(decision, ',' ORDER BY id) FROM ctxguard.audit_log WHERE trace_id = '{MCP_TRACE}'")
    assert rows == "authorized,allow"


def test_an_mcp_request_without_meta_continues_the_http_traceparent(traced):
    spans, _, _ = traced
    listed = spans_by_trace(spans, LIST_TRACE)["tools/list"]
    assert listed["parent_span_id"] == LIST_PARENT and listed["kind"] == 2
    assert listed["attributes"]["jsonrpc.request.id"] == "list-1"


def test_a_malformed_traceparent_starts_a_new_trace_that_still_joins_the_audit(traced):
    spans, seen, _ = traced
    new = seen["malformed_request_id"]
    assert len(new) == 32 and new != CHAT_TRACE.upper() and new != CHAT_TRACE
    server = spans_by_trace(spans, new)["POST /v1/chat"]
    assert server["parent_span_id"] == ""
    assert int(admin_sql(f"SELECT count(*) FROM ctxguard.audit_log WHERE trace_id = '{new}'")) >= 1
    # A caller's own x-request-id stays the audit's trace id; the span says which it is.
    named = seen["named_request_id"]
    assert named == "caller-named-telemetry-1"
    assert int(admin_sql(f"SELECT count(*) FROM ctxguard.audit_log WHERE trace_id = '{named}'")) >= 1
    [span] = [s for s in spans if s["attributes"].get("ctxguard.trace_id") == named]
    assert span["name"] == "POST /v1/chat" and span["trace_id"] != named


def test_nothing_secret_is_exported(traced):
    spans, seen, log = traced
    raw = (OUT / "raw.bin").read_bytes()
    decoded = (OUT / "spans.jsonl").read_text()
    answer = seen["chat"]["answer"]
    secrets = [ALICE, QUESTION, "quokka-question-marker", PAGE_MARKER, str(ARGUMENT_VALUE), answer,
               "ACME-2026-0003", "1257.00", "4111 1111", "jane.doe", "server-secret-for-scans", OTLP_SECRET, seen["sid"]]
    assert len(answer) > 20
    for s in secrets:
        assert s.encode() not in raw, s[:40]
        assert s not in decoded, s[:40]
    # The collector's credentials went to the collector, and nowhere in the log.
    headers = [json.loads(line) for line in (OUT / "headers.jsonl").read_text().splitlines()]
    assert headers and all(h.get("authorization") == f"Bearer {OTLP_SECRET}" for h in headers)
    assert OTLP_SECRET not in log
    # Only ctxguard's spans: no log event became a span event.
    assert {s["scope"] for s in spans} == {"ctxguard-gateway"}
    assert not any(s["events"] for s in spans)


def test_without_tracing_an_upstream_still_gets_the_requests_trace_id_which_joins_the_audit():
    """The suite's main gateway exports nothing: the upstream's `_meta.traceparent` carries the
    request's trace id (a fresh span id, unsampled), and that id is on the audit rows."""
    from test_mcp import GW as PLAIN_GW

    page = 424242
    with httpx2.Client(timeout=30) as http:
        r = http.post(f"{PLAIN_GW}/mcp", json=INIT, headers=hdrs(ALICE, INV3))
        assert r.status_code == 200, r.text
        sid = r.headers["mcp-session-id"]
        r = http.post(f"{PLAIN_GW}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                      headers=hdrs(ALICE, INV3, sid))
        assert r.status_code == 202, r.text
        call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                "params": {"name": "scans__read_scan", "arguments": {"page": page}}}
        r = http.post(f"{PLAIN_GW}/mcp", json=call, headers=hdrs(ALICE, INV3, sid))
        assert r.status_code == 200 and not answer(r)["result"].get("isError"), r.text
    lines = (WORK / "scans" / "traceparents.jsonl").read_text().splitlines()
    [sent] = [c["traceparent"] for c in map(json.loads, lines) if c["args"].get("page") == page]
    version, trace, span, flags = sent.split("-")
    assert (version, flags, len(trace), len(span)) == ("00", "00", 32, 16)
    rows = admin_sql(f"SELECT string_agg(decision, ',' ORDER BY id) FROM ctxguard.audit_log WHERE trace_id = '{trace}'")
    assert rows == "authorized,allow"
