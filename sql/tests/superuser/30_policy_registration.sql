-- Issue 30: what registration accepts as a policy condition, and what lint() reports about
-- conditions and shadow mode. As the DBA (postgres), everything rolled back.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
BEGIN;
SET LOCAL ctxguard.default_run_as = 'ctxguard_tools';
CREATE SCHEMA cond;
CREATE FUNCTION cond.ok(args jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
CREATE FUNCTION cond.volatile(args jsonb) RETURNS boolean LANGUAGE sql VOLATILE AS $$ SELECT true $$;
CREATE FUNCTION cond.text_result(args jsonb) RETURNS text LANGUAGE sql STABLE AS $$ SELECT 'yes' $$;
CREATE FUNCTION cond.two_args(args jsonb, extra int) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
CREATE FUNCTION cond.set_result(args jsonb) RETURNS SETOF boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
CREATE FUNCTION cond.by_superuser(args jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true $$;
CREATE FUNCTION cond.definer(args jsonb) RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER AS $$ SELECT true $$;
ALTER FUNCTION cond.ok(jsonb) OWNER TO ctxguard_test_owner;
ALTER FUNCTION cond.volatile(jsonb) OWNER TO ctxguard_test_owner;
ALTER FUNCTION cond.text_result(jsonb) OWNER TO ctxguard_test_owner;
ALTER FUNCTION cond.two_args(jsonb, int) OWNER TO ctxguard_test_owner;
ALTER FUNCTION cond.set_result(jsonb) OWNER TO ctxguard_test_owner;
ALTER FUNCTION cond.definer(jsonb) OWNER TO ctxguard_test_owner;
CREATE FUNCTION pg_temp.reg(name text, policy jsonb) RETURNS void LANGUAGE sql AS $$
    SELECT ctxguard.register_tool(name, 'A conditional tool.', '{"type": "object"}', 't.refund(jsonb)', policy)
$$;

SELECT lives_ok($$SELECT pg_temp.reg('cond.fine', '{"page_types": ["refund_lab"], "when": "cond.ok", "approval_when": "cond.ok(jsonb)"}')$$,
                'a STABLE (jsonb) -> boolean condition owned by a plain role registers');
SELECT is((SELECT when_fn::text || ' ' || approval_when_fn::text || ' ' || mode FROM ctxguard.tool_policies WHERE tool = 'cond.fine'),
          'cond.ok(jsonb) cond.ok(jsonb) enforce', 'both conditions are recorded by signature');
SELECT throws_ok($$SELECT pg_temp.reg('cond.missing', '{"page_types": ["refund_lab"], "when": "cond.nothing"}')$$,
                 '22023', 'ctxguard: when: no function cond.nothing(jsonb)', 'an unknown function is refused');
SELECT throws_ok($$SELECT pg_temp.reg('cond.vol', '{"page_types": ["refund_lab"], "when": "cond.volatile"}')$$,
                 '22023', 'ctxguard: when: must be STABLE or IMMUTABLE (it runs read-only, on the call''s snapshot)', 'a VOLATILE function is refused');
SELECT throws_ok($$SELECT pg_temp.reg('cond.txt', '{"page_types": ["refund_lab"], "approval_when": "cond.text_result"}')$$,
                 '22023', 'ctxguard: approval_when: must be a function (args jsonb) RETURNS boolean', 'a function returning text is refused');
SELECT throws_ok($$SELECT pg_temp.reg('cond.set', '{"page_types": ["refund_lab"], "when": "cond.set_result"}')$$,
                 '22023', 'ctxguard: when: must be a function (args jsonb) RETURNS boolean', 'a set-returning function is refused');
SELECT throws_ok($$SELECT pg_temp.reg('cond.two', '{"page_types": ["refund_lab"], "when": "cond.two_args"}')$$,
                 '22023', 'ctxguard: when: no function cond.two_args(jsonb)', 'another signature is not the condition''s');
SELECT throws_ok($$SELECT pg_temp.reg('cond.su', '{"page_types": ["refund_lab"], "when": "cond.by_superuser"}')$$,
                 '22023', 'ctxguard: when: must not be owned by a superuser or the extension owner', 'a superuser''s function is refused');
SELECT throws_ok($$SELECT pg_temp.reg('cond.unqualified', '{"page_types": ["refund_lab"], "when": "ok"}')$$,
                 '22023', NULL, 'an unqualified name is refused');
SELECT throws_ok($$SELECT pg_temp.reg('cond.both', '{"page_types": ["refund_lab"], "requires_approval": true, "approval_when": "cond.ok"}')$$,
                 '22023', NULL, 'requires_approval and approval_when together are refused');
SELECT throws_ok($$SELECT ctxguard.set_tool_policy('read_doc_pages', '{"page_types": "*", "when": "cond.ok"}')$$,
                 '22023', 'ctxguard: when and approval_when apply to SQL tools only', 'built-in tools take no conditions');
SELECT throws_ok($$SELECT ctxguard.set_server_policy('up', '{"page_types": "*", "when": "cond.ok"}')$$,
                 '22023', 'ctxguard: invalid tool policy: when and approval_when apply to SQL tools only', 'nor do upstream servers'' defaults');
SELECT throws_ok($$SELECT pg_temp.reg('cond.mode', '{"page_types": ["refund_lab"], "mode": "audit"}')$$,
                 '22023', NULL, 'an unknown mode is refused');

-- lint: a condition changed after registration, and shadow mode.
SELECT pg_temp.reg('cond.shadowed', '{"page_types": ["refund_lab"], "when": "cond.definer", "mode": "log_only"}');
ALTER FUNCTION cond.ok(jsonb) VOLATILE;
ALTER FUNCTION cond.definer(jsonb) OWNER TO postgres;
SELECT set_eq($$SELECT kind, object FROM ctxguard.lint() WHERE kind LIKE 'policy_condition%' OR (kind = 'tool_in_shadow_mode' AND object LIKE 'cond.%')$$,
              $$VALUES ('policy_condition_not_stable', 'cond.ok(jsonb)'), ('policy_condition_definer_unpinned', 'cond.definer(jsonb)'),
                       ('policy_condition_privileged_owner', 'cond.definer(jsonb)'), ('tool_in_shadow_mode', 'cond.shadowed')$$,
              'lint reports a VOLATILE condition, an unpinned definer, a privileged owner and shadow mode');

-- A condition's plan is kept across calls (as a handler's body): replacing the function is seen at
-- once, in the same session, and the replaced body's meaning is what decides.
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "refund_lab", "entity": {"type": "invoice", "id": "acme_inv6"}}') \g /dev/null
SELECT is(ctxguard.explain_call('refund.issue', '{"amount": 600}')->>'code', 'APPROVAL_REQUIRED', 'kept condition: 600 needs an approval');
SELECT is(ctxguard.explain_call('refund.issue', '{"amount": 600}')->>'code', 'APPROVAL_REQUIRED', '... again, from the kept plan');
CREATE OR REPLACE FUNCTION t.refund_needs_approval(args jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT (args->>'amount')::numeric > 1000 $$;
SELECT is(ctxguard.explain_call('refund.issue', '{"amount": 600}')->>'decision', 'allow', 'the replaced condition decides at once');
CREATE OR REPLACE FUNCTION t.refund_needs_approval(args jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT NULL::boolean $$;
SELECT is(ctxguard.explain_call('refund.issue', '{"amount": 600}')->>'code', 'POLICY_DENIED', 'a replaced condition returning NULL fails closed');
CREATE OR REPLACE FUNCTION t.refund_needs_approval(args jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$ SELECT true WHERE false $$;
SELECT is(ctxguard.explain_call('refund.issue', '{"amount": 600}')->>'code', 'POLICY_DENIED', '... and one returning no row');
-- pgTAP's counters live in the transaction: finish first.
SELECT * FROM finish();
ROLLBACK;
