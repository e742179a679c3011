-- ctxguard path: verified context + Gate A (tool list) + Gate B (policy re-check, entity
-- binding, argument validation, handler, audit row) in one transaction.
-- :token is a pgbench variable (-D token=...); with -M prepared it is sent as a bind parameter.
BEGIN;
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT count(*) FROM ctxguard.visible_tools();
SELECT ctxguard.call_tool('invoice.get', '{}');
COMMIT;
