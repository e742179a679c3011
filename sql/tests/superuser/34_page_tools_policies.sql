-- A page's tools from an upstream server cost that server's tools, not every tool policy of the
-- catalog (issue 34: a large catalog costs what a call needs; found in a review of per-call
-- statements). Reading a page type's tools (once per backend and catalog version) takes the tools of
-- the servers whose default policy covers the page and that have no policy of their own; that
-- `NOT EXISTS` was planned (generically, as the saved plan runs) as a hash anti-join over every row of
-- tool_policies. Each tool's policy is now looked up by its key.
--
-- Here 5,000 policies of another server's tools stand in the catalog beside a server of 200 tools
-- whose default policy covers every page; the rows the scans of tool_policies and of its indexes
-- return in the transaction are counted (pg_stat_get_xact_tuples_returned) around a listing.
-- Runs as the superuser (the catalog is the DBA's); the listing as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\ir ../lib/rows_returned.sql
-- As the gateway: Gate A's list on page type `page` (which reads the page's tools), then Gate B's
-- decision on wide tools w<first> .. w<first + lookups - 1> (explain_call: decided as a call,
-- nothing run; each tool looked up by name); the last decision.
CREATE FUNCTION pg_temp.wide(tok text, page text, first int, lookups int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE n bigint; d text;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, jsonb_build_object('pageType', page));
    SELECT count(*) INTO n FROM ctxguard.visible_tools();
    FOR i IN first .. first + lookups - 1 LOOP
        d := ctxguard.explain_call('wide.w' || i, '{}')->>'decision';
    END LOOP;
    RESET ROLE;
    RETURN d;
END $$;

BEGIN;
-- The filler: 5,000 tools of a server with a policy each, written directly (the catalog's triggers
-- off for them; the wide server below moves the catalog's version through the API).
INSERT INTO ctxguard.mcp_servers (name, transport, url, default_access) VALUES ('filler', 'http', 'http://127.0.0.1:9/filler', 'allow');
ALTER TABLE ctxguard.tools DISABLE TRIGGER USER;
ALTER TABLE ctxguard.tool_policies DISABLE TRIGGER USER;
INSERT INTO ctxguard.tools (name, description, input_schema, kind, server, upstream_name)
SELECT 'filler.t' || i, 'Filler.', '{"type": "object"}', 'external', 'filler', 't' || i FROM generate_series(1, 5000) i;
INSERT INTO ctxguard.tool_policies (tool, page_types, requires_entity, read_only, danger, requires_approval, enabled, policy)
SELECT 'filler.t' || i, '{vendor_table}', false, true, 'safe', false, true, '{}' FROM generate_series(1, 5000) i;
ALTER TABLE ctxguard.tools ENABLE TRIGGER USER;
ALTER TABLE ctxguard.tool_policies ENABLE TRIGGER USER;
INSERT INTO ctxguard.mcp_servers (name, transport, url, default_access, max_tools) VALUES ('wide', 'http', 'http://127.0.0.1:9/wide', 'allow', 1000);
SELECT ctxguard.set_server_policy('wide', '{"page_types": "*"}') \g /dev/null
SELECT ctxguard.sync_mcp_tools('wide', (SELECT jsonb_agg(jsonb_build_object('name', 'w' || i, 'description', 'Wide.', 'inputSchema', '{"type": "object"}'::jsonb))
                                          FROM generate_series(1, 200) i)) \g /dev/null
ANALYZE ctxguard.tools;
ANALYZE ctxguard.tool_policies;
-- ctxguard's statements follow plan_cache_mode = auto whatever the session says (pinned): the first
-- listings of a backend are planned for their values (custom plans), later ones may be generic.
-- Both are made to read through the indexes (the second part plans generic ones).
SET LOCAL plan_cache_mode = force_generic_plan;
SELECT pg_temp.rows_returned('ctxguard.tool_policies') AS before \gset
SELECT pg_temp.wide(:'tok_alice', 'invoice_table', 7, 1) AS listed \gset
SELECT pg_temp.rows_returned('ctxguard.tool_policies') - :before AS read \gset
-- The next client of a pooled server connection gets the planner settings the last one left
-- (pgbouncer's transaction mode keeps a session's SET; the gateway does not pin planner settings).
-- Every plan of ctxguard's own statements is made with the planner's own settings: with index and
-- bitmap scans off, the next listing (another page, so the page's list is read again; the plans
-- are made again, custom and generic) still reads through the indexes, and so do six tools'
-- lookups by name (the sixth on its saved plan made generic).
SET LOCAL ROLE ctxguard_gateway;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_indexonlyscan = off;
RESET ROLE;
SELECT pg_temp.rows_returned('ctxguard.tool_policies') AS before2, pg_temp.rows_returned('ctxguard.tools') AS tools_before \gset
SELECT pg_temp.wide(:'tok_alice', 'mask_lab', 11, 6) AS listed2 \gset
SELECT pg_temp.rows_returned('ctxguard.tool_policies') - :before2 AS read2,
       pg_temp.rows_returned('ctxguard.tools') - :tools_before AS tools_read2 \gset
SELECT current_setting('enable_indexscan') AS still_off \gset
ROLLBACK;

SELECT is(:'listed'::text, 'allow', 'the wide server''s tool may be called on the invoice table');
SELECT cmp_ok(:read::bigint, '<', 500::bigint,
              format('reading the page''s tools read %s policy rows, not the catalog''s 5,000 others', :read));

SELECT is(:'listed2'::text, 'allow', 'with index scans off, the wide server''s tool may still be called');
SELECT is(:'still_off'::text, 'off', 'the session''s own setting is left as it was');
SELECT cmp_ok(:read2::bigint, '<', 500::bigint,
              format('with index scans off, reading a page''s tools read %s policy rows, not the catalog''s 5,000 others', :read2));
SELECT cmp_ok(:tools_read2::bigint, '<', 1000::bigint,
              format('with index scans off, looking tools up by name read %s tool rows, not the catalog''s 5,200', :tools_read2));

SELECT * FROM finish();
