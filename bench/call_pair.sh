#!/usr/bin/env bash
# The call as the gateway sends it against the careful baseline, beside the full call: three
# transactions through pgbouncer (transaction mode), each in turn, rounds alternating the order:
#   bench/baseline_audit.sql   the careful baseline: the handler and its own audit INSERT
#   bench/ctxguard_call.sql    the gateway's tool-call transaction: context, then Gate B's call
#                              with its durable audit record (gateway/src/db/mod.rs `call_tool`)
#   bench/ctxguard.sql         the full call of issue 34's aim: context, Gate A's list, Gate B's call
# and prints each one's tps and its ratio to the baseline's in the same round (the median and the
# range of the rounds). A diagnostic: how much of the full call's gap is Gate A's list, which the
# gateway sends in a turn's first transaction, not in each call's.
#
# With BENCH_PAIR_NOWAIT=1 a fourth run in each round is the full call with
# `ctxguard.audit_wait = off` (set on the database by the superuser, the pool's connections ended
# before and after it): callers neither wait for the writer's transaction nor flush the WAL. Not a
# configuration to run (a crash loses the records not yet written), and not a bound for a durable
# design either, which still flushes (docs/audit-durability.md): what the wait and the flush cost.
#
#   bench/call_pair.sh      # build+install (release), set up, verify, measure, print
#
# Environment: BENCH_SECONDS (default 8), BENCH_PAIR_ROUNDS (default 3), BENCH_PAIR_CLIENTS
# (default "4 16"), BENCH_POOL (default 8), BENCH_PAIR_NOWAIT (default 0), BENCH_RUN,
# BENCH_PGPORT, BENCH_PGBOUNCER_PORT.
#
# Figures are refused (the script fails) when a run had a failed transaction, a call was refused
# as AUDIT_UNAVAILABLE, or an audit row of the runs is not `allow`. Only talks to the local cluster
# and its own pgbouncer; the database ctxguard_call_pair is recreated each run.
set -euo pipefail
BENCH_NAME=call_pair
BENCH_PGBOUNCER_PORT=${BENCH_PGBOUNCER_PORT:-$(( ${BENCH_PGPORT:-54339} + 1 ))}
export CTXGUARD_PGBOUNCER_PORT=$BENCH_PGBOUNCER_PORT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DB=ctxguard_call_pair
SECONDS_PER_RUN=${BENCH_SECONDS:-8}
ROUNDS=${BENCH_PAIR_ROUNDS:-3}
CLIENTS=${BENCH_PAIR_CLIENTS:-4 16}
POOL=${BENCH_POOL:-8}
NOWAIT=${BENCH_PAIR_NOWAIT:-0}
bench_args "$@"
[ "$WRITE" = 0 ] || die "prints only (no results block): run without --write"
need_pgbench
OUT=$(bench_out)

bench_cluster
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
bench_pooled_pair "$DB" call-pair
bench_audit_mark "$DB"

# The database's ctxguard.audit_wait for the runs after this (a superuser's setting), with the pool's
# server connections ended so that each new one reads it.
audit_wait() {
  psql_su -d "$DB" -c "ALTER DATABASE $DB SET ctxguard.audit_wait = $1"
  psql_su -d "$DB" -Atc "SELECT count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_stat_activity
                          WHERE datname = '$DB' AND usename = 'ctxguard_gateway'" >/dev/null
}
trap 'psql_su -d "$DB" -c "ALTER DATABASE $DB RESET ctxguard.audit_wait" >/dev/null 2>&1 || true; stop_pgbouncer' EXIT

printf 'clients|round|script|tps\n' >"$OUT/tps.tsv"
for c in $CLIENTS; do
  for r in $(seq "$ROUNDS"); do
    order=(baseline_audit ctxguard_call ctxguard)
    [ "$NOWAIT" = 0 ] || order+=(ctxguard_nowait)
    [ $((r % 2)) = 1 ] || order=($(printf '%s\n' "${order[@]}" | tac))
    for s in "${order[@]}"; do
      name="$s-c$c-r$r"
      script=$s
      if [ "$s" = ctxguard_nowait ]; then
        script=ctxguard
        audit_wait off
      fi
      log "pgbench $name -c $c -T $SECONDS_PER_RUN"
      pgbench -n -M extended -c "$c" -j 2 -T "$SECONDS_PER_RUN" "${VIA[@]}" -U ctxguard_gateway \
        -D token="$TOKEN" -f "$BENCH_DIR/$script.sql" "$DB" >"$OUT/$name.txt" 2>&1 ||
        { cat "$OUT/$name.txt" >&2; die "pgbench $name failed"; }
      [ "$s" != ctxguard_nowait ] || audit_wait on
      bench_pgbench_ok "$name" "$OUT/$name.txt"
      tps=$(awk '/^tps = / {print $3}' "$OUT/$name.txt")
      printf '%s|%s|%s|%s\n' "$c" "$r" "$s" "$tps" >>"$OUT/tps.tsv"
    done
  done
done
bench_audit_check "$DB"

python3 - "$OUT/tps.tsv" <<'PY'
import statistics, sys
rows = [l.rstrip('\n').split('|') for l in open(sys.argv[1])][1:]
tps = {(int(c), int(r), s): float(t) for c, r, s, t in rows}
nowait = any(k[2] == 'ctxguard_nowait' for k in tps)
print('| clients | careful baseline tps (median) | the gateway\'s call (`ctxguard_call.sql`) / baseline: median (range) | the full call (`ctxguard.sql`) / baseline: median (range) |'
      + (' the full call with `audit_wait = off` / baseline: median (range) |' if nowait else ''))
print('|---:|---:|---:|---:|' + ('---:|' if nowait else ''))
for c in sorted({k[0] for k in tps}):
    rs = sorted({k[1] for k in tps if k[0] == c})
    base = [tps[(c, r, 'baseline_audit')] for r in rs]
    cell = lambda s: (lambda v: f'{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})')(
        [tps[(c, r, s)] / tps[(c, r, 'baseline_audit')] for r in rs])
    print(f'| {c} | {statistics.median(base):.0f} | {cell("ctxguard_call")} | {cell("ctxguard")} |'
          + (f' {cell("ctxguard_nowait")} |' if nowait else ''))
PY
printf '\nRun: %s, commit %s, %s build, pgbench `-n -M extended -j 2`, %s s per run, %s rounds (order alternating), through %s (transaction mode, pool %s); load average before: %s.\n' \
  "$(date -u +%Y-%m-%dT%H:%MZ)" "$(bench_rev)" "$PROFILE" "$SECONDS_PER_RUN" "$ROUNDS" "$PGBOUNCER_VERSION" "$POOL" "$load_before"
bench_machine "pgbench's tps"
log "raw output: $OUT"
