-- bench/scale.sh's fixture. Run as a superuser in a database freshly made by create_demo_db
-- (scripts/lib.sh). Nothing here changes how ctxguard works: it only adds the bench's own
-- bookkeeping, the generators of its synthetic data, and lets the gateway role read what the
-- measured backend reports about itself.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

BEGIN;

CREATE SCHEMA scalebench;
GRANT USAGE ON SCHEMA scalebench TO ctxguard_gateway;

-- What a measured backend reports about its own catalog cache and memory (ctxguard.catalog_stats
-- is a DBA's view, revoked from PUBLIC): granted to the gateway role in this database only, so that
-- the backend that made the calls is the one that reports.
GRANT EXECUTE ON FUNCTION ctxguard.catalog_stats() TO ctxguard_gateway;

-- Registration times: one row per registering statement (written by the superuser's session).
CREATE TABLE scalebench.register_ms (
    upto   integer NOT NULL,   -- scale tools registered once this statement committed
    tools  integer NOT NULL,   -- tools this statement registered
    ms     float8 NOT NULL     -- the statement and its commit, clock_timestamp() before and after
);

-- The synthetic catalog: tool i sits on page type scale_pNNN with NNN = i mod 100 (a list page,
-- no entity), like bench/setup.sql's tools: a short description, a small input schema, the
-- trivial demo handler, run as the demo tools' role. Only Gate A and the cache read them; none is
-- ever called.
CREATE FUNCTION scalebench.page_of(i integer) RETURNS text LANGUAGE sql IMMUTABLE
    RETURN 'scale_p' || lpad((i % 100)::text, 3, '0');
CREATE FUNCTION scalebench.tool_name(i integer) RETURNS text LANGUAGE sql IMMUTABLE
    RETURN 'scale.p' || lpad((i % 100)::text, 3, '0') || '.t' || i;
CREATE FUNCTION scalebench.tool_description(i integer) RETURNS text LANGUAGE sql IMMUTABLE
    RETURN format('%s the %s of the records shown on this page (synthetic tool %s).',
                  (ARRAY['List', 'Search', 'Export', 'Count', 'Summarize'])[1 + i % 5],
                  (ARRAY['notes', 'attachments', 'history', 'contacts', 'tags', 'tasks', 'comments'])[1 + i % 7], i);
CREATE FUNCTION scalebench.tool_schema(i integer) RETURNS jsonb LANGUAGE sql IMMUTABLE
    RETURN jsonb_build_object('type', 'object', 'additionalProperties', false,
        'properties', jsonb_build_object(
            'query', jsonb_build_object('type', 'string', 'maxLength', 200),
            'limit', jsonb_build_object('type', 'integer', 'minimum', 1, 'maximum', 10 + i % 90)));

-- The tenants curve: one row per tenant the pgbench clients pick from (token of its user, and the
-- invoice_detail page of the tenant's own invoice).
CREATE TABLE scalebench.tenants (
    i      integer PRIMARY KEY,
    tenant text NOT NULL,
    token  text NOT NULL,
    page   jsonb NOT NULL
);
GRANT SELECT ON scalebench.tenants TO ctxguard_gateway;

COMMIT;
