#!/usr/bin/env bash
# MCP authorization end to end against a real OpenID provider (npm oidc-provider): the provider's
# JWKS written by `ctxguard-gateway jwks-sync` (the gateway binary, as a DBA's timer runs it), a
# database configured for the provider (issuer, audience = the gateway's /mcp, claim paths), the
# gateway with CTXGUARD_OAUTH_ISSUER, and the official MCP Python SDK's OAuth client
# (tests/oidc/test_mcp_oauth.py). Called by scripts/test.sh after the client integration tests (which
# install the provider and make the keys); the cluster is up and the extension installed.
#   OIDC_NODE_MODULES, OIDC_DIR, OIDC_PORT: as scripts/test.sh sets them (this script uses OIDC_PORT+2, +3).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"
: "${OIDC_NODE_MODULES:=$(bash tests/oidc/install.sh)}" "${OIDC_DIR:=$RUN/oidc}" "${OIDC_PORT:=${CTXGUARD_OIDC_TEST_PORT:-31940}}"
bash tests/oidc/keys.sh "$OIDC_DIR"
if [ "$(id -u)" = 0 ]; then VENV=${CTXGUARD_VENV:-/var/cache/ctxguard/mcp-venv}
else VENV=${CTXGUARD_VENV:-$HOME/.cache/ctxguard/venv}; fi
"$VENV/bin/python" -c 'import mcp' 2>/dev/null || { echo "run tests/mcp/run.sh first (it makes $VENV)" >&2; exit 1; }

P_PORT=$((OIDC_PORT + 2)) GW_PORT=$((OIDC_PORT + 3))
require_free_ports "$P_PORT" "$GW_PORT"
ISSUER="http://127.0.0.1:$P_PORT" GW="http://127.0.0.1:$GW_PORT"
WORK=$RUN/oidc-mcp
rm -rf "$WORK" && mkdir -p "$WORK"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  psql_su -d postgres -o /dev/null -c "ALTER SYSTEM RESET ctxguard.jwks_file" -c "SELECT pg_reload_conf()" || true
}
trap cleanup EXIT

OIDC_NODE_MODULES="$OIDC_NODE_MODULES" OIDC_PORT="$P_PORT" OIDC_KEYS="$OIDC_DIR/rsa1.pem,$OIDC_DIR/ec1.pem" \
  node tests/oidc/provider.mjs >"$WORK/provider.log" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do grep -q "^ready" "$WORK/provider.log" && break; sleep 0.1; done
grep -q "^ready $ISSUER" "$WORK/provider.log" || { cat "$WORK/provider.log"; exit 1; }

GWBIN=$(test_gateway_bin)
log "jwks-sync from $ISSUER (the subcommand, as a timer runs it)"
rm -f "$OIDC_DIR/jwks.json"
"$GWBIN" jwks-sync --issuer "$ISSUER" --out "$OIDC_DIR/jwks.json" | tee "$WORK/sync.out"
grep -q "^updated .*: 2 key(s) \[rsa1:RSA-2048, ec1:EC P-256\]" "$WORK/sync.out"
"$GWBIN" jwks-sync --url "$ISSUER/jwks" --out "$OIDC_DIR/jwks.json" | grep -q "^unchanged "
# A bad source leaves the file as it was, with exit status 1.
before=$(sha256sum <"$OIDC_DIR/jwks.json")
if "$GWBIN" jwks-sync --url "$ISSUER/.well-known/openid-configuration" --out "$OIDC_DIR/jwks.json" 2>"$WORK/sync.err"; then
  echo "jwks-sync accepted a document that is not a JWKS" >&2; exit 1
fi
grep -q "not usable, the file is left as it was" "$WORK/sync.err"
if "$GWBIN" jwks-sync --url "http://example.com/jwks" --out "$OIDC_DIR/jwks.json" 2>>"$WORK/sync.err"; then
  echo "jwks-sync fetched over plain http from a non-loopback host" >&2; exit 1
fi
[ "$(sha256sum <"$OIDC_DIR/jwks.json")" = "$before" ] || { echo "a failed jwks-sync changed the file" >&2; exit 1; }

DB=ctxguard_oidc
log "database $DB configured for the provider"
create_demo_db "$DB"
psql_su -d "$DB" -o /dev/null <<SQL
ALTER SYSTEM SET ctxguard.jwks_file = '$OIDC_DIR/jwks.json';
SELECT pg_reload_conf();
ALTER DATABASE $DB SET ctxguard.jwt_issuer = '$ISSUER';
ALTER DATABASE $DB SET ctxguard.jwt_audience = '$GW/mcp';
ALTER DATABASE $DB SET ctxguard.claim_tenant = '"https://ctxguard.test/tenant"';
ALTER DATABASE $DB SET ctxguard.claim_roles = 'realm_access.roles';
SQL
# Wait until new sessions see the file setting (the postmaster has re-read its configuration).
for _ in $(seq 300); do
  [ "$(psql_su -d "$DB" -XAtc "SHOW ctxguard.jwks_file")" = "$OIDC_DIR/jwks.json" ] && break; sleep 0.1
done

log "gateway on :$GW_PORT with CTXGUARD_OAUTH_ISSUER=$ISSUER"
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_LISTEN="127.0.0.1:$GW_PORT" CTXGUARD_PROVIDER=offline CTXGUARD_MCP_DISCOVER=false \
CTXGUARD_OAUTH_ISSUER="$ISSUER" CTXGUARD_OAUTH_SCOPES=ctxguard \
  "$GWBIN" >"$WORK/gateway.log" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$GW_PORT") 2>/dev/null && break; sleep 0.1; done

log "MCP OAuth end to end (official Python SDK OAuth client, authorization code + PKCE, scripted consent)"
CTXGUARD_OIDC_GW="$GW" CTXGUARD_OIDC_ISSUER="$ISSUER" "$VENV/bin/python" tests/oidc/test_mcp_oauth.py \
  || { echo "--- gateway log"; tail -20 "$WORK/gateway.log"; echo "--- provider log"; tail -20 "$WORK/provider.log"; exit 1; }
