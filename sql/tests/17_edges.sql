-- Issue 17 as the gateway role: a document page may name what it lies within (seed 004's matter), and
-- the database checks it; the lifetimes the gateway renews generations by; explain_tools says where
-- each visible tool lands in the model's list.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set smith_doc '{"pageType": "document_viewer", "entity": {"type": "document", "id": "smith_agreement", "within": {"type": "matter", "id": "25e70284-6124-4a2b-9c89-abc123def456"}}}'
\set foreign_matter '{"pageType": "document_viewer", "entity": {"type": "document", "id": "smith_agreement", "within": {"type": "matter", "id": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"}}}'
\set other_matter '{"pageType": "document_viewer", "entity": {"type": "document", "id": "smith_agreement", "within": {"type": "matter", "id": "6f1c2d9e-1b7a-4c55-9d2e-0a1b2c3d4e5f"}}}'
\set unknown_matter '{"pageType": "document_viewer", "entity": {"type": "document", "id": "smith_agreement", "within": {"type": "matter", "id": "00000000-0000-4000-8000-000000000000"}}}'
\set not_a_document '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3", "within": {"type": "vendor", "id": "v1"}}}'
\set inv3 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'

-- entity.within: the document's own matter, in the caller's tenant; anything else is refused like a
-- foreign entity, and no context is left behind. (COMMIT, not ROLLBACK: pgTAP keeps its results in
-- the session's tables.)
BEGIN;
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'smith_doc'), 'a document within its own matter');
SELECT is(ctxguard.context()->'entity'->'within', '{"type": "matter", "id": "25e70284-6124-4a2b-9c89-abc123def456"}'::jsonb,
          'the context carries what the document lies within');
SELECT is(ctxguard.entity_id(), 'smith_agreement', 'the page''s entity is the document');
COMMIT;
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'foreign_matter'), '22023',
                 'ctxguard: invalid page context: entity not found', 'another tenant''s matter with the user''s document');
COMMIT;
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'other_matter'), '22023',
                 'ctxguard: invalid page context: entity not found', 'a matter of the user''s tenant that is not the document''s');
COMMIT;
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'unknown_matter'), '22023',
                 'ctxguard: invalid page context: entity not found', 'a matter that does not exist');
COMMIT;
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_carol', :'smith_doc'), '22023',
                 'ctxguard: invalid page context: entity not found', 'another tenant''s document within its own matter');
COMMIT;
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'not_a_document'), '22023',
                 'ctxguard: invalid page context: entity not found', 'within is known for documents only');
COMMIT;
SELECT is(ctxguard.context(), NULL, 'no refused page was ever set');

-- effective_ttls: the settings without a context; the same for a tenant without overrides.
SELECT results_eq('SELECT generation_ttl, approval_ttl, external_call_ttl FROM ctxguard.effective_ttls()',
                  $$SELECT (SELECT setting::int FROM pg_settings WHERE name = 'ctxguard.generation_ttl'),
                           (SELECT setting::int FROM pg_settings WHERE name = 'ctxguard.approval_ttl'),
                           (SELECT setting::int FROM pg_settings WHERE name = 'ctxguard.external_call_ttl')$$,
                  'effective_ttls without a context: the settings');
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv3') \g /dev/null
SELECT results_eq('SELECT generation_ttl FROM ctxguard.effective_ttls()',
                  $$SELECT setting::int FROM pg_settings WHERE name = 'ctxguard.generation_ttl'$$,
                  'a tenant without an override: the setting');
SELECT throws_ok('INSERT INTO ctxguard.tenant_limits (tenant_id, generation_ttl) VALUES (''acme'', 2)', '42501', NULL,
                 'the gateway role cannot set a tenant''s lifetimes');
COMMIT;

-- explain_tools(query, top_k): where each visible tool lands in visible_tools(query, top_k).
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv3') \g /dev/null
SELECT is((SELECT count(*) FROM ctxguard.explain_tools() WHERE visible AND offered IS NOT TRUE), 0::bigint,
          'without top_k every visible tool is offered');
SELECT is((SELECT count(*) FROM ctxguard.explain_tools() WHERE NOT visible AND offered IS NOT NULL), 0::bigint,
          'a tool that is not visible is neither offered nor left out');
SELECT is((SELECT array_agg(name ORDER BY name) FROM ctxguard.explain_tools('vendor list documents search', 2) WHERE offered),
          (SELECT array_agg(name ORDER BY name) FROM ctxguard.visible_tools('vendor list documents search', 2)),
          'explain_tools offers what visible_tools lists');
SELECT ok((SELECT bool_and(p.entity_type = 'invoice') FROM ctxguard.explain_tools('vendor list documents search', 2) e
             JOIN ctxguard.tool_policies p ON p.tool = e.name WHERE e.offered),
          'the page''s own entity tools come first, whatever the message says');
SELECT is((SELECT array_agg(DISTINCT e.left_out) FROM ctxguard.explain_tools('vendor list documents search', 2) e
             JOIN ctxguard.tools t ON t.name = e.name WHERE e.visible AND NOT e.offered AND t.server IS NULL),
          ARRAY['top_k'], 'the DBA''s other tools are left out below the cut');
SELECT is((SELECT coalesce(bool_and(e.left_out = 'page_tools_first'), true) FROM ctxguard.explain_tools('vendor list documents search', 2) e
             JOIN ctxguard.tools t ON t.name = e.name WHERE e.visible AND NOT e.offered AND t.server IS NOT NULL),
          true, 'upstream tools are left out because the page''s own tools filled the list');
COMMIT;

SELECT * FROM finish();
