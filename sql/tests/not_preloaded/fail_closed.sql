-- Against a cluster WITHOUT shared_preload_libraries = 'ctxguard': everything fails closed.
-- Runs as ctxguard_gateway. Setup (superuser) is in scripts/test.sh.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- A session may create placeholder settings before the library is loaded in it...
SET ctxguard.tenant_id = 'acme';
SET ctxguard.context = '{"tenantId": "acme", "pageType": "invoice_table"}';
-- ...but no reader trusts them, so RLS sees nothing.
SELECT is(ctxguard.tenant_id(), NULL, 'not preloaded: tenant_id() is NULL even after SET');
SELECT is(ctxguard.context(), NULL, 'not preloaded: context() is NULL');
SELECT is((SELECT count(*)::int FROM np.secrets), 0, 'not preloaded: protected table shows zero rows');
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', '{"pageType": "list_page"}'), '55000', NULL,
                 'not preloaded: set_context refuses');
COMMIT;
-- Gate B refuses before anything else: without the preloaded ledger no call can be audited.
SELECT is(ctxguard.call_tool('np.read', '{}')->'error'->>'code', 'AUDIT_UNAVAILABLE', 'not preloaded: Gate B refuses');
SELECT is(ctxguard.call_tool('np.read', '{}')->'result', NULL, 'not preloaded: and returns nothing');
SELECT * FROM finish();
