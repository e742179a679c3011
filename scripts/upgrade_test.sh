#!/usr/bin/env bash
# Upgrade test: every released version, updated with ALTER EXTENSION ctxguard UPDATE, must end up
# with exactly the objects of a fresh install (tables, columns, constraints, indexes, policies,
# triggers, functions with their bodies, settings and privileges, grants, comments), and keep its
# data. Runs against the cluster started by scripts/lib.sh (sourced by scripts/test.sh).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

CURRENT=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

# A normalised description of everything in schema ctxguard, one line per fact.
describe() {
  psql_su -d "$1" -At <<'SQL'
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
       || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
       || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
       || coalesce(' generated ' || nullif(a.attgenerated::text, ''), '')
       || ' #' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
 WHERE c.relnamespace = 'ctxguard'::regnamespace AND c.relkind IN ('r', 'p', 'v')
UNION ALL
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' rls=' || c.relrowsecurity || ' force=' || c.relforcerowsecurity
       || ' acl=' || coalesce(c.relacl::text, '-')
  FROM pg_class c WHERE c.relnamespace = 'ctxguard'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
UNION ALL
SELECT 'column-acl ' || c.relname || '.' || a.attname || ' ' || a.attacl::text
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attacl IS NOT NULL
 WHERE c.relnamespace = 'ctxguard'::regnamespace
UNION ALL
SELECT 'constraint ' || conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace = 'ctxguard'::regnamespace
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relnamespace = 'ctxguard'::regnamespace
UNION ALL
SELECT 'policy ' || tablename || ' ' || policyname || ' ' || cmd || ' ' || coalesce(qual, '') || ' ' || coalesce(with_check, '')
  FROM pg_policies WHERE schemaname = 'ctxguard'
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE c.relnamespace = 'ctxguard'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text || ' -> ' || pg_get_function_result(p.oid)
       || ' args(' || pg_get_function_arguments(p.oid) || ')'
       || ' ' || p.provolatile::text || p.proparallel::text || CASE WHEN p.proisstrict THEN ' strict' ELSE '' END
       || CASE WHEN p.prosecdef THEN ' definer' ELSE '' END
       || ' lang=' || l.lanname || ' config=' || coalesce(p.proconfig::text, '-')
       || ' acl=' || coalesce(p.proacl::text, '-')
       || ' body=' || md5(CASE WHEN l.lanname = 'c' THEN p.prosrc ELSE coalesce(pg_get_function_sqlbody(p.oid), p.prosrc) END)
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang WHERE p.pronamespace = 'ctxguard'::regnamespace
UNION ALL
SELECT 'comment ' || classoid::regclass::text || ' ' || coalesce(objsubid, 0) || ' '
       || CASE classoid WHEN 'pg_proc'::regclass THEN objoid::regprocedure::text
                        WHEN 'pg_class'::regclass THEN objoid::regclass::text ELSE objoid::text END
       || ' ' || md5(description)
  FROM pg_description
 WHERE (classoid = 'pg_proc'::regclass AND objoid IN (SELECT oid FROM pg_proc WHERE pronamespace = 'ctxguard'::regnamespace))
    OR (classoid = 'pg_class'::regclass AND objoid IN (SELECT oid FROM pg_class WHERE relnamespace = 'ctxguard'::regnamespace))
ORDER BY 1
SQL
}

fail() { echo "upgrade test: $*" >&2; exit 1; }

for script in pg_ext/ctxguard/sql/releases/ctxguard--*.sql; do
  from=$(basename "$script" .sql); from=${from#ctxguard--}
  [ "$from" = "$CURRENT" ] && continue
  log "upgrade test: $from -> $CURRENT"
  psql_su -d postgres -c "DROP DATABASE IF EXISTS ctxguard_up_old WITH (FORCE)" -c "CREATE DATABASE ctxguard_up_old" \
    -c "DROP DATABASE IF EXISTS ctxguard_up_new WITH (FORCE)" -c "CREATE DATABASE ctxguard_up_new" 2>/dev/null
  # The old version, with data in every table the update touches. The rows are written directly:
  # the installed library is the new one, which expects the new schema (a DBA installs the new
  # package, restarts PostgreSQL and runs ALTER EXTENSION ctxguard UPDATE before any call).
  psql_su -d ctxguard_up_old -o /dev/null <<SQL
SET client_min_messages = warning;
CREATE EXTENSION ctxguard VERSION '$from';
CREATE SCHEMA app;
CREATE FUNCTION app.ping(args jsonb) RETURNS jsonb LANGUAGE sql AS \$\$ SELECT '{"pong": true}'::jsonb \$\$;
INSERT INTO ctxguard.page_types (name, entity_type, description) VALUES ('home', NULL, 'Home.');
INSERT INTO ctxguard.tools (name, description, input_schema, handler, kind)
VALUES ('app.ping', 'Ping.', '{"type": "object"}', 'app.ping(jsonb)', 'sql');
INSERT INTO ctxguard.tool_policies (tool, page_types, requires_entity, read_only, danger, requires_approval, enabled, policy)
VALUES ('app.ping', '{home}', false, true, 'safe', false, true, '{"page_types": ["home"]}');
INSERT INTO ctxguard.mcp_servers (name, transport, url) VALUES ('docs', 'http', 'http://127.0.0.1:9/mcp');
INSERT INTO ctxguard.tools (name, description, input_schema, kind, server, upstream_name)
VALUES ('docs.search', 'Search.', '{"type": "object"}', 'external', 'docs', 'search');
INSERT INTO ctxguard.approvals (call_id, tenant_id, user_id, tool, args, args_hash, expires_at)
VALUES ('00000000-0000-4000-8000-000000000001', 'acme', 'alice', 'app.ping', '{}', 'x', now() + interval '1 hour');
-- A conversation with two turns: its numbering goes on after the update (save_turn's row lock,
-- issue 29, counts from the turns already there).
INSERT INTO ctxguard.conversation_turns (tenant_id, user_id, conversation_id, turn, page, message, answer, tool_calls)
VALUES ('acme', 'alice', 'conv-up', 1, '{}', 'q1', 'a1', '[]'), ('acme', 'alice', 'conv-up', 2, '{}', 'q2', 'a2', '[]');
-- The mask rules as 0.1.0's library seeded them (Unicode word boundaries; this library seeds its own).
UPDATE ctxguard.mask_rules SET pattern = replace(pattern, '(?-u:\b)', '\b');
SQL
  psql_su -d ctxguard_up_old -o /dev/null -c "ALTER EXTENSION ctxguard UPDATE" \
    || fail "ALTER EXTENSION ctxguard UPDATE from $from failed"
  psql_su -d ctxguard_up_new -o /dev/null -c "SET client_min_messages = warning" -c "CREATE EXTENSION ctxguard"

  [ "$(psql_su -d ctxguard_up_old -Atc "SELECT extversion FROM pg_extension WHERE extname = 'ctxguard'")" = "$CURRENT" ] \
    || fail "the updated extension is not at $CURRENT"
  describe ctxguard_up_new >"$RUN/upgrade.fresh" || fail "could not describe the fresh install"
  describe ctxguard_up_old >"$RUN/upgrade.updated" || fail "could not describe the updated install"
  [ "$(wc -l <"$RUN/upgrade.fresh")" -gt 100 ] || fail "the description of a fresh install is too short"
  if ! diff "$RUN/upgrade.fresh" "$RUN/upgrade.updated" >"$RUN/upgrade.diff"; then
    cat "$RUN/upgrade.diff" >&2
    fail "$from updated to $CURRENT differs from a fresh $CURRENT install (< fresh, > updated)"
  fi

  # The built-in mask rules are rewritten like a fresh install's (ASCII word boundaries).
  mask_rules() {
    psql_su -d "$1" -At -c "SELECT string_agg(name || ' ' || pattern || ' ' || coalesce(validator, '-') || ' ' || position, E'\n' ORDER BY name) FROM ctxguard.mask_rules"
  }
  [ "$(mask_rules ctxguard_up_old)" = "$(mask_rules ctxguard_up_new)" ] || fail "the mask rules of $from updated differ from a fresh install's"

  # Data kept, and made safe: the old SQL tool has no run_as (it fails closed and lint says so), the
  # old pending approval can no longer be approved, the discovered tool's definition is accepted.
  checks=$(psql_su -d ctxguard_up_old -At <<'SQL'
SELECT 'tools=' || count(*) FROM ctxguard.tools WHERE name IN ('app.ping', 'docs.search');
SELECT 'lint=' || string_agg(kind || ':' || object, ',' ORDER BY kind) FROM ctxguard.lint() WHERE kind = 'tool_without_run_as';
SELECT 'approvals_pending=' || count(*) FROM ctxguard.approvals WHERE status = 'pending' AND expires_at > now();
SELECT 'accepted=' || bool_and(definition_hash IS NOT NULL AND definition_hash = accepted_hash) FROM ctxguard.tools WHERE kind = 'external';
-- Issue 30: policies kept as they were: enforced, without conditions.
SELECT 'policies=' || string_agg(DISTINCT mode || ':' || coalesce(when_fn::text, '-') || ':' || coalesce(approval_when_fn::text, '-'), ',') FROM ctxguard.tool_policies;
-- Issue 33: a server registered before credential modes keeps its static token, as before.
SELECT 'credentials=' || string_agg(name || ':' || credential_mode || ':' || requires_connection, ',') FROM ctxguard.mcp_servers;
-- and every kept policy allows any credential mode (policy credential_mode), none lints as a mismatch.
SELECT 'modes=' || bool_and(credential_modes = '{}') || ':' || (SELECT count(*) FROM ctxguard.lint() WHERE kind LIKE '%credential_mode%') FROM ctxguard.tool_policies;
SQL
)
  expected=$'tools=2\nlint=tool_without_run_as:app.ping\napprovals_pending=0\naccepted=true\npolicies=enforce:-:-\ncredentials=docs:static:false\nmodes=true:0'
  [ "$checks" = "$expected" ] || fail "data after the update: got [$checks], want [$expected]"
  # The conversation's next turn is its third.
  turn=$(psql_su -d ctxguard_up_old -At -v tok="$(mint --sub alice --tenant acme)" <<'SQL'
BEGIN;
SELECT ctxguard.set_context(:'tok', '{"pageType": "home"}') \g /dev/null
SELECT ctxguard.save_turn('conv-up', 'q3', 'a3');
COMMIT;
SQL
)
  [ "$turn" = 3 ] || fail "a conversation's turn after the update: got [$turn], want [3]"
  # Issue 31: the updated catalog's tools are in namespaces, described, listed and searched over
  # Gate A's tools (docs.search has no policy: neither its namespace nor the tool shows).
  ns=$(psql_su -d ctxguard_up_old -At -v tok="$(mint --sub alice --tenant acme)" <<'SQL'
SELECT ctxguard.register_namespace('app', 'The app''s own tools.', 'App') \g /dev/null
BEGIN;
SELECT ctxguard.set_context(:'tok', '{"pageType": "home"}') \g /dev/null
SELECT string_agg(namespace || ':' || title || ':' || tools, ',' ORDER BY namespace) FROM ctxguard.visible_namespaces()
 WHERE namespace IN ('app', 'docs');
SELECT string_agg(name || '@' || namespace, ',') FROM ctxguard.find_tools('ping search') WHERE namespace IN ('app', 'docs');
COMMIT;
SQL
)
  [ "$ns" = $'app:App:1\napp.ping@app' ] || fail "namespaces after the update: got [$ns], want [app:App:1, app.ping@app]"
  echo "ok: $from -> $CURRENT matches a fresh install; data kept and made safe"
done
psql_su -d postgres -c "DROP DATABASE IF EXISTS ctxguard_up_old WITH (FORCE)" -c "DROP DATABASE IF EXISTS ctxguard_up_new WITH (FORCE)" >/dev/null 2>&1
