#!/usr/bin/env bash
# Tokens of the tool list an MCP client receives on each demo page vs the full catalog
# (o200k_base, a real tokenizer), with a 200-tool catalog across 10 namespaces on top of the demo.
#   bench/mcp_tokens.sh            print the table
#   bench/mcp_tokens.sh --write    also rewrite the results block in BENCHMARKS.md
BENCH_NAME=mcp_tokens
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
cd "$ROOT"

bench_cluster
DB=ctxguard_mcp_tokens
create_demo_db "$DB"
psql_su -d "$DB" -o /dev/null -f bench/mcp_catalog.sql
VENV=${CTXGUARD_VENV:-$HOME/.cache/ctxguard/venv}
"$VENV/bin/python" -c 'import mcp' 2>/dev/null || { /usr/bin/python3 -m venv "$VENV"; "$VENV/bin/pip" install -q -r tests/mcp/requirements.txt; }
cargo build --locked --release -p ctxguard-gateway -p ctxguard-tests --bin ctxguard-gateway --bin count_tokens >/dev/null

WORK=$(mktemp -d)
GW_PORT=${BENCH_GATEWAY_PORT:-31910}  # below the ephemeral port range
CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" CTXGUARD_LISTEN="127.0.0.1:$GW_PORT" \
  "$CARGO_TARGET_DIR/release/ctxguard-gateway" >"$WORK/gateway.log" 2>&1 &
GW_PID=$!
trap 'kill $GW_PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$GW_PORT/ready" >/dev/null && break; sleep 0.2; done

# The full catalog in the same MCP tool shape the gateway lists (every tool, as if unfiltered).
psql_su -d "$DB" -qAt -o "$WORK/full.json" -c "
  SELECT jsonb_build_object('tools', jsonb_agg(jsonb_build_object(
           'name', replace(t.name, '.', '__'), 'description', t.description, 'inputSchema', t.input_schema,
           'annotations', jsonb_build_object('title', t.name, 'readOnlyHint', coalesce(p.read_only, true),
                                             'destructiveHint', coalesce(p.danger = 'destructive', false))) ORDER BY t.name))
    FROM ctxguard.tools t LEFT JOIN ctxguard.tool_policies p ON p.tool = t.name"
ALICE=$(mint --sub alice --tenant acme --roles ap_clerk)
pages=(
  'vendor_table|{"pageType":"vendor_table"}'
  'invoice_table|{"pageType":"invoice_table","pageState":{"tab":"open"}}'
  'invoice_detail|{"pageType":"invoice_detail","entity":{"type":"invoice","id":"acme_inv3"}}'
  'document_viewer|{"pageType":"document_viewer","entity":{"type":"document","id":"acme_guide"}}'
  'matter_overview|{"pageType":"matter_overview","entity":{"type":"matter","id":"25e70284-6124-4a2b-9c89-abc123def456"}}'
)
for p in "${pages[@]}"; do
  "$VENV/bin/python" bench/mcp_list.py "http://127.0.0.1:$GW_PORT" "$ALICE" "${p#*|}" >"$WORK/${p%%|*}.json" 2>>"$WORK/client.log"
done
count() { "$CARGO_TARGET_DIR/release/count_tokens" "$1" | cut -f1; }
ntools() { /usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["tools"]))' "$1"; }
FULL_TOK=$(count "$WORK/full.json") FULL_N=$(ntools "$WORK/full.json")
OUT=$WORK/results.md
{
  echo "Run $(date -u +%Y-%m-%d): catalog of $FULL_N tools ($((FULL_N - 200)) demo and document tools + 200 synthetic ones in 10 namespaces); user alice (acme, ap_clerk); tokenizer o200k_base (tiktoken-rs)."
  echo
  echo "| page | tools listed | tokens | share of the full list's tokens |"
  echo "|---|---:|---:|---:|"
  echo "| full catalog (no filtering) | $FULL_N | $FULL_TOK | 100% |"
  for p in "${pages[@]}"; do
    f=$WORK/${p%%|*}.json
    tok=$(count "$f")
    echo "| \`${p%%|*}\` | $(ntools "$f") | $tok | $(awk -v a="$tok" -v b="$FULL_TOK" 'BEGIN {printf "%.1f%%", 100 * a / b}') |"
  done
} >"$OUT"
cat "$OUT"
[ "$WRITE" = 1 ] && bench_write_results "$OUT"
exit 0
