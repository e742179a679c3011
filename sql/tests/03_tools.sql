-- SECURITY_MATRIX C: tools, Gate A, Gate B and entity binding. Runs as ctxguard_gateway, which reads
-- no table itself: what the handlers did is checked through tools (they run as ctxguard_tools) and
-- t.touched() (a definer that reads the context tenant's touches).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set detail '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
\set table_page '{"pageType": "invoice_table"}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT env->'error'->>'code' $$;

-- No context: nothing visible, nothing callable
SELECT is_empty('SELECT * FROM ctxguard.visible_tools()', 'no context: Gate A lists nothing');
SELECT is((SELECT count(*)::int FROM ctxguard.explain_tools() WHERE reason <> 'no_context'), 0, 'no context: explain says no_context');
SELECT is(pg_temp.code(ctxguard.call_tool('vendor.list', '{}')), 'CONTEXT_MISSING', 'no context: Gate B refuses');

-- Gate A per page
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "vendor_table"}') \g /dev/null
SELECT set_eq('SELECT name FROM ctxguard.visible_tools()', $$VALUES ('vendor.list'), ('test.boom'), ('test.sneaky_write'), ('test.set_identity'), ('test.numbers'), ('test.leaky'), ('test.huge'), ('test.slow'), ('test.injector'), ('list_available_tools'),
                       ('test.reenter'), ('test.twice'), ('test.twice_sql'), ('test.whoami'), ('test.noexec'), ('up.echo')$$,
              'Gate A on vendor_table');
SELECT ok((ctxguard.call_tool('vendor.list', '{}')->'result'->>'count')::int = 5, 'seed 000: vendor.list answers on vendor_table');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'detail') \g /dev/null
SELECT set_eq($$SELECT name FROM ctxguard.visible_tools() WHERE name NOT LIKE 'test.%'$$,
              $$VALUES ('invoice.get'), ('invoice.mark_paid'), ('list_available_tools'), ('read_doc_metadata'), ('read_doc_section'),
                       ('read_doc_pages'), ('doc_local_search'), ('up.echo')$$,
              'Gate A on invoice_detail');
SELECT is((SELECT input_schema FROM ctxguard.visible_tools() WHERE name = 'invoice.get'),
          '{"type": "object", "properties": {}, "additionalProperties": false}'::jsonb, 'C.19 bound param stripped from properties and required');
SELECT is((SELECT name FROM ctxguard.visible_tools('mark this invoice as paid', 1)), 'invoice.mark_paid', 'Gate A ranks by the query');
SELECT is((SELECT count(*)::int FROM ctxguard.visible_tools('invoice', 2)), 2, 'Gate A cuts at top_k');
-- The list is one materialized set (issue 34): the same rows whatever the call's position.
SELECT set_eq($$SELECT (ctxguard.visible_tools()).name$$, $$SELECT name FROM ctxguard.visible_tools()$$,
              'Gate A in a select list lists what it lists in FROM');
SELECT results_eq($$SELECT k, count(*)::int FROM pg_catalog.generate_series(1, 3) AS k,
                     LATERAL ctxguard.visible_tools('invoice', k) WITH ORDINALITY AS t GROUP BY k ORDER BY k$$,
                  $$VALUES (1, 1), (2, 2), (3, 3)$$, 'Gate A per row of a LATERAL join, each call with its own top_k');
SELECT is((SELECT row(t.name, t.read_only, t.danger, t.requires_approval, t.server, t.namespace)::text
             FROM ctxguard.visible_tools() AS t WHERE t.name = 'invoice.get'),
          '(invoice.get,t,safe,f,,invoice)', 'a listed tool''s columns: no upstream server is a NULL server');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'invoice.list'), 'wrong_page', 'explain: wrong_page');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'report.export'), 'missing_state', 'explain: missing_state');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'vendor.archive'), 'disabled', 'explain: disabled');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'legacy.export_all'), 'missing_policy', 'explain: missing_policy');
COMMIT;

-- C.16 policy-less and unknown tools look the same
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT is((SELECT count(*)::int FROM ctxguard.visible_tools() WHERE name = 'legacy.export_all'), 0, 'C.16 policy-less tool absent from Gate A');
SELECT is(ctxguard.call_tool('legacy.export_all', '{}')->'error', ctxguard.call_tool('no.such_tool', '{}')->'error',
          'C.16 policy-less and nonexistent tools give the same error');
SELECT is(pg_temp.code(ctxguard.call_tool('legacy.export_all', '{}')), 'TOOL_NOT_FOUND', 'C.16 TOOL_NOT_FOUND');
SELECT is(pg_temp.code(ctxguard.call_tool(E'bad name\u200b', '{}')), 'TOOL_NOT_FOUND', 'C.16 malformed name: TOOL_NOT_FOUND');
-- C.17 not allowed here: absent from Gate A and TOOL_NOT_VISIBLE
SELECT is(pg_temp.code(ctxguard.call_tool('invoice.get', '{"invoice_id": "acme_inv3"}')), 'TOOL_NOT_VISIBLE', 'C.17 wrong page');
SELECT is(pg_temp.code(ctxguard.call_tool('report.export', '{}')), 'TOOL_NOT_VISIBLE', 'C.17 missing state');
SELECT is(pg_temp.code(ctxguard.call_tool('vendor.archive', '{}')), 'TOOL_NOT_VISIBLE', 'C.17 disabled');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_table", "states": ["export-enabled"]}') \g /dev/null
SELECT is(ctxguard.call_tool('report.export', '{}')->>'status', 'ok', 'C.17 the state enables it');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'detail') \g /dev/null
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'invoice.mark_paid'), 'missing_role', 'C.17 viewer lacks the role');
SELECT is(pg_temp.code(ctxguard.call_tool('invoice.mark_paid', '{}')), 'TOOL_NOT_VISIBLE', 'C.17 missing role');
COMMIT;

-- C.18-C.20 entity binding
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'detail') \g /dev/null
SELECT is(ctxguard.call_tool('invoice.get', '{}')->'result'->>'id', 'acme_inv3', 'C.19 missing param filled from the context');
SELECT is(ctxguard.call_tool('invoice.get', '{"invoice_id": "acme_inv3"}')->'result'->>'number', 'ACME-2026-0003', 'C.19 equal param allowed');
SELECT is(pg_temp.code(ctxguard.call_tool('test.touch', jsonb_build_object('invoice_id', v))), 'ENTITY_MISMATCH', 'C.18/C.20 refused: ' || label)
  FROM (VALUES ('"acme_inv4"'::jsonb, 'same tenant, other invoice'), ('"glx_inv3"', 'other tenant''s invoice'),
               ('["acme_inv3"]', 'array'), ('{"id": "acme_inv3"}', 'object'), ('3', 'number'), ('null', 'null'),
               ('" acme_inv3"', 'leading space'), ('"acme_inv3 "', 'trailing space'), (to_jsonb(E'acme_inv3\u200b'::text), 'zero-width'),
               (to_jsonb(E'acme_inv\uff13'::text), 'fullwidth digit'), ('"ACME_INV3"', 'case')) AS c(v, label);
SELECT is((SELECT count(*)::int FROM t.touched()), 0, 'C.18 nothing executed on mismatch');
SELECT is(ctxguard.call_tool('test.touch', '{}')->>'status', 'ok', 'C.19 bound call runs');
SELECT results_eq('SELECT * FROM t.touched()', $$VALUES ('acme_inv3')$$, 'C.19 the handler saw the context entity');
COMMIT;

-- C.21-C.22 arguments
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('invoice.list', a)), 'INVALID_ARGUMENT', 'C.21 refused: ' || label)
  FROM (VALUES ('{"tenant_id": "globex"}'::jsonb, 'tenant_id key'), ('{"page": 2}', 'page key'), ('{"limit": "ten"}', 'wrong type'),
               ('{"limit": 100000}', 'out of range'), ('[]', 'not an object'), ('"x"', 'string'),
               (jsonb_build_object('status', repeat('x', 20000)), 'huge string'),
               ((repeat('{"a":', 200) || '1' || repeat('}', 200))::jsonb, 'deep JSON')) AS c(a, label);
SELECT is(pg_temp.code(ctxguard.call_tool('invoice.list', '{"status": "''; DROP TABLE demo.invoices; --"}')), 'INVALID_ARGUMENT', 'C.22 SQL text is data');
SELECT unalike(ctxguard.call_tool('invoice.list', '{"status": "''; DROP TABLE demo.invoices; --"}')->'error'->>'message', '%DROP%', 'C.22 the error does not echo it');
SELECT unalike(ctxguard.call_tool('invoice.list', '{"s3cr3t_key": 1}')->'error'->>'message', '%s3cr3t%', 'C.21 unknown keys are not echoed');
SELECT is((ctxguard.call_tool('invoice.list', '{}')->'result'->>'count')::int, 12, 'C.22 table intact');
-- ... and SQL text that reaches a handler is data there too: stored as given, the table it names intact.
SELECT ctxguard.call_tool('test.note', '{"note": "''; DROP TABLE demo.invoices; --"}') AS note \gset
SELECT is(:'note'::jsonb->>'status', 'ok', 'C.22 a handler takes free text');
SELECT is(:'note'::jsonb->'result'->>'stored', '''; DROP TABLE demo.invoices; --', 'C.22 the handler received the SQL text unchanged, as data');
SELECT is((:'note'::jsonb->'result'->>'invoices')::int, 12, 'C.22 the table it names is intact after the handler ran');
SELECT is((ctxguard.call_tool('invoice.list', '{"status": "overdue"}')->'result'->>'count')::int, 4, 'valid filter works');
COMMIT;

-- Results keep numbers exactly (no float round trip)
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'detail') \g /dev/null
SELECT is(ctxguard.call_tool('test.numbers', '{}')->'result', '{"big": 12345678901234567.89, "money": 0.10, "exp": 1e400, "neg": -0.0000001}'::jsonb,
          'handler numbers come back exactly');
-- jsonb equality ignores a numeric's scale: compare the digits as text too.
SELECT is(ctxguard.call_tool('test.numbers', '{}')->'result'->>'money', '0.10', 'a number keeps its scale (0.10, not 0.1)');
SELECT is(ctxguard.call_tool('test.numbers', '{}')->'result'->>'big', '12345678901234567.89', 'a big number keeps every digit');
SELECT is(ctxguard.call_tool('invoice.get', '{}')->'result'->>'amount', '1257.00', 'numeric(12,2) keeps its scale');
COMMIT;

-- C.23 read-only tools cannot write
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT is(ctxguard.call_tool('test.sneaky_write', '{}')->'error', '{"code": "TOOL_ERROR", "message": "tool handler failed (SQLSTATE 25006)"}'::jsonb,
          'C.23 write inside a read-only tool fails (25006)');
SELECT is((ctxguard.call_tool('invoice.list', '{"status": "paid"}')->'result'->>'count')::int, 4, 'C.23 nothing written');
SELECT is(current_setting('transaction_read_only'), 'off', 'C.23 caller''s transaction is read-write again');
COMMIT;

-- C.24 a raising handler: TOOL_ERROR, caller's transaction intact, audit kept, message not leaked
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT ctxguard.call_tool('test.boom', '{}') AS boom \gset
SELECT is(:'boom'::jsonb->'error'->>'code', 'TOOL_ERROR', 'C.24 TOOL_ERROR');
SELECT unalike(:'boom'::jsonb->'error'->>'message', '%secret-row%', 'C.24 handler message not passed on');
SELECT is((ctxguard.call_tool('invoice.list', '{}')->'result'->>'count')::int, 12, 'C.24 transaction still usable');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT results_eq(format('SELECT decision, code FROM ctxguard.audit_log WHERE call_id = %L', :'boom'::jsonb->>'call_id'),
                  $$VALUES ('error', 'TOOL_ERROR')$$, 'C.24 audit row committed');
COMMIT;

-- C.25 approvals: single use, bound to user
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'detail') \g /dev/null
SELECT ctxguard.call_tool('invoice.mark_paid', '{}') AS pending \gset
SELECT is(:'pending'::jsonb->'error'->>'code', 'APPROVAL_REQUIRED', 'C.25 APPROVAL_REQUIRED');
SELECT is(ctxguard.call_tool('invoice.get', '{}')->'result'->>'status', 'open', 'C.25 nothing ran yet');
COMMIT;
SELECT :'pending'::jsonb->>'call_id' AS cid \gset
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv3"}}') \g /dev/null
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'C.25 another tenant cannot approve');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'detail') \g /dev/null
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'C.25 another user cannot approve');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'detail') \g /dev/null
SELECT is(ctxguard.approve_call(:'cid')->'result', '{"invoice_id": "acme_inv3", "updated": 1}'::jsonb, 'C.25 the user approves: runs');
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'C.25 a second approval does nothing');
SELECT is(ctxguard.call_tool('invoice.get', '{}')->'result'->>'status', 'paid', 'C.25 ran exactly once');
COMMIT;

SELECT * FROM finish();
