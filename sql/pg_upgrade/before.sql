-- Before pg_upgrade: run in every database that has ctxguard, on the old cluster, as a superuser, with
-- the gateways stopped (psql -v ON_ERROR_STOP=1 -d DB -f before.sql).
--
-- pg_upgrade copies table files as they are, so it refuses tables with columns of the reg* types that
-- hold OIDs it does not keep (functions, text search configurations). ctxguard has four:
-- ctxguard.tools.handler, ctxguard.tool_policies.when_fn and approval_when_fn (regprocedure), and
-- ctxguard.documents.language (regconfig). Here they become
-- their text form (schema-qualified), and after.sql turns them back on the new cluster. Until then
-- ctxguard's calls fail (closed). To stay on the old cluster instead, run after.sql there.
\set ON_ERROR_STOP 1
BEGIN;
SET LOCAL search_path = pg_catalog, pg_temp;
ALTER TABLE ctxguard.tools ALTER COLUMN handler TYPE text USING handler::text;
ALTER TABLE ctxguard.tool_policies ALTER COLUMN when_fn TYPE pg_catalog.text USING when_fn::pg_catalog.text,
                                   ALTER COLUMN approval_when_fn TYPE pg_catalog.text USING approval_when_fn::pg_catalog.text;
ALTER TABLE ctxguard.documents ALTER COLUMN language DROP DEFAULT,
                               ALTER COLUMN language TYPE text USING language::text;
COMMIT;
