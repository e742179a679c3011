-- ctxguard benchmark fixture. Run as a superuser in a database freshly loaded with
-- sql/demo/schema.sql (bench/gate_bench.sh does both). Idempotent for the bench objects.
--
-- 1. A realistic catalog: 1,000 extra tools (on top of the demo catalog): 900 in 6 namespaced
--    domains (crm, hr, support, sales, it, projects) with their own list/detail page types, 94
--    finance/procurement/ops tools on the demo page types (24 on invoice_detail, the benchmarked
--    page) and 6 global ("*") help/me tools. All use the trivial demo.vendor_list(jsonb) handler:
--    only the demo tool invoice.get is ever called by the benchmark.
-- 2. The BASELINE: the classic app-side design. The app sets a plain custom GUC
--    (app.tenant_id) and calls a handler directly; RLS on copies of the demo tables reads it.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

BEGIN;

-- ---------------------------------------------------------------------------------------------
-- 1a. Extra page types: one list page and one detail page per domain.
-- ---------------------------------------------------------------------------------------------
CREATE TEMP TABLE bench_domains (ns text, entity text, plural text, label text) ON COMMIT DROP;
INSERT INTO bench_domains VALUES
    ('crm',      'customer', 'customers', 'customer account'),
    ('hr',       'employee', 'employees', 'employee record'),
    ('support',  'ticket',   'tickets',   'support ticket'),
    ('sales',    'order',    'orders',    'sales order'),
    ('it',       'asset',    'assets',    'IT asset'),
    ('projects', 'project',  'projects',  'project');

SELECT ctxguard.register_page_type(d.entity || '_table', NULL,
           format('The %s table: a filterable list of the tenant''s %s.', d.entity, d.plural)),
       ctxguard.register_page_type(d.entity || '_detail', d.entity,
           format('One %s: its fields, related records and activity.', d.label))
  FROM bench_domains d;

-- ---------------------------------------------------------------------------------------------
-- 1b. 1,000 tools.
-- ---------------------------------------------------------------------------------------------
-- Sub-topics every record has, and the verbs offered on list and detail pages.
CREATE TEMP TABLE bench_topics (topic text, words text) ON COMMIT DROP;
INSERT INTO bench_topics VALUES
    ('notes', 'internal notes'), ('attachments', 'attached files'), ('history', 'change history'),
    ('contacts', 'linked contacts'), ('tags', 'tags'), ('tasks', 'open tasks'),
    ('comments', 'comments'), ('documents', 'documents'), ('activities', 'logged activities'),
    ('reminders', 'reminders'), ('approvals', 'approval requests'), ('metrics', 'key metrics'),
    ('alerts', 'alerts'), ('links', 'related links'), ('audit_events', 'audit events');

CREATE TEMP TABLE bench_list_verbs (verb text, template text) ON COMMIT DROP;
INSERT INTO bench_list_verbs VALUES
    ('list',      'List the %s of all %s, newest first, with paging.'),
    ('search',    'Search the %s of all %s by keyword.'),
    ('export',    'Export the %s of the %s shown in the table as CSV.'),
    ('count',     'Count the %s of the %s, grouped by status.'),
    ('summarize', 'Summarize the %s of the %s for the selected period.');

-- Detail-page verbs: the entity id is bound from the page by Gate B (entity_param).
CREATE TEMP TABLE bench_detail_verbs (verb text, template text, read_only boolean, danger text, approval boolean)
    ON COMMIT DROP;
INSERT INTO bench_detail_verbs VALUES
    ('get',    'Show the %s of the %s on this page.',                       true,  'safe',     false),
    ('list',   'List the %s of the %s on this page, newest first.',         true,  'safe',     false),
    ('add',    'Add an entry to the %s of the %s on this page.',             false, 'moderate', false),
    ('update', 'Update an entry in the %s of the %s on this page.',          false, 'moderate', false),
    ('remove', 'Remove an entry from the %s of the %s on this page (needs approval).', false, 'moderate', true);

CREATE TEMP TABLE bench_tools (name text, description text, input_schema jsonb, policy jsonb) ON COMMIT DROP;

-- 6 domains x 15 topics x 5 verbs = 450 list-page tools, e.g. crm.customer_notes.search.
INSERT INTO bench_tools
SELECT format('%s.%s_%s.%s', d.ns, d.entity, t.topic, v.verb),
       format(v.template, t.words, d.plural),
       '{"type": "object", "properties": {"query": {"type": "string", "maxLength": 200},
         "status": {"type": "string", "maxLength": 32},
         "limit": {"type": "integer", "minimum": 1, "maximum": 100}}, "additionalProperties": false}',
       jsonb_build_object('page_types', jsonb_build_array(d.entity || '_table'))
  FROM bench_domains d, bench_topics t, bench_list_verbs v;

-- 6 domains x 15 topics x 5 verbs = 450 detail-page tools, e.g. crm.customer.notes.add.
INSERT INTO bench_tools
SELECT format('%s.%s.%s.%s', d.ns, d.entity, t.topic, v.verb),
       format(v.template, t.words, d.label),
       jsonb_build_object('type', 'object', 'additionalProperties', false,
           'required', jsonb_build_array(d.entity || '_id'),
           'properties', jsonb_build_object(d.entity || '_id', '{"type": "string", "maxLength": 128}'::jsonb)
               || CASE WHEN v.read_only THEN '{"limit": {"type": "integer", "minimum": 1, "maximum": 100}}'::jsonb
                       ELSE '{"item_id": {"type": "string", "maxLength": 128}, "text": {"type": "string", "maxLength": 2000}}'::jsonb END),
       jsonb_build_object('page_types', jsonb_build_array(d.entity || '_detail'), 'entity_type', d.entity,
           'entity_param', d.entity || '_id', 'read_only', v.read_only, 'danger', v.danger,
           'requires_approval', v.approval)
  FROM bench_domains d, bench_topics t, bench_detail_verbs v;

-- Finance, procurement and ops tools on the demo list pages: 6 x 5 + 2 x 5 on invoice_table,
-- 6 x 5 on vendor_table.
INSERT INTO bench_tools
SELECT format('%s%s.%s', x.prefix, x.topic, v.verb),
       format(v.template, x.words, x.noun),
       '{"type": "object", "properties": {"query": {"type": "string", "maxLength": 200},
         "limit": {"type": "integer", "minimum": 1, "maximum": 100}}, "additionalProperties": false}'::jsonb,
       jsonb_build_object('page_types', jsonb_build_array(x.page_type))
  FROM (VALUES ('finance.invoice_', 'invoices', 'invoice_table', 'payments', 'payments'),
               ('finance.invoice_', 'invoices', 'invoice_table', 'credit_notes', 'credit notes'),
               ('finance.invoice_', 'invoices', 'invoice_table', 'reminders', 'payment reminders'),
               ('finance.invoice_', 'invoices', 'invoice_table', 'disputes', 'disputes'),
               ('finance.invoice_', 'invoices', 'invoice_table', 'approvals', 'approval requests'),
               ('finance.invoice_', 'invoices', 'invoice_table', 'taxes', 'tax lines'),
               ('procurement.vendor_', 'vendors', 'vendor_table', 'contracts', 'contracts'),
               ('procurement.vendor_', 'vendors', 'vendor_table', 'bank_details', 'bank details'),
               ('procurement.vendor_', 'vendors', 'vendor_table', 'ratings', 'ratings'),
               ('procurement.vendor_', 'vendors', 'vendor_table', 'spend', 'spend'),
               ('procurement.vendor_', 'vendors', 'vendor_table', 'documents', 'documents'),
               ('procurement.vendor_', 'vendors', 'vendor_table', 'contacts', 'contacts'),
               ('ops.', 'invoices', 'invoice_table', 'invoice_imports', 'import batches'),
               ('ops.', 'invoices', 'invoice_table', 'payment_runs', 'payment runs'))
       AS x(prefix, noun, page_type, topic, words),
       bench_list_verbs v;

-- 6 x 4 = 24 tools on the demo invoice_detail page (the benchmarked page). The "approvals" ones
-- need the controller role, which the benchmark's user (ap_clerk) lacks: Gate A must hide them.
INSERT INTO bench_tools
SELECT format('finance.invoice.%s.%s', x.topic, v.verb),
       format(v.template, x.words, 'invoice'),
       jsonb_build_object('type', 'object', 'additionalProperties', false, 'required', '["invoice_id"]'::jsonb,
           'properties', '{"invoice_id": {"type": "string", "maxLength": 128}}'::jsonb
               || CASE WHEN v.read_only THEN '{"limit": {"type": "integer", "minimum": 1, "maximum": 100}}'::jsonb
                       ELSE '{"item_id": {"type": "string", "maxLength": 128}, "text": {"type": "string", "maxLength": 2000}}'::jsonb END),
       jsonb_build_object('page_types', '["invoice_detail"]'::jsonb, 'entity_type', 'invoice',
           'entity_param', 'invoice_id', 'read_only', v.read_only, 'danger', v.danger,
           'requires_approval', v.approval)
           || CASE WHEN x.topic = 'approvals' THEN '{"roles": ["controller"]}'::jsonb ELSE '{}'::jsonb END
  FROM (VALUES ('payments', 'payments'), ('notes', 'internal notes'), ('attachments', 'attached files'),
               ('reminders', 'payment reminders'), ('disputes', 'disputes'), ('approvals', 'approval requests')) AS x(topic, words),
       bench_detail_verbs v
 WHERE v.verb <> 'remove';

-- 6 global tools, visible on every page.
INSERT INTO bench_tools VALUES
    ('help.docs.search', 'Search the product documentation.',
     '{"type": "object", "properties": {"query": {"type": "string", "maxLength": 200}}, "required": ["query"], "additionalProperties": false}', '{"page_types": "*"}'),
    ('help.support.contact', 'Open a support request with the vendor of this software.',
     '{"type": "object", "properties": {"subject": {"type": "string", "maxLength": 200}, "text": {"type": "string", "maxLength": 2000}}, "required": ["subject"], "additionalProperties": false}',
     '{"page_types": "*", "read_only": false, "danger": "safe"}'),
    ('help.shortcuts.list', 'List the keyboard shortcuts of the current page.',
     '{"type": "object", "properties": {}, "additionalProperties": false}', '{"page_types": "*"}'),
    ('me.profile.get', 'Show the signed-in user''s profile.',
     '{"type": "object", "properties": {}, "additionalProperties": false}', '{"page_types": "*"}'),
    ('me.preferences.get', 'Show the signed-in user''s preferences (language, time zone).',
     '{"type": "object", "properties": {}, "additionalProperties": false}', '{"page_types": "*"}'),
    ('me.notifications.list', 'List the signed-in user''s unread notifications.',
     '{"type": "object", "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 50}}, "additionalProperties": false}', '{"page_types": "*"}');

DO $$
BEGIN
    IF (SELECT count(*) FROM bench_tools) <> 1000 THEN
        RAISE EXCEPTION 'bench: expected 1000 extra tools, built %', (SELECT count(*) FROM bench_tools);
    END IF;
END $$;

-- The handler runs as the demo tools' run_as role (the gateway role cannot execute it).
SELECT count(ctxguard.register_tool(name, description, input_schema, 'demo.vendor_list(jsonb)',
                                    policy || '{"run_as": "ctxguard_tools"}'))
  FROM bench_tools;

COMMIT;

-- ---------------------------------------------------------------------------------------------
-- 2. BASELINE: copies of the demo tables, tenant RLS on a plain custom GUC set by the app.
-- ---------------------------------------------------------------------------------------------
DROP SCHEMA IF EXISTS bench CASCADE;
CREATE SCHEMA bench;
GRANT USAGE ON SCHEMA bench TO ctxguard_gateway;

-- LIKE ... INCLUDING ALL copies the primary keys, the id indexes, defaults and checks.
CREATE TABLE bench.vendors (LIKE demo.vendors INCLUDING ALL);
CREATE TABLE bench.invoices (LIKE demo.invoices INCLUDING ALL,
    FOREIGN KEY (tenant_id, vendor_id) REFERENCES bench.vendors (tenant_id, id));
INSERT INTO bench.vendors SELECT * FROM demo.vendors;
INSERT INTO bench.invoices SELECT * FROM demo.invoices;
ANALYZE bench.vendors, bench.invoices;

ALTER TABLE bench.vendors ENABLE ROW LEVEL SECURITY;
ALTER TABLE bench.vendors FORCE ROW LEVEL SECURITY;
ALTER TABLE bench.invoices ENABLE ROW LEVEL SECURITY;
ALTER TABLE bench.invoices FORCE ROW LEVEL SECURITY;
CREATE POLICY app_tenant ON bench.vendors USING (tenant_id = current_setting('app.tenant_id', true));
CREATE POLICY app_tenant ON bench.invoices USING (tenant_id = current_setting('app.tenant_id', true));
GRANT SELECT ON bench.vendors, bench.invoices TO ctxguard_gateway;

-- The invoice's documents, as demo.invoice_get reads them (ctxguard.documents' columns and index),
-- under the baseline's RLS.
CREATE TABLE bench.documents (LIKE ctxguard.documents INCLUDING ALL);
INSERT INTO bench.documents SELECT * FROM ctxguard.documents;
ALTER TABLE bench.documents ENABLE ROW LEVEL SECURITY;
ALTER TABLE bench.documents FORCE ROW LEVEL SECURITY;
CREATE POLICY app_tenant ON bench.documents USING (tenant_id = current_setting('app.tenant_id', true));
GRANT SELECT ON bench.documents TO ctxguard_gateway;

-- The same body as demo.invoice_get (sql/demo/schema.sql), over the bench tables: the same work
-- minus what is measured (gate_bench.sh checks that both return the same JSON).
CREATE FUNCTION bench.invoice_get(args jsonb) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT jsonb_build_object('id', i.id, 'number', i.number, 'amount', i.amount, 'currency', i.currency,
                                              'status', i.status, 'issued_on', i.issued_on, 'due_on', i.due_on,
                                              'vendor', jsonb_build_object('id', v.id, 'name', v.name, 'country', v.country),
                                              'documents', (SELECT coalesce(jsonb_agg(jsonb_build_object('doc_id', d.id, 'title', d.title, 'status', d.status)
                                                                                      ORDER BY d.title), '[]')
                                                              FROM bench.documents d
                                                             WHERE d.entity_type = 'invoice' AND d.entity_id = i.id))
                       FROM bench.invoices i JOIN bench.vendors v ON v.tenant_id = i.tenant_id AND v.id = i.vendor_id
                      WHERE i.id = args->>'invoice_id'),
                    jsonb_build_object('found', false))
$$;
REVOKE EXECUTE ON FUNCTION bench.invoice_get(jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION bench.invoice_get(jsonb) TO ctxguard_gateway;

ANALYZE demo.vendors, demo.invoices, bench.vendors, bench.invoices, bench.documents, ctxguard.documents, ctxguard.tools, ctxguard.tool_policies, ctxguard.page_types;

-- 3. The CAREFUL BASELINE (issue 13): the same, plus the audit row a careful app writes for each
--    call in its own transaction (and so a WAL flush at its COMMIT).
CREATE TABLE bench.audit (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    tenant_id text NOT NULL,
    tool      text NOT NULL,
    args_hash text NOT NULL,
    result_bytes integer NOT NULL
);
GRANT INSERT ON bench.audit TO ctxguard_gateway;

-- 4. The bench measures the gates, not the daily byte limit. One run reads about 60 MB as alice
--    (some 200,000 calls of 303 bytes): close to ctxguard.max_bytes_per_user_day's 64 MiB, so a
--    faster machine (or a second run within the same UTC day on one database) would measure
--    refusals (RATE_LIMIT_EXCEEDED, which skip the handler). acme's limit is raised to the most.
INSERT INTO ctxguard.tenant_limits (tenant_id, max_bytes_per_user_day) VALUES ('acme', 2147483647)
ON CONFLICT (tenant_id) DO UPDATE SET max_bytes_per_user_day = EXCLUDED.max_bytes_per_user_day;

-- 5. Policies that look at the call (issue 30): invoice.get again, with one condition (`when`, a
--    STABLE function reading the bound invoice's row, run as the tool's run_as role) and one quota
--    (`rate_limit`, counted in the shared-memory ledger; large enough never to refuse here).
--    bench/ctxguard_conditions.sql calls it; gate_bench.sh reports the difference per call.
CREATE FUNCTION bench.invoice_exists(args jsonb) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM demo.invoices i WHERE i.id = args->>'invoice_id')
$$;
ALTER FUNCTION bench.invoice_exists(jsonb) OWNER TO ctxguard_tools;
GRANT USAGE ON SCHEMA bench TO ctxguard_tools;
SELECT ctxguard.register_tool('invoice.get_checked', 'Get the invoice on this page (with a condition and a quota).',
    '{"type": "object", "properties": {"invoice_id": {"type": "string", "maxLength": 128}}, "required": ["invoice_id"], "additionalProperties": false}',
    'demo.invoice_get(jsonb)',
    '{"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "run_as": "ctxguard_tools",
      "when": "bench.invoice_exists", "rate_limit": {"per": "user", "calls": 1000000, "window": "1d"}}');

-- 6. Issue 30's aim measured in one run (gate_bench.sh, bench/ctxguard_interleaved.sql): each
--    transaction calls invoice.get or invoice.get_checked at random, and the call is timed inside
--    the database (clock_timestamp() around call_tool), so both calls meet the same moments of the
--    machine (its fsync latency, the CPU the hypervisor takes) and their medians compare.
CREATE UNLOGGED TABLE bench.call_ms (tool text NOT NULL, ms float8 NOT NULL, status text);
CREATE FUNCTION bench.timed_call(tool text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    r  jsonb;
BEGIN
    t0 := pg_catalog.clock_timestamp();
    r := ctxguard.call_tool(tool, '{}');
    INSERT INTO bench.call_ms VALUES (tool, extract(epoch FROM pg_catalog.clock_timestamp() - t0) * 1000, r->>'status');
    RETURN r->>'status';
END
$$;
GRANT INSERT ON bench.call_ms TO ctxguard_gateway;
GRANT EXECUTE ON FUNCTION bench.timed_call(text) TO ctxguard_gateway;
