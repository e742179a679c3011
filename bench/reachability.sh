#!/usr/bin/env bash
# Reachability (issue 31): for each request of bench/reachability_requests.jsonl (text, page, the
# tool it needs), is the tool offered at once (today's cut: visible_tools(message, 24)), or found
# in tool search's top 5, lexical only and with the semantic ranker (cosine first, lexical tie-break)? Over the catalog of
# bench/reachability_catalog.py (1,000 DBA tools over 100 page types, two upstream servers of 100).
#
#   bench/reachability.sh            # print the table
#   bench/reachability.sh --write    # ... and rewrite the reachability block of BENCHMARKS.md
#
# The lexical scores come from PostgreSQL itself: a throwaway cluster (initdb in a temporary
# directory, BENCH_REACH_PGPORT, default 25398; no extension needed) computes, for every request
# and visible tool, ts_rank(search, to_tsquery('english', words)) with `search` defined as
# ctxguard.tools.search and the words joined as gates.rs's or_query does: what visible_tools ranks
# by. (When ctxguard.find_tools is on main, its lexical order can be read instead.) The ranking
# (tiers, per-server caps, fusion) runs in gateway/examples/reachability.rs with the gateway's
# own code (a debug build: the encoder crate is optimized in it, see Cargo.toml), the semantic
# ranker with the offline model (scripts/embed_model.sh installs it).
# Checks mechanically that at least half of the requests are paraphrases: no word shared with the
# tool's name or description (PostgreSQL's English stop words aside) and no lexeme (ts_rank 0).
set -euo pipefail
BENCH_NAME=reachability
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/lib.sh"
die() { printf "reachability: %s\n" "$*" >&2; exit 1; }
WRITE=0
case "${1:-}" in --write) WRITE=1 ;; "") ;; *) echo "usage: $0 [--write]" >&2; exit 2 ;; esac
PORT=${BENCH_REACH_PGPORT:-25398}
MODEL_DIR=${CTXGUARD_EMBED_MODEL_DIR:-$("$ROOT/scripts/embed_model.sh" --print-dir)}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/ctxguard-reachability.XXXXXX")
chmod 755 "$OUT"
mkdir -m 700 "$OUT/pg" "$OUT/sock"
[ "$(id -u)" != 0 ] || chown postgres "$OUT/pg" "$OUT/sock"

python3 "$ROOT/bench/reachability_catalog.py" >"$OUT/catalog.json"

log "throwaway cluster on port $PORT ($OUT/pg)"
as_pg "$PG_BIN/initdb" -D "$OUT/pg" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
as_pg "$PG_BIN/pg_ctl" -D "$OUT/pg" -l "$OUT/sock/pg.log" -w -o "-p $PORT -k $OUT/sock -c listen_addresses=''" start >/dev/null
trap 'as_pg "$PG_BIN/pg_ctl" -D "$OUT/pg" -m fast -w stop >/dev/null 2>&1 || true' EXIT

# Tools, pages and requests as rows (or_query as gates.rs builds it: [a-z0-9] words of 2-32
# characters, lowercased, each once, at most 16, joined by |).
python3 - "$OUT" "$ROOT/bench/reachability_requests.jsonl" <<'PY'
import json, re, sys
out, reqs = sys.argv[1], sys.argv[2]
cat = json.load(open(f"{out}/catalog.json"))
def or_query(text):
    words = []
    for w in re.split(r"[^A-Za-z0-9]", text):
        w = w.lower()
        if 2 <= len(w) <= 32 and w not in words and len(words) < 16:
            words.append(w)
    return " | ".join(words)
with open(f"{out}/tools.tsv", "w") as f:
    for t in cat["tools"]:
        f.write(f"{t['name']}\t{t['description']}\n")
with open(f"{out}/requests.tsv", "w") as f, open(f"{out}/pairs.tsv", "w") as p:
    for i, line in enumerate(open(reqs)):
        r = json.loads(line)
        f.write(f"{i}\t{r['tool']}\t{or_query(r['text'])}\t{r['text']}\n")
        for name in cat["pages"][r["page_type"]]["tools"]:
            p.write(f"{i}\t{name}\n")
PY
psql -X -q -v ON_ERROR_STOP=1 -h "$OUT/sock" -p "$PORT" -U postgres -d postgres <<SQL
CREATE TABLE tools (name text PRIMARY KEY, description text NOT NULL,
    search tsvector GENERATED ALWAYS AS
        (to_tsvector('english'::regconfig, translate(name, '._-', '   ') || ' ' || description)) STORED);
CREATE TABLE requests (i int PRIMARY KEY, tool text, words text, body text);
CREATE TABLE pairs (i int, tool text);
\copy tools (name, description) FROM '$OUT/tools.tsv'
\copy requests FROM '$OUT/requests.tsv'
\copy pairs FROM '$OUT/pairs.tsv'
\copy (SELECT p.i, p.tool, ts_rank(t.search, to_tsquery('english'::regconfig, r.words)) FROM pairs p JOIN requests r USING (i) JOIN tools t ON t.name = p.tool WHERE r.words <> '' ORDER BY 1, 2) TO '$OUT/lexical.tsv'
\copy (SELECT r.i, t.search @@ to_tsquery('english'::regconfig, r.words) FROM requests r JOIN tools t ON t.name = r.tool WHERE r.words <> '') TO '$OUT/lexeme_shared.tsv'
SQL

# Mark paraphrases and check that they are at least half.
python3 - "$OUT" "$ROOT/bench/reachability_requests.jsonl" "$PG_BIN" <<'PY'
import json, re, subprocess, sys
out, reqs, pg_bin = sys.argv[1:4]
share = subprocess.run([f"{pg_bin}/pg_config", "--sharedir"], capture_output=True, text=True).stdout.strip()
stop = set(open(f"{share}/tsearch_data/english.stop").read().split())
cat = {t["name"]: t for t in json.load(open(f"{out}/catalog.json"))["tools"]}
shared = {}
for line in open(f"{out}/lexeme_shared.tsv"):
    i, s = line.split("\t")
    shared[int(i)] = s.strip() == "t"
words = lambda s: {w for w in re.split(r"[^a-z0-9]+", s.lower()) if w and w not in stop}
n = para = 0
with open(f"{out}/requests.jsonl", "w") as f:
    for i, line in enumerate(open(reqs)):
        r = json.loads(line)
        t = cat[r["tool"]]
        tool_words = words(t["name"].replace(".", " ").replace("_", " ") + " " + t["description"])
        r["paraphrase"] = not (words(r["text"]) & tool_words) and not shared.get(i, False)
        n += 1
        para += r["paraphrase"]
        f.write(json.dumps(r) + "\n")
print(f"{n} requests, {para} paraphrases", file=sys.stderr)
if n < 200 or 2 * para < n:
    sys.exit(f"reachability: need at least 200 requests, half of them paraphrases ({n}, {para})")
PY

args=("$OUT/catalog.json" "$OUT/requests.jsonl" "$OUT/lexical.tsv")
if [ -f "$MODEL_DIR/model.safetensors" ]; then args+=("$MODEL_DIR")
else log "no embedding model in $MODEL_DIR (scripts/embed_model.sh): lexical figures only"; fi
(cd "$ROOT" && nice cargo run -q --locked -p ctxguard-gateway --example reachability -- "${args[@]}") \
  >"$OUT/table.md" 2>"$OUT/ranker.log"
cat "$OUT/ranker.log" >&2

{
  echo "Requests: $(wc -l <"$ROOT/bench/reachability_requests.jsonl") ($(grep -c '"paraphrase": true' "$OUT/requests.jsonl") paraphrases sharing no word with the tool's name or description); catalog: bench/reachability_catalog.py (1,000 DBA tools, 100 page types, upstream servers chat and drive of 100 tools each; 154-256 tools visible per page)."
  echo
  cat "$OUT/table.md"
  echo
  echo "Measured at $(cd "$ROOT" && git rev-parse --short HEAD) on $(nproc) cores ($(lscpu | awk -F': *' '/^Model name/ {print $2; exit}')); $(grep -m1 'per request' "$OUT/ranker.log" || true)"
} >"$OUT/results.md"
cat "$OUT/results.md"
if [ "$WRITE" = 1 ]; then
  md=$ROOT/BENCHMARKS.md
  grep -q "^<!-- $BENCH_NAME:begin -->\$" "$md" || die "$md lacks the <!-- $BENCH_NAME:begin/end --> markers"
  awk -v res="$OUT/results.md" -v begin="<!-- $BENCH_NAME:begin -->" -v end="<!-- $BENCH_NAME:end -->" '
    $0 == begin {print; while ((getline line < res) > 0) print line; skip = 1; next}
    $0 == end {skip = 0}
    !skip {print}' "$md" >"$OUT/md" && cat "$OUT/md" >"$md"
  log "rewrote the reachability block of $md"
fi
log "raw output: $OUT"
