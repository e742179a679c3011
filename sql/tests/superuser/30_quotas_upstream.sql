-- Issue 30: a server's default policy carries its quotas to the server's upstream tools (each tool
-- its own count), and rate_limit is validated there as on a tool. As the DBA (postgres); the
-- catalog changes are rolled back (the server's name is new each run: counts outlive a rollback).
\set QUIET 1
SET client_min_messages = warning;
BEGIN;
SELECT * FROM no_plan();
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
SELECT 'quota_up_' || pg_catalog.substr(pg_catalog.md5(pg_catalog.random()::text), 1, 8) AS srv \gset
INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access)
VALUES (:'srv', 'http', 'http://127.0.0.1:9/quota_up', 'Quota test service', 'allow');
SELECT ctxguard.sync_mcp_tools(:'srv', '[{"name": "ping", "description": "Ping.", "inputSchema": {"type": "object"}},
                                         {"name": "pong", "description": "Pong.", "inputSchema": {"type": "object"}}]') \g /dev/null
SELECT throws_ok(format($$SELECT ctxguard.set_server_policy(%L, '{"page_types": ["quota_lab"], "rate_limit": {"per": "user", "calls": 0, "window": "1h"}}')$$, :'srv'),
                 '22023', NULL, 'a server policy''s rate_limit is validated');
SELECT throws_ok($$SELECT ctxguard.set_tool_policy('quota.per_user', '{"page_types": ["quota_lab"], "rate_limit": {"per": "user", "calls": 5, "window": "1w"}}')$$,
                 '22023', NULL, 'a tool policy''s rate_limit is validated');
SELECT lives_ok(format($$SELECT ctxguard.set_server_policy(%L, '{"page_types": ["quota_lab"], "rate_limit": {"per": "user", "calls": 1, "window": "1h"}}')$$, :'srv'),
                'a server policy with a quota');
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "quota_lab"}') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool(:'srv' || '.ping')), 'authorized', 'upstream: the first call is authorized');
SELECT is(pg_temp.code(ctxguard.call_tool(:'srv' || '.ping')), 'RATE_LIMIT_EXCEEDED', 'upstream: the second is over the server''s default quota');
SELECT is(pg_temp.code(ctxguard.call_tool(:'srv' || '.pong')), 'authorized', 'upstream: each tool of the server has its own count');
-- pgTAP's counters live in the transaction: finish first.
SELECT * FROM finish();
ROLLBACK;
