#!/usr/bin/env bash
# Soak (issue 20, SECURITY_MATRIX G.47): two gateways behind pgbouncer (transaction mode) for a bounded
# time, mixed traffic (tool calls, chat turns with the offline provider, MCP tools/list and tools/call on
# sessions opened through one gateway and used through both), loopback only. Reports throughput,
# p50/p99 per kind, errors, and the resident memory (RSS) of each gateway, pgbouncer and the
# postmaster at start (after a warm-up) and at the end. Not run by CI.
#
#   bench/soak.sh                 # SOAK_SECONDS=120 SOAK_WORKERS=16
#
# Environment: SOAK_SECONDS (default 120), SOAK_WORKERS (16), SOAK_PORT (first of two gateway ports,
# default 18491), CTXGUARD_RUN / CTXGUARD_PGPORT / CTXGUARD_PGBOUNCER_PORT (scripts/lib.sh's cluster and
# pgbouncer, restarted here), PGBOUNCER_POOL_SIZE (server connections, default 4 here),
# SOAK_SKIP_BUILD=1 (use the release binaries and the installed extension as they are).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
cd "$ROOT"

SECS=${SOAK_SECONDS:-120}
WORKERS=${SOAK_WORKERS:-16}
PORT=${SOAK_PORT:-18491}
export PGBOUNCER_POOL_SIZE=${PGBOUNCER_POOL_SIZE:-4}
require_free_ports "$PORT" "$((PORT + 1))"

if [ "${SOAK_SKIP_BUILD:-}" != 1 ]; then
  log "building (release): the gateway and the load generator"
  cargo build --locked --release -p ctxguard-gateway -p ctxguard-tests --bin ctxguard-gateway --bin soak
  install_extension
fi
start_cluster
DB=ctxguard_soak
create_demo_db "$DB"
# Per-generation budgets big enough for a worker's reused generation, and short generation lifetimes
# so that the chat turns' generations leave the ledger's slots within the run.
psql_su -d "$DB" -o /dev/null -c "INSERT INTO ctxguard.tenant_limits (tenant_id, max_bytes_per_generation, generation_ttl)
  VALUES ('acme', 1000000000, 60), ('globex', 1000000000, 60)"
start_pgbouncer

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; stop_pgbouncer; }
trap cleanup EXIT
gateway_user
for i in 0 1; do
  env CTXGUARD_DATABASE_URL="host=127.0.0.1 port=$PGBOUNCER_PORT user=ctxguard_gateway dbname=$DB" \
      CTXGUARD_NOTIFY_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" \
      CTXGUARD_LISTEN="127.0.0.1:$((PORT + i))" CTXGUARD_MCP_DISCOVER=false CTXGUARD_POOL_SIZE=8 \
      CTXGUARD_HTTP_MAX_STREAMS_PER_USER=10000 RUST_LOG=warn \
      "${GW_AS[@]}" "$CARGO_TARGET_DIR/release/ctxguard-gateway" >"$RUN/soak-gw$i.log" 2>&1 &
  PIDS+=($!)
done
for i in 0 1; do
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$((PORT + i))") 2>/dev/null && break; sleep 0.1; done
done
GW_PIDS=("${PIDS[@]}")

rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
snapshot() {
  echo "gateway-a $(rss "${GW_PIDS[0]}")"
  echo "gateway-b $(rss "${GW_PIDS[1]}")"
  echo "pgbouncer $(rss "$(cat "$PGB_DIR/pgbouncer.pid")")"
  echo "postmaster $(rss "$(head -1 "$PGDATA_DIR/postmaster.pid")")"
  # Every backend of the soak database, summed (shared buffers count once per backend: an upper bound).
  local sum=0 p
  for p in $(psql_su -d postgres -At -c "SELECT pid FROM pg_stat_activity WHERE datname = '$DB'"); do
    sum=$((sum + $(rss "$p")))
  done
  echo "backends $sum"
}

export SOAK_TOKENS="$(mint --sub soak-a --tenant acme --roles ap_clerk),$(mint --sub soak-g --tenant globex --roles ap_clerk)"
GWS="127.0.0.1:$PORT,127.0.0.1:$((PORT + 1))"
log "warm-up (10 s)"
"$CARGO_TARGET_DIR/release/soak" --gateways "$GWS" --seconds 10 --workers "$WORKERS" >/dev/null
snapshot >"$RUN/soak-rss-start"
log "soak: $SECS s, $WORKERS workers, two gateways, pgbouncer pool $PGBOUNCER_POOL_SIZE"
# Resident memory a quarter, half and three quarters into the run too: a slope, or a plateau.
( for q in 1 2 3; do sleep "$(awk -v s="$SECS" 'BEGIN {print s / 4}')"; snapshot >"$RUN/soak-rss-q$q"; done ) &
QUARTERS=$!
"$CARGO_TARGET_DIR/release/soak" --gateways "$GWS" --seconds "$SECS" --workers "$WORKERS" | tee "$RUN/soak.json"
snapshot >"$RUN/soak-rss-end"
wait "$QUARTERS" 2>/dev/null || true
echo
echo "RSS (KiB)     start       1/4       1/2       3/4       end"
join "$RUN/soak-rss-start" "$RUN/soak-rss-q1" | join - "$RUN/soak-rss-q2" | join - "$RUN/soak-rss-q3" |
  join - "$RUN/soak-rss-end" | awk '{printf "%-12s %9d %9d %9d %9d %9d\n", $1, $2, $3, $4, $5, $6}'
echo "audit rows of the soak: $(psql_su -d "$DB" -At -c "SELECT count(*) FROM ctxguard.audit_log WHERE user_id IN ('soak-a', 'soak-g')")"
echo "cross-tenant audit rows: $(psql_su -d "$DB" -At -c "SELECT count(*) FROM ctxguard.audit_log WHERE (user_id = 'soak-a' AND tenant_id <> 'acme') OR (user_id = 'soak-g' AND tenant_id <> 'globex')")"
