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

-- A.2 forced RLS; no context → zero rows (the demo tables' rows: reader/01_rls.sql, as a role that may read them)
-- (pg_class by name: the gateway role has no USAGE on schema demo, so 'demo.x'::regclass is refused.)
SELECT ok(relrowsecurity AND relforcerowsecurity, 'A.2 RLS enabled and forced on ' || relnamespace::regnamespace || '.' || relname)
  FROM pg_class
 WHERE (relnamespace::regnamespace::text, relname) IN (('demo', 'vendors'), ('demo', 'invoices'), ('demo', 'matters'), ('ctxguard', 'audit_log'));
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log), 0, 'A.2 no context: zero audit rows');

-- A.3 row_security = off must error, never return rows
SET row_security = off;
SELECT throws_ok($$SELECT count(*) FROM ctxguard.audit_log$$, '42501', NULL, 'A.3 row_security=off errors');
RESET row_security;

-- H.49 the gateway role runs model calls and nothing else: no table, handler or demo function
SELECT throws_ok(format('SELECT count(*) FROM %s', t), '42501', NULL, 'H.49 no direct read of ' || t)
  FROM unnest(ARRAY['demo.invoices', 'demo.vendors', 'demo.matters', 't.touches', 'ctxguard.document_pages', 'ctxguard.generations',
                    'ctxguard.approvals', 'ctxguard.external_calls', 'ctxguard.mcp_server_grants']) t;
SELECT throws_ok($$INSERT INTO demo.vendors VALUES ('acme', 'x', 'x', 'DE', 'x@x.example')$$, '42501', NULL, 'H.49 no direct write');
SELECT is((SELECT count(*)::int FROM information_schema.role_table_grants WHERE grantee = 'ctxguard_gateway' AND table_schema !~ '^pg_temp'), 0,
          'H.49 no table privilege granted to the gateway role');
SELECT is_empty($$SELECT p.oid::regprocedure::text FROM pg_proc p
                   WHERE p.pronamespace IN ('demo'::regnamespace, 't'::regnamespace) AND p.prorettype = 'jsonb'::regtype
                     AND p.proargtypes::oid[] = ARRAY['jsonb'::regtype::oid] AND has_function_privilege(p.oid, 'EXECUTE')
                     AND p.oid <> 't.noexec(jsonb)'::regprocedure$$,
                'H.49 no tool handler is executable by the gateway role');
SELECT ok(NOT has_function_privilege('ctxguard.sync_mcp_tools(text, jsonb)', 'EXECUTE'), 'H.52 discovery is not the gateway''s');

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
