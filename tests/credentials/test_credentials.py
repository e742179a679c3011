"""Issue 33's client checks, through the gateway's HTTP API (tests/credentials/run.sh starts the
components and checks the logs and rows afterwards). Standard library only."""

import json
import os
import sys
import urllib.error
import urllib.request

GW = os.environ["CTXGUARD_CREDS_GW"]
SEK = {"acme": os.environ["SEK_ACME"], "globex": os.environ["SEK_GLOBEX"]}
TOK = {k: os.environ[f"TOK_{k.upper()}"] for k in ("alice", "bob", "carol", "tina", "gina")}
PAGE = {"pageType": "invoice_table"}
answers = []


def call(method, path, token, body):
    req = urllib.request.Request(GW + path, method=method, data=json.dumps(body).encode(),
                                 headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    answers.append(text)
    return status, json.loads(text) if text else None


def execute(user, tool):
    return call("POST", "/internal/mcp/execute", TOK[user], {"tool_name": tool, "arguments": {}, "pageContext": PAGE})


def text_of(envelope):
    return " ".join(c.get("text", "") for c in envelope["result"]["content"])


def check(cond, what, detail=""):
    if not cond:
        print(f"FAIL: {what} {detail}", file=sys.stderr)
        sys.exit(1)
    print(f"ok - {what}")


# Before any secret: the call is refused, nothing is forwarded.
s, env = execute("alice", "ledgerapi.whoami")
check(s == 200 and env["error"]["code"] == "TOOL_ERROR" and "not set a secret" in env["error"]["message"],
      "no tenant secret yet: the call fails closed", env)

# Only a tenant's admin sets its secret; the answer never carries it.
s, env = call("PUT", "/v1/tenant-secrets/ledgerapi", TOK["alice"], {"pageContext": PAGE, "secret": "sek-from-alice"})
check(s == 403, "a user who is not the tenant's admin cannot set the secret", (s, env))
s, env = call("PUT", "/v1/tenant-secrets/ledgerapi", TOK["tina"], {"pageContext": PAGE, "secret": SEK["acme"]})
check(s == 200 and env["status"] == "ok", "acme's admin sets acme's secret", (s, env))
s, env = call("PUT", "/v1/tenant-secrets/ledgerapi", TOK["gina"], {"pageContext": PAGE, "secret": SEK["globex"]})
check(s == 200 and env["status"] == "ok", "globex's admin sets globex's secret", (s, env))
s, env = call("PUT", "/v1/tenant-secrets/drive", TOK["tina"], {"pageContext": PAGE, "secret": "x" * 10})
check(s == 422, "a tenant secret only for a tenant_secret server", (s, env))
s, env = call("PUT", "/v1/tenant-secrets/ledgerapi", TOK["tina"], {"pageContext": PAGE, "secret": "x" * 16385})
check(s == 422, "a secret over 16 KiB is refused before anything", s)

# Each tenant's calls carry its own secret (the upstream says whose it saw), within and across tenants.
for user, tenant in [("alice", "acme"), ("carol", "globex"), ("bob", "acme"), ("carol", "globex"), ("alice", "acme")]:
    s, env = execute(user, "ledgerapi.whoami")
    check(s == 200 and env.get("status") == "ok" and text_of(env) == f"you are tenant {tenant}",
          f"{user}'s call carries {tenant}'s secret", env)

# The tenant's users learn that a secret is set, never what it is.
s, env = call("POST", "/v1/connections", TOK["bob"], {"pageContext": PAGE})
conns = {c["server"]: c for c in env["connections"]}
check(conns["ledgerapi"]["connected"] is True and conns["drive"]["connected"] is False, "connections list (no values)", env)

# A user_oauth server without the user's connection: CONNECTION_REQUIRED, naming the server.
s, env = execute("alice", "drive.whoami")
check(env["error"]["code"] == "CONNECTION_REQUIRED" and env["error"]["details"]["server"] == "drive",
      "a user_oauth server without a connection answers CONNECTION_REQUIRED", env)

# Replacing and deleting: globex's admin replaces globex's secret; acme's calls are unaffected.
s, env = call("POST", "/v1/tenant-secrets/ledgerapi/delete", TOK["gina"], {"pageContext": PAGE})
check(s == 200 and env["changed"] is True, "globex's admin deletes globex's secret", env)
s, env = execute("carol", "ledgerapi.whoami")
check(env["error"]["code"] == "TOOL_ERROR", "globex's calls then fail closed", env)
s, env = execute("alice", "ledgerapi.whoami")
check(text_of(env) == "you are tenant acme", "acme's still carry acme's", env)
s, env = call("PUT", "/v1/tenant-secrets/ledgerapi", TOK["gina"], {"pageContext": PAGE, "secret": SEK["globex"]})
check(env["status"] == "ok", "globex's admin sets it again", env)

for secret in SEK.values():
    check(not any(secret in a for a in answers), "no answer carries a tenant secret")
