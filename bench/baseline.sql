-- Baseline: the classic app-side design. The app sets a plain custom GUC and calls the handler
-- directly; forced RLS on bench.invoices/bench.vendors reads app.tenant_id. No token check,
-- no tool list, no policy, no audit.
BEGIN;
SELECT set_config('app.tenant_id', 'acme', true);
SELECT bench.invoice_get('{"invoice_id": "acme_inv3"}');
COMMIT;
