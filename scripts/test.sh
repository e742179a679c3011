#!/usr/bin/env bash
# Run every test: lint, pure unit tests, then the SQL security suite (pgTAP, as the non-superuser
# gateway role) against a real PostgreSQL with ctxguard preloaded. Installs what it needs.
#
# PostgreSQL majors: PG_MAJORS (default "15 17 18"; "$PG_MAJOR" alone when only PG_MAJOR is set).
# The whole suite runs on PG_MAJOR (default 15); every other major in PG_MAJORS then runs the SQL suite
# (clippy for that major, pgTAP as each role, the upgrade test, the refusal-log check, the fail-closed
# suite without preload) on a cluster of its own (scripts/lib.sh); then each major's .deb is installed
# and tested (scripts/package.sh --test), and a 15 cluster is pg_upgraded to each newer major
# (scripts/pg_upgrade_test.sh). The end lists what was tested on which major, and the times.
majors_default=${PG_MAJOR:-15 17 18}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
PG_MAJORS=${PG_MAJORS:-$majors_default}
MODE=${1:-}
# A fresh checkout gains nothing from incremental compilation's caches, which take several GB beside
# the ~30 test binaries (a CI machine's disk once filled mid-link). CARGO_INCREMENTAL=1 keeps them.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

# --sql-only: skip setup, lint and unit tests (quick loop while editing SQL tests).
# --major-sql-suite: the SQL suite alone, on PG_MAJOR (what the loop at the end runs for each major).
if [ "$MODE" = --major-sql-suite ]; then
  bash scripts/setup.sh
  log "clippy for PostgreSQL $PG_MAJOR"
  cargo clippy -p ctxguard --no-default-features --features "pg$PG_MAJOR" --locked -- -D warnings
  install_extension
elif [ "$MODE" != --sql-only ]; then
  bash scripts/setup.sh

  log "cargo fmt / clippy"
  cargo fmt --all --check
  cargo clippy --workspace --all-targets --locked -- -D warnings

  log "unit tests (pure crates)"
  cargo test --locked

  install_extension
fi
start_cluster

# CTXGUARD_SUITE_DB: the SQL suite alone, on that database as it is (scripts/release_upgrade_test.sh
# runs it on a database updated from the release).
DB=${CTXGUARD_SUITE_DB:-ctxguard_test}
if [ -z "${CTXGUARD_SUITE_DB:-}" ]; then
  log "fresh database $DB with demo data and fixtures"
  create_demo_db "$DB"
  psql_su -d "$DB" -o /dev/null -f sql/tests/fixtures.sql
fi

AUD=(--aud ctxguard-tests)
vars=(
  -S "tok_alice=$(mint --sub alice --tenant acme --roles ap_clerk "${AUD[@]}")"
  -S "tok_bob=$(mint --sub bob --tenant acme --roles viewer "${AUD[@]}")"
  -S "tok_dave=$(mint --sub dave --tenant acme --roles viewer "${AUD[@]}")"
  -S "tok_carol=$(mint --sub carol --tenant globex --roles ap_clerk "${AUD[@]}")"
  -S "tok_root=$(mint --sub root --tenant acme --roles admin "${AUD[@]}")"
  -S "tok_eddsa=$(mint --sub erin --tenant acme --alg EdDSA "${AUD[@]}")"
  -S "tok_forged=$(mint --sub alice --tenant acme --bad-signature "${AUD[@]}")"
  -S "tok_none=$(mint --sub alice --tenant acme --alg none "${AUD[@]}")"
  -S "tok_confused=$(mint --sub alice --tenant acme --alg confused "${AUD[@]}")"
  -S "tok_expired=$(mint --sub alice --tenant acme --ttl -120 "${AUD[@]}")"
  -S "tok_nbf=$(mint --sub alice --tenant acme --nbf-in 600 "${AUD[@]}")"
  -S "tok_wrong_aud=$(mint --sub alice --tenant acme --aud someone-else)"
  -S "tok_no_aud=$(mint --sub alice --tenant acme)"
  -S "tok_no_exp=$(mint --sub alice --tenant acme --no-exp "${AUD[@]}")"
  -S "tok_crit=$(mint --sub alice --tenant acme --crit "${AUD[@]}")"
  -S "tok_dup=$(mint --sub alice --tenant acme --roles ap_clerk --dup-tenant globex "${AUD[@]}")"
  -S "tok_ingest=$(mint --sub ingest-bot --tenant acme --roles doc_ingest "${AUD[@]}")"
  -S "tok_tadmin=$(mint --sub tina --tenant acme --roles tenant_admin "${AUD[@]}")"
  -S "tok_ranker=$(mint --sub ranker --tenant acme --roles ap_clerk "${AUD[@]}")"
  # A reader of its own each run: the ledger's shared memory remembers a user's pages for the day.
  -S "tok_reader=$(mint --sub "reader-$(date +%s)-$$" --tenant acme --roles ap_clerk "${AUD[@]}")"
)

# Each directory runs as the role it is about (sql/tests/fixtures.sql): the gateway role (model calls,
# hostile SQL session), a reader with table privileges (RLS itself), the demo app's screens, ingestion.
# The server log is appended across runs: the checks below read only what this run writes.
LOG_START=$(stat -c %s "$RUN/postgres.log" 2>/dev/null || echo 0)
log "SQL security suite (pgTAP) as ctxguard_gateway"
pg_prove -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$DB" "${vars[@]}" sql/tests/[0-9]*.sql
log "SQL security suite (pgTAP): RLS as ctxguard_reader, screens as ctxguard_app, ingestion as ctxguard_ingest"
pg_prove -h "$RUN" -p "$PGPORT" -U ctxguard_reader -d "$DB" "${vars[@]}" sql/tests/reader/*.sql
pg_prove -h "$RUN" -p "$PGPORT" -U ctxguard_app -d "$DB" "${vars[@]}" sql/tests/app/*.sql
pg_prove -h "$RUN" -p "$PGPORT" -U ctxguard_ingest -d "$DB" "${vars[@]}" sql/tests/ingest/*.sql
log "SQL suite (pgTAP) as the superuser: masking interrupts, the audit chain, the writer's two ways in, tenant limits"
pg_prove -h "$RUN" -p "$PGPORT" -U postgres -d "$DB" "${vars[@]}" sql/tests/superuser/*.sql
[ -n "${CTXGUARD_SUITE_DB:-}" ] && exit 0

bash scripts/upgrade_test.sh
# From the real release build (issue 13): its data through its API, this build, UPDATE, the SQL suite.
if [ "$PG_MAJOR" = "$PG_DEBIAN_MAJOR" ] && [ "$MODE" != --major-sql-suite ]; then
  bash scripts/release_upgrade_test.sh
fi

log "server log: set_context refusals are logged with reason and identity, never the token"
denied=$(tail -c +"$((LOG_START + 1))" "$RUN/postgres.log" | grep -F "ctxguard: set_context denied" || true)
[ -n "$denied" ] || { echo "no set_context refusal was logged" >&2; exit 1; }
grep -q 'reason="invalid context token: token has expired"' <<<"$denied" || { echo "expired-token refusal not logged" >&2; exit 1; }
if grep -q "eyJ" <<<"$denied"; then echo "a token reached the refusal log lines" >&2; exit 1; fi
echo "ok: $(wc -l <<<"$denied") refusals logged without tokens"
# Nothing of this run's server log holds a token (issue 29, M.72): the suites send tokens in
# statements that fail (STATEMENT and CONTEXT lines), with log_parameter_max_length_on_error set by
# hostile sessions and role defaults; ctxguard's log hook redacts or hides them all.
if tail -c +"$((LOG_START + 1))" "$RUN/postgres.log" | grep -qE 'eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.'; then
  tail -c +"$((LOG_START + 1))" "$RUN/postgres.log" | grep -nE 'eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.' | head -3 | cut -c1-160 >&2
  echo "a token reached the server log" >&2; exit 1
fi
echo "ok: no token anywhere in this run's server log ($(tail -c +"$((LOG_START + 1))" "$RUN/postgres.log" | grep -c 'token redacted by ctxguard' || true) redacted)"

if [ "$MODE" != --major-sql-suite ]; then
# A real OpenID provider (npm oidc-provider) for tests/tests/oidc.rs and tests/oidc/run.sh: installed
# once into a cache outside the checkout; its keys in the run directory. Ports: the base and 3 more.
OIDC_NODE_MODULES=$(bash tests/oidc/install.sh)
OIDC_DIR=$RUN/oidc
bash tests/oidc/keys.sh "$OIDC_DIR"
OIDC_PORT=${CTXGUARD_OIDC_TEST_PORT:-31940}
require_free_ports "$OIDC_PORT" $((OIDC_PORT + 1)) $((OIDC_PORT + 2)) $((OIDC_PORT + 3))
log "client integration tests (tests/, real connections as ctxguard_gateway and the demo's other roles)"
# pgbouncer (transaction mode, a server pool of 2) for the tests of gateways behind a pooler.
start_pgbouncer
# The capacity tests' cluster: tiny ledger tables set in its postgresql.conf (tests/tests/capacity.rs).
start_capacity_cluster
trap 'stop_pgbouncer; stop_capacity_cluster' EXIT
# The gateway binary for the drill that kills one (tests/gateway_drills.rs).
cargo build --locked -p ctxguard-gateway
CTXGUARD_TEST_GATEWAY_BIN="$CARGO_TARGET_DIR/debug/ctxguard-gateway" \
CTXGUARD_TEST_DRILL_PORT=${CTXGUARD_DRILL_TEST_PORT:-31990} \
CTXGUARD_TEST_POOLER_URL="host=127.0.0.1 port=$PGBOUNCER_PORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_TEST_POOLER_ADMIN_URL="host=127.0.0.1 port=$PGBOUNCER_PORT user=postgres dbname=pgbouncer" \
CTXGUARD_TEST_PGBOUNCER_INI="$PGB_DIR/pgbouncer.ini" \
CTXGUARD_TEST_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_TEST_CAPACITY_URL="host=$CAP_RUN port=$CAP_PORT user=ctxguard_gateway dbname=ctxguard_capacity" \
CTXGUARD_TEST_CAPACITY_ADMIN_URL="host=$CAP_RUN port=$CAP_PORT user=postgres dbname=ctxguard_capacity" \
CTXGUARD_TEST_DISCOVERY_URL="host=$RUN port=$PGPORT user=ctxguard_discovery dbname=$DB" \
CTXGUARD_TEST_APP_URL="host=$RUN port=$PGPORT user=ctxguard_app dbname=$DB" \
CTXGUARD_TEST_ADMIN_URL="host=$RUN port=$PGPORT user=postgres dbname=$DB" \
CTXGUARD_TEST_JWT_SECRET="$(cat "$RUN/jwt_secret")" \
CTXGUARD_TEST_PGDATA="$PGDATA_DIR" CTXGUARD_TEST_PG_BIN="$PG_BIN" \
CTXGUARD_TEST_OIDC_NODE_MODULES="$OIDC_NODE_MODULES" CTXGUARD_TEST_OIDC_DIR="$OIDC_DIR" \
CTXGUARD_TEST_OIDC_PORT="$OIDC_PORT" \
  cargo test --locked -p ctxguard-tests
stop_pgbouncer
stop_capacity_cluster

bash tests/mcp/run.sh

OIDC_NODE_MODULES="$OIDC_NODE_MODULES" OIDC_DIR="$OIDC_DIR" OIDC_PORT="$OIDC_PORT" bash tests/oidc/run.sh

# Issue 33: upstream credentials end to end (an upstream that checks its callers; ~10 s).
bash tests/credentials/run.sh

bash tests/ui/run.sh
fi

log "fail-closed suite against a second cluster without shared_preload_libraries"
NP_RUN="$RUN-nopreload" NP_PORT=$((PGPORT + 1))
start_cluster_without_preload "$NP_RUN" "$NP_PORT"
psql -X -q -v ON_ERROR_STOP=1 -h "$NP_RUN" -p "$NP_PORT" -U postgres -d postgres -o /dev/null <<'SQL'
DROP DATABASE IF EXISTS ctxguard_np WITH (FORCE);
CREATE DATABASE ctxguard_np;
SQL
psql -X -q -v ON_ERROR_STOP=1 -h "$NP_RUN" -p "$NP_PORT" -U postgres -d ctxguard_np -o /dev/null <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION ctxguard;
CREATE EXTENSION pgtap;
DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ctxguard_gateway') THEN
  CREATE ROLE ctxguard_gateway LOGIN NOSUPERUSER NOBYPASSRLS; END IF; END $$;
GRANT TEMPORARY ON DATABASE ctxguard_np TO ctxguard_gateway;
CREATE SCHEMA np;
GRANT USAGE ON SCHEMA np TO ctxguard_gateway;
CREATE TABLE np.secrets (tenant_id text NOT NULL, v text);
INSERT INTO np.secrets VALUES ('acme', 'a'), ('globex', 'g');
-- (Direct SELECT for the gateway here: this suite proves that RLS fails closed without the library.)
GRANT SELECT ON np.secrets TO ctxguard_gateway;
SELECT ctxguard.protect_table('np.secrets', 'tenant_id');
CREATE FUNCTION np.read(args jsonb) RETURNS jsonb LANGUAGE sql AS $f$ SELECT jsonb_agg(v) FROM np.secrets $f$;
DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'np_tools') THEN CREATE ROLE np_tools NOLOGIN; END IF; END $$;
GRANT USAGE ON SCHEMA np TO np_tools;
GRANT SELECT ON np.secrets TO np_tools;
SELECT ctxguard.register_page_type('list_page', NULL, 'A list.');
SELECT ctxguard.register_tool('np.read', 'Read.', '{"type": "object"}', 'np.read(jsonb)', '{"page_types": "*", "run_as": "np_tools"}');
SQL
pg_prove -h "$NP_RUN" -p "$NP_PORT" -U ctxguard_gateway -d ctxguard_np \
  -S "tok_alice=$(mint --sub alice --tenant acme --roles ap_clerk)" sql/tests/not_preloaded/*.sql
stop_cluster_at "$NP_RUN/pgdata"

if [ "$MODE" = --major-sql-suite ]; then
  stop_cluster
  exit 0
fi

# The other majors: each on its own cluster (lib.sh's per-major directory and port, or beside this
# run's when CTXGUARD_RUN / CTXGUARD_PGPORT are set), timed. A major whose PostgreSQL cannot be had
# here (setup.sh exits 3: no Debian source package for it can be fetched) is type-checked instead
# (scripts/check_major.sh) and reported NOT TESTED at the end; CTXGUARD_REQUIRE_ALL_MAJORS=1 fails then.
# PG_CHECK_MAJORS (default 16, in no Debian suite) are only type-checked.
major_env() {
  local m=$1 env=(PG_MAJOR="$m")
  [ -n "${CTXGUARD_RUN:-}" ] && env+=(CTXGUARD_RUN="$RUN-pg$m")
  [ -n "${CTXGUARD_PGPORT:-}" ] && env+=(CTXGUARD_PGPORT=$((PGPORT + 10 * (m - PG_DEBIAN_MAJOR))))
  printf '%s\n' "${env[@]}"
}
in_major() {
  local m=$1 menv
  shift
  mapfile -t menv < <(major_env "$m")
  env -u CTXGUARD_RUN -u CTXGUARD_PGPORT "${menv[@]}" "$@"
}
timings=() tested=("$PG_MAJOR") untested=()
for m in $PG_MAJORS; do
  [ "$m" = "$PG_MAJOR" ] && continue
  log "PostgreSQL $m: the SQL suite"
  t0=$SECONDS
  rc=0
  in_major "$m" bash scripts/setup.sh || rc=$?
  if [ "$rc" = 3 ] && [ "${CTXGUARD_REQUIRE_ALL_MAJORS:-0}" != 1 ]; then
    bash scripts/check_major.sh "$m"
    untested+=("$m")
    timings+=("PostgreSQL $m: NOT TESTED, its PostgreSQL could not be had here (see setup above); compile-checked in $((SECONDS - t0)) s")
    continue
  fi
  [ "$rc" = 0 ] || exit "$rc"
  in_major "$m" bash scripts/test.sh --major-sql-suite
  tested+=("$m")
  timings+=("PostgreSQL $m SQL suite: $((SECONDS - t0)) s")
done
for m in ${PG_CHECK_MAJORS-16}; do
  [[ " $PG_MAJORS " == *" $m "* ]] && continue
  t0=$SECONDS
  bash scripts/check_major.sh "$m"
  timings+=("PostgreSQL $m: compile-checked only, in $((SECONDS - t0)) s")
done
for m in "${tested[@]}"; do
  if pg_own_prefix "$m"; then
    # A PostgreSQL of your own (CTXGUARD_PG<NN>_PREFIX) has no Debian package directory to install into.
    timings+=("PostgreSQL $m .deb test: skipped, CTXGUARD_PG${m}_PREFIX names a PostgreSQL of your own")
    continue
  fi
  log "PostgreSQL $m: the .deb, installed into a clean cluster"
  t0=$SECONDS
  in_major "$m" bash scripts/package.sh "$m" --test
  timings+=("PostgreSQL $m .deb test: $((SECONDS - t0)) s")
done
# pg_upgrade from 15 to every newer major tested here.
if [[ " ${tested[*]} " == *" 15 "* ]]; then
  for m in "${tested[@]}"; do
    [ "$m" -gt 15 ] || continue
    t0=$SECONDS
    bash scripts/pg_upgrade_test.sh 15 "$m"
    timings+=("pg_upgrade 15 -> $m test: $((SECONDS - t0)) s")
  done
fi
log "PostgreSQL majors: tested ${tested[*]}${untested[*]:+; NOT TESTED ${untested[*]}}"
printf '  %s\n' "${timings[@]}"
# Disk: what the build left (the CI machine's disk is finite; BENCHMARKS.md, "Build footprint").
echo "  build directory: $(du -sh "$CARGO_TARGET_DIR" 2>/dev/null | cut -f1); free on its disk: $(df -h --output=avail "$CARGO_TARGET_DIR" | tail -1 | tr -d ' ')"
