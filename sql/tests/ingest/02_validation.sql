-- put_document / put_page / put_section validation (README: documents), as ctxguard_ingest: a document
-- becomes ready only with pages 1..n without gaps and sections within them; a changed page sends a
-- ready document back to processing (unreadable) until it is made ready again.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set lib '{"pageType": "document_library"}'
CREATE FUNCTION pg_temp.status(doc text) RETURNS text LANGUAGE sql AS $$ SELECT status FROM ctxguard.documents WHERE id = doc $$;
CREATE FUNCTION pg_temp.read(tok text, doc text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE g uuid;
BEGIN
    PERFORM ctxguard.set_context(tok, '{"pageType": "document_library"}');
    g := ctxguard.begin_generation('ingest-validation');
    PERFORM ctxguard.set_context(tok, '{"pageType": "document_library"}', g);
    RETURN ctxguard.call_tool('read_doc_pages', jsonb_build_object('doc_id', doc, 'page_start', 1, 'page_end', 1));
END $$;

-- Page gaps: pages 1 and 3 only cannot be made ready; the document stays processing.
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT ctxguard.put_document('val_gaps', 'Pages with a gap') \g /dev/null
SELECT ctxguard.put_page('val_gaps', 1, 'Page one.') \g /dev/null
SELECT ctxguard.put_page('val_gaps', 3, 'Page three.') \g /dev/null
SAVEPOINT s;
SELECT throws_ok($$SELECT ctxguard.put_document('val_gaps', 'Pages with a gap', 'ready')$$, '22023',
                 'ctxguard: a ready document needs pages numbered 1..n without gaps', 'a gap in the pages: not ready');
ROLLBACK TO s;
SELECT is(pg_temp.status('val_gaps'), 'processing', 'and the document stays processing');
-- Positive control: with the missing page, the same call succeeds.
SELECT ctxguard.put_page('val_gaps', 2, 'Page two.') \g /dev/null
SELECT is(ctxguard.put_document('val_gaps', 'Pages with a gap', 'ready')->>'page_count', '3', 'positive control: pages 1..3 make it ready');
SELECT is(pg_temp.status('val_gaps'), 'ready', 'ready');
-- A document without any page cannot be ready either.
SELECT ctxguard.put_document('val_empty', 'No pages') \g /dev/null
SAVEPOINT s;
SELECT throws_ok($$SELECT ctxguard.put_document('val_empty', 'No pages', 'ready')$$, '22023',
                 'ctxguard: a ready document needs pages numbered 1..n without gaps', 'no pages: not ready');
ROLLBACK TO s;
COMMIT;

-- Sections that do not fit: a section past the last page keeps the document from being ready.
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT ctxguard.put_document('val_sections', 'A section too long') \g /dev/null
SELECT ctxguard.put_page('val_sections', n, 'Section page ' || n || '.') FROM generate_series(1, 2) n \g /dev/null
SELECT ctxguard.put_section('val_sections', 'long', 'Too long', 1, 3) \g /dev/null
SAVEPOINT s;
SELECT throws_ok($$SELECT ctxguard.put_document('val_sections', 'A section too long', 'ready')$$, '22023',
                 'ctxguard: a section lies beyond the last page', 'a section beyond the last page: not ready');
ROLLBACK TO s;
SELECT is(pg_temp.status('val_sections'), 'processing', 'and the document stays processing');
SELECT throws_ok($$SELECT ctxguard.put_section('val_sections', 'rev', 'Reversed', 2, 1)$$, '22023',
                 'ctxguard: section pages must satisfy 1 <= page_start <= page_end', 'a reversed section is refused');
SELECT throws_ok($$SELECT ctxguard.put_section('val_sections', 'zero', 'Zero', 0, 1)$$, '22023',
                 'ctxguard: section pages must satisfy 1 <= page_start <= page_end', 'a section from page 0 is refused');
SELECT ctxguard.put_section('val_sections', 'long', 'Fits now', 1, 2) \g /dev/null
SELECT is(ctxguard.put_document('val_sections', 'A section too long', 'ready')->>'page_count', '2', 'positive control: the section within the pages');
COMMIT;

-- Other refusals of the writers.
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT throws_ok($$SELECT ctxguard.put_page('val_nosuch', 1, 'x')$$, '22023', 'ctxguard: document not found (put_document first)',
                 'a page of an unknown document');
SELECT throws_ok($$SELECT ctxguard.put_page('val_gaps', 0, 'x')$$, '22023', 'ctxguard: page_no must be 1..100000', 'page 0');
SELECT throws_ok($$SELECT ctxguard.put_document('val_gaps', 'x', 'done')$$, '22023', 'ctxguard: status must be processing, ready or failed',
                 'an unknown status');
COMMIT;

-- A ready document sent back to processing by a changed page: unreadable until ready again, and
-- then it reads the new text. An unchanged page leaves it ready.
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT ctxguard.put_page('val_gaps', 1, 'Page one.') \g /dev/null
SELECT is(pg_temp.status('val_gaps'), 'ready', 'the same text again: still ready');
COMMIT;
BEGIN;
SELECT is(pg_temp.read(:'tok_ingest', 'val_gaps')->'result'->'pages'->0->>'text', 'Page one.', 'positive control: the ready document reads');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT ctxguard.put_page('val_gaps', 1, 'Page one, revised.') \g /dev/null
SELECT is(pg_temp.status('val_gaps'), 'processing', 'a changed page sends the ready document back to processing');
COMMIT;
BEGIN;
SELECT is(pg_temp.read(:'tok_ingest', 'val_gaps')->'error'->>'code', 'DOCUMENT_NOT_READY', 'and it cannot be read meanwhile');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT ctxguard.put_document('val_gaps', 'Pages with a gap', 'ready') \g /dev/null
COMMIT;
BEGIN;
SELECT is(pg_temp.read(:'tok_ingest', 'val_gaps')->'result'->'pages'->0->>'text', 'Page one, revised.', 'ready again: the new text');
COMMIT;
-- put_document without a status sends a ready document back to processing too.
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', :'lib') \g /dev/null
SELECT ctxguard.put_document('val_gaps', 'Pages with a gap, renamed') \g /dev/null
SELECT is(pg_temp.status('val_gaps'), 'processing', 'put_document(..., processing) on a ready document: processing');
COMMIT;
BEGIN;
SELECT is(pg_temp.read(:'tok_ingest', 'val_gaps')->'error'->>'code', 'DOCUMENT_NOT_READY', 'unreadable again');
COMMIT;
SELECT * FROM finish();
