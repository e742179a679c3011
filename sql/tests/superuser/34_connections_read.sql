-- Whether a user holds a connection to a `user_oauth` server is read by that user's keys, not from
-- every connection of the tenant (issue 34: cost as the tenants' users grow). Gate A, on a page where
-- a `requires_connection` server offers tools, and Gate B, for a call to a `user_oauth` server's
-- tool, asked for the user's connections by (tenant, user, mode); the primary key of
-- upstream_credentials is (tenant_id, server, user_id), so the statement read the tenant's whole
-- range of it (or the whole table, by the plan statistics chose): every other user's connection, on
-- each listing and call. Now the servers are named from the catalog and each (tenant, server, user)
-- is one lookup.
--
-- Here 20,000 other users of acme hold connections to the server beside alice's; the blocks the
-- scans of upstream_credentials and its index fetch in the transaction are counted
-- (pg_stat_get_xact_blocks_fetched) around a listing and a call as alice and as bob (who holds no
-- connection). Runs as the superuser (the servers are the DBA's); the calls as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

\ir ../lib/rows_returned.sql
-- As the gateway, in `tok`'s context: whether Gate A lists the vault server's tool, and Gate B's
-- decision on a call of it (explain_call: decided as a call, nothing run) with its code.
CREATE FUNCTION pg_temp.vault(tok text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE listed boolean; env jsonb;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, '{"pageType": "invoice_table"}');
    listed := EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE server = 'vault_many');
    env := ctxguard.explain_call('vault_many.whoami', '{}');
    RESET ROLE;
    RETURN listed::text || '/' || (env->>'decision') || coalesce('/' || (env->>'code'), '');
END $$;

BEGIN;
INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access, credential_mode, credential_config, requires_connection)
VALUES ('vault_many', 'http', 'http://127.0.0.1:9/vault', 'Vault', 'allow', 'user_oauth', '{}', true);
SELECT ctxguard.set_server_policy('vault_many', '{"page_types": "*"}') \g /dev/null
SELECT ctxguard.sync_mcp_tools('vault_many', '[{"name": "whoami", "description": "Who am I.", "inputSchema": {"type": "object"}}]') \g /dev/null
INSERT INTO ctxguard.upstream_credentials (tenant_id, user_id, server, mode, key_id, ciphertext, nonce)
SELECT 'acme', u, 'vault_many', 'user_oauth', 'k1', decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex')
  FROM (SELECT 'filler' || i FROM generate_series(1, 20000) i UNION ALL SELECT 'alice') f(u);
ANALYZE ctxguard.upstream_credentials;
SELECT pg_temp.blocks_fetched('ctxguard.upstream_credentials') AS before \gset
SELECT pg_temp.vault(:'tok_alice') AS alice \gset
SELECT pg_temp.blocks_fetched('ctxguard.upstream_credentials') - :before AS alice_read \gset
SELECT pg_temp.blocks_fetched('ctxguard.upstream_credentials') AS before \gset
SELECT pg_temp.vault(:'tok_bob') AS bob \gset
SELECT pg_temp.blocks_fetched('ctxguard.upstream_credentials') - :before AS bob_read \gset
ROLLBACK;

SELECT is(:'alice'::text, 'true/allow', 'alice, connected: Gate A lists the server''s tool and Gate B lets its call through');
SELECT is(:'bob'::text, 'false/deny/CONNECTION_REQUIRED', 'bob, without a connection: the tool is hidden and its call refused');
SELECT cmp_ok(:alice_read::bigint, '<', 30::bigint,
              format('alice''s listing and call fetched %s blocks of the connections, not the 20,000 other users''', :alice_read));
SELECT cmp_ok(:bob_read::bigint, '<', 30::bigint,
              format('and bob''s %s', :bob_read));

SELECT * FROM finish();
