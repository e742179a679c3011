-- explain_tools(query, top_k, max_hidden) costs what the page and max_hidden need, not the catalog
-- (issue 34). The gateway's POST /v1/tools, open to every user, explained every catalogued tool
-- in every request: 1.7 s of one core per request at 100,000 tools (AMD EPYC), an answer listing
-- all of them. With max_hidden it lists every visible tool (from the page's list) and at most
-- that many hidden ones, the first by name, and its walk over the catalog stops there.
--
-- Here 2,000 tools of another page type stand in the catalog; the tool rows the explanation reads
-- are counted (pg_stat_get_xact_tuples_returned on ctxguard.tools and its indexes, this
-- transaction's). Without max_hidden, every tool is still explained, as before.
-- Runs as the superuser (registration); the explanations as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

\ir ../lib/rows_returned.sql
-- As the gateway on `page`: explain_tools(NULL, NULL, max_hidden) as one JSON array, and the tool
-- rows read meanwhile.
CREATE FUNCTION pg_temp.explained(tok text, page jsonb, max_hidden int, OUT rows jsonb, OUT read bigint)
LANGUAGE plpgsql AS $$
DECLARE before bigint;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page);
    RESET ROLE;
    before := pg_temp.rows_returned('ctxguard.tools');
    SET LOCAL ROLE ctxguard_gateway;
    SELECT coalesce(jsonb_agg(jsonb_build_object('name', e.name, 'visible', e.visible, 'reason', e.reason) ORDER BY e.name), '[]')
      INTO rows FROM ctxguard.explain_tools(NULL, NULL, max_hidden) e;
    RESET ROLE;
    read := pg_temp.rows_returned('ctxguard.tools') - before;
END $$;

BEGIN;
-- The caller's planner settings are the caller's (any role may set them, and a pooled connection
-- keeps them for its next client): a seq scan made cheap must not turn the walk into a read of the
-- whole catalog (it did, with statistics that made the name index look scattered).
SET LOCAL random_page_cost = 1000;
SELECT ctxguard.register_page_type('explain_pt', NULL, 'A page of 2,000 tools.') IS NOT NULL AS registered \gset
SELECT count(ctxguard.register_tool('explain.t' || i, 'Explain test tool ' || i || '.',
           '{"type": "object", "properties": {}, "additionalProperties": false}', 'demo.vendor_list(jsonb)',
           '{"page_types": ["explain_pt"], "run_as": "ctxguard_tools"}'))
       AS n FROM generate_series(1, 2000) i \gset
SELECT count(*) AS catalogued FROM ctxguard.tools \gset
\set vendor '{"pageType": "vendor_table"}'
SELECT (pg_temp.explained(:'tok_alice', :'vendor', NULL)).* \gset all_
SELECT (pg_temp.explained(:'tok_alice', :'vendor', 5)).* \gset five_
SELECT (pg_temp.explained(:'tok_alice', :'vendor', 0)).* \gset none_
SELECT (pg_temp.explained(:'tok_alice', '{"pageType": "explain_pt"}', 5)).* \gset busy_
ROLLBACK;

-- Without max_hidden: every tool, as before.
SELECT is(jsonb_array_length(:'all_rows'::jsonb), :catalogued::int, 'without max_hidden every catalogued tool is explained');
-- With it: the visible ones, all of them, and the first 5 hidden by name.
SELECT is((SELECT jsonb_agg(r->>'name' ORDER BY r->>'name') FROM jsonb_array_elements(:'five_rows'::jsonb) r WHERE (r->>'visible')::boolean),
          (SELECT jsonb_agg(r->>'name' ORDER BY r->>'name') FROM jsonb_array_elements(:'all_rows'::jsonb) r WHERE (r->>'visible')::boolean),
          'max_hidden 5: every visible tool');
SELECT is((SELECT jsonb_agg(r ORDER BY r->>'name') FROM jsonb_array_elements(:'five_rows'::jsonb) r WHERE NOT (r->>'visible')::boolean),
          (SELECT jsonb_agg(r ORDER BY r->>'name') FROM (SELECT r FROM jsonb_array_elements(:'all_rows'::jsonb) r
                                                          WHERE NOT (r->>'visible')::boolean ORDER BY r->>'name' LIMIT 5) x),
          'and the first 5 hidden by name, with the same reasons');
SELECT is((SELECT count(*) FROM jsonb_array_elements(:'none_rows'::jsonb) r WHERE NOT (r->>'visible')::boolean), 0::bigint,
          'max_hidden 0: no hidden tool');
SELECT cmp_ok(:all_read::bigint, '>=', :catalogued::bigint, format('fixture: explaining every tool read %s tool rows', :all_read));
SELECT cmp_ok(:all_read::bigint, '<', 2 * :catalogued::bigint, 'and the catalog once, not once per batch of the walk');
SELECT cmp_ok(:five_read::bigint, '<', 600::bigint, format('max_hidden 5 read %s tool rows, not the catalog''s %s', :five_read, :catalogued));
-- A page of 2,000 visible tools: all are listed, and the walk still stops after 5 hidden.
SELECT is((SELECT count(*) FROM jsonb_array_elements(:'busy_rows'::jsonb) r WHERE (r->>'visible')::boolean AND r->>'name' LIKE 'explain.%'), 2000::bigint,
          'on a page of 2,000 tools every one is listed');
SELECT is((SELECT count(*) FROM jsonb_array_elements(:'busy_rows'::jsonb) r WHERE NOT (r->>'visible')::boolean), 5::bigint,
          'with 5 hidden ones');

SELECT * FROM finish();
