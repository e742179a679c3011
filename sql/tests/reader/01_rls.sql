-- SECURITY_MATRIX A.2-A.6, B.10, B.11, B.14: row-level security itself, proven as ctxguard_reader, a
-- login role (NOSUPERUSER NOBYPASSRLS) with SELECT on the demo tables. (The gateway role has no table
-- privileges at all since 0.2.0; its tests are in ../0*.sql.)
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set table_page '{"pageType": "invoice_table"}'

SELECT ok(NOT rolsuper AND NOT rolbypassrls, 'runs as a role that RLS applies to') FROM pg_roles WHERE rolname = current_user;
SELECT is(current_user::text, 'ctxguard_reader', 'runs as the reader role');

-- A.2 no context → zero rows
SELECT is((SELECT count(*)::int FROM demo.invoices), 0, 'A.2 no context: zero invoices');
SELECT is((SELECT count(*)::int FROM demo.vendors), 0, 'A.2 no context: zero vendors');
SELECT is((SELECT count(*)::int FROM demo.matters), 0, 'A.2 no context: zero matters');
SELECT is((SELECT count(*)::int FROM t.touches), 0, 'A.2 no context: zero touches');

-- A.3 row_security = off must error, never return rows
SET row_security = off;
SELECT throws_ok($$SELECT count(*) FROM demo.invoices$$, '42501', NULL, 'A.3 row_security=off errors');
RESET row_security;

-- A.4 one prepared statement, generic plan, tenant A then tenant B on one connection
SET plan_cache_mode = force_generic_plan;
PREPARE inv_tenants AS SELECT DISTINCT tenant_id FROM demo.invoices;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT results_eq('EXECUTE inv_tenants', $$VALUES ('acme')$$, 'A.4 prepared statement sees tenant A only');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', :'table_page') \g /dev/null
SELECT results_eq('EXECUTE inv_tenants', $$VALUES ('globex')$$, 'A.4 same prepared statement then sees tenant B only');
COMMIT;
SELECT is_empty('EXECUTE inv_tenants', 'A.4 same prepared statement without context sees nothing');
RESET plan_cache_mode;

-- A.5 a cheap leaky function in WHERE cannot observe other tenants' values
CREATE TEMP TABLE seen (v text);
CREATE FUNCTION pg_temp.leak(v text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN INSERT INTO seen VALUES (v); RETURN true; END $$;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT is((SELECT count(*)::int FROM demo.invoices WHERE pg_temp.leak(tenant_id || ':' || number)), 12, 'A.5 own rows visible');
COMMIT;
SELECT ok((SELECT count(*) FROM seen) > 0, 'A.5 the leaky function ran');
SELECT is((SELECT count(*)::int FROM seen WHERE v NOT LIKE 'acme:%'), 0, 'A.5 it never saw another tenant''s row');

-- A.6 duplicate keys do not reveal another tenant's row
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "vendor_table"}') \g /dev/null
SELECT lives_ok($$INSERT INTO demo.vendors VALUES ('acme', 'glx_v1', 'Copycat', 'DE', 'a@b.example')$$,
                'A.6 an id that exists in another tenant can be used: nothing collides, nothing is revealed');
SELECT throws_ok($$INSERT INTO demo.vendors VALUES ('globex', 'glx_v1', 'Intruder', 'DE', 'a@b.example')$$, '42501',
                 'new row violates row-level security policy for table "vendors"', 'A.6 writing into another tenant is refused by RLS, not by a key');
ROLLBACK;

-- B.10 after COMMIT the context is gone, and so are the rows
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT is((SELECT count(*)::int FROM demo.invoices), 12, 'B.10 in the transaction: the tenant''s rows');
COMMIT;
SELECT is((SELECT count(*)::int FROM demo.invoices), 0, 'B.10 after COMMIT RLS sees nothing');

-- B.11 SAVEPOINT + ROLLBACK TO restores the earlier context, and RLS follows it
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SAVEPOINT s1;
SELECT ctxguard.set_context(:'tok_carol', '{"pageType": "vendor_table"}') \g /dev/null
SELECT is((SELECT DISTINCT tenant_id FROM demo.invoices), 'globex', 'B.11 RLS follows the inner context');
ROLLBACK TO SAVEPOINT s1;
SELECT is((SELECT DISTINCT tenant_id FROM demo.invoices), 'acme', 'B.11 RLS follows the restored context');
COMMIT;

-- B.14 parallel plans see the same context as serial plans
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000 THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'on', true) \g /dev/null
SET LOCAL parallel_setup_cost = 0;
SET LOCAL parallel_tuple_cost = 0;
SET LOCAL min_parallel_table_scan_size = 0;
-- A table this small is read through its index otherwise, serially.
SET LOCAL enable_indexscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_indexonlyscan = off;
CREATE FUNCTION pg_temp.plan(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE line text; plan text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP plan := plan || line || E'\n'; END LOOP;
    RETURN plan;
END $$;
SELECT alike(pg_temp.plan($$SELECT tenant_id, count(*)::int FROM demo.invoices GROUP BY 1$$), '%Gather%',
             'B.14 the plan below is parallel (a Gather node), so workers apply the policy');
SELECT alike(pg_temp.plan($$SELECT DISTINCT ctxguard.tenant_id() FROM demo.invoices$$), '%Gather%',
             'B.14 and the reader below runs in a parallel plan too');
SELECT results_eq($$SELECT tenant_id, count(*)::int FROM demo.invoices GROUP BY 1$$, $$VALUES ('acme', 12)$$, 'B.14 parallel plan: own tenant only');
SELECT results_eq($$SELECT DISTINCT ctxguard.tenant_id() FROM demo.invoices$$, $$VALUES ('acme')$$, 'B.14 reader inside workers');
COMMIT;

-- The entity check (set_context) and the tools do not depend on the caller's privileges either way
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv3"}}'),
                 '22023', 'ctxguard: invalid page context: entity not found', 'B.13 other tenant''s invoice: not found');
COMMIT;

SELECT * FROM finish();
