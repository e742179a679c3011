-- Issue 11 §4: set_context's entity check runs as the owner on the qualified table, so a temp table
-- of the same name cannot answer it. Runs as ctxguard_gateway; the first ctxguard call of the session
-- (the catalog cache is built) happens with the demo schema on the path.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set table_page '{"pageType": "invoice_table"}'
\set glx3 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv3"}}'
\set inv3 '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'

-- The catalog cache is built with the demo schema on the path...
SET search_path = demo, pg_temp, public;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'table_page') \g /dev/null
COMMIT;
-- ...then a temp table of the table's name holds another tenant's invoice id under acme.
RESET search_path;
CREATE TEMP TABLE invoices (tenant_id text, id text, vendor_id text, number text, amount numeric, currency text, status text,
                            issued_on date, due_on date);
INSERT INTO invoices (tenant_id, id) VALUES ('acme', 'glx_inv3'), ('globex', 'glx_inv3');
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'glx3'), '22023', 'ctxguard: invalid page context: entity not found',
                 'a temp table named invoices does not make another tenant''s invoice acceptable');
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'inv3'), 'and does not hide the tenant''s own invoice');
COMMIT;
SET search_path = pg_temp, demo, public;
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'glx3'), '22023', 'ctxguard: invalid page context: entity not found',
                 'nor with pg_temp named first on the path');
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'inv3'), 'own invoice accepted with pg_temp first');
COMMIT;
RESET search_path;
DROP TABLE invoices;
BEGIN;
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', :'inv3'),
                'the entity check works for a role without any privilege on the table');
COMMIT;

SELECT * FROM finish();
