-- Issue 20 as the gateway role: the shared state of gateways (user pages, MCP session records). Every
-- function is keyed by a verified token, so another user's session is never seen, touched, expired or
-- ended through them; a session's use is recorded in the database (throttled) and only a session
-- idle there is expired; notifications name a session by an opaque key; inputs are bounded and
-- errors carry stable codes.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set inv3 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
\set init '{"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "pgtap", "version": "1"}}'
SELECT pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text AS sid \gset
SELECT pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text AS sid2 \gset
-- How long the database has seen no use of alice's session (ms), through expire with a long idle.
CREATE FUNCTION pg_temp.idle_ms(tok text, sid text) RETURNS bigint LANGUAGE sql AS
$$ SELECT (ctxguard.mcp_session_expire(tok, sid, 86400000)->>'idleMs')::bigint $$;

-- The tables are the owner's; the functions are definers with a pinned search_path.
SELECT throws_ok('SELECT * FROM ctxguard.mcp_sessions', '42501', NULL, 'the gateway role cannot read session records');
SELECT throws_ok('UPDATE ctxguard.mcp_sessions SET last_used_at = now()', '42501', NULL, 'nor write them');
SELECT throws_ok('SELECT * FROM ctxguard.state_salt', '42501', NULL, 'nor read the salt of the keys');
SELECT throws_ok($$SELECT ctxguard._session_key('x')$$, '42501', NULL, 'nor compute a session''s key');
SELECT is(array_agg(p.oid::regprocedure::text ORDER BY 1), NULL, 'every state function is a definer with search_path pinned')
  FROM pg_catalog.pg_proc p
 WHERE p.pronamespace = 'ctxguard'::regnamespace
   AND p.proname IN ('mcp_identity', 'mcp_session_open', 'mcp_session_load', 'mcp_session_close',
                     'mcp_session_expire', 'mcp_session_touch', 'put_session_page', 'put_user_page')
   AND NOT (p.prosecdef AND p.proconfig = ARRAY['search_path=pg_catalog, pg_temp']);
SELECT is(count(*)::int, 8, 'all eight exist') FROM pg_catalog.pg_proc p
 WHERE p.pronamespace = 'ctxguard'::regnamespace
   AND p.proname IN ('mcp_identity', 'mcp_session_open', 'mcp_session_load', 'mcp_session_close',
                     'mcp_session_expire', 'mcp_session_touch', 'put_session_page', 'put_user_page');

-- Alice's session; bob (same tenant) and carol (another tenant) know its id.
SELECT lives_ok(format('SELECT ctxguard.mcp_session_open(%L, %L, %L)', :'tok_alice', :'sid', :'init'), 'alice opens a session');
SELECT lives_ok(format('SELECT ctxguard.mcp_session_open(%L, %L, %L)', :'tok_alice', :'sid2', :'init'), 'and another');
SELECT ok(ctxguard.mcp_identity(:'tok_alice', :'sid')->'session' ? 'page', 'alice''s identity names her session');
SELECT is(ctxguard.mcp_identity(:'tok_bob', :'sid')->'session', 'null'::jsonb, 'bob''s does not (as if it did not exist)');
SELECT is(ctxguard.mcp_identity(:'tok_carol', :'sid')->'session', 'null'::jsonb, 'nor carol''s');
SELECT is(ctxguard.mcp_identity(:'tok_alice', repeat('a', 257))->'session', 'null'::jsonb, 'an over-long session id is no session');
SELECT throws_ok(format('SELECT ctxguard.mcp_identity(%L, %L, -1)', :'tok_alice', :'sid'), '22023',
                 'ctxguard: touch_after_ms is 0-86400000 milliseconds', 'a negative throttle is refused');
SELECT throws_ok(format('SELECT ctxguard.mcp_identity(%L, %L, 86400001)', :'tok_alice', :'sid'), '22023',
                 'ctxguard: touch_after_ms is 0-86400000 milliseconds', 'so is one over a day');
SELECT throws_ok(format('SELECT ctxguard.mcp_identity(%L, %L, 0)', :'tok_forged', :'sid'), '28000', NULL,
                 'a forged token records no use');

-- The session's notification key: opaque (neither its id nor its stored hash), not the user's key.
SELECT ctxguard.mcp_identity(:'tok_alice', :'sid') AS ident \gset
SELECT ok((:'ident'::jsonb->'session'->>'key') ~ '^[0-9a-f]{32}$', 'a session has a key of 32 hex digits');
SELECT ok((:'ident'::jsonb->'session'->>'key') <> (:'ident'::jsonb->>'key'), 'not the user''s key');
SELECT ok(position((:'ident'::jsonb->'session'->>'key') IN
                   :'sid' || pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(:'sid', 'UTF8')), 'hex')) = 0,
          'neither the session id nor its hash');
SELECT isnt(ctxguard.mcp_identity(:'tok_alice', :'sid2')->'session'->>'key', :'ident'::jsonb->'session'->>'key',
            'each session has its own key');

-- Use is recorded in the database, at most once per touch_after_ms.
SELECT ok(pg_temp.idle_ms(:'tok_alice', :'sid') < 1000, 'a new session was just used');
SELECT pg_catalog.pg_sleep(1.1);
SELECT ok(ctxguard.mcp_identity(:'tok_alice', :'sid', 3600000)->'session' ? 'page', 'a use within the throttle');
SELECT ok(pg_temp.idle_ms(:'tok_alice', :'sid') >= 1000, 'writes nothing');
SELECT ok(ctxguard.mcp_identity(:'tok_alice', :'sid', 500)->'session' ? 'page', 'a use past the throttle');
SELECT ok(pg_temp.idle_ms(:'tok_alice', :'sid') < 1000, 'is recorded');
SELECT ok(ctxguard.mcp_identity(:'tok_alice', :'sid2')->'session' ? 'page', 'without touch_after_ms (a gateway re-reading a page)');
SELECT ok(pg_temp.idle_ms(:'tok_alice', :'sid2') >= 1000, 'nothing is recorded');

-- Touch: the sessions a gateway holds streams on, in one call; only each token's own sessions.
SELECT is((SELECT array_agg(g ORDER BY g) FROM unnest(ctxguard.mcp_session_touch(jsonb_build_array(
              jsonb_build_object('token', :'tok_bob', 'sessionId', :'sid2'),
              jsonb_build_object('token', :'tok_carol', 'sessionId', :'sid2'),
              jsonb_build_object('token', :'tok_forged', 'sessionId', :'sid2'),
              jsonb_build_object('token', :'tok_expired', 'sessionId', :'sid2')), 0)) g),
          ARRAY[:'sid2', :'sid2'],
          'another user''s session is gone to bob and carol (as an unknown one); bad tokens are skipped and do not stop the batch');
SELECT ok(pg_temp.idle_ms(:'tok_alice', :'sid2') >= 1000, 'alice''s session untouched');
SELECT is((SELECT array_agg(g ORDER BY g) FROM unnest(ctxguard.mcp_session_touch(jsonb_build_array(
              jsonb_build_object('token', :'tok_bob', 'sessionId', :'sid'),
              jsonb_build_object('token', :'tok_alice', 'sessionId', :'sid2'),
              jsonb_build_object('token', :'tok_alice', 'sessionId', repeat('z', 40)),
              jsonb_build_object('token', :'tok_alice', 'sessionId', repeat('z', 300))), 0)) g),
          (SELECT array_agg(g ORDER BY g) FROM unnest(ARRAY[:'sid', repeat('z', 40), repeat('z', 300)]) g),
          'alice''s own live session is not gone; an unknown id (of any length) and another user''s are');
SELECT ok(pg_temp.idle_ms(:'tok_alice', :'sid2') < 1000, 'and is kept alive');
-- A token's entries anywhere in the batch are taken together (grouped in one pass): alice's and bob's
-- interleaved, alice's live session given twice, a bad token between them.
SELECT is((SELECT array_agg(g ORDER BY g) FROM unnest(ctxguard.mcp_session_touch(jsonb_build_array(
              jsonb_build_object('token', :'tok_alice', 'sessionId', 'unknown-1'),
              jsonb_build_object('token', :'tok_bob', 'sessionId', 'unknown-2'),
              jsonb_build_object('token', :'tok_forged', 'sessionId', 'unknown-3'),
              jsonb_build_object('token', :'tok_alice', 'sessionId', :'sid2'),
              jsonb_build_object('token', :'tok_bob', 'sessionId', :'sid2'),
              jsonb_build_object('token', :'tok_alice', 'sessionId', :'sid2'),
              jsonb_build_object('token', :'tok_alice', 'sessionId', 'unknown-4')), 0)) g),
          ARRAY[:'sid2', 'unknown-1', 'unknown-2', 'unknown-4'],
          'interleaved tokens: each token''s ids judged against its own user, the bad token''s skipped');
-- The gateway's largest batch: 1,000 entries of 1,000 distinct tokens (one user's own, 999 that do not
-- verify), all answered.
SELECT is(pg_catalog.cardinality(ctxguard.mcp_session_touch(
              (SELECT jsonb_agg(jsonb_build_object('token', CASE WHEN i = 1 THEN :'tok_alice' ELSE 'not-a-token-' || i END,
                                                   'sessionId', 'gone-' || i))
                 FROM generate_series(1, 1000) i), 0)), 1,
          'a batch of 1,000 distinct tokens: the one that verifies has its unknown id back');
SELECT is(ctxguard.mcp_session_touch('[]', 0), '{}'::text[], 'an empty batch');
SELECT throws_ok($$SELECT ctxguard.mcp_session_touch('{}', 0)$$, '22023',
                 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects', 'not an array');
SELECT throws_ok($$SELECT ctxguard.mcp_session_touch('[{"token": "x"}]', 0)$$, '22023',
                 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects', 'an entry without a session id');
SELECT throws_ok($$SELECT ctxguard.mcp_session_touch('[{"token": "x", "sessionId": 5}]', 0)$$, '22023',
                 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects', 'a session id that is not text');
SELECT throws_ok($$SELECT ctxguard.mcp_session_touch((SELECT jsonb_agg(jsonb_build_object('token', 'x', 'sessionId', 'y')) FROM generate_series(1, 1001)), 0)$$,
                 '22023', 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects', 'more than 1000 entries');
SELECT throws_ok(format('SELECT ctxguard.mcp_session_touch(%L, 0)', jsonb_build_array(jsonb_build_object('token', repeat('x', 9000000), 'sessionId', 'y'))),
                 '22023', 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects', 'more than 8 MiB');
SELECT throws_ok($$SELECT ctxguard.mcp_session_touch('[]', NULL)$$, '22023',
                 'ctxguard: touch_after_ms is 0-86400000 milliseconds', 'touch needs a throttle');
SELECT throws_ok($$SELECT ctxguard.mcp_session_touch('[]', 86400001)$$, '22023',
                 'ctxguard: touch_after_ms is 0-86400000 milliseconds', 'of at most a day');

-- Expire: ends the caller's session only when the database saw no use for idle_ms.
SELECT is(ctxguard.mcp_session_expire(:'tok_bob', :'sid', 1000), NULL, 'bob cannot expire alice''s session');
SELECT is(ctxguard.mcp_session_expire(:'tok_carol', :'sid', 1000), NULL, 'nor can carol');
SELECT throws_ok(format('SELECT ctxguard.mcp_session_expire(%L, %L, 1000)', :'tok_forged', :'sid'), '28000', NULL,
                 'nor a forged token');
SELECT is(ctxguard.mcp_session_expire(:'tok_alice', :'sid', 60000)->'ended', 'false'::jsonb, 'a session used within idle_ms lives on');
SELECT ok(ctxguard.mcp_identity(:'tok_alice', :'sid')->'session' ? 'page', 'and is still alice''s');
SELECT throws_ok(format('SELECT ctxguard.mcp_session_expire(%L, %L, 999)', :'tok_alice', :'sid'), '22023',
                 'ctxguard: idle_ms is 1000-172800000 milliseconds', 'idle_ms under a second is refused');
SELECT throws_ok(format('SELECT ctxguard.mcp_session_expire(%L, %L, NULL)', :'tok_alice', :'sid'), '22023',
                 'ctxguard: idle_ms is 1000-172800000 milliseconds', 'idle_ms is required');
SELECT throws_ok(format('SELECT ctxguard.mcp_session_expire(%L, %L, 1000)', :'tok_alice', repeat('a', 257)), '22023',
                 'ctxguard: a session id is 16-256 printable ASCII characters', 'an over-long session id');
SELECT throws_ok(format('SELECT ctxguard.mcp_session_expire(%L, NULL, 1000)', :'tok_alice'), '22023',
                 'ctxguard: a session id is 16-256 printable ASCII characters', 'no session id');
SELECT pg_catalog.pg_sleep(1.1);
SELECT is(ctxguard.mcp_session_expire(:'tok_bob', :'sid', 1000), NULL, 'idle, bob still cannot expire it');
SELECT is(ctxguard.mcp_session_expire(:'tok_alice', :'sid', 1000), '{"ended": true}'::jsonb, 'idle in the database: ended');
SELECT is(ctxguard.mcp_identity(:'tok_alice', :'sid')->'session', 'null'::jsonb, 'gone for every gateway');
SELECT is(ctxguard.mcp_session_expire(:'tok_alice', :'sid', 1000), NULL, 'expiring it again finds nothing');

-- A session's own page: only through the caller's own validated context.
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'inv3') \g /dev/null
SELECT is(ctxguard.put_session_page(:'sid2'), false, 'bob cannot set the page of alice''s session');
COMMIT;
SELECT is(ctxguard.mcp_identity(:'tok_alice', :'sid2')->'session'->'page', 'null'::jsonb, 'it has none');
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'inv3') \g /dev/null
SELECT is(ctxguard.put_session_page(:'sid2'), true, 'alice sets her session''s page');
SELECT is(ctxguard.put_session_page(:'sid2'), false, 'the same page again changes nothing');
COMMIT;
SELECT is(ctxguard.mcp_identity(:'tok_alice', :'sid2')->'session'->'page', :'inv3'::jsonb, 'her session has its page');
SELECT throws_ok(format('SELECT ctxguard.put_session_page(%L)', :'sid2'), '28000', 'ctxguard: no context is set',
                 'no page without a validated context');

-- Close: the caller's own only.
SELECT is(ctxguard.mcp_session_close(:'tok_bob', :'sid2'), false, 'bob cannot end alice''s session');
SELECT is(ctxguard.mcp_session_close(:'tok_alice', :'sid2'), true, 'alice can');
SELECT is(ctxguard.mcp_identity(:'tok_alice', :'sid2')->'session', 'null'::jsonb, 'and it is gone');

SELECT * FROM finish();
