-- SECURITY_MATRIX B: context integrity. Runs as ctxguard_gateway (which reads no table: what RLS makes
-- of each context is proven in reader/01_rls.sql).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set table_page '{"pageType": "invoice_table"}'

-- B.8 clients cannot write ctxguard.* settings
SELECT throws_ok($$SET ctxguard.tenant_id = 'globex'$$, '42501', NULL, 'B.8 SET denied');
SELECT throws_ok($$SET LOCAL ctxguard.tenant_id = 'globex'$$, '42501', NULL, 'B.8 SET LOCAL denied');
SELECT throws_ok($$RESET ctxguard.tenant_id$$, '42501', NULL, 'B.8 RESET denied');
SELECT throws_ok($$SELECT set_config('ctxguard.tenant_id', 'globex', true)$$, '42501', NULL, 'B.8 set_config denied');
SELECT throws_ok($$SELECT set_config('ctxguard.context', '{}', false)$$, '42501', NULL, 'B.8 set_config of the context JSON denied');
SELECT throws_ok($$SET ctxguard.jwt_secret = 'attacker-chosen-secret-attacker-chosen'$$, '42501', NULL, 'B.8 the key cannot be replaced');
SELECT throws_ok($$SET ctxguard.made_up = 'x'$$, '42602', NULL, 'B.8 the ctxguard prefix is reserved');
SELECT throws_ok($$ALTER ROLE ctxguard_gateway SET ctxguard.tenant_id = 'globex'$$, '42501', NULL, 'B.8 ALTER ROLE SET denied');
SELECT throws_ok($$SELECT current_setting('ctxguard.jwt_secret')$$, '42501', NULL, 'B.8 the secret is unreadable');
SELECT is(ctxguard.tenant_id(), NULL, 'B.8 still no context');

-- B.9 bad tokens: SQLSTATE 28000, no context
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', t, :'table_page'), '28000', NULL, 'B.9 refused: ' || label)
  FROM (VALUES (:'tok_forged', 'forged signature'), (:'tok_none', 'alg none'), (:'tok_confused', 'HS256 keyed with the Ed25519 public key'),
               (:'tok_expired', 'expired'), (:'tok_nbf', 'not yet valid'), (:'tok_wrong_aud', 'wrong audience'),
               (:'tok_no_aud', 'missing audience'), (:'tok_no_exp', 'no exp'), ('not.a.jwt', 'garbage'), ('', 'empty'))
       AS c(t, label);
SELECT throws_ok(format('SELECT ctxguard.set_context(NULL, %L)', :'table_page'), '28000', NULL, 'B.9 NULL token refused');
SELECT is(ctxguard.tenant_id(), NULL, 'B.9 no context after refusals');
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_eddsa', :'table_page'), 'B.9 EdDSA token accepted');
SELECT is(ctxguard.user_id(), 'erin', 'B.9 EdDSA identity');
COMMIT;

-- B.10 outside a transaction block: error; after COMMIT/ROLLBACK: gone
-- A top-level statement in autocommit mode (not wrapped in throws_ok, whose subtransaction counts as a block).
\set ON_ERROR_STOP 0
\set VERBOSITY terse
SELECT ctxguard.set_context(:'tok_alice', :'table_page');
\set ON_ERROR_STOP 1
SELECT is(:'LAST_ERROR_SQLSTATE'::text, '25P01', 'B.10 autocommit call refused');
SELECT is(ctxguard.tenant_id(), NULL::text, 'B.10 and left no context');
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT is(ctxguard.tenant_id(), 'acme', 'B.10 context set in the transaction');
COMMIT;
SELECT ok(ctxguard.context() IS NULL AND ctxguard.tenant_id() IS NULL AND ctxguard.user_id() IS NULL AND ctxguard.roles() IS NULL
          AND ctxguard.has_role('ap_clerk') IS NULL AND ctxguard.page_type() IS NULL AND ctxguard.entity_type() IS NULL
          AND ctxguard.entity_id() IS NULL AND ctxguard.generation() IS NULL, 'B.10 every reader is NULL (not empty) after COMMIT');
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
ROLLBACK;
SELECT is(ctxguard.tenant_id(), NULL, 'B.10 gone after ROLLBACK');

-- B.11 SAVEPOINT + ROLLBACK TO restores the earlier context
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SAVEPOINT s1;
SELECT ctxguard.set_context(:'tok_carol', '{"pageType": "vendor_table"}') \g /dev/null
SELECT is(ctxguard.tenant_id(), 'globex', 'B.11 inner context applies');
ROLLBACK TO SAVEPOINT s1;
SELECT is(ctxguard.tenant_id() || '/' || ctxguard.page_type(), 'acme/invoice_table', 'B.11 earlier context restored');
SELECT is(ctxguard.call_tool('invoice.list', '{"limit": 1}')->'result'->'invoices'->0->>'id', 'acme_inv1', 'B.11 tools follow the restored context');
COMMIT;

-- B.12 page contract violations: 22023, no context
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', p), '22023', NULL, 'B.12 refused: ' || label)
  FROM (VALUES ('{"pageType": "admin_console"}', 'unknown page type'),
               ('{"pageType": "invoice_table", "entity": {"type": "invoice", "id": "acme_inv1"}}', 'list page with entity'),
               ('{"pageType": "invoice_detail"}', 'detail page without entity'),
               ('{"pageType": "invoice_detail", "entity": {"type": "vendor", "id": "acme_v1"}}', 'wrong entity type'),
               ('{"pageType": "invoice_table", "tenant_id": "globex"}', 'unknown key'),
               ('{"pageType": "invoice_table", "pageState": {"sql": "x"}}', 'unknown pageState key'),
               ('{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "' || repeat('x', 129) || '"}}', 'oversize id'),
               ('{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv1\u200b"}}', 'zero-width id'),
               ('{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv1\u0007"}}', 'control character id'),
               ('{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": " acme_inv1"}}', 'padded id'),
               ('{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": 1}}', 'numeric id'),
               ('[]', 'not an object')) AS c(p, label);
SELECT is(ctxguard.tenant_id(), NULL, 'B.12 no context after refusals');
SELECT throws_like(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', '{"pageType": "invoice_table", "secret-key-xyz": 1}'),
                   '%unknown key%', 'B.12 message names the rule');
COMMIT;
CREATE FUNCTION pg_temp.errmsg(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN EXECUTE q; RETURN NULL; EXCEPTION WHEN OTHERS THEN RETURN SQLERRM; END $$;
BEGIN;
SELECT unalike(pg_temp.errmsg(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', p)), '%secret-value-xyz%',
               'B.12 message never echoes a caller value: ' || label)
  FROM (VALUES ('{"pageType": "invoice_table", "secret-value-xyz": 1}', 'unknown key'),
               ('{"pageType": "secret-value-xyz"}', 'unknown page type'),
               ('{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "secret-value-xyz"}}', 'missing entity'),
               ('{"pageType": "invoice_table", "states": ["secret-value-xyz "]}', 'bad state')) AS c(p, label);
COMMIT;

-- B.13 another tenant's entity and a nonexistent one: the same error
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv3"}}'),
                 '22023', 'ctxguard: invalid page context: entity not found', 'B.13 other tenant''s invoice: not found');
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv999"}}'),
                 '22023', 'ctxguard: invalid page context: entity not found', 'B.13 nonexistent invoice: the same error');
SELECT is(ctxguard.tenant_id(), NULL, 'B.13 no context after refusal');
COMMIT;

-- B.15 generations: minted server-side, bound to user and tenant, expiring
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT ctxguard.begin_generation('conv-1') AS gen \gset
SELECT is(ctxguard.generation()::text, :'gen', 'B.15 the minted generation becomes the context''s at once');
SELECT is(ctxguard.context()->>'generation', :'gen', 'B.15 and context() shows it');
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L, %L)', :'tok_alice', :'table_page', :'gen'), 'B.15 own generation accepted');
SELECT is(ctxguard.generation()::text, :'gen', 'B.15 generation reader');
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L, %L)', :'tok_carol', :'table_page', :'gen'), '28000', NULL, 'B.15 foreign generation refused');
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L, %L)', :'tok_bob', :'table_page', :'gen'), '28000', NULL, 'B.15 same tenant, other user refused');
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L, %L)', :'tok_alice', :'table_page', gen_random_uuid()), '28000', NULL, 'B.15 forged generation refused');
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L, %L)', :'tok_alice', :'table_page', '00000000-0000-4000-8000-000000000001'), '28000', NULL, 'B.15 expired generation refused');
SELECT throws_ok($$SELECT ctxguard.begin_generation(E'conv\n2')$$, '22023', NULL, 'B.15 conversation id validated');
COMMIT;
SELECT throws_ok($$SELECT ctxguard.begin_generation('conv-1')$$, '28000', NULL, 'B.15 no generation without context');

-- Handlers cannot switch identity
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT ctxguard.call_tool('test.set_identity', jsonb_build_object('token', :'tok_carol')) AS switched \gset
SELECT is(:'switched'::jsonb->'error'->>'code', 'TOOL_ERROR', 'a handler calling set_context fails');
SELECT is(:'switched'::jsonb->'error'->>'message', 'tool handler failed (SQLSTATE 42501)',
          'refused as a privilege violation (42501), not some other failure');
SELECT is(ctxguard.tenant_id(), 'acme', 'and the identity is unchanged');
COMMIT;

-- The context settings are excluded from RESET ALL (README): a client's RESET ALL inside the
-- transaction neither clears nor changes the context, and tools still run under it.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
SELECT current_setting('work_mem') AS work_mem0 \gset
SET LOCAL work_mem = '77MB';
SELECT is(current_setting('work_mem'), '77MB', 'an ordinary setting changed');
RESET ALL;
SELECT is(current_setting('work_mem'), :'work_mem0', 'positive control: RESET ALL did reset it');
SELECT is(ctxguard.tenant_id() || '/' || ctxguard.user_id() || '/' || ctxguard.page_type(), 'acme/alice/invoice_table', 'the context survives RESET ALL');
SELECT is(ctxguard.call_tool('list_available_tools', '{}')->>'status', 'ok', 'and tools still run under it');
COMMIT;
SELECT is(ctxguard.tenant_id(), NULL, 'the context still ends with its transaction');

SELECT * FROM finish();
