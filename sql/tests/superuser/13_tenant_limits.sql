-- A tenant's limits travel with the catalog (issue 13: Budget reads them once per catalog version):
-- a change to ctxguard.tenant_limits moves the catalog's version, so it binds the gateway's next
-- transaction. Runs as the superuser (the DBA changes the limits); the calls run as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set page '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
\ir ../lib/gateway_call.sql
-- The call's status, or the limit that refused it.
CREATE FUNCTION pg_temp.call(tok text, page jsonb) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(split_part(r->'error'->>'message', ':', 1), r->>'status') FROM pg_temp.gateway_call(tok, page) r
$$;
CREATE TEMP TABLE saved AS SELECT * FROM ctxguard.tenant_limits WHERE tenant_id = 'acme';
SELECT catalog_version.version AS v0 FROM ctxguard.catalog_version \gset

BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS r1 \gset
COMMIT;
SELECT is(:'r1'::text, 'ok', 'a call within acme''s limits');
INSERT INTO ctxguard.tenant_limits (tenant_id, max_bytes_per_generation) VALUES ('acme', 10)
ON CONFLICT (tenant_id) DO UPDATE SET max_bytes_per_generation = 10;
SELECT ok((SELECT version FROM ctxguard.catalog_version) > :v0, 'a change to tenant_limits moves the catalog''s version');
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS r2 \gset
COMMIT;
SELECT is(:'r2'::text, 'bytes_per_generation',
          'the next transaction is bound by the lowered limit (10 bytes)');

UPDATE ctxguard.tenant_limits SET max_bytes_per_generation = NULL WHERE tenant_id = 'acme';
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS r3 \gset
COMMIT;
SELECT is(:'r3'::text, 'ok', 'the limit raised again binds the next transaction');

DELETE FROM ctxguard.tenant_limits WHERE tenant_id = 'acme';
INSERT INTO ctxguard.tenant_limits SELECT * FROM saved;
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS r4 \gset
COMMIT;
SELECT is(:'r4'::text, 'ok', 'acme''s limits as they were');
SELECT * FROM finish();
