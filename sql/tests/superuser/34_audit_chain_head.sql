-- The ledger writer finds a tenant's audit chain head (the last row_hash it wrote for the tenant)
-- through the tenant's own index range, whatever plan the statistics suggest (issue 34; found by
-- bench/scale.sh's tenants curve, where every tenant new to the writer cost it about 15 ms at
-- 50,000 audit rows and the one writer stalled every tenant's calls: 800 tps fell to 70).
--
-- The lookup ran `WHERE tenant_id = $1 ... ORDER BY id DESC LIMIT 1` from a kept plan. With
-- statistics of a table holding few tenants, the generic plan walks the primary key backwards and
-- filters on the tenant: for a tenant whose last row lies behind many of other tenants' rows (a
-- new tenant: behind all of them), it reads every one of them. The writer runs the lookup on its
-- generic plan from the first lookup on (made with the planner's own settings), 20,000 acme rows
-- lie after
-- globex's last row (not committed: index entries all the same, which a scan reads), and a globex
-- call needs globex's chain head. The writer's primary-key reads are counted from its statistics,
-- which it reports when it exits; that they arrived is checked (its scans of the tenants' index),
-- and so is the trap itself (the old lookup, planned generically here, walks the primary key).
-- Runs as the superuser (the DBA); the calls as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\ir ../lib/gateway_call.sql
\ir ../lib/writer.sql
-- A run stopped half-way must not leave its database setting to the next.
SELECT format('ALTER DATABASE %I RESET plan_cache_mode', current_database()) \gexec

-- Index entries of an index of audit_log read by scans, as reported so far.
CREATE FUNCTION pg_temp.reads(idx text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    PERFORM pg_stat_clear_snapshot();
    SELECT idx_tup_read INTO n FROM pg_stat_all_indexes
     WHERE schemaname = 'ctxguard' AND indexrelname = idx;
    RETURN n;
END $$;
-- Scans of an index of audit_log, once (up to 10 s) they exceed `more_than` (an exiting process
-- reports them just after it leaves pg_stat_activity); their count.
CREATE FUNCTION pg_temp.scans(idx text, more_than bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    FOR i IN 1 .. 100 LOOP
        PERFORM pg_stat_clear_snapshot();
        SELECT idx_scan INTO n FROM pg_stat_all_indexes
         WHERE schemaname = 'ctxguard' AND indexrelname = idx;
        EXIT WHEN n > more_than;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN n;
END $$;
-- The lines of EXPLAIN of `q`.
CREATE FUNCTION pg_temp.explain(q text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE l text;
BEGIN
    FOR l IN EXECUTE 'EXPLAIN ' || q LOOP
        RETURN NEXT l;
    END LOOP;
END $$;
-- As the gateway: invoice.get for `tok` on `invoice` (in the caller's transaction); its status.
CREATE FUNCTION pg_temp.call(tok text, invoice text) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(r->'error'->>'code', r->>'status')
      FROM pg_temp.gateway_call(tok, jsonb_build_object('pageType', 'invoice_detail',
               'entity', jsonb_build_object('type', 'invoice', 'id', invoice))) AS r
$$;

-- Both tenants have chain heads, and the statistics see the table as it is.
BEGIN;
SELECT is(pg_temp.call(:'tok_carol', 'glx_inv3'), 'ok', 'a globex call before');
COMMIT;
BEGIN;
SELECT is(pg_temp.call(:'tok_alice', 'acme_inv3'), 'ok', 'an acme call before');
COMMIT;
ANALYZE ctxguard.audit_log;

-- The setting makes the old lookup's plan the primary key's walk (so this test still sets the
-- trap on this major and with these statistics).
SET plan_cache_mode = force_generic_plan;
PREPARE old_lookup(text) AS SELECT row_hash FROM ctxguard.audit_log
 WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND row_hash IS NOT NULL ORDER BY id DESC LIMIT 1;
SELECT ok(EXISTS (SELECT FROM pg_temp.explain('EXECUTE old_lookup(''globex'')') AS e(line) WHERE line LIKE '%Index Scan Backward using audit_log_pkey%'),
          'the old lookup, planned generically, walks the primary key');
DEALLOCATE old_lookup;
RESET plan_cache_mode;

-- From here to the RESET below, an error must not stop the file before the RESET.
\set ON_ERROR_STOP 0
SELECT ok(pg_temp.stop_writer(), 'the writer has exited (the next one plans generically)');
SELECT pg_temp.reads('audit_log_pkey') AS reads_before \gset
SELECT pg_temp.scans('audit_log_tenant_id_idx', -1) AS scans_before \gset

BEGIN;
INSERT INTO ctxguard.audit_log (call_id, tenant_id, user_id, tool, decision)
SELECT gen_random_uuid(), 'acme', 'filler', 'invoice.get', 'allow' FROM generate_series(1, 20000);
SELECT is(pg_temp.call(:'tok_carol', 'glx_inv3'), 'ok', 'a globex call behind 20,000 acme rows: a new writer finds its chain head');
ROLLBACK;
-- The rolled-back rows' index entries out of acme's range, for the tests after this one.
VACUUM ctxguard.audit_log;

SELECT ok(pg_temp.stop_writer(), 'the writer has exited (and reported its statistics)');
SELECT format('ALTER DATABASE %I RESET plan_cache_mode', current_database()) \gexec
\set ON_ERROR_STOP 1
SELECT cmp_ok(pg_temp.scans('audit_log_tenant_id_idx', :scans_before), '>', :scans_before::bigint,
              'the writer''s statistics arrived: it looked in the tenants'' index');
SELECT cmp_ok(pg_temp.reads('audit_log_pkey') - :reads_before, '<', 1000::bigint,
              'the chain head is found in the tenant''s index range: the writer did not walk the other tenants'' rows');

-- The chain is still whole after it.
BEGIN;
SELECT is(pg_temp.call(:'tok_carol', 'glx_inv3'), 'ok', 'a globex call after');
COMMIT;
SELECT is((ctxguard.verify_audit('globex')->>'intact')::boolean, true, 'globex''s chain is intact');

SELECT * FROM finish();
