-- Upstream credentials (issue 33), as the gateway role with arbitrary SQL: the table is out of
-- reach; every function reads and writes only the verified context user's own credential (or,
-- for a tenant secret, the context tenant's, written only by its tenant admin and never read back
-- but for one authorized call); Gate B answers CONNECTION_REQUIRED without a connection, Gate A
-- hides a requires_connection server's tools. The servers are made here by the DBA (postgres, on
-- a connection of its own: lib/dba.sql) and dropped at the end.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set page '{"pageType": "invoice_table"}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
CREATE FUNCTION pg_temp.audit(cid text) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(decision || ':' || coalesce(tool, '-') || ':' || coalesce(user_id, '-'), ',') FROM ctxguard.audit_log WHERE call_id = cid::uuid
$$;
-- A sealed value as the gateway would store it: 17+ bytes of ciphertext, a 24-byte nonce.
\set ct_alice 'decode(repeat(''a1'', 40), ''hex'')'
\set ct_carol 'decode(repeat(''c3'', 40), ''hex'')'
\set nonce 'decode(repeat(''00'', 24), ''hex'')'

\set dba_role postgres
\set dba_sql 'DELETE FROM ctxguard.mcp_servers WHERE name IN (''drive'', ''vault'', ''ledgerapi'', ''fed''); INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access, credential_mode, credential_config, requires_connection) VALUES (''drive'', ''http'', ''http://127.0.0.1:9/drive'', ''Drive'', ''allow'', ''user_oauth'', ''{"client_id": "ctxguard"}'', false), (''vault'', ''http'', ''http://127.0.0.1:9/vault'', ''Vault'', ''allow'', ''user_oauth'', ''{}'', true), (''ledgerapi'', ''http'', ''http://127.0.0.1:9/ledger'', ''Ledger'', ''allow'', ''tenant_secret'', ''{}'', false), (''fed'', ''http'', ''http://127.0.0.1:9/fed'', ''Federated'', ''allow'', ''token_exchange'', ''{"audience": "fed"}'', false); SELECT ctxguard.set_server_policy(s, ''{"page_types": "*"}'') FROM unnest(''{drive,vault,ledgerapi,fed}''::text[]) s; SELECT ctxguard.sync_mcp_tools(s, ''[{"name": "whoami", "description": "Who am I.", "inputSchema": {"type": "object"}}]'') FROM unnest(''{drive,vault,ledgerapi,fed}''::text[]) s'
\ir lib/dba.sql
SELECT unalike(:'dba_out'::text, 'ERROR%'::text, 'the DBA registers four servers, one per credential mode');
SELECT throws_ok($$INSERT INTO ctxguard.mcp_servers (name, transport, command, credential_mode) VALUES ('x', 'stdio', 'true', 'user_oauth')$$,
                 '42501', NULL, 'the gateway cannot register servers');
\set dba_sql 'INSERT INTO ctxguard.mcp_servers (name, transport, command, credential_mode) VALUES (''x'', ''stdio'', ''true'', ''user_oauth'')'
\ir lib/dba.sql
SELECT alike(:'dba_out'::text, 'ERROR:  23514%'::text, 'a credential mode needs an http server');

-- The table is out of reach
SELECT throws_ok('SELECT * FROM ctxguard.upstream_credentials', '42501', NULL, 'credential rows are not readable');
SELECT throws_ok($$INSERT INTO ctxguard.upstream_credentials (tenant_id, user_id, server, mode, key_id, ciphertext, nonce)
                   VALUES ('acme', 'bob', 'drive', 'user_oauth', 'k', '\x00', '\x00')$$, '42501', NULL, 'nor writable');
SELECT throws_ok($$UPDATE ctxguard.upstream_credentials SET user_id = 'bob'$$, '42501', NULL, 'a row cannot be moved to another user');
SELECT throws_ok($$DELETE FROM ctxguard.upstream_credentials$$, '42501', NULL, 'nor deleted');
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('drive', 'k1', decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex'))$$,
                 '28000', NULL, 'no context: nothing is stored');
SELECT is((SELECT count(*)::int FROM ctxguard.upstream_connections()), 0, 'no context: no connections');

-- alice connects drive
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'page') \g /dev/null
SELECT set_eq($$SELECT server, mode, connected FROM ctxguard.upstream_connections()$$,
              $$VALUES ('drive', 'user_oauth', false), ('vault', 'user_oauth', false), ('ledgerapi', 'tenant_secret', false), ('fed', 'token_exchange', true)$$,
              'alice sees the servers that take a credential, none connected yet');
SELECT ok(NOT EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE server = 'vault'), 'Gate A hides a requires_connection server without a connection');
SELECT ok(EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE name = 'drive.whoami'), 'and shows the other user_oauth server');
SELECT ctxguard.call_tool('drive.whoami') AS r \gset
SELECT is(pg_temp.code(:'r'), 'CONNECTION_REQUIRED', 'Gate B: no connection, no call');
SELECT is(:'r'::jsonb->'error'->'details'->>'server', 'drive', 'the refusal names the server to connect');
SELECT is(pg_temp.audit(:'r'::jsonb->>'call_id'), 'deny:drive.whoami:alice', 'and is audited');
SELECT is(pg_temp.code(ctxguard.call_tool('vault.whoami')), 'CONNECTION_REQUIRED', 'a hidden tool answers the same');
SELECT ctxguard.put_upstream_credential('drive', 'k1', :ct_alice, :nonce, now() + interval '1 hour', :ct_alice, :nonce) AS put \gset
SELECT is(:'put'::jsonb->>'status', 'ok', 'alice stores her own connection');
SELECT is(pg_temp.audit(:'put'::jsonb->>'call_id'), 'credential_set:drive:alice', 'audited as credential_set');
SELECT ctxguard.put_upstream_credential('vault', 'k1', :ct_alice, :nonce) \g /dev/null
SELECT ok(EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE server = 'vault'), 'with a connection, Gate A shows the requires_connection server');
SELECT ctxguard.call_tool('drive.whoami') AS a1 \gset
SELECT is(pg_temp.code(:'a1'), 'authorized', 'with her connection, alice''s call is authorized');
SELECT results_eq(format($$SELECT server, mode, key_id, ciphertext, nonce, refresh_ciphertext IS NOT NULL FROM ctxguard.upstream_credential(%L)$$, :'a1'::jsonb->>'call_id'),
                  format($$VALUES ('drive', 'user_oauth', 'k1', %L::bytea, %L::bytea, true)$$, :ct_alice, :nonce),
                  'upstream_credential answers her own credential for her authorized call');
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('ledgerapi', 'k1', decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex'))$$,
                 '22023', 'ctxguard: no such upstream server takes this credential for this user', 'a user connection is for user_oauth servers only');
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('nosuch', 'k1', decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex'))$$,
                 '22023', 'ctxguard: no such upstream server takes this credential for this user', '... and known servers (the same message)');
SELECT throws_ok($$SELECT ctxguard.put_tenant_secret('ledgerapi', 'k1', decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex'))$$,
                 '42501', NULL, 'a tenant secret needs the tenant admin role');
-- Sizes and shapes, checked before anything else; no error repeats what it was given.
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('drive', 'k1', pg_catalog.decode(repeat('ab', 16401), 'hex'), decode(repeat('00', 24), 'hex'))$$,
                 '54000', 'ctxguard: ciphertext is limited to 16400 bytes', 'an oversize ciphertext');
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('drive', 'k1', decode(repeat('a1', 40), 'hex'), '\x0001')$$,
                 '22023', 'ctxguard: ciphertext is not an AEAD ciphertext with a 24-byte nonce', 'a short nonce');
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('drive', 'k1 secret-value', decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex'))$$,
                 '22023', 'ctxguard: key_id must be letters, digits, _ or -', 'a malformed key id, not echoed');
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('drive', repeat('k', 65), decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex'))$$,
                 '54000', NULL, 'an oversize key id');
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('drive', 'k1', NULL, decode(repeat('00', 24), 'hex'))$$, '22004', NULL, 'a NULL ciphertext');
SELECT throws_ok($$SELECT ctxguard.put_upstream_credential('drive', 'k1', decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex'), NULL, decode(repeat('a1', 40), 'hex'))$$,
                 '22004', NULL, 'a refresh ciphertext without its nonce');
COMMIT;

-- bob (acme) and carol (globex) see nothing of alice's
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'page') \g /dev/null
SELECT set_eq($$SELECT server, connected FROM ctxguard.upstream_connections() WHERE mode = 'user_oauth'$$,
              $$VALUES ('drive', false), ('vault', false)$$, 'bob (alice''s tenant) has no connection of hers');
SELECT ok(NOT EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE server = 'vault'), 'Gate A still hides vault from bob');
SELECT is(pg_temp.code(ctxguard.call_tool('drive.whoami')), 'CONNECTION_REQUIRED', 'bob''s call is not authorized with alice''s connection');
SELECT is((SELECT count(*)::int FROM ctxguard.upstream_credential((:'a1'::jsonb->>'call_id')::uuid)), 0, 'alice''s call id gives bob nothing');
SELECT is((SELECT count(*)::int FROM ctxguard.delete_upstream_credential('drive')), 0, 'bob''s disconnect finds nothing of his');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', :'page') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('drive.whoami')), 'CONNECTION_REQUIRED', 'nor carol''s (another tenant)');
SELECT is((SELECT count(*)::int FROM ctxguard.upstream_credential((:'a1'::jsonb->>'call_id')::uuid)), 0, 'alice''s call id gives carol nothing');
SELECT ctxguard.put_upstream_credential('drive', 'k1', :ct_carol, :nonce) \g /dev/null
SELECT ctxguard.call_tool('drive.whoami') AS c1 \gset
SELECT results_eq(format($$SELECT ciphertext FROM ctxguard.upstream_credential(%L)$$, :'c1'::jsonb->>'call_id'),
                  format($$VALUES (%L::bytea)$$, :ct_carol), 'carol''s call gets carol''s credential');
-- The ledger API: globex has no secret; its call is authorized but finds no credential.
SELECT ctxguard.call_tool('ledgerapi.whoami') AS cl \gset
SELECT is((SELECT count(*)::int FROM ctxguard.upstream_credential((:'cl'::jsonb->>'call_id')::uuid)), 0, 'globex has no ledger secret');
COMMIT;

-- alice's connection is still hers; her call's credential is gone once the call completes
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'page') \g /dev/null
SELECT is((SELECT connected FROM ctxguard.upstream_connections() WHERE server = 'drive'), true, 'others'' disconnects left alice''s connection');
SELECT ctxguard.complete_call((:'a1'::jsonb->>'call_id')::uuid, '{"content": []}') \g /dev/null
SELECT is((SELECT count(*)::int FROM ctxguard.upstream_credential((:'a1'::jsonb->>'call_id')::uuid)), 0, 'a completed call reads no credential');
COMMIT;

-- Tenant secrets: written by the tenant admin only, never read back but for an authorized call
BEGIN;
SELECT ctxguard.set_context(:'tok_tadmin', :'page') \g /dev/null
SELECT throws_ok($$SELECT ctxguard.put_tenant_secret('drive', 'k1', decode(repeat('a1', 40), 'hex'), decode(repeat('00', 24), 'hex'))$$,
                 '22023', NULL, 'a tenant secret is for tenant_secret servers only');
SELECT ctxguard.put_tenant_secret('ledgerapi', 'k1', :ct_alice, :nonce) AS ts \gset
SELECT is(:'ts'::jsonb->>'status', 'ok', 'the tenant admin sets acme''s ledger secret');
SELECT is(pg_temp.audit(:'ts'::jsonb->>'call_id'), 'credential_set:ledgerapi:tina', 'audited');
SELECT is((SELECT connected FROM ctxguard.upstream_connections() WHERE server = 'ledgerapi'), true, 'the tenant''s users see it is set, not what it is');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'page') \g /dev/null
SELECT ctxguard.call_tool('ledgerapi.whoami') AS bl \gset
SELECT results_eq(format($$SELECT mode, ciphertext FROM ctxguard.upstream_credential(%L)$$, :'bl'::jsonb->>'call_id'),
                  format($$VALUES ('tenant_secret', %L::bytea)$$, :ct_alice), 'an acme user''s authorized call gets acme''s secret (ciphertext)');
SELECT throws_ok($$SELECT ctxguard.delete_tenant_secret('ledgerapi')$$, '42501', NULL, 'only the tenant admin deletes it');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', :'page') \g /dev/null
SELECT is((SELECT count(*)::int FROM ctxguard.upstream_credential((:'bl'::jsonb->>'call_id')::uuid)), 0, 'bob''s call id gives carol nothing');
COMMIT;

-- Disconnect: answers what was deleted once, audited
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'page') \g /dev/null
SELECT results_eq($$SELECT key_id, ciphertext FROM ctxguard.delete_upstream_credential('drive')$$,
                  format($$VALUES ('k1'::text, %L::bytea)$$, :ct_alice), 'alice disconnects: the deleted credential comes back once, for revocation');
SELECT is((SELECT count(*)::int FROM ctxguard.delete_upstream_credential('drive')), 0, 'then nothing');
SELECT is(pg_temp.code(ctxguard.call_tool('drive.whoami')), 'CONNECTION_REQUIRED', 'and her next call needs a connection again');
SELECT ok(EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE server = 'vault'), 'vault is shown while she is connected (a later transaction)');
SELECT ctxguard.delete_upstream_credential('vault') \g /dev/null
SELECT ok(NOT EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE server = 'vault'), 'and hidden again once she disconnects (Gate A''s kept answers know)');
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log WHERE user_id = 'alice' AND tool = 'drive' AND decision = 'credential_deleted' AND at >= now()),
          1, 'the disconnect is audited (once: the second found nothing)');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_tadmin', :'page') \g /dev/null
SELECT is(ctxguard.delete_tenant_secret('ledgerapi')->>'changed', 'true', 'the tenant admin deletes the secret');
COMMIT;

-- A policy can require a credential mode (issue 33 item 4): drive's tool goes out only with each
-- user's own connection, fed's only by token exchange; a tool whose server is registered with
-- another mode is neither listed nor callable, and follows the server when the DBA changes it.
\set dba_sql 'SELECT ctxguard.set_tool_policy(''fed.whoami'', ''{"page_types": "*", "credential_mode": "token_exchange"}''); SELECT ctxguard.set_tool_policy(''ledgerapi.whoami'', ''{"page_types": "*", "credential_mode": ["user_oauth", "token_exchange"]}''); SELECT ctxguard.set_server_policy(''vault'', ''{"page_types": "*", "credential_mode": "static"}'')'
\ir lib/dba.sql
SELECT unalike(:'dba_out'::text, '%ERROR%'::text, 'the DBA requires credential modes in a tool policy and a server''s default policy');
\set dba_sql 'SELECT ctxguard.set_tool_policy(''drive.whoami'', ''{"page_types": "*", "credential_mode": "oauth"}'')'
\ir lib/dba.sql
SELECT alike(:'dba_out'::text, 'ERROR:  22023%credential_mode must be%'::text, 'a credential_mode that is not a mode is refused');
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'page') \g /dev/null
SELECT ctxguard.call_tool('fed.whoami') AS fe \gset
SELECT is(pg_temp.code(:'fe'), 'authorized', 'a tool requiring token_exchange on a token_exchange server is authorized');
SELECT is(:'fe'::jsonb->>'credential_mode', 'token_exchange', 'and the authorization names the mode the gateway must use');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'ledgerapi.whoami'), 'credential_mode_mismatch',
          'a tool requiring a per-user mode on a tenant_secret server: credential_mode_mismatch');
SELECT ok(NOT EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE name = 'ledgerapi.whoami'), 'Gate A does not list it');
SELECT ctxguard.call_tool('ledgerapi.whoami') AS lm \gset
SELECT is(pg_temp.code(:'lm'), 'TOOL_NOT_VISIBLE', 'Gate B refuses it');
SELECT is(pg_temp.audit(:'lm'::jsonb->>'call_id'), 'deny:ledgerapi.whoami:alice', 'audited');
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'vault.whoami'), 'credential_mode_mismatch',
          'a server default policy requiring static on a user_oauth server: its tools mismatch too');
COMMIT;
\set dba_sql 'UPDATE ctxguard.mcp_servers SET credential_mode = ''tenant_secret'' WHERE name = ''fed'''
\ir lib/dba.sql
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'page') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('fed.whoami')), 'TOOL_NOT_VISIBLE',
          'the DBA moves fed to tenant_secret: the tool requiring token_exchange is refused at once');
COMMIT;
\set dba_sql 'SELECT string_agg(kind || '' '' || object, '', '' ORDER BY kind, object) FROM ctxguard.lint() WHERE kind LIKE ''%credential_mode%'''
\ir lib/dba.sql
SELECT is(:'dba_out'::text, 'server_credential_mode_mismatch vault, tool_credential_mode_mismatch fed.whoami, tool_credential_mode_mismatch ledgerapi.whoami',
          'lint names every tool and server default policy whose mode its server lacks');
\set dba_sql 'SELECT ctxguard.register_tool(''test.mode_local'', ''A local tool whose policy asks for a credential mode.'', ''{"type": "object"}'', ''t.boom(jsonb)'', ''{"page_types": "*", "credential_mode": "static", "run_as": "ctxguard_tools"}'')'
\ir lib/dba.sql
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'page') \g /dev/null
SELECT is((SELECT reason FROM ctxguard.explain_tools() WHERE name = 'test.mode_local'), 'credential_mode_mismatch',
          'a local tool has no credential mode: a policy requiring one keeps it unlisted');
SELECT is(pg_temp.code(ctxguard.call_tool('test.mode_local')), 'TOOL_NOT_VISIBLE', 'and uncallable');
COMMIT;
\set dba_sql 'DELETE FROM ctxguard.tools WHERE name = ''test.mode_local'''
\ir lib/dba.sql

\set dba_sql 'DELETE FROM ctxguard.mcp_servers WHERE name IN (''drive'', ''vault'', ''ledgerapi'', ''fed'')'
\ir lib/dba.sql
SELECT * FROM finish();
