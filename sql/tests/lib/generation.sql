-- For the superuser suite: pg_temp.gen(token, page) mints a generation as the gateway role
-- (set_context, begin_generation) and returns it; the session is the superuser again after it.
-- Call it inside a transaction block (set_context refuses outside one). Also sets :viewer, the
-- document viewer page of the demo guide.
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'
CREATE FUNCTION pg_temp.gen(tok text, page jsonb) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE g uuid;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page);
    g := ctxguard.begin_generation('superuser-suite');
    RESET ROLE;
    RETURN g;
END $$;
