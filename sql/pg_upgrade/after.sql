-- After pg_upgrade: run in every database that has ctxguard, on the new cluster, as a superuser,
-- before the gateways start (psql -v ON_ERROR_STOP=1 -d DB -f after.sql). Undoes before.sql: the
-- handler and policy-condition signatures and text search configurations are looked up again in
-- the new cluster.
\set ON_ERROR_STOP 1
BEGIN;
SET LOCAL search_path = pg_catalog, pg_temp;
ALTER TABLE ctxguard.tools ALTER COLUMN handler TYPE regprocedure USING handler::regprocedure;
ALTER TABLE ctxguard.tool_policies ALTER COLUMN when_fn TYPE pg_catalog.regprocedure USING when_fn::pg_catalog.regprocedure,
                                   ALTER COLUMN approval_when_fn TYPE pg_catalog.regprocedure USING approval_when_fn::pg_catalog.regprocedure;
ALTER TABLE ctxguard.documents ALTER COLUMN language TYPE regconfig USING language::regconfig,
                               ALTER COLUMN language SET DEFAULT 'simple';
COMMIT;
