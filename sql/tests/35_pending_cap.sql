-- A user's calls waiting for an approval are capped (50 at once), so that one user cannot push the
-- rest of the tenant's requests out of the approvers' list (its 200 oldest) on their own. Found by
-- an attacker's review: a call that needs an approval was recorded whatever the user had waiting.
-- Runs as ctxguard_gateway; refund.four_eyes in fixtures.sql.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set lab '{"pageType": "refund_lab", "entity": {"type": "invoice", "id": "acme_inv6"}}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;

-- The calls in a transaction rolled back at the end (their pending rows with it); the outcomes
-- are kept in variables and checked after (pgTAP's own records would be rolled back too).
BEGIN;
-- A user of this run alone (nothing of theirs waits yet).
SELECT ctxguard.set_context(:'tok_reader', :'lab') \g /dev/null
SELECT count(*) AS waiting FROM pg_catalog.generate_series(1, 50) g
 WHERE pg_temp.code(ctxguard.call_tool('refund.four_eyes', '{"amount": 1}')) = 'APPROVAL_REQUIRED' \gset
SELECT ctxguard.call_tool('refund.four_eyes', '{"amount": 1}') AS over \gset
-- Another user of the tenant still asks.
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT pg_temp.code(ctxguard.call_tool('refund.four_eyes', '{"amount": 2}')) AS other \gset
ROLLBACK;
SELECT is(:waiting::int, 50, '50 calls wait for an approval');
SELECT is(pg_temp.code(:'over'), 'RATE_LIMIT_EXCEEDED', 'the 51st is refused');
SELECT is(:'over'::jsonb->'error'->>'message', 'pending_approvals: 50 calls of this user already wait for an approval',
          'with why');
BEGIN;
SELECT ctxguard.set_context(:'tok_reader', :'lab') \g /dev/null
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log WHERE call_id = (:'over'::jsonb->>'call_id')::uuid AND code = 'RATE_LIMIT_EXCEEDED'),
          1, 'and audited');
COMMIT;
SELECT is(:'other'::text, 'APPROVAL_REQUIRED', 'another user''s call still waits for an approval');
SELECT * FROM finish();
