-- Careful baseline (issue 13): the classic app-side design plus the app's own audit INSERT in the
-- same transaction (hash of the arguments, size of the result), as a careful app would write it.
BEGIN;
SELECT set_config('app.tenant_id', 'acme', true);
WITH r AS (SELECT bench.invoice_get('{"invoice_id": "acme_inv3"}') AS v)
INSERT INTO bench.audit (tenant_id, tool, args_hash, result_bytes)
SELECT 'acme', 'invoice.get', md5('{"invoice_id": "acme_inv3"}'), octet_length(r.v::text) FROM r RETURNING (SELECT v FROM r);
COMMIT;
