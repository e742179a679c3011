-- Making a document ready holds a batch of its pages at a time, not the document (issue 34: cost
-- as the documents grow, without a crash). put_document(..., 'ready') read every page's body into
-- memory at once, then the cleaned copy of each, then both again as one text[] for the statement
-- that writes them: about five times the document (up to 100,000 pages of 1 MiB each), in the
-- backend of an ingester that only needs the ingestion role of one tenant. It now finds the
-- repeated headers and footers in one pass over the pages and writes the cleaned pages in a
-- second, a batch at a time.
--
-- Here a document of 300 pages of about 100 kB (30 MB) is made ready as the ingester; the
-- backend's peak resident memory (VmHWM, through catalog_stats) may grow by at most 64 MB over
-- its peak before the call (shared buffers it touches count too). Its running header and footer
-- are still found and stripped, and its text is searchable.
-- Runs as the superuser (catalog_stats is the DBA's); the ingestion with the ingester's context.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set lib '{"pageType": "document_library"}'

CREATE FUNCTION pg_temp.peak_kb() RETURNS bigint LANGUAGE sql AS $$
    SELECT (ctxguard.catalog_stats()->>'backend_peak_kb')::bigint
$$;

BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT ctxguard.put_document('big_finalize', 'A large document') \g /dev/null
-- Each page: a running header, a line of about 100 kB that differs from page to page, a footer.
SELECT count(ctxguard.put_page('big_finalize', i,
           'ACME Big Manual v1 - Confidential' || E'\n'
           || repeat('Chapter ' || i || ' explains the replication settings of cluster node ' || (i * 7919 % 1000) || '. ', 1500)
           || md5(i::text) || '.' || E'\nPage ' || i || ' of 300'))
       AS pages FROM generate_series(1, 300) i \gset
SELECT pg_temp.peak_kb() AS peak_before \gset
SELECT ctxguard.put_document('big_finalize', 'A large document', 'ready') AS ready \gset
SELECT pg_temp.peak_kb() - :peak_before AS grew_kb \gset
SELECT sum(octet_length(body)) AS doc_bytes FROM ctxguard.document_pages WHERE doc_id = 'big_finalize' \gset
SELECT count(*) AS clean_pages FROM ctxguard.document_pages
 WHERE doc_id = 'big_finalize' AND clean IS NOT NULL AND tsv IS NOT NULL
   AND left(clean, 7) = 'Chapter' AND right(clean, 1) = '.' \gset
SELECT count(*) AS page_17_hits FROM ctxguard.document_pages
 WHERE doc_id = 'big_finalize' AND tsv @@ to_tsquery('english', 'chapter & 17') AND page_no = 17 \gset
ROLLBACK;

SELECT is(:pages::bigint, 300::bigint, '300 pages put');
SELECT cmp_ok(:doc_bytes::bigint, '>', 25000000::bigint, format('fixture: the document holds %s bytes', :doc_bytes));
SELECT is((:'ready'::jsonb)->>'page_count', '300', 'the document is made ready');
SELECT is((:'ready'::jsonb)->>'boilerplate_lines', '2', 'its running header and footer are found');
SELECT is(:clean_pages::bigint, 300::bigint, 'and stripped from every page, each cleaned and indexed');
SELECT is(:page_17_hits::bigint, 1::bigint, 'a page''s own words are searchable');
SELECT cmp_ok(:grew_kb::bigint, '<', 65536::bigint,
              format('making 30 MB of pages ready grew the backend''s peak memory by less than 64 MB (%s kB)', :grew_kb));

-- The second pass reads each batch's pages by their keys, not the document from its first page:
-- its UPDATE joined the batch's page numbers to the document's range of the primary key, which the
-- planner (the pages just written in the same transaction, no statistics for them) did as a merge
-- join from page 1 up to the batch, for every batch: quadratic in the pages (making 10,000 pages
-- ready took 10 s, 20,000 took 30 s, the 50,000 of bench/scale.sh 141 s). Counted here: the
-- entries of the primary key the call reads in its transaction (pg_stat_get_xact_tuples_returned),
-- for 2,000 small pages. Every step reads each page a bounded number of times (the count, the two
-- passes, the update of each page, the search candidates): at most 8 per page (12,000 measured);
-- the merge join read 198,496.
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT ctxguard.put_document('many_pages', 'Many small pages') \g /dev/null
SELECT count(ctxguard.put_page('many_pages', i, 'Page ' || i || ' covers backup scheduling on node ' || (i % 97) || '.'))
       AS small_pages FROM generate_series(1, 2000) i \gset
SELECT pg_stat_get_xact_tuples_returned('ctxguard.document_pages_pkey'::regclass) AS pkey_before \gset
SELECT (ctxguard.put_document('many_pages', 'Many small pages', 'ready'))->>'page_count' AS many_ready \gset
SELECT pg_stat_get_xact_tuples_returned('ctxguard.document_pages_pkey'::regclass) - :pkey_before AS pkey_read \gset
SELECT count(*) AS many_clean FROM ctxguard.document_pages WHERE doc_id = 'many_pages' AND tsv IS NOT NULL \gset
ROLLBACK;

SELECT is(:small_pages::bigint, 2000::bigint, '2,000 small pages put');
SELECT is(:'many_ready'::text, '2000', 'the document of 2,000 pages is made ready');
SELECT is(:many_clean::bigint, 2000::bigint, 'each of its pages cleaned and indexed');
SELECT cmp_ok(:pkey_read::bigint, '<=', 16000::bigint,
              format('making 2,000 pages ready read at most 8 primary-key entries per page (%s)', :pkey_read));

SELECT * FROM finish();
