-- The document tools' kept plans stay the planner's own when PostgreSQL makes them again on its own
-- accord (issue 34; see 34_doc_plans_pinned.sql for the first plan). A kept plan is made again when
-- the plan cache finds it stale once inside (`GetCachedPlan`): an invalidation another backend sent,
-- taken in with the plan's locks, or the session's search path changed since the plan was made.
-- ctxguard pins the search path's text, but what it means grows when the session's temporary
-- schema comes into use: a session's first temporary object, after the plans were made, made
-- PostgreSQL plan the statements again under that session's settings, and the plan it kept served
-- every next client of the backend. Such a plan is now dropped and made again with the planner's
-- own settings.
--
-- Here the plans are made by a first call before this session has any temporary object (pgTAP's
-- own come after it), then a client with hostile planner settings creates one (a sequence: it
-- touches no cache that resets every plan) and calls, then the next client's reads are counted
-- (pg_stat_get_xact_tuples_returned, not time).
-- Runs as ctxguard_gateway; each file of the suite is a backend of its own.
\set QUIET 1
SET client_min_messages = warning;
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'

-- The first calls, with the defaults and no temporary object: the plans are made.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-repath-1') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory integration"}') AS first_hits \gset
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 43}') AS first_pages \gset
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') AS first_sec \gset
COMMIT;

-- A client with hostile planner settings and its first temporary object.
BEGIN;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_indexonlyscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL random_page_cost = 1000000;
SET LOCAL cpu_index_tuple_cost = 1000000;
SET LOCAL jit_above_cost = 0;
CREATE TEMPORARY SEQUENCE test_34_repath;
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-repath-2') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory integration"}') AS hostile_hits \gset
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 43}') AS hostile_pages \gset
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') AS hostile_sec \gset
SELECT pg_catalog.current_setting('enable_indexscan') AS hostile_setting \gset
COMMIT;

SELECT * FROM no_plan();
\ir lib/rows_returned.sql

-- The next client, with the defaults.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-repath-3') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS r0 \gset
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory integration"}') AS hits \gset
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS r1 \gset
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 43}') AS pages \gset
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS r2 \gset
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') AS sec \gset
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS r3 \gset
COMMIT;

SELECT is(:'hostile_setting'::text, 'off', 'the hostile client''s own setting is left as it set it');
SELECT is(:'first_hits'::jsonb->'result'->'results', :'hits'::jsonb->'result'->'results', 'the search: the same results each time');
SELECT is(:'hostile_hits'::jsonb->'result'->'results', :'hits'::jsonb->'result'->'results', 'and under the hostile settings');
SELECT is(:'hostile_pages'::jsonb->'result', :'pages'::jsonb->'result', 'read_doc_pages: the same pages');
SELECT is(:'first_pages'::jsonb->'result', :'pages'::jsonb->'result', 'read_doc_pages: the same pages each time');
SELECT is(:'hostile_sec'::jsonb->'result'->>'text', :'sec'::jsonb->'result'->>'text', 'read_doc_section: the same text');
SELECT is(:'first_sec'::jsonb->'result'->>'text', :'sec'::jsonb->'result'->>'text', 'read_doc_section: the same text each time');
SELECT is(jsonb_array_length(:'hits'::jsonb->'result'->'results'), 5, 'the next client''s search finds its five pages');
-- Each candidate is one page entry (and one entry of the hash index that finds it).
SELECT cmp_ok(:r1 - :r0, '<=', 2 * 100 + 10, 'the next client''s search reads its candidates'' entries, not the table per candidate');
SELECT cmp_ok(:r2 - :r1, '<=', 2 * 3 + 2, 'its read_doc_pages reads its 3 pages'' entries');
SELECT cmp_ok(:r3 - :r2, '<=', 2 * 3 + 4, 'its read_doc_section reads its section''s entries');

SELECT * FROM finish();
