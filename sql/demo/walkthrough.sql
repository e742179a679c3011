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
\echo '== 5. no context, no rows: the gateway role alone sees nothing'
SELECT count(*) AS invoices_visible_without_context FROM demo.invoices;

\echo
\echo '== 6. audit trail for acme (hashes and sizes, never values)'
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_table"}') \g /dev/null
SELECT to_char(at, 'HH24:MI:SS') AS at, user_id, page_type, entity_id, tool, decision, code, left(args_hash, 12) AS args_hash, result_bytes
  FROM ctxguard.audit_log ORDER BY id;
COMMIT;
