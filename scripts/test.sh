#!/usr/bin/env bash
# Run every test: lint, pure unit tests, then the SQL security suite (pgTAP, as the non-superuser
# gateway role) against a real PostgreSQL with ctxguard preloaded. Installs what it needs.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

# --sql-only: skip setup, lint and unit tests (quick loop while editing SQL tests).
if [ "${1:-}" != --sql-only ]; then
  bash scripts/setup.sh

  log "cargo fmt / clippy"
  cargo fmt --all --check
  cargo clippy --workspace --all-targets --locked -- -D warnings

  log "unit tests (pure crates)"
  cargo test --locked

  install_extension
fi
start_cluster

DB=ctxguard_test
log "fresh database $DB with demo data and fixtures"
create_demo_db "$DB"
psql_su -d "$DB" -o /dev/null -f sql/tests/fixtures.sql

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
  -S "tok_ingest=$(mint --sub ingest-bot --tenant acme --roles doc_ingest "${AUD[@]}")"
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

bash scripts/upgrade_test.sh

log "server log: set_context refusals are logged with reason and identity, never the token"
denied=$(tail -c +"$((LOG_START + 1))" "$RUN/postgres.log" | grep -F "ctxguard: set_context denied" || true)
[ -n "$denied" ] || { echo "no set_context refusal was logged" >&2; exit 1; }
grep -q 'reason="invalid context token: token has expired"' <<<"$denied" || { echo "expired-token refusal not logged" >&2; exit 1; }
if grep -q "eyJ" <<<"$denied"; then echo "a token reached the refusal log lines" >&2; exit 1; fi
echo "ok: $(wc -l <<<"$denied") refusals logged without tokens"

log "client integration tests (tests/, real connections as ctxguard_gateway and the demo's other roles)"
CTXGUARD_TEST_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_TEST_DISCOVERY_URL="host=$RUN port=$PGPORT user=ctxguard_discovery dbname=$DB" \
CTXGUARD_TEST_APP_URL="host=$RUN port=$PGPORT user=ctxguard_app dbname=$DB" \
CTXGUARD_TEST_ADMIN_URL="host=$RUN port=$PGPORT user=postgres dbname=$DB" \
CTXGUARD_TEST_JWT_SECRET="$(cat "$RUN/jwt_secret")" \
CTXGUARD_TEST_PGDATA="$PGDATA_DIR" CTXGUARD_TEST_PG_BIN="$PG_BIN" \
  cargo test --locked -p ctxguard-tests

bash tests/mcp/run.sh

bash tests/ui/run.sh

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
