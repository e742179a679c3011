-- Functions that run as ctxguard's owner (SECURITY DEFINER) and what the gateway role can make of
-- them (SECURITY_MATRIX H, M.71). Runs as ctxguard_gateway.
--
-- Found by an attacker's review: the catalog's trigger functions were SECURITY DEFINER and
-- executable by PUBLIC, so the gateway role could attach them to a temporary table of its own.
-- `_log_tool_changes` then turned the caller's rows into `jsonb` as the owner, and a cast to
-- `json` the caller had made for its own type ran as the owner (a superuser on most clusters);
-- `_bump_catalog_version` let it hold the catalog version's row lock (every catalog change then
-- waited) or write `catalog_changes` rows of its choosing (every backend reloaded them).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- The attack as it was: a trigger of the caller's own on a temporary table.
CREATE TEMP TABLE tools (name text);
SELECT throws_ok($$CREATE TRIGGER l AFTER INSERT ON pg_temp.tools REFERENCING NEW TABLE AS changed_new
                     FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._log_tool_changes('name')$$,
                 '42501', NULL, 'the gateway role cannot attach the catalog''s change log to a table of its own');
SELECT throws_ok($$CREATE TRIGGER b AFTER INSERT ON pg_temp.tools
                     FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version()$$,
                 '42501', NULL, 'nor the catalog''s version bump');
SELECT is((SELECT count(*)::int FROM pg_catalog.pg_trigger WHERE tgrelid = 'pg_temp.tools'::regclass), 0,
          'no trigger was made');
DROP TABLE pg_temp.tools;

-- The class: every function that runs as ctxguard's owner and that this role may execute is one of
-- the gateway's own entry points (each checks its token or session itself and takes only values
-- of built-in types, so no cast or operator of the caller's runs inside it).
SELECT set_eq($$SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc p
                 WHERE p.prosecdef AND p.pronamespace = 'ctxguard'::regnamespace
                   AND has_function_privilege(p.oid, 'EXECUTE')$$,
              $$VALUES ('ctxguard.mcp_identity(text,text,integer)'), ('ctxguard.mcp_session_open(text,text,jsonb,integer)'),
                       ('ctxguard.mcp_session_load(text,text)'), ('ctxguard.mcp_session_close(text,text)'),
                       ('ctxguard.mcp_session_expire(text,text,integer)'), ('ctxguard.mcp_session_touch(jsonb,integer)'),
                       ('ctxguard.put_session_page(text)'), ('ctxguard.put_user_page()'),
                       ('ctxguard.save_turn(text,text,text,jsonb)')$$,
              'the owner''s functions the gateway role may run are its entry points, and nothing else');
SELECT is((SELECT count(*)::int FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'ctxguard'::regnamespace AND p.prorettype = 'pg_catalog.trigger'::regtype
              AND has_function_privilege('public', p.oid, 'EXECUTE')),
          0, 'no trigger function of ctxguard is executable by PUBLIC');
SELECT is((SELECT count(*)::int FROM pg_catalog.pg_proc p
            WHERE p.prosecdef AND p.pronamespace = 'ctxguard'::regnamespace
              AND p.proargtypes::oid[] && ARRAY['pg_catalog.anyelement'::regtype, 'pg_catalog.record'::regtype,
                                                'pg_catalog.anyarray'::regtype, 'pg_catalog.anycompatible'::regtype]::oid[]),
          0, 'no function of the owner''s takes a value of the caller''s type');

SELECT * FROM finish();
