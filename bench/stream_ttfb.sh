#!/usr/bin/env bash
# Time to the first answer byte with streaming, against the whole answer (issue 32): a fake
# OpenAI-compatible provider streams a 60-word answer, one word every 20 ms (bench/stream_ttfb.py);
# the gateway streams it to the client as `answer_delta` events. Measured per turn: the first
# `answer_delta` at the client after the provider sent its first delta (the gateway's overhead:
# request, cleaning, event), the time to the first delta from the request, and the time to the
# whole answer (a non-streaming client, today's behaviour). Aim: first byte within 5 ms of the
# provider's first delta.
#
#   bench/stream_ttfb.sh            # build, set up, measure, print a table
#   bench/stream_ttfb.sh --write    # ... and rewrite the stream_ttfb results block of BENCHMARKS.md
#
# Environment: BENCH_TURNS (default 20), BENCH_PORT (first of two loopback ports: provider,
# gateway; default 18396), BENCH_RUN / BENCH_PGPORT (cluster, as bench/lib.sh), CTXGUARD_PROFILE.
set -euo pipefail

BENCH_NAME=stream_ttfb
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DB=ctxguard_streambench
TURNS=${BENCH_TURNS:-20}
WORDS=60
INTERVAL_MS=20
PORT=${BENCH_PORT:-18396}
bench_args "$@"
require_free_ports "$PORT" "$((PORT + 1))"

OUT=$(bench_out)
bench_cluster
log "building the gateway ($PROFILE)"
(cd "$ROOT" && cargo build --locked -p ctxguard-gateway $([ "$PROFILE" = release ] && echo --release))
create_demo_db "$DB"
TOKEN=$(mint --sub alice --tenant acme --roles ap_clerk --ttl 7200)
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
CTXGUARD_LISTEN="127.0.0.1:$((PORT + 1))" CTXGUARD_PROVIDER=openai \
CTXGUARD_LLM_BASE_URL="http://127.0.0.1:$PORT/v1" \
  "$CARGO_TARGET_DIR/$PROFILE/ctxguard-gateway" >"$OUT/gateway.log" 2>&1 &
GW_PID=$!
trap 'kill $GW_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((PORT + 1))/ready" >/dev/null && break; sleep 0.1; done
log "$TURNS turns streamed and $TURNS whole"
python3 "$BENCH_DIR/stream_ttfb.py" "$PORT" "$((PORT + 1))" "$TOKEN" "$TURNS" "$WORDS" "$INTERVAL_MS" \
  >"$OUT/turns.jsonl"

report() {
  python3 - "$OUT/turns.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
s = [r for r in rows if r["mode"] == "streamed"]; w = [r for r in rows if r["mode"] == "whole"]
after = [r["after_provider_ms"] for r in s]; ttfb = [r["ttfb_ms"] for r in s]
whole = [r["whole_ms"] for r in w]; swhole = [r["whole_ms"] for r in s]
print("| measure | p50 ms | p90 ms |")
print("| --- | ---: | ---: |")
for name, xs in [("first `answer_delta` after the provider's first delta (gateway overhead)", after),
                 ("first `answer_delta` after the request (streamed)", ttfb),
                 ("whole answer, streamed (`done`)", swhole),
                 ("whole answer, not streamed (today's behaviour)", whole)]:
    print(f"| {name} | {pct(xs, 50):.1f} | {pct(xs, 90):.1f} |")
print(f"\nFirst byte / whole answer (p50): {statistics.median(ttfb) / statistics.median(whole):.3f}.")
PY
  bench_machine "python3 http.client, $TURNS turns each, provider: $WORDS words $INTERVAL_MS ms apart" \
    "gateway $PROFILE build, commit $(bench_rev gateway)"
}
bench_report report
