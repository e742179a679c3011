#!/usr/bin/env bash
# Stop the local cluster started by scripts/demo.sh or scripts/test.sh.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [ -f "$RUN/gateway.pid" ]; then kill "$(cat "$RUN/gateway.pid")" 2>/dev/null || true; rm -f "$RUN/gateway.pid"; fi
stop_cluster
