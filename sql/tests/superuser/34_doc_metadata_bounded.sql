-- A document's metadata lists its first 200 sections in page order, read through an index in that
-- order, not by sorting every section of the document (issue 34: cost as the documents grow; found
-- in a review of per-call statements). `read_doc_metadata` ordered the document's sections by
-- (page_start, section_id) with no index giving that order, so each call read all of them into a
-- top-200 sort: the ingester decides how many sections a document has (put_section has no limit),
-- and every reader's call paid for them (100,000 sections: about 40 ms a call).
--
-- Here 20,000 sections stand in the demo guide; the entries the scans of document_sections and of
-- its indexes return in the call's transaction are counted (pg_stat_get_xact_tuples_returned).
-- Runs as the superuser (the sections are written directly); the call as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\ir ../lib/generation.sql
\ir ../lib/rows_returned.sql
-- As the gateway, in generation g of the viewer page: the metadata's sections (their ids, in order).
CREATE FUNCTION pg_temp.sections(tok text, page jsonb, g uuid) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page, g);
    r := ctxguard.call_tool('read_doc_metadata', '{}');
    RESET ROLE;
    RETURN ARRAY(SELECT s->>'section_id' FROM jsonb_array_elements(r->'result'->'sections') s);
END $$;

BEGIN;
SELECT pg_temp.gen(:'tok_ranker', :'viewer') AS g \gset
INSERT INTO ctxguard.document_sections (tenant_id, doc_id, section_id, title, page_start, page_end)
SELECT 'acme', 'acme_guide', 'm' || (100000 + i), 'Section ' || i, 1 + i % 500, 1 + i % 500
  FROM generate_series(1, 20000) i;
ANALYZE ctxguard.document_sections;
-- As the saved plan runs once generic (a pooled backend's later calls).
SET LOCAL plan_cache_mode = force_generic_plan;
SELECT pg_temp.rows_returned('ctxguard.document_sections') AS before \gset
SELECT pg_temp.sections(:'tok_ranker', :'viewer', :'g') AS listed \gset
SELECT pg_temp.rows_returned('ctxguard.document_sections') - :before AS read \gset
-- The first 200 in (page_start, section_id) order, as the table sorts them.
SELECT ARRAY(SELECT section_id FROM ctxguard.document_sections WHERE tenant_id = 'acme' AND doc_id = 'acme_guide'
              ORDER BY page_start, section_id LIMIT 200) AS expected \gset
ROLLBACK;

SELECT is(:'listed'::text[], :'expected'::text[], 'the metadata lists the first 200 sections in page order');
SELECT cmp_ok(:read::bigint, '<=', 400::bigint,
              format('the call read %s section entries, not the document''s 20,000', :read));

SELECT * FROM finish();
