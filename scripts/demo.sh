#!/usr/bin/env bash
# The main job: PostgreSQL 15 with ctxguard preloaded, the demo schema loaded, a walkthrough that
# prints Gate A and Gate B decisions for three users of two tenants, and the gateway (offline model)
# in demo mode, serving the demo app at http://127.0.0.1:8088/, with Demo Notes (demo-upstream/), an
# upstream MCP server that needs each user's own connection, on :8089. Installs what it needs.
# Ports: CTXGUARD_GATEWAY_PORT (8088), CTXGUARD_DEMO_UPSTREAM_PORT (8089); cluster: CTXGUARD_RUN,
# CTXGUARD_PGPORT (lib.sh). CTXGUARD_SKIP_INSTALL=1 skips setup.sh and the extension's build and
# install (an extension already installed, e.g. by another checkout's run).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

if [ "${CTXGUARD_SKIP_INSTALL:-}" != 1 ]; then
  bash scripts/setup.sh
  install_extension
fi
start_cluster
DB=ctxguard_demo
log "loading demo schema into $DB"
create_demo_db "$DB"

log "walkthrough (as ctxguard_gateway)"
psql -X -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$DB" -v ON_ERROR_STOP=1 \
  -v tok_alice="$(mint --sub alice --tenant acme --roles ap_clerk)" \
  -v tok_bob="$(mint --sub bob --tenant acme --roles viewer)" \
  -v tok_carol="$(mint --sub carol --tenant globex --roles ap_clerk)" \
  -f sql/demo/walkthrough.sql

log "building and starting the gateway (offline model) and Demo Notes"
UPBIN=$(demo_upstream_bin release)
GW_PORT=${CTXGUARD_GATEWAY_PORT:-8088}
UP_PORT=${CTXGUARD_DEMO_UPSTREAM_PORT:-8089}
GW="http://127.0.0.1:$GW_PORT"
for pidfile in "$RUN/gateway.pid" "$RUN/demo-upstream.pid"; do
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then kill "$(cat "$pidfile")"; sleep 0.5; fi
  rm -f "$pidfile"
done
# Demo Notes: its own OAuth 2.1 authorization server (the gateway's callback is the one redirect URI)
# and an MCP server answering with the notes of the user whose access token a call carries.
start_demo_upstream "$UPBIN" "$UP_PORT" "$GW" "$RUN/demo-upstream.log"
echo "$DEMO_UPSTREAM_PID" >"$RUN/demo-upstream.pid"
register_demo_upstream "$DB" "$UP_PORT" "$UPBIN"
# Users' connections are sealed with this key (README "Upstream credentials"), made once.
credential_key_file "$RUN/credential.keys"
# Three roles (sql/demo/schema.sql): model calls as ctxguard_gateway (EXECUTE on ctxguard only),
# upstream MCP discovery as ctxguard_discovery, the app's human screens as ctxguard_app.
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_DISCOVERY_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_discovery dbname=$DB" \
CTXGUARD_DEMO_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_app dbname=$DB" \
CTXGUARD_LISTEN="127.0.0.1:$GW_PORT" CTXGUARD_PROVIDER=offline \
CTXGUARD_DEMO=true CTXGUARD_DEMO_JWT_SECRET_FILE="$RUN/jwt_secret" \
CTXGUARD_CREDENTIAL_KEY_FILE="$RUN/credential.keys" CTXGUARD_PUBLIC_URL="$GW" \
  nohup "$CARGO_TARGET_DIR/release/ctxguard-gateway" >"$RUN/gateway.log" 2>&1 &
echo $! >"$RUN/gateway.pid"
for _ in $(seq 50); do curl -sf "$GW/ready" >/dev/null && break; sleep 0.2; done
curl -sf "$GW/ready" >/dev/null || { cat "$RUN/gateway.log"; exit 1; }

ALICE=$(mint --sub alice --tenant acme --roles ap_clerk --ttl 86400)
CAROL=$(mint --sub carol --tenant globex --roles ap_clerk --ttl 86400)
log "one request per demo page through the gateway"
for page in '{"pageType":"vendor_table","entity":null}|what vendors do I have?' \
            '{"pageType":"invoice_table","pageState":{"tab":"overdue"}}|which invoices are overdue?' \
            '{"pageType":"invoice_detail","entity":{"type":"invoice","id":"acme_inv3"}}|summarize this invoice' \
            '{"pageType":"document_viewer","entity":{"type":"document","id":"acme_guide"}}|search for certificate rotation' \
            '{"pageType":"invoice_detail","entity":{"type":"invoice","id":"glx_inv3"}}|summarize this invoice' \
            '{"pageType":"vendor_table","entity":null}|what are my notes?'; do
  ctx=${page%%|*} msg=${page#*|}
  echo; echo "\$ curl -s $GW/v1/chat -H \"Authorization: Bearer \$ALICE\" -H 'content-type: application/json' -d '{\"message\":\"$msg\",\"pageContext\":$ctx}'"
  curl -s "$GW/v1/chat" -H "Authorization: Bearer $ALICE" -H 'content-type: application/json' \
    -d "{\"message\":\"$msg\",\"pageContext\":$ctx}" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
if "error" in r: print("  ->", r["error"]["code"], "-", r["error"]["message"]); sys.exit()
print("  visible tools:", ", ".join(r["visibleTools"]))
for c in r["toolCalls"]: print("  tool call:", c["tool"], json.dumps(c["arguments"]), "->", c["decision"], c["code"] or "")
print("  answer:", r["answer"][:400].replace("\n", "\n          "))'
done

cat <<MSG

Everything is running:
  demo app    $GW/   (open it in a browser; switch users at the top right)
  gateway     $GW   (log: $RUN/gateway.log; provider: offline; demo mode)
  Demo Notes  http://127.0.0.1:$UP_PORT/mcp   (server \`notes\`, user_oauth; log: $RUN/demo-upstream.log)
  PostgreSQL  psql -h $RUN -p $PGPORT -U ctxguard_gateway $DB   (the model-call role: it can only call ctxguard)
Tokens (24 h) for the demo users:
  export ALICE=$ALICE   # acme, ap_clerk
  export CAROL=$CAROL   # globex, ap_clerk
  more:  /usr/bin/python3 scripts/mint_token.py mint --dir $RUN --sub bob --tenant acme --roles viewer
Try:
  curl -s $GW/v1/chat -H "Authorization: Bearer \$ALICE" -H 'content-type: application/json' \\
       -d '{"message":"what vendors do I have?","pageContext":{"pageType":"vendor_table","entity":null}}'
  curl -s $GW/v1/chat -H "Authorization: Bearer \$ALICE" -H 'accept: text/event-stream' -H 'content-type: application/json' \\
       -d '{"message":"summarize this invoice","pageContext":{"pageType":"invoice_detail","entity":{"type":"invoice","id":"acme_inv3"}}}'
MCP (Streamable HTTP at $GW/mcp; the page rides in a header, or set it with PUT $GW/v1/context):
  curl -s $GW/mcp -H "Authorization: Bearer \$ALICE" -H 'accept: application/json, text/event-stream' \\
       -H 'content-type: application/json' -H 'mcp-protocol-version: 2025-11-25' \\
       -H 'x-ctxguard-page: {"pageType":"invoice_detail","entity":{"type":"invoice","id":"acme_inv3"}}' \\
       -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}'
Each user's own connection (server \`notes\`, Demo Notes, with its own sign-in):
  1. In the demo app, on any page, ask "what are my notes?": notes.my_notes is refused with
     CONNECTION_REQUIRED, and the chat shows a "Connect notes" button.
  2. Click it: Demo Notes' sign-in page opens in a new tab. Pick who you are there (alice, carol, ...),
     Allow. The gateway stores the connection (sealed); "Your connections" shows notes connected.
  3. Ask again: the answer is that account's own notes. Disconnect (in "Your connections") revokes it
     at Demo Notes; the next question asks you to connect again.
Stop everything: scripts/stop.sh
MSG
