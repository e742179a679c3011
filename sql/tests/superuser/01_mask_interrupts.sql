-- Masking stops when PostgreSQL asks it to (issue 12 §3, SECURITY_MATRIX J.57): statement_timeout,
-- pg_cancel_backend and pg_terminate_backend end a mask_text call on ~150 MB within a second, and the
-- size cap refuses large text. Runs as a superuser: mask_text is a DBA's tool, and so is raising
-- ctxguard.max_mask_bytes. The cancel and terminate cases drive a second session through dblink
-- (skipped where the dblink extension is not available).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- ~150 MB of e-mail addresses, one per line (5 million matches for the email rule), stored
-- uncompressed so that reading it back is a copy.
CREATE UNLOGGED TABLE public.mask_interrupts_big (t text);
ALTER TABLE public.mask_interrupts_big ALTER COLUMN t SET STORAGE EXTERNAL;
INSERT INTO public.mask_interrupts_big
SELECT string_agg('someone.' || i || '@mail' || (i % 97) || '.example', E'\n') FROM generate_series(1, 5000000) i;
SELECT ok((SELECT octet_length(t) FROM public.mask_interrupts_big) > 100000000, 'the input holds more than 100 MB');

-- The size cap: larger text is refused (54000), never returned unmasked.
SELECT throws_ok($$SELECT ctxguard.mask_text(t) FROM public.mask_interrupts_big$$, '54000', 'ctxguard: the text is larger than ctxguard.max_mask_bytes',
                 'above ctxguard.max_mask_bytes (8 MB by default) mask_text refuses');
SELECT is(ctxguard.mask_text('mail ivan.petrov@example.com')->>'text', 'mail [REDACTED:email]', 'small text is masked');

-- How long the whole call takes when nothing stops it (the yardstick for the cases below).
CREATE FUNCTION pg_temp.seconds_to_mask() RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    PERFORM ctxguard.mask_text(t) FROM public.mask_interrupts_big;
    RETURN extract(epoch FROM clock_timestamp() - t0);
END $$;
SET ctxguard.max_mask_bytes = '1GB';
SELECT pg_temp.seconds_to_mask() AS full_seconds \gset
-- How long an uncancelled call takes depends on the machine: reported, not asserted. The cases
-- below assert that a stop arrives promptly and that the call returned nothing.
SELECT diag(format('uncancelled, the call takes %s s', round(:full_seconds::numeric, 2)));

-- statement_timeout: mask_text checks for interrupts as it goes. (The timeout is armed when the
-- statement starts; the function catches the cancel and reports how long it took.)
CREATE FUNCTION pg_temp.mask_until_stopped() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    BEGIN
        PERFORM ctxguard.mask_text(t) FROM public.mask_interrupts_big;
    EXCEPTION WHEN query_canceled THEN
        RETURN SQLSTATE || CASE WHEN clock_timestamp() - t0 < interval '1.3 s' THEN ' within 1.3 s' ELSE ' after ' || (clock_timestamp() - t0)::text END;
    END;
    RETURN 'finished after ' || (clock_timestamp() - t0)::text;
END $$;
BEGIN;
SET LOCAL statement_timeout = '300ms';
SELECT is(pg_temp.mask_until_stopped(), '57014 within 1.3 s', 'statement_timeout = 300ms stops the call (SQLSTATE 57014) within a second');
ROLLBACK;
RESET ctxguard.max_mask_bytes;

-- pg_cancel_backend and pg_terminate_backend, from another session: start the call, let it run
-- 0.3 s, signal it, and measure until its backend is no longer active.
CREATE FUNCTION pg_temp.start_masking(conn text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    pid int;
BEGIN
    PERFORM dblink_connect(conn, format('host=%s port=%s dbname=%s user=%s', split_part(current_setting('unix_socket_directories'), ',', 1),
                                        current_setting('port'), current_database(), current_user));
    SELECT p INTO pid FROM dblink(conn, 'SELECT pg_backend_pid()') AS r(p int);
    PERFORM dblink_exec(conn, 'SET ctxguard.max_mask_bytes = ''1GB''');
    PERFORM dblink_send_query(conn, 'SELECT ctxguard.mask_text(t) FROM public.mask_interrupts_big');
    PERFORM pg_sleep(0.3);
    RETURN pid;
END $$;
-- Seconds from now until backend `pid` is no longer active (with `gone`: has exited), at most `seconds`.
CREATE FUNCTION pg_temp.seconds_until_stopped(pid int, seconds float8, gone boolean DEFAULT false) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
BEGIN
    LOOP
        PERFORM pg_stat_clear_snapshot();   -- pg_stat_activity is otherwise read once per transaction
        IF NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = seconds_until_stopped.pid AND (gone OR a.state = 'active'))
           OR clock_timestamp() - t0 > make_interval(secs => seconds) THEN
            RETURN extract(epoch FROM clock_timestamp() - t0);
        END IF;
        PERFORM pg_sleep(0.02);
    END LOOP;
END $$;
CREATE FUNCTION pg_temp.running(pid int) RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = running.pid AND a.state = 'active' AND a.query LIKE '%mask_text%')
$$;

SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'dblink') AS have_dblink \gset
\if :have_dblink
CREATE EXTENSION IF NOT EXISTS dblink;

SELECT pg_temp.start_masking('cancel') AS pid \gset
SELECT ok(pg_temp.running(:pid), 'cancel: masking is running');
SELECT ok(pg_cancel_backend(:pid), 'cancel: pg_cancel_backend sent');
SELECT pg_temp.seconds_until_stopped(:pid, 5) AS stopped \gset
SELECT ok(:stopped < 1.0, format('cancel: the call stops within a second (%s s)', round(:stopped::numeric, 2)));
SELECT is(count(*), 0::bigint, 'cancel: the call returned no result') FROM dblink_get_result('cancel', false) AS r(x jsonb);
SELECT ok(dblink_error_message('cancel') LIKE '%canceling statement due to user request%', 'cancel: the call ended with a cancel (57014)');
SELECT count(*) FROM dblink_get_result('cancel', false) AS r(x jsonb) \g /dev/null
SELECT is((SELECT x FROM dblink('cancel', 'SELECT 1') AS r(x int)), 1, 'cancel: the session is usable again');
SELECT dblink_disconnect('cancel') \g /dev/null

SELECT pg_temp.start_masking('terminate') AS pid \gset
SELECT ok(pg_temp.running(:pid), 'terminate: masking is running');
SELECT ok(pg_terminate_backend(:pid), 'terminate: pg_terminate_backend sent');
SELECT pg_temp.seconds_until_stopped(:pid, 5) AS stopped \gset
SELECT ok(:stopped < 1.0, format('terminate: the call stops within a second (%s s)', round(:stopped::numeric, 2)));

SELECT ok(pg_temp.seconds_until_stopped(:pid, 2, gone => true) < 2, 'terminate: the backend has exited (no kill -9, no cluster restart)');
SELECT ok(EXISTS (SELECT FROM pg_stat_activity WHERE pid = pg_backend_pid()), 'terminate: the cluster keeps running');
DO $$ BEGIN PERFORM dblink_disconnect('terminate'); EXCEPTION WHEN OTHERS THEN NULL; END $$;
\else
SELECT skip('dblink is not available: cancel and terminate from another session not tested', 1);
\endif

DROP TABLE public.mask_interrupts_big;
SELECT * FROM finish();
