-- Issue 29 item 7: repeated JSON members are refused (token headers and claims, page contexts read
-- from text), and NULL or deeply nested JSON arguments get stable SQLSTATEs (22004, 54000), never
-- XX000. Runs as ctxguard_gateway; discovery and policies as their own roles (lib/dba.sql).
-- Before this change: tok_dup set a context for tenant globex (the last tenant_id), and every
-- deep-JSON and NULL case below raised XX000.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set table_page '{"pageType": "invoice_table"}'

-- A token whose claims repeat tenant_id ("acme", then "globex"), correctly signed: refused, whichever
-- value a parser would keep.
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_dup', :'table_page'), '28000',
                 'ctxguard: invalid context token: token header or claims repeat a member',
                 'a token repeating a claim is refused');
SELECT is(ctxguard.tenant_id(), NULL, 'and sets no context');
COMMIT;
SELECT throws_ok(format('SELECT ctxguard.verify_token(%L)', :'tok_dup'), '28000',
                 'ctxguard: invalid context token: token header or claims repeat a member',
                 'verify_token refuses it too');
BEGIN;
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'table_page'), 'the same claims once each verify');
SELECT is(ctxguard.tenant_id(), 'acme', 'as acme');
COMMIT;

-- Page contexts. Through set_context(text, jsonb), PostgreSQL's jsonb has already kept one of the
-- repeated members (the last) before ctxguard sees the page: there is nothing left to refuse.
BEGIN;
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', '{"pageType": "nosuch", "pageType": "invoice_table"}'),
                'a jsonb page arrives with one member of each name');
SELECT is(ctxguard.page_type(), 'invoice_table', 'the one jsonb kept');
COMMIT;
-- _set_context(text, text) reads the page's text itself: a repeated member, at any depth, is refused.
BEGIN;
SELECT throws_ok(format('SELECT ctxguard._set_context(%L, %L)', :'tok_alice', page), '22023',
                 'ctxguard: invalid page context: an object repeats a member', 'page text refused: ' || label)
  FROM (VALUES ('{"pageType": "invoice_table", "pageType": "invoice_table"}', 'pageType twice'),
               ('{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3", "id": "globex_inv1"}}', 'entity.id twice'),
               ('{"pageType": "invoice_table", "pageState": {"filters": {"status": "open", "st\u0061tus": "paid"}}}', 'a filter twice, escaped')) AS c(page, label);
SELECT throws_ok(format('SELECT ctxguard._set_context(%L, %L)', :'tok_alice', repeat('[', 300) || repeat(']', 300)), '22023',
                 'ctxguard: invalid page context: not valid JSON or nested too deeply', 'a page text nested 300 deep is 22023, not XX000');
SELECT is(ctxguard.tenant_id(), NULL, 'no context after the refusals');
COMMIT;

-- NULL where a value is required: 22004.
SELECT throws_ok($$SELECT ctxguard._mask_rule_valid(NULL, 'x', NULL)$$, '22004', 'ctxguard: name must not be NULL', '_mask_rule_valid(NULL name)');
SELECT throws_ok($$SELECT ctxguard._mask_rule_valid('x', NULL, NULL)$$, '22004', 'ctxguard: pattern must not be NULL', '_mask_rule_valid(NULL pattern)');

-- Discovery and policies, on a server of this file's own.
\set dba_role postgres
\set dba_sql 'INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access) VALUES (''deep'', ''http'', ''http://127.0.0.1:9/deep'', ''Hostile upstream'', ''allow'')'
\ir lib/dba.sql
SELECT is((SELECT count(*)::int FROM ctxguard.mcp_servers WHERE name = 'deep'), 1, 'a server for this file');

\set dba_role ctxguard_discovery
\set dba_sql 'SELECT ctxguard.sync_mcp_tools(''deep'', NULL)'
\ir lib/dba.sql
SELECT is(split_part(:'dba_out', E'\n', 1), 'ERROR:  22004: ctxguard: tools must not be NULL', 'sync_mcp_tools(server, NULL) is 22004');
\set dba_sql 'SELECT ctxguard.sync_mcp_tools(NULL, ''[]'')'
\ir lib/dba.sql
SELECT is(split_part(:'dba_out', E'\n', 1), 'ERROR:  22004: ctxguard: server must not be NULL', 'sync_mcp_tools(NULL, tools) is 22004');
\set dba_sql 'SELECT ctxguard.sync_mcp_tools(''deep'', ''{"tools": []}'')'
\ir lib/dba.sql
SELECT is(split_part(:'dba_out', E'\n', 1), 'ERROR:  22023: ctxguard: tools must be a JSON array', 'tools that are not an array stay 22023');

-- A tool whose inputSchema is nested 300 deep (what a hostile tools/list can send) is skipped with
-- its reason; the server's other tools are catalogued.
SELECT format('SELECT ctxguard.sync_mcp_tools(%L, %L)', 'deep',
              format('[{"name": "abyss", "description": "Deep.", "inputSchema": {"type": "object", "properties": {"x": %s1%s}}}, '
                     '{"name": "shallow", "description": "Fine.", "inputSchema": {"type": "object"}}]',
                     repeat('[', 300), repeat(']', 300))) AS dba_sql \gset
\ir lib/dba.sql
SELECT is(:'dba_out'::jsonb, '{"added": 1, "updated": 0, "removed": 0, "skipped": [{"tool": "abyss", "reason": "tool definition nested too deeply"}]}'::jsonb,
          'sync skips the tool nested 300 deep and adds the other (before: XX000, nothing synced)');
SELECT set_eq($$SELECT name FROM ctxguard.tools WHERE server = 'deep'$$, $$VALUES ('deep.shallow')$$, 'only the shallow tool is catalogued');
-- The whole list nested deep: each element is its own tool, refused alone.
SELECT format('SELECT ctxguard.sync_mcp_tools(%L, %L)', 'deep', '[' || repeat('[', 300) || repeat(']', 300) || ']') AS dba_sql \gset
\ir lib/dba.sql
SELECT is(:'dba_out'::jsonb -> 'skipped', '[{"tool": "", "reason": "tool definition nested too deeply"}]'::jsonb,
          'a list element nested 300 deep is skipped, not XX000');

-- Policies nested 300 deep: 54000 naming the argument and the limit.
\set dba_role postgres
SELECT format('SELECT ctxguard.set_server_policy(%L, %L)', 'deep', format('{"page_types": "*", "x": %s1%s}', repeat('[', 300), repeat(']', 300))) AS dba_sql \gset
\ir lib/dba.sql
SELECT is(split_part(:'dba_out', E'\n', 1), 'ERROR:  54000: ctxguard: policy is nested more than 100 levels deep',
          'set_server_policy with a policy nested 300 deep is 54000');
SELECT format('SELECT ctxguard.set_tool_policy(%L, %L)', 'deep.shallow', format('{"page_types": "*", "x": %s1%s}', repeat('[', 300), repeat(']', 300))) AS dba_sql \gset
\ir lib/dba.sql
SELECT is(split_part(:'dba_out', E'\n', 1), 'ERROR:  54000: ctxguard: policy is nested more than 100 levels deep',
          'set_tool_policy with a policy nested 300 deep is 54000');
SELECT format('SELECT ctxguard.register_tool(%L, %L, %L, %L, %L)', 'deep_local', 'Deep.',
              format('{"type": "object", "properties": {"x": %s1%s}}', repeat('[', 300), repeat(']', 300)),
              'pg_catalog.now()', '{"page_types": "*"}') AS dba_sql \gset
\ir lib/dba.sql
SELECT is(split_part(:'dba_out', E'\n', 1), 'ERROR:  54000: ctxguard: input_schema is nested more than 100 levels deep',
          'register_tool with an input_schema nested 300 deep is 54000');
\set dba_sql 'SELECT ctxguard.set_server_policy(NULL, NULL)'
\ir lib/dba.sql
SELECT is(split_part(:'dba_out', E'\n', 1), 'ERROR:  22004: ctxguard: server must not be NULL', 'set_server_policy(NULL, ...) is 22004');
\set dba_sql 'SELECT ctxguard.set_server_policy(''deep'', NULL)'
\ir lib/dba.sql
SELECT is(:'dba_out'::text, ''::text, 'set_server_policy(server, NULL) still clears the server''s policy (documented)');

-- complete_call with is_error NULL: 22004 (was XX000: a NULL where the function took a bool).
SELECT throws_ok($$SELECT ctxguard.complete_call('00000000-0000-4000-8000-000000000029', '{}', NULL)$$, '22004',
                 'ctxguard: complete_call: is_error must not be NULL', 'complete_call(id, result, NULL) is 22004');
-- Tool arguments sent as text repeating a member: refused, not read with the last value.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}') \g /dev/null
SELECT is(ctxguard._call_tool('invoice.get', '{"invoice_id": "acme_inv3", "invoice_id": "acme_inv3"}')->'error'->>'code',
          'INVALID_ARGUMENT', 'call_tool arguments repeating a member are INVALID_ARGUMENT');
COMMIT;

-- Tool arguments larger than ctxguard.max_arg_bytes are refused before they are parsed (issue 34, a
-- review as an attacker: the whole text was parsed into a tree first, several times its size in
-- memory, and only then measured). An oversized text that is not even JSON gets the size refusal,
-- not the parse's: before the fix, 'arguments are not valid JSON, ...'.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}') \g /dev/null
SELECT is(ctxguard._call_tool('invoice.get', repeat('[', 20000))->'error'->>'message',
          format('arguments exceed %s bytes', (SELECT setting FROM pg_settings WHERE name = 'ctxguard.max_arg_bytes')),
          'call_tool arguments over max_arg_bytes are refused by size before any parse');
SELECT is(ctxguard._call_tool('invoice.get', '{"invoice_id": "acme_inv3", "pad": "' || repeat('x', 20000) || '"}')->'error'->>'code',
          'INVALID_ARGUMENT', 'and valid JSON over max_arg_bytes too');
COMMIT;

-- Clean up: nothing of this file's server is left for the files after it.
\set dba_sql 'DELETE FROM ctxguard.tools WHERE server = ''deep''; DELETE FROM ctxguard.mcp_servers WHERE name = ''deep'''
\ir lib/dba.sql
SELECT is((SELECT count(*)::int FROM ctxguard.mcp_servers WHERE name = 'deep'), 0, 'the server is gone');

SELECT * FROM finish();
