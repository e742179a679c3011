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
