-- Upstream MCP servers (seed 002): discovery, invisibility without a policy, per-server RBAC,
-- server default policies, and authorize/complete around forwarded calls. Runs as ctxguard_gateway;
-- discovery is the DBA's or a discovery role's (here: ctxguard_discovery on a connection of its own,
-- lib/dba.sql), never the gateway's; so are policies (here: postgres, the same way).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set inv3 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
\set table_page '{"pageType": "invoice_table"}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
CREATE FUNCTION pg_temp.version() RETURNS bigint LANGUAGE sql AS $$ SELECT version FROM ctxguard.catalog_version $$;

-- The registry is the DBA's
SELECT throws_ok($$INSERT INTO ctxguard.mcp_servers (name, transport, url) VALUES ('evil', 'http', 'http://x/')$$, '42501', NULL,
                 'the gateway cannot register servers');
SELECT throws_ok($$INSERT INTO ctxguard.mcp_server_grants VALUES ('files', NULL, 'user:bob', 'allow')$$, '42501', NULL,
                 'the gateway cannot grant itself a server');
SELECT throws_ok('SELECT * FROM ctxguard.mcp_server_grants', '42501', NULL, 'grants (users of every tenant) are not readable');
SELECT throws_ok($$SELECT ctxguard.set_server_policy('files', '{"page_types": "*"}')$$, '42501', NULL, 'server policies are the DBA''s');
SELECT throws_ok($$SELECT ctxguard.sync_mcp_tools('files', '[]')$$, '42501', NULL, 'H.52 the gateway role cannot sync (discovery has its own role)');
SELECT ok(NOT has_function_privilege('ctxguard.set_tool_policy(text, jsonb)', 'EXECUTE')
          AND NOT has_function_privilege('ctxguard.set_server_policy(text, jsonb)', 'EXECUTE')
          AND NOT has_function_privilege('ctxguard.accept_mcp_tool(text)', 'EXECUTE'), 'the gateway role can execute no policy writer');
SELECT set_eq($$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
                 WHERE p.prosecdef AND p.pronamespace NOT IN ('ctxguard'::regnamespace, 'pg_catalog'::regnamespace)
                   AND has_function_privilege(p.oid, 'EXECUTE')$$,
              $$VALUES ('t.touched()'), ('lintme.definer_no_path()')$$,
              'nor a test helper that could (the only definers it may run outside ctxguard read t.touches or return 1 for lint)');
\set dba_role ctxguard_discovery
\set dba_sql 'SELECT ctxguard.sync_mcp_tools(''nosuch'', ''[]'')'
\ir lib/dba.sql
SELECT is(split_part(:'dba_out', E'\n', 1), 'ERROR:  22023: ctxguard: no such MCP server', 'sync needs a registered server');

-- Discovery: catalogued as server.tool, invisible without a policy
\set dba_sql 'SELECT ctxguard.sync_mcp_tools(''files'', $j$[{"name": "read_scan", "description": "Read the scanned PDF of an invoice.", "inputSchema": {"type": "object", "properties": {"invoice_id": {"type": "string"}, "page": {"type": "integer"}}, "required": ["invoice_id"]}}, {"name": "Delete-All!", "description": "Delete every file.", "inputSchema": {"type": "object"}}, {"name": "9lives", "inputSchema": {"type": "object"}}, {"name": "broken", "inputSchema": {"type": "object", "properties": {"x": {"type": "no-such-type"}}}}]$j$)'
\ir lib/dba.sql
\set synced :dba_out
SELECT is(:'synced'::jsonb - 'skipped', '{"added": 2, "updated": 0, "removed": 0}'::jsonb, 'sync adds the catalogable tools');
SELECT is(:'synced'::jsonb -> 'skipped', '[{"tool": "9lives", "reason": "name cannot be catalogued"}, {"tool": "broken", "reason": "invalid input schema"}]'::jsonb,
          'and reports the ones it skipped, with why');
SELECT set_eq($$SELECT name, upstream_name, kind FROM ctxguard.tools WHERE server = 'files'$$,
              $$VALUES ('files.read_scan', 'read_scan', 'external'), ('files.delete-all_', 'Delete-All!', 'external')$$,
              'upstream names are normalised into the server''s namespace; the original is kept for forwarding');
\set dba_sql 'SELECT ctxguard.sync_mcp_tools(''crm'', ''[{"name": "lookupContact", "description": "Find a contact.", "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}}]'')'
\ir lib/dba.sql
SELECT is(:'dba_out'::jsonb - 'skipped', '{"added": 1, "updated": 0, "removed": 0}'::jsonb, 'crm synced');
\set crm_sync :dba_sql
\set dba_sql 'SELECT ctxguard.sync_mcp_tools(''off'', ''[{"name": "noop", "description": "Nothing."}]'')'
\ir lib/dba.sql
SELECT is(:'dba_out'::jsonb - 'skipped', '{"added": 1, "updated": 0, "removed": 0}'::jsonb, 'off synced');
SELECT pg_temp.version() AS v0 \gset
\set dba_sql :crm_sync
\ir lib/dba.sql
SELECT is(:'dba_out'::jsonb - 'skipped', '{"added": 0, "updated": 0, "removed": 0}'::jsonb, 'a repeated sync changes nothing');
SELECT is(pg_temp.version(), :'v0'::bigint, 'a repeated sync leaves the catalog version (and every backend''s cache) alone');

BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv3') \g /dev/null
SELECT is((SELECT count(*)::int FROM ctxguard.visible_tools() WHERE server IN ('files', 'crm', 'off')), 0, 'discovered tools are invisible without a policy');
SELECT set_eq($$SELECT name, reason FROM ctxguard.explain_tools() WHERE name LIKE 'files.%' OR name LIKE 'crm.%'$$,
              $$VALUES ('files.read_scan', 'missing_policy'), ('files.delete-all_', 'missing_policy'), ('crm.lookupcontact', 'missing_policy')$$,
              'explain_tools names the seed-000 bug: missing_policy');
SELECT is(pg_temp.code(ctxguard.call_tool('files.read_scan', '{}')), 'TOOL_NOT_FOUND', 'a policy-less upstream tool cannot be called');
COMMIT;
SELECT ok(EXISTS (SELECT 1 FROM ctxguard.lint() WHERE kind = 'tool_without_policy' AND object = 'files.read_scan'), 'lint lists discovered tools without policy');

-- Policies: one tool explicitly, and a whole server in one statement
-- (as the DBA, on its own connection: the gateway's session sees the change through the catalog version)
\set dba_role postgres
\set dba_sql 'SELECT ctxguard.set_tool_policy(''files.read_scan'', ''{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "read_only": true}''); SELECT ctxguard.set_server_policy(''crm'', ''{"page_types": ["*"], "read_only": true}''); SELECT ctxguard.set_server_policy(''off'', ''{"page_types": ["*"], "read_only": true}'')'
\ir lib/dba.sql
SELECT unalike(:'dba_out'::text, '%ERROR%', 'the DBA set the policies');
SELECT ok(NOT EXISTS (SELECT 1 FROM ctxguard.lint() WHERE object IN ('crm.lookupcontact', 'files.read_scan')), 'lint: covered tools are no longer reported');

-- Per-server RBAC in Gate A
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv3') \g /dev/null
SELECT set_eq($$SELECT name, server, read_only FROM ctxguard.visible_tools() WHERE server IN ('files', 'crm', 'off')$$,
              $$VALUES ('files.read_scan', 'files', true), ('crm.lookupcontact', 'crm', true)$$,
              'alice (ap_clerk) sees files (role grant) and crm (default allow), not the disabled server');
SELECT is((SELECT input_schema FROM ctxguard.visible_tools() WHERE name = 'files.read_scan'),
          '{"type": "object", "properties": {"page": {"type": "integer"}}}'::jsonb, 'the bound entity parameter is stripped (and its required entry)');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'off.noop'), 'server_not_allowed', 'a disabled server''s tools are server_not_allowed');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'files.delete-all_'), 'missing_policy', 'another tool of the same server still has no policy');
SELECT set_eq($$SELECT s FROM ctxguard.usable_mcp_servers() AS s WHERE s IN ('files', 'crm', 'off')$$, $$VALUES ('crm'), ('files')$$, 'usable_mcp_servers for alice');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'inv3') \g /dev/null
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'files.read_scan'), 'server_not_allowed', 'bob (viewer): files is default deny');
SELECT is(pg_temp.code(ctxguard.call_tool('files.read_scan', '{}')), 'TOOL_NOT_VISIBLE', 'Gate B re-checks server access');
SELECT set_eq($$SELECT s FROM ctxguard.usable_mcp_servers() AS s WHERE s IN ('files', 'crm', 'off')$$, $$VALUES ('crm')$$, 'usable_mcp_servers for bob');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_dave', :'table_page') \g /dev/null
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'crm.lookupcontact'), 'server_not_allowed', 'dave: an explicit deny beats default allow');
SELECT is_empty($$SELECT s FROM ctxguard.usable_mcp_servers() AS s WHERE s IN ('files', 'crm', 'off')$$, 'usable_mcp_servers for dave: none');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', :'table_page') \g /dev/null
SELECT set_eq($$SELECT s FROM ctxguard.usable_mcp_servers() AS s WHERE s IN ('files', 'crm', 'off')$$, $$VALUES ('crm'), ('files')$$, 'a tenant-scoped deny does not reach another tenant');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_root', :'table_page') \g /dev/null
SELECT set_eq($$SELECT s FROM ctxguard.usable_mcp_servers() AS s WHERE s IN ('files', 'crm', 'off')$$, $$VALUES ('crm'), ('files')$$, 'the admin role sees every enabled server');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'off.noop'), 'server_not_allowed', 'even the admin does not see a disabled server');
COMMIT;
SELECT is_empty($$SELECT s FROM ctxguard.usable_mcp_servers() AS s WHERE s IN ('files', 'crm', 'off')$$, 'no context: no servers');

-- Gate B for forwarded calls: authorize with binding, then complete exactly once
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv3') \g /dev/null
SELECT ctxguard.call_tool('files.read_scan', '{"page": 2}') AS auth \gset
SELECT is(:'auth'::jsonb - 'call_id', '{"status": "authorized", "server": "files", "tool": "read_scan", "args": {"invoice_id": "acme_inv3", "page": 2}, "credential_mode": "static"}'::jsonb,
          'authorize: the entity id is bound from the context, the upstream name returned for forwarding');
SELECT is(pg_temp.code(ctxguard.call_tool('files.read_scan', '{"invoice_id": "acme_inv4"}')), 'ENTITY_MISMATCH', 'a spoofed entity id is refused before forwarding');
SELECT is(pg_temp.code(ctxguard.call_tool('files.read_scan', '{"page": "two"}')), 'INVALID_ARGUMENT', 'arguments are validated against the upstream schema');
SELECT ctxguard.complete_call((:'auth'::jsonb->>'call_id')::uuid,
    '{"content": [{"type": "text", "text": "Paid by card 4111 1111 1111 1111, contact jane.doe@example.com"}]}') AS done \gset
SELECT is(pg_temp.code(:'done'::jsonb), 'ok', 'complete_call returns the result');
SELECT ok(:'done'::jsonb::text NOT LIKE '%4111 1111%' AND :'done'::jsonb::text NOT LIKE '%jane.doe@%', 'the upstream result is masked');
SELECT ok(:'done'::jsonb::text LIKE '%[REDACTED:card_number]%' AND :'done'::jsonb::text LIKE '%[REDACTED:email]%',
          'positive control: the card and the e-mail were in the result, and were replaced');
SELECT is(pg_temp.code(ctxguard.complete_call((:'auth'::jsonb->>'call_id')::uuid, '{}')), 'NOT_FOUND', 'a call completes only once');
SELECT is(pg_temp.code(ctxguard.complete_call(gen_random_uuid(), '{}')), 'NOT_FOUND', 'an unknown call id is refused');
SELECT set_eq(format($$SELECT decision, tool, result_bytes IS NOT NULL FROM ctxguard.audit_log WHERE call_id = %L$$, :'auth'::jsonb->>'call_id'),
              $$VALUES ('authorized', 'files.read_scan', false), ('allow', 'files.read_scan', true), ('deny', NULL, false)$$,
              'audit: authorized, then allow with the result size (and the refused repeat)');
SELECT ctxguard.call_tool('files.read_scan', '{}') AS auth2 \gset
SELECT ctxguard.call_tool('files.read_scan', '{}') AS auth3 \gset
SELECT ctxguard.complete_call((:'auth2'::jsonb->>'call_id')::uuid, '{"content": [{"type": "text", "text": "upstream failed: token sk-live-0123456789abcdef0123"}]}', true) AS failed \gset
SELECT is(pg_temp.code(:'failed'::jsonb), 'TOOL_ERROR', 'an upstream error is reported as TOOL_ERROR');
SELECT ok(:'failed'::jsonb->'result' IS NOT NULL, 'with its content');
SELECT ok((:'failed'::jsonb->'result')::text NOT LIKE '%sk-live-0123456789abcdef0123%'
          AND (:'failed'::jsonb->'result')::text LIKE '%[REDACTED:openai_key]%', 'its content is masked (the API key replaced)');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'inv3') \g /dev/null
SELECT is(pg_temp.code(ctxguard.complete_call((:'auth3'::jsonb->>'call_id')::uuid, '{}')), 'NOT_FOUND', 'another user cannot complete alice''s call');
COMMIT;
SELECT is(pg_temp.code(ctxguard.complete_call((:'auth3'::jsonb->>'call_id')::uuid, '{}')), 'CONTEXT_MISSING', 'no context: nothing completes');

-- Vanished upstream tools are kept, hidden and uncallable, with their DBA policies (H.52)
\set dba_role ctxguard_discovery
\set dba_sql 'SELECT ctxguard.sync_mcp_tools(''files'', ''[]'')'
\ir lib/dba.sql
SELECT is(:'dba_out'::jsonb->>'removed', '2', 'the files server lists no tools any more');
SELECT is((SELECT count(*)::int FROM ctxguard.tool_policies WHERE tool = 'files.read_scan'), 1, 'a vanished tool keeps its DBA policy');
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv3') \g /dev/null
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'files.read_scan'), 'tool_absent', 'explain: tool_absent');
SELECT is(pg_temp.code(ctxguard.call_tool('files.read_scan', '{}')), 'TOOL_NOT_FOUND', 'a vanished tool cannot be called');
COMMIT;
SELECT * FROM finish();
