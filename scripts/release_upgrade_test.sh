#!/usr/bin/env bash
# Upgrade test from the real release (issue 13): the 0.1.0 build (scripts/release_build.sh, cached)
# runs a cluster in which its own demo, walkthrough (audit rows, generations, document budgets and
# coverage) and a pending approval are made through its API; then the same data directory is started
# with this tree's build (installed by scripts/test.sh), `ALTER EXTENSION ctxguard UPDATE` runs, the
# data must have survived (every row of every ctxguard and demo table the update does not rewrite,
# counts of the rest), and the SQL suite (scripts/test.sh --sql-suite-on) runs against the result,
# after this tree's demo and fixtures are applied on top of the updated database, as a DBA would.
# scripts/upgrade_test.sh checks the other half: an updated schema describes exactly like a fresh one.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
RELEASE=0.1.0 RELEASE_COMMIT=eb098cb5216ebe62a7329888cd4b2504fe975f04
CURRENT=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
fail() { echo "release upgrade test: $*" >&2; exit 1; }

OLD_PREFIX=$(bash scripts/release_build.sh "$RELEASE" "$RELEASE_COMMIT" | tail -1)
OLD_SRC=$PG_CACHE/release-$RELEASE/src
NEW_BIN=$PG_BIN
UP=$RUN-release
PG_BIN=$OLD_PREFIX/bin stop_cluster_at "$UP/pgdata"
rm -rf "$UP"
RUN=$UP PGPORT=$((PGPORT + 6)) PGDATA_DIR=$UP/pgdata

log "release upgrade test: ctxguard $RELEASE (its own build) on port $PGPORT"
PG_BIN=$OLD_PREFIX/bin
start_cluster
# 0.1.0 reads its keys from settings only (key files came with 0.2.0).
psql_su -d postgres -o /dev/null -c "ALTER SYSTEM SET ctxguard.jwt_secret = '$(cat "$RUN/jwt_secret")'" \
  -c "ALTER SYSTEM SET ctxguard.jwt_public_key = '$(cat "$RUN/ed25519_public_x")'" -c "SELECT pg_reload_conf()"
DB=ctxguard_rel
[ "$(psql_su -d postgres -Atc "SELECT default_version FROM pg_available_extensions WHERE name = 'ctxguard'")" = "$RELEASE" ] \
  || fail "the release's PostgreSQL does not offer ctxguard $RELEASE"
(ROOT=$OLD_SRC; create_demo_db "$DB")
psql -X -q -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$DB" -v ON_ERROR_STOP=1 \
  -v tok_alice="$(mint --sub alice --tenant acme --roles ap_clerk)" \
  -v tok_bob="$(mint --sub bob --tenant acme --roles viewer)" \
  -v tok_carol="$(mint --sub carol --tenant globex --roles ap_clerk)" \
  -f "$OLD_SRC/sql/demo/walkthrough.sql" >"$UP/walkthrough.log" 2>&1 \
  || { cat "$UP/walkthrough.log" >&2; fail "the $RELEASE walkthrough failed"; }
TOK_CAROL=$(mint --sub carol --tenant globex --roles ap_clerk)
INV='{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv6"}}'
pending=$(psql -X -q -At -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$DB" -v ON_ERROR_STOP=1 \
  -c "BEGIN" -c "SELECT ctxguard.set_context('$TOK_CAROL', '$INV') IS NULL" \
  -c "SELECT ctxguard.call_tool('invoice.mark_paid', '{}')->>'call_id'" -c "COMMIT" | sed -n 2p)
[ -n "$pending" ] || fail "no pending approval was made with $RELEASE"

# Row counts of every ctxguard and demo table, and the content of those the update leaves alone.
snapshot() {
  psql_su -d "$DB" -At <<'SQL'
DO $$
DECLARE r record; h text; n bigint;
BEGIN
  CREATE TEMP TABLE snap (line text);
  FOR r IN SELECT c.oid::regclass AS t, c.relnamespace = 'demo'::regnamespace AS whole FROM pg_class c
            WHERE c.relnamespace IN ('ctxguard'::regnamespace, 'demo'::regnamespace) AND c.relkind IN ('r', 'p')
            ORDER BY c.oid::regclass::text LOOP
    EXECUTE format('SELECT count(*), md5(coalesce(string_agg(x::text, E''\n'' ORDER BY x::text), '''')) FROM %s x', r.t) INTO n, h;
    INSERT INTO snap VALUES (format('table %s rows=%s%s', r.t, n, CASE WHEN r.whole THEN ' md5=' || h ELSE '' END));
  END LOOP;
END $$;
SELECT line FROM snap ORDER BY 1;
SQL
}
snapshot >"$UP/before.txt"
for t in tools tool_policies documents document_pages audit_log approvals generations document_calls document_coverage; do
  grep -q "^table ctxguard\.$t rows=[1-9]" "$UP/before.txt" || { cat "$UP/before.txt"; fail "ctxguard.$t is empty before the update"; }
done
stop_cluster

log "release upgrade test: the same data directory with this build ($CURRENT), ALTER EXTENSION ctxguard UPDATE"
PG_BIN=$NEW_BIN
psql_settings_reset() {
  psql_su -d postgres -o /dev/null -c "ALTER SYSTEM RESET ctxguard.jwt_secret" -c "ALTER SYSTEM RESET ctxguard.jwt_public_key" \
    -c "SELECT pg_reload_conf()"
}
start_cluster
psql_settings_reset
# Before the update, calls fail closed (the library is newer than the catalog).
psql_su -d "$DB" -o /dev/null -c "ALTER EXTENSION ctxguard UPDATE" || fail "ALTER EXTENSION ctxguard UPDATE failed"
[ "$(psql_su -d "$DB" -Atc "SELECT extversion FROM pg_extension WHERE extname = 'ctxguard'")" = "$CURRENT" ] \
  || fail "the extension is not at $CURRENT after the update"
snapshot >"$UP/after.txt"
# Tables the update adds are new (and empty); every table of the release keeps its rows.
awk '{ print $2 }' "$UP/before.txt" >"$UP/tables.txt"
awk 'NR == FNR { t[$1]; next } $2 in t' "$UP/tables.txt" "$UP/after.txt" >"$UP/after.kept.txt"
diff "$UP/before.txt" "$UP/after.kept.txt" || fail "rows lost or changed by the update (< before, > after)"
checks=$(psql_su -d "$DB" -At <<SQL
SELECT 'approval_pending=' || count(*) FROM ctxguard.approvals WHERE call_id = '$pending' AND status = 'pending';
SELECT 'audit_kept=' || (count(*) > 0) FROM ctxguard.audit_log WHERE row_hash IS NULL;
SELECT 'chain=' || (ctxguard.verify_audit('acme')->>'intact');
SQL
)
echo "$checks" | tr '\n' ' '; echo
grep -q '^audit_kept=true' <<<"$checks" || fail "the $RELEASE audit rows are gone"
# A pending approval of the release is kept (as a record) but can no longer be approved: it was not
# bound to its entity and arguments as 0.2.0's are.
approved=$(psql -X -q -At -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$DB" -v ON_ERROR_STOP=1 \
  -c "BEGIN" -c "SELECT ctxguard.set_context('$TOK_CAROL', '$INV') IS NULL" \
  -c "SELECT ctxguard.approve_call('$pending')->>'status'" -c "COMMIT" | sed -n 2p)
[ "$approved" = error ] || fail "the $RELEASE pending approval could still be approved (status: $approved)"
grep -q '^chain=true' <<<"$checks" || fail "verify_audit fails on the updated audit log"

log "release upgrade test: this tree's demo and fixtures on the updated database, then the SQL suite"
psql_su -d "$DB" -o /dev/null -f sql/demo/schema.sql
psql_su -d "$DB" -o /dev/null -f sql/demo/documents.sql \
  -v tok_ingest_acme="$(mint --sub ingest-bot --tenant acme --roles doc_ingest --aud "${CTXGUARD_AUD:-}")" \
  -v tok_ingest_globex="$(mint --sub ingest-bot --tenant globex --roles doc_ingest --aud "${CTXGUARD_AUD:-}")"
psql_su -d "$DB" -o /dev/null -f sql/demo/app.sql
psql_su -d "$DB" -o /dev/null -f sql/tests/fixtures.sql
CTXGUARD_RUN=$RUN CTXGUARD_PGPORT=$PGPORT CTXGUARD_SUITE_DB=$DB CTXGUARD_KEEP_RUNNING=1 PG_MAJORS=$PG_MAJOR \
  bash scripts/test.sh --sql-only || fail "the SQL suite failed on the database updated from $RELEASE"
stop_cluster
echo "ok: ctxguard $RELEASE (its own build) updated to $CURRENT with its data; the SQL suite passes on the result"
