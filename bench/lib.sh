# Shared by bench/*.sh: the dedicated bench cluster, argument parsing and the BENCHMARKS.md results
# block. Source it after setting BENCH_NAME (the script's name, used in messages and the markers).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEFAULT_RUN=/tmp/ctxguard-bench
export CTXGUARD_RUN=${BENCH_RUN:-$DEFAULT_RUN}
export CTXGUARD_PGPORT=${BENCH_PGPORT:-54339}
# Never restart someone else's cluster: only the dedicated one is restarted to load a new build.
[ "$CTXGUARD_RUN" = "$DEFAULT_RUN" ] || export CTXGUARD_KEEP_RUNNING=1
source "$BENCH_DIR/../scripts/lib.sh"

die() { printf '%s: %s\n' "$BENCH_NAME" "$*" >&2; exit 1; }

# `--write` rewrites this script's results block in BENCHMARKS.md; no argument only prints.
bench_args() {
  WRITE=0
  case "${1:-}" in
    --write) WRITE=1 ;;
    "") ;;
    *) echo "usage: $0 [--write]" >&2; exit 2 ;;
  esac
}

# Build and install the extension, then (re)start the bench cluster so it preloads that build.
bench_cluster() {
  install_extension
  SO=$("$PG_BIN/pg_config" --pkglibdir)/ctxguard.so
  if [ "$PROFILE" = release ] && ! cmp -s "$SO" "$CARGO_TARGET_DIR/release/libctxguard.so"; then
    die "$SO is not the release build just made (installed concurrently by someone else?)"
  fi
  start_cluster
  [ "$CTXGUARD_RUN" = "$DEFAULT_RUN" ] ||
    log "WARNING: the cluster at $RUN was not restarted; it runs the ctxguard.so it preloaded at its start"
}

# pgbench from PATH or PostgreSQL's bin directory.
need_pgbench() {
  command -v pgbench >/dev/null || PATH=$PG_BIN:$PATH
  command -v pgbench >/dev/null || die "pgbench not found (Debian: postgresql-client-$PG_MAJOR)"
}

# psql as the non-superuser gateway role (the role every measurement runs as) on the bench's $DB.
psql_gw() { psql -X -q -v ON_ERROR_STOP=1 -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$DB" "$@"; }

# A fresh directory for this run's raw output.
bench_out() { mktemp -d "${TMPDIR:-/tmp}/ctxguard-$BENCH_NAME.XXXXXX"; }

# The commit measured, with "+uncommitted" when the given paths differ from it.
bench_rev() {
  local rev
  rev=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
  (cd "$ROOT" && GIT_OPTIONAL_LOCKS=0 git diff --quiet HEAD -- "$@" 2>/dev/null) || rev="$rev+uncommitted"
  echo "$rev"
}

# The results' machine line: cores, CPU, PostgreSQL, the load tool ($1), and an optional remark ($2).
bench_machine() {
  printf '\nMachine: %s cores (%s), %s, %s%s.\n' "$(nproc)" \
    "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)" \
    "$(psql_su -d postgres -Atc "SELECT split_part(version(), ' on ', 1)")" "$1" "${2:+; $2}"
}

# Print the report (function $1) into $OUT/results.md and, with --write, into BENCHMARKS.md.
bench_report() {
  "$1" | tee "$OUT/results.md"
  log "raw output: $OUT"
  if [ "$WRITE" = 1 ]; then
    bench_write_results "$OUT/results.md"
  fi
}

# Replace the block between <!-- $BENCH_NAME:begin/end --> in BENCHMARKS.md with file $1.
bench_write_results() {
  local md=$ROOT/BENCHMARKS.md tmp
  if ! grep -q "^<!-- $BENCH_NAME:begin -->\$" "$md" || ! grep -q "^<!-- $BENCH_NAME:end -->\$" "$md"; then
    die "$md lacks the <!-- $BENCH_NAME:begin/end --> markers"
  fi
  tmp=$(mktemp)
  awk -v res="$1" -v begin="<!-- $BENCH_NAME:begin -->" -v end="<!-- $BENCH_NAME:end -->" '
    $0 == begin {print; while ((getline line < res) > 0) print line; skip = 1; next}
    $0 == end {skip = 0}
    !skip {print}' "$md" >"$tmp"
  cat "$tmp" >"$md"
  rm -f "$tmp"
  log "rewrote the $BENCH_NAME results block of $md (update the reading by hand)"
}

# bench_same_invoice DB TOKEN CONNECTION-ARGS...: through the given connection (pgbouncer), ctxguard's
# invoice.get on acme_inv3 returns what the careful baseline's handler returns (correctness before
# speed, for the scripts that compare bench/ctxguard.sql with bench/baseline_audit.sql).
bench_same_invoice() {
  local db=$1 token=$2 got
  shift 2
  got=$(psql -X -q -v ON_ERROR_STOP=1 "$@" -U ctxguard_gateway -d "$db" -At -F '|' -v token="$token" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'token', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}') \g /dev/null
SELECT ctxguard.call_tool('invoice.get', '{}')->'result' AS gated \gset
SELECT set_config('app.tenant_id', 'acme', true) \g /dev/null
SELECT bench.invoice_get('{"invoice_id": "acme_inv3"}') = :'gated'::jsonb, :'gated'::jsonb->>'id';
COMMIT;
SQL
)
  [ "$got" = "t|acme_inv3" ] || die "through $*: baseline vs ctxguard returned '$got'"
}

# bench_pooled_pair DB SUB: database DB made as gate_bench.sh's (demo + bench/setup.sql), an
# ap_clerk token for SUB in TOKEN, pgbouncer started (pool $POOL, stopped on exit) with VIA its
# connection arguments, and the call checked against the baseline through it
# (bench_same_invoice). For the scripts that compare bench/ctxguard*.sql with
# bench/baseline_audit.sql through the pooler.
bench_pooled_pair() {
  local db=$1 sub=$2
  log "creating $db (demo + bench/setup.sql, as gate_bench.sh and scale.sh)"
  create_demo_db "$db"
  psql_su -d "$db" -o /dev/null -f "$BENCH_DIR/setup.sql"
  TOKEN=$(mint --sub "$sub" --tenant acme --roles ap_clerk --ttl 7200)
  PGBOUNCER_POOL_SIZE=$POOL start_pgbouncer
  trap stop_pgbouncer EXIT
  VIA=(-h 127.0.0.1 -p "$PGBOUNCER_PORT")
  PGBOUNCER_VERSION=$("$(command -v pgbouncer || echo /usr/sbin/pgbouncer)" --version 2>/dev/null | head -n 1)
  bench_same_invoice "$db" "$TOKEN" "${VIA[@]}"
}

# bench_audit_mark DB: remember where DB's audit rows and the log's AUDIT_UNAVAILABLE refusals stand.
bench_audit_mark() {
  AUDIT0=$(psql_su -d "$1" -Atc "SELECT coalesce(max(id), 0) FROM ctxguard.audit_log")
  REFUSED0=$(grep -c 'AUDIT_UNAVAILABLE' "$RUN/postgres.log" || true)
}

# bench_audit_check DB: since bench_audit_mark, no call was refused as AUDIT_UNAVAILABLE and every
# audit row is `allow` (else the figures are refused); AUDITED is the number of those rows.
bench_audit_check() {
  local refused audit
  refused=$(( $(grep -c 'AUDIT_UNAVAILABLE' "$RUN/postgres.log" || true) - REFUSED0 ))
  [ "$refused" = 0 ] || die "$refused calls were refused as AUDIT_UNAVAILABLE (see $RUN/postgres.log)"
  audit=$(psql_su -d "$1" -Atc "SELECT count(*) FILTER (WHERE decision <> 'allow') || '|' || count(*)
                                 FROM ctxguard.audit_log WHERE id > $AUDIT0")
  [ "${audit%%|*}" = 0 ] || die "$1: the runs' audit rows hold ${audit%%|*} non-allow decisions"
  AUDITED=${audit#*|}
}

# bench_pgbench_ok NAME FILE: pgbench run NAME (its output in FILE) failed no transaction and
# completed at least one.
bench_pgbench_ok() {
  grep -q '^number of failed transactions: 0 ' "$2" ||
    { cat "$2" >&2; die "pgbench $1 had failed transactions"; }
  grep -Eq '^number of transactions actually processed: [1-9]' "$2" ||
    { cat "$2" >&2; die "pgbench $1 completed no transaction"; }
}
