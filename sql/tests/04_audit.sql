-- Audit (core §7): every Gate B decision, hashes and sizes only, tenant-scoped, append-only.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set detail '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv5"}}'

BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'detail', NULL, 'trace-abc-123') \g /dev/null
SELECT ctxguard.call_tool('invoice.get', '{}')->>'call_id' AS ok_id \gset
SELECT ctxguard.call_tool('invoice.get', '{"invoice_id": "glx_inv1", "zz": "PLAINTEXT-SECRET"}')->>'call_id' AS bad_id \gset
SELECT ctxguard.call_tool('invoice.get', '{"invoice_id": "PLAINTEXT-SECRET"}')->>'call_id' AS spoof_id \gset
SELECT results_eq(format($$SELECT decision, code, tool, page_type, entity_id, trace_id, tenant_id, user_id FROM ctxguard.audit_log
                           WHERE call_id IN (%L, %L, %L) ORDER BY id$$, :'ok_id', :'bad_id', :'spoof_id'),
                  $$VALUES ('allow', NULL, 'invoice.get', 'invoice_detail', 'acme_inv5', 'trace-abc-123', 'acme', 'alice'),
                           ('deny', 'INVALID_ARGUMENT', 'invoice.get', 'invoice_detail', 'acme_inv5', 'trace-abc-123', 'acme', 'alice'),
                           ('deny', 'ENTITY_MISMATCH', 'invoice.get', 'invoice_detail', 'acme_inv5', 'trace-abc-123', 'acme', 'alice')$$,
                  'every allow and deny is audited with ids and codes');
SELECT ok((SELECT result_bytes > 0 AND args_hash ~ '^[0-9a-f]{64}$' FROM ctxguard.audit_log WHERE call_id = :'ok_id'), 'sizes and hashes recorded');
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log a WHERE row_to_json(a)::text LIKE '%PLAINTEXT-SECRET%'), 0,
          'argument values never reach the audit log');
COMMIT;

BEGIN;
SELECT ctxguard.set_context(:'tok_carol', '{"pageType": "vendor_table"}') \g /dev/null
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log WHERE tenant_id <> 'globex'), 0, 'another tenant''s audit rows are invisible');
SELECT ctxguard.call_tool('vendor.list', '{}') \g /dev/null
SELECT ok((SELECT count(*) FROM ctxguard.audit_log) > 0, 'own audit rows are visible');
SELECT throws_ok('DELETE FROM ctxguard.audit_log', '42501', NULL, 'audit is append-only (DELETE)');
SELECT throws_ok('TRUNCATE ctxguard.audit_log', '42501', NULL, 'audit is append-only (TRUNCATE)');
COMMIT;

SELECT * FROM finish();
