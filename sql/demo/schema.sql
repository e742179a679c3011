-- ctxguard demo: two tenants (acme, globex), vendors and invoices, three page types, four tools.
-- Run as a superuser in a fresh database. Idempotent for the demo schema.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE EXTENSION IF NOT EXISTS ctxguard;

-- Roles (cluster-wide; created once, their attributes re-asserted on every load):
--   ctxguard_gateway    LOGIN: runs the model's calls. EXECUTE on ctxguard's API and nothing else: no
--                       table privileges, no EXECUTE on tool handlers or demo functions.
--   ctxguard_tools      NOLOGIN: the run_as role of every demo tool. Tool handlers run as this role
--                       (like SECURITY DEFINER), so it holds the table privileges the handlers need.
--                       RLS still scopes it to the context's tenant. Owns nothing.
--   ctxguard_discovery  LOGIN: records the tools of upstream MCP servers (EXECUTE on
--                       ctxguard.sync_mcp_tools only). The gateway's CTXGUARD_DISCOVERY_DATABASE_URL.
--   ctxguard_app        LOGIN: the demo app's human screens (demo.page_data and what it reads). The
--                       gateway's CTXGUARD_DEMO_DATABASE_URL in demo mode.
--   ctxguard_gateways   NOLOGIN: the group of the gateways' login roles, holding their grants. One
--                       login role per gateway instance, each a member (docs/deploy.md): a role can
--                       cancel or terminate its own role's backends, so no gateway can end another's.
--   ctxguard_gateway_b  LOGIN: a second gateway instance's role (ctxguard_gateway is the first's).
--   ctxguard_policies   NOLOGIN: owns the demo's policy conditions (`approval_when`). ctxguard refuses
--                       a condition owned by a superuser or by its own owner (it could bypass RLS).
-- None is a superuser, none bypasses RLS, none creates databases or roles.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT * FROM (VALUES ('ctxguard_gateway', true), ('ctxguard_tools', false),
                                   ('ctxguard_discovery', true), ('ctxguard_app', true),
                                   ('ctxguard_gateways', false), ('ctxguard_gateway_b', true),
                                   ('ctxguard_policies', false)) AS v(name, login) LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r.name) THEN
            EXECUTE format('CREATE ROLE %I', r.name);
        END IF;
        EXECUTE format('ALTER ROLE %I %s NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION',
                       r.name, CASE WHEN r.login THEN 'LOGIN' ELSE 'NOLOGIN' END);
    END LOOP;
END $$;
GRANT CONNECT, TEMPORARY ON DATABASE :"DBNAME" TO ctxguard_gateway;
-- One login role per gateway instance, members of the group that holds the grants (ctxguard's API is
-- EXECUTE to PUBLIC; the group holds CONNECT, and would hold EXECUTE where PUBLIC's is revoked).
GRANT CONNECT ON DATABASE :"DBNAME" TO ctxguard_gateways;
GRANT ctxguard_gateways TO ctxguard_gateway, ctxguard_gateway_b;
GRANT CONNECT ON DATABASE :"DBNAME" TO ctxguard_discovery, ctxguard_app;

DROP SCHEMA IF EXISTS demo CASCADE;
CREATE SCHEMA demo;
-- The gateway role gets nothing in this schema, not even USAGE.
GRANT USAGE ON SCHEMA demo TO ctxguard_tools, ctxguard_app;

CREATE TABLE demo.vendors (
    tenant_id text NOT NULL,
    id        text NOT NULL,
    name      text NOT NULL,
    country   text NOT NULL,
    email     text NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE TABLE demo.invoices (
    tenant_id text NOT NULL,
    id        text NOT NULL,
    vendor_id text NOT NULL,
    number    text NOT NULL,
    amount    numeric(12, 2) NOT NULL,
    currency  text NOT NULL DEFAULT 'EUR',
    status    text NOT NULL CHECK (status IN ('open', 'paid', 'overdue')),
    issued_on date NOT NULL,
    due_on    date NOT NULL,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, vendor_id) REFERENCES demo.vendors (tenant_id, id)
);
CREATE INDEX invoices_id_idx ON demo.invoices (id);
CREATE INDEX vendors_id_idx ON demo.vendors (id);

INSERT INTO demo.vendors (tenant_id, id, name, country, email)
SELECT t.tenant, t.prefix || '_v' || g, t.names[g], t.countries[1 + g % 3], 'billing' || g || '@' || lower(replace(t.names[g], ' ', '')) || '.example'
  FROM (VALUES ('acme', 'acme', ARRAY['Northwind Traders', 'Contoso Paper', 'Fabrikam Steel', 'Tailspin Freight', 'Wingtip Office'], ARRAY['DE', 'FR', 'NL']),
               ('globex', 'glx', ARRAY['Initech Supplies', 'Umbrella Logistics', 'Hooli Cloud', 'Soylent Catering', 'Stark Tools'], ARRAY['US', 'CA', 'MX']))
       AS t(tenant, prefix, names, countries),
       generate_series(1, 5) AS g;

INSERT INTO demo.invoices (tenant_id, id, vendor_id, number, amount, status, issued_on, due_on)
SELECT v.tenant, v.prefix || '_inv' || g, v.prefix || '_v' || (1 + g % 5), upper(v.prefix) || '-2026-' || lpad(g::text, 4, '0'),
       round((120 + (g * 379) % 9000)::numeric, 2),
       (ARRAY['open', 'paid', 'overdue'])[1 + g % 3],
       DATE '2026-09-01' + g, DATE '2026-10-01' + g
  FROM (VALUES ('acme', 'acme'), ('globex', 'glx')) AS v(tenant, prefix), generate_series(1, 12) AS g;

-- What the tool handlers need, held by their run_as role; what the screens read, by the app's role.
GRANT SELECT ON demo.vendors, demo.invoices TO ctxguard_tools, ctxguard_app;
GRANT UPDATE (status) ON demo.invoices TO ctxguard_tools;

-- Tenant isolation (forced RLS) and entity mappings used by set_context.
SELECT ctxguard.protect_table('demo.vendors', 'tenant_id', 'vendor', 'id');
SELECT ctxguard.protect_table('demo.invoices', 'tenant_id', 'invoice', 'id');

-- Tool handlers: plain SECURITY INVOKER functions. ctxguard runs them as the tool's run_as role
-- (ctxguard_tools), with search_path = pg_catalog, pg_temp (so every name here is qualified), and RLS
-- scopes them to the context's tenant.
CREATE FUNCTION demo.vendor_list(args jsonb) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('vendors', coalesce(jsonb_agg(jsonb_build_object('id', id, 'name', name, 'country', country) ORDER BY name), '[]'),
                              'count', count(*))
      FROM (SELECT * FROM demo.vendors ORDER BY name LIMIT coalesce((args->>'limit')::int, 50)) v
$$;

CREATE FUNCTION demo.invoice_list(args jsonb) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('invoices', coalesce(jsonb_agg(jsonb_build_object('id', i.id, 'number', i.number, 'vendor', v.name,
                                  'amount', i.amount, 'currency', i.currency, 'status', i.status, 'due_on', i.due_on) ORDER BY i.due_on), '[]'),
                              'count', count(*))
      FROM (SELECT * FROM demo.invoices
             WHERE (args->>'status' IS NULL OR status = args->>'status')
             ORDER BY due_on LIMIT coalesce((args->>'limit')::int, 50)) i
      JOIN demo.vendors v ON v.tenant_id = i.tenant_id AND v.id = i.vendor_id
$$;

CREATE FUNCTION demo.invoice_get(args jsonb) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT jsonb_build_object('id', i.id, 'number', i.number, 'amount', i.amount, 'currency', i.currency,
                                              'status', i.status, 'issued_on', i.issued_on, 'due_on', i.due_on,
                                              'vendor', jsonb_build_object('id', v.id, 'name', v.name, 'country', v.country),
                                              'documents', (SELECT coalesce(jsonb_agg(jsonb_build_object('doc_id', d.id, 'title', d.title, 'status', d.status)
                                                                                      ORDER BY d.title), '[]')
                                                              FROM ctxguard.documents d
                                                             WHERE d.entity_type = 'invoice' AND d.entity_id = i.id))
                       FROM demo.invoices i JOIN demo.vendors v ON v.tenant_id = i.tenant_id AND v.id = i.vendor_id
                      WHERE i.id = args->>'invoice_id'),
                    jsonb_build_object('found', false))
$$;

CREATE FUNCTION demo.invoice_mark_paid(args jsonb) RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE n int;
BEGIN
    UPDATE demo.invoices SET status = 'paid' WHERE id = args->>'invoice_id' AND status <> 'paid';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN jsonb_build_object('invoice_id', args->>'invoice_id', 'updated', n);
END $$;

-- The policy condition of invoice.mark_paid (`approval_when`): above 1,000 a manager approves first.
-- Gate B runs it after binding, as the tool's run_as role, read-only, on the bound arguments: it
-- reads the bound invoice's own row (RLS scopes it to the context's tenant). No row: approval.
CREATE FUNCTION demo.mark_paid_needs_approval(args jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT i.amount OPERATOR(pg_catalog.>) 1000 FROM demo.invoices i
                      WHERE i.id OPERATOR(pg_catalog.=) (args OPERATOR(pg_catalog.->>) 'invoice_id')), true)
$$;
ALTER FUNCTION demo.mark_paid_needs_approval(jsonb) OWNER TO ctxguard_policies;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA demo FROM PUBLIC;
GRANT EXECUTE ON FUNCTION demo.vendor_list(jsonb), demo.invoice_list(jsonb), demo.invoice_get(jsonb),
                          demo.invoice_mark_paid(jsonb), demo.mark_paid_needs_approval(jsonb) TO ctxguard_tools;
-- Discovery of upstream MCP tools runs under its own role, never the one that runs model calls
-- (the REVOKE undoes the 0.1 demo's grant when this script is loaded into an older database).
REVOKE EXECUTE ON FUNCTION ctxguard.sync_mcp_tools(text, jsonb) FROM ctxguard_gateway;
GRANT EXECUTE ON FUNCTION ctxguard.sync_mcp_tools(text, jsonb) TO ctxguard_discovery;

SELECT ctxguard.register_page_type('vendor_table', NULL, 'The vendor table: a list of the tenant''s vendors.');
SELECT ctxguard.register_page_type('invoice_table', NULL, 'The invoice table: a filterable list of invoices with tabs (open, paid, overdue).');
SELECT ctxguard.register_page_type('invoice_detail', 'invoice', 'One invoice: its amount, status, dates and vendor.');

SELECT ctxguard.register_tool('vendor.list', 'List the vendors of the current company (name, country).',
    '{"type": "object", "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 100}}, "additionalProperties": false}',
    'demo.vendor_list(jsonb)', '{"page_types": ["vendor_table"], "run_as": "ctxguard_tools"}');
SELECT ctxguard.register_tool('invoice.list', 'List invoices, optionally filtered by status (open, paid, overdue).',
    '{"type": "object", "properties": {"status": {"enum": ["open", "paid", "overdue"]}, "limit": {"type": "integer", "minimum": 1, "maximum": 100}}, "additionalProperties": false}',
    'demo.invoice_list(jsonb)', '{"page_types": ["invoice_table"], "run_as": "ctxguard_tools"}');
SELECT ctxguard.register_tool('invoice.get', 'Get the invoice on this page: number, amount, status, dates and vendor.',
    '{"type": "object", "properties": {"invoice_id": {"type": "string", "maxLength": 128}}, "required": ["invoice_id"], "additionalProperties": false}',
    'demo.invoice_get(jsonb)', '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "run_as": "ctxguard_tools"}');
-- Four eyes: above 1,000 (demo.mark_paid_needs_approval) a user holding ap_manager, never the clerk
-- who asked, approves or rejects the call; the clerk then runs it once, from the invoice's page.
SELECT ctxguard.register_tool('invoice.mark_paid', 'Mark the invoice on this page as paid (above 1,000 a manager approves first).',
    '{"type": "object", "properties": {"invoice_id": {"type": "string", "maxLength": 128}}, "required": ["invoice_id"], "additionalProperties": false}',
    'demo.invoice_mark_paid(jsonb)',
    '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "roles": ["ap_clerk"],
      "read_only": false, "danger": "moderate", "run_as": "ctxguard_tools",
      "approval_when": "demo.mark_paid_needs_approval", "approver_roles": ["ap_manager"]}');
