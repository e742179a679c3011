#!/usr/bin/env bash
# Latency the gateway adds per turn (one tool call) against calling the mock model directly (wrk).
#
#   bench/gateway_bench.sh            # build (release), set up, verify, measure, print a table
#   bench/gateway_bench.sh --write    # ... and rewrite the gateway_bench results block of BENCHMARKS.md
#
# Environment:
#   BENCH_SECONDS      duration of each wrk/pgbench run (default 10; 11 runs, so ~2.5 min in all)
#   BENCH_CONNECTIONS  connections of the loaded runs (default 8, wrk -t2); the others use 1 (-t1)
#   BENCH_TRACE_ROUNDS, BENCH_TRACE_SECONDS  tracing on against off, paired at 1 connection: rounds
#                      (default 8) of one run per gateway (default 4 s each), alternating order
#   BENCH_PERF=1       also a CPU profile (perf record -g) of each gateway during the first round
#   BENCH_PORT         first of five loopback ports: mock, gateway (mock provider), gateway
#                      (offline provider), gateway (mock provider, tracing on), OTLP sink (default 18391)
#   BENCH_RUN          cluster directory (default /tmp/ctxguard-bench, shared with gate_bench.sh)
#   BENCH_PGPORT       cluster port (default 54339)
#   CTXGUARD_PROFILE   build profile (default release)
#
# What runs: the dedicated bench cluster (database ctxguard_gwbench: the demo schema), the mock
# OpenAI-compatible server `mock_openai` (tests/src/bin/mock_openai.rs: step 1 answers one tool
# call `vendor__list`, step 2 a short text; no sleeps), a gateway with CTXGUARD_PROVIDER=openai
# pointed at the mock, a gateway with CTXGUARD_PROVIDER=offline, and the mock-provider gateway again
# with OpenTelemetry tracing on (OTEL_EXPORTER_OTLP_ENDPOINT: a loopback sink that reads and
# acknowledges every OTLP/HTTP export, counting requests and bytes). One turn is
# `POST /v1/chat {"message": "what vendors do I have?", "pageContext": {"pageType": "vendor_table"}}`
# as alice (tenant acme, role ap_clerk): open_turn transaction, model step 1, call_tool transaction
# (vendor.list), model step 2, save_turn transaction. The direct baseline POSTs to the mock the two
# bodies the gateway sent it for that turn (captured by the mock), one wrk run per body. Diagnostic:
# the turn's database statements alone (bench/gateway_turn_db.sql, pgbench), right after the
# gateway runs at the same connection count.
#
# Only loopback traffic; every wrk run is bounded by BENCH_SECONDS. The mock and both gateways are
# stopped on exit; the bench cluster is left running (as gate_bench.sh does).
set -euo pipefail

BENCH_NAME=gateway_bench
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DB=ctxguard_gwbench
SECONDS_PER_RUN=${BENCH_SECONDS:-10}
LOAD=${BENCH_CONNECTIONS:-8}
PORT=${BENCH_PORT:-18391}
MOCK_ADDR=127.0.0.1:$PORT
GW_MOCK_ADDR=127.0.0.1:$((PORT + 1))
GW_OFF_ADDR=127.0.0.1:$((PORT + 2))
GW_OTEL_ADDR=127.0.0.1:$((PORT + 3))
SINK_ADDR=127.0.0.1:$((PORT + 4))
MESSAGE='what vendors do I have?'
bench_args "$@"

need_pgbench
if ! command -v wrk >/dev/null; then
  [ "$(id -u)" = 0 ] || die "wrk not found (Debian: apt-get install wrk)"
  log "installing wrk (Debian package)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; } ||
    die "could not install wrk"
fi
command -v curl >/dev/null || die "curl not found"
for addr in "$MOCK_ADDR" "$GW_MOCK_ADDR" "$GW_OFF_ADDR" "$GW_OTEL_ADDR" "$SINK_ADDR"; do
  if (exec 3<>"/dev/tcp/${addr%:*}/${addr#*:}") 2>/dev/null; then
    die "something already listens on $addr (set BENCH_PORT)"
  fi
done

OUT=$(bench_out)
mkdir -p "$OUT/capture"

# Processes this script starts (pids), stopped on exit.
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------------------
# 1. Build, install, cluster, database, binaries.
# ------------------------------------------------------------------------------------------------
bench_cluster
log "creating $DB (demo schema)"
create_demo_db "$DB" >/dev/null
# One bench user makes every turn, faster than a real user: on this dedicated cluster she may hold
# the whole of her tenant's ledger share (ctxguard.ledger_user_share, default 5 %, would refuse her
# calls as CAPACITY_EXCEEDED under load; fair capacity itself is gate_bench's and the SQL suite's).
psql_su -d postgres -o /dev/null -c "ALTER SYSTEM SET ctxguard.ledger_user_share = 25" -c "SELECT pg_reload_conf()"

log "building ctxguard-gateway and mock_openai ($PROFILE)"
flag=()
bindir=$CARGO_TARGET_DIR/debug
[ "$PROFILE" = release ] && { flag=(--release); bindir=$CARGO_TARGET_DIR/release; }
(cd "$ROOT" && cargo build -q "${flag[@]}" -p ctxguard-gateway --bin ctxguard-gateway &&
  cargo build -q "${flag[@]}" -p ctxguard-tests --bin mock_openai)

TOKEN=$(mint --sub alice --tenant acme --roles ap_clerk --ttl 7200)
DB_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB"

# ------------------------------------------------------------------------------------------------
# 2. Start the mock and the two gateways (clean environments: nothing inherited but PATH/HOME).
# ------------------------------------------------------------------------------------------------
log "starting mock_openai on $MOCK_ADDR and gateways on $GW_MOCK_ADDR (openai -> mock), $GW_OFF_ADDR (offline)"
env -i PATH="$PATH" HOME="${HOME:-/root}" MOCK_OPENAI_CAPTURE="$OUT/capture" \
  "$bindir/mock_openai" "$MOCK_ADDR" >"$OUT/mock.log" 2>&1 &
PIDS+=($!)
gateway() { # ADDR PROVIDER [VAR=value...]  (log: gateway-PROVIDER$GW_TAG.log)
  local addr=$1 provider=$2
  shift 2
  env -i PATH="$PATH" HOME="${HOME:-/root}" RUST_LOG=info \
    CTXGUARD_DATABASE_URL="$DB_URL" CTXGUARD_LISTEN="$addr" CTXGUARD_PROVIDER="$provider" \
    CTXGUARD_POOL_SIZE="$LOAD" "$@" \
    "$bindir/ctxguard-gateway" >"$OUT/gateway-$provider${GW_TAG:-}.log" 2>&1 &
  PIDS+=($!)
}
# The OTLP sink: reads and acknowledges each export (an empty ExportTraceServiceResponse), and
# counts them ("requests bytes" in $OUT/otlp-sink.txt).
python3 - "${SINK_ADDR#*:}" "$OUT/otlp-sink.txt" >"$OUT/otlp-sink.log" 2>&1 <<'PY' &
import sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port, out = int(sys.argv[1]), sys.argv[2]
lock, seen = threading.Lock(), [0, 0]
class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = len(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with lock:
            seen[0] += 1; seen[1] += n
            open(out, "w").write(f"{seen[0]} {seen[1]}\n")
        self.send_response(200 if self.path == "/v1/traces" else 404)
        self.send_header("Content-Type", "application/x-protobuf"); self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
PY
PIDS+=($!)
gateway "$GW_MOCK_ADDR" openai CTXGUARD_LLM_BASE_URL="http://$MOCK_ADDR/v1" CTXGUARD_MODEL=mock
GW_MOCK_PID=${PIDS[-1]}
gateway "$GW_OFF_ADDR" offline
GW_TAG=-otel gateway "$GW_OTEL_ADDR" openai CTXGUARD_LLM_BASE_URL="http://$MOCK_ADDR/v1" CTXGUARD_MODEL=mock \
  OTEL_EXPORTER_OTLP_ENDPOINT="http://$SINK_ADDR" OTEL_SERVICE_NAME=ctxguard-bench
GW_OTEL_PID=${PIDS[-1]}
# wait_ok URL: until it answers 200 (at most ~20 s)
wait_ok() {
  local _
  for _ in $(seq 1 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1" 2>/dev/null)" = 200 ] && return 0
    sleep 0.2
  done
  die "$1 did not answer 200 (logs in $OUT)"
}
wait_ok "http://$MOCK_ADDR/health"
wait_ok "http://$GW_MOCK_ADDR/ready"
wait_ok "http://$GW_OFF_ADDR/ready"
wait_ok "http://$GW_OTEL_ADDR/ready"

# ------------------------------------------------------------------------------------------------
# 3. Correctness before speed: one turn through each gateway, checked field by field.
# ------------------------------------------------------------------------------------------------
python3 -c 'import json, sys; print(json.dumps({"message": sys.argv[1], "pageContext": {"pageType": "vendor_table", "entity": None}}))' \
  "$MESSAGE" >"$OUT/chat.json"
# check_turn ADDR PROVIDER STEPS: POST one turn, check it, print the answer
check_turn() {
  local addr=$1 provider=$2 steps=$3 trace code
  trace="gwbench-check-$provider-$$"
  code=$(curl -s -o "$OUT/check-$provider.json" -w '%{http_code}' "http://$addr/v1/chat" \
    -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' -H "x-request-id: $trace" \
    --data-binary "@$OUT/chat.json")
  [ "$code" = 200 ] || die "$provider gateway: POST /v1/chat returned $code: $(cat "$OUT/check-$provider.json")"
  python3 - "$OUT/check-$provider.json" "$steps" <<'PY' || die "$provider gateway: unexpected turn: $(cat "$OUT/check-$provider.json")"
import json, sys
r = json.load(open(sys.argv[1]))
calls = r["toolCalls"]
assert len(calls) == 1, calls
assert calls[0]["tool"] == "vendor.list" and calls[0]["decision"] == "allow", calls
assert r["steps"] == int(sys.argv[2]) and not r["stoppedByStepLimit"], r
assert r["pageType"] == "vendor_table" and r["turn"] == 1 and r["answer"], r
assert "vendor.list" in r["visibleTools"], r
print(r["answer"].replace("\n", " ")[:120])
PY
  local audit
  audit=$(psql_su -d "$DB" -Atc "SELECT string_agg(tool || ':' || decision, ',') FROM ctxguard.audit_log WHERE trace_id = '$trace'")
  [ "$audit" = "vendor.list:allow" ] || die "$provider gateway: audit rows for the turn: '$audit'"
}
log "verifying one turn through each gateway"
answer_mock=$(check_turn "$GW_MOCK_ADDR" openai 2)
answer_off=$(check_turn "$GW_OFF_ADDR" offline 2)
check_turn "$GW_OTEL_ADDR" openai-otel 2 >/dev/null
if [ ! -s "$OUT/capture/step1.json" ] || [ ! -s "$OUT/capture/step2.json" ]; then
  die "the mock did not capture both request bodies of the turn"
fi
python3 - "$OUT/capture/step1.json" "$OUT/capture/step2.json" <<'PY' || die "captured model requests are not as expected"
import json, sys
s1, s2 = (json.load(open(p)) for p in sys.argv[1:3])
assert [m["role"] for m in s1["messages"]] == ["system", "user"], s1["messages"]
assert "vendor__list" in [t["function"]["name"] for t in s1["tools"]], s1["tools"]
roles = [m["role"] for m in s2["messages"]]
assert roles == ["system", "user", "assistant", "tool"], roles
assert json.loads(s2["messages"][3]["content"])["status"] == "ok", s2["messages"][3]
PY
step1_bytes=$(stat -c %s "$OUT/capture/step1.json")
step2_bytes=$(stat -c %s "$OUT/capture/step2.json")
n_vendors=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["messages"][3]; print(len(json.loads(m["content"])["result"]["vendors"]))' "$OUT/capture/step2.json")
n_offered=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["tools"]))' "$OUT/capture/step1.json")
log "ok: mock provider answered '$answer_mock'; offline answered '${answer_off:0:60}...'"
log "ok: the gateway sent the mock $step1_bytes + $step2_bytes bytes ($n_offered tools offered, $n_vendors vendors in the tool result)"

# ------------------------------------------------------------------------------------------------
# 4. Measure.
# ------------------------------------------------------------------------------------------------
# bench NAME URL BODY TOKEN CONNECTIONS [SECONDS]: one wrk run, its result line kept in $OUT/NAME-cN.txt
bench() {
  local name=$1 url=$2 body=$3 token=$4 c=$5 secs=${6:-$SECONDS_PER_RUN}
  local t=$(( c > 1 ? 2 : 1 )) out="$OUT/$name-c$c.txt"
  log "wrk $name -c $c -t $t -d ${secs}s"
  WRK_BODY=$body WRK_TOKEN=$token wrk -c "$c" -t "$t" -d "${secs}s" --latency -s "$BENCH_DIR/wrk_post.lua" "$url" \
    >"$out" 2>&1 || { cat "$out" >&2; die "wrk $name failed"; }
  grep -q '^WRK_RESULT ' "$out" || { cat "$out" >&2; die "wrk $name printed no result"; }
  grep -q ' connect=0 read=0 write=0 status=0 timeout=0$' "$out" ||
    { cat "$out" >&2; die "wrk $name had errors (4xx/5xx responses, timeouts or socket errors)"; }
}
# val NAME C KEY: one field of a run's result line
val() { sed -n 's/^WRK_RESULT .*\<'"$3"'=\([0-9.]*\).*/\1/p' "$OUT/$1-c$2.txt"; }
# metric ADDR NAME: sum of a Prometheus series over its labels
metric() { curl -s "http://$1/metrics" | awk -v n="$2" '$1 ~ "^"n"($|\\{)" {s += $2} END {printf "%.9f", s}'; }

MOCK_URL=http://$MOCK_ADDR/v1/chat/completions
log "warm-up (discarded)"
bench warm-step1 "$MOCK_URL" "$OUT/capture/step1.json" "" 1 2
bench warm-step2 "$MOCK_URL" "$OUT/capture/step2.json" "" 1 2
bench warm-gw-mock "http://$GW_MOCK_ADDR/v1/chat" "$OUT/chat.json" "$TOKEN" "$LOAD" 3
bench warm-gw-offline "http://$GW_OFF_ADDR/v1/chat" "$OUT/chat.json" "$TOKEN" "$LOAD" 3
bench warm-gw-otel "http://$GW_OTEL_ADDR/v1/chat" "$OUT/chat.json" "$TOKEN" "$LOAD" 3

# The same database work without HTTP or model (pgbench): prepared (every statement one round trip
# with a saved plan), and at 1 client also extended (parsed and planned on every execution, as the
# gateway does for the statements it does not cache).
TURN_SQL=$BENCH_DIR/gateway_turn_db.sql
# pg_run MODE CLIENTS: one pgbench run; output in $OUT/db-MODE-cN.txt, transaction log db-MODE-cN.log.*
pg_run() {
  local mode=$1 c=$2 j out
  j=$(( $2 > 1 ? 2 : 1 )); out=$OUT/db-$mode-c$c.txt
  log "pgbench gateway_turn_db.sql -M $mode -c $c -j $j -T $SECONDS_PER_RUN"
  pgbench -n -M "$mode" -r -c "$c" -j "$j" -T "$SECONDS_PER_RUN" --log --log-prefix="$OUT/db-$mode-c$c.log" \
    -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -D token="$TOKEN" -f "$TURN_SQL" "$DB" >"$out" 2>&1 ||
    { cat "$out" >&2; die "pgbench -M $mode -c $c failed"; }
  grep -q '^number of failed transactions: 0 ' "$out" ||
    { cat "$out" >&2; die "pgbench -M $mode -c $c had failed transactions"; }
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
audit_before=$(psql_su -d "$DB" -Atc "SELECT coalesce(max(id), 0) FROM ctxguard.audit_log")
for c in 1 "$LOAD"; do
  bench step1 "$MOCK_URL" "$OUT/capture/step1.json" "" "$c"
  bench step2 "$MOCK_URL" "$OUT/capture/step2.json" "" "$c"
  if [ "$c" = 1 ]; then
    llm_sum0=$(metric "$GW_MOCK_ADDR" ctxguard_llm_request_seconds_sum)
    llm_n0=$(metric "$GW_MOCK_ADDR" ctxguard_llm_request_seconds_count)
  fi
  bench gw-mock "http://$GW_MOCK_ADDR/v1/chat" "$OUT/chat.json" "$TOKEN" "$c"
  if [ "$c" = 1 ]; then
    llm_sum1=$(metric "$GW_MOCK_ADDR" ctxguard_llm_request_seconds_sum)
    llm_n1=$(metric "$GW_MOCK_ADDR" ctxguard_llm_request_seconds_count)
  fi
  bench gw-otel "http://$GW_OTEL_ADDR/v1/chat" "$OUT/chat.json" "$TOKEN" "$c"
  bench gw-offline "http://$GW_OFF_ADDR/v1/chat" "$OUT/chat.json" "$TOKEN" "$c"
  pg_run prepared "$c"
  if [ "$c" = 1 ]; then pg_run extended 1; fi
done

# Tracing on against off, paired (issue 32): at 1 connection the two gateways (the same binary,
# provider and database; only OTEL_EXPORTER_OTLP_ENDPOINT differs) are run in turn, TRACE_ROUNDS
# times, in the order A B, B A, A B, ... (so a drift of the machine's load falls on both alike).
# Each run gives its p50 and the gateway process's CPU time per turn (the time on the CPU of each
# of its threads, /proc/PID/task/*/schedstat: all of them, and those that serve requests). The aim is judged on the
# median of the rounds' paired p50 differences: a single pair of runs moves by more than the aim on
# a shared machine (the database's fsync alone varies by a millisecond).
TRACE_ROUNDS=${BENCH_TRACE_ROUNDS:-8}
TRACE_SECONDS=${BENCH_TRACE_SECONDS:-4}
# cpu_ns PID [req]: nanoseconds on the CPU of the process's threads (their schedstat), or with
# `req` of the threads that serve requests only (all but the exporter's: the batch processor's
# thread, OpenTelemetry.Traces…, and its HTTP client's runtime, reqwest-internal…).
cpu_ns() {
  local t n=0 comm
  for t in /proc/"$1"/task/*; do
    comm=$(cat "$t/comm" 2>/dev/null) || continue
    if [ "${2:-}" = req ]; then
      case $comm in OpenTelemetry* | reqwest*) continue ;; esac
    fi
    n=$(( n + $(cut -d' ' -f1 "$t/schedstat" 2>/dev/null || echo 0) ))
  done
  echo "$n"
}
: >"$OUT/trace-pairs.txt"
log "threads of the traced gateway: $(sort "/proc/$GW_OTEL_PID"/task/*/comm | uniq -c | tr -s ' \n' ' ')"
for r in $(seq 1 "$TRACE_ROUNDS"); do
  order="gw-mock gw-otel"
  [ $(( r % 2 )) = 0 ] && order="gw-otel gw-mock"
  for name in $order; do
    if [ "$name" = gw-otel ]; then addr=$GW_OTEL_ADDR pid=$GW_OTEL_PID; else addr=$GW_MOCK_ADDR pid=$GW_MOCK_PID; fi
    t0=$(cpu_ns "$pid") q0=$(cpu_ns "$pid" req)
    # BENCH_PERF=1: a CPU profile of each gateway in the first round (perf-NAME.data in the raw output).
    if [ "$r" = 1 ] && [ "${BENCH_PERF:-}" = 1 ]; then
      perf record -q -g -F 1999 -p "$pid" -o "$OUT/perf-$name.data" -- sleep "$TRACE_SECONDS" 2>/dev/null &
      perf_pid=$!
    fi
    bench "pair$r-$name" "http://$addr/v1/chat" "$OUT/chat.json" "$TOKEN" 1 "$TRACE_SECONDS"
    if [ -n "${perf_pid:-}" ]; then wait "$perf_pid" || true; perf_pid=; fi
    t1=$(cpu_ns "$pid") q1=$(cpu_ns "$pid" req)
    printf '%s %s %s %s %s %s\n' "$r" "$name" "$(val "pair$r-$name" 1 p50_us)" "$(val "pair$r-$name" 1 requests)" \
      "$(( t1 - t0 ))" "$(( q1 - q0 ))" >>"$OUT/trace-pairs.txt"
  done
done

# Every tool call of the runs must have been allowed, and there must be one per measured turn.
turns=0
for c in 1 "$LOAD"; do
  turns=$(( turns + $(val gw-mock "$c" requests) + $(val gw-otel "$c" requests) + $(val gw-offline "$c" requests) ))
done
for r in $(seq 1 "$TRACE_ROUNDS"); do
  turns=$(( turns + $(val "pair$r-gw-mock" 1 requests) + $(val "pair$r-gw-otel" 1 requests) ))
done
# (pgbench's rows carry trace ids gwbench-N; the gateways' carry generated trace ids.)
audit=$(psql_su -d "$DB" -At -F '|' -c "SELECT count(*) FILTER (WHERE decision <> 'allow' OR tool <> 'vendor.list'),
                                                count(*) FILTER (WHERE trace_id NOT LIKE 'gwbench-%'), count(*)
                                         FROM ctxguard.audit_log WHERE id > $audit_before")
IFS='|' read -r audit_bad audit_gw audit_rows <<<"$audit"
[ "$audit_bad" = 0 ] || die "audit_log holds $audit_bad rows of the runs that are not vendor.list:allow"
[ "$audit_gw" -ge "$turns" ] || die "only $audit_gw gateway audit rows for $turns measured turns"
for a in "$GW_MOCK_ADDR" "$GW_OFF_ADDR" "$GW_OTEL_ADDR"; do
  bad=$(curl -s "http://$a/metrics" | awk '/^ctxguard_http_requests_total\{/ && !/status="200"/ {s += $2} END {print s + 0}')
  [ "$bad" = 0 ] || die "gateway $a answered $bad requests with a status other than 200"
done

# ------------------------------------------------------------------------------------------------
# 5. Report.
# ------------------------------------------------------------------------------------------------
ms() { awk -v u="$1" 'BEGIN {printf "%.3f", u / 1000}'; }
# db_row MODE C: "tps|p50|p95|p99|mean" (ms) of a pgbench run, percentiles by nearest rank from its log
db_row() {
  local tps mean
  tps=$(awk '/^tps = / {printf "%.0f", $3}' "$OUT/db-$1-c$2.txt")
  mean=$(awk '/^latency average = / {printf "%.3f", $4}' "$OUT/db-$1-c$2.txt")
  cat "$OUT/db-$1-c$2.log".* | awk '{print $3}' | sort -n | awk -v tps="$tps" -v mean="$mean" '
    {v[NR] = $1}
    END {
      printf "%s", tps
      split("0.50 0.95 0.99", q, " ")
      for (i = 1; i <= 3; i++) { r = int(q[i] * NR + 0.999999); if (r < 1) r = 1; printf "|%.3f", v[r] / 1000 }
      printf "|%s", mean
    }'
}
rps() { awk -v n="$(val "$1" "$2" requests)" -v d="$(val "$1" "$2" duration_us)" 'BEGIN {printf "%.0f", n / (d / 1e6)}'; }
# The backticks below are Markdown code spans, not command substitutions.
# shellcheck disable=SC2016
report() {
  local c label name p row
  printf '| scenario | connections | turns/s | p50 ms | p95 ms | p99 ms | mean ms | non-2xx / errors |\n'
  printf '|---|---:|---:|---:|---:|---:|---:|---:|\n'
  for c in 1 "$LOAD"; do
    local names="step1 step2 direct gw-mock gw-otel gw-offline db-prepared"
    [ "$c" = 1 ] && names="$names db-extended"
    for name in $names; do
      case $name in
        step1) label='mock direct: step 1 request (answers the tool call), req/s' ;;
        step2) label='mock direct: step 2 request (answers the text), req/s' ;;
        direct) label='**mock direct: one turn** (step 1 + step 2)' ;;
        gw-mock) label='**gateway, mock provider: one turn** (2 model calls, 1 tool call, 3 DB transactions)' ;;
        gw-otel) label='gateway, mock provider, **tracing on** (OTLP export to a loopback sink): one turn' ;;
        gw-offline) label='gateway, offline provider: one turn (no model I/O, 1 tool call, 3 DB transactions)' ;;
        db-prepared) label='the turn'"'"'s database work alone (pgbench `-M prepared`, `bench/gateway_turn_db.sql`)' ;;
        db-extended) label='the turn'"'"'s database work alone, parsed and planned each time (pgbench `-M extended`)' ;;
      esac
      if [ "${name#db-}" != "$name" ]; then
        IFS='|' read -r -a row <<<"$(db_row "${name#db-}" "$c")"
        printf '| %s | %s | %s | %s | %s | %s | %s | 0 |\n' "$label" "$c" "${row[@]}"
        continue
      fi
      if [ "$name" = direct ]; then
        # Sequential sum: p50 etc. of step 1 plus those of step 2; turns/s = 1 / (1/r1 + 1/r2).
        printf '| %s | %s | %s' "$label" "$c" \
          "$(awk -v a="$(rps step1 "$c")" -v b="$(rps step2 "$c")" 'BEGIN {printf "%.0f", 1 / (1 / a + 1 / b)}')"
        for p in p50_us p95_us p99_us mean_us; do
          printf ' | %s' "$(ms "$(awk -v a="$(val step1 "$c" "$p")" -v b="$(val step2 "$c" "$p")" 'BEGIN {print a + b}')")"
        done
        printf ' | 0 |\n'
        continue
      fi
      printf '| %s | %s | %s' "$label" "$c" "$(rps "$name" "$c")"
      for p in p50_us p95_us p99_us mean_us; do printf ' | %s' "$(ms "$(val "$name" "$c" "$p")")"; done
      printf ' | %s |\n' "$(val "$name" "$c" status)"
    done
  done
  local added added_load direct1 gw1 llm_turn
  direct1=$(( $(val step1 1 p50_us) + $(val step2 1 p50_us) ))
  gw1=$(val gw-mock 1 p50_us)
  added=$(( gw1 - direct1 ))
  added_load=$(( $(val gw-mock "$LOAD" p50_us) - $(val step1 "$LOAD" p50_us) - $(val step2 "$LOAD" p50_us) ))
  printf '\n**Added per turn at p50, 1 connection: %s ms** (gateway %s ms − direct %s ms; aim ≤ 2 ms: **%s**). ' \
    "$(ms "$added")" "$(ms "$gw1")" "$(ms "$direct1")" "$( [ "$added" -le 2000 ] && echo met || echo 'not met')"
  printf 'At p95 %s ms, p99 %s ms (differences of percentiles). With %s connections: %s ms at p50; throughput %s turns/s through the gateway against %s direct (%s), all with zero non-2xx responses and zero socket errors or timeouts.\n' \
    "$(ms "$(( $(val gw-mock 1 p95_us) - $(val step1 1 p95_us) - $(val step2 1 p95_us) ))")" \
    "$(ms "$(( $(val gw-mock 1 p99_us) - $(val step1 1 p99_us) - $(val step2 1 p99_us) ))")" \
    "$LOAD" "$(ms "$added_load")" "$(rps gw-mock "$LOAD")" \
    "$(awk -v a="$(rps step1 "$LOAD")" -v b="$(rps step2 "$LOAD")" 'BEGIN {printf "%.0f", 1 / (1 / a + 1 / b)}')" \
    "$(awk -v g="$(rps gw-mock "$LOAD")" -v a="$(rps step1 "$LOAD")" -v b="$(rps step2 "$LOAD")" 'BEGIN {printf "%.2f×", g * (1 / a + 1 / b)}')"
  local traced sink
  traced=$(( $(val gw-otel 1 p50_us) - gw1 ))
  read -r -a sink <<<"$(cat "$OUT/otlp-sink.txt" 2>/dev/null || echo 0 0)"
  printf '\nTracing on (OTLP export) in the single runs of the table, 1 connection, p50: %s ms (%s ms with, %s ms without; %s×; one pair of runs, not the aim'"'"'s measure: see the paired rounds below); with %s connections %s ms at p50 and %s against %s turns/s. The sink received %s export requests, %s bytes.\n' \
    "$(ms "$traced")" "$(ms "$(val gw-otel 1 p50_us)")" "$(ms "$gw1")" \
    "$(awk -v a="$(val gw-otel 1 p50_us)" -v b="$gw1" 'BEGIN {printf "%.3f", a / b}')" "$LOAD" \
    "$(ms "$(( $(val gw-otel "$LOAD" p50_us) - $(val gw-mock "$LOAD" p50_us) ))")" "$(rps gw-otel "$LOAD")" "$(rps gw-mock "$LOAD")" \
    "${sink[0]}" "${sink[1]}"
  # The paired rounds: per round p50 with and without, the difference, CPU ms per turn of each.
  printf '\n**Tracing on against off, paired at 1 connection** (%s rounds of %s s per gateway, alternating order; p50 ms and the gateway process'"'"'s CPU ms per turn, all threads):\n\n' \
    "$TRACE_ROUNDS" "$TRACE_SECONDS"
  awk '
    {p50[$1, $2] = $3 / 1000; cpu[$1, $2] = $5 / 1e6 / $4; req[$1, $2] = $6 / 1e6 / $4; if ($1 > n) n = $1}
    function median(a, k,   i, j, t) {
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) {t = a[i]; a[i] = a[j]; a[j] = t}
      return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    END {
      print "| round | p50 off | p50 on | on − off | CPU/turn off | CPU/turn on | on − off | of it, request threads |"
      print "|---:|---:|---:|---:|---:|---:|---:|---:|"
      for (r = 1; r <= n; r++) {
        d[r] = p50[r, "gw-otel"] - p50[r, "gw-mock"]; c[r] = cpu[r, "gw-otel"] - cpu[r, "gw-mock"]
        q[r] = req[r, "gw-otel"] - req[r, "gw-mock"]
        printf "| %d | %.3f | %.3f | %+.3f | %.3f | %.3f | %+.3f | %+.3f |\n", r, p50[r, "gw-mock"], p50[r, "gw-otel"], d[r],
          cpu[r, "gw-mock"], cpu[r, "gw-otel"], c[r], q[r]
      }
      md = median(d, n); mc = median(c, n); mq = median(q, n)
      printf "\n**Tracing on (OTLP export), added per turn at p50, 1 connection, median of the %d paired rounds: %+.3f ms** (aim ≤ 0.1 ms: **%s**); CPU per turn, median of the paired differences: %+.3f ms, of which %+.3f ms on the threads that serve requests (the rest is the exporter'"'"'s thread and its HTTP client).\n",
        n, md, (md <= 0.1 ? "met" : "not met"), mc, mq
    }' "$OUT/trace-pairs.txt"
  local dbp dbe
  dbp=$(db_row prepared 1 | cut -d'|' -f2)
  dbe=$(db_row extended 1 | cut -d'|' -f2)
  printf '\nAt 1 connection, p50: a turn through the offline gateway %s ms; the same database work from pgbench %s ms prepared, %s ms parsed and planned each time. Difference (HTTP in and out, JSON, the offline model, the pool, and the gateway'"'"'s extra round trips): %s ms against the prepared run, %s ms against the extended one.\n' \
    "$(ms "$(val gw-offline 1 p50_us)")" "$dbp" "$dbe" \
    "$(awk -v g="$(val gw-offline 1 p50_us)" -v d="$dbp" 'BEGIN {printf "%+.3f", g / 1000 - d}')" \
    "$(awk -v g="$(val gw-offline 1 p50_us)" -v d="$dbe" 'BEGIN {printf "%+.3f", g / 1000 - d}')"
  llm_turn=$(awk -v s0="$llm_sum0" -v s1="$llm_sum1" -v n0="$llm_n0" -v n1="$llm_n1" \
    'BEGIN {printf "%.3f", (s1 - s0) / (n1 - n0) * 2 * 1000}')
  printf '\nInside the gateway at 1 connection (its `ctxguard_llm_request_seconds`, mean): the two model calls take %s ms per turn as the gateway sees them (request built, sent, answer parsed), against a mean turn of %s ms.\n' \
    "$llm_turn" "$(ms "$(val gw-mock 1 mean_us)")"
  printf '\nThe turn'"'"'s database work alone at 1 client, per statement (pgbench `-M prepared -r`, mean ms; in a pipeline a statement'"'"'s time is its sending, and the wait for all answers is the pipeline'"'"'s end):'
  awk 'BEGIN {name[1] = "open_turn"; name[2] = "call_tool"; name[3] = "save_turn"}
       /^statement latencies/ {f = 1; next}
       f && $1 ~ /^[0-9.]+$/ && $3 != "\\set" && $3 != "\\startpipeline" {
         k = "?"
         if ($0 ~ /BEGIN;/) { k = "BEGIN"; t++; out = out sprintf("%s %s:", (t > 1 ? ";" : ""), name[t]) }
         else if ($0 ~ /COMMIT;/) k = "COMMIT"
         else if ($3 == "\\endpipeline") k = "the pipeline'"'"'s answers"
         else if ($0 ~ /synchronous_commit/) k = "`SET LOCAL synchronous_commit`"
         else if ($0 ~ /set_context/) k = "`set_context`"
         else if ($0 ~ /begin_generation/) k = "`begin_generation`"
         else if ($0 ~ /visible_tools/ || $0 ~ /pt\.description/) k = "`visible_tools`"
         else if ($0 ~ /page_types/) k = "page description"
         else if ($0 ~ /conversation_turns/) k = "history"
         else if ($0 ~ /call_tool/) k = "`call_tool`"
         else if ($0 ~ /save_turn/) k = "`save_turn`"
         out = out sprintf("%s %s %s", (k == "BEGIN" ? "" : ","), k, $1)
       }
       END {print out "."}' "$OUT/db-prepared-c1.txt"
  printf '\nRun: %s, commit %s, %s build, wrk %s s per run (`-c 1 -t 1` and `-c %s -t 2`, keep-alive, after a short warm-up), gateway pool %s connections, %s tools offered to the model (%s + %s request bytes), %s audit rows written by the gateway and pgbench runs (all `vendor.list` `allow`), load average before: %s.\n' \
    "$(date -u +%Y-%m-%dT%H:%MZ)" "$(bench_rev pg_ext gateway)" "$PROFILE" "$SECONDS_PER_RUN" "$LOAD" "$LOAD" "$n_offered" \
    "$step1_bytes" "$step2_bytes" "$audit_rows" "$load_before"
  bench_machine "$(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)" "wrk, the mock, the gateways and PostgreSQL share the cores"
}

bench_report report
