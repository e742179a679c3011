# Shared helpers for scripts/*.sh: a throwaway PostgreSQL cluster (major PG_MAJOR, default 15) with
# ctxguard preloaded. Source it; do not run it.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The PostgreSQL major, resolved once here for setup, demo, tests and packaging. Debian 12 packages
# PostgreSQL 15 (/usr/lib/postgresql/15); every other major is built by scripts/setup.sh from Debian's
# source package into a cache outside the checkout, $PG_CACHE/pgNN (a prefix with bin/, lib/, share/).
PG_MAJOR=${PG_MAJOR:-15}
export PG_MAJOR
PG_SUPPORTED_MAJORS="15 16 17 18"
case " $PG_SUPPORTED_MAJORS " in *" $PG_MAJOR "*) ;; *)
  echo "PG_MAJOR=$PG_MAJOR: ctxguard supports PostgreSQL $PG_SUPPORTED_MAJORS" >&2; exit 2 ;;
esac
PG_DEBIAN_MAJOR=15
if [ "$(id -u)" = 0 ]; then PG_CACHE=${CTXGUARD_PG_CACHE:-/var/cache/ctxguard}
else PG_CACHE=${CTXGUARD_PG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ctxguard}; fi
# Where major $1 is installed: CTXGUARD_PG<NN>_PREFIX when set (a PostgreSQL of your own, with
# bin/pg_config and pgTAP: setup.sh then builds nothing), else Debian's package directory for 15 and the
# cache prefix for the others.
pg_prefix() {
  local own=CTXGUARD_PG$1_PREFIX
  if [ -n "${!own:-}" ]; then echo "${!own}"
  elif [ "$1" = "$PG_DEBIAN_MAJOR" ]; then echo "/usr/lib/postgresql/$1"
  else echo "$PG_CACHE/pg$1"; fi
}
pg_own_prefix() { local own=CTXGUARD_PG$1_PREFIX; [ -n "${!own:-}" ]; }
PG_BIN=$(pg_prefix "$PG_MAJOR")/bin
# psql, pg_prove's psql and pg_dump of this major first.
PATH=$PG_BIN:$PATH
# 15 keeps its cluster directory; each other major has its own. Ports (the base and up to 6 more:
# the cluster without preload, the package, pg_upgrade and release tests' clusters, pgbouncer) lie
# below Linux's ephemeral range (32768-60999), where a client socket of an earlier test could hold
# one when a cluster starts: 15: 25329, 16: 25160, 17: 25170, 18: 25180.
if [ "$PG_MAJOR" = "$PG_DEBIAN_MAJOR" ]; then
  RUN=${CTXGUARD_RUN:-/tmp/ctxguard-run}
  PGPORT=${CTXGUARD_PGPORT:-25329}
else
  RUN=${CTXGUARD_RUN:-/tmp/ctxguard-run-pg$PG_MAJOR}
  PGPORT=${CTXGUARD_PGPORT:-25${PG_MAJOR}0}
fi
PGDATA_DIR=$RUN/pgdata
PROFILE=${CTXGUARD_PROFILE:-release}
# More initdb options for start_cluster's cluster (pg_upgrade_test.sh matches the old cluster's checksums).
INITDB_OPTS=()
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

# Each line carries the wall-clock time and the seconds since the script began (where a run's time goes).
log() { printf '\033[1m==> [%s +%ss] %s\033[0m\n' "$(date +%T)" "$SECONDS" "$*" >&2; }

# The gateway binary the client suites run (tests/mcp, tests/oidc, tests/ui): by default the debug
# build scripts/test.sh has already made for the integration tests, so that CI compiles no second
# (release) gateway; CTXGUARD_TEST_GATEWAY_PROFILE=release runs them on the release build.
test_gateway_bin() {
  local profile=${CTXGUARD_TEST_GATEWAY_PROFILE:-debug} flag=()
  [ "$profile" = release ] && flag=(--release)
  cargo build --locked "${flag[@]}" -p ctxguard-gateway >/dev/null
  echo "$CARGO_TARGET_DIR/$profile/ctxguard-gateway"
}

# Run a command as the postgres OS user when we are root (initdb refuses root).
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

psql_su() { psql -X -q -v ON_ERROR_STOP=1 -h "$RUN" -p "$PGPORT" -U postgres "$@"; }

# Build and install the extension into PG_MAJOR's PostgreSQL (idempotent; cargo caches the build).
# cargo pgrx picks the feature pgNN from the pg_config's major.
install_extension() {
  log "building and installing ctxguard ($PROFILE) for PostgreSQL $PG_MAJOR"
  local flag=()
  [ "$PROFILE" = release ] && flag=(--release)
  local sudo=()
  [ "$(id -u)" = 0 ] || sudo=(--sudo)
  (cd "$ROOT/pg_ext/ctxguard" && cargo pgrx install "${flag[@]}" "${sudo[@]}" --pg-config "$PG_BIN/pg_config" >/dev/null)
  # Released install scripts (frozen), so that `CREATE EXTENSION ctxguard VERSION '<old>'` followed by
  # `ALTER EXTENSION ctxguard UPDATE` can be tested; cargo pgrx installs only the current one.
  local extdir
  extdir="$("$PG_BIN/pg_config" --sharedir)/extension"
  if [ "$(id -u)" = 0 ]; then
    cp "$ROOT"/pg_ext/ctxguard/sql/releases/ctxguard--*.sql "$extdir/"
  else
    sudo cp "$ROOT"/pg_ext/ctxguard/sql/releases/ctxguard--*.sql "$extdir/"
  fi
}

# Create (once) and start a local cluster with ctxguard in shared_preload_libraries.
start_cluster() {
  mkdir -p "$RUN"
  chmod 755 "$RUN"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$RUN"
  if [ ! -f "$PGDATA_DIR/PG_VERSION" ]; then
    log "initdb $PGDATA_DIR"
    as_pg "$PG_BIN/initdb" -D "$PGDATA_DIR" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 "${INITDB_OPTS[@]}" >/dev/null
    as_pg /usr/bin/python3 "$ROOT/scripts/mint_token.py" keygen --dir "$RUN"
    cat >>"$PGDATA_DIR/postgresql.conf" <<CONF
# --- ctxguard local cluster ---
listen_addresses = '127.0.0.1'
port = $PGPORT
unix_socket_directories = '$RUN'
max_connections = 200
shared_preload_libraries = 'ctxguard'
# Keys from files read by the server: never in a setting SHOW or pg_settings could reveal.
ctxguard.jwt_secret_file = '$RUN/jwt_secret'
ctxguard.jwt_public_key_file = '$RUN/ed25519_public_x'
ctxguard.jwt_audience = ''
log_min_messages = warning
CONF
  fi
  # The ledger (issue 13): one audit writer (a dynamic background worker) per database in use,
  # besides PostgreSQL's own workers; prepared transactions for the rollback-attack tests.
  # Added to clusters made before too (the restart below applies them).
  if ! grep -q '^# --- ctxguard ledger ---' "$PGDATA_DIR/postgresql.conf"; then
    as_pg tee -a "$PGDATA_DIR/postgresql.conf" >/dev/null <<CONF
# --- ctxguard ledger ---
max_worker_processes = 32
max_prepared_transactions = 10
CONF
  fi
  conf_port "$PGDATA_DIR"
  # A preloaded library is read once, at postmaster start: restart so a fresh install takes effect.
  if as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
    [ "${CTXGUARD_KEEP_RUNNING:-}" = 1 ] && return 0
    log "restarting PostgreSQL on port $PGPORT (to load the installed ctxguard)"
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -l "$RUN/postgres.log" -m fast -w restart >/dev/null
  else
    log "starting PostgreSQL on port $PGPORT"
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -l "$RUN/postgres.log" -w start >/dev/null
  fi
}

# The cluster in data directory $1 listens on port $2 (default $PGPORT). One made before its port
# moved (these ports were once in the ephemeral range) is given the new one (the last `port` line
# of the file wins) and stopped if it runs, so that its caller starts it there.
conf_port() {
  local conf=$1/postgresql.conf want=${2:-$PGPORT}
  if [ "$(sed -n 's/^port *= *\([0-9]*\).*/\1/p' "$conf" | tail -n 1)" != "$want" ]; then
    log "$1: port $want"
    echo "port = $want" | as_pg tee -a "$conf" >/dev/null
    stop_cluster_at "$1"
  fi
}

stop_cluster_at() {
  as_pg "$PG_BIN/pg_ctl" -D "$1" -m fast -w stop >/dev/null 2>&1 || true
}

stop_cluster() { stop_cluster_at "$PGDATA_DIR"; }

# A second cluster with the same keys but WITHOUT ctxguard preloaded (for the fail-closed tests).
start_cluster_without_preload() {
  local run=$1 port=$2
  mkdir -p "$run"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$run"
  if [ ! -f "$run/pgdata/PG_VERSION" ]; then
    as_pg "$PG_BIN/initdb" -D "$run/pgdata" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    cat >>"$run/pgdata/postgresql.conf" <<CONF
listen_addresses = ''
port = $port
unix_socket_directories = '$run'
ctxguard.jwt_secret = '$(cat "$RUN/jwt_secret")'
log_min_messages = warning
CONF
  fi
  conf_port "$run/pgdata" "$port"
  as_pg "$PG_BIN/pg_ctl" -D "$run/pgdata" status >/dev/null 2>&1 ||
    as_pg "$PG_BIN/pg_ctl" -D "$run/pgdata" -l "$run/postgres.log" -w start >/dev/null
}

# A second preloaded cluster whose shared-memory ledger tables are tiny, set in its postgresql.conf
# (tests/tests/capacity.rs: the sizes take effect, and one tenant filling its share leaves the
# others theirs): 64 slots per table, a tenant's share 25 %, a user's 10 %. Port: the base + 7.
# Database ctxguard_capacity with the demo's roles, pages and tools.
CAP_RUN=$RUN-capacity
CAP_PORT=$((PGPORT + 7))
start_capacity_cluster() {
  mkdir -p "$CAP_RUN"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$CAP_RUN"
  if [ ! -f "$CAP_RUN/pgdata/PG_VERSION" ]; then
    as_pg "$PG_BIN/initdb" -D "$CAP_RUN/pgdata" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    as_pg tee -a "$CAP_RUN/pgdata/postgresql.conf" >/dev/null <<CONF
listen_addresses = ''
port = $CAP_PORT
unix_socket_directories = '$CAP_RUN'
shared_preload_libraries = 'ctxguard'
max_worker_processes = 16
ctxguard.jwt_secret_file = '$RUN/jwt_secret'
ctxguard.jwt_public_key_file = '$RUN/ed25519_public_x'
ctxguard.jwt_audience = ''
log_min_messages = warning
ctxguard.ledger_generations = 64
ctxguard.ledger_document_calls = 64
ctxguard.ledger_coverage = 64
ctxguard.ledger_user_days = 64
ctxguard.ledger_owners = 64
ctxguard.ledger_tenant_share = 25
ctxguard.ledger_user_share = 10
CONF
  fi
  # The quota counters' table (issue 30), also in capacity clusters made before it.
  grep -q '^ctxguard.ledger_quotas' "$CAP_RUN/pgdata/postgresql.conf" ||
    echo "ctxguard.ledger_quotas = 64" | as_pg tee -a "$CAP_RUN/pgdata/postgresql.conf" >/dev/null
  conf_port "$CAP_RUN/pgdata" "$CAP_PORT"
  # Restarted, so that a fresh install (and an empty ledger) is what the test sees.
  as_pg "$PG_BIN/pg_ctl" -D "$CAP_RUN/pgdata" status >/dev/null 2>&1 &&
    as_pg "$PG_BIN/pg_ctl" -D "$CAP_RUN/pgdata" -m fast -w stop >/dev/null
  as_pg "$PG_BIN/pg_ctl" -D "$CAP_RUN/pgdata" -l "$CAP_RUN/postgres.log" -w start >/dev/null
  local cap=(psql -X -q -v ON_ERROR_STOP=1 -h "$CAP_RUN" -p "$CAP_PORT" -U postgres)
  "${cap[@]}" -d postgres -c "DROP DATABASE IF EXISTS ctxguard_capacity WITH (FORCE)" -c "CREATE DATABASE ctxguard_capacity"
  "${cap[@]}" -d ctxguard_capacity -o /dev/null -f "$ROOT/sql/demo/schema.sql"
  "${cap[@]}" -d ctxguard_capacity -o /dev/null -f "$ROOT/sql/demo/documents.sql" \
    -v tok_ingest_acme="$(mint --sub ingest-bot --tenant acme --roles doc_ingest)" \
    -v tok_ingest_globex="$(mint --sub ingest-bot --tenant globex --roles doc_ingest)"
}
stop_capacity_cluster() { stop_cluster_at "$CAP_RUN/pgdata"; }

# pgbouncer (Debian's package: 1.18 on Debian 12) in transaction mode between clients and this cluster,
# as the gateway runs behind it in production (README "Behind pgbouncer"): every database of the
# cluster, trust authentication for the roles in $PGB_DIR/userlist.txt, a server pool of
# ${PGBOUNCER_POOL_SIZE:-2} connections per database and role, and docs/deploy.md's timeouts
# (idle_transaction_timeout, query_timeout, query_wait_timeout). Admin console: database pgbouncer, user postgres.
PGBOUNCER_PORT=${CTXGUARD_PGBOUNCER_PORT:-$((PGPORT + 5))}
PGB_DIR=$RUN/pgbouncer
start_pgbouncer() {
  if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
    log "installing pgbouncer"
    if [ "$(id -u)" = 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null; }
    else
      sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >/dev/null
    fi
  fi
  stop_pgbouncer
  mkdir -p "$PGB_DIR"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$PGB_DIR"
  as_pg tee "$PGB_DIR/userlist.txt" >/dev/null <<USERS
"postgres" ""
"ctxguard_gateway" ""
"ctxguard_gateway_b" ""
"ctxguard_discovery" ""
"ctxguard_app" ""
USERS
  as_pg tee "$PGB_DIR/pgbouncer.ini" >/dev/null <<INI
[databases]
* = host=$RUN port=$PGPORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGBOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGB_DIR/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = ${PGBOUNCER_POOL_SIZE:-2}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 1000
server_login_retry = 1
; The hygiene docs/deploy.md sets, with why (its pgbouncer section).
max_db_connections = 64
idle_transaction_timeout = 5
query_timeout = 30
query_wait_timeout = 10
server_idle_timeout = 600
server_lifetime = 3600
server_reset_query = DISCARD ALL
server_reset_query_always = 0
logfile = $PGB_DIR/pgbouncer.log
pidfile = $PGB_DIR/pgbouncer.pid
INI
  log "starting pgbouncer (transaction mode, pool ${PGBOUNCER_POOL_SIZE:-2}) on port $PGBOUNCER_PORT"
  as_pg "$(command -v pgbouncer || echo /usr/sbin/pgbouncer)" -d "$PGB_DIR/pgbouncer.ini"
  local i
  for i in $(seq 1 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$PGBOUNCER_PORT") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "pgbouncer did not start (see $PGB_DIR/pgbouncer.log)" >&2
  exit 1
}

# Stop the pgbouncer start_pgbouncer started (its pid file), if it runs.
stop_pgbouncer() {
  local pid
  pid=$(cat "$PGB_DIR/pgbouncer.pid" 2>/dev/null || true)
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null && grep -q pgbouncer "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$PGB_DIR/pgbouncer.pid"
}

# Fresh database with the demo schema (drops any previous one).
create_demo_db() {
  local db=$1
  psql_su -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  psql_su -d "$db" -o /dev/null -f "$ROOT/sql/demo/schema.sql"
  psql_su -d "$db" -o /dev/null -f "$ROOT/sql/demo/documents.sql" \
    -v tok_ingest_acme="$(mint --sub ingest-bot --tenant acme --roles doc_ingest --aud "${CTXGUARD_AUD:-}")" \
    -v tok_ingest_globex="$(mint --sub ingest-bot --tenant globex --roles doc_ingest --aud "${CTXGUARD_AUD:-}")"
  psql_su -d "$db" -o /dev/null -f "$ROOT/sql/demo/app.sql"
}

# Fail unless every given TCP port on 127.0.0.1 is free (test servers use ports below Linux's
# ephemeral range, 32768-60999, so client sockets of earlier tests cannot hold them).
require_free_ports() {
  local port
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "port $port is in use (set the test's port variable to another base)" >&2; exit 1
    fi
  done
}

mint() { /usr/bin/python3 "$ROOT/scripts/mint_token.py" mint --dir "$RUN" "$@"; }

# The smoke set: pgTAP files of the SQL suite (roles and RLS, Gate A and B with entity binding and
# approvals, audit) as ctxguard_gateway, on database $1 made by create_demo_db and sql/tests/fixtures.sql.
# The package and pg_upgrade tests run it.
SMOKE_SET=(sql/tests/01_roles_rls.sql sql/tests/03_tools.sql sql/tests/04_audit.sql)
run_smoke_set() {
  local aud=(--aud ctxguard-tests)
  (cd "$ROOT" && pg_prove -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$1" \
    -S "tok_alice=$(mint --sub alice --tenant acme --roles ap_clerk "${aud[@]}")" \
    -S "tok_bob=$(mint --sub bob --tenant acme --roles viewer "${aud[@]}")" \
    -S "tok_carol=$(mint --sub carol --tenant globex --roles ap_clerk "${aud[@]}")" \
    "${SMOKE_SET[@]}")
}

# The gateway under test runs as an ordinary user: as root, the system user ctxguard-gw (made on first
# use; CTXGUARD_GW_USER names another); otherwise the caller. Start it with "${GW_AS[@]}" binary ...
gateway_user() {
  GW_AS=()
  if [ "$(id -u)" = 0 ]; then
    GW_USER=${CTXGUARD_GW_USER:-ctxguard-gw}
    id -u "$GW_USER" >/dev/null 2>&1 ||
      useradd --system --no-create-home --shell /usr/sbin/nologin "$GW_USER" 2>/dev/null || id -u "$GW_USER" >/dev/null
    GW_AS=(setpriv --reuid="$GW_USER" --regid="$GW_USER" --init-groups --)
  else
    GW_USER=$(id -un)
  fi
}

# Demo Notes (demo-upstream/): the demo's upstream MCP server that needs each user's own connection,
# with the small OAuth 2.1 authorization server it trusts, in one process. Built together with the
# gateway (`cargo build -p ctxguard-gateway -p ctxguard-demo-upstream`: one feature set, so the crates
# they share are built once); $1: release or debug. Prints the binary's path.
demo_upstream_bin() {
  local flag=()
  [ "$1" = release ] && flag=(--release)
  cargo build --locked "${flag[@]}" -p ctxguard-gateway -p ctxguard-demo-upstream >/dev/null
  echo "$CARGO_TARGET_DIR/$1/ctxguard-demo-upstream"
}

# Start Demo Notes (binary $1) on 127.0.0.1:$2 for the gateway at URL $3 (its callback is the one
# redirect URI the authorization server accepts), logging to $4; its pid in DEMO_UPSTREAM_PID.
# Runs as the caller ("${GW_AS[@]}" in front to run it as the gateway's user).
start_demo_upstream() {
  local bin=$1 port=$2 gw=$3 logfile=$4
  require_free_ports "$port"
  DEMO_UPSTREAM_LISTEN="127.0.0.1:$port" DEMO_UPSTREAM_REDIRECT_URI="$gw/v1/connections/callback" \
    nohup "$bin" >"$logfile" 2>&1 &
  DEMO_UPSTREAM_PID=$!
  local i
  # Ready only while the process started here is alive (not some other listener on the port).
  for i in $(seq 100); do
    kill -0 "$DEMO_UPSTREAM_PID" 2>/dev/null || break
    if curl -sf "http://127.0.0.1:$port/.well-known/oauth-authorization-server" >/dev/null; then
      kill -0 "$DEMO_UPSTREAM_PID" 2>/dev/null && return 0
      break
    fi
    sleep 0.1
  done
  cat "$logfile" >&2
  return 1
}

# Register Demo Notes (listening on 127.0.0.1:$2; binary $3 prints its tools) in database $1, as the
# DBA: server `notes`, each user's own connection (`user_oauth`: the gateway is a public client of
# its authorization server, PKCE), open to every demo user on every page, read-only, and its tools
# recorded now (the gateway's discovery cannot list them before someone connects: without them in
# the catalog, nobody would ever be asked to connect). Same definitions as its tools/list, so the
# first connection's discovery changes nothing.
register_demo_upstream() {
  local db=$1 up="http://127.0.0.1:$2" tools
  tools=$("$3" --print-tools)
  psql_su -d "$db" -o /dev/null -v url="$up/mcp" -v issuer="$up" -v tools="$tools" <<'SQL'
INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access, credential_mode, credential_config)
VALUES ('notes', 'http', :'url', 'Demo Notes: your own notes, from your own Demo Notes account (connect it once)',
        'allow', 'user_oauth',
        jsonb_build_object('issuer', :'issuer', 'client_id', 'ctxguard-demo', 'scopes', jsonb_build_array('notes.read')));
SELECT ctxguard.set_server_policy('notes', '{"page_types": ["*"], "read_only": true}');
SELECT ctxguard.sync_mcp_tools('notes', :'tools');
SQL
}

# The key file that seals stored upstream credentials (README "Upstream credentials"): made once,
# `k1:<32 random bytes, base64>`, readable by its owner only.
credential_key_file() {
  local file=$1
  [ -s "$file" ] || ( umask 077; echo "k1:$(head -c 32 /dev/urandom | base64)" >"$file" )
}
