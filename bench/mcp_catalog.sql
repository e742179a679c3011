-- A 200-tool catalog across 10 namespaces for bench/mcp_tokens.sh, on top of the demo schema, on the
-- pages the benchmark visits: in each namespace one tool is global (every page), as search/help
-- tools tend to be, and the other 19 are spread over the five demo page types. So every synthetic
-- tool appears on some visited page and each page lists 40 or 50 of them besides its demo tools;
-- the benchmark measures what page filtering saves on a catalog the pages actually use. Handlers
-- are never called (the benchmark only lists tools).
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
DO $$
DECLARE
    ns text;
    verbs text[] := ARRAY['search', 'get', 'list', 'create', 'update', 'archive', 'export', 'summarize',
                          'assign', 'comment', 'tag', 'merge', 'link', 'notify', 'schedule', 'approve',
                          'reject', 'count', 'compare', 'history'];
    pages text[] := ARRAY['vendor_table', 'invoice_table', 'invoice_detail', 'document_viewer', 'matter_overview'];
    i int;
    page text;
BEGIN
    FOREACH ns IN ARRAY ARRAY['crm', 'hr', 'billing', 'inventory', 'support', 'analytics', 'legal', 'marketing', 'shipping', 'admin'] LOOP
        FOR i IN 1..20 LOOP
            page := CASE WHEN i = 1 THEN '*' ELSE pages[1 + i % 5] END;
            PERFORM ctxguard.register_tool(
                format('%s.%s_%s', ns, verbs[i], CASE WHEN i % 2 = 0 THEN 'records' ELSE 'record' END),
                format('%s %s records in the %s module. Returns matching %s records with their id, title, owner, status, '
                       'timestamps and a short summary; respects the caller''s permissions and the current filters.',
                       initcap(verbs[i]), CASE WHEN i % 2 = 0 THEN 'many' ELSE 'one of the' END, ns, ns),
                jsonb_build_object('type', 'object', 'additionalProperties', false, 'properties', jsonb_build_object(
                    'query', jsonb_build_object('type', 'string', 'description', 'Free-text filter.', 'maxLength', 200),
                    'status', jsonb_build_object('enum', jsonb_build_array('open', 'closed', 'all'), 'description', 'Status filter.'),
                    'limit', jsonb_build_object('type', 'integer', 'minimum', 1, 'maximum', 100, 'description', 'Most results.'),
                    'fields', jsonb_build_object('type', 'array', 'items', jsonb_build_object('type', 'string'), 'description', 'Fields to return.'))),
                'demo.vendor_list(jsonb)',
                jsonb_build_object('page_types', jsonb_build_array(page), 'run_as', 'ctxguard_tools'));
        END LOOP;
    END LOOP;
END $$;
