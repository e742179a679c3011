-- Whether a user may use an upstream MCP server is decided from the grants that can apply to that
-- user, not from every grant of the tenant (issue 34: cost as the tenants' users grow). Gate A and
-- Gate B read a server's grants for the caller's tenant: every role grant and every user grant of
-- the tenant, kept per (server, tenant) only while the catalog cache had room (96 bytes a grant).
-- A tenant granting a server user by user (seed 002's per-user access) made each of its users'
-- calls read every other user's grant: 20,000 rows per call here, and once the list no longer fit
-- the cache, on every call. Now the grants of the caller's roles and its own user grant are read,
-- through the grants' index, and kept for the last caller only.
--
-- Here 20,000 user grants of the files server stand beside alice's in acme; the entries the
-- scans of ctxguard.mcp_server_grants and its index return in the transaction are counted
-- (pg_stat_get_xact_tuples_returned) around usable_mcp_servers(), which asks for every server.
-- Runs as the superuser (grants are the DBA's); the call as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

\ir ../lib/rows_returned.sql
-- As the gateway, in `tok`'s context: the usable servers among files, crm and off.
CREATE FUNCTION pg_temp.usable(tok text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE s text;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, '{"pageType": "invoice_table"}');
    SELECT coalesce(string_agg(u, ',' ORDER BY u), '') INTO s FROM ctxguard.usable_mcp_servers() u WHERE u IN ('files', 'crm', 'off');
    RESET ROLE;
    RETURN s;
END $$;

BEGIN;
SELECT pg_temp.usable(:'tok_alice') AS alice_before, pg_temp.usable(:'tok_bob') AS bob_before \gset
INSERT INTO ctxguard.mcp_server_grants (server, tenant_id, principal, access)
SELECT 'files', 'acme', 'user:filler' || i, CASE WHEN i % 2 = 0 THEN 'allow' ELSE 'deny' END
  FROM generate_series(1, 20000) i;
ANALYZE ctxguard.mcp_server_grants;
SELECT pg_temp.rows_returned('ctxguard.mcp_server_grants') AS before \gset
SELECT pg_temp.usable(:'tok_alice') AS alice_after \gset
SELECT pg_temp.rows_returned('ctxguard.mcp_server_grants') - :before AS read \gset
SELECT pg_temp.usable(:'tok_bob') AS bob_after \gset
-- What the backend keeps of them after two users: one user's worth (the last caller's).
SELECT (ctxguard.catalog_stats()->>'server_access_kept')::int AS kept, (SELECT count(*) FROM ctxguard.mcp_servers) AS servers \gset
-- A user grant of the filler kind still counts for its user: bob denied files by his own grant.
INSERT INTO ctxguard.mcp_server_grants (server, tenant_id, principal, access) VALUES ('crm', 'acme', 'user:bob', 'deny');
SELECT pg_temp.usable(:'tok_bob') AS bob_denied \gset
ROLLBACK;

SELECT is(:'alice_after'::text, :'alice_before'::text, format('alice''s usable servers are the same beside 20,000 other users'' grants (%s)', :'alice_after'));
SELECT is(:'bob_after'::text, :'bob_before'::text, format('and bob''s (%s)', :'bob_after'));
SELECT isnt(:'bob_denied'::text, :'bob_before'::text, 'a user''s own deny is still read');
SELECT ok(position('crm' in coalesce(:'bob_denied', '')) = 0, 'and keeps him from that server');
SELECT cmp_ok(:kept::bigint, '<=', :servers::bigint,
              format('the backend keeps one caller''s access to the %s servers, not each user''s (%s)', :servers, :kept));
SELECT cmp_ok(:read::bigint, '<', 200::bigint,
              format('deciding them read %s grant entries, not the other users''', :read));

SELECT * FROM finish();
