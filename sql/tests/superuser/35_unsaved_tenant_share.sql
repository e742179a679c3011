-- One tenant's generation counters that never find their row cannot crowd out another tenant's
-- (SECURITY_MATRIX M.75). Found by an attacker's review: the ledger writer keeps the counters of a
-- generation whose row it cannot see yet (minted in a transaction still open) and writes them when
-- the row appears; it kept at most 16,384 of them for all tenants, and a generation minted in a
-- transaction that rolled back never appears, so its counters stay until the generation expires
-- (about an hour). Two users of one tenant filled the list in seconds; then another tenant's
-- counters were dropped, and its generation's bytes were never written (a restart would forget
-- them: the byte budget starts again). Now one tenant keeps at most a quarter of the list.
-- Runs as a superuser; the calls as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\ir ../lib/writer.sql
\set detail '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
\set glx_detail '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "glx_inv3"}}'
-- As the gateway, in the caller's transaction: `n` generations minted by `tok`'s user on `page`,
-- each charged by one call; how many calls ran.
CREATE FUNCTION pg_temp.mint_and_call(tok text, page jsonb, prefix text, n int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE ran int;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page);
    SELECT count(*) INTO ran FROM generate_series(1, n) g
     WHERE ctxguard.begin_generation(prefix || g) IS NOT NULL
       AND ctxguard.call_tool('invoice.get', '{}')->>'status' = 'ok';
    RESET ROLE;
    RETURN ran;
END $$;

-- Two acme users: 8,300 generations each, minted and charged in transactions that roll back.
BEGIN;
SELECT is(pg_temp.mint_and_call(:'tok_reader', :'detail', 'u35-a-', 8300), 8300, 'one acme user: 8,300 calls, each in a generation of its own');
ROLLBACK;
BEGIN;
SELECT is(pg_temp.mint_and_call(:'tok_ranker', :'detail', 'u35-r-', 8300), 8300, 'another: 8,300 more');
ROLLBACK;

-- A globex user mints a generation and calls in it, in one transaction: the writer writes the
-- call's record before the generation's row is committed, and keeps its counter waiting.
BEGIN;
SET LOCAL ROLE ctxguard_gateway;
SELECT ctxguard.set_context(:'tok_carol', :'glx_detail') \g /dev/null
SELECT ctxguard.begin_generation('u35-globex') AS gen \gset
SELECT ctxguard.set_context(:'tok_carol', :'glx_detail', :'gen') \g /dev/null
SELECT is(ctxguard.call_tool('invoice.get', '{}')->>'status', 'ok', 'globex: a call in its new generation');
RESET ROLE;
COMMIT;

-- The writer writes waiting counters again at least every 10 s.
CREATE FUNCTION pg_temp.bytes_written(g uuid) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE b bigint;
BEGIN
    FOR i IN 1 .. 300 LOOP
        SELECT bytes_used INTO b FROM ctxguard.generations WHERE id = g;
        EXIT WHEN b > 0;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN b;
END $$;
SELECT cmp_ok(pg_temp.bytes_written(:'gen'::uuid), '>', 0::bigint,
              'the globex generation''s bytes are written, though acme''s counters wait by the thousand');

-- acme's waiting counters go with the writer (they are in shared memory too, until they expire).
SELECT ok(pg_temp.stop_writer(), 'the writer has exited');
SELECT * FROM finish();
