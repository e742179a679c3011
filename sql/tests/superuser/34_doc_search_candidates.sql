-- doc_local_search reads only its words' candidate lists (issue 34), also while
-- ctxguard.document_terms has no statistics: the state between a document's put_document(..., 'ready')
-- and autovacuum's next analyze. The lookup of the candidates once read the document's whole term
-- list and filtered it by the query's words in that state (about 13,000 index entries for 300 on
-- the 500-page guide, and more as the document grows). Nor, without statistics on
-- ctxguard.document_pages, does it read more than one page entry per candidate (the pages are
-- looked up through a hash of their key, in a form the primary key cannot take). The work is
-- counted in entries the search's scans of the tables and their indexes return
-- (pg_stat_get_xact_tuples_returned), not timed.
-- Runs as the superuser: it removes the tables' statistics inside its transaction (rolled back).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'
-- Scans return the index entries of dead rows too (a document made ready again replaces its lists,
-- as the release-upgrade run does): gone first, so that what is counted is what the search needs.
VACUUM (INDEX_CLEANUP ON) ctxguard.document_terms, ctxguard.document_pages;

BEGIN;
-- Neither the lists nor the pages (nor their indexes) have statistics.
DELETE FROM pg_catalog.pg_statistic
 WHERE starelid IN ('ctxguard.document_terms'::pg_catalog.regclass, 'ctxguard.document_pages'::pg_catalog.regclass,
                    'ctxguard.document_pages_key_hash'::pg_catalog.regclass);
UPDATE pg_catalog.pg_class SET reltuples = -1, relpages = 0
 WHERE oid IN (SELECT 'ctxguard.document_terms'::pg_catalog.regclass UNION ALL SELECT 'ctxguard.document_pages'::pg_catalog.regclass
               UNION ALL SELECT i.indexrelid FROM pg_catalog.pg_index i WHERE i.indrelid = 'ctxguard.document_pages'::pg_catalog.regclass);
-- The plan every execution after the fifth may use, from the first.
SET LOCAL plan_cache_mode = force_generic_plan;
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-candidates') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null

-- The query's words as the document's lists know them, and how long those lists and the whole are.
SELECT pg_catalog.count(*) AS lists FROM ctxguard.document_terms
 WHERE tenant_id = 'acme' AND doc_id = 'acme_guide'
   AND lexeme = ANY (pg_catalog.tsvector_to_array(pg_catalog.to_tsvector('english', 'LDAP directory integration'))) \gset
SELECT pg_catalog.count(*) AS whole FROM ctxguard.document_terms WHERE tenant_id = 'acme' AND doc_id = 'acme_guide' \gset

-- Entries returned by scans of the list (this transaction, this backend).
CREATE FUNCTION pg_temp.terms_read() RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_catalog.sum(pg_catalog.pg_stat_get_xact_tuples_returned(r))::bigint
      FROM pg_catalog.unnest(ARRAY['ctxguard.document_terms'::pg_catalog.regclass,
                                   'ctxguard.document_terms_pkey'::pg_catalog.regclass,
                                   'ctxguard.document_terms_rank_idx'::pg_catalog.regclass]) r $$;
-- Entries returned by scans of the pages and their indexes (each candidate is one page).
CREATE FUNCTION pg_temp.pages_read() RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_catalog.sum(pg_catalog.pg_stat_get_xact_tuples_returned(r))::bigint
      FROM (SELECT 'ctxguard.document_pages'::pg_catalog.regclass
            UNION ALL SELECT i.indexrelid::pg_catalog.regclass FROM pg_catalog.pg_index i
                       WHERE i.indrelid = 'ctxguard.document_pages'::pg_catalog.regclass) AS x(r) $$;
SELECT pg_temp.terms_read() AS before, pg_temp.pages_read() AS pages_before \gset
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory integration"}') AS hits \gset
SELECT pg_temp.terms_read() - :before AS read, pg_temp.pages_read() - :pages_before AS pages \gset
ROLLBACK;
-- (pgTAP's results are written after the rollback that restores the statistics.)
SELECT cmp_ok(:whole, '>', 10 * :lists, 'fixture: the document''s term list is ten times its three words'' lists');
SELECT is(:'hits'::jsonb->>'status', 'ok', 'the search succeeds without statistics');
SELECT is(jsonb_array_length(:'hits'::jsonb->'result'->'results'), 5, 'and finds its five pages');
-- Its words' lists, and the one entry that says the document has lists at all.
SELECT cmp_ok(:read, '<=', :lists + 1, 'it reads its words'' candidate lists, not the document''s whole list');
SELECT cmp_ok(:read, '>', 0, 'it reads them (the count is of this table)');
-- At most one index entry per candidate page (their lists' entries, less the repeats).
SELECT cmp_ok(:pages, '<=', :lists, 'it reads one page entry per candidate, not the document''s range of pages');
SELECT cmp_ok(:pages, '>', 0, 'it reads the candidates (the count is of the pages and their indexes)');
SELECT * FROM finish();
