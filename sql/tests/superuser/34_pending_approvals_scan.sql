-- An approver's list reads its own tenant's pending calls, not every tenant's (issue 34; found in a
-- review of the chain-head fix). `pending_approvals()` filtered `ctxguard.approvals` by tenant and
-- status with no index to do it: every approver's list read every approval of every tenant ever
-- requested (approvals are kept after they are decided), so one tenant's users, requesting calls
-- that need four eyes, made every other tenant's approvers pay for them. Here 3,000 pending acme
-- approvals stand beside globex's list; the rows this transaction's scans of the table read are
-- counted (pg_stat_xact_all_tables: this backend's own, the owner's reads inside the function
-- included).
-- Runs as the superuser (the DBA); the list as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- Rows of ctxguard.approvals read by this transaction's scans so far (sequential and index).
CREATE FUNCTION pg_temp.rows_read() RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_all_tables
     WHERE schemaname = 'ctxguard' AND relname = 'approvals'
$$;
-- As the gateway: the number of calls `tok`'s user may decide (in the caller's transaction), after
-- one live globex call is requested and the table analyzed; "listed/rows read by the list".
CREATE FUNCTION pg_temp.listed(tok text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE n bigint; before bigint;
BEGIN
    INSERT INTO ctxguard.approvals (call_id, tenant_id, user_id, tool, args, args_hash, expires_at, approver_roles)
    VALUES (gen_random_uuid(), 'globex', 'someone', 'invoice.get', '{}', 'x', now() + interval '1 hour', '{ap_clerk}');
    ANALYZE ctxguard.approvals;
    before := pg_temp.rows_read();
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv3"}}');
    SELECT count(*) INTO n FROM ctxguard.pending_approvals();
    RESET ROLE;
    RETURN n || '/' || (pg_temp.rows_read() - before);
END $$;

BEGIN;
INSERT INTO ctxguard.approvals (call_id, tenant_id, user_id, tool, args, args_hash, expires_at, approver_roles)
SELECT gen_random_uuid(), 'acme', 'filler', 'invoice.get', '{}', 'x', now() + interval '1 hour', '{ap_clerk}'
  FROM generate_series(1, 3000);
SELECT pg_temp.listed(:'tok_carol') AS beside \gset
-- The filler goes (and pgTAP's results are recorded after it, so that they stay).
ROLLBACK;
SELECT is(split_part(:'beside', '/', 1)::bigint, 1::bigint, 'globex''s approver is listed globex''s one pending call');
SELECT cmp_ok(split_part(:'beside', '/', 2)::bigint, '<', 100::bigint,
              'the list read globex''s pending calls, not the 3,000 of acme');

-- Nor a tenant's own expired calls: a pending approval no one decides stays `pending` after it
-- expires (nothing moves it), so the tenant's range of the pending index began with every call
-- that ever expired undecided, read on each list. An approval lives at most a day (approval_ttl and
-- tenant_limits.approval_ttl are at most 86,400 s, from its creation), so the list starts a day back.
-- Here 3,000 globex calls that expired undecided (created two days ago) stand before one live call.
BEGIN;
INSERT INTO ctxguard.approvals (call_id, tenant_id, user_id, tool, args, args_hash, created_at, expires_at, approver_roles)
SELECT gen_random_uuid(), 'globex', 'filler', 'invoice.get', '{}', 'x', now() - interval '2 days',
       now() - interval '2 days' + interval '15 minutes', '{ap_clerk}'
  FROM generate_series(1, 3000);
SELECT pg_temp.listed(:'tok_carol') AS behind \gset
ROLLBACK;
SELECT is(split_part(:'behind', '/', 1)::bigint, 1::bigint, 'behind 3,000 expired undecided calls, the approver is listed the live one');
SELECT cmp_ok(split_part(:'behind', '/', 2)::bigint, '<', 100::bigint,
              format('the list read %s rows, not the 3,000 expired calls', split_part(:'behind', '/', 2)));

SELECT * FROM finish();
