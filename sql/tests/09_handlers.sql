-- SECURITY_MATRIX H.49/H.50 (issue 11 §2, §3): handlers run as their tool's run_as role, cannot call
-- back into ctxguard to change anything, and cannot crash the backend; the gateway role itself can
-- read or write no application table. Runs as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set inv3 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
\set inv9 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv9"}}'
\set table_page '{"pageType": "invoice_table"}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
CREATE FUNCTION pg_temp.reenter(fn text, extra jsonb DEFAULT '{}') RETURNS jsonb LANGUAGE sql AS $$
    SELECT ctxguard.call_tool('test.reenter', jsonb_build_object('fn', fn) || extra)
$$;

-- H.49 the gateway role holds no table privileges: every direct path is refused, tools still work
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'inv9') \g /dev/null
SELECT throws_ok($$UPDATE demo.invoices SET status = 'paid' WHERE id = 'acme_inv6'$$, '42501', NULL,
                 'issue 11 §3: a viewer''s token and a direct UPDATE: refused (no role check, approval or audit to skip)');
SELECT throws_ok($$SELECT count(*) FROM demo.invoices$$, '42501', NULL, 'direct SELECT on invoices refused');
SELECT throws_ok($$SELECT count(*) FROM demo.vendors$$, '42501', NULL, 'direct SELECT on vendors refused');
SELECT throws_ok($$SELECT count(*) FROM demo.matters$$, '42501', NULL, 'direct SELECT on matters refused');
SELECT throws_ok($$EXPLAIN ANALYZE SELECT * FROM demo.invoices WHERE id = 'glx_inv3'$$, '42501', NULL,
                 'EXPLAIN ANALYZE cannot count another tenant''s rows');
SELECT throws_ok($$EXPLAIN SELECT * FROM demo.invoices WHERE id = 'glx_inv3'$$, '42501', NULL, 'nor plain EXPLAIN');
SELECT throws_ok($$SELECT demo.invoice_mark_paid('{"invoice_id": "acme_inv6"}')$$, '42501', NULL, 'handlers are not executable by the gateway');
SELECT throws_ok($$SELECT demo.invoice_get('{"invoice_id": "acme_inv6"}')$$, '42501', NULL, 'not even read-only ones');
SELECT throws_ok($$SELECT t.touch('{"invoice_id": "acme_inv6"}')$$, '42501', NULL, 'nor test handlers');
SELECT throws_ok($$SELECT count(*) FROM t.touches$$, '42501', NULL, 'nor the tables test handlers write');
SELECT throws_ok($$SELECT demo.page_data()$$, '42501', NULL, 'the demo app''s screens are not the gateway''s');
SELECT throws_ok($$SELECT demo.viewer_page(1)$$, '42501', NULL, 'the raw page viewer is not the gateway''s');
SELECT throws_ok($$SELECT demo.manual_page(77, 500)$$, '42501', NULL, 'the guide generator is executable by nobody but its owner');
SELECT throws_ok($$SELECT boilerplate FROM ctxguard.documents$$, '42501', NULL, 'documents.boilerplate (raw text) is not readable');
SELECT is(ctxguard.call_tool('invoice.get', '{}')->'result'->>'status', 'open', 'the tool reads the invoice as its run_as role');
SELECT is(pg_temp.code(ctxguard.call_tool('invoice.mark_paid', '{}')), 'TOOL_NOT_VISIBLE', 'and Gate B still applies the role check');
COMMIT;
SELECT is_empty($$SELECT c.oid::regclass FROM pg_class c
                   WHERE (c.relrowsecurity AND c.relnamespace::regnamespace::text IN ('demo', 't') OR c.oid = 'ctxguard.document_pages'::regclass)
                     AND has_table_privilege(c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')$$,
                'the gateway role has no privilege on protected tables or page text');
SELECT ok(NOT has_schema_privilege('demo', 'USAGE'), 'nor USAGE on the demo schema');

-- The handler runs as the run_as role with a pinned path, restricted, read-only when declared so
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SET LOCAL search_path = pg_temp, public;
SELECT ctxguard.call_tool('test.whoami', '{}')->'result' AS who \gset
SELECT is(:'who'::jsonb->>'current_user', 'ctxguard_tools', 'the handler runs as the tool''s run_as role');
SELECT is(:'who'::jsonb->>'session_user', 'ctxguard_gateway', 'in the caller''s session');
SELECT is(:'who'::jsonb->>'search_path', 'pg_catalog, pg_temp', 'with search_path = pg_catalog, pg_temp');
SELECT is(:'who'::jsonb->>'set_role', '42501', 'SET ROLE is refused inside (security-restricted)');
SELECT is(:'who'::jsonb->>'create_temp', '42501', 'creating a temp table is refused inside (security-restricted)');
SELECT is(current_user::text, 'ctxguard_gateway', 'the caller''s identity is back after the call');
SELECT is(current_setting('search_path'), 'pg_temp, public', 'and its own search_path');
SELECT is(ctxguard.call_tool('test.noexec', '{}')->'error', '{"code": "TOOL_ERROR", "message": "tool handler failed (SQLSTATE 42501)"}'::jsonb,
          'EXECUTE on the handler is checked for the run_as role, not the caller');
COMMIT;

-- Every scope checks the pinned settings before it runs SQL, and opens a nest level to set them
-- only when one differs. Each setting in turn moved away from ctxguard's value while every other
-- one holds it (the check that lets a scope skip the nest level must see that one): the handler
-- still sees every setting pinned, and the caller's own value is back after the call.
CREATE TEMP TABLE pins (n text, v text, odd text);
INSERT INTO pins VALUES ('search_path', 'pg_catalog, pg_temp', 'pg_temp, public'),
    ('TimeZone', 'UTC', 'Pacific/Kiritimati'), ('DateStyle', 'ISO, YMD', 'SQL, DMY'),
    ('DateStyle', 'ISO, YMD', 'ISO, DMY'), ('DateStyle', 'ISO, YMD', 'Postgres, YMD'),
    ('IntervalStyle', 'postgres', 'sql_standard'), ('default_text_search_config', 'pg_catalog.english', 'pg_catalog.simple'),
    ('standard_conforming_strings', 'on', 'off'), ('transform_null_equals', 'off', 'on'), ('array_nulls', 'on', 'off'),
    ('extra_float_digits', '1', '3'), ('bytea_output', 'hex', 'escape'), ('row_security', 'on', 'off'),
    ('check_function_bodies', 'on', 'off'), ('gin_fuzzy_search_limit', '0', '1'),
    ('plan_cache_mode', 'auto', 'force_custom_plan'), ('quote_all_identifiers', 'off', 'on');
CREATE FUNCTION pg_temp.pinned_call(odd_n text, odd_v text) RETURNS jsonb LANGUAGE plpgsql AS $f$
DECLARE r jsonb; after text;
    before jsonb := (SELECT jsonb_object_agg(n, current_setting(n)) FROM (SELECT DISTINCT n FROM pg_temp.pins) p);
BEGIN
    PERFORM set_config(n, v, true) FROM (SELECT DISTINCT n, v FROM pg_temp.pins) p;
    IF odd_n IS NOT NULL THEN PERFORM set_config(odd_n, odd_v, true); END IF;
    r := ctxguard.call_tool('test.whoami', '{}')->'result';
    after := current_setting(COALESCE(odd_n, 'search_path'));
    PERFORM set_config(key, value, true) FROM jsonb_each_text(before);
    RETURN jsonb_build_object('seen', r->'pinned', 'after', after);
END $f$;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT is(pg_temp.pinned_call(NULL, NULL)->'seen', (SELECT jsonb_object_agg(n, v) FROM (SELECT DISTINCT n, v FROM pins) p),
          'every setting at ctxguard''s value: the handler sees them all');
SELECT is(pg_temp.pinned_call(n, odd), jsonb_build_object('seen', (SELECT jsonb_object_agg(n, v) FROM (SELECT DISTINCT n, v FROM pins) p),
                                                          'after', odd),
          n || ' = ' || odd || ', every other setting at ctxguard''s value: the handler sees ' || n || ' pinned, the caller its own after')
  FROM pins;
COMMIT;

-- H.50 a handler calling back into ctxguard: refused with 42501 and a clear message; nothing changes
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT ctxguard.begin_generation('conv-handlers') AS gen \gset
SELECT ctxguard.set_context(:'tok_alice', :'table_page', :'gen') \g /dev/null
SELECT is(pg_temp.reenter(fn)->'result', jsonb_build_object('refused', true, 'sqlstate', '42501',
                                                            'message', 'ctxguard: ' || fn || ' cannot be called from a tool handler'),
          'a handler calling ' || fn || ' is refused: 42501, clear message')
  FROM unnest(ARRAY['set_context', 'begin_generation', 'call_tool', 'approve_call', 'complete_call', 'save_turn']) fn;
SELECT is(pg_temp.reenter('sync_mcp_tools')->'result'->>'sqlstate', '42501', 'a handler calling sync_mcp_tools is refused');
SELECT is(ctxguard.call_tool('test.reenter', jsonb_build_object('fn', fn, 'catch', false))->'error',
          '{"code": "TOOL_ERROR", "message": "tool handler failed (SQLSTATE 42501)"}'::jsonb,
          'uncaught, the refusal of ' || fn || ' makes the outer call TOOL_ERROR')
  FROM unnest(ARRAY['set_context', 'begin_generation', 'call_tool', 'approve_call', 'save_turn', 'sync_mcp_tools']) fn;
SELECT is(ctxguard.call_tool('test.reenter', jsonb_build_object('fn', 'set_context', 'token', :'tok_carol'))->'result'->>'refused', 'true',
          'issue 11 §2: another tenant''s token from inside a handler');
SELECT is(ctxguard.tenant_id() || '/' || ctxguard.user_id() || '/' || ctxguard.page_type(), 'acme/alice/invoice_table', 'the context is still the caller''s');
SELECT is(ctxguard.generation()::text, :'gen', 'the generation is unchanged');
SELECT is((SELECT count(*)::int FROM ctxguard.conversation_turns WHERE conversation_id = 'from-a-handler'), 0, 'no turn was saved');
SELECT is(pg_temp.reenter('readers', jsonb_build_object('gen', :'gen'))->'result',
          jsonb_build_object('tenant', 'acme', 'user', 'alice', 'roles', '["ap_clerk"]'::jsonb, 'page', 'invoice_table', 'entity', NULL,
                             'generation', true, 'context', true, 'has_role', true,
                             'visible', (SELECT count(*) FROM ctxguard.visible_tools()), 'explained', (SELECT count(*) FROM ctxguard.explain_tools())),
          'the readers keep working inside a handler');
COMMIT;
SELECT is((SELECT count(*)::int FROM ctxguard.tools WHERE server = 'up'), 1, 'the catalog is unchanged (the handler''s sync did nothing)');

-- H.51 a pending approval cannot be approved by a handler; its owner still can, once
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv9') \g /dev/null
SELECT ctxguard.call_tool('invoice.mark_paid', '{}')->>'call_id' AS cid \gset
SELECT is(pg_temp.reenter('approve_call', jsonb_build_object('call_id', :'cid'))->'result'->>'sqlstate', '42501',
          'issue 11 §2: a handler approving the pending call is refused');
SELECT is(ctxguard.call_tool('invoice.get', '{}')->'result'->>'status', 'open', 'nothing was paid');
SELECT is(ctxguard.approve_call(:'cid')->'result', '{"invoice_id": "acme_inv9", "updated": 1}'::jsonb, 'the approval is still pending: its owner approves, it runs');
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'once');
COMMIT;

-- H.50 the crash of issue 11 §2: two nested calls with a catalog change between them
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT ctxguard.call_tool('test.twice', '{}') AS twice \gset
SELECT is(:'twice'::jsonb->'result', '{"first": "42501", "bump": "ok", "second": "42501"}'::jsonb,
          'both nested calls are refused; the catalog changed between them');
SELECT is(ctxguard.call_tool('test.twice_sql', '{}')->'error', '{"code": "TOOL_ERROR", "message": "tool handler failed (SQLSTATE 42501)"}'::jsonb,
          'a SQL-language handler doing the same fails at its first nested call');
COMMIT;
SELECT is((SELECT 1), 1, 'the backend survived (same session, no restart)');
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "vendor_table"}') \g /dev/null
SELECT is((ctxguard.call_tool('vendor.list', '{}')->'result'->>'count')::int, 5, 'and ctxguard still works in it after the catalog reload');
SELECT is(pg_temp.code(ctxguard.call_tool('test.twice', '{}')), 'ok', 'a second time too');
COMMIT;

-- A SQL handler's body is parsed and planned once per backend (handler.rs), not in every
-- transaction: what it runs as, which tenant it sees and which body runs must not be frozen by that.
\set plan_lab '{"pageType": "plan_lab"}'
\set dba_role postgres
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'plan_lab') \g /dev/null
SELECT is(ctxguard.call_tool('test.versioned', '{}')->'result', '{"v": 1, "user": "ctxguard_tools", "tenants": ["acme"]}'::jsonb,
          'a SQL handler''s body runs as its tool''s run_as role and sees its tenant''s rows');
SELECT is(ctxguard.call_tool('test.versioned_other', '{}')->'result', '{"v": 1, "user": "ctxguard_test_tools2", "tenants": ["acme"]}'::jsonb,
          'the same body through another tool runs as that tool''s role');
SELECT is(ctxguard.call_tool('test.versioned', '{}')->'result'->>'user', 'ctxguard_tools', 'and back: the first tool''s role again');
SELECT is(ctxguard.call_tool('test.versioned_nousage', '{}')->'error',
          '{"code": "TOOL_ERROR", "message": "tool handler failed (SQLSTATE 42501)"}'::jsonb,
          'a role without USAGE on the schema the body reads cannot run it, though another role''s plan of it is kept');
SELECT is(ctxguard.call_tool('test.versioned', '{}')->'result'->>'user', 'ctxguard_tools', 'and the kept plan still runs for its own role');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', :'plan_lab') \g /dev/null
SELECT is(ctxguard.call_tool('test.versioned', '{}')->'result', '{"v": 1, "user": "ctxguard_tools", "tenants": ["globex"]}'::jsonb,
          'the next transaction, another tenant''s token: that tenant''s rows only');
COMMIT;
\set dba_sql 'CREATE OR REPLACE FUNCTION t.versioned(args jsonb) RETURNS jsonb LANGUAGE sql STABLE AS $b$ SELECT jsonb_build_object(''v'', 2, ''user'', current_user::text, ''tenants'', (SELECT jsonb_agg(DISTINCT tenant_id) FROM demo.invoices)) $b$'
\ir lib/dba.sql
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'plan_lab') \g /dev/null
SELECT is(ctxguard.call_tool('test.versioned', '{}')->'result', '{"v": 2, "user": "ctxguard_tools", "tenants": ["acme"]}'::jsonb,
          'the DBA replaced the body: the next call runs the new one');
COMMIT;
\set dba_sql 'CREATE OR REPLACE FUNCTION t.versioned(args jsonb) RETURNS jsonb LANGUAGE sql VOLATILE AS $b$ SELECT jsonb_build_object(''v'', 3, ''user'', current_user::text, ''tenants'', (SELECT jsonb_agg(DISTINCT tenant_id) FROM demo.invoices)) $b$'
\ir lib/dba.sql
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'plan_lab') \g /dev/null
SELECT is(ctxguard.call_tool('test.versioned', '{}')->'result'->'v', '3'::jsonb, 'and again (now VOLATILE): that body');
COMMIT;
\set dba_sql 'CREATE OR REPLACE FUNCTION t.versioned(args jsonb) RETURNS jsonb LANGUAGE sql STABLE AS $b$ SELECT jsonb_build_object(''v'', 1, ''user'', current_user::text, ''tenants'', (SELECT jsonb_agg(DISTINCT tenant_id) FROM demo.invoices)) $b$'
\ir lib/dba.sql

SELECT * FROM finish();
