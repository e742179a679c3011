#!/usr/bin/env bash
# MCP tests with clients no one here wrote: the official MCP Python SDK as a client of the
# gateway's /mcp, and upstream servers built with the same SDK (HTTP and stdio).
# Called by scripts/test.sh after the cluster is up; the extension must be installed.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"

VENV=${CTXGUARD_VENV:-$HOME/.cache/ctxguard/venv}
if ! "$VENV/bin/python" -c 'import mcp, pytest' 2>/dev/null; then
  log "python venv with the MCP SDK ($VENV)"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r tests/mcp/requirements.txt
fi

DB=ctxguard_mcp
WORK=$RUN/mcp
rm -rf "$WORK" && mkdir -p "$WORK"
log "database $DB with the demo data and an upstream MCP registry"
create_demo_db "$DB"
# Below Linux's ephemeral range (32768-60999): client sockets of earlier tests cannot hold them.
BASE=${CTXGUARD_MCP_TEST_PORT:-31900}
UP_PORT=$BASE FLAKY_PORT=$((BASE + 1)) DEAD_PORT=$((BASE + 2)) GW_PORT=$((BASE + 3))
require_free_ports "$UP_PORT" "$FLAKY_PORT" "$DEAD_PORT" "$GW_PORT"  # CTXGUARD_MCP_TEST_PORT moves them
psql_su -d "$DB" -o /dev/null -v ON_ERROR_STOP=1 <<SQL
INSERT INTO ctxguard.mcp_servers (name, transport, url, bearer_token_env, description, default_access) VALUES
  ('scans', 'http', 'http://127.0.0.1:$UP_PORT/mcp', 'SCANS_TOKEN', 'Scanned invoices', 'allow'),
  ('flaky', 'http', 'http://127.0.0.1:$FLAKY_PORT/mcp', NULL, 'Goes away after discovery', 'allow'),
  ('dead', 'http', 'http://127.0.0.1:$DEAD_PORT/mcp', NULL, 'Never up', 'allow');
INSERT INTO ctxguard.mcp_servers (name, transport, command, args, description, default_access) VALUES
  ('notes', 'stdio', '$VENV/bin/python', ARRAY['$ROOT/tests/mcp/upstream_server.py', 'stdio', '$WORK/notes'], 'Internal notes', 'deny'),
  ('ghost', 'stdio', '/nonexistent/mcp-server', '{}', 'Command missing', 'allow');
INSERT INTO ctxguard.mcp_server_grants (server, principal, access) VALUES ('notes', 'role:ap_clerk', 'allow');
-- One statement per server: every scans tool that can bind the invoice on the page gets this policy.
SELECT ctxguard.set_server_policy('scans', '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "read_only": true}');
SELECT ctxguard.set_server_policy('flaky', '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "read_only": true}');
SELECT ctxguard.set_server_policy('notes', '{"page_types": ["*"], "read_only": true}');
SQL

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
"$VENV/bin/python" tests/mcp/upstream_server.py http "$UP_PORT" "$WORK/scans" >"$WORK/scans.log" 2>&1 & PIDS+=($!)
"$VENV/bin/python" tests/mcp/upstream_server.py http "$FLAKY_PORT" "$WORK/flaky" >"$WORK/flaky.log" 2>&1 & FLAKY_PID=$!; PIDS+=($!)
for port in "$UP_PORT" "$FLAKY_PORT"; do
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
done

log "gateway on :$GW_PORT"
cargo build --locked --release -p ctxguard-gateway >/dev/null
SCANS_TOKEN=server-secret-for-scans \
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_DISCOVERY_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_discovery dbname=$DB" \
CTXGUARD_LISTEN="127.0.0.1:$GW_PORT" CTXGUARD_PROVIDER=offline CTXGUARD_MCP_CONNECT_TIMEOUT_MS=15000 \
  "$CARGO_TARGET_DIR/release/ctxguard-gateway" >"$WORK/gateway.log" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do grep -q "upstream MCP discovery done" "$WORK/gateway.log" && break; sleep 0.1; done
grep -q "upstream MCP discovery done" "$WORK/gateway.log" || { cat "$WORK/gateway.log"; exit 1; }
# Discovered tools are recorded through the discovery role (the gateway role may not).
if grep -E "could not record|discovered MCP tools are not recorded" "$WORK/gateway.log"; then exit 1; fi
kill "$FLAKY_PID"  # discovered, then gone

export CTXGUARD_MCP_URL="http://127.0.0.1:$GW_PORT" CTXGUARD_MCP_WORK="$WORK"
export CTXGUARD_ADMIN_PSQL="host=$RUN port=$PGPORT user=postgres dbname=$DB"
export TOK_ALICE=$(mint --sub alice --tenant acme --roles ap_clerk)
export TOK_BOB=$(mint --sub bob --tenant acme --roles viewer)
export TOK_CAROL=$(mint --sub carol --tenant globex --roles ap_clerk)
export TOK_NEWCOMER=$(mint --sub newcomer --tenant acme --roles ap_clerk)
export TOK_FORGED=$(mint --sub alice --tenant acme --roles ap_clerk --bad-signature)
export TOK_EXPIRED=$(mint --sub alice --tenant acme --roles ap_clerk --ttl -120)
log "MCP tests (official Python SDK client; MCPServer upstreams over HTTP and stdio)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/mcp/test_mcp.py "$@"
