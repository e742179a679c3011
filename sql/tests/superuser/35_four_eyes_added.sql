-- Four eyes added to a tool's policy also hold for the calls already waiting (SECURITY_MATRIX C,
-- issue 30). Found by an attacker's review: a call requested while the policy let the user approve
-- it themselves stayed theirs to approve for up to the approval TTL after a DBA had added
-- approvers, and Gate B does not ask for an approval again when an approved call runs.
-- Runs as a superuser (the DBA changes the policy); the calls as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set detail '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv1"}}'
\set args '{"invoice_id": "acme_inv1"}'
-- As the gateway, with alice's context: `stmt`'s one value.
CREATE FUNCTION pg_temp.as_alice(tok text, page jsonb, stmt text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page);
    EXECUTE stmt INTO r;
    RESET ROLE;
    RETURN r;
END $$;

BEGIN;
SELECT pg_temp.as_alice(:'tok_alice', :'detail', format('SELECT ctxguard.call_tool(%L, %L)', 'invoice.mark_paid', :'args')) AS req \gset
COMMIT;
SELECT is(:'req'::jsonb->'error'->>'code', 'APPROVAL_REQUIRED', 'the call waits for the user''s own approval');
SELECT :'req'::jsonb->>'call_id' AS cid \gset
SELECT is((SELECT approver_roles FROM ctxguard.approvals WHERE call_id = :'cid'::uuid), NULL, 'requested without approvers');

-- The DBA adds approvers (four eyes).
SELECT ctxguard.set_tool_policy('invoice.mark_paid',
    '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "roles": ["ap_clerk"],
      "read_only": false, "danger": "moderate", "requires_approval": true, "approver_roles": ["admin"], "run_as": "ctxguard_tools"}') \g /dev/null

BEGIN;
SELECT pg_temp.as_alice(:'tok_alice', :'detail', format('SELECT ctxguard.approve_call(%L)', :'cid')) AS approved \gset
ROLLBACK;
SELECT is(:'approved'::jsonb->'error'->>'code', 'APPROVAL_INVALID', 'the requester can no longer approve it themselves');
SELECT is((SELECT status FROM ctxguard.approvals WHERE call_id = :'cid'::uuid), 'pending', 'it stays pending (until it expires)');

-- The policy as it was (fixtures.sql).
SELECT ctxguard.set_tool_policy('invoice.mark_paid',
    '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "roles": ["ap_clerk"],
      "read_only": false, "danger": "moderate", "requires_approval": true, "run_as": "ctxguard_tools"}') \g /dev/null
SELECT is((SELECT approver_roles FROM ctxguard.tool_policies WHERE tool = 'invoice.mark_paid'), '{}'::text[], 'the policy is back as it was');
SELECT * FROM finish();
