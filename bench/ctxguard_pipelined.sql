-- The ctxguard transaction of ctxguard.sql, sent as the gateway sends it: pipelined (one round
-- trip), with a plain BEGIN. The baseline of ctxguard_pinned.sql.
\startpipeline
BEGIN;
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT count(*) FROM ctxguard.visible_tools();
SELECT ctxguard.call_tool('invoice.get', '{}');
COMMIT;
\endpipeline
