-- Gate A's list is a C function that fills a tuple store with 8 values per row (issue 34): a
-- definition of another width bound to its symbol (only a superuser can make one) is refused
-- before a row is formed from them, not read past. Runs as the superuser (the DBA).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

CREATE FUNCTION pg_temp.narrow_list(query text DEFAULT NULL, top_k int DEFAULT NULL)
    RETURNS TABLE (name text) LANGUAGE c STABLE AS 'ctxguard', 'visible_tools_wrapper';
CREATE FUNCTION pg_temp.wide_list(query text DEFAULT NULL, top_k int DEFAULT NULL)
    RETURNS TABLE (a text, b text, c jsonb, d bool, e text, f bool, g text, h text, i text)
    LANGUAGE c STABLE AS 'ctxguard', 'visible_tools_wrapper';
SELECT throws_ok('SELECT * FROM pg_temp.narrow_list()', '42804', NULL,
                 'a narrower definition of Gate A''s list is refused');
SELECT throws_ok('SELECT * FROM pg_temp.wide_list()', '42804', NULL,
                 'a wider definition of Gate A''s list is refused');
SELECT is((SELECT count(*)::int FROM ctxguard.visible_tools()), 0,
          'the extension''s own definition answers (no context: no tools)');

SELECT * FROM finish();
