-- Document tool benchmark fixture. Run as a superuser in a database freshly made by
-- create_demo_db (sql/demo/schema.sql + sql/demo/documents.sql: the 500-page acme_guide).
-- bench/doc_bench.sh does both. Nothing here changes how the document tools work.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

BEGIN;

-- 1. Raised limits for the bench tenant, so that every measured call does the full work (read,
--    mask, audit, charge the budget) instead of being refused after a few calls. The checks
--    themselves still run on every call: the generation's bytes, the per-document call counter and
--    the user's day are charged in the ledger, the daily coverage is checked (and recorded for new
--    pages). Pages per call (5) and search results (5) keep their defaults.
--    Defaults: 20 KB per generation, 10 calls per document per generation, 30 % of a document's
--    pages per user per day, 64 MiB per user per day.
INSERT INTO ctxguard.tenant_limits (tenant_id, max_bytes_per_generation, max_calls_per_document, max_document_coverage,
                                    max_bytes_per_user_day)
VALUES ('acme', 2147483647, 2147483647, 1.0, 2147483647)
ON CONFLICT (tenant_id) DO UPDATE
   SET max_bytes_per_generation = EXCLUDED.max_bytes_per_generation,
       max_calls_per_document = EXCLUDED.max_calls_per_document,
       max_document_coverage = EXCLUDED.max_document_coverage,
       max_bytes_per_user_day = EXCLUDED.max_bytes_per_user_day;

-- 2. Per pgbench client: its own user token and generation (one conversation per client, as in
--    production; a shared generation would serialise all clients on its row lock, and a shared
--    user on the coverage lock). Filled by doc_bench.sh; read by the gateway in set_context's
--    statement (one primary-key lookup).
CREATE SCHEMA docbench;
GRANT USAGE ON SCHEMA docbench TO ctxguard_gateway;
CREATE TABLE docbench.clients (
    client_id  integer PRIMARY KEY,
    token      text NOT NULL,
    generation uuid NOT NULL
);
GRANT SELECT ON docbench.clients TO ctxguard_gateway;

-- 3. In-database latency of the call alone: clock_timestamp() just before and just after
--    ctxguard.call_tool, recorded (after the second reading) in an unlogged table. Runs as the
--    caller (SECURITY INVOKER), i.e. as ctxguard_gateway, inside the caller's transaction.
CREATE UNLOGGED TABLE docbench.call_ms (
    run     text NOT NULL,
    tool    text NOT NULL,
    query   text,
    ms      float8 NOT NULL,
    status  text,
    code    text,
    items   integer,
    bytes   integer,
    trimmed boolean NOT NULL
);
GRANT INSERT ON docbench.call_ms TO ctxguard_gateway;

CREATE FUNCTION docbench.timed_call(run text, tool text, args jsonb) RETURNS text
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    t0 timestamptz;
    t1 timestamptz;
    r  jsonb;
BEGIN
    t0 := clock_timestamp();
    r := ctxguard.call_tool(tool, args);
    t1 := clock_timestamp();
    INSERT INTO docbench.call_ms
    VALUES (run, tool, args->>'query', extract(epoch FROM t1 - t0) * 1000, r->>'status', r->'error'->>'code',
            coalesce(jsonb_array_length(r->'result'->'pages'), jsonb_array_length(r->'result'->'results')),
            octet_length((r->'result')::text), coalesce(r->'result' ? 'trimmed', false));
    RETURN r->>'status';
END
$$;
REVOKE EXECUTE ON FUNCTION docbench.timed_call(text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION docbench.timed_call(text, text, jsonb) TO ctxguard_gateway;

-- The baseline of the search in the same run (issue 34): what an application would write on the
-- same pages with PostgreSQL's full-text search alone (no gate, budget, masking or audit): every
-- page holding all the query's words (GIN index), ranked by ts_rank_cd, the best five with their
-- ts_headline snippet (the options doc_local_search's snippets were once made with), timed inside
-- the database as timed_call times the tool. Run as its owner (the superuser who runs this file):
-- the gateway role reads no table.
CREATE FUNCTION docbench.timed_plain_search(run text, query text) RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t0 timestamptz;
    t1 timestamptz;
    n  integer;
BEGIN
    t0 := clock_timestamp();
    SELECT count(*) INTO n FROM (
        SELECT p.page_no,
               ts_headline('english', p.clean, q.q, 'MaxFragments=2, MaxWords=24, MinWords=8, FragmentDelimiter=" … ", StartSel=«, StopSel=»')
          FROM ctxguard.document_pages p, websearch_to_tsquery('english', query) q(q)
         WHERE p.tenant_id = 'acme' AND p.doc_id = 'acme_guide' AND p.tsv @@ q.q
         ORDER BY ts_rank_cd(p.tsv, q.q) DESC, p.page_no
         LIMIT 5) s;
    t1 := clock_timestamp();
    INSERT INTO docbench.call_ms VALUES (run, 'plain_search', query, extract(epoch FROM t1 - t0) * 1000, 'ok', NULL, n, NULL, false);
    RETURN 'ok';
END
$$;
REVOKE EXECUTE ON FUNCTION docbench.timed_plain_search(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION docbench.timed_plain_search(text, text) TO ctxguard_gateway;

COMMIT;

-- Fresh statistics for the planner (the demo data was just loaded).
ANALYZE ctxguard.documents;
ANALYZE ctxguard.document_pages;
ANALYZE ctxguard.document_sections;
