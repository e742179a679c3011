-- Issue 30: call quotas in time windows (policy "rate_limit"), counted in the shared-memory ledger.
-- N calls run, the next is RATE_LIMIT_EXCEEDED with retry_after_ms; per user and per tenant; a
-- caller's ROLLBACK or savepoint rollback gives no count back; a dry run charges nothing; shadow
-- mode logs would_deny and runs. Runs as ctxguard_gateway; the tools are in fixtures.sql (quota_lab).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set lab '{"pageType": "quota_lab"}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
CREATE FUNCTION pg_temp.audit(cid text) RETURNS text LANGUAGE sql AS $$
    SELECT decision || ':' || coalesce(code, '-') FROM ctxguard.audit_log WHERE call_id = cid::uuid
$$;

-- Per user: two calls an hour, then refused until the hour rolls over.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.per_user')), 'ok', 'per user: call 1 of 2 runs');
SELECT is(pg_temp.code(ctxguard.call_tool('quota.per_user')), 'ok', 'per user: call 2 of 2 runs');
SELECT ctxguard.call_tool('quota.per_user') AS over \gset
SELECT is(pg_temp.code(:'over'), 'RATE_LIMIT_EXCEEDED', 'per user: call 3 is refused');
SELECT is(:'over'::jsonb->'error'->>'message', 'rate_limit: 2 calls per 1h per user: the quota is used up; retry after retry_after_ms',
          'the message names the limit');
SELECT ok((:'over'::jsonb->'error'->'details'->>'retry_after_ms')::bigint BETWEEN 1 AND 3600000,
          'retry_after_ms: until the hour rolls over');
SELECT is(:'over'::jsonb->'error'->'details'->'rate_limit', '{"per": "user", "calls": 2, "window": "1h"}'::jsonb,
          'the details name the limit that refused it');
SELECT is(pg_temp.audit(:'over'::jsonb->>'call_id'), 'deny:RATE_LIMIT_EXCEEDED', 'the refusal is audited');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.per_user')), 'ok', 'per user: another user has quota of their own');
COMMIT;

-- Per tenant: three calls an hour for all of acme's users together; globex has its own.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.per_tenant')), 'ok', 'per tenant: alice 1');
SELECT is(pg_temp.code(ctxguard.call_tool('quota.per_tenant')), 'ok', 'per tenant: alice 2');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.per_tenant')), 'ok', 'per tenant: bob 3');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_dave', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.per_tenant')), 'RATE_LIMIT_EXCEEDED', 'per tenant: dave (same tenant) is refused');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.per_tenant')), 'ok', 'per tenant: another tenant has its own');
COMMIT;

-- Two quotas: every window must have room; the one that refuses is named.
BEGIN;
SELECT ctxguard.set_context(:'tok_dave', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.two')), 'ok', 'two quotas: 1');
SELECT is(pg_temp.code(ctxguard.call_tool('quota.two')), 'ok', 'two quotas: 2');
SELECT ctxguard.call_tool('quota.two') AS two \gset
SELECT is(pg_temp.code(:'two'), 'RATE_LIMIT_EXCEEDED', 'two quotas: the tenant''s day is used up');
SELECT is(:'two'::jsonb->'error'->'details'->'rate_limit'->>'window', '1d', '... and it is the one named');
SELECT ok((:'two'::jsonb->'error'->'details'->>'retry_after_ms')::bigint BETWEEN 1 AND 86400000, '... retry after the UTC day');
COMMIT;

-- ROLLBACK after a counted call gives nothing back.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.rollback')), 'ok', 'rollback: a call runs');
ROLLBACK;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('quota.rollback')), 'ok', 'rollback: the second call runs');
SELECT is(pg_temp.code(ctxguard.call_tool('quota.rollback')), 'RATE_LIMIT_EXCEEDED',
          'rollback: the rolled-back call still counts');
COMMIT;

-- Nor does a savepoint rollback.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SAVEPOINT s;
SELECT is(pg_temp.code(ctxguard.call_tool('quota.savepoint')), 'ok', 'savepoint: a call runs');
ROLLBACK TO SAVEPOINT s;
SELECT is(pg_temp.code(ctxguard.call_tool('quota.savepoint')), 'ok', 'savepoint: the second call runs');
SELECT is(pg_temp.code(ctxguard.call_tool('quota.savepoint')), 'RATE_LIMIT_EXCEEDED',
          'savepoint: the call rolled back to the savepoint still counts');
COMMIT;

-- A dry run reads the quota and charges nothing.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT ctxguard.explain_call('quota.dry') AS d1 \gset
SELECT is(:'d1'::jsonb->>'decision', 'allow', 'dry run: allow');
SELECT is(:'d1'::jsonb->'quotas', '[{"per": "user", "window": "1h", "calls": 1, "used": 0, "retry_after_ms": null}]'::jsonb,
          'dry run: the quota''s state');
SELECT is(ctxguard.explain_call('quota.dry')->'quotas'->0->>'used', '0', 'dry run: a second dry run charged nothing either');
SELECT is(pg_temp.code(ctxguard.call_tool('quota.dry')), 'ok', 'dry run: the one real call runs');
SELECT ctxguard.explain_call('quota.dry') AS d2 \gset
SELECT is(:'d2'::jsonb->>'decision', 'deny', 'dry run: now it would be refused');
SELECT is(:'d2'::jsonb->>'code', 'RATE_LIMIT_EXCEEDED', '... with RATE_LIMIT_EXCEEDED');
SELECT is(:'d2'::jsonb->>'rule', 'rate_limit', '... by the rate_limit rule');
SELECT is(:'d2'::jsonb->'quotas'->0->>'used', '1', '... the quota used');
SELECT ok((:'d2'::jsonb->'quotas'->0->>'retry_after_ms')::bigint BETWEEN 1 AND 3600000, '... and when it has room again');
SELECT is(pg_temp.audit(:'d2'::jsonb->>'call_id'), 'dry_run:RATE_LIMIT_EXCEEDED', 'dry run: audited as a dry run');
SELECT is(pg_temp.code(ctxguard.call_tool('quota.dry')), 'RATE_LIMIT_EXCEEDED', 'dry run: the real call agrees');
COMMIT;

-- Shadow mode: an exceeded quota is logged as would_deny and the call runs.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT ctxguard.call_tool('quota.shadow') AS s1 \gset
SELECT is(pg_temp.audit(:'s1'::jsonb->>'call_id'), 'allow:-', 'shadow: within the quota, allowed');
SELECT ctxguard.call_tool('quota.shadow') AS s2 \gset
SELECT is(pg_temp.code(:'s2'), 'ok', 'shadow: over the quota, the call runs');
SELECT is(:'s2'::jsonb->'result', '{"pong": true}'::jsonb, '... and returns its result');
SELECT is(pg_temp.audit(:'s2'::jsonb->>'call_id'), 'would_deny:RATE_LIMIT_EXCEEDED', '... audited as would_deny with its code');
SELECT is(ctxguard.explain_call('quota.shadow')->'would_deny'->>'code', 'RATE_LIMIT_EXCEEDED', 'shadow: the dry run says so too');
COMMIT;

-- A call needing an approval counts when it runs, not when it is asked for.
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'lab') \g /dev/null
SELECT ctxguard.call_tool('quota.approval') AS a1 \gset
SELECT ctxguard.call_tool('quota.approval') AS a2 \gset
SELECT is(pg_temp.code(:'a1'), 'APPROVAL_REQUIRED', 'approval: the first call waits for its approval');
SELECT is(pg_temp.code(:'a2'), 'APPROVAL_REQUIRED', 'approval: so does a second (a pending call counts nothing)');
SELECT is(pg_temp.code(ctxguard.approve_call((:'a1'::jsonb->>'call_id')::uuid)), 'ok', 'approval: the approved call runs and counts');
SELECT is(pg_temp.code(ctxguard.approve_call((:'a2'::jsonb->>'call_id')::uuid)), 'RATE_LIMIT_EXCEEDED', 'approval: the second is over the quota');
SELECT is(pg_temp.code(ctxguard.call_tool('quota.approval')), 'RATE_LIMIT_EXCEEDED', 'approval: a new request is refused before it is recorded');
COMMIT;

-- explain_tools names the quotas among what Gate B still checks.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is((SELECT conditions FROM ctxguard.explain_tools() WHERE name = 'quota.two'),
          'rate_limit 3 per 1h per user; rate_limit 2 per 1d per tenant', 'explain_tools names the quotas');
SELECT is((SELECT conditions FROM ctxguard.explain_tools() WHERE name = 'quota.approval'),
          'rate_limit 1 per 1h per user; requires_approval', '... before the approval step, as Gate B checks them');
COMMIT;

SELECT * FROM finish();
