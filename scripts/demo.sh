#!/usr/bin/env bash
# The main job: PostgreSQL 15 with ctxguard preloaded, the demo schema loaded, and a walkthrough
# that prints Gate A and Gate B decisions for three users of two tenants. Installs what it needs.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

bash scripts/setup.sh
install_extension
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

cat <<MSG

PostgreSQL with ctxguard is running: psql -h $RUN -p $PGPORT -U ctxguard_gateway $DB
Mint a token:  /usr/bin/python3 scripts/mint_token.py mint --dir $RUN --sub alice --tenant acme --roles ap_clerk
Stop it:       scripts/stop.sh
MSG
