#!/usr/bin/env bash
# The demo app in a real browser: Debian's chromium, headless, driven by Playwright (playwright-core
# from npm; it never downloads a browser). Called by scripts/test.sh after the cluster is up; the
# extension must be installed. Installs chromium and the npm package when missing.
#   CTXGUARD_UI_SCREENSHOTS=docs/screenshots bash tests/ui/run.sh   # also refresh the screenshots
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v npm >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
want=$(node -p "require('./tests/ui/package.json').devDependencies['playwright-core']")
have=$(node -p "require('./tests/ui/node_modules/playwright-core/package.json').version" 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  log "npm ci (tests/ui)"
  (cd tests/ui && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi

DB=ctxguard_ui
WORK=$RUN/ui
rm -rf "$WORK" && mkdir -p "$WORK"
log "database $DB with the demo data"
create_demo_db "$DB"

GW_PORT=${CTXGUARD_UI_TEST_PORT:-31920}
# Demo Notes, the upstream that needs each user's own connection (scripts/demo.sh runs it too).
UP_PORT=$((GW_PORT + 1))
require_free_ports "$GW_PORT" "$UP_PORT"
GW="http://127.0.0.1:$GW_PORT"
# The gateway runs as an ordinary user (scripts/lib.sh), with its own copy of the demo's key and a
# credential key of its own.
gateway_user
install -m 600 "$RUN/jwt_secret" "$WORK/jwt_secret"
credential_key_file "$WORK/credential.keys"
[ "$(id -u)" = 0 ] && chown "$GW_USER" "$WORK/jwt_secret" "$WORK/credential.keys"
GWBIN=$(test_gateway_bin)
UPBIN=$(demo_upstream_bin "${CTXGUARD_TEST_GATEWAY_PROFILE:-debug}")
log "Demo Notes on :$UP_PORT (server notes, user_oauth)"
start_demo_upstream "$UPBIN" "$UP_PORT" "$GW" "$WORK/demo-upstream.log"
trap 'kill $DEMO_UPSTREAM_PID 2>/dev/null || true' EXIT
register_demo_upstream "$DB" "$UP_PORT" "$UPBIN"
log "gateway in demo mode on :$GW_PORT, as $GW_USER"
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_DEMO_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_app dbname=$DB" \
CTXGUARD_LISTEN="127.0.0.1:$GW_PORT" CTXGUARD_PROVIDER=offline \
CTXGUARD_DEMO=true CTXGUARD_DEMO_JWT_SECRET_FILE="$WORK/jwt_secret" \
CTXGUARD_CREDENTIAL_KEY_FILE="$WORK/credential.keys" CTXGUARD_PUBLIC_URL="$GW" \
  "${GW_AS[@]}" "$GWBIN" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
trap 'kill $GW_PID $DEMO_UPSTREAM_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$GW_PORT/ready" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$GW_PORT/ready" >/dev/null || { cat "$WORK/gateway.log"; exit 1; }

log "UI tests in headless chromium"
shots=${CTXGUARD_UI_SCREENSHOTS:-$WORK/screenshots}
[[ "$shots" = /* ]] || shots=$ROOT/$shots
CTXGUARD_UI_URL="$GW" CTXGUARD_UI_UPSTREAM_URL="http://127.0.0.1:$UP_PORT" CTXGUARD_UI_UPSTREAM_LOG="$WORK/demo-upstream.log" \
  CTXGUARD_UI_SCREENSHOTS="$shots" \
  node --test tests/ui/demo.test.mjs
echo "screenshots: $shots"
