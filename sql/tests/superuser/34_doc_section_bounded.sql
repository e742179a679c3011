-- read_doc_section reads no more of a section than the call may mask (issue 34: cost as the
-- documents grow, without a crash). A section's page range is the ingester's: up to 100,000 pages
-- of up to 1 MiB each. The call read every page of it into memory (the rows, their texts, the
-- joined text: three copies) and only then found it larger than ctxguard.max_mask_bytes and
-- refused it (RESULT_TOO_LARGE). It now reads the pages a batch at a time and refuses as soon as
-- the text passes what the call may mask, with the same answer.
--
-- Here a section spans all 500 pages of the guide (about 630 kB of text) and the call may mask
-- 100 kB; the entries the call's scans of ctxguard.document_pages return are counted
-- (pg_stat_get_xact_tuples_returned, this transaction's). With the default limit a section of 20
-- pages is read as before.
-- Runs as the superuser (the limit is a superuser setting; the section is inserted directly).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'

\ir ../lib/rows_returned.sql

BEGIN;
INSERT INTO ctxguard.document_sections (tenant_id, doc_id, section_id, title, page_start, page_end)
VALUES ('acme', 'acme_guide', 'whole_guide', 'The whole guide', 1, 500),
       ('acme', 'acme_guide', 'first_pages', 'The first pages', 1, 20);
SELECT pg_catalog.sum(pg_catalog.octet_length(coalesce(clean, body))) AS guide_bytes
  FROM ctxguard.document_pages WHERE tenant_id = 'acme' AND doc_id = 'acme_guide' \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-section') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null

SET LOCAL ctxguard.max_mask_bytes = '100kB';
SELECT pg_temp.rows_returned('ctxguard.document_pages') AS before \gset
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "whole_guide"}') AS refused \gset
SELECT pg_temp.rows_returned('ctxguard.document_pages') - :before AS read \gset

RESET ctxguard.max_mask_bytes;
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "first_pages"}') AS first \gset
SELECT coalesce(clean, body) AS page1 FROM ctxguard.document_pages
 WHERE tenant_id = 'acme' AND doc_id = 'acme_guide' AND page_no = 1 \gset
ROLLBACK;

SELECT cmp_ok(:guide_bytes::bigint, '>', 500000::bigint, 'fixture: the section''s text is far over the call''s 100 kB');
SELECT is(:'refused'::jsonb->'error'->>'code', 'RESULT_TOO_LARGE', 'a section larger than the call may mask is refused, as before');
SELECT cmp_ok(:read::bigint, '<', 150::bigint,
              format('and no more of it is read than that (%s page entries of 500)', :read));
SELECT is(:'first'::jsonb->>'status', 'ok', 'a section within the limit is read');
SELECT ok(starts_with(:'first'::jsonb->'result'->>'text', left(:'page1', 200)), 'starting with its first page');
SELECT is((:'first'::jsonb->'result'->>'page_end')::int, 20, 'to its last');

SELECT * FROM finish();
