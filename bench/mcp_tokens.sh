#!/usr/bin/env bash
# Tokens of the tool list an MCP client receives on each demo page vs the full catalog
# (o200k_base, a real tokenizer), with a 200-tool catalog across 10 namespaces on top of the demo,
# spread over the pages visited (bench/mcp_catalog.sql). Fails on any error: a gateway that never
# becomes ready, a failed client, or a page whose tool list is not the one the database's Gate A
# gives (checked by name before any token is counted).
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
ready=0
for _ in $(seq 100); do
  if curl -sf "http://127.0.0.1:$GW_PORT/ready" >/dev/null; then ready=1; break; fi
  kill -0 "$GW_PID" 2>/dev/null || break
  sleep 0.2
done
[ "$ready" = 1 ] || { cat "$WORK/gateway.log" >&2; echo "the gateway never became ready" >&2; exit 1; }

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
# Each page's list, checked against the database's Gate A for alice on that page (names in MCP form)
# before anything is counted: a failed client, an empty list or a wrong one stops the benchmark.
names_of() { /usr/bin/python3 -c 'import json,sys; print("\n".join(sorted(t["name"] for t in json.load(open(sys.argv[1]))["tools"])))' "$1"; }
for p in "${pages[@]}"; do
  name=${p%%|*} page=${p#*|}
  "$VENV/bin/python" bench/mcp_list.py "http://127.0.0.1:$GW_PORT" "$ALICE" "$page" >"$WORK/$name.json" 2>>"$WORK/client.log" \
    || { cat "$WORK/client.log" >&2; echo "MCP client failed on $name" >&2; exit 1; }
  psql -X -q -v ON_ERROR_STOP=1 -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$DB" -At -v tok="$ALICE" -v page="$page" \
    -o "$WORK/$name.expected" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'tok', :'page') \g /dev/null
SELECT replace(name, '.', '__') FROM ctxguard.visible_tools() ORDER BY 1;
COMMIT;
SQL
  LC_ALL=C sort "$WORK/$name.expected" -o "$WORK/$name.expected"
  names_of "$WORK/$name.json" | LC_ALL=C sort >"$WORK/$name.names"
  [ -s "$WORK/$name.expected" ] || { echo "$name: Gate A lists no tool" >&2; exit 1; }
  if ! cmp -s "$WORK/$name.expected" "$WORK/$name.names"; then
    diff "$WORK/$name.expected" "$WORK/$name.names" >&2 || true
    echo "$name: the MCP tool list is not Gate A's" >&2; exit 1
  fi
  n_syn=$(grep -cE '^(crm|hr|billing|inventory|support|analytics|legal|marketing|shipping|admin)__' "$WORK/$name.names" || true)
  [ "$n_syn" -gt 10 ] || { echo "$name: only $n_syn synthetic tools: the catalog does not bear on this page" >&2; exit 1; }
done
count() {
  local n
  n=$("$CARGO_TARGET_DIR/release/count_tokens" "$1" | cut -f1)
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] || { echo "count_tokens gave '$n' for $1" >&2; exit 1; }
  echo "$n"
}
ntools() { /usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["tools"]))' "$1"; }
FULL_TOK=$(count "$WORK/full.json")
FULL_N=$(ntools "$WORK/full.json")
OUT=$WORK/results.md
{
  echo "Run $(date -u +%Y-%m-%d) (commit $(git rev-parse --short HEAD)): catalog of $FULL_N tools ($((FULL_N - 200)) demo and document tools + 200 synthetic ones in 10 namespaces, each on one of the five pages below or, one per namespace, on every page); user alice (acme, ap_clerk); tokenizer o200k_base (tiktoken-rs). Each page's list was checked by name against Gate A before counting."
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
