-- The document tools' kept plans are not the caller's to shape (issue 34). The search's candidates,
-- read_doc_pages' range and read_doc_section's batches run on one generic plan, made at a backend's
-- first call and kept for its life: through a pooler, for every later client of that server
-- connection, whatever tenant. Planner settings are any role's to set (and a pooled connection
-- keeps them for its next client). Made under a session's hostile settings (no index scans, page
-- reads a million times dearer), the plan read every page of the table for each of the search's
-- 100 candidates, for every next client of the backend. The plans are now made with the planner's
-- own settings whatever the session's; a session that slows planning (`plan_cache_mode`) or JIT
-- still pays only for its own calls.
--
-- Here the first calls of this backend run under such settings; then, as the next client of the
-- backend would, with the defaults, the entries the calls' scans of ctxguard.document_pages and its
-- indexes return are counted (pg_stat_get_xact_tuples_returned, not time).
-- Runs as ctxguard_gateway; each file of the suite is a backend of its own.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\ir lib/rows_returned.sql
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'

-- The first client: hostile planner settings, then one call of each tool.
BEGIN;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_indexonlyscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL random_page_cost = 1000000;
SET LOCAL cpu_index_tuple_cost = 1000000;
SET LOCAL jit_above_cost = 0;
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-pinned-1') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory integration"}') AS hostile_hits \gset
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 43}') AS hostile_pages \gset
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') AS hostile_sec \gset
COMMIT;

-- The next client, with the defaults.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-pinned-2') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS r0 \gset
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory integration"}') AS hits \gset
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS r1 \gset
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 43}') AS pages \gset
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS r2 \gset
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') AS sec \gset
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS r3 \gset
COMMIT;

SELECT is(:'hostile_hits'::jsonb->>'status', 'ok', 'the search succeeds under the hostile settings');
SELECT is(:'hostile_pages'::jsonb->'result', :'pages'::jsonb->'result', 'read_doc_pages: the same pages either way');
SELECT is(:'hostile_sec'::jsonb->'result'->>'text', :'sec'::jsonb->'result'->>'text', 'read_doc_section: the same text either way');
SELECT is(:'hostile_hits'::jsonb->'result'->'results', :'hits'::jsonb->'result'->'results', 'the search: the same results either way');
SELECT is(jsonb_array_length(:'hits'::jsonb->'result'->'results'), 5, 'the next client''s search finds its five pages');
-- Each candidate is one page entry (and one entry of the hash index that finds it).
SELECT cmp_ok(:r1 - :r0, '<=', 2 * 100 + 10, 'the next client''s search reads its candidates'' entries, not the table per candidate');
SELECT cmp_ok(:r2 - :r1, '<=', 2 * 3 + 2, 'its read_doc_pages reads its 3 pages'' entries');
SELECT cmp_ok(:r3 - :r2, '<=', 2 * 3 + 4, 'its read_doc_section reads its section''s entries');

SELECT * FROM finish();
