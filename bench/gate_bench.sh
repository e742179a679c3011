#!/usr/bin/env bash
# Gate A + Gate B vs a direct handler call, with 1,000 registered tools (pgbench, prepared mode).
#
#   bench/gate_bench.sh            # build+install (release), set up, verify, measure, print a table
#   bench/gate_bench.sh --write    # ... and rewrite the results block of BENCHMARKS.md
#
# Environment:
#   BENCH_SECONDS   duration of each pgbench run (default 12; 14 runs, so ~3 min in all)
#   BENCH_MIXED_SECONDS  issue 30's aim at 1 client: one run (default 40 s) calling the tool with
#                   and without the condition and quota at random, each call timed in the database
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
# Issue 30's aim in one run at 1 client: each transaction calls the tool with or without its
# condition and quota at random (bench/ctxguard_interleaved.sql), the call timed inside the
# database. Both meet the same moments of the machine (the audit record's fsync alone varies by a
# millisecond, and the hypervisor takes CPU time in stretches), so their medians compare; judged
# on the difference of the medians. Each quarter of the run is also reported alone.
MIXED_SECONDS=${BENCH_MIXED_SECONDS:-40}
psql_su -d "$DB" -o /dev/null -c 'TRUNCATE bench.call_ms'
out=$OUT/mixed.txt
pgbench -n -M prepared -r -c 1 -j 1 -T "$MIXED_SECONDS" -h "$RUN" -p "$PGPORT" -U ctxguard_gateway \
  -D token="$TOKEN" -f "$BENCH_DIR/ctxguard_interleaved.sql" "$DB" >"$out" 2>&1 || { cat "$out" >&2; die "pgbench mixed run failed"; }
grep -q '^number of failed transactions: 0 ' "$out" || { cat "$out" >&2; die "pgbench mixed run had failed transactions"; }
not_ok=$(psql_su -d "$DB" -Atc "SELECT count(*) FILTER (WHERE status IS DISTINCT FROM 'ok') || '|' || count(DISTINCT tool) FROM bench.call_ms")
[ "$not_ok" = "0|2" ] || die "mixed run: calls not ok, or not both tools called ($not_ok)"
psql_su -d "$DB" -At -F ' ' >"$OUT/mixed.tsv" <<'SQL'
WITH c AS (SELECT tool, ms, ntile(4) OVER (ORDER BY ctid) AS quarter FROM bench.call_ms)
SELECT 'all', tool, count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), avg(ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY ms) FROM c GROUP BY tool
UNION ALL
SELECT quarter::text, tool, count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), avg(ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY ms) FROM c GROUP BY quarter, tool
ORDER BY 1, 2;
SQL
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
  printf '\nConditions at 1 client in the single runs of the table (per statement, ms): `call_tool` with one `when` and one `rate_limit` %s, without %s: %s ms added per call (one pair of runs; the aim is judged on the run below, which calls both in turn).\n' \
    "$(stmt "$k" 'call_tool')" "$(stmt "$g" 'call_tool')" \
    "$(awk -v a="$(stmt "$k" 'call_tool')" -v b="$(stmt "$g" 'call_tool')" 'BEGIN {printf "%+.3f", a - b}')"
  printf '\nConditions in one run at 1 client (%s s; each transaction calls one of the two tools at random; `call_tool` timed in the database, ms):\n\n' "$MIXED_SECONDS"
  awk '
    {n[$1, $2] = $3; p50[$1, $2] = $4; mean[$1, $2] = $5; p95[$1, $2] = $6}
    END {
      a = "invoice.get"; b = "invoice.get_checked"
      print "| part of the run | calls without / with | p50 without | p50 with | p50 added | mean added | p95 added |"
      print "|---|---:|---:|---:|---:|---:|---:|"
      for (q = 1; q <= 4; q++)
        printf "| quarter %d | %d / %d | %.3f | %.3f | %+.3f | %+.3f | %+.3f |\n", q, n[q, a], n[q, b], p50[q, a], p50[q, b],
          p50[q, b] - p50[q, a], mean[q, b] - mean[q, a], p95[q, b] - p95[q, a]
      d = p50["all", b] - p50["all", a]
      printf "| **the whole run** | %d / %d | %.3f | %.3f | **%+.3f** | %+.3f | %+.3f |\n", n["all", a], n["all", b], p50["all", a],
        p50["all", b], d, mean["all", b] - mean["all", a], p95["all", b] - p95["all", a]
      printf "\n**A `when` condition and a quota, added per call at 1 client (difference of the medians): %+.3f ms** (aim ≤ 0.1 ms: **%s**).\n",
        d, (d <= 0.1 ? "met" : "not met")
    }' "$OUT/mixed.tsv"
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
