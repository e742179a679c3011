-- 13_ledger.sql: a read-only tool call in a session of its own (its first call looks up the
-- extension's owner), run as the gateway role; prints "<status>|<xid or none>".
-- In: tok (a token of alice, acme).
\set QUIET 1
BEGIN;
SELECT FROM ctxguard.set_context(:'tok', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT FROM ctxguard.visible_tools();
SELECT ctxguard.call_tool('invoice.get', '{}')->>'status' AS status, coalesce(txid_current_if_assigned()::text, 'none') AS xid \gset
COMMIT;
\echo :status|:xid
