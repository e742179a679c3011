-- For the superuser suite: pg_temp.writer_pid() (this database's ledger writer, NULL if none) and
-- pg_temp.stop_writer() (stop it and wait, up to 20 s, until it has exited; whether it has).
CREATE FUNCTION pg_temp.writer_pid() RETURNS int LANGUAGE sql AS $$
    SELECT (ctxguard.ledger_stats()->>'writer_pid')::int
$$;
-- Stop the writer (if one runs) and wait (up to 20 s) until it has exited; whether it has.
CREATE FUNCTION pg_temp.stop_writer() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE w int := pg_temp.writer_pid();
BEGIN
    IF w IS NULL OR NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = w) THEN
        RETURN true;
    END IF;
    PERFORM pg_terminate_backend(w);
    FOR i IN 1 .. 200 LOOP
        PERFORM pg_stat_clear_snapshot();  -- pg_stat_activity is read once per transaction otherwise
        IF NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.pid = w) THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN false;
END $$;
