-- The ledger (issue 13; SECURITY_MATRIX I.53-I.55): charges and audit rows that no rollback of the
-- caller undoes, on UTC days whatever the session's TimeZone. Runs as ctxguard_gateway (bob, who
-- reads acme_guide nowhere else in the suite).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
CREATE FUNCTION pg_temp.gen(tok text, page jsonb) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE g uuid;
BEGIN
    PERFORM ctxguard.set_context(tok, page);
    g := ctxguard.begin_generation('ledger');
    PERFORM ctxguard.set_context(tok, page, g);
    RETURN g;
END $$;
-- Each call in a subtransaction that is rolled back (ROLLBACK TO SAVEPOINT), its outcome kept.
CREATE FUNCTION pg_temp.undone(n int) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE out text[] := '{}'; r jsonb;
BEGIN
    FOR i IN 1 .. n LOOP
        BEGIN
            r := ctxguard.call_tool('read_doc_pages', '{"page_start": 1, "page_end": 1}');
            RAISE EXCEPTION 'undo';
        EXCEPTION WHEN raise_exception THEN
            out := out || coalesce(split_part(r->'error'->>'message', ':', 1), r->>'status');
        END;
    END LOOP;
    RETURN out;
END $$;

-- I.53 ROLLBACK TO SAVEPOINT: the per-document call limit (10) still binds, and every call is audited.
BEGIN;
SELECT pg_temp.gen(:'tok_bob', :'viewer') AS g1 \gset
SELECT pg_temp.undone(12) AS undone \gset
ROLLBACK;
-- (pgTAP's results are rows too: assertions run outside the transactions that roll back.)
SELECT is(:'undone'::text[], array_fill('ok'::text, ARRAY[10]) || ARRAY['calls_per_document', 'calls_per_document'],
          'I.53 savepoint rollbacks refund no call: the 11th and 12th are refused');
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'viewer') \g /dev/null
SELECT is((SELECT count(*) FROM ctxguard.audit_log WHERE generation = :'g1'), 12::bigint,
          'I.53 the audit rows of calls whose subtransactions and transaction rolled back are there');
SELECT is((SELECT count(*) FROM ctxguard.audit_log WHERE generation = :'g1' AND row_hash IS NOT NULL), 12::bigint,
          'I.53 each is chained (row_hash set by the writer)');
COMMIT;

-- I.53 a whole ROLLBACK: the generation (committed) keeps its calls.
BEGIN;
SELECT pg_temp.gen(:'tok_bob', :'viewer') AS g2 \gset
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'viewer', :'g2') \g /dev/null
SELECT (SELECT count(*) FROM generate_series(1, 10) i
         WHERE pg_temp.code(ctxguard.call_tool('read_doc_pages', '{"page_start": 1, "page_end": 1}')) = 'ok') AS ten \gset
ROLLBACK;
SELECT is(:ten::bigint, 10::bigint, 'ten calls in a transaction that rolls back');
BEGIN;
SELECT ctxguard.set_context(:'tok_bob', :'viewer', :'g2') \g /dev/null
SELECT is(ctxguard.call_tool('read_doc_pages', '{"page_start": 1, "page_end": 1}')->'error'->>'message',
          'calls_per_document: at most 10 calls per document per generation', 'I.53 ROLLBACK refunds no call');
SELECT ok((SELECT (budget->>'bytes_used')::bigint FROM ctxguard.audit_log WHERE generation = :'g2' AND decision = 'allow'
            ORDER BY id DESC LIMIT 1) > 0, 'I.53 the rolled-back bytes stay charged to the generation');
COMMIT;

-- I.53 TimeZone: every window in a zone 167 hours away, alternately east and west; the coverage
-- (30% of 500 pages = 150, of which bob read 1-5 above) is one UTC day's.
CREATE FUNCTION pg_temp.walk(tok text, page jsonb, windows int) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE out text[] := '{}'; r jsonb;
BEGIN
    FOR i IN 1 .. windows LOOP
        PERFORM set_config('TimeZone', CASE WHEN i % 2 = 0 THEN '<X>+167' ELSE '<X>-167' END, true);
        PERFORM pg_temp.gen(tok, page);
        r := ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', i * 5 + 1, 'page_end', i * 5 + 5));
        out := out || coalesce(split_part(r->'error'->>'message', ':', 1), 'ok');
    END LOOP;
    RETURN out;
END $$;
BEGIN;
SELECT pg_temp.walk(:'tok_bob', :'viewer', 30) AS walk \gset
ROLLBACK;
SELECT is((:'walk'::text[])[1:29], array_fill('ok'::text, ARRAY[29]), 'I.53 29 windows pass (pages 6-150)');
SELECT is((:'walk'::text[])[30], 'document_coverage', 'I.53 the 30th is stopped: TimeZone does not move the coverage day');

-- I.54 search results count toward coverage: bob's day on acme_guide is spent.
BEGIN;
SELECT pg_temp.gen(:'tok_bob', :'viewer') \g /dev/null
SELECT split_part(ctxguard.call_tool('doc_local_search', '{"query": "chapter 30 audit logging"}')->'error'->>'message', ':', 1) AS searched \gset
ROLLBACK;
SELECT is(:'searched'::text, 'document_coverage', 'I.54 doc_local_search returns no snippet of pages past the day''s coverage');

-- Issue 13: the transaction of a read-only tool call writes nothing of its own (no xid: no WAL,
-- no commit record, no flush to wait for); its charges and audit record go through the writer.
-- (Read before any pgTAP assertion: pgTAP records results in a table.)
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}') \g /dev/null
SELECT count(*) AS nowal_tools FROM ctxguard.visible_tools() \gset
SELECT pg_temp.code(ctxguard.call_tool('invoice.get', '{}')) AS nowal_code,
       coalesce(txid_current_if_assigned()::text, 'none') AS nowal_xid \gset
COMMIT;
SELECT ok(:nowal_tools > 0, 'Gate A lists tools on the invoice page');
SELECT is(:'nowal_code'::text, 'ok', 'a read-only tool answers');
SELECT is(:'nowal_xid'::text, 'none', 'and the caller''s transaction has no xid: it wrote nothing');
-- In a session of its own too (its first call looks up the extension's owner).
\set nowal_out `psql -X -q -At -h :'HOST' -p :'PORT' -d :'DBNAME' -U ctxguard_gateway -v tok=:'tok_alice' -f sql/tests/lib/nowal_session.sql 2>&1`
SELECT is(:'nowal_out'::text, 'ok|none', 'the same in a new session: no xid');
BEGIN;
SELECT pg_temp.gen(:'tok_dave', :'viewer') AS nowal_gen \gset
COMMIT;
BEGIN;
SELECT ctxguard.set_context(:'tok_dave', :'viewer', :'nowal_gen') \g /dev/null
SELECT pg_temp.code(ctxguard.call_tool('read_doc_pages', '{"page_start": 1, "page_end": 1}')) AS nowal_code,
       coalesce(txid_current_if_assigned()::text, 'none') AS nowal_xid \gset
COMMIT;
SELECT is(:'nowal_code'::text, 'ok', 'a document tool charges the generation and the coverage');
SELECT is(:'nowal_xid'::text, 'none', 'and its transaction wrote nothing either');

SELECT * FROM finish();
