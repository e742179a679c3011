#!/usr/bin/env bash
# Stop the local cluster started by scripts/demo.sh or scripts/test.sh, and the demo's gateway and
# Demo Notes server.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
for pidfile in "$RUN/gateway.pid" "$RUN/demo-upstream.pid"; do
  if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
done
stop_cluster
