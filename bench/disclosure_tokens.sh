#!/usr/bin/env bash
# Tokens of the tool definitions an MCP client (and, built by the same code, our model loop) is given
# per page, full list against the compact list of issue 31 (CTXGUARD_TOOL_BUDGET, default 30 tools):
# the 1,000-tool bench catalog (bench/setup.sql) on the demo, plus two upstream MCP servers of 100
# tools each (bench/upstream_catalog.py, discovered by the gateway, on every page). Counted with
# o200k_base (tiktoken-rs, tests/src/bin/count_tokens.rs), the tokenizer bench/mcp_tokens.sh uses.
# Fails on any error: a gateway that never becomes ready, a failed client, a full list that is not
# Gate A's, or a compact list holding a tool Gate A does not show.
#   bench/disclosure_tokens.sh            print the table
#   bench/disclosure_tokens.sh --write    also rewrite the results block in BENCHMARKS.md
BENCH_NAME=disclosure_tokens
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_args "$@"
cd "$ROOT"

bench_cluster
DB=ctxguard_disclosure_tokens
create_demo_db "$DB"
psql_su -d "$DB" -o /dev/null -f bench/setup.sql
if [ "$(id -u)" = 0 ]; then VENV=${CTXGUARD_VENV:-/var/cache/ctxguard/mcp-venv}
else VENV=${CTXGUARD_VENV:-$HOME/.cache/ctxguard/venv}; fi
"$VENV/bin/python" -c 'import mcp' 2>/dev/null || { /usr/bin/python3 -m venv "$VENV"; "$VENV/bin/pip" install -q -r tests/mcp/requirements.txt; }
# Token counts do not depend on the build: BENCH_BUILD=debug reuses a debug build.
BUILD=${BENCH_BUILD:-release}
cargo build --locked $([ "$BUILD" = release ] && echo --release) -p ctxguard-gateway -p ctxguard-tests --bin ctxguard-gateway --bin count_tokens >/dev/null

WORK=$(mktemp -d)
BASE=${BENCH_GATEWAY_PORT:-32410}  # below the ephemeral port range: 2 gateways, 2 upstream servers
FULL_PORT=$BASE COMPACT_PORT=$((BASE + 1)) GH_PORT=$((BASE + 2)) DRIVE_PORT=$((BASE + 3))
require_free_ports "$FULL_PORT" "$COMPACT_PORT" "$GH_PORT" "$DRIVE_PORT"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$WORK"' EXIT
"$VENV/bin/python" bench/upstream_catalog.py "$GH_PORT" github >"$WORK/github.log" 2>&1 & PIDS+=($!)
"$VENV/bin/python" bench/upstream_catalog.py "$DRIVE_PORT" drive >"$WORK/drive.log" 2>&1 & PIDS+=($!)
for port in "$GH_PORT" "$DRIVE_PORT"; do
  for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
done
psql_su -d "$DB" -o /dev/null <<SQL
INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access, max_tools) VALUES
  ('github', 'http', 'http://127.0.0.1:$GH_PORT/mcp', 'Code hosting: issues, pull requests, branches, releases, workflows.', 'allow', 200),
  ('drive', 'http', 'http://127.0.0.1:$DRIVE_PORT/mcp', 'Files and folders of the company drive, with sharing.', 'allow', 200);
SELECT ctxguard.set_server_policy('github', '{"page_types": "*", "read_only": true}');
SELECT ctxguard.set_server_policy('drive', '{"page_types": "*", "read_only": true}');
SQL

start_gateway() {  # PORT BUDGET LOG [discovery]
  local extra=()
  [ "${4:-}" = discover ] && extra=(--discovery-database-url "host=$RUN port=$PGPORT user=ctxguard_discovery dbname=$DB")
  CTXGUARD_DATABASE_URL="host=$RUN port=$PGPORT user=ctxguard_gateway dbname=$DB" CTXGUARD_LISTEN="127.0.0.1:$1" \
  CTXGUARD_TOOL_BUDGET="$2" CTXGUARD_MCP_DISCOVER=$([ "${4:-}" = discover ] && echo true || echo false) \
    "$CARGO_TARGET_DIR/$BUILD/ctxguard-gateway" "${extra[@]}" >"$3" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$1/ready" >/dev/null && return 0; sleep 0.1; done
  cat "$3" >&2; die "the gateway on :$1 never became ready"
}
# The full list: a budget no page reaches (today's MCP list); it also records the upstream tools.
start_gateway "$FULL_PORT" 10000 "$WORK/full.log" discover
for _ in $(seq 300); do grep -q "upstream MCP discovery done" "$WORK/full.log" && break; sleep 0.1; done
n_up=$(psql_su -d "$DB" -qAt -c "SELECT count(*) FROM ctxguard.tools WHERE name LIKE 'github.%' OR name LIKE 'drive.%'")
[ "$n_up" = 200 ] || { cat "$WORK/full.log" >&2; die "discovery recorded $n_up upstream tools, not 200"; }
start_gateway "$COMPACT_PORT" "${CTXGUARD_TOOL_BUDGET:-30}" "$WORK/compact.log"

ALICE=$(mint --sub alice --tenant acme --roles ap_clerk)
pages=(
  'vendor_table|{"pageType":"vendor_table"}'
  'invoice_table|{"pageType":"invoice_table","pageState":{"tab":"open"}}'
  'invoice_detail|{"pageType":"invoice_detail","entity":{"type":"invoice","id":"acme_inv3"}}'
  'document_viewer|{"pageType":"document_viewer","entity":{"type":"document","id":"acme_guide"}}'
  'customer_table|{"pageType":"customer_table"}'
  'ticket_table|{"pageType":"ticket_table"}'
)
names_of() { /usr/bin/python3 -c 'import json,sys; print("\n".join(sorted(t["name"] for t in json.load(open(sys.argv[1]))["tools"])))' "$1"; }
ntools() { /usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["tools"]))' "$1"; }
count() {
  local n
  n=$("$CARGO_TARGET_DIR/$BUILD/count_tokens" "$1" | cut -f1)
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] || die "count_tokens gave '$n' for $1"
  echo "$n"
}
OUT=$WORK/results.md
{
  echo "Run $(date -u +%Y-%m-%d) (commit $(git rev-parse --short HEAD)) on $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores: the bench catalog (bench/setup.sql: the demo's tools + 1,000) and two upstream MCP servers of 100 tools each on every page (bench/upstream_catalog.py); user alice (acme, ap_clerk); MCP \`tools/list\` as the official Python SDK receives it (the model loop's list is built by the same \`compact::offer\`); budget \`${CTXGUARD_TOOL_BUDGET:-30}\`; tokenizer o200k_base. The full list is checked by name against Gate A; the compact list holds only Gate A's tools and \`find_tools\`."
  echo
  echo "| page | visible tools | full list tokens | compact list (tools + find_tools) | compact tokens | compact / full |"
  echo "|---|---:|---:|---:|---:|---:|"
} >"$OUT"
for p in "${pages[@]}"; do
  name=${p%%|*} page=${p#*|}
  for kind in full compact; do
    port=$FULL_PORT; [ "$kind" = compact ] && port=$COMPACT_PORT
    "$VENV/bin/python" bench/mcp_list.py "http://127.0.0.1:$port" "$ALICE" "$page" >"$WORK/$name.$kind.json" 2>>"$WORK/client.log" \
      || { cat "$WORK/client.log" >&2; die "MCP client failed on $name ($kind)"; }
    names_of "$WORK/$name.$kind.json" | LC_ALL=C sort >"$WORK/$name.$kind.names"
  done
  psql -X -q -v ON_ERROR_STOP=1 -h "$RUN" -p "$PGPORT" -U ctxguard_gateway -d "$DB" -At -v tok="$ALICE" -v page="$page" \
    -o "$WORK/$name.expected" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'tok', :'page') \g /dev/null
SELECT replace(name, '.', '__') FROM ctxguard.visible_tools() ORDER BY 1;
COMMIT;
SQL
  LC_ALL=C sort "$WORK/$name.expected" -o "$WORK/$name.expected"
  cmp -s "$WORK/$name.expected" "$WORK/$name.full.names" || { diff "$WORK/$name.expected" "$WORK/$name.full.names" >&2 || true; die "$name: the full list is not Gate A's"; }
  extra=$(LC_ALL=C comm -13 "$WORK/$name.expected" "$WORK/$name.compact.names" | grep -vx find_tools || true)
  [ -z "$extra" ] || die "$name: the compact list holds tools Gate A does not show: $extra"
  n=$(ntools "$WORK/$name.full.json")
  full=$(count "$WORK/$name.full.json") compact=$(count "$WORK/$name.compact.json")
  echo "| \`$name\` | $n | $full | $(ntools "$WORK/$name.compact.json") | $compact | $(awk -v a="$compact" -v b="$full" 'BEGIN {printf "%.1f%%", 100 * a / b}') |" >>"$OUT"
done
# The gateway's estimate (4 bytes a token, +48 bytes a definition) against o200k_base, per page.
{
  echo
  echo "The budget's token estimate against o200k_base (\`POST /v1/tools\`' \`budget.estimatedTokens\` / the full list's tokens):"
  for p in "${pages[@]}"; do
    name=${p%%|*} page=${p#*|}
    est=$(curl -sf "http://127.0.0.1:$COMPACT_PORT/v1/tools" -H "Authorization: Bearer $ALICE" -H 'content-type: application/json' \
      -d "{\"pageContext\": $page}" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["budget"]["estimatedTokens"])')
    printf '`%s` %s/%s; ' "$name" "$est" "$(count "$WORK/$name.full.json")"
  done
  echo
} >>"$OUT"
cat "$OUT"
[ "$WRITE" = 1 ] && bench_write_results "$OUT"
exit 0
