-- ctxguard demo: two tenants (acme, globex), vendors and invoices, three page types, four tools.
-- Run as a superuser in a fresh database. Idempotent for the demo schema.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

CREATE EXTENSION IF NOT EXISTS ctxguard;

-- The role the gateway connects as: not a superuser, cannot bypass RLS, owns nothing.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ctxguard_gateway') THEN
        CREATE ROLE ctxguard_gateway LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE NOREPLICATION;
    END IF;
END $$;
GRANT CONNECT, TEMPORARY ON DATABASE :"DBNAME" TO ctxguard_gateway;

DROP SCHEMA IF EXISTS demo CASCADE;
CREATE SCHEMA demo;
GRANT USAGE ON SCHEMA demo TO ctxguard_gateway;

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

GRANT SELECT ON demo.vendors, demo.invoices TO ctxguard_gateway;
GRANT UPDATE (status) ON demo.invoices TO ctxguard_gateway;

-- Tenant isolation (forced RLS) and entity mappings used by set_context.
SELECT ctxguard.protect_table('demo.vendors', 'tenant_id', 'vendor', 'id');
SELECT ctxguard.protect_table('demo.invoices', 'tenant_id', 'invoice', 'id');

-- Tool handlers: plain SECURITY INVOKER functions; RLS scopes them to the context's tenant.
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

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA demo FROM PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA demo TO ctxguard_gateway;
-- The gateway records the tools it discovers on upstream MCP servers (they stay invisible until
-- the DBA gives them a policy).
GRANT EXECUTE ON FUNCTION ctxguard.sync_mcp_tools(text, jsonb) TO ctxguard_gateway;

SELECT ctxguard.register_page_type('vendor_table', NULL, 'The vendor table: a list of the tenant''s vendors.');
SELECT ctxguard.register_page_type('invoice_table', NULL, 'The invoice table: a filterable list of invoices with tabs (open, paid, overdue).');
SELECT ctxguard.register_page_type('invoice_detail', 'invoice', 'One invoice: its amount, status, dates and vendor.');

SELECT ctxguard.register_tool('vendor.list', 'List the vendors of the current company (name, country).',
    '{"type": "object", "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 100}}, "additionalProperties": false}',
    'demo.vendor_list(jsonb)', '{"page_types": ["vendor_table"]}');
SELECT ctxguard.register_tool('invoice.list', 'List invoices, optionally filtered by status (open, paid, overdue).',
    '{"type": "object", "properties": {"status": {"enum": ["open", "paid", "overdue"]}, "limit": {"type": "integer", "minimum": 1, "maximum": 100}}, "additionalProperties": false}',
    'demo.invoice_list(jsonb)', '{"page_types": ["invoice_table"]}');
SELECT ctxguard.register_tool('invoice.get', 'Get the invoice on this page: number, amount, status, dates and vendor.',
    '{"type": "object", "properties": {"invoice_id": {"type": "string", "maxLength": 128}}, "required": ["invoice_id"], "additionalProperties": false}',
    'demo.invoice_get(jsonb)', '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id"}');
SELECT ctxguard.register_tool('invoice.mark_paid', 'Mark the invoice on this page as paid (needs the user''s approval).',
    '{"type": "object", "properties": {"invoice_id": {"type": "string", "maxLength": 128}}, "required": ["invoice_id"], "additionalProperties": false}',
    'demo.invoice_mark_paid(jsonb)',
    '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "roles": ["ap_clerk"],
      "read_only": false, "danger": "moderate", "requires_approval": true}');
