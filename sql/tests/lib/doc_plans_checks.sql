-- For the document-plan tests (34_doc_plans_*.sql), after lib/doc_plans_calls.sql ran with the
-- prefixes hostile_ (under lib/doc_plans_hostile.sql's settings) and next_ (a next client, with
-- the defaults): the same answers, and the next client's calls read only their own entries.
SELECT is(:'hostile_indexscan'::text, 'off', 'the hostile client''s own settings are still its own after the calls');
SELECT is(:'next_indexscan'::text, 'on', 'and the next client''s');
SELECT is(:'hostile_hits'::jsonb->>'status', 'ok', 'the search succeeds under the hostile settings');
SELECT is(:'hostile_hits'::jsonb->'result'->'results', :'next_hits'::jsonb->'result'->'results', 'the search: the same results either way');
SELECT is(:'hostile_pages'::jsonb->'result', :'next_pages'::jsonb->'result', 'read_doc_pages: the same pages either way');
SELECT is(:'hostile_sec'::jsonb->'result'->>'text', :'next_sec'::jsonb->'result'->>'text', 'read_doc_section: the same text either way');
SELECT is(jsonb_array_length(:'next_hits'::jsonb->'result'->'results'), 5, 'the next client''s search finds its five pages');
-- Each candidate is one page entry (and one entry of the hash index that finds it).
SELECT cmp_ok(:next_search_read, '<=', 2 * 100 + 10, 'the next client''s search reads its candidates'' entries, not the table per candidate');
SELECT cmp_ok(:next_pages_read, '<=', 2 * 3 + 2, 'its read_doc_pages reads its 3 pages'' entries');
SELECT cmp_ok(:next_sec_read, '<=', 2 * 3 + 4, 'its read_doc_section reads its section''s entries');
