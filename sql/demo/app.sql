-- ctxguard demo app: the read API behind the screens the gateway serves in demo mode.
-- Loaded by a superuser after schema.sql and documents.sql.
--
-- The app reads its screens under the same context as the assistant: the gateway calls
-- `demo.page_data()` right after `ctxguard.set_context(token, page)`, so the data a screen shows is
-- the data of the page context the chat panel sends, scoped by row-level security to the token's
-- tenant. A page of another tenant's record never gets this far: set_context refuses it.
--
-- These functions are for the human screens only: they run as the app's own role, ctxguard_app
-- (the gateway's CTXGUARD_DEMO_DATABASE_URL), never as the role that runs the model's calls. The
-- viewer shows raw page text (no masking, budget or audit), which the model must never reach.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

-- Page text is granted to no role (only the document tools read it, under budgets, masking and
-- audit). The human viewer reads it through this one definer function, executable by ctxguard_app
-- only, and only for the document the context is on: it shows what the user may see, unmasked.
CREATE FUNCTION demo.viewer_page(page_no integer) RETURNS jsonb
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object('page', p.page_no, 'text', p.body)
      FROM ctxguard.document_pages p
     WHERE ctxguard.page_type() = 'document_viewer'
       AND p.tenant_id = ctxguard.tenant_id()
       AND p.doc_id = ctxguard.entity_id()
       AND p.page_no = viewer_page.page_no
$$;

CREATE FUNCTION demo.document_list(kind text, id text) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('id', d.id, 'title', d.title, 'status', d.status, 'pages', d.page_count,
                                                 'entityType', d.entity_type, 'entityId', d.entity_id) ORDER BY d.title), '[]')
      FROM ctxguard.documents d
     WHERE (document_list.kind IS NULL OR (d.entity_type = document_list.kind AND d.entity_id = document_list.id))
$$;

CREATE FUNCTION demo.page_data() RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    ctx    jsonb := ctxguard.context();
    state  jsonb := coalesce(ctx->'pageState', '{}');
    entity text  := ctx#>>'{entity,id}';
    tab    text;
    vendor text;
    n      integer;
    out    jsonb;
BEGIN
    IF ctx IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '28000', MESSAGE = 'ctxguard: no context is set';
    END IF;
    CASE ctx->>'pageType'
    WHEN 'vendor_table' THEN
        SELECT jsonb_build_object('vendors', coalesce(jsonb_agg(jsonb_build_object(
                   'id', v.id, 'name', v.name, 'country', v.country, 'email', v.email,
                   'unpaid', (SELECT count(*) FROM demo.invoices i WHERE i.tenant_id = v.tenant_id AND i.vendor_id = v.id AND i.status <> 'paid'))
                   ORDER BY v.name), '[]'))
          INTO out FROM demo.vendors v;
    WHEN 'invoice_table' THEN
        tab := coalesce(nullif(state->>'tab', ''), 'all');
        vendor := nullif(state#>>'{filters,vendor}', '');
        IF tab NOT IN ('all', 'open', 'paid', 'overdue') THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: unknown invoice tab';
        END IF;
        SELECT jsonb_build_object(
                   'tab', tab, 'vendor', vendor,
                   'invoices', coalesce(jsonb_agg(jsonb_build_object('id', i.id, 'number', i.number, 'vendor', v.name, 'vendorId', v.id,
                                       'amount', i.amount, 'currency', i.currency, 'status', i.status, 'dueOn', i.due_on)
                                       ORDER BY i.due_on) FILTER (WHERE (tab = 'all' OR i.status = tab) AND (vendor IS NULL OR i.vendor_id = vendor)), '[]'),
                   'tabs', jsonb_build_object(
                       'all', count(*) FILTER (WHERE vendor IS NULL OR i.vendor_id = vendor),
                       'open', count(*) FILTER (WHERE i.status = 'open' AND (vendor IS NULL OR i.vendor_id = vendor)),
                       'paid', count(*) FILTER (WHERE i.status = 'paid' AND (vendor IS NULL OR i.vendor_id = vendor)),
                       'overdue', count(*) FILTER (WHERE i.status = 'overdue' AND (vendor IS NULL OR i.vendor_id = vendor))),
                   'vendors', (SELECT coalesce(jsonb_agg(jsonb_build_object('id', id, 'name', name) ORDER BY name), '[]') FROM demo.vendors))
          INTO out
          FROM demo.invoices i JOIN demo.vendors v ON v.tenant_id = i.tenant_id AND v.id = i.vendor_id;
    WHEN 'invoice_detail' THEN
        out := jsonb_build_object('invoice', demo.invoice_get(jsonb_build_object('invoice_id', entity)));
    WHEN 'document_viewer' THEN
        SELECT jsonb_build_object('document', jsonb_build_object('id', d.id, 'title', d.title, 'status', d.status, 'pages', d.page_count,
                                                                 'entityType', d.entity_type, 'entityId', d.entity_id))
          INTO out FROM ctxguard.documents d WHERE d.id = entity;
        IF coalesce(state#>>'{filters,page}', '1') !~ '^[0-9]{1,6}$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: the viewer page must be a page number';
        END IF;
        n := greatest(1, least(coalesce((state#>>'{filters,page}')::integer, 1), (out#>>'{document,pages}')::integer));
        out := out || jsonb_build_object('page', demo.viewer_page(n));
    WHEN 'matter_overview' THEN
        SELECT jsonb_build_object('matter', jsonb_build_object('id', m.id, 'name', m.name), 'documents', demo.document_list('matter', entity))
          INTO out FROM demo.matters m WHERE m.id::text = entity;
    WHEN 'document_library' THEN
        SELECT jsonb_build_object('documents', demo.document_list(NULL, NULL),
                                  'matters', coalesce(jsonb_agg(jsonb_build_object('id', m.id, 'name', m.name) ORDER BY m.name), '[]'))
          INTO out FROM demo.matters m;
    ELSE
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: the demo app has no screen for this page type';
    END CASE;
    RETURN out;
END
$$;

REVOKE EXECUTE ON FUNCTION demo.viewer_page(integer), demo.document_list(text, text), demo.page_data() FROM PUBLIC;
-- The screens' role: these three, and demo.invoice_get, which the invoice screen shares with the
-- invoice.get tool (its table privileges are granted in schema.sql and documents.sql).
GRANT EXECUTE ON FUNCTION demo.viewer_page(integer), demo.document_list(text, text), demo.page_data(),
                          demo.invoice_get(jsonb) TO ctxguard_app;
