-- A catalog change applies from the next statement of every transaction, whatever snapshot the
-- caller keeps (SECURITY_MATRIX C, M.71). Found by an attacker's review: a backend kept the catalog
-- of a transaction's first look for the whole transaction, and read it on the transaction's
-- snapshot, so the gateway role kept a tool a DBA had just disabled
--   - for as long as it kept a READ COMMITTED transaction open,
--   - in a REPEATABLE READ transaction begun before the change,
--   - in any new transaction that imported a snapshot exported before the change;
-- and a DBA's change rolled back to a savepoint kept applying for the rest of the transaction.
-- Now every statement looks at the catalog's version again, and a statement on a snapshot that
-- does not see the latest committed catalog is refused (40001: retry in a new transaction) when
-- the snapshot is its transaction's, when it runs in a cursor, or when a statement that has run
-- for more than a second looks again.
-- Runs as a superuser (changes the catalog and commits); the gateway's backends through dblink.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set vendor_page '{"pageType": "vendor_table"}'
SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'dblink') AS have_dblink \gset
\if :have_dblink
CREATE EXTENSION IF NOT EXISTS dblink;
SELECT format('host=%s port=%s dbname=%s user=ctxguard_gateway',
    split_part(current_setting('unix_socket_directories'), ',', 1), current_setting('port'), current_database()) AS gw_conn \gset
SELECT dblink_connect('gw', :'gw_conn') \g /dev/null
SELECT dblink_connect('gw2', :'gw_conn') \g /dev/null
SELECT set_config('t.token', :'tok_alice', false) \g /dev/null
-- In the gateway's open transaction on `conn`: `q`'s one value as text.
CREATE FUNCTION pg_temp.gw(conn text, q text) RETURNS text LANGUAGE sql AS $$
    SELECT x FROM dblink(conn, q) AS r(x text)
$$;
CREATE FUNCTION pg_temp.ctx(conn text) RETURNS text LANGUAGE sql AS $$
    SELECT pg_temp.gw(conn, format('SELECT ctxguard.set_context(%L, %L)->>''pageType''', current_setting('t.token'), '{"pageType": "vendor_table"}'))
$$;
\set call 'SELECT coalesce(ctxguard.call_tool(''snap35.tool'', ''{}'')->''error''->>''code'', ''ok'')'
\set listed 'SELECT (''snap35.tool'' IN (SELECT name FROM ctxguard.visible_tools()))::text'
\set open '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}'
\set closed '{"page_types": ["vendor_table"], "roles": ["nobody"], "run_as": "ctxguard_tools"}'

SELECT ctxguard.register_tool('snap35.tool', 'A vendor tool for the stale-catalog test.',
    '{"type": "object", "properties": {}, "additionalProperties": false}', 'demo.vendor_list(jsonb)', :'open') \g /dev/null

-- 1. A READ COMMITTED transaction kept open across the change.
SELECT dblink_exec('gw', 'BEGIN ISOLATION LEVEL READ COMMITTED') \g /dev/null
SELECT is(pg_temp.ctx('gw'), 'vendor_table', 'read committed: the context is set');
SELECT is(pg_temp.gw('gw', :'call'), 'ok', 'and the tool runs');
SELECT ctxguard.set_tool_policy('snap35.tool', :'closed') \g /dev/null
SELECT is(pg_temp.gw('gw', :'listed'), 'false', 'the DBA closed it: the same transaction''s next statement no longer lists it');
SELECT is(pg_temp.gw('gw', :'call'), 'TOOL_NOT_VISIBLE', 'nor runs it');
SELECT dblink_exec('gw', 'COMMIT') \g /dev/null
SELECT ctxguard.set_tool_policy('snap35.tool', :'open') \g /dev/null

-- 1b. A cursor declared before the change, fetched from after it (its query runs on its snapshot).
SELECT dblink_exec('gw', 'BEGIN ISOLATION LEVEL READ COMMITTED') \g /dev/null
SELECT is(pg_temp.ctx('gw'), 'vendor_table', 'a cursor: the context is set');
SELECT dblink_exec('gw', format('DECLARE c NO SCROLL CURSOR FOR %s FROM pg_catalog.generate_series(1, 10)', :'call')) \g /dev/null
SELECT is(pg_temp.gw('gw', 'FETCH 1 FROM c'), 'ok', 'its first row runs the tool');
SELECT ctxguard.set_tool_policy('snap35.tool', :'closed') \g /dev/null
SELECT throws_ok(format('SELECT pg_temp.gw(%L, %L)', 'gw', 'FETCH 1 FROM c'), '40001', NULL,
                 'the DBA closed it: a fetch from the cursor is refused');
SELECT dblink_exec('gw', 'ROLLBACK') \g /dev/null
SELECT ctxguard.set_tool_policy('snap35.tool', :'open') \g /dev/null

-- 2. A REPEATABLE READ transaction begun before the change.
SELECT dblink_exec('gw', 'BEGIN ISOLATION LEVEL REPEATABLE READ') \g /dev/null
SELECT is(pg_temp.ctx('gw'), 'vendor_table', 'repeatable read: the context is set');
SELECT is(pg_temp.gw('gw', :'call'), 'ok', 'and the tool runs');
SELECT ctxguard.set_tool_policy('snap35.tool', :'closed') \g /dev/null
SELECT throws_ok(format('SELECT pg_temp.gw(%L, %L)', 'gw', :'call'), '40001', NULL,
                 'the DBA closed it: a statement on the snapshot from before is refused');
SELECT dblink_exec('gw', 'ROLLBACK') \g /dev/null
SELECT is((SELECT x FROM dblink('gw', 'SELECT 1::text') AS r(x text)), '1', 'the gateway''s connection is usable after it');
SELECT ctxguard.set_tool_policy('snap35.tool', :'open') \g /dev/null

-- 3. A snapshot exported before the change, imported by a new transaction after it.
SELECT dblink_exec('gw2', 'BEGIN ISOLATION LEVEL REPEATABLE READ') \g /dev/null
SELECT pg_temp.gw('gw2', 'SELECT pg_export_snapshot()') AS snap \gset
SELECT is(pg_temp.gw('gw', :'listed'), 'false', 'no context: nothing listed') FROM (SELECT dblink_exec('gw', 'BEGIN')) b;
SELECT dblink_exec('gw', 'COMMIT') \g /dev/null
SELECT ctxguard.set_tool_policy('snap35.tool', :'closed') \g /dev/null
SELECT dblink_exec('gw', 'BEGIN ISOLATION LEVEL REPEATABLE READ') \g /dev/null
SELECT dblink_exec('gw', format('SET TRANSACTION SNAPSHOT %L', :'snap')) \g /dev/null
SELECT throws_ok($$SELECT pg_temp.ctx('gw')$$, '40001', NULL,
                 'a new transaction on a snapshot from before the change cannot set a context');
SELECT dblink_exec('gw', 'ROLLBACK') \g /dev/null
SELECT dblink_exec('gw2', 'ROLLBACK') \g /dev/null

-- 4. A DBA's own change, rolled back to a savepoint: it no longer applies in the transaction. The
-- catalog's version is moved by the transaction's first change (before the savepoint), not again
-- by the one inside it.
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'vendor_page') \g /dev/null
UPDATE ctxguard.tool_policies SET enabled = enabled WHERE tool = 'vendor.list';
SELECT ok('snap35.tool' NOT IN (SELECT name FROM ctxguard.visible_tools()), 'closed: not listed');
-- (No test function between the change and the looks: pgTAP's own writes would move the command id.)
SAVEPOINT s;
UPDATE ctxguard.tool_policies SET roles = '{}' WHERE tool = 'snap35.tool';
SELECT ctxguard.explain_call('snap35.tool')->>'decision' AS in_savepoint \gset
ROLLBACK TO SAVEPOINT s;
SELECT ctxguard.explain_call('snap35.tool')->>'decision' AS rolled_back \gset
SELECT is(:'in_savepoint'::text, 'allow', 'opened in a savepoint: allowed');
SELECT is(:'rolled_back'::text, 'deny', 'the opening rolled back to the savepoint: denied');
SELECT ok('snap35.tool' NOT IN (SELECT name FROM ctxguard.visible_tools()), 'not listed');
SELECT is(ctxguard.call_tool('snap35.tool', '{}')->'error'->>'code', 'TOOL_NOT_VISIBLE', 'nor run');
-- The same within one statement: a PL/pgSQL block whose exception undoes the opening.
CREATE FUNCTION pg_temp.open_then_undo() RETURNS text LANGUAGE plpgsql AS $$
DECLARE inside text;
BEGIN
    BEGIN
        UPDATE ctxguard.tool_policies SET roles = '{}' WHERE tool = 'snap35.tool';
        inside := ctxguard.explain_call('snap35.tool')->>'decision';
        RAISE EXCEPTION 'undo';
    EXCEPTION WHEN raise_exception THEN NULL;
    END;
    RETURN inside || ' then ' || (ctxguard.explain_call('snap35.tool')->>'decision');
END $$;
SELECT pg_temp.open_then_undo() AS undone \gset
SELECT is(:'undone'::text, 'allow then deny', 'an exception block that undoes the opening: denied after it, in the same statement');
COMMIT;

DELETE FROM ctxguard.tools WHERE name = 'snap35.tool';
SELECT dblink_disconnect('gw') \g /dev/null
SELECT dblink_disconnect('gw2') \g /dev/null
\else
SELECT pass('dblink is not available on this PostgreSQL: skipped (it runs on the PostgreSQL with contrib)');
\endif
SELECT * FROM finish();
