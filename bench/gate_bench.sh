#!/usr/bin/env bash
# Gate A + Gate B vs a direct handler call, with 1,000 registered tools (pgbench, prepared mode).
#
#   bench/gate_bench.sh            # build+install (release), set up, verify, measure, print a table
#   bench/gate_bench.sh --write    # ... and rewrite the results block of BENCHMARKS.md
#
# Environment:
#   BENCH_SECONDS   duration of each pgbench run (default 12; 14 runs, so ~3 min in all)
#   BENCH_PAIR_ROUNDS, BENCH_PAIR_SECONDS  issue 30's aim, paired at 1 client: rounds (default 8)
#                   of one run with and one without the condition and quota (default 5 s each)
#   BENCH_RUN       cluster directory (default /tmp/ctxguard-bench: a dedicated cluster, so that it
#                   preloads the release build just installed; a shared dev cluster keeps whatever
#                   ctxguard.so it preloaded at start until it is restarted)
#   BENCH_PGPORT    cluster port (default 54339)
#   CTXGUARD_PROFILE  build profile (default release)
#
# Only talks to the local cluster. Idempotent: the database ctxguard_bench is recreated each run.
set -euo pipefail

BENCH_NAME=gate_bench
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DB=ctxguard_bench
SECONDS_PER_RUN=${BENCH_SECONDS:-12}
PAGE='{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
bench_args "$@"

need_pgbench

OUT=$(bench_out)

# ------------------------------------------------------------------------------------------------
# 1. Build, install, cluster, database.
# ------------------------------------------------------------------------------------------------
bench_cluster
create_demo_db "$DB"
# The demo catalog (demo tools plus the built-in document tools), before the 1,000 bench tools.
n_demo=$(psql_su -d "$DB" -Atc "SELECT count(*) FROM ctxguard.tools")
log "registering 1,000 extra tools and the baseline schema"
psql_su -d "$DB" -o /dev/null -f "$BENCH_DIR/setup.sql"
TOKEN=$(mint --sub alice --tenant acme --roles ap_clerk --ttl 7200)

# ------------------------------------------------------------------------------------------------
# 2. Correctness before speed (as ctxguard_gateway).
# ------------------------------------------------------------------------------------------------
log "verifying both paths"
# visible, visible off-page, expected visible (from the catalog), catalog size, status, invoice id
check=$(psql_gw -At -F '|' -v token="$TOKEN" -v page="$PAGE" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'token', :'page') \g /dev/null
WITH v AS (SELECT name FROM ctxguard.visible_tools()),
     call AS (SELECT ctxguard.call_tool('invoice.get', '{}') AS r)
SELECT (SELECT count(*) FROM v),
       (SELECT count(*) FROM v JOIN ctxguard.tool_policies p ON p.tool = v.name
         WHERE NOT p.page_types && '{*,invoice_detail}'),
       (SELECT count(*) FROM ctxguard.tool_policies
         WHERE enabled AND page_types && '{*,invoice_detail}' AND required_states = '{}'
           AND (roles = '{}' OR roles && '{ap_clerk}')),
       (SELECT count(*) FROM ctxguard.tools),
       r->>'status', r->'result'->>'id'
  FROM call;
COMMIT;
SQL
)
IFS='|' read -r n_visible n_offpage n_expected n_catalog status invoice_id <<<"$check"
[ "$n_catalog" = $((n_demo + 1001)) ] || die "expected $((n_demo + 1001)) catalogued tools, found $n_catalog"
if [ "$status" != ok ] || [ "$invoice_id" != acme_inv3 ]; then
  die "call_tool('invoice.get') returned status=$status id=$invoice_id"
fi
if [ "$n_offpage" != 0 ] || [ "$n_visible" != "$n_expected" ]; then
  die "visible_tools returned $n_visible tools ($n_offpage off-page), expected $n_expected"
fi

# own tenant's invoice, another tenant's invoice (must be hidden by RLS)
baseline=$(psql_gw -At -F '|' <<'SQL'
BEGIN;
SELECT set_config('app.tenant_id', 'acme', true) \g /dev/null
SELECT bench.invoice_get('{"invoice_id": "acme_inv3"}')->>'id',
       bench.invoice_get('{"invoice_id": "glx_inv3"}')->>'found',
       jsonb_array_length(bench.invoice_get('{"invoice_id": "acme_inv3"}')->'documents');
COMMIT;
SQL
)
[ "$baseline" = "acme_inv3|false|1" ] || die "baseline handler returned '$baseline' (expected the invoice with its 1 document)"
# The same work minus what is measured: the baseline's result is ctxguard's, byte for byte.
same=$(psql_gw -At -v token="$TOKEN" -v page="$PAGE" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'token', :'page') \g /dev/null
SELECT ctxguard.call_tool('invoice.get', '{}')->'result' AS gated \gset
SELECT set_config('app.tenant_id', 'acme', true) \g /dev/null
SELECT bench.invoice_get('{"invoice_id": "acme_inv3"}') = :'gated'::jsonb;
COMMIT;
SQL
)
[ "$same" = t ] || die "the baseline handler's result differs from demo.invoice_get's through ctxguard"
log "ok: invoice.get status ok; Gate A shows $n_visible of $n_catalog tools; baseline returns the invoice"

# ------------------------------------------------------------------------------------------------
# 3. Measure. Prepared mode (a pooled gateway prepares its statements), per-statement latencies.
# ------------------------------------------------------------------------------------------------
# run NAME SCRIPT CLIENTS THREADS [PGOPTIONS]: one pgbench run, output kept in $OUT/NAME-cCLIENTS.txt
run() {
  local name=$1 script=$2 clients=$3 threads=$4 options=${5:-}
  local out="$OUT/$name-c$clients.txt"
  log "pgbench $name -c $clients -j $threads -T $SECONDS_PER_RUN"
  PGOPTIONS=$options pgbench -n -M prepared -r -c "$clients" -j "$threads" -T "$SECONDS_PER_RUN" \
    --log --log-prefix="$OUT/$name-c$clients.tx" \
    -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -D token="$TOKEN" -f "$BENCH_DIR/$script" "$DB" >"$out" 2>&1 \
    || { cat "$out" >&2; die "pgbench $name failed"; }
  grep -q '^number of failed transactions: 0 ' "$out" || { cat "$out" >&2; die "pgbench $name had failed transactions"; }
}
# field FILE: tps and average latency of a run, "tps|ms"
field() {
  awk '/^tps = / {tps = $3} /^latency average = / {lat = $4} END {printf "%.0f|%.3f", tps, lat}' "$1"
}
# pct NAME CLIENTS: p50, p95 and p99 of the run's transaction latencies (ms), "p50|p95|p99", from
# pgbench's per-transaction log (its third field: the latency in microseconds).
pct() {
  cat "$OUT/$1-c$2".tx.* | awk '{print $3}' | sort -n | awk '{v[NR] = $1}
    END {printf "%.3f|%.3f|%.3f", v[int(NR * 0.50) + 1] / 1000, v[int(NR * 0.95) + 1] / 1000, v[int(NR * 0.99) + 1] / 1000}'
}
# stmt FILE PATTERN: average latency (ms) of the statement whose text matches PATTERN
stmt() {
  awk -v pat="$2" 'found && $0 ~ pat {print $1; exit} /^statement latencies/ {found = 1}' "$1"
}

# Warm up shared buffers and the catalog caches after the (re)start: 2 s per script, discarded.
log "warm-up"
for script in baseline.sql baseline_audit.sql ctxguard.sql context_gate_a.sql ctxguard_pipelined.sql ctxguard_pinned.sql ctxguard_conditions.sql; do
  pgbench -n -M prepared -c 1 -j 1 -T 2 -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -D token="$TOKEN" \
    -f "$BENCH_DIR/$script" "$DB" >/dev/null 2>&1 || die "warm-up with $script failed"
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# Calls refused as AUDIT_UNAVAILABLE are not audited: count them in the server log instead.
refused_before=$(grep -c 'AUDIT_UNAVAILABLE' "$RUN/postgres.log" || true)
audit_before=$(psql_su -d "$DB" -Atc "SELECT count(*) FROM ctxguard.audit_log")
# audit_wait is superuser-only: the off runs get it from a role setting.
nowait() { psql_su -d "$DB" -c "ALTER ROLE ctxguard_gateway IN DATABASE $DB $1" >/dev/null; }
for c in 1 4; do
  j=$(( c > 1 ? 2 : 1 ))
  run baseline baseline.sql "$c" "$j"
  run baseline_audit baseline_audit.sql "$c" "$j"
  run ctxguard ctxguard.sql "$c" "$j"
  # Issue 30: the same call with one `when` condition and one quota, right after it.
  run ctxguard_conditions ctxguard_conditions.sql "$c" "$j"
  run gate_a context_gate_a.sql "$c" "$j"
  # The gateway's way: pipelined, with and without its pinned settings (issue 29).
  run ctxguard_pipelined ctxguard_pipelined.sql "$c" "$j"
  run ctxguard_pinned ctxguard_pinned.sql "$c" "$j"
  # The same ctxguard transaction with ctxguard.audit_wait = off (results before the audit is durable).
  nowait "SET ctxguard.audit_wait = off"
  run ctxguard_nowait ctxguard.sql "$c" "$j"
  nowait "RESET ctxguard.audit_wait"
done
# Issue 30's aim, paired: the call with and without its condition and quota at 1 client, in turn,
# PAIR_ROUNDS times (order A B, B A, ...: a drift of the machine falls on both alike); each run's
# `call_tool` mean (pgbench -r). Judged on the median of the rounds' paired differences: one pair
# of runs moves by more than the aim here (the audit record's fsync alone varies by a millisecond).
PAIR_ROUNDS=${BENCH_PAIR_ROUNDS:-8}
PAIR_SECONDS=${BENCH_PAIR_SECONDS:-5}
: >"$OUT/pairs.txt"
for r in $(seq 1 "$PAIR_ROUNDS"); do
  order="ctxguard ctxguard_conditions"
  [ $(( r % 2 )) = 0 ] && order="ctxguard_conditions ctxguard"
  for name in $order; do
    out=$OUT/pair$r-$name.txt
    pgbench -n -M prepared -r -c 1 -j 1 -T "$PAIR_SECONDS" -h "$RUN" -p "$PGPORT" -U ctxguard_gateway \
      -D token="$TOKEN" -f "$BENCH_DIR/$name.sql" "$DB" >"$out" 2>&1 || { cat "$out" >&2; die "pgbench pair $r $name failed"; }
    grep -q '^number of failed transactions: 0 ' "$out" || { cat "$out" >&2; die "pgbench pair $r $name had failed transactions"; }
    printf '%s %s %s\n' "$r" "$name" "$(stmt "$out" 'call_tool')" >>"$OUT/pairs.txt"
  done
done
writer=$(psql_su -d "$DB" -Atc "SELECT ctxguard.ledger_stats()")

# Every Gate B call of the runs must have been allowed (no silent denials measured as speed).
bad=$(psql_su -d "$DB" -Atc "SELECT count(*) FILTER (WHERE decision <> 'allow') || '|' || count(*) - $audit_before
                             FROM ctxguard.audit_log")
[ "${bad%%|*}" = 0 ] || die "audit_log holds ${bad%%|*} non-allow decisions"
refused=$(( $(grep -c 'AUDIT_UNAVAILABLE' "$RUN/postgres.log" || true) - refused_before ))
[ "$refused" = 0 ] || die "$refused calls were refused as AUDIT_UNAVAILABLE (see $RUN/postgres.log)"

# ------------------------------------------------------------------------------------------------
# 4. Report.
# ------------------------------------------------------------------------------------------------
# The backticks below are Markdown code spans, not command substitutions.
# shellcheck disable=SC2016
report() {
  local c tps lat p50 p95 p99 base_tps audit_tps label
  printf '| scenario | clients | tps | avg latency ms | p50 ms | p95 ms | p99 ms | ratio vs baseline | ratio vs careful baseline |\n'
  printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
  for c in 1 4; do
    base_tps=$(field "$OUT/baseline-c$c.txt" | cut -d'|' -f1)
    audit_tps=$(field "$OUT/baseline_audit-c$c.txt" | cut -d'|' -f1)
    for name in baseline baseline_audit ctxguard ctxguard_conditions gate_a ctxguard_nowait ctxguard_pipelined ctxguard_pinned; do
      case $name in
        baseline) label='baseline: `set_config` + `bench.invoice_get()` (no audit)' ;;
        baseline_audit) label='careful baseline: the same + its own audit `INSERT`' ;;
        ctxguard) label='ctxguard: `set_context` + `visible_tools` + `call_tool(invoice.get)`' ;;
        ctxguard_conditions) label='ctxguard, the tool with one `when` condition and one `rate_limit` quota' ;;
        gate_a) label='context + Gate A only: `set_context` + `visible_tools`' ;;
        ctxguard_nowait) label='ctxguard, `ctxguard.audit_wait = off`' ;;
        ctxguard_pipelined) label='ctxguard, pipelined as the gateway sends it, plain `BEGIN`' ;;
        ctxguard_pinned) label='ctxguard, pipelined, with the gateway'"'"'s `BEGIN … READ WRITE` and its pins' ;;
      esac
      IFS='|' read -r tps lat <<<"$(field "$OUT/$name-c$c.txt")"
      IFS='|' read -r p50 p95 p99 <<<"$(pct "$name" "$c")"
      printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$c" "$tps" "$lat" "$p50" "$p95" "$p99" \
        "$(awk -v a="$tps" -v b="$base_tps" 'BEGIN {printf "%.2f", a / b}')" \
        "$(awk -v a="$tps" -v b="$audit_tps" 'BEGIN {printf "%.2f", a / b}')"
    done
  done
  for c in 1 4; do
    printf '\nPinned settings at %s client(s): pinned / unpinned pipelined tps = %s.' "$c" \
      "$(awk -v a="$(field "$OUT/ctxguard_pinned-c$c.txt" | cut -d'|' -f1)" -v b="$(field "$OUT/ctxguard_pipelined-c$c.txt" | cut -d'|' -f1)" 'BEGIN {printf "%.2f", a / b}')"
  done
  printf '\n'
  printf '\nAudit writer after the runs: %s.\n' "$writer"
  local f=$OUT/gate_a-c1.txt g=$OUT/ctxguard-c1.txt
  local sc va cm
  sc=$(stmt "$f" 'set_context'); va=$(stmt "$f" 'visible_tools'); cm=$(stmt "$f" '^ *[0-9.]+ +[0-9]+ +COMMIT')
  printf '\nContext + Gate A at 1 client (per statement, ms): `set_context` %s + `visible_tools` %s = %s' \
    "$sc" "$va" "$(awk -v a="$sc" -v b="$va" 'BEGIN {printf "%.3f", a + b}')"
  printf ' (whole transaction incl. BEGIN/COMMIT %s; its COMMIT alone %s).\n' \
    "$(field "$f" | cut -d'|' -f2)" "$cm"
  printf '\nFull ctxguard transaction at 1 client (per statement, ms): BEGIN %s, `set_context` %s, `visible_tools` %s, `call_tool` %s, COMMIT %s.\n' \
    "$(stmt "$g" '^ *[0-9.]+ +[0-9]+ +BEGIN')" "$(stmt "$g" 'set_context')" "$(stmt "$g" 'visible_tools')" \
    "$(stmt "$g" 'call_tool')" "$(stmt "$g" '^ *[0-9.]+ +[0-9]+ +COMMIT')"
  local k=$OUT/ctxguard_conditions-c1.txt
  printf '\nConditions at 1 client in the single runs of the table (per statement, ms): `call_tool` with one `when` and one `rate_limit` %s, without %s: %s ms added per call (one pair of runs; the aim is judged on the paired rounds below).\n' \
    "$(stmt "$k" 'call_tool')" "$(stmt "$g" 'call_tool')" \
    "$(awk -v a="$(stmt "$k" 'call_tool')" -v b="$(stmt "$g" 'call_tool')" 'BEGIN {printf "%+.3f", a - b}')"
  printf '\nConditions, paired at 1 client (%s rounds of %s s per script, alternating order; `call_tool` mean ms):\n\n' \
    "$PAIR_ROUNDS" "$PAIR_SECONDS"
  awk '
    {v[$1, $2] = $3; if ($1 > n) n = $1}
    function median(a, k,   i, j, t) {
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) {t = a[i]; a[i] = a[j]; a[j] = t}
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    END {
      print "| round | without | with `when` + `rate_limit` | added |"
      print "|---:|---:|---:|---:|"
      for (r = 1; r <= n; r++) {
        d[r] = v[r, "ctxguard_conditions"] - v[r, "ctxguard"]
        printf "| %d | %.3f | %.3f | %+.3f |\n", r, v[r, "ctxguard"], v[r, "ctxguard_conditions"], d[r]
      }
      m = median(d, n)
      printf "\n**A `when` condition and a quota, added per call at 1 client, median of the %d paired rounds: %+.3f ms** (aim ≤ 0.1 ms: **%s**).\n",
        n, m, (m <= 0.1 ? "met" : "not met")
    }' "$OUT/pairs.txt"
  printf '\nBaseline at 1 client (per statement, ms): `set_config` %s, `bench.invoice_get` %s, COMMIT %s.\n' \
    "$(stmt "$OUT/baseline-c1.txt" 'set_config')" "$(stmt "$OUT/baseline-c1.txt" 'invoice_get')" \
    "$(stmt "$OUT/baseline-c1.txt" '^ *[0-9.]+ +[0-9]+ +COMMIT')"
  printf '\nRun: %s, commit %s, %s build, %s x %s s pgbench runs (`-n -M prepared -r`, 1 client `-j 1`, 4 clients `-j 2`), ' \
    "$(date -u +%Y-%m-%dT%H:%MZ)" "$(bench_rev pg_ext)" "$PROFILE" 16 "$SECONDS_PER_RUN"
  printf '%s of %s catalogued tools visible on the page, %s audit rows written (all `allow`), load average before: %s.\n' \
    "$n_visible" "$n_catalog" "${bad#*|}" "$load_before"
  bench_machine "$(pgbench --version)"
}

bench_report report
