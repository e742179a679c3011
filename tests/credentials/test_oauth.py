"""Issue 33's user_oauth and token_exchange checks with real components: the upstream's own
authorization server (npm oidc-provider, tests/credentials/upstream_as.mjs), an upstream MCP server
that verifies its tokens (whoami_server.py) and the gateway between them. A scripted browser signs
in and consents. Phases (tests/credentials/run.sh restarts the authorization server between them):

    test_oauth.py connect    # connect, per-user calls, refresh, exchange, disconnect
    test_oauth.py forgotten  # the AS forgot every grant: a refresh fails, CONNECTION_REQUIRED
Standard library only; every answer is appended to $CTXGUARD_CREDS_WORK/answers.jsonl."""

import http.cookiejar
import json
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

GW = os.environ["CTXGUARD_CREDS_GW"]
AS = os.environ["CTXGUARD_CREDS_AS"]
WORK = os.environ["CTXGUARD_CREDS_WORK"]
TOK = {k: os.environ[f"TOK_{k.upper()}"] for k in ("alice", "bob", "carol", "mallory")}
PAGE = {"pageType": "invoice_table"}


def record(text):
    with open(os.path.join(WORK, "answers.jsonl"), "a") as f:
        f.write(json.dumps(text) + "\n")


def call(method, path, token, body):
    req = urllib.request.Request(GW + path, method=method, data=json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    record(text)
    return status, json.loads(text) if text else None


def execute(user, tool):
    return call("POST", "/internal/mcp/execute", TOK[user], {"tool_name": tool, "arguments": {}, "pageContext": PAGE})[1]


def said(env):
    if env.get("status") != "ok":
        return env.get("error", {}).get("code")
    return " ".join(c.get("text", "") for c in env["result"]["content"])


def check(cond, what, detail=""):
    if not cond:
        print(f"FAIL: {what} {detail}", file=sys.stderr)
        sys.exit(1)
    print(f"ok - {what}")


def connect(user):
    """Start a connection at the gateway and complete it in a scripted browser; the callback page."""
    s, env = call("POST", "/v1/connections/drive", TOK[user], {"pageContext": PAGE})
    check(s == 200 and env["authorizeUrl"].startswith(AS + "/"), f"{user} gets an authorization URL", (s, env))
    q = urllib.parse.parse_qs(urllib.parse.urlparse(env["authorizeUrl"]).query)
    check(q["code_challenge_method"] == ["S256"] and q["state"] and q["client_id"] == ["ctxguard-gw"], "PKCE, state and client", q)
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    page = browser.open(env["authorizeUrl"], timeout=30)
    for _ in range(4):
        html = page.read().decode()
        form = re.search(r'<form method="post" action="([^"]+)">', html)
        if not form:
            return page.status, html, q["state"][0]
        fields = {"login": user} if "/login" in form.group(1) else {}
        page = browser.open(AS + form.group(1), data=urllib.parse.urlencode(fields).encode(), timeout=30)
    check(False, "the sign-in ended")


phase = sys.argv[1]
if phase == "connect":
    check(execute("alice", "drive.whoami")["error"]["code"] == "CONNECTION_REQUIRED", "alice has no connection yet")
    status, html, state = connect("alice")
    check(status == 200 and "Connected" in html, "alice connects (authorization code + PKCE)", html)
    try:
        urllib.request.urlopen(f"{GW}/v1/connections/callback?code=x&state={state}", timeout=30)
        check(False, "a used connect request is refused")
    except urllib.error.HTTPError as e:
        check(e.code == 400, "a used connect request is refused (single use)")
    check(said(execute("alice", "drive.whoami")) == "you are alice of acme", "alice's call carries alice's own token")
    status, html, _ = connect("carol")
    check("Connected" in html, "carol connects")
    for user, who in [("carol", "carol of globex"), ("alice", "alice of acme"), ("carol", "carol of globex")]:
        check(said(execute(user, "drive.whoami")) == f"you are {who}", f"{user}'s call carries {user}'s own token")
    check(execute("bob", "drive.whoami")["error"]["code"] == "CONNECTION_REQUIRED", "bob (alice's tenant) never gets alice's connection")
    s, env = call("POST", "/v1/connections", TOK["alice"], {"pageContext": PAGE})
    drive = [c for c in env["connections"] if c["server"] == "drive"][0]
    check(drive["connected"] is True and drive["expiresAt"], "alice's connections list drive, with its expiry", env)

    # Token exchange: the upstream sees a token for its own audience with the user's subject.
    check(said(execute("alice", "fed.whoami")) == "you are alice of acme", "token exchange: alice's subject, the upstream's audience")
    check(said(execute("carol", "fed.whoami")) == "you are carol of globex", "token exchange: carol's")
    env = execute("mallory", "fed.whoami")
    check(env["error"]["code"] == "TOOL_ERROR" and "refused the token exchange" in env["error"]["message"],
          "an exchange the authorization server refuses fails closed", env)

    # Expiry and refresh: access tokens live 62 s, refreshed a minute before they expire.
    time.sleep(3)
    check(said(execute("alice", "drive.whoami")) == "you are alice of acme", "alice's expiring token is refreshed, the call works")

    # Disconnect: deleted, revoked at the AS; the next call needs a connection again.
    s, env = call("POST", "/v1/connections/drive/disconnect", TOK["alice"], {"pageContext": PAGE})
    check(env["disconnected"] is True, "alice disconnects", env)
    check(execute("alice", "drive.whoami")["error"]["code"] == "CONNECTION_REQUIRED", "then her call needs a connection")

    # A streamed chat turn: the app gets a connection_required event with the connect URL; the
    # model (and the saved turn) only the refusal naming the server.
    req = urllib.request.Request(GW + "/v1/chat", method="POST",
                                 data=json.dumps({"message": "drive whoami", "pageContext": PAGE}).encode(),
                                 headers={"authorization": f"Bearer {TOK['alice']}", "content-type": "application/json",
                                          "accept": "text/event-stream"})
    with urllib.request.urlopen(req, timeout=60) as r:
        stream = r.read().decode()
    record(stream)
    events = [(m.group(1), m.group(2)) for m in re.finditer(r"event: ?(\S+)\ndata: ?(.*)", stream)]
    hints = [json.loads(d) for e, d in events if e == "connection_required"]
    check(len(hints) == 1 and hints[0]["server"] == "drive" and hints[0]["connectUrl"].startswith(AS + "/"),
          "the chat stream carries a connection_required event with the connect URL", stream[:800])
    state = urllib.parse.parse_qs(urllib.parse.urlparse(hints[0]["connectUrl"]).query)["state"][0]
    others = "".join(d for e, d in events if e != "connection_required")
    check(state not in others and "CONNECTION_REQUIRED" in others, "the rest of the turn names the refusal, never the URL")
    check(said(execute("carol", "drive.whoami")) == "you are carol of globex", "carol's connection is untouched")
elif phase == "forgotten":
    time.sleep(3)
    env = execute("carol", "drive.whoami")
    check(env["error"]["code"] == "CONNECTION_REQUIRED", "a refresh the AS refuses answers CONNECTION_REQUIRED", env)
    s, env = call("POST", "/v1/connections", TOK["carol"], {"pageContext": PAGE})
    check([c for c in env["connections"] if c["server"] == "drive"][0]["connected"] is False, "and the dead connection is gone")
