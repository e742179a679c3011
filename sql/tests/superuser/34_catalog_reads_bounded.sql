-- Walking the catalog leaves nothing behind in the transaction's memory, and holds one batch of it
-- at a time (issue 34: cost as the catalog grows, without a crash). explain_tools() (the gateway's
-- POST /v1/tools: any user) walks every tool of the catalog in batches. Each tool row had
-- its array columns (page types, roles, states, approver roles, credential modes) and its jsonb
-- columns copied by pgrx into the transaction's memory context, where they stayed until commit
-- (about 2.3 kB per tool per walk here), and every batch of the walk stayed until it returned: at
-- 100,000 tools one call took the backend to a 315 MB peak and kept over 200 MB of it, and a
-- statement calling it repeatedly grew the backend without bound.
--
-- Here the catalog holds 1,000 tools more, and the transaction's own memory context
-- (pg_backend_memory_contexts, TopTransactionContext) is measured around 3 calls of
-- explain_tools(), made as the gateway role.
-- Runs as the superuser (the DBA): registration and the memory view; the calls as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- Bytes in use in the transaction's memory context itself (not its children: SPI's and the
-- executor's contexts, freed when they end; nor its free space, which grows by whole blocks).
CREATE FUNCTION pg_temp.txn_bytes() RETURNS bigint LANGUAGE sql AS $$
    SELECT total_bytes - free_bytes FROM pg_backend_memory_contexts WHERE name = 'TopTransactionContext'
$$;
-- As the gateway, on `page`: n calls of explain_tools(); the rows of the last one.
CREATE FUNCTION pg_temp.explains(tok text, page text, n int) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE c bigint;
BEGIN
    SET LOCAL ROLE ctxguard_gateway;
    PERFORM ctxguard.set_context(tok, jsonb_build_object('pageType', page));
    FOR i IN 1 .. n LOOP
        SELECT count(*) INTO c FROM ctxguard.explain_tools();
    END LOOP;
    RESET ROLE;
    RETURN c;
END $$;

BEGIN;
SELECT ctxguard.register_page_type('reads_pt', NULL, 'A page of 1,000 tools.') IS NOT NULL AS registered \gset
SELECT count(ctxguard.register_tool('reads.t' || i, 'Catalog read test tool ' || i || '.',
           '{"type": "object", "properties": {"q": {"type": "string"}}, "additionalProperties": false}',
           'demo.vendor_list(jsonb)',
           jsonb_build_object('page_types', jsonb_build_array('reads_pt'), 'run_as', 'ctxguard_tools',
                              'roles', jsonb_build_array('ap_clerk', 'viewer', 'auditor', 'approver', 'admin'))))
       AS n FROM generate_series(1, 1000) i \gset
SELECT pg_temp.txn_bytes() AS before_explains \gset
SELECT pg_temp.explains(:'tok_alice', 'reads_pt', 3) AS explained \gset
SELECT pg_temp.txn_bytes() - :before_explains AS explains_grew \gset
SELECT count(*) AS catalogued FROM ctxguard.tools \gset
ROLLBACK;

SELECT is(:n::bigint, 1000::bigint, '1,000 tools registered');
SELECT is(:explained::bigint, :catalogued::bigint, 'explain_tools explains every catalogued tool');
SELECT cmp_ok(:explains_grew::bigint, '<', 262144::bigint,
              format('3 explain_tools walks of the catalog left less than 256 kB in the transaction''s memory (%s bytes)', :explains_grew));

SELECT * FROM finish();
