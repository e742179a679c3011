-- The ledger writer's statements join through indexes whatever the statistics say (issue 34). A
-- plan the writer made while `generations` was small (a sequential scan costs nothing then) is
-- kept until the table is analyzed again: told that jsonb_to_recordset returns 100 rows, it joins
-- them to `generations` by scanning the whole table, tens of thousands of live generations, in
-- every batch. The writer asks for index joins on top of the planner's own settings
-- (`owner::planner_base`), and the planner hook that makes every plan inside ctxguard with the
-- planner's own settings applies both. (The hook first reset the writer's own settings for this to
-- PostgreSQL's defaults: found by a review as an attacker. Any tenant can grow `generations` with
-- `begin_generation`, and the one writer per database would have slowed every tenant's calls.)
--
-- Here DBA's triggers on generations and document_calls send the generation counters through the
-- writer's statement; a new writer makes its plans while the table is small (compacted) and
-- analyzed, then 30,000 other generations arrive (autovacuum off for the table meanwhile, so
-- that it is not analyzed), and the rows the writer's sequential scans of `generations` read in three more reads
-- are counted once it has exited and reported its statistics. Runs as the superuser (the DBA); the
-- calls as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\ir ../lib/generation.sql
\ir ../lib/writer.sql
CREATE FUNCTION pg_temp.read(tok text, page jsonb, g uuid, p int) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page, g);
    r := ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', p, 'page_end', p));
    RESET ROLE;
    RETURN coalesce(r->'error'->>'code', r->>'status');
END $$;
-- Scans of `generations` so far: rows read by sequential scans, and scans of its primary key.
CREATE FUNCTION pg_temp.scans() RETURNS TABLE(seq bigint, idx bigint) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_stat_clear_snapshot();
    RETURN QUERY SELECT coalesce(t.seq_tup_read, 0), coalesce(t.idx_scan, 0)
                   FROM pg_stat_all_tables t WHERE t.relid = 'ctxguard.generations'::regclass;
END $$;

-- A run stopped half-way must not leave its trigger to the next.
DROP TRIGGER IF EXISTS writer_plans_copy ON ctxguard.document_calls;
DROP TABLE IF EXISTS public.writer_plans_copy;
DROP FUNCTION IF EXISTS public.writer_plans_copy();
DROP TRIGGER IF EXISTS writer_plans_touch ON ctxguard.generations;
DROP FUNCTION IF EXISTS public.writer_plans_touch();
DELETE FROM ctxguard.generations WHERE tenant_id = 'filler';
ALTER TABLE ctxguard.generations SET (autovacuum_enabled = false);
-- Small, as the statistics see it: the rows of the earlier tests, in as few pages as they take.
VACUUM (FULL, ANALYZE) ctxguard.generations;
CREATE TABLE public.writer_plans_copy (generation uuid, calls int);
CREATE FUNCTION public.writer_plans_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.writer_plans_copy VALUES (NEW.generation, NEW.calls);
    RETURN NEW;
END $$;
CREATE TRIGGER writer_plans_copy AFTER INSERT OR UPDATE ON ctxguard.document_calls
    FOR EACH ROW EXECUTE FUNCTION public.writer_plans_copy();
CREATE FUNCTION public.writer_plans_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NEW;
END $$;
CREATE TRIGGER writer_plans_touch BEFORE UPDATE ON ctxguard.generations
    FOR EACH ROW EXECUTE FUNCTION public.writer_plans_touch();

-- From here to the clean-up below, an error must not stop the file before it.
\set ON_ERROR_STOP 0
SELECT ok(pg_temp.stop_writer(), 'the writer has exited (the next one makes its plans)');
CREATE TEMP TABLE reads (n int, r text);
-- Nine generations, then a read in each (each call waits for its own record: a batch per read).
BEGIN;
CREATE TEMP TABLE gens AS SELECT n, pg_temp.gen(:'tok_ranker', :'viewer') AS g FROM generate_series(1, 9) n;
COMMIT;
BEGIN;
INSERT INTO reads SELECT n, pg_temp.read(:'tok_ranker', :'viewer', g, n) FROM gens WHERE n <= 6 ORDER BY n;
COMMIT;
-- The table grows, unanalyzed.
INSERT INTO ctxguard.generations (id, tenant_id, user_id, conversation_id, expires_at)
SELECT gen_random_uuid(), 'filler', 'filler-' || i, 'filler', now() + interval '1 hour'
  FROM generate_series(1, 30000) i;
SELECT seq AS seq_before, idx AS idx_before FROM pg_temp.scans() \gset
BEGIN;
INSERT INTO reads SELECT n, pg_temp.read(:'tok_ranker', :'viewer', g, n) FROM gens WHERE n > 6 ORDER BY n;
COMMIT;
SELECT ok(pg_temp.stop_writer(), 'the writer has exited (and reported its statistics)');
-- Its statistics arrive just after it leaves pg_stat_activity.
CREATE FUNCTION pg_temp.idx_over(n bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. 100 LOOP
        EXIT WHEN (SELECT idx FROM pg_temp.scans()) > n;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT pg_temp.idx_over(:idx_before) \g /dev/null
SELECT seq AS seq_after, idx AS idx_after FROM pg_temp.scans() \gset
SELECT count(DISTINCT generation) AS copied FROM public.writer_plans_copy \gset
DROP TRIGGER writer_plans_copy ON ctxguard.document_calls;
DROP TABLE public.writer_plans_copy;
DROP FUNCTION public.writer_plans_copy();
DROP TRIGGER writer_plans_touch ON ctxguard.generations;
DROP FUNCTION public.writer_plans_touch();
DELETE FROM ctxguard.generations WHERE tenant_id = 'filler';
ALTER TABLE ctxguard.generations RESET (autovacuum_enabled);
\set ON_ERROR_STOP 1

SELECT is((SELECT string_agg(r, ',' ORDER BY n) FROM reads), 'ok,ok,ok,ok,ok,ok,ok,ok,ok', 'nine reads in nine generations');
SELECT is(:copied::int, 9,
          'the writer''s statement wrote their document counters');
SELECT cmp_ok(:idx_after::bigint, '>', :idx_before::bigint, 'the writer''s statistics arrived: it read generations by key');
SELECT diag('seq rows read: ' || (:seq_after::bigint - :seq_before::bigint) || ', idx scans: ' || (:idx_after::bigint - :idx_before::bigint));
SELECT cmp_ok(:seq_after::bigint - :seq_before::bigint, '<', 1000::bigint,
          'the writer''s three batches after the table grew read its generations by key, not the 30,000 others');

SELECT * FROM finish();
