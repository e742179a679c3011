-- Issue 30: policies that look at the call. Conditions (`when`, `approval_when`: SQL predicates run
-- as the tool's run_as role on the bound arguments), shadow mode (`"mode": "log_only"`) and the dry
-- run (`explain_call`). Runs as ctxguard_gateway; the tools and predicates are in fixtures.sql.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set lab '{"pageType": "refund_lab", "entity": {"type": "invoice", "id": "acme_inv6"}}'
\set lab_paid '{"pageType": "refund_lab", "entity": {"type": "invoice", "id": "acme_inv4"}}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
CREATE FUNCTION pg_temp.refund(tool text, amount numeric) RETURNS jsonb LANGUAGE sql AS $$
    SELECT ctxguard.call_tool(tool, jsonb_build_object('amount', amount))
$$;
CREATE FUNCTION pg_temp.audit(cid text) RETURNS text LANGUAGE sql AS $$
    SELECT decision || ':' || coalesce(code, '-') FROM ctxguard.audit_log WHERE call_id = cid::uuid
$$;

-- A refund up to 500 runs; above, it needs an approval; above 5,000 it is refused.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is(pg_temp.code(pg_temp.refund('refund.issue', 499)), 'ok', 'when/approval_when: 499 runs');
SELECT is(pg_temp.code(pg_temp.refund('refund.issue', 500)), 'ok', 'when/approval_when: 500 runs');
SELECT pg_temp.refund('refund.issue', 501) AS r501 \gset
SELECT is(pg_temp.code(:'r501'), 'APPROVAL_REQUIRED', 'approval_when: 501 needs an approval');
SELECT pg_temp.refund('refund.issue', 5001) AS r5001 \gset
SELECT is(pg_temp.code(:'r5001'), 'POLICY_DENIED', 'when: 5,001 is refused');
SELECT is(:'r5001'::jsonb->'error'->>'message', 'the policy''s condition (when) does not hold for this call',
          'the refusal names the condition, not the amount');
SELECT is(pg_temp.audit(:'r5001'::jsonb->>'call_id'), 'deny:POLICY_DENIED', 'the refusal is audited with its code');
SELECT is((SELECT count(*)::int FROM t.touched() AS x(t) WHERE t = 'acme_inv6'), 2, 'only the two allowed refunds ran');
-- The approval runs it, and the condition is checked again then.
SELECT is(ctxguard.approve_call((:'r501'::jsonb->>'call_id')::uuid)->'result'->>'refunded', '501', 'the approved refund runs');
SELECT is((SELECT count(*)::int FROM t.touched() AS x(t) WHERE t = 'acme_inv6'), 3, '... once');
-- The bound entity is what the predicate sees: a spoofed id is refused before any condition.
SELECT is(pg_temp.code(ctxguard.call_tool('refund.issue', '{"amount": 1, "invoice_id": "acme_inv2"}')), 'ENTITY_MISMATCH',
          'a spoofed entity is refused');
COMMIT;

-- A condition on data: the invoice on the page is open, and the amount is within the user's own limit.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT is(pg_temp.code(pg_temp.refund('refund.within_limit', 999)), 'ok', 'data condition: within alice''s limit (1,000), open invoice');
SELECT is(pg_temp.code(pg_temp.refund('refund.within_limit', 1001)), 'POLICY_DENIED', 'data condition: above alice''s limit');
-- A hostile session: its own user_limits table first on the path, a huge limit in it.
CREATE TEMP TABLE user_limits (tenant_id text, user_id text, max_refund numeric);
INSERT INTO user_limits VALUES ('acme', 'alice', 1e9);
SET LOCAL search_path = pg_temp, attacker, public;
SELECT is(pg_temp.code(pg_temp.refund('refund.within_limit', 1001)), 'POLICY_DENIED',
          'a caller''s temp table and search_path do not change what the condition reads');
RESET search_path;
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab_paid') \g /dev/null
SELECT is(pg_temp.code(pg_temp.refund('refund.within_limit', 10)), 'POLICY_DENIED', 'data condition: the invoice on the page is paid');
COMMIT;
-- Carol (globex) has a large limit, but acme's invoice is not hers: the page is refused first.
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_carol', :'lab'), '22023', NULL,
                 'another tenant''s invoice cannot be the page entity');
ROLLBACK;

-- Conditions fail closed, and never leak what they saw.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT pg_temp.refund('refund.cond_boom', 1) AS boom \gset
SELECT is(pg_temp.code(:'boom'), 'POLICY_DENIED', 'a condition that raises refuses');
SELECT is(:'boom'::jsonb->'error'->>'message', 'the policy''s condition (when) could not be evaluated', '... saying so');
SELECT unalike(:'boom'::text, '%secret%', '... without its message or the arguments');
SELECT is(pg_temp.code(pg_temp.refund('refund.cond_null', 1)), 'POLICY_DENIED', 'a condition returning NULL refuses');
SELECT is(pg_temp.code(pg_temp.refund('refund.cond_globex', 1)), 'POLICY_DENIED', 'a condition cannot see another tenant''s rows');
SELECT is(pg_temp.code(pg_temp.refund('refund.cond_writes', 1)), 'POLICY_DENIED', 'a condition cannot write');
SELECT is((SELECT count(*)::int FROM t.touched() AS x(t) WHERE t = 'from-a-condition'), 0, '... nothing it wrote is kept');
COMMIT;

-- Dry run: the decision Gate B would take, the code and rule; nothing runs, nothing is recorded.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT count(*)::int AS touched_before FROM t.touched() AS x(t) WHERE t = 'acme_inv6' \gset
SELECT ctxguard.explain_call('refund.issue', '{"amount": 499}') AS e499 \gset
SELECT is(:'e499'::jsonb->>'decision', 'allow', 'dry run: 499 would run');
SELECT ctxguard.explain_call('refund.issue', '{"amount": 501}') AS e501 \gset
SELECT is(:'e501'::jsonb->>'decision' || ' ' || (:'e501'::jsonb->>'rule'), 'approval_required approval_when', 'dry run: 501 would need an approval');
SELECT is(pg_temp.code(ctxguard.approve_call((:'e501'::jsonb->>'call_id')::uuid)), 'APPROVAL_INVALID', '... and recorded none');
SELECT ctxguard.explain_call('refund.issue', '{"amount": 5001}') AS e5001 \gset
SELECT is(:'e5001'::jsonb->>'decision' || ' ' || (:'e5001'::jsonb->>'code') || ' ' || (:'e5001'::jsonb->>'rule'),
          'deny POLICY_DENIED when', 'dry run: 5,001 would be refused by when');
SELECT is(ctxguard.explain_call('refund.issue', '{"amount": 1, "invoice_id": "acme_inv2"}')->>'rule', 'entity_binding', 'dry run: a spoofed entity');
SELECT is(ctxguard.explain_call('refund.cond_boom', '{"amount": 1}')->>'code', 'POLICY_DENIED', 'dry run: a failing condition');
SELECT is(ctxguard.explain_call('invoice.list', '{}')->>'code', 'TOOL_NOT_VISIBLE', 'dry run: a tool of another page');
SELECT is(ctxguard.explain_call('no.such_tool', '{}')->>'code', 'TOOL_NOT_FOUND', 'dry run: an unknown tool');
SELECT is((SELECT count(*)::int FROM t.touched() AS x(t) WHERE t = 'acme_inv6'), :touched_before, 'dry runs ran no handler');
SELECT is(pg_temp.audit(:'e499'::jsonb->>'call_id'), 'dry_run:-', 'a dry run is audited as dry_run');
SELECT is(pg_temp.audit(:'e5001'::jsonb->>'call_id'), 'dry_run:POLICY_DENIED', '... with the code it would have returned');
COMMIT;
-- The dry run agrees with the real decision on every case above.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT results_eq(
    $$SELECT coalesce(ctxguard.explain_call(t, a)->>'code', 'ok') FROM (VALUES
        ('refund.issue', '{"amount": 499}'::jsonb), ('refund.issue', '{"amount": 500}'), ('refund.issue', '{"amount": 501}'),
        ('refund.issue', '{"amount": 5001}'), ('refund.within_limit', '{"amount": 999}'), ('refund.within_limit', '{"amount": 1001}'),
        ('refund.cond_null', '{"amount": 1}'), ('refund.cond_globex', '{"amount": 1}'), ('refund.cond_writes', '{"amount": 1}')) v(t, a)$$,
    $$SELECT pg_temp.code(ctxguard.call_tool(t, a)) FROM (VALUES
        ('refund.issue', '{"amount": 499}'::jsonb), ('refund.issue', '{"amount": 500}'), ('refund.issue', '{"amount": 501}'),
        ('refund.issue', '{"amount": 5001}'), ('refund.within_limit', '{"amount": 999}'), ('refund.within_limit', '{"amount": 1001}'),
        ('refund.cond_null', '{"amount": 1}'), ('refund.cond_globex', '{"amount": 1}'), ('refund.cond_writes', '{"amount": 1}')) v(t, a)$$,
    'the dry run matches the real decision');
ROLLBACK;
SELECT is(ctxguard.explain_call('refund.issue', '{"amount": 1}')->>'code', 'CONTEXT_MISSING', 'dry run without a context');

-- Shadow mode: the stricter policy is evaluated and logged, and the call runs.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT ok(EXISTS (SELECT 1 FROM ctxguard.visible_tools() WHERE name = 'refund.shadow'), 'shadow: listed although alice lacks the role');
SELECT pg_temp.refund('refund.shadow', 6000) AS s \gset
SELECT is(:'s'::jsonb->'result'->>'refunded', '6000', 'shadow: a call the policy would refuse runs');
SELECT is(pg_temp.audit(:'s'::jsonb->>'call_id'), 'would_deny:TOOL_NOT_VISIBLE', '... audited as would_deny with the first refusal''s code');
SELECT is(ctxguard.explain_call('refund.shadow', '{"amount": 6000}')->'would_deny'->>'code', 'TOOL_NOT_VISIBLE', 'dry run shows the shadowed refusal');
SELECT is(pg_temp.code(ctxguard.call_tool('refund.shadow', '{"amount": 1, "invoice_id": "acme_inv2"}')), 'ENTITY_MISMATCH',
          'shadow: a spoofed entity is still refused');
SELECT is(pg_temp.code(ctxguard.call_tool('refund.shadow', '{"amount": "many"}')), 'INVALID_ARGUMENT', 'shadow: the schema is still enforced');
COMMIT;
-- On another page of the same entity, the page condition is shadowed; on a page without the entity it is not.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv6"}}') \g /dev/null
SELECT ctxguard.call_tool('refund.shadow', '{"amount": 5}') AS s2 \gset
SELECT is(pg_temp.audit(:'s2'::jsonb->>'call_id'), 'would_deny:TOOL_NOT_VISIBLE', 'shadow: another page with the same entity runs, logged');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_table"}') \g /dev/null
SELECT is(pg_temp.code(ctxguard.call_tool('refund.shadow', '{"amount": 5, "invoice_id": "acme_inv6"}')), 'TOOL_NOT_VISIBLE',
          'shadow: a page without the entity is refused (binding is never shadowed)');
COMMIT;

-- explain_tools names what Gate B will still check (never evaluating it).
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT results_eq($$SELECT name, visible, conditions FROM ctxguard.explain_tools() WHERE name IN ('refund.issue', 'refund.shadow', 'refund.four_eyes') ORDER BY name$$,
                  $$VALUES ('refund.four_eyes', true, 'requires_approval; approver_roles admin,ap_clerk'),
                           ('refund.issue', true, 'when t.refund_allowed(jsonb); approval_when t.refund_needs_approval(jsonb)'),
                           ('refund.shadow', true, 'when t.refund_allowed(jsonb); log_only would_deny:missing_role')$$,
                  'explain_tools: a conditional tool is visible, its conditions named');
COMMIT;

SELECT * FROM finish();
