#!/usr/bin/env bash
# Stop the local cluster started by scripts/demo.sh or scripts/test.sh.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
stop_cluster
