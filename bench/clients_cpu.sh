#!/usr/bin/env bash
# Where the CPU goes per transaction: the full read-only call (bench/ctxguard.sql: context, Gate A's
# list, Gate B's call with its durable audit record) against the careful baseline
# (bench/baseline_audit.sql: the same handler and its own audit INSERT), through pgbouncer, with
# the CPU time every process of the run used divided by the transactions it completed.
#
#   bench/clients_cpu.sh            # build+install (release), set up, verify, measure, print tables
#   bench/clients_cpu.sh --write    # ... and rewrite the clients_cpu results block of BENCHMARKS.md
#
# Environment:
#   BENCH_SECONDS         duration of each pgbench run (default 10)
#   BENCH_CPU_ROUNDS      rounds per client count, the two scripts back to back, order alternating
#                         (default 3)
#   BENCH_CPU_CLIENTS     client counts (default "4 16")
#   BENCH_POOL            pgbouncer's server pool (default 8, as bench/scale.sh)
#   BENCH_RUN, BENCH_PGPORT, BENCH_PGBOUNCER_PORT (default BENCH_PGPORT + 1), CTXGUARD_PROFILE
#
# Why: the tps ratio of two runs moves by more than the issue's aim on a shared 2-core machine
# (0.82 to 1.05 at one client count); CPU time per transaction, process by process, moves much less
# and says where the difference is. Read from /proc/<pid>/stat (user + system clock ticks) before
# and after each run, for the cluster's processes (the postmaster's children), pgbouncer, and
# pgbench itself (its own rusage). A process that exits during a run (an autovacuum worker) takes
# its ticks with it: the run notes how many did.
#
# Figures are refused (the script fails) when a run had a failed transaction, when a call was
# refused as AUDIT_UNAVAILABLE, or when an audit row of the run is not `allow`.
#
# Only talks to the local cluster (and its own pgbouncer). Idempotent: the database
# ctxguard_clients_cpu is recreated each run.
set -euo pipefail
BENCH_NAME=clients_cpu
BENCH_PGBOUNCER_PORT=${BENCH_PGBOUNCER_PORT:-$(( ${BENCH_PGPORT:-54339} + 1 ))}
export CTXGUARD_PGBOUNCER_PORT=$BENCH_PGBOUNCER_PORT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DB=ctxguard_clients_cpu
SECONDS_PER_RUN=${BENCH_SECONDS:-10}
ROUNDS=${BENCH_CPU_ROUNDS:-3}
CLIENTS=${BENCH_CPU_CLIENTS:-4 16}
POOL=${BENCH_POOL:-8}
bench_args "$@"
need_pgbench
OUT=$(bench_out)
[ -x /usr/bin/time ] || die "/usr/bin/time is needed (Debian package time)"

bench_cluster
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# Correctness through the pooler first: the call and the baseline return the same invoice.
bench_pooled_pair "$DB" clients-cpu
POSTMASTER=$(head -n 1 "$RUN/pgdata/postmaster.pid")
PGBOUNCER_PID=$(cat "$PGB_DIR/pgbouncer.pid")
for s in baseline_audit.sql ctxguard.sql; do
  pgbench -n -M extended -c 4 -j 2 -T 2 "${VIA[@]}" -U ctxguard_gateway -D token="$TOKEN" \
    -f "$BENCH_DIR/$s" "$DB" >/dev/null 2>&1 || die "warm-up with $s through pgbouncer failed"
done
bench_audit_mark "$DB"

# snapshot FILE: "pid kind ticks" of the cluster's processes and pgbouncer.
snapshot() {
  local stat pid ppid kind title rest
  for stat in /proc/[0-9]*/stat; do
    pid=${stat#/proc/}; pid=${pid%/stat}
    # Fields after the command's closing parenthesis: state ppid ... utime(14) stime(15).
    rest=$(cat "$stat" 2>/dev/null) || continue
    rest=${rest##*) }
    read -r -a f <<<"$rest"
    ppid=${f[1]}
    if [ "$pid" = "$PGBOUNCER_PID" ]; then
      kind=pgbouncer
    elif [ "$ppid" = "$POSTMASTER" ]; then
      title=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
      case $title in
        *"ctxguard ledger writer"*) kind=writer ;;
        *"postgres: ctxguard_gateway "*) kind=backends ;;
        *walwriter*) kind=walwriter ;;
        *) kind=other ;;
      esac
    else
      continue
    fi
    echo "$pid $kind $(( f[11] + f[12] ))"
  done >"$1"
}

# run NAME SCRIPT CLIENTS: one pgbench run with the CPU snapshots around it.
run() {
  local name=$1 script=$2 clients=$3
  log "pgbench $name -c $clients -j 2 -T $SECONDS_PER_RUN"
  snapshot "$OUT/$name.before"
  /usr/bin/time -f '%U %S' -o "$OUT/$name.pgbench-cpu" \
    pgbench -n -M extended -c "$clients" -j 2 -T "$SECONDS_PER_RUN" "${VIA[@]}" -U ctxguard_gateway \
    -D token="$TOKEN" -f "$BENCH_DIR/$script" "$DB" >"$OUT/$name.txt" 2>&1 ||
    { cat "$OUT/$name.txt" >&2; die "pgbench $name failed"; }
  snapshot "$OUT/$name.after"
  bench_pgbench_ok "$name" "$OUT/$name.txt"
  # name|tps|tx|µs per tx by kind (backends writer walwriter other pgbouncer pgbench)|exited
  /usr/bin/python3 - "$OUT/$name" "$(getconf CLK_TCK)" <<'PY' >"$OUT/$name.cpu"
import re, sys
base, hz = sys.argv[1], int(sys.argv[2])
def load(path):
    out = {}
    for line in open(path):
        pid, kind, ticks = line.split()
        out[pid] = (kind, int(ticks))
    return out
before, after = load(base + '.before'), load(base + '.after')
text = open(base + '.txt').read()
tx = int(re.search(r'^number of transactions actually processed: (\d+)', text, re.M).group(1))
tps = float(re.search(r'^tps = ([0-9.]+)', text, re.M).group(1))
kinds = ['backends', 'writer', 'walwriter', 'other', 'pgbouncer']
sums = dict.fromkeys(kinds, 0)
for pid, (kind, ticks) in after.items():
    sums[kind] += ticks - before.get(pid, (kind, 0))[1]
exited = sum(1 for pid in before if pid not in after)
user, system = open(base + '.pgbench-cpu').read().split()[-2:]
us = [sums[k] / hz / tx * 1e6 for k in kinds] + [(float(user) + float(system)) / tx * 1e6]
print('|'.join([f'{tps:.0f}', str(tx)] + [f'{u:.1f}' for u in us] + [str(exited)]))
PY
}

printf 'clients|script|round|tps|tx|backends|writer|walwriter|other|pgbouncer|pgbench|exited\n' >"$OUT/cpu.tsv"
for c in $CLIENTS; do
  for r in $(seq 1 "$ROUNDS"); do
    order=(base ctx)
    [ $((r % 2)) = 1 ] || order=(ctx base)
    for which in "${order[@]}"; do
      script=baseline_audit.sql
      [ "$which" = ctx ] && script=ctxguard.sql
      run "$which-c$c-r$r" "$script" "$c"
      echo "$c|$which|$r|$(cat "$OUT/$which-c$c-r$r.cpu")" >>"$OUT/cpu.tsv"
    done
  done
done
stop_pgbouncer
trap - EXIT

bench_audit_check "$DB"
ctx_tx=$(awk -F'|' '$2 == "ctx" {n += $5} END {print n + 0}' "$OUT/cpu.tsv")
[ "$AUDITED" -ge "$ctx_tx" ] || die "$DB: $AUDITED audit rows for $ctx_tx ctxguard transactions"

report() {
  /usr/bin/python3 - "$OUT/cpu.tsv" <<'PY'
import statistics, sys
rows = [l.rstrip('\n').split('|') for l in open(sys.argv[1])][1:]
cols = ['backends', 'writer', 'walwriter', 'other', 'pgbouncer', 'pgbench']
med = lambda xs: statistics.median(xs)
print('| clients | transaction | tps (median) | backends | ledger writer | WAL writer | other cluster processes | pgbouncer | pgbench | all | runs |')
print('|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
summary = []
for c in sorted({int(r[0]) for r in rows}):
    got = {}
    for which, label in (('base', 'careful baseline (`baseline_audit.sql`)'), ('ctx', 'ctxguard full call (`ctxguard.sql`)')):
        rs = [r for r in rows if int(r[0]) == c and r[1] == which]
        per = {k: med([float(r[5 + i]) for r in rs]) for i, k in enumerate(cols)}
        total = med([sum(float(r[5 + i]) for i in range(len(cols))) for r in rs])
        tps = med([float(r[3]) for r in rs])
        exited = sum(int(r[11]) for r in rs)
        got[which] = (tps, per, total)
        cells = ' | '.join(f'{per[k]:.0f}' for k in cols)
        note = f'{len(rs)}' + (f' ({exited} processes exited during them)' if exited else '')
        print(f'| {c} | {label} | {tps:.0f} | {cells} | {total:.0f} | {note} |')
    pairs = {}
    for r in rows:
        if int(r[0]) == c:
            pairs.setdefault(r[2], {})[r[1]] = float(r[3])
    ratios = sorted(p['ctx'] / p['base'] for p in pairs.values() if len(p) == 2)
    (bt, bp, btot), (xt, xp, xtot) = got['base'], got['ctx']
    summary.append((c, med(ratios), ratios[0], ratios[-1], btot / xtot, xtot - btot,
                    {k: xp[k] - bp[k] for k in cols}))
print()
print('CPU time per transaction in µs (medians of the rounds), by process.')
print()
for c, rm, lo, hi, cpu_ratio, diff, by in summary:
    parts = ', '.join(f'{k} {v:+.0f}' for k, v in by.items() if abs(v) >= 1)
    print(f'- {c} clients: tps ratio ctxguard / baseline {rm:.2f} (rounds {lo:.2f}-{hi:.2f}); '
          f'CPU per transaction baseline / ctxguard {cpu_ratio:.2f}: ctxguard uses {diff:+.0f} µs '
          f'per transaction ({parts}).')
PY
  printf '\nRun: %s, commit %s, %s build, pgbench `-n -M extended -j 2`, %s s per run, %s rounds per client count (order alternating), through %s (transaction mode, pool %s); audit rows of the runs: %s, all `allow`; load average before: %s.\n' \
    "$(date -u +%Y-%m-%dT%H:%MZ)" "$(bench_rev)" "$PROFILE" "$SECONDS_PER_RUN" "$ROUNDS" "$PGBOUNCER_VERSION" "$POOL" "$AUDITED" "$load_before"
  bench_machine "CPU ticks from /proc/<pid>/stat ($(getconf CLK_TCK) per second), pgbench's from its rusage"
}
bench_report report
