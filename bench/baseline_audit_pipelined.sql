-- The careful baseline (baseline_audit.sql) pipelined (one round trip), as a careful app on a
-- pipelining driver would send it: the baseline of ctxguard_pinned.sql, the ctxguard transaction as
-- the gateway sends it (scale.sh's clients curve, issue 34).
\startpipeline
BEGIN;
SELECT set_config('app.tenant_id', 'acme', true);
WITH r AS (SELECT bench.invoice_get('{"invoice_id": "acme_inv3"}') AS v)
INSERT INTO bench.audit (tenant_id, tool, args_hash, result_bytes)
SELECT 'acme', 'invoice.get', md5('{"invoice_id": "acme_inv3"}'), octet_length(r.v::text) FROM r RETURNING (SELECT v FROM r);
COMMIT;
\endpipeline
