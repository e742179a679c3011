-- A short walkthrough of Gate A and Gate B, run as ctxguard_gateway by scripts/demo.sh.
-- psql variables: tok_alice (acme, ap_clerk), tok_bob (acme, viewer), tok_carol (globex, ap_clerk).
\set QUIET 1
\pset footer off
\pset border 1
SET client_min_messages = warning;
CREATE FUNCTION pg_temp.decision(env jsonb) RETURNS text LANGUAGE sql AS
$$ SELECT CASE env->>'status' WHEN 'ok' THEN 'ALLOW' ELSE 'DENY ' || (env->'error'->>'code') END $$;

\echo
\echo '== 1. alice (acme, ap_clerk) on vendor_table asks "what vendors do I have?"'
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "vendor_table", "entity": null}') \g /dev/null
\echo '-- Gate A: visible tools'
SELECT name, danger, read_only FROM ctxguard.visible_tools();
\echo '-- Gate B: vendor.list'
SELECT pg_temp.decision(r) AS decision, jsonb_path_query_array(r, '$.result.vendors[*].name') AS vendors
  FROM ctxguard.call_tool('vendor.list', '{}') r;
COMMIT;

\echo
\echo '== 2. alice opens invoice acme_inv3 (invoice_detail) and asks "summarize this invoice"'
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}') \g /dev/null
\echo '-- Gate A: visible tools (invoice_id is bound by the page, so it is not in the schema the model sees)'
SELECT name, input_schema, requires_approval FROM ctxguard.visible_tools();
\echo '-- Why the others are hidden (explain_tools)'
SELECT name, reason FROM ctxguard.explain_tools() WHERE NOT visible;
\echo '-- Gate B decisions'
SELECT label, pg_temp.decision(r) AS decision, coalesce(r->'result'->>'number', r->'error'->>'message') AS detail
  FROM (VALUES ('invoice.get {}                              ', ctxguard.call_tool('invoice.get', '{}')),
               ('invoice.get {"invoice_id":"acme_inv4"} (spoof)', ctxguard.call_tool('invoice.get', '{"invoice_id": "acme_inv4"}')),
               ('invoice.get {"invoice_id":"glx_inv3"} (tenant)', ctxguard.call_tool('invoice.get', '{"invoice_id": "glx_inv3"}')),
               ('invoice.list {} (not on this page)           ', ctxguard.call_tool('invoice.list', '{}')),
               ('invoice.get {"tenant_id":"globex"}           ', ctxguard.call_tool('invoice.get', '{"tenant_id": "globex"}')),
               ('invoice.mark_paid {}                        ', ctxguard.call_tool('invoice.mark_paid', '{}'))) AS c(label, r);
COMMIT;

\echo
\echo '== 3. bob (acme, viewer) on the same page: no mark_paid for him'
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}') \g /dev/null
SELECT name, reason FROM ctxguard.explain_tools() WHERE name LIKE 'invoice.%';
COMMIT;

\echo
\echo '== 4. carol (globex) claims to be on acme''s invoice: set_context refuses (same error as a missing invoice)'
BEGIN;
\set ON_ERROR_STOP 0
\set VERBOSITY terse
SELECT ctxguard.set_context(:'tok_carol', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
\set ON_ERROR_STOP 1
ROLLBACK;

\echo
\echo '== 5. the gateway role can only call ctxguard: even with a context, no direct reads, writes or handler calls'
\echo '--    (the tools run their handlers as their run_as role, ctxguard_tools, which holds the table privileges)'
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv6"}}') \g /dev/null
\set ON_ERROR_STOP 0
\set VERBOSITY terse
SAVEPOINT s;
UPDATE demo.invoices SET status = 'paid' WHERE id = 'acme_inv6';
ROLLBACK TO s;
SELECT demo.invoice_mark_paid('{"invoice_id": "acme_inv6"}');
ROLLBACK TO s;
SELECT ctxguard.sync_mcp_tools('any', '[]');
ROLLBACK TO s;
\set ON_ERROR_STOP 1
ROLLBACK;

\echo
\echo '== 6. documents (seed 003): alice views the 500-page guide in one generation'
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}') \g /dev/null
SELECT ctxguard.begin_generation('demo-conversation') AS gen \gset
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}', :'gen') \g /dev/null
\echo '-- page 42 as the model sees it (masked; running header and footer stripped)'
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 42, "page_end": 42}')->'result'->'pages'->0->>'text' AS page_42;
SELECT label, pg_temp.decision(r) AS decision,
       coalesce(left(r->'error'->>'message', 60), r->'result'->>'tokens' || ' tokens' || coalesce(', trimmed: ' || (r->'result'->>'trimmed'), '')) AS detail
  FROM (VALUES ('read_doc_pages 40-44                           ', ctxguard.call_tool('read_doc_pages', '{"page_start": 40, "page_end": 44}')),
               ('read_doc_pages 1-6                             ', ctxguard.call_tool('read_doc_pages', '{"page_start": 1, "page_end": 6}')),
               ('doc_local_search "TLS certificate rotation"    ', ctxguard.call_tool('doc_local_search', '{"query": "TLS certificate rotation"}')),
               ('read_doc_section ch7                           ', ctxguard.call_tool('read_doc_section', '{"section_id": "ch7"}')),
               ('read_doc_pages 100-104                         ', ctxguard.call_tool('read_doc_pages', '{"page_start": 100, "page_end": 104}')),
               ('read_doc_pages 105-109                         ', ctxguard.call_tool('read_doc_pages', '{"page_start": 105, "page_end": 109}')),
               ('read_doc_pages {"doc_id":"acme_inv3_pdf"} spoof', ctxguard.call_tool('read_doc_pages', '{"doc_id": "acme_inv3_pdf", "page_start": 1, "page_end": 1}'))) AS c(label, r);
COMMIT;

\echo
\echo '== 7. seed 004: alice on the matter "Smith v. Jones"'
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "matter_overview", "entity": {"type": "matter", "id": "25e70284-6124-4a2b-9c89-abc123def456"}}') \g /dev/null
SELECT ctxguard.begin_generation('demo-matter') AS gen \gset
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "matter_overview", "entity": {"type": "matter", "id": "25e70284-6124-4a2b-9c89-abc123def456"}}', :'gen') \g /dev/null
SELECT label, pg_temp.decision(r) AS decision, coalesce(r->'error'->>'message', 'ok') AS detail, r->'error'->'details'->'available_documents' AS available
  FROM (VALUES ('read_doc_section smith_agreement/termination', ctxguard.call_tool('read_doc_section', '{"doc_id": "smith_agreement", "section_id": "termination"}')),
               ('read_doc_metadata smith_deposition (processing)', ctxguard.call_tool('read_doc_metadata', '{"doc_id": "smith_deposition"}')),
               ('read_doc_metadata coyote_complaint (other matter)', ctxguard.call_tool('read_doc_metadata', '{"doc_id": "coyote_complaint"}'))) AS c(label, r);
COMMIT;

\echo
\echo '== 8. audit trail for acme (hashes, sizes, mask counts, budget state; never values)'
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_table"}') \g /dev/null
SELECT to_char(at, 'HH24:MI:SS') AS at, user_id, page_type, tool, decision, code, doc_id, result_bytes AS bytes, masked,
       budget->>'bytes_used' AS gen_bytes
  FROM ctxguard.audit_log ORDER BY id;
COMMIT;
