-- For the superuser suite: pg_temp.gateway_call(token, page) calls invoice.get as the gateway role
-- (set_context, call_tool) and returns its envelope; the session is the superuser again after it.
-- Call it inside a transaction block (set_context refuses outside one).
CREATE FUNCTION pg_temp.gateway_call(tok text, page jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, page);
    r := ctxguard.call_tool('invoice.get', '{}');
    RESET ROLE;
    RETURN r;
END $$;
