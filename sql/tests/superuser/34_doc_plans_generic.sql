-- The document tools' statements over a document's pages run on one generic plan from their first
-- execution (issue 34): doc_local_search's candidates, read_doc_pages' range, read_doc_section's
-- batches. PostgreSQL's plan cache makes a custom plan for each execution of a saved statement
-- while the generic plan's estimate stays above the custom plans' average. It stays there when
-- the estimates cannot see how few rows the parameters select: on bench/scale.sh's data (one
-- document of 50,000 pages beside smaller ones) the search planned its statement again on every
-- call, 0.4 ms of its 3 ms. Those statements are written so that one plan is right for every
-- value (34_doc_search_candidates.sql plans them generically and counts what they read).
--
-- Seen in this backend's memory contexts: a kept generic plan is a `CachedPlan` context named by
-- its statement; a custom plan is freed once executed, and the plan cache makes the generic plan
-- no sooner than the sixth execution (as the control shows). So after one call of each tool, its
-- statement's generic plan exists only if it was planned generically from the start.
-- Runs as the superuser (pg_backend_memory_contexts); each file of the suite is a new backend.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'

-- This backend's kept plans whose statement matches `pattern`.
CREATE FUNCTION pg_temp.kept(pattern text) RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_catalog.count(*) FROM pg_catalog.pg_backend_memory_contexts
     WHERE name = 'CachedPlan' AND ident LIKE pattern $$;

\set search '''WITH c AS MATERIALIZED (%ctxguard.document_terms t%'''
\set range '''SELECT page_no, coalesce(clean, body) FROM ctxguard.document_pages%page_no BETWEEN $3 AND $4%'''
\set batch '''SELECT page_no, coalesce(clean, body) FROM ctxguard.document_pages%ORDER BY page_no LIMIT $5'''
SELECT is(pg_temp.kept(:search) + pg_temp.kept(:range) + pg_temp.kept(:batch), 0::bigint,
          'no plan of the three statements before the first calls');

BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-plans') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory integration"}') AS hits \gset
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 43}') AS pages \gset
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') AS sec \gset
ROLLBACK;

SELECT is(:'hits'::jsonb->>'status', 'ok', 'doc_local_search succeeds');
SELECT ok(jsonb_array_length(:'hits'::jsonb->'result'->'results') > 0, 'and finds pages');
SELECT is(jsonb_array_length(:'pages'::jsonb->'result'->'pages'), 3, 'read_doc_pages reads its 3 pages');
SELECT ok(length(:'sec'::jsonb->'result'->>'text') > 0, 'read_doc_section reads its section');
SELECT is(pg_temp.kept(:search), 1::bigint, 'after one search, its statement''s generic plan is kept');
SELECT is(pg_temp.kept(:range), 1::bigint, 'after one read_doc_pages, its range''s generic plan is kept');
SELECT is(pg_temp.kept(:batch), 1::bigint, 'after one read_doc_section, its batch''s generic plan is kept');

-- Control: a statement left to the plan cache's choice has no kept plan after one execution,
-- and has one after the sixth (the generic plan made to compare with the custom ones).
PREPARE ctl(text) AS SELECT pg_catalog.count(*) FROM ctxguard.document_pages WHERE tenant_id = $1;
EXECUTE ctl('acme') \g /dev/null
SELECT is(pg_temp.kept('PREPARE ctl(text)%'), 0::bigint, 'control: no kept plan after one execution');
EXECUTE ctl('acme') \g /dev/null
EXECUTE ctl('acme') \g /dev/null
EXECUTE ctl('acme') \g /dev/null
EXECUTE ctl('acme') \g /dev/null
EXECUTE ctl('acme') \g /dev/null
SELECT is(pg_temp.kept('PREPARE ctl(text)%'), 1::bigint, 'control: the generic plan after the sixth');

SELECT * FROM finish();
