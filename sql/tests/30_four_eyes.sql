-- Issue 30: approvals by someone else (four eyes). A policy's approver_roles: only a user of the
-- same tenant holding one of them, never the requester, grants or rejects; the requester then runs
-- the granted call once. Runs as ctxguard_gateway; tools in fixtures.sql.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set lab '{"pageType": "refund_lab", "entity": {"type": "invoice", "id": "acme_inv6"}}'
\set table_page '{"pageType": "invoice_table"}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
CREATE FUNCTION pg_temp.as_user(tok text, page text, stmt text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    PERFORM ctxguard.set_context(tok, page::jsonb);
    EXECUTE stmt INTO r;
    RETURN r;
END $$;

-- Alice (ap_clerk) asks for a refund; it waits for someone else.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT ctxguard.call_tool('refund.four_eyes', '{"amount": 40, "note": "call me at alice.private@example.com"}') AS req \gset
SELECT is(pg_temp.code(:'req'), 'APPROVAL_REQUIRED', 'four eyes: the call waits for an approval');
SELECT :'req'::jsonb->>'call_id' AS cid \gset
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'the requester cannot approve it');
SELECT is_empty('SELECT * FROM ctxguard.pending_approvals()', 'the requester is not shown it to decide');
COMMIT;
-- Nobody else but an approver of the tenant may decide.
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'table_page') \g /dev/null
SELECT is_empty('SELECT * FROM ctxguard.pending_approvals()', 'a user without an approver role sees nothing');
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'a user without the role cannot approve');
SELECT is(pg_temp.code(ctxguard.reject_call(:'cid', 'no')), 'APPROVAL_INVALID', '... nor reject');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', :'table_page') \g /dev/null
SELECT is_empty('SELECT * FROM ctxguard.pending_approvals()', 'an approver of another tenant sees nothing');
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'an approver of another tenant cannot approve');
COMMIT;
-- The approver (root, admin) sees what they approve, masked, and grants it from any page.
BEGIN;
SELECT ctxguard.set_context(:'tok_root', :'table_page') \g /dev/null
SELECT results_eq($$SELECT call_id::text, tool, requested_by, entity_id, args->>'amount' FROM ctxguard.pending_approvals() WHERE call_id = '$$ || :'cid' || $$'$$,
                  format($$VALUES (%L, 'refund.four_eyes', 'alice', 'acme_inv6', '40')$$, :'cid'),
                  'the approver sees the bound call: tool, requester, entity and arguments');
SELECT unalike((SELECT args->>'note' FROM ctxguard.pending_approvals() WHERE call_id = :'cid'::uuid), '%alice.private@%',
               '... its arguments masked');
SELECT count(*)::int AS ran_before FROM t.touched() AS x(t) WHERE t = 'acme_inv6' \gset
SELECT ctxguard.approve_call(:'cid') AS granted \gset
SELECT is(:'granted'::jsonb->>'status' || ' ' || (:'granted'::jsonb->>'requested_by'), 'granted alice', 'the approver grants it');
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'a second grant does nothing');
SELECT is((SELECT count(*)::int FROM t.touched() AS x(t) WHERE t = 'acme_inv6'), :ran_before, 'granting runs nothing');
COMMIT;
-- The requester runs it once, under their own identity, from its page.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', 'the granted call runs only from its entity''s page');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is(ctxguard.approve_call(:'cid')->'result'->>'refunded', '40', 'the requester runs the granted call');
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid')), 'APPROVAL_INVALID', '... exactly once');
SELECT is((SELECT count(*)::int FROM t.touched() AS x(t) WHERE t = 'acme_inv6'), :ran_before + 1, 'the handler ran once');
-- The audit trail of the call holds both users.
SELECT results_eq(format($$SELECT decision, user_id FROM ctxguard.audit_log WHERE call_id = %L AND decision IN ('pending', 'granted', 'allow') ORDER BY id$$, :'cid'),
                  $$VALUES ('pending', 'alice'), ('granted', 'root'), ('allow', 'alice')$$,
                  'audited: requested by alice, granted by root, run by alice');
COMMIT;

-- Reject, then approve: fails.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT ctxguard.call_tool('refund.four_eyes', '{"amount": 41}')->>'call_id' AS cid2 \gset
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_root', :'table_page') \g /dev/null
SELECT is(pg_temp.code(ctxguard.reject_call(:'cid2', repeat('x', 501))), 'INVALID_ARGUMENT', 'a reason over 500 bytes is refused');
SELECT is(pg_temp.code(ctxguard.reject_call(:'cid2', repeat('a@b.io ', 70))), 'INVALID_ARGUMENT', 'a reason longer than 500 bytes once masked is refused, cleanly');
SELECT is(pg_temp.code(ctxguard.reject_call(:'cid2', 'not this month')), 'rejected', 'the approver rejects it');
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid2')), 'APPROVAL_INVALID', 'a rejected call cannot be granted');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid2')), 'APPROVAL_INVALID', 'nor run');
SELECT is((SELECT decision || ':' || user_id FROM ctxguard.audit_log WHERE call_id = :'cid2'::uuid AND decision = 'rejected'), 'rejected:root',
          'the rejection is audited under the approver');
-- The requester may withdraw their own pending call.
SELECT ctxguard.call_tool('refund.four_eyes', '{"amount": 42}')->>'call_id' AS cid3 \gset
SELECT is(pg_temp.code(ctxguard.reject_call(:'cid3')), 'rejected', 'the requester withdraws their own call');
-- approval_when with approvers: below the threshold it runs, above it waits for an admin.
SELECT is(pg_temp.code(ctxguard.call_tool('refund.big_four_eyes', '{"amount": 100}')), 'ok', 'approval_when false: runs');
SELECT ctxguard.call_tool('refund.big_four_eyes', '{"amount": 600}')->>'call_id' AS cid4 \gset
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_dave', :'table_page') \g /dev/null
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid4')), 'APPROVAL_INVALID', 'approval_when true: a viewer cannot approve');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_root', :'table_page') \g /dev/null
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid4')), 'granted', 'approval_when true: the admin grants');
COMMIT;
SELECT is(pg_temp.code(ctxguard.approve_call(:'cid4')), 'CONTEXT_MISSING', 'no context: nothing');
SELECT is_empty('SELECT * FROM ctxguard.pending_approvals()', 'no context: no pending approvals');
SELECT * FROM finish();
