-- Documents (issue: documents): seed 003/004 tools, SECURITY_MATRIX D (budgets) and E (masking, audit).
-- Runs as ctxguard_gateway against the demo documents (sql/demo/documents.sql).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'
\set table_page '{"pageType": "invoice_table"}'
\set library '{"pageType": "document_library"}'
\set smith '{"pageType": "matter_overview", "entity": {"type": "matter", "id": "25e70284-6124-4a2b-9c89-abc123def456"}}'
\set inv3 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
-- Start a generation for `tok` on `page` (context, mint, context again with the generation).
CREATE FUNCTION pg_temp.gen(tok text, page jsonb) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE g uuid;
BEGIN
    PERFORM ctxguard.set_context(tok, page);
    g := ctxguard.begin_generation('test');
    PERFORM ctxguard.set_context(tok, page, g);
    RETURN g;
END $$;

-- The page text itself is not readable, and ingestion is not for the gateway
SELECT throws_ok('SELECT body FROM ctxguard.document_pages', '42501', NULL, 'page text has no grant');
SELECT throws_ok($$SELECT ctxguard.put_document('x', 'y')$$, '42501', NULL, 'ingestion is not the gateway''s');
SELECT throws_ok($$SELECT ctxguard.set_tool_policy('read_doc_pages', '{"page_types": "*"}')$$, '42501', NULL, 'policies are the DBA''s');

-- Document tools need a generation (budgets hang off it)
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_metadata', '{}')), 'CONTEXT_MISSING', 'no generation: document tools refuse');
COMMIT;

-- Seed 003 shapes, headers/footers stripped, search scoped to the document
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.call_tool('read_doc_metadata', '{}') AS meta \gset
SELECT is(:'meta'::jsonb->'result'->>'page_count', '500', 'metadata: page count');
SELECT is(:'meta'::jsonb->'result'->>'product_version', '4.2', 'metadata: product version');
SELECT is(jsonb_array_length(:'meta'::jsonb->'result'->'sections'), 51, 'metadata: sections');
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 45}') AS pages \gset
SELECT is(jsonb_array_length(:'pages'::jsonb->'result'->'pages'), 5, 'read_doc_pages: 5 pages');
SELECT unalike(:'pages'::jsonb->'result'->>'pages', '%Confidential%', 'running header stripped');
SELECT unalike(:'pages'::jsonb->'result'->>'pages', '%Page 41 of 500%', 'running footer stripped');
SELECT ok((:'pages'::jsonb->'result'->>'tokens')::int > 0, 'read_doc_pages reports tokens');
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') AS sec \gset
SELECT is((:'sec'::jsonb->'result'->>'page_start') || '-' || (:'sec'::jsonb->'result'->>'page_end'), '1-3', 'section: page range');
SELECT is((:'sec'::jsonb->'result'->>'tokens')::int, (octet_length(:'sec'::jsonb->'result'->>'text') + 3) / 4, 'section: tokens = ceil(bytes/4)');
COMMIT;
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "ch7"}') AS ch7 \gset
SELECT is(:'ch7'::jsonb->'result'->>'trimmed', 'section_tokens', 'a long section is trimmed and marked');
SELECT ok(octet_length(:'ch7'::jsonb->'result'->>'text') <= 8000, 'trimmed to ~2k tokens');
SELECT pg_temp.gen(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.call_tool('doc_local_search', '{"query": "certificate rotation", "max_results": 9}') AS hits \gset
SELECT is(jsonb_array_length(:'hits'::jsonb->'result'->'results'), 5, 'search: capped at 5 results');
SELECT is(:'hits'::jsonb->'result'->>'max_results_capped_to', '5', 'search: the cap is reported');
SELECT alike(:'hits'::jsonb->'result'->'results'->0->>'snippet', '%«%»%', 'search: snippet marks the match');
SELECT is(jsonb_array_length(ctxguard.call_tool('doc_local_search', '{"query": "VOLCANO"}')->'result'->'results'), 0,
          'search is scoped to the one document (a term of another document finds nothing)');
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_section', '{"section_id": "nope"}')), 'NOT_FOUND', 'unknown section');
SELECT ctxguard.call_tool('doc_local_search', '{"query": "search for certificate rotation"}') AS anyword \gset
SELECT is(:'anyword'::jsonb->'result'->>'matched', 'any_word', 'search: with no page holding every word, any word may match');
SELECT ok(jsonb_array_length(:'anyword'::jsonb->'result'->'results') > 0, 'search: the fallback finds pages');
SELECT is(ctxguard.call_tool('doc_local_search', '{"query": "certificate rotation"}')->'result'->>'matched', 'all_words', 'search: all words first');
SELECT ok(ctxguard.call_tool('list_available_tools', '{}')->'result'->'tools' ? 'read_doc_pages', 'list_available_tools');
COMMIT;

-- Two tenants' documents with the same id ('twin', sql/tests/fixtures.sql): each tenant searches and
-- reads only its own, and each finds its own term (the positive control)
\set twin '{"pageType": "document_viewer", "entity": {"type": "document", "id": "twin"}}'
BEGIN;
SELECT pg_temp.gen(:'tok_carol', :'twin') \g /dev/null
SELECT is(jsonb_array_length(ctxguard.call_tool('doc_local_search', '{"query": "VOLCANO"}')->'result'->'results'), 1,
          'positive control: globex finds VOLCANO in its twin');
SELECT is(jsonb_array_length(ctxguard.call_tool('doc_local_search', '{"query": "checklist"}')->'result'->'results'), 0,
          'globex does not find acme''s term in the document with the same id');
SELECT alike(ctxguard.call_tool('read_doc_pages', '{"page_start": 1, "page_end": 1}')->'result'->'pages'->0->>'text', 'Globex twin page%',
             'globex reads its own twin');
COMMIT;
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'twin') \g /dev/null
SELECT is(jsonb_array_length(ctxguard.call_tool('doc_local_search', '{"query": "checklist"}')->'result'->'results'), 1,
          'positive control: acme finds its checklist in its twin');
SELECT is(jsonb_array_length(ctxguard.call_tool('doc_local_search', '{"query": "VOLCANO"}')->'result'->'results'), 0,
          'another tenant''s term finds nothing, in a document with the same id');
SELECT alike(ctxguard.call_tool('read_doc_pages', '{"page_start": 1, "page_end": 1}')->'result'->'pages'->0->>'text', 'Acme twin page%',
             'acme reads its own twin');
COMMIT;

-- Binding on the viewer page; another tenant's document and a nonexistent one look the same
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'viewer') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_pages', '{"doc_id": "acme_inv3_pdf", "page_start": 1, "page_end": 1}')), 'ENTITY_MISMATCH',
          'viewer page: another document is a spoof');
SELECT pg_temp.gen(:'tok_alice', :'library') \g /dev/null
SELECT is(ctxguard.call_tool('read_doc_metadata', '{"doc_id": "glx_handbook"}')->'error',
          ctxguard.call_tool('read_doc_metadata', '{"doc_id": "no_such_doc"}')->'error', 'other tenant''s and nonexistent documents: same error');
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_metadata', '{"doc_id": "glx_handbook"}')), 'NOT_FOUND', 'NOT_FOUND');
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_metadata', '{"doc_id": "acme_guide"}')), 'ok', 'list page: any visible document');
COMMIT;
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', '{"pageType": "document_viewer", "entity": {"type": "document", "id": "glx_handbook"}}'),
                 '22023', 'ctxguard: invalid page context: entity not found', 'viewer of another tenant''s document refused');
COMMIT;

-- Detail page: only the entity's linked documents (the invoice and its PDF)
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'inv3') \g /dev/null
SELECT alike(ctxguard.call_tool('read_doc_pages', '{"doc_id": "acme_inv3_pdf", "page_start": 1, "page_end": 1}')->'result'->'pages'->0->>'text',
             '%Total 1,257.00 EUR%', 'invoice page reads its PDF');
SELECT is(ctxguard.call_tool('read_doc_metadata', '{"doc_id": "acme_guide"}')->'error'->'details'->'available_documents',
          '[{"doc_id": "acme_inv3_pdf", "title": "Invoice ACME-2026-0003.pdf", "status": "ready"}]'::jsonb,
          'invoice page: unrelated document refused, the invoice''s documents listed');
COMMIT;

-- Seed 004: matter context
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'smith') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_section', '{"doc_id": "smith_agreement", "section_id": "termination"}')), 'ok', 'matter document readable');
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_metadata', '{"doc_id": "smith_deposition"}')), 'DOCUMENT_NOT_READY', 'processing document: DOCUMENT_NOT_READY');
SELECT ctxguard.call_tool('read_doc_metadata', '{"doc_id": "coyote_complaint"}') AS other \gset
SELECT is(pg_temp.code(:'other'::jsonb), 'NOT_FOUND', 'document of another matter: NOT_FOUND');
SELECT is((SELECT jsonb_agg(d->>'doc_id' ORDER BY d->>'doc_id') FROM jsonb_array_elements(:'other'::jsonb->'error'->'details'->'available_documents') d),
          '["smith_agreement", "smith_deposition"]'::jsonb, 'the matter''s available documents are listed (titles and ids)');
SELECT is(:'other'::jsonb->'error'->'details'->'available_documents', ctxguard.call_tool('read_doc_metadata', '{"doc_id": "glx_handbook"}')->'error'->'details'->'available_documents',
          'another tenant''s document: the same answer');
COMMIT;

-- D.26 six pages in one read; invalid ranges
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 1, "page_end": 6}') AS six \gset
SELECT is(pg_temp.code(:'six'::jsonb), 'RATE_LIMIT_EXCEEDED', 'D.26 6 pages refused');
SELECT alike(:'six'::jsonb->'error'->>'message', 'pages_per_call:%', 'D.26 the limit is named');
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_pages', '{"page_start": 499, "page_end": 501}')), 'INVALID_ARGUMENT', 'beyond the last page');
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_pages', '{"page_start": 5, "page_end": 4}')), 'INVALID_ARGUMENT', 'reversed range');
COMMIT;

-- D.27 the 11th call on a document in one generation
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'viewer') AS g27 \gset
SELECT is(array_agg(pg_temp.code(ctxguard.call_tool('doc_local_search', '{"query": "zzzqqq"}')) ORDER BY i),
          array_fill('ok'::text, ARRAY[10]) || 'RATE_LIMIT_EXCEEDED'::text, 'D.27 ten calls pass, the 11th is refused')
  FROM generate_series(1, 11) i;
SELECT alike(ctxguard.call_tool('read_doc_metadata', '{}')->'error'->>'message', 'calls_per_document:%', 'D.27 calls_per_document named');
COMMIT;

-- D.27/D.31 reading 1..N in 5-page windows: the byte budget trims, then refuses; every tool counts
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'viewer') AS g31 \gset
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory"}') \g /dev/null
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') \g /dev/null
CREATE TEMP TABLE windows AS
SELECT i, ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', 100 + i * 5 + 1, 'page_end', 100 + i * 5 + 5)) AS r
  FROM generate_series(0, 7) i;
SELECT ok(EXISTS (SELECT 1 FROM windows WHERE r->'result'->>'trimmed' = 'bytes_per_generation'), 'D.27 a read near the limit is trimmed and marked');
SELECT ok(EXISTS (SELECT 1 FROM windows WHERE r->'error'->>'message' LIKE 'bytes_per_generation:%'), 'D.27 then reads are refused');
SELECT ok((SELECT sum(result_bytes) FROM ctxguard.audit_log WHERE generation = :'g31') <= 20480, 'D.27 at most 20 KB returned in the generation');
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log WHERE generation = :'g31' AND tool IN ('doc_local_search', 'read_doc_section') AND result_bytes > 0), 2,
          'D.31 search snippets and section reads were charged too');
SELECT is((SELECT (budget->>'bytes_used')::bigint FROM ctxguard.audit_log WHERE generation = :'g31' AND decision = 'allow' ORDER BY id DESC LIMIT 1),
          (SELECT sum(result_bytes) FROM ctxguard.audit_log WHERE generation = :'g31'), 'D.31 one budget: bytes used = bytes returned');
COMMIT;
-- Registered tools share the byte budget
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'table_page') \g /dev/null
SELECT alike(ctxguard.call_tool('test.huge', '{}')->'error'->>'message', 'bytes_per_generation:%', 'a registered tool''s oversize result is refused');
COMMIT;

-- D.30 page iteration spread over many generations: the coverage limit stops it (30% of 500 = 150 pages)
CREATE FUNCTION pg_temp.iterate(tok text, page jsonb, windows int) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE out text[] := '{}'; r jsonb;
BEGIN
    FOR i IN 0 .. windows - 1 LOOP
        PERFORM pg_temp.gen(tok, page);
        r := ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', i * 5 + 1, 'page_end', i * 5 + 5));
        out := out || coalesce(split_part(r->'error'->>'message', ':', 1), 'ok');
    END LOOP;
    RETURN out;
END $$;
BEGIN;
SELECT pg_temp.iterate(:'tok_dave', :'viewer', 32) AS walk \gset
SELECT is((:'walk'::text[])[1:30], array_fill('ok'::text, ARRAY[30]), 'D.30 30 windows (150 pages) in 30 generations pass');
SELECT is((:'walk'::text[])[31:32], ARRAY['document_coverage', 'document_coverage'], 'D.30 the 31st is stopped by document_coverage');
SELECT pg_temp.gen(:'tok_dave', :'viewer') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('read_doc_pages', '{"page_start": 26, "page_end": 30}')), 'ok', 'D.30 re-reading pages already read is allowed');
COMMIT;

-- E.32/E.33 masking of each kind, in documents and in registered tools; counts in the audit row
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'viewer') \g /dev/null
CREATE TEMP TABLE pii AS
SELECT p, ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', p, 'page_end', p)) AS r FROM unnest(ARRAY[42, 77, 99, 123]) p;
SELECT unalike((SELECT string_agg(r::text, ' ') FROM pii), pat, 'E.32 masked: ' || label)
  FROM (VALUES ('%ivan.petrov@%', 'email'), ('%1234 5678%', 'phone'), ('%4111 1111 1111 1111%', 'card'), ('%DE89 3704%', 'IBAN'),
               ('%sk-proj-%', 'OpenAI key'), ('%AKIAIOSFODNN7%', 'AWS key'), ('%ｉｖａｎ＠%', 'fullwidth email'),
               ('%４１１１%', 'fullwidth dashed card')) AS c(pat, label);
SELECT alike((SELECT r->'result'->'pages'->0->>'text' FROM pii WHERE p = 77), '%[REDACTED:card_number]%[REDACTED:iban]%', 'E.32 replaced by typed markers');
SELECT is((SELECT masked FROM ctxguard.audit_log WHERE call_id = (SELECT (r->>'call_id')::uuid FROM pii WHERE p = 123)),
          '{"email": 1, "card_number": 1}'::jsonb, 'E.33 obfuscated variants counted in the audit row');
SELECT ctxguard.call_tool('test.leaky', '{}') AS leaky \gset
SELECT is(:'leaky'::jsonb->'result'->>'note', 'mail [REDACTED:email], token [REDACTED:bearer_token], aws [REDACTED:aws_access_key]',
          'E.32 registered handlers are masked too');
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log a WHERE row_to_json(a)::text ~ 'ivan\.petrov|4111 1111|AKIAIOSFODNN7|ops@acme|REDACTED|replication lag|Orion Platform'), 0, 'E.34 no text in audit rows');
COMMIT;

SELECT * FROM finish();
