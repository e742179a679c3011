-- The demo app's read API (sql/demo/app.sql): every screen is read under the page context it
-- names, so it cannot show another page's record, another tenant's rows or page text of another
-- document. Runs as ctxguard_app, the screens' own role (not a superuser, owns nothing); the role
-- that runs model calls cannot execute any of this (09_handlers.sql).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set guide '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}, "pageState": {"filters": {"page": 42}}}'
\set inv_pdf '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_inv3_pdf"}}'
\set inv3 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
\set smith '{"pageType": "matter_overview", "entity": {"type": "matter", "id": "25e70284-6124-4a2b-9c89-abc123def456"}}'

SELECT ok(NOT rolsuper AND NOT rolbypassrls, 'running as a role that RLS applies to') FROM pg_roles WHERE rolname = current_user;
SELECT is(current_user::text, 'ctxguard_app', 'running as the app''s role');

-- No context: nothing.
SELECT throws_ok('SELECT demo.page_data()', '28000', 'ctxguard: no context is set', 'no context, no screen');
SELECT is(demo.viewer_page(1), NULL, 'no context, no page text');

-- Lists are the token's tenant's, whatever the page state claims.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "vendor_table", "pageState": {"visibleIds": ["glx_v1"]}}') \g /dev/null
SELECT is((SELECT array_agg(v->>'id' ORDER BY v->>'id') FROM jsonb_array_elements(demo.page_data()->'vendors') v),
          ARRAY['acme_v1', 'acme_v2', 'acme_v3', 'acme_v4', 'acme_v5'], 'vendor table: acme''s five vendors only');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', '{"pageType": "invoice_table", "pageState": {"tab": "overdue"}}') \g /dev/null
SELECT ok((SELECT bool_and(i->>'status' = 'overdue' AND i->>'id' LIKE 'glx_%') FROM jsonb_array_elements(demo.page_data()->'invoices') i),
          'invoice table: the tab filters, globex rows only');
SELECT is((demo.page_data()->'tabs'->>'all')::int, 12, 'tab counts are the tenant''s');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_table", "pageState": {"tab": "deleted"}}') \g /dev/null
SELECT throws_ok('SELECT demo.page_data()', '22023', 'ctxguard: unknown invoice tab', 'an unknown tab is refused, not ignored');
COMMIT;

-- A detail screen shows the context's entity, nothing else.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv3') \g /dev/null
SELECT is(demo.page_data()#>>'{invoice,number}', 'ACME-2026-0003', 'invoice detail: the page''s invoice');
SELECT is(demo.page_data()#>>'{invoice,documents,0,doc_id}', 'acme_inv3_pdf', 'with its linked document');
SELECT is(demo.viewer_page(1), NULL, 'no page text on an invoice page');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'smith') \g /dev/null
SELECT is((SELECT array_agg(d->>'id' ORDER BY d->>'id') FROM jsonb_array_elements(demo.page_data()->'documents') d),
          ARRAY['smith_agreement', 'smith_deposition'], 'matter overview: the matter''s documents only');
COMMIT;

-- The viewer: the context's document, the requested page clamped to the document.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'guide') \g /dev/null
SELECT is(demo.page_data()#>>'{page,page}', '42', 'viewer: the page of the page state');
SELECT ok(demo.page_data()#>>'{page,text}' LIKE '%ivan.petrov@orion-support.example%', 'the human viewer sees the page unmasked');
SELECT is(demo.page_data()#>>'{document,pages}', '500', 'and the page count');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_inv3_pdf"}, "pageState": {"filters": {"page": 9999}}}') \g /dev/null
SELECT is(demo.page_data()#>>'{page,page}', '1', 'a page past the end shows the last page');
SELECT alike(demo.page_data()#>>'{page,text}', '%Total 1,257.00 EUR%', 'of the context''s document');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}, "pageState": {"filters": {"page": "1; DROP"}}}') \g /dev/null
SELECT throws_ok('SELECT demo.page_data()', '22023', 'ctxguard: the viewer page must be a page number', 'a non-numeric page is refused');
COMMIT;

-- Another tenant's document or invoice never becomes a context; the definer function reads
-- only the tenant's rows of the context's document.
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_carol', :'guide'), '22023', 'ctxguard: invalid page context: entity not found',
                 'globex cannot open acme''s document');
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_carol', :'inv3'), '22023', 'ctxguard: invalid page context: entity not found',
                 'nor acme''s invoice (same message as a missing one)');
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', '{"pageType": "document_viewer", "entity": {"type": "document", "id": "glx_handbook"}}') \g /dev/null
SELECT alike(demo.viewer_page(1)->>'text', 'Globex handbook page 1%', 'globex reads its own handbook');
COMMIT;
SELECT throws_ok('SELECT body FROM ctxguard.document_pages', '42501', NULL, 'page text is not granted to the app role either');
SELECT throws_ok($$SELECT ctxguard.put_page('acme_guide', 1, 'x')$$, '42501', NULL, 'nor writable');

SELECT * FROM finish();
