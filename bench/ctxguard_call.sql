-- The gateway's tool-call transaction (gateway/src/db/mod.rs `call_tool` through `Db::one`):
-- context, then Gate B's call with its durable audit record; no Gate A list (the gateway lists the
-- page's tools in the turn's first transaction, not in each call's). Against the careful baseline
-- (bench/baseline_audit.sql), the same number of statements. A diagnostic beside ctxguard.sql (the
-- full call: context, Gate A's list and Gate B's call), which is what issue 34's aim measures.
-- :token is a pgbench variable (-D token=...).
BEGIN;
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT ctxguard.call_tool('invoice.get', '{}');
COMMIT;
