-- SECURITY_MATRIX A: roles and RLS hygiene. Runs as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- A.1 the gateway role
SELECT ok(NOT rolsuper AND NOT rolbypassrls AND NOT rolcreaterole AND NOT rolcreatedb, 'A.1 gateway is NOSUPERUSER NOBYPASSRLS')
  FROM pg_roles WHERE rolname = current_user;
SELECT is(current_user::text, 'ctxguard_gateway', 'A.1 tests run as the gateway role');
SELECT is((SELECT count(*)::int FROM pg_class WHERE relpersistence <> 't' AND relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)), 0,
          'A.1 gateway owns no (non-temporary) relation');
SELECT throws_ok($$INSERT INTO ctxguard.tools (name, description, input_schema) VALUES ('x.y', 'd', '{}')$$, '42501', NULL, 'A.1 catalog not writable');
SELECT throws_ok($$UPDATE ctxguard.tool_policies SET enabled = true$$, '42501', NULL, 'A.1 policies not writable');
SELECT throws_ok($$SELECT ctxguard.register_page_type('evil_page', NULL, 'x')$$, '42501', NULL, 'A.1 register_page_type is DBA-only');
SELECT throws_ok($$SELECT ctxguard.register_tool('evil.tool', 'x', '{"type":"object"}', 'demo.vendor_list(jsonb)', '{"page_types":"*"}')$$,
                 '42501', NULL, 'A.1 register_tool is DBA-only');
SELECT throws_ok($$SELECT ctxguard.protect_table('demo.vendors', 'tenant_id')$$, '42501', NULL, 'A.1 protect_table is DBA-only');
SELECT throws_ok($$DELETE FROM ctxguard.audit_log$$, '42501', NULL, 'A.1 audit rows cannot be deleted');
SELECT throws_ok($$UPDATE ctxguard.audit_log SET code = NULL$$, '42501', NULL, 'A.1 audit rows cannot be updated');
SELECT throws_ok($$INSERT INTO ctxguard.audit_log (call_id, decision) VALUES (gen_random_uuid(), 'allow')$$, '42501', NULL, 'A.1 audit rows cannot be forged');
SELECT throws_ok($$SELECT * FROM ctxguard.generations$$, '42501', NULL, 'A.1 generations are private');
SELECT throws_ok($$SELECT * FROM ctxguard.approvals$$, '42501', NULL, 'A.1 approvals are private');

-- A.2 forced RLS; no context → zero rows
SELECT ok(relrowsecurity AND relforcerowsecurity, 'A.2 RLS enabled and forced on ' || relname)
  FROM pg_class WHERE oid IN ('demo.vendors'::regclass, 'demo.invoices'::regclass, 'ctxguard.audit_log'::regclass);
SELECT is((SELECT count(*)::int FROM demo.invoices), 0, 'A.2 no context: zero invoices');
SELECT is((SELECT count(*)::int FROM demo.vendors), 0, 'A.2 no context: zero vendors');
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log), 0, 'A.2 no context: zero audit rows');

-- A.3 row_security = off must error, never return rows
SET row_security = off;
SELECT throws_ok($$SELECT count(*) FROM demo.invoices$$, '42501', NULL, 'A.3 row_security=off errors');
RESET row_security;

-- A.4 one prepared statement, generic plan, tenant A then tenant B on one connection
SET plan_cache_mode = force_generic_plan;
PREPARE inv_tenants AS SELECT DISTINCT tenant_id FROM demo.invoices;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_table"}') \g /dev/null
SELECT results_eq('EXECUTE inv_tenants', $$VALUES ('acme')$$, 'A.4 prepared statement sees tenant A only');
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_carol', '{"pageType": "invoice_table"}') \g /dev/null
SELECT results_eq('EXECUTE inv_tenants', $$VALUES ('globex')$$, 'A.4 same prepared statement then sees tenant B only');
COMMIT;
SELECT is_empty('EXECUTE inv_tenants', 'A.4 same prepared statement without context sees nothing');
RESET plan_cache_mode;

-- A.5 a cheap leaky function in WHERE cannot observe other tenants' values
CREATE TEMP TABLE seen (v text);
CREATE FUNCTION pg_temp.leak(v text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN INSERT INTO seen VALUES (v); RETURN true; END $$;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_table"}') \g /dev/null
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

-- A.7 lint finds each planted problem
SELECT set_eq($$SELECT kind, object FROM ctxguard.lint() WHERE object LIKE 'lintme.%' OR kind = 'tool_without_policy'$$,
              $$VALUES ('table_without_forced_rls', 'lintme.unprotected'),
                       ('view_bypasses_rls', 'lintme.leaky_view'),
                       ('definer_without_search_path', 'lintme.definer_no_path()'),
                       ('immutable_context_reader', 'lintme.cached_tenant()'),
                       ('tool_without_policy', 'legacy.export_all')$$,
              'A.7 lint reports every planted problem');
SELECT is_empty($$SELECT * FROM ctxguard.lint() WHERE object LIKE 'demo.%' OR object LIKE 'ctxguard.%'$$,
                'A.7 demo schema and the extension itself are clean');

SELECT * FROM finish();
