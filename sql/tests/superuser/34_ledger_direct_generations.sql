-- The writer's generation counters without a statement (issue 34; ledger/direct.rs): a generation's
-- bytes and its calls on a document are what the audit rows say, written directly while the tables
-- are as ctxguard creates them and by the statement once a DBA's trigger is on them; a generation
-- minted in a transaction still open is not waited for (its caller is waiting for the writer), and
-- its counters follow once it commits. Runs as the superuser (the DBA); the calls as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\ir ../lib/generation.sql
-- As the gateway: read each of the pages in generation g, one call each (each waits for its own
-- audit record: the writer's batches follow the calls); the envelopes' statuses or error codes.
CREATE FUNCTION pg_temp.read(tok text, page jsonb, g uuid, VARIADIC pages int[]) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r jsonb; out text := ''; p int;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page, g);
    FOREACH p IN ARRAY pages LOOP
        r := ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', p, 'page_end', p));
        out := out || coalesce(r->'error'->>'code', r->>'status');
    END LOOP;
    RESET ROLE;
    RETURN out;
END $$;
-- What the writer persisted for g, against what its audit rows record: bytes|audited bytes|calls|audited calls.
CREATE FUNCTION pg_temp.persisted(g uuid) RETURNS text LANGUAGE sql AS $$
    SELECT (SELECT bytes_used FROM ctxguard.generations WHERE id = g) || '|'
        || (SELECT coalesce(sum(result_bytes), 0) FROM ctxguard.audit_log WHERE generation = g AND decision = 'allow') || '|'
        || coalesce((SELECT calls FROM ctxguard.document_calls WHERE generation = g AND doc_id = 'acme_guide'), 0) || '|'
        || (SELECT count(*) FROM ctxguard.audit_log WHERE generation = g AND decision = 'allow')
$$;
CREATE FUNCTION pg_temp.direct_rows() RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce((ctxguard.ledger_stats()->>'counter_rows_direct')::bigint, 0)  -- 0 before the writer starts
$$;

-- The tables as ctxguard creates them: the counters without a statement.
BEGIN;
SELECT pg_temp.gen(:'tok_ranker', :'viewer') AS g1 \gset
COMMIT;
SELECT pg_temp.direct_rows() AS direct0 \gset
BEGIN;
SELECT pg_temp.read(:'tok_ranker', :'viewer', :'g1', 1, 2) AS r1 \gset
COMMIT;
SELECT is(:'r1'::text, 'okok', 'two reads in a committed generation');
SELECT ok(split_part(pg_temp.persisted(:'g1'), '|', 1)::bigint > 0, 'the generation''s bytes are persisted');
SELECT is(split_part(pg_temp.persisted(:'g1'), '|', 1), split_part(pg_temp.persisted(:'g1'), '|', 2),
          'and are the bytes its audit rows record');
SELECT is(split_part(pg_temp.persisted(:'g1'), '|', 3) || '|' || split_part(pg_temp.persisted(:'g1'), '|', 4), '2|2',
          'its calls on the document are its audited calls');
-- Per read: the generation's row (raised), its document row (inserted, then raised), the user's day.
SELECT ok(pg_temp.direct_rows() - :direct0 >= 4, 'written without a statement');

-- A generation minted in a transaction still open: its calls are audited at once (the writer does
-- not wait for the caller's transaction, whose caller waits for it), their counters once it commits.
BEGIN;
SELECT pg_temp.gen(:'tok_ranker', :'viewer') AS g2 \gset
SELECT pg_temp.read(:'tok_ranker', :'viewer', :'g2', 3, 4) AS r3 \gset
COMMIT;
SELECT is(:'r3'::text, 'okok', 'reads in a generation minted in their own open transaction are not held up');
-- The waiting counters are written again on the writer's retry schedule (well within 20 s).
CREATE FUNCTION pg_temp.wait_for(g uuid, want text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE got text;
BEGIN
    FOR i IN 1 .. 200 LOOP
        got := pg_temp.persisted(g);
        EXIT WHEN split_part(got, '|', 3) = want;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN got;
END $$;
SELECT pg_temp.wait_for(:'g2', '2') AS p2 \gset
SELECT is(split_part(:'p2', '|', 3) || '|' || split_part(:'p2', '|', 4), '2|2', 'once it commits, its calls are persisted');
SELECT is(split_part(:'p2', '|', 1), split_part(:'p2', '|', 2), 'and its bytes');

-- A DBA's trigger on document_calls: the statement writes the document counters, and the trigger fires.
CREATE TABLE public.doc_calls_copy (generation uuid, calls int);
CREATE FUNCTION public.doc_calls_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.doc_calls_copy VALUES (NEW.generation, NEW.calls);
    RETURN NEW;
END $$;
CREATE TRIGGER doc_calls_copy AFTER INSERT OR UPDATE ON ctxguard.document_calls
    FOR EACH ROW EXECUTE FUNCTION public.doc_calls_copy();
BEGIN;
SELECT pg_temp.gen(:'tok_ranker', :'viewer') AS g3 \gset
COMMIT;
BEGIN;
SELECT pg_temp.read(:'tok_ranker', :'viewer', :'g3', 5, 6) AS r5 \gset
COMMIT;
DROP TRIGGER doc_calls_copy ON ctxguard.document_calls;
SELECT is(:'r5'::text, 'okok', 'two reads with a DBA''s trigger on document_calls');
SELECT is((SELECT array_agg(calls ORDER BY calls) FROM public.doc_calls_copy WHERE generation = :'g3'), ARRAY[1, 2],
          'the trigger fired for the writer''s insert and update');
SELECT is(split_part(pg_temp.persisted(:'g3'), '|', 3), '2', 'the document counter is right');
SELECT is(split_part(pg_temp.persisted(:'g3'), '|', 1), split_part(pg_temp.persisted(:'g3'), '|', 2),
          'and the generation''s bytes (still without a statement)');

-- A DBA's column on generations (a table others insert into): the bytes are still raised directly,
-- and the column keeps its value.
ALTER TABLE ctxguard.generations ADD COLUMN dba_note text DEFAULT 'noted';
-- (As this run's own reader, on a page it has not read: the writer does not look again for a
-- coverage row it committed before.)
BEGIN;
SELECT pg_temp.gen(:'tok_reader', :'viewer') AS g4 \gset
COMMIT;
SELECT pg_temp.direct_rows() AS direct4 \gset
BEGIN;
SELECT pg_temp.read(:'tok_reader', :'viewer', :'g4', 7) AS r7 \gset
COMMIT;
SELECT is(:'r7'::text, 'ok', 'a read with a DBA''s column on generations');
SELECT is(split_part(pg_temp.persisted(:'g4'), '|', 1), split_part(pg_temp.persisted(:'g4'), '|', 2), 'its bytes are persisted');
SELECT is((SELECT dba_note FROM ctxguard.generations WHERE id = :'g4'), 'noted'::text, 'the DBA''s column is left as it was');
-- The generation's row, its document row and the page's coverage row (the user's day may be ahead
-- of this read's bytes).
SELECT ok(pg_temp.direct_rows() - :direct4 >= 3, 'still written without a statement');
ALTER TABLE ctxguard.generations DROP COLUMN dba_note;

-- A stored generated column on generations: the single-row update computes it as an UPDATE would.
ALTER TABLE ctxguard.generations ADD COLUMN dba_plus_one bigint GENERATED ALWAYS AS (bytes_used + 1) STORED;
BEGIN;
SELECT pg_temp.gen(:'tok_ranker', :'viewer') AS g5 \gset
COMMIT;
BEGIN;
SELECT pg_temp.read(:'tok_ranker', :'viewer', :'g5', 8) AS r8 \gset
COMMIT;
SELECT is(:'r8'::text, 'ok', 'a read with a DBA''s generated column on generations');
SELECT is(split_part(pg_temp.persisted(:'g5'), '|', 1), split_part(pg_temp.persisted(:'g5'), '|', 2), 'its bytes are persisted');
SELECT is((SELECT dba_plus_one - bytes_used FROM ctxguard.generations WHERE id = :'g5'), 1::bigint,
          'and the generated column is computed from them');
ALTER TABLE ctxguard.generations DROP COLUMN dba_plus_one;

-- Another index as the replica identity (from PostgreSQL 16 a key-only lookup in it finds no row):
-- the statement writes the counters, and none is lost.
CREATE UNIQUE INDEX dba_generations_identity ON ctxguard.generations (id, tenant_id);
ALTER TABLE ctxguard.generations REPLICA IDENTITY USING INDEX dba_generations_identity;
CREATE UNIQUE INDEX dba_document_calls_identity ON ctxguard.document_calls (generation, doc_id, tenant_id);
ALTER TABLE ctxguard.document_calls REPLICA IDENTITY USING INDEX dba_document_calls_identity;
BEGIN;
SELECT pg_temp.gen(:'tok_ranker', :'viewer') AS g6 \gset
COMMIT;
BEGIN;
SELECT pg_temp.read(:'tok_ranker', :'viewer', :'g6', 9, 10) AS r9 \gset
COMMIT;
ALTER TABLE ctxguard.generations REPLICA IDENTITY DEFAULT;
ALTER TABLE ctxguard.document_calls REPLICA IDENTITY DEFAULT;
DROP INDEX ctxguard.dba_generations_identity;
DROP INDEX ctxguard.dba_document_calls_identity;
SELECT is(:'r9'::text, 'okok', 'two reads with another replica identity');
SELECT is(split_part(pg_temp.persisted(:'g6'), '|', 1), split_part(pg_temp.persisted(:'g6'), '|', 2), 'its bytes are persisted');
SELECT is(split_part(pg_temp.persisted(:'g6'), '|', 3), '2', 'and its calls on the document');

-- Removing a generation (a DBA's DELETE) removes its document counters (the foreign key's cascade,
-- which the direct path leaves in place).
DELETE FROM ctxguard.generations WHERE id = :'g1';
SELECT is((SELECT count(*) FROM ctxguard.document_calls WHERE generation = :'g1'), 0::bigint,
          'the foreign key still cascades');
SELECT is(ctxguard.verify_audit('acme')->>'intact', 'true', 'the audit chain holds');
DROP TABLE public.doc_calls_copy;
DROP FUNCTION public.doc_calls_copy();
SELECT * FROM finish();
