#!/usr/bin/env bash
# Issue 33 end to end, with real components: an upstream MCP server that authenticates its callers
# itself (tests/credentials/whoami_server.py, the official Python SDK), the gateway with a
# credential key file, and the database. Tenant secrets: set by each tenant's admin through the
# gateway (write-only), each tenant's calls carry its own secret, never another's; a user_oauth
# server without the user's connection answers CONNECTION_REQUIRED; no secret appears in the
# gateway log, the server log, audit rows, the credential rows or any answer.
# Called by scripts/test.sh after the client suites (the cluster is up, the extension installed).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then VENV=${CTXGUARD_VENV:-/var/cache/ctxguard/mcp-venv}
else VENV=${CTXGUARD_VENV:-$HOME/.cache/ctxguard/venv}; fi
"$VENV/bin/python" -c 'import mcp' 2>/dev/null || { echo "run tests/mcp/run.sh first (it makes $VENV)" >&2; exit 1; }
BASE=${CTXGUARD_CREDS_TEST_PORT:-31960}
UP_PORT=$BASE GW_PORT=$((BASE + 1)) AS_PORT=$((BASE + 2))
require_free_ports "$UP_PORT" "$GW_PORT" "$AS_PORT"
AS="http://127.0.0.1:$AS_PORT"
: "${OIDC_NODE_MODULES:=$(bash tests/oidc/install.sh)}"
GW="http://127.0.0.1:$GW_PORT"
WORK=$RUN/credentials
rm -rf "$WORK" && mkdir -p "$WORK"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
fail() { echo "credentials test: $*" >&2; echo "--- gateway log" >&2; tail -20 "$WORK/gateway.log" >&2; exit 1; }

# Secrets no one but the upstream and each tenant's admin knows.
SEK_ACME="sek-acme-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
SEK_GLOBEX="sek-globex-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
WHOAMI_SECRETS="acme=$SEK_ACME,globex=$SEK_GLOBEX" WHOAMI_ISSUER="$AS" \
  "$VENV/bin/python" tests/credentials/whoami_server.py "$UP_PORT" "$WORK/upstream" >"$WORK/upstream.log" 2>&1 & PIDS+=($!)
# The upstream's authorization server (access tokens live 62 s: a minute's margin refreshes them
# two seconds after they are issued).
start_as() {
  OIDC_NODE_MODULES="$OIDC_NODE_MODULES" AS_PORT="$AS_PORT" GW_CALLBACK="http://127.0.0.1:$GW_PORT/v1/connections/callback" \
  IDP_SECRET_FILE="$RUN/jwt_secret" AT_TTL=62 node tests/credentials/upstream_as.mjs >>"$WORK/as.log" 2>&1 & AS_PID=$!
  PIDS+=($AS_PID)
  for _ in $(seq 300); do grep -q "^ready" "$WORK/as.log" && break; sleep 0.1; done
}
start_as

DB=ctxguard_creds
create_demo_db "$DB"
psql_su -d "$DB" -o /dev/null -v ON_ERROR_STOP=1 <<SQL
INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access, credential_mode)
VALUES ('ledgerapi', 'http', 'http://127.0.0.1:$UP_PORT/mcp', 'Ledger API (one secret per tenant)', 'allow', 'tenant_secret'),
       ('drive', 'http', 'http://127.0.0.1:$UP_PORT/mcp', 'Drive (each user''s own)', 'allow', 'user_oauth'),
       ('fed', 'http', 'http://127.0.0.1:$UP_PORT/mcp', 'Federated (token exchange)', 'allow', 'token_exchange');
UPDATE ctxguard.mcp_servers SET credential_config = jsonb_build_object('issuer', '$AS', 'client_id', 'ctxguard-gw',
       'client_secret_env', 'DRIVE_CLIENT_SECRET', 'scopes', jsonb_build_array('openid', 'offline_access', 'files'))
 WHERE name IN ('drive', 'fed');
SELECT ctxguard.set_server_policy(s, '{"page_types": "*"}') FROM unnest('{ledgerapi,drive,fed}'::text[]) s;
SELECT ctxguard.sync_mcp_tools(s, '[{"name": "whoami", "description": "Who am I.", "inputSchema": {"type": "object"}}]')
  FROM unnest('{ledgerapi,drive,fed}'::text[]) s;
SQL

KEYS=$WORK/credential.keys
( umask 077; echo "k1:$(head -c 32 /dev/urandom | base64)" >"$KEYS" )
GWBIN=$(test_gateway_bin)
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_LISTEN="127.0.0.1:$GW_PORT" CTXGUARD_PROVIDER=offline CTXGUARD_MCP_DISCOVER=false \
CTXGUARD_CREDENTIAL_KEY_FILE="$KEYS" DRIVE_CLIENT_SECRET=gw-secret RUST_LOG=info \
  "$GWBIN" >"$WORK/gateway.log" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$GW_PORT") 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$UP_PORT") 2>/dev/null && break; sleep 0.1; done
LOG_START=$(stat -c %s "$RUN/postgres.log" 2>/dev/null || echo 0)

CTXGUARD_CREDS_GW="$GW" CTXGUARD_CREDS_WORK="$WORK" SEK_ACME="$SEK_ACME" SEK_GLOBEX="$SEK_GLOBEX" \
TOK_ALICE="$(mint --sub alice --tenant acme --roles ap_clerk)" \
TOK_BOB="$(mint --sub bob --tenant acme --roles viewer)" \
TOK_CAROL="$(mint --sub carol --tenant globex --roles ap_clerk)" \
TOK_TINA="$(mint --sub tina --tenant acme --roles tenant_admin)" \
TOK_GINA="$(mint --sub gina --tenant globex --roles tenant_admin)" \
  /usr/bin/python3 tests/credentials/test_credentials.py || fail "the client checks failed"

log "user_oauth and token_exchange against the upstream's authorization server"
oauth() {
  CTXGUARD_CREDS_GW="$GW" CTXGUARD_CREDS_AS="$AS" CTXGUARD_CREDS_WORK="$WORK" \
  TOK_ALICE="$(mint --sub alice --tenant acme --roles ap_clerk)" TOK_BOB="$(mint --sub bob --tenant acme --roles viewer)" \
  TOK_CAROL="$(mint --sub carol --tenant globex --roles ap_clerk)" TOK_MALLORY="$(mint --sub mallory --tenant acme --roles viewer)" \
    /usr/bin/python3 tests/credentials/test_oauth.py "$1" || { echo "--- as log"; tail -20 "$WORK/as.log"; fail "oauth phase $1"; }
}
oauth connect
grep -q "grant refresh_token" "$WORK/as.log" || fail "no refresh grant reached the authorization server"
grep -q "^revocation 200" "$WORK/as.log" || fail "the disconnect revoked nothing at the authorization server"
grep -q "exchanged for alice" "$WORK/as.log" || fail "no token exchange for alice"
# The authorization server forgets every grant (a restart of its in-memory store).
kill "$AS_PID"; wait "$AS_PID" 2>/dev/null || true
start_as
oauth forgotten

log "MCP clients without the user's connection: the connect URL, an elicitation or input_required"
CTXGUARD_CREDS_GW="$GW" CTXGUARD_CREDS_AS="$AS" CTXGUARD_CREDS_WORK="$WORK" \
TOK_ALICE="$(mint --sub alice --tenant acme --roles ap_clerk)" TOK_BOB="$(mint --sub bob --tenant acme --roles viewer)" \
TOK_CAROL="$(mint --sub carol --tenant globex --roles ap_clerk)" TOK_MALLORY="$(mint --sub mallory --tenant acme --roles viewer)" \
  "$VENV/bin/python" tests/credentials/test_mcp_connect.py || { echo "--- as log"; tail -20 "$WORK/as.log"; fail "MCP clients"; }

# No secret anywhere it must not be: the gateway's log, the server's log, audit rows, the
# credential rows (ciphertext only), saved turns.
for s in "$SEK_ACME" "$SEK_GLOBEX"; do
  ! grep -qF "$s" "$WORK/gateway.log" || fail "a tenant secret reached the gateway log"
  ! tail -c +"$((LOG_START + 1))" "$RUN/postgres.log" | grep -qF "$s" || fail "a tenant secret reached the server log"
  found=$(psql_su -d "$DB" -At -v s="$s" <<'SQL'
SELECT count(*) FROM ctxguard.audit_log a WHERE a::text LIKE '%' || :'s' || '%';
SELECT count(*) FROM ctxguard.upstream_credentials c
 WHERE c::text LIKE '%' || :'s' || '%' OR position(convert_to(:'s', 'UTF8') IN c.ciphertext) > 0;
SELECT count(*) FROM ctxguard.conversation_turns t WHERE t::text LIKE '%' || :'s' || '%';
SQL
)
  [ "$(echo $found)" = "0 0 0" ] || fail "a tenant secret is in audit rows, credential rows or turns ($found)"
done
[ "$(psql_su -d "$DB" -At -c "SELECT count(*) FROM ctxguard.upstream_credentials WHERE mode = 'tenant_secret'")" = 2 ] \
  || fail "expected the two tenants' secrets to be stored (sealed)"
# Each tenant's calls carried its own secret: the upstream saw both, and nothing else got through.
grep -qxF "Bearer $SEK_ACME" "$WORK/upstream/auth.log" || fail "the upstream never saw acme's secret"
grep -qxF "Bearer $SEK_GLOBEX" "$WORK/upstream/auth.log" || fail "the upstream never saw globex's secret"
# Every token the upstream saw (users' own, exchanged) is in no log, row or answer either.
n=0
while read -r line; do
  tok=${line#Bearer }
  [ ${#tok} -gt 40 ] || continue
  n=$((n + 1))
  ! grep -qF "$tok" "$WORK/gateway.log" "$WORK/answers.jsonl" || fail "an upstream token reached the gateway log or an answer"
  ! tail -c +"$((LOG_START + 1))" "$RUN/postgres.log" | grep -qF "$tok" || fail "an upstream token reached the server log"
done < <(sort -u "$WORK/upstream/auth.log" | grep -v "sek-")
[ "$n" -ge 4 ] || fail "expected the upstream to have seen several users' tokens (saw $n)"
[ "$(psql_su -d "$DB" -At -c "SELECT count(*) FROM ctxguard.audit_log WHERE decision LIKE 'credential%'")" -gt 0 ] || fail "no credential change was audited"
echo "ok: tenant secrets, users' own connections and exchanged tokens: per owner, in no log, row or answer"
