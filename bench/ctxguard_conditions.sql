-- ctxguard.sql with invoice.get_checked: the same handler and page, plus one `when` condition and
-- one `rate_limit` quota (bench/setup.sql, part 5). Issue 30's aim: at most 0.1 ms added per call.
BEGIN;
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT count(*) FROM ctxguard.visible_tools();
SELECT ctxguard.call_tool('invoice.get_checked', '{}');
COMMIT;
