-- The audit chain (issue 13; SECURITY_MATRIX E.34, I): verify_audit finds a row edited by the superuser.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
SELECT is(ctxguard.verify_audit('acme')->>'intact', 'true', 'acme''s chain holds');
SELECT ok((ctxguard.verify_audit('acme')->>'rows')::int > 0, 'and has rows');
BEGIN;
SELECT id AS victim FROM ctxguard.audit_log WHERE tenant_id = 'acme' AND row_hash IS NOT NULL ORDER BY id LIMIT 1 OFFSET 3 \gset
UPDATE ctxguard.audit_log SET result_bytes = coalesce(result_bytes, 0) + 1 WHERE id = :victim;
SELECT is((ctxguard.verify_audit('acme')->>'first_broken_id')::bigint, :victim::bigint, 'an edited row is the first broken link');
SELECT is(ctxguard.verify_audit('globex')->>'intact', 'true', 'another tenant''s chain is its own');
ROLLBACK;
BEGIN;
SELECT id AS victim FROM ctxguard.audit_log WHERE tenant_id = 'acme' AND row_hash IS NOT NULL ORDER BY id LIMIT 1 OFFSET 2 \gset
DELETE FROM ctxguard.audit_log WHERE id = :victim;
SELECT ok((ctxguard.verify_audit('acme')->>'first_broken_id')::bigint > :victim::bigint, 'a deleted row breaks the next link');
ROLLBACK;
SELECT ok((ctxguard.ledger_stats()->>'batches')::bigint > 0, 'the writer committed batches');
-- The ledger's tables have the sizes the server started with (whole buckets of 16 slots).
SELECT is((SELECT jsonb_object_agg(k, (ctxguard.ledger_stats()->'tables'->k->>'slots')::bigint)
             FROM unnest(ARRAY['ledger_generations', 'ledger_document_calls', 'ledger_coverage', 'ledger_user_days']) k),
          (SELECT jsonb_object_agg(k, ((current_setting('ctxguard.' || k)::bigint + 15) / 16) * 16)
             FROM unnest(ARRAY['ledger_generations', 'ledger_document_calls', 'ledger_coverage', 'ledger_user_days']) k),
          'ledger tables sized by the ctxguard.ledger_* settings');
SELECT ok((ctxguard.ledger_stats()->'tables'->'ledger_generations'->>'live')::int > 0
          AND (ctxguard.ledger_stats()->'tables'->'ledger_user_days'->>'live')::int > 0,
          'ledger_stats counts live entries (the suite charged generations and user-days)');
SELECT * FROM finish();
