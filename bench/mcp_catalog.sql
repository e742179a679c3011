-- A 200-tool catalog across 10 namespaces for bench/mcp_tokens.sh, on top of the demo schema.
-- Each namespace has its own page types; one tool per namespace is global (every page), as
-- search/help tools tend to be. Handlers are never called (the benchmark only lists tools).
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
DO $$
DECLARE
    ns text;
    verbs text[] := ARRAY['search', 'get', 'list', 'create', 'update', 'archive', 'export', 'summarize',
                          'assign', 'comment', 'tag', 'merge', 'link', 'notify', 'schedule', 'approve',
                          'reject', 'count', 'compare', 'history'];
    i int;
    page text;
BEGIN
    FOREACH ns IN ARRAY ARRAY['crm', 'hr', 'billing', 'inventory', 'support', 'analytics', 'legal', 'marketing', 'shipping', 'admin'] LOOP
        PERFORM ctxguard.register_page_type(ns || '_list', NULL, format('The %s list page.', ns));
        PERFORM ctxguard.register_page_type(ns || '_detail', ns || '_record', format('One %s record.', ns));
        FOR i IN 1..20 LOOP
            page := CASE WHEN i = 1 THEN '*' WHEN i % 2 = 0 THEN ns || '_list' ELSE ns || '_detail' END;
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
                CASE WHEN page = '*' THEN '{"page_types": ["*"]}'::jsonb
                     WHEN page LIKE '%_detail' THEN jsonb_build_object('page_types', jsonb_build_array(page), 'entity_type', ns || '_record')
                     ELSE jsonb_build_object('page_types', jsonb_build_array(page)) END
                || '{"run_as": "ctxguard_tools"}'::jsonb);
        END LOOP;
    END LOOP;
END $$;
