-- The writer's two ways into ctxguard.audit_log (issue 13): into the table as ctxguard creates it,
-- rows without a statement (ledger/direct.rs); into a table a DBA changed, the statement, which
-- honours the change. Either way a DBA's column gets its default, a DBA's trigger fires, and the
-- chain verifies. Runs as the superuser (the DBA); the calls run as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set page '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}'
\ir ../lib/gateway_call.sql
-- The call's id; a call that is not ok fails the test.
CREATE FUNCTION pg_temp.call(tok text, page jsonb) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE r jsonb := pg_temp.gateway_call(tok, page);
BEGIN
    IF r->>'status' <> 'ok' THEN RAISE EXCEPTION 'call failed: %', r; END IF;
    RETURN (r->>'call_id')::uuid;
END $$;
CREATE TABLE public.audit_direct_copy (call_id uuid, decision text, id bigint);
CREATE FUNCTION public.audit_direct_copy() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.audit_direct_copy VALUES (NEW.call_id, NEW.decision, NEW.id);
    RETURN NEW;
END $$;

-- The table as ctxguard creates it: no statement.
SELECT (ctxguard.ledger_stats()->>'audit_rows_direct')::bigint AS direct0 \gset
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS c1 \gset
COMMIT;
SELECT is((SELECT decision || '|' || tool || '|' || entity_id || '|' || (row_hash IS NOT NULL) || '|' || (id IS NOT NULL)
             FROM ctxguard.audit_log WHERE call_id = :'c1'),
          'allow|invoice.get|acme_inv3|true|true', 'direct: the row is there, chained, with its identity id');
SELECT ok((ctxguard.ledger_stats()->>'audit_rows_direct')::bigint > :direct0, 'direct: written without a statement');

-- A column a DBA added, with a default: filled on the direct path as an INSERT would fill it.
ALTER TABLE ctxguard.audit_log ADD COLUMN dba_note text DEFAULT 'noted';
SELECT (ctxguard.ledger_stats()->>'audit_rows_direct')::bigint AS direct1 \gset
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS c2 \gset
COMMIT;
SELECT is((SELECT dba_note FROM ctxguard.audit_log WHERE call_id = :'c2'), 'noted', 'direct: a DBA''s column gets its default');
SELECT ok((ctxguard.ledger_stats()->>'audit_rows_direct')::bigint > :direct1, 'direct: still without a statement');

-- A DBA's trigger: the statement, and the trigger fires.
CREATE TRIGGER audit_direct_copy AFTER INSERT ON ctxguard.audit_log
    FOR EACH ROW EXECUTE FUNCTION public.audit_direct_copy();
SELECT (ctxguard.ledger_stats()->>'audit_rows_direct')::bigint AS direct2 \gset
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS c3 \gset
COMMIT;
SELECT is((SELECT decision FROM public.audit_direct_copy WHERE call_id = :'c3'), 'allow',
          'with a DBA''s trigger on audit_log, the trigger fires for the writer''s row');
SELECT is((SELECT dba_note FROM ctxguard.audit_log WHERE call_id = :'c3'), 'noted', 'statement: the DBA''s column gets its default');
SELECT is((ctxguard.ledger_stats()->>'audit_rows_direct')::bigint, :direct2::bigint, 'with a trigger, no row goes without a statement');
DROP TRIGGER audit_direct_copy ON ctxguard.audit_log;

-- A dropped column: the direct path again.
ALTER TABLE ctxguard.audit_log DROP COLUMN dba_note;
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS c4 \gset
COMMIT;
SELECT ok((SELECT id FROM ctxguard.audit_log WHERE call_id = :'c4') > (SELECT id FROM ctxguard.audit_log WHERE call_id = :'c3'),
          'after a dropped column, ids still follow the calls');
SELECT ok((ctxguard.ledger_stats()->>'audit_rows_direct')::bigint > :direct2, 'and rows go without a statement again');
-- A check the direct path must honour: a DBA's constraint refuses the row, and the call fails closed.
ALTER TABLE ctxguard.audit_log ADD CONSTRAINT dba_no_invoice_get CHECK (tool <> 'invoice.get') NOT VALID;
BEGIN;
SELECT pg_temp.gateway_call(:'tok_alice', :'page') AS refused \gset
COMMIT;
ALTER TABLE ctxguard.audit_log DROP CONSTRAINT dba_no_invoice_get;
SELECT is((:'refused'::jsonb)->'error'->>'code', 'AUDIT_UNAVAILABLE', 'a row the table refuses fails its call closed');
SELECT is((SELECT count(*) FROM ctxguard.audit_log WHERE call_id = ((:'refused'::jsonb)->>'call_id')::uuid), 0::bigint, 'and is not there');

-- The writer keeps a CHECK constraint compiled across batches only when it calls built-in functions:
-- a DBA's function is read anew each batch, so redefining it changes what the next batch allows.
CREATE FUNCTION public.dba_allows(t text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT t <> 'invoice.get' $$;
ALTER TABLE ctxguard.audit_log ADD CONSTRAINT dba_fn_check CHECK (public.dba_allows(tool)) NOT VALID;
BEGIN;
SELECT pg_temp.gateway_call(:'tok_alice', :'page') AS refused_fn \gset
COMMIT;
SELECT is((:'refused_fn'::jsonb)->'error'->>'code', 'AUDIT_UNAVAILABLE', 'a DBA''s function in a CHECK refuses the row: the call fails closed');
CREATE OR REPLACE FUNCTION public.dba_allows(t text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT true $$;
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS c5 \gset
COMMIT;
SELECT is((SELECT decision FROM ctxguard.audit_log WHERE call_id = :'c5'), 'allow', 'the function redefined, the next call''s row is written');
ALTER TABLE ctxguard.audit_log DROP CONSTRAINT dba_fn_check;
DROP FUNCTION public.dba_allows(text);
-- A built-in CHECK kept compiled is dropped with its constraint: the next row is not judged by it.
ALTER TABLE ctxguard.audit_log ADD CONSTRAINT dba_no_invoice_get CHECK (tool <> 'invoice.get') NOT VALID;
BEGIN;
SELECT pg_temp.gateway_call(:'tok_alice', :'page') AS refused_again \gset
COMMIT;
ALTER TABLE ctxguard.audit_log DROP CONSTRAINT dba_no_invoice_get;
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS c6 \gset
COMMIT;
SELECT is((:'refused_again'::jsonb)->'error'->>'code', 'AUDIT_UNAVAILABLE', 'the same built-in CHECK again: refused');
SELECT is((SELECT decision FROM ctxguard.audit_log WHERE call_id = :'c6'), 'allow', 'and once dropped, no longer applied');

-- A CHECK on the whole row (the executor keeps per-query state for it): compiled for each batch, so
-- every batch's rows are judged with state of its own.
ALTER TABLE ctxguard.audit_log ADD CONSTRAINT dba_whole_row CHECK (audit_log IS DISTINCT FROM NULL) NOT VALID;
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS w1 \gset
COMMIT;
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS w2 \gset
COMMIT;
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS w3 \gset
COMMIT;
ALTER TABLE ctxguard.audit_log DROP CONSTRAINT dba_whole_row;
SELECT is((SELECT count(*) FROM ctxguard.audit_log WHERE call_id IN (:'w1', :'w2', :'w3') AND decision = 'allow'), 3::bigint,
          'a whole-row CHECK passes batch after batch');

-- The identity's sequence, kept by the writer across batches, follows a DBA's change of the
-- identity: replaced by another, the next row takes its id from the new one, still without a
-- statement, in the same writer.
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS i1 \gset
COMMIT;
SELECT ctxguard.ledger_stats()->>'writer_pid' AS writer0, (SELECT max(id) + 1000000 FROM ctxguard.audit_log) AS next_start \gset
ALTER EXTENSION ctxguard DROP SEQUENCE ctxguard.audit_log_id_seq;
ALTER TABLE ctxguard.audit_log ALTER COLUMN id DROP IDENTITY;
SELECT format('ALTER TABLE ctxguard.audit_log ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH %s)', :next_start) \gexec
ALTER EXTENSION ctxguard ADD SEQUENCE ctxguard.audit_log_id_seq;
SELECT (ctxguard.ledger_stats()->>'audit_rows_direct')::bigint AS direct3 \gset
BEGIN;
SELECT pg_temp.call(:'tok_alice', :'page') AS i2 \gset
COMMIT;
SELECT is(ctxguard.ledger_stats()->>'writer_pid', :'writer0', 'the same writer wrote the rows before and after the change');
SELECT is((SELECT id FROM ctxguard.audit_log WHERE call_id = :'i2'), :next_start::bigint,
          'after the identity is replaced, the next row takes the new sequence''s first id');
SELECT ok((ctxguard.ledger_stats()->>'audit_rows_direct')::bigint > :direct3, 'still without a statement');

SELECT is(ctxguard.verify_audit('acme')->>'intact', 'true', 'the chain holds across both ways');
DROP TABLE public.audit_direct_copy;
DROP FUNCTION public.audit_direct_copy();
SELECT * FROM finish();
