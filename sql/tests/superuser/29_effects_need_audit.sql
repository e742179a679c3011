-- Issue 29, items 2 and 3 (SECURITY_MATRIX M.73, M.74): a tool's effects commit only with its audit
-- record, and a call that leaves no record leaves no ledger charge the next caller inherits.
-- The audit record is made to fail with a DBA's CHECK on audit_log (the writer cannot write the
-- row, the caller's wait fails: AUDIT_UNAVAILABLE). Checked as the owner (this superuser session);
-- every call runs as ctxguard_gateway. Failed on main before: the invoice was paid and the
-- approval consumed with no allow row; the document's call counter was used up by refused calls.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- An open invoice of this file's own, and a call as the gateway role on its page.
DELETE FROM demo.invoices WHERE id = 'acme_inv29';
INSERT INTO demo.invoices (tenant_id, id, vendor_id, number, amount, status, issued_on, due_on)
SELECT tenant_id, 'acme_inv29', vendor_id, 'N-29', 29, 'open', issued_on, due_on
  FROM demo.invoices WHERE id = 'acme_inv1';
\set page29 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv29"}}'
CREATE FUNCTION pg_temp.as_gateway(tok text, page jsonb, tool text, args text, approve uuid DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page);
    PERFORM ctxguard.set_context(tok, page, ctxguard.begin_generation('conv-29'));
    IF approve IS NOT NULL THEN
        r := ctxguard.approve_call(approve);
    ELSE
        r := ctxguard.call_tool(tool, args::jsonb);
    END IF;
    RESET ROLE;
    RETURN r;
END $$;

-- 1. approve_call: the approved handler writes, its record fails: nothing of it stays.
BEGIN;
SELECT pg_temp.as_gateway(:'tok_alice', :'page29', 'invoice.mark_paid', '{}') AS pending \gset
COMMIT;
SELECT is((:'pending'::jsonb)->'error'->>'code', 'APPROVAL_REQUIRED', 'the write needs approval');
SELECT (:'pending'::jsonb)->>'call_id' AS cid \gset
ALTER TABLE ctxguard.audit_log ADD CONSTRAINT dba_no_paid CHECK (tool <> 'invoice.mark_paid' OR decision <> 'allow') NOT VALID;
BEGIN;
SELECT pg_temp.as_gateway(:'tok_alice', :'page29', NULL, NULL, :'cid') AS refused \gset
COMMIT;
SELECT is((:'refused'::jsonb)->'error'->>'code', 'AUDIT_UNAVAILABLE', 'approve_call: the record cannot be written, the call fails closed');
SELECT is((SELECT status FROM demo.invoices WHERE id = 'acme_inv29'), 'open', 'approve_call: the handler''s write is rolled back');
SELECT is((SELECT status FROM ctxguard.approvals WHERE call_id = :'cid'), 'pending', 'approve_call: the approval stays pending');
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log WHERE call_id = :'cid' AND decision = 'allow'), 0, 'approve_call: and no allow row');
ALTER TABLE ctxguard.audit_log DROP CONSTRAINT dba_no_paid;
BEGIN;
SELECT pg_temp.as_gateway(:'tok_alice', :'page29', NULL, NULL, :'cid') AS approved \gset
COMMIT;
SELECT is((:'approved'::jsonb)->'result'->>'updated', '1', 'once the record can be written, the same approval runs');
SELECT is((SELECT status FROM demo.invoices WHERE id = 'acme_inv29'), 'paid', 'and its write stays, with its record');
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log WHERE call_id = :'cid' AND decision = 'allow'), 1, 'one allow row');

-- 2. call_tool: a writing handler (test.touch) whose record fails leaves no row behind.
ALTER TABLE ctxguard.audit_log ADD CONSTRAINT dba_no_touch CHECK (tool <> 'test.touch') NOT VALID;
BEGIN;
SELECT pg_temp.as_gateway(:'tok_alice', :'page29', 'test.touch', '{}') AS touched \gset
COMMIT;
ALTER TABLE ctxguard.audit_log DROP CONSTRAINT dba_no_touch;
SELECT is((:'touched'::jsonb)->'error'->>'code', 'AUDIT_UNAVAILABLE', 'call_tool: the record cannot be written, the call fails closed');
SELECT is((SELECT count(*)::int FROM t.touches WHERE invoice_id = 'acme_inv29'), 0, 'call_tool: the handler''s row is rolled back');

-- 3. Document calls whose records fail: their document-call counts and bytes are given back, so
-- calls_per_document (10) is not used up by calls that returned nothing; what cannot be given
-- back (coverage) waits, bounded, and never rides on another caller's record.
\set docpage '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
CREATE FUNCTION pg_temp.doc_calls(tok text, page jsonb, n int) RETURNS TABLE (code text, held jsonb)
LANGUAGE plpgsql AS $$
DECLARE g uuid; r jsonb;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page);
    g := ctxguard.begin_generation('conv-29');
    PERFORM ctxguard.set_context(tok, page, g);
    FOR i IN 1..n LOOP
        r := ctxguard.call_tool('read_doc_pages', '{"doc_id": "acme_inv3_pdf", "page_start": 1, "page_end": 1}');
        code := coalesce(r->'error'->>'code', r->>'status');
        RESET ROLE;
        held := ctxguard.ledger_stats()->'this_backend';
        SET LOCAL ROLE ctxguard_gateway;
        RETURN NEXT;
    END LOOP;
    RESET ROLE;
END $$;
ALTER TABLE ctxguard.audit_log ADD CONSTRAINT dba_no_docs CHECK (tool <> 'read_doc_pages') NOT VALID;
BEGIN;
CREATE TEMP TABLE failed AS SELECT * FROM pg_temp.doc_calls(:'tok_alice', :'docpage', 12);
COMMIT;
ALTER TABLE ctxguard.audit_log DROP CONSTRAINT dba_no_docs;
SELECT is((SELECT array_agg(DISTINCT code) FROM failed), ARRAY['AUDIT_UNAVAILABLE'], '12 document calls, none audited');
SELECT is((SELECT max((held->>'call_changes')::int) FROM failed), 0, 'no charge of an unaudited call stays with the running call');
SELECT ok((SELECT max((held->>'leftover_changes')::int) FROM failed) <= 64, 'leftovers of unaudited calls stay bounded');
BEGIN;
CREATE TEMP TABLE later AS SELECT * FROM pg_temp.doc_calls(:'tok_alice', :'docpage', 10);
COMMIT;
SELECT is((SELECT array_agg(DISTINCT code) FROM later), ARRAY['ok'],
          'the same generation''s next 10 calls all run: unaudited calls used none of calls_per_document');
-- Another tenant on the same backend is not held back by anything the failed calls left.
BEGIN;
SELECT pg_temp.as_gateway(:'tok_carol', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv3"}}', 'invoice.get', '{}') AS other \gset
COMMIT;
SELECT is((:'other'::jsonb)->>'status', 'ok', 'another tenant''s call on this backend is audited and answered');
SELECT is((ctxguard.ledger_stats()->'this_backend'->>'leftover_changes')::int, 0, 'and the leftovers were queued at the transaction''s end');

DELETE FROM demo.invoices WHERE id = 'acme_inv29';
SELECT * FROM finish();
