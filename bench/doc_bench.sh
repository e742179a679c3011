#!/usr/bin/env bash
# In-database latency of the document tools on the 500-page demo document (pgbench, prepared mode).
#
#   bench/doc_bench.sh            # build+install (release), set up, verify, measure, print tables
#   bench/doc_bench.sh --write    # ... and rewrite the doc_bench results block of BENCHMARKS.md
#   BENCH_DOC_PAGES=50000 bench/doc_bench.sh --write   # the same guide with 50,000 pages
#                                 # (block doc_bench_50000; the search is meant to be as fast)
#
# Environment:
#   BENCH_DOC_PAGES number of pages of the guide (default 500: the demo's; any other count
#                   regenerates it with that many pages, same text per page, before the runs;
#                   50,000 pages take about a minute more; reads stay within pages 1-500)
#   BENCH_SECONDS   duration of each pgbench run (default 8; 9 runs, so ~1.5 min in all)
#   BENCH_RUN       cluster directory (default /tmp/ctxguard-bench, shared with gate_bench.sh)
#   BENCH_PGPORT    cluster port (default 54339)
#   CTXGUARD_PROFILE  build profile (default release)
#
# What is measured, per tool (read_doc_pages with 5 pages from a random start; doc_local_search
# with one of four queries) at 1 and 4 clients:
#   - plain runs:  BEGIN; set_context(token, document_viewer page, generation); call_tool(...); COMMIT
#                  -> tps, pgbench -r per-statement averages, per-transaction percentiles (--log);
#   - timed runs:  the same transaction, the call wrapped in docbench.timed_call, which reads
#                  clock_timestamp() right before and after ctxguard.call_tool inside the database
#                  -> p50/p95/p99/max of the call alone.
#   - the search's baseline (1 client): the same four queries in PostgreSQL's full-text search alone
#                  (docbench.timed_plain_search: every matching page ranked by ts_rank_cd, the best
#                  five with ts_headline), timed the same way -> doc_local_search / baseline.
# Before them, each client's user reads the whole document once, 5 pages per call (the first read
# of a page in a day also records it for the coverage limit): timed as "first read".
#
# Only talks to the local cluster. Idempotent: the database ctxguard_docbench is recreated each run.
set -euo pipefail

DOC_PAGES=${BENCH_DOC_PAGES:-500}
[[ $DOC_PAGES =~ ^[0-9]+$ ]] && [ "$DOC_PAGES" -ge 500 ] && [ "$DOC_PAGES" -le 100000 ] ||
  { echo "BENCH_DOC_PAGES must be 500-100000" >&2; exit 2; }
BENCH_NAME=doc_bench
[ "$DOC_PAGES" = 500 ] || BENCH_NAME=doc_bench_$DOC_PAGES
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DB=ctxguard_docbench
SECONDS_PER_RUN=${BENCH_SECONDS:-8}
CLIENTS=4
PAGE='{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'
QUERIES=('LDAP directory integration' 'TLS certificate rotation' 'backup scheduling' 'replication lag')
bench_args "$@"

need_pgbench

OUT=$(bench_out)

# ------------------------------------------------------------------------------------------------
# 1. Build, install, cluster, database.
# ------------------------------------------------------------------------------------------------
bench_cluster
log "creating $DB (demo schema + demo documents: the 500-page acme_guide, then $DOC_PAGES pages)"
create_demo_db "$DB"
psql_su -d "$DB" -o /dev/null -f "$BENCH_DIR/doc_setup.sql"
if [ "$DOC_PAGES" != 500 ]; then
  # The same guide with DOC_PAGES pages (demo.manual_page's text, ten pages per chapter), ingested
  # as the demo ingests it: pages, chapters, then ready (boilerplate detection and the index).
  log "regenerating acme_guide with $DOC_PAGES pages"
  psql_su -d "$DB" -o /dev/null -v pages="$DOC_PAGES" \
    -v tok="$(mint --sub ingest-bot --tenant acme --roles doc_ingest --aud "${CTXGUARD_AUD:-}")" <<'SQL'
SET client_min_messages = warning;
BEGIN;
SELECT ctxguard.set_context(:'tok', '{"pageType": "invoice_table"}');
SELECT ctxguard.put_document('acme_guide', 'Orion Platform Administrator Guide 4.2', tags => ARRAY['admin', 'orion'],
                             product_version => '4.2', language => 'english');
SELECT count(ctxguard.put_page('acme_guide', n, demo.manual_page(n, :pages))) FROM generate_series(1, :pages) n;
SELECT count(ctxguard.put_section('acme_guide', 'ch' || c, 'Chapter ' || c, (c - 1) * 10 + 1, least(c * 10, :pages)))
  FROM generate_series(1, (:pages + 9) / 10) c;
SELECT ctxguard.put_document('acme_guide', 'Orion Platform Administrator Guide 4.2', 'ready', ARRAY['admin', 'orion'], '4.2', NULL, NULL, 'english');
COMMIT;
ANALYZE ctxguard.document_pages;
SQL
  [ "$(psql_su -d "$DB" -Atc "SELECT page_count || status FROM ctxguard.documents WHERE id = 'acme_guide'")" = "${DOC_PAGES}ready" ] ||
    die "acme_guide was not regenerated with $DOC_PAGES pages"
fi

# One user, token and generation per pgbench client (client_id 0..CLIENTS-1), and one for checks.
# mint_generation USER: prints "token|generation" (minted as the gateway, as a gateway would).
mint_generation() {
  local token gen
  token=$(mint --sub "$1" --tenant acme --roles support --ttl 7200)
  gen=$(psql_gw -At -v token="$token" -v page="$PAGE" -v conv="docbench-$1" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'token', :'page') \g /dev/null
SELECT ctxguard.begin_generation(:'conv');
COMMIT;
SQL
)
  printf '%s|%s' "$token" "$gen"
}
for ((c = 0; c < CLIENTS; c++)); do
  IFS='|' read -r token gen <<<"$(mint_generation "reader$c")"
  psql_su -d "$DB" -c "INSERT INTO docbench.clients VALUES ($c, '$token', '$gen')"
done
IFS='|' read -r CHECK_TOKEN CHECK_GEN <<<"$(mint_generation checker)"

# ------------------------------------------------------------------------------------------------
# 2. Correctness before speed (as ctxguard_gateway, with the statements the benchmark sends).
# ------------------------------------------------------------------------------------------------
log "verifying the document tools"
# read 1-5: status, pages, first..last page, doc_id, trimmed; read 75-79 (page 77 holds a card
# number and an IBAN): status, raw card still present?; read 1-6: error code; audit of the first
# call: bytes limit and per-document call count.
check=$(psql_gw -At -F '|' -v token="$CHECK_TOKEN" -v gen="$CHECK_GEN" -v page="$PAGE" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'token', :'page', :'gen') \g /dev/null
WITH r AS (SELECT ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', 1, 'page_end', 5)) AS r)
SELECT r->>'status', jsonb_array_length(r->'result'->'pages'), r->'result'->'pages'->0->>'page',
       r->'result'->'pages'->4->>'page', r->'result'->>'doc_id', coalesce(r->'result'->>'trimmed', '-')
  FROM r;
WITH r AS (SELECT ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', 75, 'page_end', 79)) AS r)
SELECT r->>'status', (r->'result')::text LIKE '%4111 1111 1111 1111%' FROM r;
SELECT ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', 1, 'page_end', 6))->'error'->>'code';
SELECT budget->>'bytes_limit', budget->>'doc_calls', masked IS NOT NULL
  FROM ctxguard.audit_log WHERE user_id = 'checker' AND tool = 'read_doc_pages' AND decision = 'allow'
 ORDER BY id DESC LIMIT 1;
COMMIT;
SQL
)
{ read -r line1; read -r line2; read -r line3; read -r line4; } <<<"$check"
[ "$line1" = "ok|5|1|5|acme_guide|-" ] || die "read_doc_pages 1-5 returned '$line1' (want ok|5|1|5|acme_guide|-)"
[ "$line2" = "ok|f" ] || die "read_doc_pages 75-79 returned '$line2' (want ok and the card number masked)"
[ "$line3" = RATE_LIMIT_EXCEEDED ] || die "read_doc_pages 1-6 returned '$line3' (pages_per_call must still apply)"
[ "$line4" = "2147483647|2|t" ] || die "audit of the last read: '$line4' (want the raised byte limit, 2 calls, masking counts)"
for q in "${QUERIES[@]}"; do
  res=$(psql_gw -At -F '|' -v token="$CHECK_TOKEN" -v gen="$CHECK_GEN" -v page="$PAGE" -v q="$q" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'token', :'page', :'gen') \g /dev/null
WITH r AS (SELECT ctxguard.call_tool('doc_local_search', jsonb_build_object('query', :'q'::text)) AS r)
SELECT r->>'status', jsonb_array_length(r->'result'->'results'), length(r->'result'->'results'->0->>'snippet') > 0,
       coalesce(r->'result'->>'trimmed', '-')
  FROM r;
COMMIT;
SQL
)
  case $res in
    ok\|[1-5]\|t\|-) ;;
    *) die "doc_local_search '$q' returned '$res' (want ok, 1-5 results with snippets, untrimmed)" ;;
  esac
done
log "ok: 5 pages per read, masking on, pages_per_call enforced, raised limits in force, searches return results"

# ------------------------------------------------------------------------------------------------
# 3. First read: every client's user reads the whole document once, 5 pages per call, each call in
#    its own transaction (one psql session, simple protocol; the call is timed in the database).
# ------------------------------------------------------------------------------------------------
log "first read: $CLIENTS users x 100 calls of 5 new pages"
for ((c = 0; c < CLIENTS; c++)); do
  for ((s = 1; s <= 496; s += 5)); do
    echo 'BEGIN;'
    echo "SELECT ctxguard.set_context(c.token, :'page', c.generation) FROM docbench.clients c WHERE c.client_id = $c \\g /dev/null"
    echo "SELECT docbench.timed_call('first-read', 'read_doc_pages', jsonb_build_object('page_start', $s, 'page_end', $((s + 4)))) \\g /dev/null"
    echo 'COMMIT;'
  done
done >"$OUT/first_read.sql"
psql_gw -v page="$PAGE" -f "$OUT/first_read.sql"

# ------------------------------------------------------------------------------------------------
# 4. Measure. Prepared mode (a pooled gateway prepares its statements).
# ------------------------------------------------------------------------------------------------
# run NAME SCRIPT CLIENTS: one pgbench run; output in $OUT/NAME-cCLIENTS.txt, transaction log in
# $OUT/NAME-cCLIENTS.log.*; timed scripts label their rows in docbench.call_ms NAME-cCLIENTS.
run() {
  local name=$1 script=$2 clients=$3 threads
  threads=$(( clients > 1 ? 2 : 1 ))
  local out="$OUT/$name-c$clients.txt"
  log "pgbench $name -c $clients -j $threads -T $SECONDS_PER_RUN"
  pgbench -n -M prepared -r -c "$clients" -j "$threads" -T "$SECONDS_PER_RUN" \
    --log --log-prefix="$OUT/$name-c$clients.log" \
    -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -D run="$name-c$clients" -f "$BENCH_DIR/$script" "$DB" >"$out" 2>&1 \
    || { cat "$out" >&2; die "pgbench $name failed"; }
  grep -q '^number of failed transactions: 0 ' "$out" || { cat "$out" >&2; die "pgbench $name had failed transactions"; }
}
# field FILE: tps and average latency of a run, "tps|ms"
field() {
  awk '/^tps = / {tps = $3} /^latency average = / {lat = $4} END {printf "%.0f|%.3f", tps, lat}' "$1"
}
# stmt FILE PATTERN: average latency (ms) of the statement whose text matches PATTERN
stmt() {
  awk -v pat="$2" 'found && $0 ~ pat {print $1; exit} /^statement latencies/ {found = 1}' "$1"
}
# txn_pct NAME-cN: per-transaction latency p50|p95|p99|max (ms) from the pgbench logs (field 3, us)
txn_pct() {
  cat "$OUT/$1.log".* | awk '{print $3 / 1000}' | sort -g | awk '
    {v[NR] = $1}
    END {
      split("0.50 0.95 0.99", q, " ")
      for (i = 1; i <= 3; i++) { r = int(q[i] * NR + 0.999999); if (r < 1) r = 1; printf "%.2f|", v[r] }
      printf "%.2f", v[NR]
    }'
}

log "warm-up"
for script in doc_read_pages.sql doc_search.sql; do
  pgbench -n -M prepared -c "$CLIENTS" -j 2 -T 2 -h "$RUN" -p "$PGPORT" -U ctxguard_gateway \
    -f "$BENCH_DIR/$script" "$DB" >/dev/null 2>&1 || die "warm-up with $script failed"
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
audit_before=$(psql_su -d "$DB" -Atc "SELECT coalesce(max(id), 0) FROM ctxguard.audit_log")
for c in 1 "$CLIENTS"; do
  run pages doc_read_pages.sql "$c"
  run pages_timed doc_read_pages_timed.sql "$c"
  run search doc_search.sql "$c"
  run search_timed doc_search_timed.sql "$c"
done
# The search's baseline in the same run: PostgreSQL's full-text search alone, 1 client.
run plain_timed doc_search_plain_timed.sql 1

# Every call must have done the full work: allowed, 5 pages / 1-5 results, nothing trimmed.
bad=$(psql_su -d "$DB" -Atc "SELECT count(*) FILTER (WHERE decision <> 'allow') || '|' || count(*)
                             FROM ctxguard.audit_log WHERE id > $audit_before")
[ "${bad%%|*}" = 0 ] || die "audit_log holds ${bad%%|*} non-allow decisions"
badcalls=$(psql_su -d "$DB" -Atc "SELECT count(*) FROM docbench.call_ms
  WHERE status IS DISTINCT FROM 'ok' OR trimmed
     OR (tool = 'read_doc_pages' AND items IS DISTINCT FROM 5)
     OR (tool IN ('doc_local_search', 'plain_search') AND NOT items BETWEEN 1 AND 5)")
[ "$badcalls" = 0 ] || die "docbench.call_ms holds $badcalls calls that were refused, trimmed or short"

# ------------------------------------------------------------------------------------------------
# 5. Report.
# ------------------------------------------------------------------------------------------------
# call_pct RUN [QUERY]: calls|mean|p50|p95|p99|max (ms) of the timed calls of RUN
call_pct() {
  psql_su -d "$DB" -At -F '|' -v run="$1" -v q="${2:-}" <<'SQL'
SELECT count(*), round(avg(ms)::numeric, 2),
       round((percentile_cont(0.50) WITHIN GROUP (ORDER BY ms))::numeric, 2),
       round((percentile_cont(0.95) WITHIN GROUP (ORDER BY ms))::numeric, 2),
       round((percentile_cont(0.99) WITHIN GROUP (ORDER BY ms))::numeric, 2),
       round(max(ms)::numeric, 2)
  FROM docbench.call_ms WHERE run = :'run' AND (:'q' = '' OR query = :'q');
SQL
}
# The backticks below are Markdown code spans, not command substitutions.
# shellcheck disable=SC2016
report() {
  local c n mean p50 p95 p99 max label target aim
  printf '| call (in-database, timed around `call_tool`) | clients | calls | mean ms | p50 ms | p95 ms | p99 ms | max ms | seed 003 p95 target | aim |\n'
  printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
  for row in first-read pages_timed-c1 "pages_timed-c$CLIENTS" search_timed-c1 "search_timed-c$CLIENTS" plain_timed-c1; do
    case $row in
      first-read) label='`read_doc_pages`, 5 pages, first read today (records coverage)'; c=1 ;;
      pages_timed-*) label='`read_doc_pages`, 5 pages, random start'; c=${row##*-c} ;;
      search_timed-*) label='`doc_local_search`, 4 queries at random'; c=${row##*-c} ;;
      plain_timed-*) label='baseline: the same 4 queries in PostgreSQL'"'"'s full-text search alone (every matching page ranked, `ts_headline`; no gate, masking or audit)'; c=1 ;;
    esac
    case $row in
      search*) target='70-140 ms'; aim='< 10 ms' ;;
      plain*) target='—'; aim='—' ;;
      *) target='60-120 ms'; aim='< 2 ms' ;;
    esac
    IFS='|' read -r n mean p50 p95 p99 max <<<"$(call_pct "$row")"
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$c" "$n" "$mean" "$p50" "$p95" "$p99" "$max" "$target" "$aim"
  done
  printf '\n`doc_local_search` per query at 1 client (p50 / p95 ms, calls):'
  local q sep=' '
  for q in "${QUERIES[@]}"; do
    IFS='|' read -r n mean p50 p95 p99 max <<<"$(call_pct search_timed-c1 "$q")"
    printf '%s"%s" %s / %s (%s)' "$sep" "$q" "$p50" "$p95" "$n"
    sep='; '
  done
  printf '.\n'
  local s50 s95 b50 b95
  IFS='|' read -r n mean s50 s95 p99 max <<<"$(call_pct search_timed-c1)"
  IFS='|' read -r n mean b50 b95 p99 max <<<"$(call_pct plain_timed-c1)"
  printf '\n`doc_local_search` / the baseline at 1 client, same run: p50 %s, p95 %s (times; below 1 is faster than PostgreSQL'"'"'s search alone).\n' \
    "$(awk -v a="$s50" -v b="$b50" 'BEGIN {printf "%.2f", a / b}')" "$(awk -v a="$s95" -v b="$b95" 'BEGIN {printf "%.2f", a / b}')"
  printf '\nResult size (bytes of the masked `result`, mean): `read_doc_pages` %s, `doc_local_search` %s.\n' \
    "$(psql_su -d "$DB" -Atc "SELECT round(avg(bytes)) FROM docbench.call_ms WHERE tool = 'read_doc_pages'")" \
    "$(psql_su -d "$DB" -Atc "SELECT round(avg(bytes)) FROM docbench.call_ms WHERE tool = 'doc_local_search'")"

  printf '\n| pgbench transaction (`BEGIN; set_context; call_tool; COMMIT`) | clients | tps | `call_tool` avg ms (`-r`) | txn avg ms | txn p50 ms | txn p95 ms | txn p99 ms | txn max ms |\n'
  printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|\n'
  local name tps lat
  for c in 1 "$CLIENTS"; do
    for name in pages search; do
      case $name in
        pages) label='`read_doc_pages`, 5 pages' ;;
        search) label='`doc_local_search`' ;;
      esac
      IFS='|' read -r tps lat <<<"$(field "$OUT/$name-c$c.txt")"
      IFS='|' read -r p50 p95 p99 max <<<"$(txn_pct "$name-c$c")"
      printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$c" "$tps" \
        "$(stmt "$OUT/$name-c$c.txt" 'call_tool')" "$lat" "$p50" "$p95" "$p99" "$max"
    done
  done
  for name in pages search; do
    local f=$OUT/$name-c1.txt
    printf '\n%s at 1 client (per statement, ms): BEGIN %s, `set_context` %s, `call_tool` %s, COMMIT %s.\n' \
      "$([ $name = pages ] && echo '`read_doc_pages`' || echo '`doc_local_search`')" \
      "$(stmt "$f" '^ *[0-9.]+ +[0-9]+ +BEGIN')" "$(stmt "$f" 'set_context')" "$(stmt "$f" 'call_tool')" \
      "$(stmt "$f" '^ *[0-9.]+ +[0-9]+ +COMMIT')"
  done
  printf '\nDocument: `acme_guide` with %s pages (%s of them match "replication lag").\n' "$DOC_PAGES" \
    "$(psql_su -d "$DB" -Atc "SELECT count(*) FROM ctxguard.document_pages WHERE doc_id = 'acme_guide' AND tsv @@ websearch_to_tsquery('english', 'replication lag')")"
  printf '\nRun: %s, commit %s, %s build, 9 x %s s pgbench runs (`-n -M prepared -r --log`, 1 client `-j 1`, %s clients `-j 2`) after %s first-read calls and a 2 x 2 s warm-up, ' \
    "$(date -u +%Y-%m-%dT%H:%MZ)" "$(bench_rev pg_ext)" "$PROFILE" "$SECONDS_PER_RUN" "$CLIENTS" $((CLIENTS * 100))
  printf '%s audit rows written by the runs (all `allow`), load average before: %s.\n' "${bad#*|}" "$load_before"
  bench_machine "$(pgbench --version)"
}

bench_report report
