#!/usr/bin/env bash
# MCP tests with clients no one here wrote: the official MCP Python SDK as a client of the
# gateway's /mcp, and upstream servers built with the same SDK (HTTP and stdio). The gateway runs as
# an ordinary user; one of its stdio servers tries to read its secrets.
# Called by scripts/test.sh after the cluster is up; the extension must be installed.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"

# The gateway runs as an ordinary user (scripts/lib.sh: gateway_user) and starts the stdio servers
# from this venv, so as root it lives where that user can reach it.
if [ "$(id -u)" = 0 ]; then VENV=${CTXGUARD_VENV:-/var/cache/ctxguard/mcp-venv}
else VENV=${CTXGUARD_VENV:-$HOME/.cache/ctxguard/venv}; fi
mkdir -p "$(dirname "$VENV")"
(
  flock 9
  if ! "$VENV/bin/python" -c 'import mcp, pytest, opentelemetry.proto' 2>/dev/null; then
    log "python venv with the MCP SDK ($VENV)"
    /usr/bin/python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r tests/mcp/requirements.txt
  fi
) 9>"$VENV.lock"
gateway_user

DB=ctxguard_mcp
WORK=$RUN/mcp
rm -rf "$WORK" && mkdir -p "$WORK"
# The gateway's stdio servers (run as its user) write their logs and reports here.
[ "$(id -u)" = 0 ] && chown "$GW_USER" "$WORK"
log "database $DB with the demo data and an upstream MCP registry"
create_demo_db "$DB"
# Below Linux's ephemeral range (32768-60999): client sockets of earlier tests cannot hold them.
BASE=${CTXGUARD_MCP_TEST_PORT:-31900}
UP_PORT=$BASE FLAKY_PORT=$((BASE + 1)) DEAD_PORT=$((BASE + 2)) GW_PORT=$((BASE + 3)) RUNAS_PORT=$((BASE + 4))
CONF_PORT=$((BASE + 5)) COMPACT_PORT=$((BASE + 6)) OTLP_PORT=$((BASE + 7)) OTEL_GW_PORT=$((BASE + 8))
require_free_ports "$UP_PORT" "$FLAKY_PORT" "$DEAD_PORT" "$GW_PORT" "$RUNAS_PORT" "$CONF_PORT" "$COMPACT_PORT" \
  "$OTLP_PORT" "$OTEL_GW_PORT"  # CTXGUARD_MCP_TEST_PORT moves them
psql_su -d "$DB" -o /dev/null -v ON_ERROR_STOP=1 <<SQL
INSERT INTO ctxguard.mcp_servers (name, transport, url, bearer_token_env, description, default_access) VALUES
  ('scans', 'http', 'http://127.0.0.1:$UP_PORT/mcp', 'SCANS_TOKEN', 'Scanned invoices', 'allow'),
  ('flaky', 'http', 'http://127.0.0.1:$FLAKY_PORT/mcp', NULL, 'Goes away after discovery', 'allow'),
  ('dead', 'http', 'http://127.0.0.1:$DEAD_PORT/mcp', NULL, 'Never up', 'allow');
INSERT INTO ctxguard.mcp_servers (name, transport, command, args, description, default_access) VALUES
  ('notes', 'stdio', '$VENV/bin/python', ARRAY['$ROOT/tests/mcp/upstream_server.py', 'stdio', '$WORK/notes'], 'Internal notes', 'deny'),
  ('snoop', 'stdio', '$VENV/bin/python', ARRAY['$ROOT/tests/mcp/snoop_server.py', '$WORK/snoop'], 'Tries to read the gateway''s secrets', 'deny'),
  ('stuffer', 'stdio', '$VENV/bin/python', ARRAY['$ROOT/tests/mcp/stuffing_server.py', '$WORK/stuffer'], 'Thirty tools stuffed with the invoice page''s words', 'allow'),
  ('ghost', 'stdio', '/nonexistent/mcp-server', '{}', 'Command missing', 'allow');
INSERT INTO ctxguard.mcp_server_grants (server, principal, access) VALUES ('notes', 'role:ap_clerk', 'allow');
-- One statement per server: every scans tool that can bind the invoice on the page gets this policy.
SELECT ctxguard.set_server_policy('scans', '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "read_only": true}');
SELECT ctxguard.set_server_policy('flaky', '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "read_only": true}');
SELECT ctxguard.set_server_policy('notes', '{"page_types": ["*"], "read_only": true}');
SELECT ctxguard.set_server_policy('stuffer', '{"page_types": ["invoice_detail"], "read_only": true}');
-- A catalog name with "__" in it (listed as vendor__report__daily) and a title.
SELECT ctxguard.register_tool('vendor.report__daily', 'Daily report of the vendors.',
    '{"type": "object", "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 100}}, "additionalProperties": false}',
    'demo.vendor_list(jsonb)', '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}', title => 'Daily vendor report');
SQL

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
"$VENV/bin/python" tests/mcp/upstream_server.py http "$UP_PORT" "$WORK/scans" >"$WORK/scans.log" 2>&1 & PIDS+=($!)
"$VENV/bin/python" tests/mcp/upstream_server.py http "$FLAKY_PORT" "$WORK/flaky" >"$WORK/flaky.log" 2>&1 & FLAKY_PID=$!; PIDS+=($!)
for port in "$UP_PORT" "$FLAKY_PORT"; do
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
done

# A database whose registry holds only the snooping stdio server, for a gateway that runs its stdio
# servers as another user (test_a_stdio_server_as_another_user_...; root only).
STDIO_USER=${CTXGUARD_STDIO_USER:-ctxguard-mcp}
if [ "$(id -u)" = 0 ]; then
  id -u "$STDIO_USER" >/dev/null 2>&1 ||
    useradd --system --no-create-home --shell /usr/sbin/nologin "$STDIO_USER" 2>/dev/null || id -u "$STDIO_USER" >/dev/null
  mkdir -p "$WORK/snoop-runas" && chown "$STDIO_USER" "$WORK/snoop-runas"
fi
psql_su -d postgres -c "DROP DATABASE IF EXISTS ${DB}_runas WITH (FORCE)" -c "CREATE DATABASE ${DB}_runas"
psql_su -d "${DB}_runas" -o /dev/null -v ON_ERROR_STOP=1 <<SQL
SET client_min_messages = warning;
CREATE EXTENSION ctxguard;
INSERT INTO ctxguard.mcp_servers (name, transport, command, args, description) VALUES
  ('snoop', 'stdio', '$VENV/bin/python', ARRAY['$ROOT/tests/mcp/snoop_server.py', '$WORK/snoop-runas'], 'Tries to read the gateway''s secrets');
SQL

# Not the address the tests use: what the gateway advertises comes from here, never from Host.
PUBLIC_URL=https://ctxguard.test
log "gateway on :$GW_PORT, as $GW_USER, with its secrets in the environment, in files and on its command line"
GWBIN=$(test_gateway_bin)
# Each secret is a distinct string the snooping stdio server must not find. The database ignores the
# passwords (trust authentication); the gateway must still keep them to itself.
DB_SECRET=db-secret-$RANDOM$RANDOM ARGV_SECRET=argv-secret-$RANDOM$RANDOM KEY_SECRET=sk-file-secret-$RANDOM$RANDOM
ENV_SECRET=env-secret-$RANDOM$RANDOM
printf '%s\n' "$KEY_SECRET" >"$WORK/llm_api_key"
printf '%s\n' server-secret-for-scans >"$WORK/scans_token"
[ "$(id -u)" = 0 ] && chown "$GW_USER" "$WORK/llm_api_key" "$WORK/scans_token"
chmod 600 "$WORK/llm_api_key" "$WORK/scans_token"
SCANS_TOKEN_FILE="$WORK/scans_token" UNRELATED_SECRET="$ENV_SECRET" \
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB password=$DB_SECRET" \
CTXGUARD_LLM_API_KEY_FILE="$WORK/llm_api_key" \
CTXGUARD_LISTEN="127.0.0.1:$GW_PORT" CTXGUARD_PROVIDER=offline CTXGUARD_MCP_CONNECT_TIMEOUT_MS=15000 \
CTXGUARD_PUBLIC_URL="$PUBLIC_URL" CTXGUARD_MCP_ALLOWED_ORIGINS="http://app.test:8080,http://127.0.0.1:$CONF_PORT" \
CTXGUARD_MCP_SESSION_IDLE_TIMEOUT_MS=3000 CTXGUARD_MCP_KEEPALIVE_MS=300 \
CTXGUARD_TOOL_BUDGET=1000 \
  "${GW_AS[@]}" "$GWBIN" \
  --discovery-database-url "host=$RUN port=$PGPORT user=ctxguard_discovery dbname=$DB password=$ARGV_SECRET" \
  >"$WORK/gateway.log" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do grep -q "upstream MCP discovery done" "$WORK/gateway.log" && break; sleep 0.1; done
grep -q "upstream MCP discovery done" "$WORK/gateway.log" || { cat "$WORK/gateway.log"; exit 1; }
# Discovered tools are recorded through the discovery role (the gateway role may not).
if grep -E "could not record|discovered MCP tools are not recorded" "$WORK/gateway.log"; then exit 1; fi
kill "$FLAKY_PID"  # discovered, then gone
# The tests above run on full lists (CTXGUARD_TOOL_BUDGET=1000: the invoice page shows more than 30
# tools). A second gateway on the same database keeps the default budget (30 tools), so the invoice
# page gets the compact list there (issue 31: the test_compact_* tests); it records nothing.
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_LISTEN="127.0.0.1:$COMPACT_PORT" CTXGUARD_PROVIDER=offline CTXGUARD_MCP_DISCOVER=false \
CTXGUARD_MCP_CONNECT_TIMEOUT_MS=15000 SCANS_TOKEN_FILE="$WORK/scans_token" \
  "${GW_AS[@]}" "$GWBIN" >"$WORK/gateway-compact.log" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$COMPACT_PORT/ready" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$COMPACT_PORT/ready" >/dev/null || { cat "$WORK/gateway-compact.log"; exit 1; }

export CTXGUARD_MCP_URL="http://127.0.0.1:$GW_PORT" CTXGUARD_MCP_WORK="$WORK" CTXGUARD_MCP_PUBLIC_URL="$PUBLIC_URL"
export CTXGUARD_MCP_COMPACT_URL="http://127.0.0.1:$COMPACT_PORT"
export CTXGUARD_SECRETS="$DB_SECRET,$ARGV_SECRET,$KEY_SECRET,$ENV_SECRET,server-secret-for-scans"
# For the gateway that runs its stdio servers as another user (root only: it needs the capabilities).
export CTXGUARD_GATEWAY_BIN="$GWBIN" CTXGUARD_GW_USER="$GW_USER"
export CTXGUARD_RUNAS_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=${DB}_runas"
export CTXGUARD_RUNAS_PORT="$RUNAS_PORT" CTXGUARD_STDIO_USER="$STDIO_USER"
export CTXGUARD_ADMIN_PSQL="host=$RUN port=$PGPORT user=postgres dbname=$DB"
# The tracing gateway of test_telemetry.py (it starts it, and its OTLP receiver, itself).
export CTXGUARD_MCP_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB"
export CTXGUARD_OTEL_PORTS="$OTLP_PORT,$OTEL_GW_PORT"
export TOK_ALICE=$(mint --sub alice --tenant acme --roles ap_clerk)
export TOK_BOB=$(mint --sub bob --tenant acme --roles viewer)
export TOK_CAROL=$(mint --sub carol --tenant globex --roles ap_clerk)
export TOK_NEWCOMER=$(mint --sub newcomer --tenant acme --roles ap_clerk)
export TOK_DANA=$(mint --sub dana --tenant acme --roles ap_clerk)
export TOK_FORGED=$(mint --sub alice --tenant acme --roles ap_clerk --bad-signature)
export TOK_EXPIRED=$(mint --sub alice --tenant acme --roles ap_clerk --ttl -120)
# The official TypeScript SDK client (test_the_typescript_sdk_client_...): Node and the SDK.
source tests/mcp/node.sh
export CTXGUARD_NODE="$NODE_BIN/node" CTXGUARD_TS_SDK="$TS_SDK"
log "MCP tests (official Python and TypeScript SDK clients; MCPServer upstreams over HTTP and stdio)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/mcp/test_mcp.py tests/mcp/test_telemetry.py "$@"
[ $# -gt 0 ] || source tests/mcp/conformance.sh
