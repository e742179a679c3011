-- The pages read for the daily coverage without a statement (issue 34; ledger/direct.rs,
-- insert_absent): each page of a call is inserted into document_coverage once, a page already there
-- is left as it is (not even locked), a page whose row the writer committed already is not looked
-- for again (writer.rs, Covered), a batch that carries the same page twice writes it once, and a
-- DBA's trigger, column or second unique index on the table sends the pages through the statement.
-- Runs as the superuser (the DBA); the calls as ctxguard_gateway, as a reader of this run's own
-- (:tok_reader: the writer remembers the rows it wrote, and the ledger's shared memory a user's
-- pages, until the day is over).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\ir ../lib/generation.sql
-- As the gateway: one read_doc_pages call per range "first-last"; the envelopes' statuses or codes.
CREATE FUNCTION pg_temp.read(tok text, page jsonb, g uuid, VARIADIC ranges text[]) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r jsonb; out text := ''; x text;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page, g);
    FOREACH x IN ARRAY ranges LOOP
        r := ctxguard.call_tool('read_doc_pages', jsonb_build_object(
            'page_start', split_part(x, '-', 1)::int, 'page_end', split_part(x, '-', 2)::int));
        out := out || coalesce(r->'error'->>'code', r->>'status');
    END LOOP;
    RESET ROLE;
    RETURN out;
END $$;
-- The reader: the token's subject (its payload, base64url).
SELECT convert_from(decode(rpad(translate(split_part(:'tok_reader', '.', 2), '-_', '+/'),
                                (length(split_part(:'tok_reader', '.', 2)) + 3) / 4 * 4, '='), 'base64'),
                    'UTF8')::jsonb->>'sub' AS reader \gset
-- The reader's coverage rows for pages lo..hi of the guide, as "page:count" in page order.
CREATE FUNCTION pg_temp.covered(lo int, hi int) RETURNS text LANGUAGE sql AS $$
    SELECT coalesce(string_agg(page_no || ':' || n, ',' ORDER BY page_no), '')
      FROM (SELECT page_no, count(*) AS n FROM ctxguard.document_coverage
             WHERE tenant_id = 'acme' AND user_id = current_setting('test.reader') AND doc_id = 'acme_guide'
               AND page_no BETWEEN lo AND hi
             GROUP BY page_no) c
$$;
SELECT set_config('test.reader', :'reader', false) \g /dev/null
CREATE FUNCTION pg_temp.direct_rows() RETURNS bigint LANGUAGE sql AS $$
    SELECT coalesce((ctxguard.ledger_stats()->>'counter_rows_direct')::bigint, 0)  -- 0 before the writer starts
$$;
-- Wait (up to 20 s) until the audit rows the writer inserted without a statement reach `want`
-- (ledger_stats is published after the batch commits); their count.
CREATE FUNCTION pg_temp.direct_audits(want bigint DEFAULT 0) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE got bigint;
BEGIN
    FOR i IN 1 .. 200 LOOP
        got := coalesce((ctxguard.ledger_stats()->>'audit_rows_direct')::bigint, 0);
        EXIT WHEN got >= want;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN got;
END $$;
-- Wait (up to 20 s) until generation g has `want` audited read_doc_pages calls; their count.
CREATE FUNCTION pg_temp.audited(g uuid, want int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE got int;
BEGIN
    FOR i IN 1 .. 200 LOOP
        SELECT count(*) INTO got FROM ctxguard.audit_log
         WHERE generation = g AND tool = 'read_doc_pages' AND decision = 'allow';
        EXIT WHEN got >= want;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN got;
END $$;

SELECT is(pg_temp.covered(1, 500), '', 'a reader who read nothing yet');

-- Three new pages in one call: inserted without a statement.
BEGIN;
SELECT pg_temp.gen(:'tok_reader', :'viewer') AS g1 \gset
COMMIT;
SELECT pg_temp.direct_rows() AS direct0 \gset
BEGIN;
SELECT pg_temp.read(:'tok_reader', :'viewer', :'g1', '211-213') AS r1 \gset
COMMIT;
SELECT is(:'r1'::text, 'ok', 'a read of three pages');
SELECT is(pg_temp.covered(211, 219), '211:1,212:1,213:1', 'each page read is covered once');
-- The call's rows: the generation's bytes, its document counter, the user's day, three pages.
SELECT ok(pg_temp.direct_rows() - :direct0 >= 6, 'the pages were written without a statement');

-- The same pages again: the rows found are left as they are.
BEGIN;
SELECT pg_temp.read(:'tok_reader', :'viewer', :'g1', '211-213', '212-214') AS r2 \gset
COMMIT;
SELECT is(:'r2'::text, 'okok', 'the pages read again, and one more');
SELECT is(pg_temp.covered(211, 219), '211:1,212:1,213:1,214:1', 'still once each, and the new page added');
SELECT is((SELECT count(*) FROM ctxguard.document_coverage
            WHERE tenant_id = 'acme' AND user_id = :'reader' AND doc_id = 'acme_guide'
              AND page_no BETWEEN 211 AND 214 AND xmax::text <> '0'), 0::bigint,
          'the rows found were not locked or changed (as ON CONFLICT DO NOTHING leaves them)');

-- Callers that do not wait for their record: their records reach the writer together (as a rule: the
-- writer collects records that do not wait every 50 ms), so one batch carries the same page several
-- times. Each page is written once, every call is audited, and the batch is written without a
-- statement (a failure of the direct path would send it to the statement).
SELECT pg_temp.direct_audits() AS audits0 \gset
SET ctxguard.audit_wait = off;
BEGIN;
SELECT pg_temp.read(:'tok_reader', :'viewer', :'g1', '215-215', '215-216', '215-215', '216-216') AS r_nowait \gset
COMMIT;
RESET ctxguard.audit_wait;
SELECT is(:'r_nowait'::text, 'okokokok', 'four reads that do not wait, three of page 215');
SELECT is(pg_temp.audited(:'g1', 7), 7, 'every call is audited');
SELECT is(pg_temp.direct_audits(:audits0 + 4) - :audits0, 4::bigint, 'their batch was written without a statement');
SELECT is(pg_temp.covered(211, 219), '211:1,212:1,213:1,214:1,215:1,216:1', 'pages 215 and 216 covered once each');

-- A DBA's trigger on document_coverage: the statement writes the pages, and the trigger fires for
-- each new one. A BEFORE trigger sees every row the statement proposes, those ON CONFLICT DO
-- NOTHING then skips too: page 216, whose row the writer committed above, is not even proposed.
CREATE TABLE public.coverage_copy (page_no int, proposed boolean);
CREATE FUNCTION public.coverage_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.coverage_copy VALUES (NEW.page_no, TG_WHEN = 'BEFORE');
    RETURN NEW;
END $$;
CREATE TRIGGER coverage_copy AFTER INSERT ON ctxguard.document_coverage
    FOR EACH ROW EXECUTE FUNCTION public.coverage_copy();
CREATE TRIGGER coverage_proposed BEFORE INSERT ON ctxguard.document_coverage
    FOR EACH ROW EXECUTE FUNCTION public.coverage_copy();
-- (A generation of its own: a generation's calls on a document are limited.)
BEGIN;
SELECT pg_temp.gen(:'tok_reader', :'viewer') AS g2 \gset
COMMIT;
BEGIN;
SELECT pg_temp.read(:'tok_reader', :'viewer', :'g2', '216-218') AS r3 \gset
COMMIT;
SELECT is(:'r3'::text, 'ok', 'a read with a DBA''s trigger on document_coverage');
DROP TRIGGER coverage_copy ON ctxguard.document_coverage;
DROP TRIGGER coverage_proposed ON ctxguard.document_coverage;
SELECT is((SELECT array_agg(page_no ORDER BY page_no) FROM public.coverage_copy WHERE NOT proposed), ARRAY[217, 218],
          'the trigger fired for the new pages only');
SELECT is((SELECT array_agg(page_no ORDER BY page_no) FROM public.coverage_copy WHERE proposed), ARRAY[217, 218],
          'a page whose row the writer committed already is not sent to the table again');
SELECT is(pg_temp.covered(211, 219), '211:1,212:1,213:1,214:1,215:1,216:1,217:1,218:1', 'each page covered once');

-- A DBA's column on document_coverage: the statement again (its default is the DBA's to apply).
ALTER TABLE ctxguard.document_coverage ADD COLUMN dba_note text DEFAULT 'noted';
BEGIN;
SELECT pg_temp.read(:'tok_reader', :'viewer', :'g2', '219-219') AS r4 \gset
COMMIT;
SELECT is(:'r4'::text, 'ok', 'a read with a DBA''s column on document_coverage');
SELECT is((SELECT dba_note FROM ctxguard.document_coverage
            WHERE tenant_id = 'acme' AND user_id = :'reader' AND doc_id = 'acme_guide' AND page_no = 219
           ), 'noted', 'the row has the column''s default');
ALTER TABLE ctxguard.document_coverage DROP COLUMN dba_note;

-- A DBA's second unique index (here: a page once per user and document, whatever the day). The
-- statement's ON CONFLICT DO NOTHING skips a conflict on it, so the pages take the statement: a
-- page read on another day is skipped, and the batch's audit rows are still written directly (a
-- direct insert would raise the conflict and send the whole batch to the statement).
CREATE UNIQUE INDEX dba_coverage_once ON ctxguard.document_coverage (tenant_id, user_id, doc_id, page_no);
INSERT INTO ctxguard.document_coverage VALUES ('acme', :'reader', 'acme_guide', '2001-01-01', 220);
SELECT pg_temp.direct_audits() AS audits1 \gset
BEGIN;
SELECT pg_temp.read(:'tok_reader', :'viewer', :'g2', '220-220') AS r_unique \gset
COMMIT;
SELECT is(:'r_unique'::text, 'ok', 'a read with a DBA''s second unique index on document_coverage');
SELECT is(pg_temp.direct_audits(:audits1 + 1) - :audits1, 1::bigint, 'its audit row was written without a statement');
SELECT is((SELECT array_agg(day ORDER BY day) FROM ctxguard.document_coverage
            WHERE tenant_id = 'acme' AND user_id = :'reader' AND doc_id = 'acme_guide' AND page_no = 220),
          ARRAY['2001-01-01'::date], 'the page''s row of another day is left, and no second row is written');
DROP INDEX ctxguard.dba_coverage_once;
DELETE FROM ctxguard.document_coverage
 WHERE tenant_id = 'acme' AND user_id = :'reader' AND doc_id = 'acme_guide' AND page_no = 220;

-- The table as ctxguard creates it again: without a statement.
BEGIN;
SELECT pg_temp.gen(:'tok_reader', :'viewer') AS g3 \gset
COMMIT;
SELECT pg_temp.direct_rows() AS direct1 \gset
BEGIN;
SELECT pg_temp.read(:'tok_reader', :'viewer', :'g3', '221-221') AS r5 \gset
COMMIT;
SELECT is(:'r5'::text, 'ok', 'a read once the table is as ctxguard made it');
SELECT is(pg_temp.covered(221, 221), '221:1', 'the page is covered');
-- The page, the generation's bytes and its document counter (the user's day is persisted ahead of
-- its bytes by a margin, so this read may not write it).
SELECT ok(pg_temp.direct_rows() - :direct1 >= 3, 'without a statement');

DROP TABLE public.coverage_copy;
DROP FUNCTION public.coverage_copy();
SELECT * FROM finish();
