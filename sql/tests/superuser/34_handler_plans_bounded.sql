-- A backend keeps a bounded number of handler plans (issue 34: memory per backend bounded as the
-- catalog grows). Each SQL handler (and `when` condition) a backend runs is parsed and planned
-- once and kept with its plan, per (function, run_as role), for the backend's life: a pooled
-- backend that served calls to many tools kept every one (a plan and its memory context each: 2.8
-- MB of private memory for the 300 here), whatever the catalog's size, dropped functions' plans
-- too. Now at most 256 are kept, the least recently used dropped first, and catalog_stats()
-- reports how many.
--
-- Here 300 tools, each with a handler of its own, are called once each through Gate B as the
-- gateway role, in one backend; then the first again (its plan was dropped: made again).
-- Runs as the superuser (the DBA): functions, registration, catalog_stats; the calls as
-- ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- As the gateway, on the vendor table: call_tool of bodies.t<i> for i in `from`..`upto`; how many
-- returned {"n": i}.
CREATE FUNCTION pg_temp.calls(tok text, from_i int, upto int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE ok bigint := 0; r jsonb;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, '{"pageType": "vendor_table"}');
    FOR i IN from_i .. upto LOOP
        r := ctxguard.call_tool('bodies.t' || i, '{}');
        IF r->'result'->>'n' = i::text THEN
            ok := ok + 1;
        END IF;
    END LOOP;
    RESET ROLE;
    RETURN ok;
END $$;

BEGIN;
CREATE SCHEMA bodies_test;
GRANT USAGE ON SCHEMA bodies_test TO ctxguard_tools;
SELECT format('CREATE FUNCTION bodies_test.h%s(args jsonb) RETURNS jsonb LANGUAGE sql STABLE AS %L',
              i, format('SELECT pg_catalog.jsonb_build_object(''n'', %s)', i))
  FROM generate_series(1, 300) i \gexec
SELECT count(ctxguard.register_tool('bodies.t' || i, 'Handler plan test tool ' || i || '.',
           '{"type": "object", "properties": {}, "additionalProperties": false}',
           format('bodies_test.h%s(jsonb)', i)::regprocedure,
           '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}'))
       AS registered FROM generate_series(1, 300) i \gset
SELECT pg_temp.calls(:'tok_alice', 1, 300) AS answered \gset
SELECT coalesce((ctxguard.catalog_stats()->>'handler_plans_kept')::int, -1) AS kept \gset
SELECT pg_temp.calls(:'tok_alice', 1, 1) AS again \gset
ROLLBACK;

SELECT is(:registered::bigint, 300::bigint, '300 tools registered, each with a handler of its own');
SELECT is(:answered::bigint, 300::bigint, 'each answered its own call');
SELECT cmp_ok(:'kept'::int, '<=', 256, format('the backend kept at most 256 handler plans (%s)', :'kept'));
SELECT cmp_ok(:'kept'::int, '>=', 200, 'and kept the recent ones');
SELECT is(:again::bigint, 1::bigint, 'the first tool, its plan dropped, answers again');

SELECT * FROM finish();
