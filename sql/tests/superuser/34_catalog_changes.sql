-- A catalog change is seen by every backend at its next transaction (issue 34): each backend keeps
-- what it read of the catalog (a page type's tools, a tool by name, a page type), so the tests drive
-- a gateway backend through dblink, warm its cache, change the catalog from this session (committed,
-- as a DBA would), and check that the gateway's next transaction sees the change: a tool added, a
-- policy tightened, a tool removed, a page type changed. Also register_tools, the bulk form.
-- Runs as a superuser (changes the catalog and commits); the observed backend is the gateway role.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set vendor_page '{"pageType": "vendor_table"}'
\set visible 'SELECT name FROM ctxguard.visible_tools() ORDER BY 1'
-- The sessions are driven through dblink (skipped where the extension is not available: the
-- PostgreSQL majors built from source here have no contrib; tests/tests/catalog_cache.rs covers
-- the cross-session cases there too).
SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'dblink') AS have_dblink \gset
\if :have_dblink
CREATE EXTENSION IF NOT EXISTS dblink;

SELECT dblink_connect('gw', format('host=%s port=%s dbname=%s user=ctxguard_gateway',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database())) \g /dev/null
-- A transaction of the gateway: set the context, then run `q`; its rows as text.
CREATE FUNCTION pg_temp.gw(page text, q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM dblink_exec('gw', 'BEGIN');
    PERFORM * FROM dblink('gw', format('SELECT ctxguard.set_context(%L, %L)::text', current_setting('t.token'), page)) AS r(x text);
    RETURN QUERY SELECT x FROM dblink('gw', q) AS r(x text);
    PERFORM dblink_exec('gw', 'COMMIT');
END $$;
SELECT set_config('t.token', :'tok_alice', false) \g /dev/null

-- Warm: the gateway backend reads vendor_table's tools and keeps them.
SELECT ok('vendor.list' IN (SELECT pg_temp.gw(:'vendor_page', :'visible')), 'the gateway sees vendor.list on the vendor table');
SELECT ok('cat34.extra' NOT IN (SELECT pg_temp.gw(:'vendor_page', :'visible')), 'cat34.extra does not exist yet');

-- 1. A tool added (committed here) is listed by the gateway's next transaction.
SELECT ctxguard.register_tool('cat34.extra', 'An extra vendor tool for the catalog-change test.',
    '{"type": "object", "properties": {}, "additionalProperties": false}', 'demo.vendor_list(jsonb)',
    '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}') \g /dev/null
SELECT ok('cat34.extra' IN (SELECT pg_temp.gw(:'vendor_page', :'visible')), 'a tool registered in another session is listed at the next transaction');
SELECT is((SELECT (x::jsonb->'result'->>'count')::int FROM pg_temp.gw(:'vendor_page', $$SELECT ctxguard.call_tool('cat34.extra', '{}')::text$$) x), 5,
          'and Gate B (reading it by name) runs it');

-- 2. Its policy tightened: gone from Gate A and refused by Gate B, though the backend kept it.
SELECT ctxguard.set_tool_policy('cat34.extra', '{"page_types": ["vendor_table"], "roles": ["nobody"], "run_as": "ctxguard_tools"}') \g /dev/null
SELECT ok('cat34.extra' NOT IN (SELECT pg_temp.gw(:'vendor_page', :'visible')), 'a policy tightened in another session hides the tool at the next transaction');
SELECT is((SELECT x::jsonb->'error'->>'code' FROM pg_temp.gw(:'vendor_page', $$SELECT ctxguard.call_tool('cat34.extra', '{}')::text$$) x), 'TOOL_NOT_VISIBLE',
          'and Gate B refuses it');

-- 3. Moved to another page type: listed there, not here.
SELECT ctxguard.set_tool_policy('cat34.extra', '{"page_types": ["invoice_table"], "run_as": "ctxguard_tools"}') \g /dev/null
SELECT ok('cat34.extra' NOT IN (SELECT pg_temp.gw(:'vendor_page', :'visible')), 'moved away: no longer on the vendor table');
SELECT ok('cat34.extra' IN (SELECT pg_temp.gw('{"pageType": "invoice_table"}', :'visible')), 'moved: listed on the invoice table');

-- 4. Removed: neither listed nor callable.
DELETE FROM ctxguard.tools WHERE name = 'cat34.extra';
SELECT ok('cat34.extra' NOT IN (SELECT pg_temp.gw('{"pageType": "invoice_table"}', :'visible')), 'a tool removed in another session is no longer listed');
SELECT is((SELECT x::jsonb->'error'->>'code' FROM pg_temp.gw('{"pageType": "invoice_table"}', $$SELECT ctxguard.call_tool('cat34.extra', '{}')::text$$) x), 'TOOL_NOT_FOUND',
          'nor callable');

-- 5. A page type changed: cat34_page starts as a list page, then needs an entity.
SELECT ctxguard.register_page_type('cat34_page', NULL, 'A page type for the catalog-change test.') \g /dev/null
SELECT is((SELECT count(*)::int FROM pg_temp.gw('{"pageType": "cat34_page"}', 'SELECT 1::text')), 1, 'the gateway sets a context on the list page');
SELECT ctxguard.register_page_type('cat34_page', 'invoice', 'Now a detail page of one invoice.') \g /dev/null
SELECT throws_ok($$SELECT * FROM pg_temp.gw('{"pageType": "cat34_page"}', 'SELECT 1::text')$$, NULL, NULL,
                 'after the page type changed in another session, a context without the entity is refused');
SELECT dblink_exec('gw', 'ROLLBACK') \g /dev/null

-- 5b. A backend takes a version that changed only tools over from the one before, reading just
-- those tools (ctxguard.catalog_changes); any other change makes it read afresh. Observed through
-- catalog_stats() in a second backend (a superuser's, as catalog_stats is a DBA's function).
SELECT dblink_connect('su', format('host=%s port=%s dbname=%s user=%s',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database(), current_user)) \g /dev/null
CREATE FUNCTION pg_temp.su(page text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    s jsonb;
    names text[];
BEGIN
    PERFORM dblink_exec('su', 'BEGIN');
    PERFORM * FROM dblink('su', format('SELECT ctxguard.set_context(%L, %L)::text', current_setting('t.token'), page)) AS r(x text);
    SELECT array_agg(x ORDER BY x) INTO names FROM dblink('su', 'SELECT name FROM ctxguard.visible_tools()') AS r(x text);
    SELECT x::jsonb INTO s FROM dblink('su', 'SELECT ctxguard.catalog_stats()::text') AS r(x text);
    PERFORM dblink_exec('su', 'COMMIT');
    RETURN s || jsonb_build_object('names', to_jsonb(names));
END $$;
SELECT pg_temp.su(:'vendor_page') AS before \gset
SELECT ctxguard.register_tool('cat34.fresh', 'A tool added while a backend keeps the vendor table''s list.',
    '{"type": "object"}', 'demo.vendor_list(jsonb)', '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}') \g /dev/null
SELECT pg_temp.su(:'vendor_page') AS after \gset
SELECT ok((:'after'::jsonb->'names') ? 'cat34.fresh', 'the added tool is listed by the backend that kept the list');
SELECT is((:'after'::jsonb->>'versions_refreshed')::int, (:'before'::jsonb->>'versions_refreshed')::int + 1, 'it took the new version over from the one before');
SELECT is((:'after'::jsonb->>'tools_read')::int, (:'before'::jsonb->>'tools_read')::int + 1, 'reading the one changed tool, not the page''s list');
SELECT is((:'after'::jsonb->'names') - 'cat34.fresh', :'before'::jsonb->'names', 'and the rest of the list is the same');
SELECT ctxguard.set_tool_policy('cat34.fresh', '{"page_types": ["invoice_table"], "run_as": "ctxguard_tools"}') \g /dev/null
SELECT pg_temp.su(:'vendor_page') AS moved \gset
SELECT is(:'moved'::jsonb->'names', :'before'::jsonb->'names', 'moved to another page: gone from the kept list');
SELECT is((:'moved'::jsonb->>'versions_refreshed')::int, (:'after'::jsonb->>'versions_refreshed')::int + 1, 'again by taking the version over');
-- Anything but tools (here a page type) makes the backend read afresh.
SELECT ctxguard.register_page_type('cat34_other', NULL, 'Another page type.') \g /dev/null
SELECT pg_temp.su(:'vendor_page') AS afresh \gset
SELECT is((:'afresh'::jsonb->>'versions_refreshed')::int, (:'moved'::jsonb->>'versions_refreshed')::int, 'a page type change is not taken over');
SELECT is(:'afresh'::jsonb->'names', :'before'::jsonb->'names', 'and the list read afresh is the same');
-- A version moved without a record of what changed (by hand) is not taken over either.
UPDATE ctxguard.catalog_version SET version = version + 1;
SELECT pg_temp.su(:'vendor_page') AS by_hand \gset
SELECT is((:'by_hand'::jsonb->>'versions_refreshed')::int, (:'afresh'::jsonb->>'versions_refreshed')::int, 'a version with no record of its change is read afresh');
SELECT ok(EXISTS (SELECT FROM ctxguard.catalog_changes c WHERE c.version = (SELECT version FROM ctxguard.catalog_version) - 1 AND c.tool IS NULL),
          'the page type''s change was recorded as a change of everything');
SELECT ok(NOT EXISTS (SELECT FROM ctxguard.catalog_changes c WHERE c.version = (SELECT version FROM ctxguard.catalog_version) - 2 AND c.tool IS NULL),
          'the policy change as the one tool it changed');
DELETE FROM ctxguard.tools WHERE name = 'cat34.fresh';
DELETE FROM ctxguard.page_types WHERE name = 'cat34_other';
SELECT dblink_disconnect('su') \g /dev/null

\else
SELECT skip('dblink is not available: the cross-session cases are not tested on this major', 1);
\endif

-- 6. register_tools: many tools in one call, all or none.
SELECT is(ctxguard.register_tools(jsonb_build_array(
    jsonb_build_object('name', 'cat34.bulk_a', 'description', 'Bulk tool A.', 'input_schema', '{"type": "object"}'::jsonb,
                       'handler', 'demo.vendor_list(jsonb)', 'policy', '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}'::jsonb),
    jsonb_build_object('name', 'cat34.bulk_b', 'description', 'Bulk tool B.', 'input_schema', '{"type": "object"}'::jsonb,
                       'handler', 'demo.vendor_list(jsonb)', 'policy', '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}'::jsonb,
                       'title', 'Bulk B'))), 2, 'register_tools registers a list and returns its length');
\if :have_dblink
SELECT ok(ARRAY['cat34.bulk_a', 'cat34.bulk_b'] <@ ARRAY(SELECT pg_temp.gw(:'vendor_page', :'visible')), 'the gateway lists both at its next transaction');
\endif
SELECT is((SELECT title FROM ctxguard.tools WHERE name = 'cat34.bulk_b'), 'Bulk B', 'with the title given');
-- A bad element refuses the whole list, naming its index, not its values; nothing is written.
SELECT throws_ok($$SELECT ctxguard.register_tools('[{"name": "cat34.bulk_c", "description": "C.", "input_schema": {"type": "object"}, "handler": "demo.vendor_list(jsonb)", "policy": {"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}},
                                                   {"name": "cat34.bulk_d", "description": "D.", "input_schema": {"type": "object"}, "handler": "demo.vendor_list(jsonb)", "policy": {"page_types": ["no_such_page_secret"]}}]')$$,
                 '22023', NULL, 'an invalid element refuses the list (22023)');
SELECT is((SELECT count(*)::int FROM ctxguard.tools WHERE name = 'cat34.bulk_c'), 0, 'and writes none of it');
SELECT throws_like($$SELECT ctxguard.register_tools('[{"name": "cat34.bulk_c", "description": "C.", "input_schema": {"type": "object"}, "handler": "demo.vendor_list(jsonb)", "policy": {"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}},
                                                    {"name": "cat34.bulk_d", "description": "D.", "input_schema": {"type": "object"}, "handler": "demo.vendor_list(jsonb)", "policy": {"page_types": ["no_such_page_secret"]}}]')$$,
                   'ctxguard: tools[1]: %', 'the refusal names the element''s index');
SELECT throws_matching($$SELECT ctxguard.register_tools('[{"name": "Bad Name s3cret", "description": "D.", "input_schema": {"type": "object"}, "handler": "demo.vendor_list(jsonb)", "policy": {"page_types": ["vendor_table"]}}]')$$,
                       '^((?!s3cret).)*$', 'and never the values it refused');
-- The handler is read with the pinned search_path: it must name its schema.
SELECT throws_ok($$SELECT ctxguard.register_tools('[{"name": "cat34.bulk_e", "description": "E.", "input_schema": {"type": "object"}, "handler": "vendor_list(jsonb)", "policy": {"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}}]')$$,
                 '22023', NULL, 'a handler without its schema is refused, whatever the caller''s search_path');
-- The same name twice, or two names clients would see as one.
SELECT throws_ok($$SELECT ctxguard.register_tools('[{"name": "cat34.twice", "description": "T.", "input_schema": {"type": "object"}, "handler": "demo.vendor_list(jsonb)", "policy": {"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}},
                                                   {"name": "cat34__twice", "description": "T.", "input_schema": {"type": "object"}, "handler": "demo.vendor_list(jsonb)", "policy": {"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}}]')$$,
                 '42710', NULL, 'two names that clients would see as one are refused (42710)');
SELECT throws_ok($$SELECT ctxguard.register_tools('[{"name": "cat34__bulk_a", "description": "T.", "input_schema": {"type": "object"}, "handler": "demo.vendor_list(jsonb)", "policy": {"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}}]')$$,
                 '42710', NULL, 'a name clients would see as an existing tool''s is refused (42710)');
SELECT throws_ok($$SELECT ctxguard.register_tools('{"name": "x"}')$$, '22023', NULL, 'not an array: 22023');
SELECT throws_ok($$SELECT ctxguard.register_tools('[{"name": "cat34.bulk_f", "colour": "red"}]')$$, '22023', NULL, 'an unknown key: 22023');
SELECT throws_ok($$SELECT ctxguard.register_tools(NULL)$$, '22004', NULL, 'NULL: 22004');
SELECT throws_ok($$SELECT ctxguard.register_tools((SELECT jsonb_agg(i) FROM generate_series(1, 100001) i))$$, '54000', NULL,
                 'more than 100,000 definitions: 54000, before any is read');
-- Not for the gateway role.
SELECT is(has_function_privilege('ctxguard_gateway', 'ctxguard.register_tools(jsonb)', 'EXECUTE'), false, 'register_tools is not granted to the gateway role');
SELECT is(has_function_privilege('ctxguard_gateway', 'ctxguard.catalog_stats()', 'EXECUTE'), false, 'nor is catalog_stats');

-- catalog_stats reports this backend's cache within its bound.
SELECT ok((ctxguard.catalog_stats()->>'bytes_kept')::bigint <= (ctxguard.catalog_stats()->>'bytes_limit')::bigint, 'catalog_stats: what is kept is within ctxguard.catalog_cache_size');

DELETE FROM ctxguard.tools WHERE name IN ('cat34.bulk_a', 'cat34.bulk_b');
DELETE FROM ctxguard.page_types WHERE name = 'cat34_page';
\if :have_dblink
SELECT dblink_disconnect('gw') \g /dev/null
\endif
SELECT * FROM finish();
