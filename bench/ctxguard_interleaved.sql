-- Issue 30's aim in one run: ctxguard.sql's transaction with invoice.get or invoice.get_checked
-- (one `when` condition and one `rate_limit` quota) at random, the call timed inside the database
-- (bench.timed_call, bench/setup.sql part 6).
\set t random(1, 2)
BEGIN;
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT count(*) FROM ctxguard.visible_tools();
SELECT bench.timed_call((ARRAY['invoice.get', 'invoice.get_checked'])[:t]);
COMMIT;
