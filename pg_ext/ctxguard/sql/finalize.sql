-- Wrappers, RLS on bookkeeping tables, and privileges. Runs after all Rust functions exist.

-- Gate A's list, filled in one call from the backend's kept answer (issue 34): the definition
-- 0.2.0's upgrade script makes.
CREATE FUNCTION ctxguard."visible_tools"(
	"query" TEXT DEFAULT NULL,
	"top_k" INT DEFAULT NULL
) RETURNS TABLE (
	"name" TEXT,
	"description" TEXT,
	"input_schema" jsonb,
	"read_only" bool,
	"danger" TEXT,
	"requires_approval" bool,
	"server" TEXT,
	"namespace" TEXT
)
STABLE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'visible_tools_wrapper';

-- The page, a call's arguments and upstream results reach Rust as text: their size is checked
-- before they are parsed, with a depth bound, so a document too large or too deep is a clean
-- refusal (22023 for a page, an audited INVALID_ARGUMENT for arguments and results)
-- instead of an internal error. The three are C functions that take the jsonb themselves (as its
-- text): a SQL wrapper is inlined by the planner in each client statement that calls it, its body
-- read from the catalog and folded every time (issue 34).
CREATE FUNCTION ctxguard.call_tool(name text, args jsonb DEFAULT '{}'::pg_catalog.jsonb) RETURNS jsonb
    LANGUAGE c VOLATILE PARALLEL UNSAFE
    AS 'MODULE_PATHNAME', 'call_tool_jsonb_wrapper';

CREATE FUNCTION ctxguard.set_context(token text, page jsonb, generation uuid DEFAULT NULL, trace_id text DEFAULT NULL)
    RETURNS jsonb LANGUAGE c VOLATILE PARALLEL UNSAFE
    AS 'MODULE_PATHNAME', 'set_context_wrapper';
COMMENT ON FUNCTION ctxguard.set_context(text, jsonb, uuid, text) IS 'Verify the token, validate the page, and make them this transaction''s context.';

CREATE FUNCTION ctxguard.complete_call(call_id uuid, result jsonb, is_error boolean DEFAULT false)
    RETURNS jsonb LANGUAGE c VOLATILE PARALLEL UNSAFE
    AS 'MODULE_PATHNAME', 'complete_call_wrapper';
COMMENT ON FUNCTION ctxguard.complete_call(uuid, jsonb, boolean) IS 'Mask, budget and audit the result of an upstream call authorized by call_tool (once).';
COMMENT ON FUNCTION ctxguard.call_tool(text, jsonb) IS 'Gate B: re-check policy, bind the entity, validate, run the handler, audit.';

CREATE FUNCTION ctxguard.explain_call(tool text, args jsonb DEFAULT '{}'::pg_catalog.jsonb) RETURNS jsonb
    LANGUAGE sql VOLATILE PARALLEL UNSAFE
    RETURN ctxguard._explain_call(tool, args::pg_catalog.text);
COMMENT ON FUNCTION ctxguard.explain_call(text, jsonb) IS 'Dry run of Gate B under the current context: the decision, its code and rule; runs and charges nothing; audited as dry_run.';

CREATE FUNCTION ctxguard.register_tool(name text, description text, input_schema jsonb, handler regprocedure, policy jsonb, title text DEFAULT NULL)
    RETURNS void LANGUAGE sql VOLATILE
    RETURN ctxguard._register_tool(name, description, input_schema, handler::oid, policy, title);
COMMENT ON FUNCTION ctxguard.register_tool(text, text, jsonb, regprocedure, jsonb, text) IS 'Register or update a tool with its (mandatory) policy and an optional title.';

CREATE FUNCTION ctxguard.protect_table(tbl regclass, tenant_column name, entity_type text DEFAULT NULL, id_column name DEFAULT NULL)
    RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tenant_type text;
    id_type regtype;
BEGIN
    PERFORM ctxguard._refuse_inside_handler('protect_table');
    SELECT format_type(a.atttypid, a.atttypmod) INTO tenant_type
      FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = tenant_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF tenant_type IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: tenant column not found on table';
    END IF;
    IF (entity_type IS NULL) <> (id_column IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: entity_type and id_column go together';
    END IF;
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('DROP POLICY IF EXISTS ctxguard_tenant ON %s', tbl);
    -- (SELECT ...) makes the reader an initplan: evaluated once per statement, not per row.
    EXECUTE format('CREATE POLICY ctxguard_tenant ON %s USING (%I = (SELECT ctxguard.tenant_id())::%s) WITH CHECK (%I = (SELECT ctxguard.tenant_id())::%s)',
                   tbl, tenant_column, tenant_type, tenant_column, tenant_type);
    IF entity_type IS NOT NULL THEN
        IF entity_type !~ '^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$' THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: invalid entity type name';
        END IF;
        SELECT a.atttypid::regtype INTO id_type
          FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = id_column AND a.attnum > 0 AND NOT a.attisdropped;
        IF id_type IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: id column not found on table';
        END IF;
        INSERT INTO ctxguard.entity_types (name, tbl, tenant_column, id_column, id_type)
        VALUES (entity_type, tbl, tenant_column, id_column, id_type)
        ON CONFLICT (name) DO UPDATE SET tbl = EXCLUDED.tbl, tenant_column = EXCLUDED.tenant_column,
                                         id_column = EXCLUDED.id_column, id_type = EXCLUDED.id_type;
    END IF;
END
$$;
COMMENT ON FUNCTION ctxguard.protect_table(regclass, name, text, name) IS 'Enable+force tenant RLS keyed on ctxguard.tenant_id(); optionally map an entity type.';

-- The one definition of a role unfit to run tool handlers: a superuser, BYPASSRLS, the extension owner,
-- or a member of the owner of a table with row level security or of a ctxguard table. Used by
-- register_tool / set_tool_policy (through Rust) and by lint().
CREATE FUNCTION ctxguard._run_as_unfit(role oid) RETURNS boolean
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.rolsuper OR r.rolbypassrls OR r.oid = e.extowner
           OR EXISTS (SELECT 1 FROM pg_class t
                       WHERE t.relkind IN ('r', 'p') AND (t.relrowsecurity OR t.relnamespace = e.extnamespace)
                         AND pg_has_role(r.oid, t.relowner, 'MEMBER'))
      FROM pg_roles r, pg_extension e
     WHERE r.oid = _run_as_unfit.role AND e.extname = 'ctxguard'
$$;

CREATE FUNCTION ctxguard.lint() RETURNS TABLE (kind text, object text, detail text)
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    -- Tables with a tenant column whose RLS is not enabled and forced.
    SELECT 'table_without_forced_rls', c.oid::regclass::text, 'has column ' || a.attname || ' but RLS is not enabled and forced'
      FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
     WHERE c.relkind IN ('r', 'p') AND a.attname IN ('tenant_id', 'tenant')
       AND c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
       AND NOT (c.relrowsecurity AND c.relforcerowsecurity)
    UNION ALL
    SELECT 'tool_without_policy', t.name, 'catalogued but invisible and uncallable until a policy is registered'
      FROM ctxguard.tools t WHERE NOT EXISTS (SELECT 1 FROM ctxguard.tool_policies p WHERE p.tool = t.name)
       AND NOT EXISTS (SELECT 1 FROM ctxguard.mcp_servers s WHERE s.name = t.server AND s.default_policy IS NOT NULL)
    UNION ALL
    SELECT 'definer_without_search_path', p.oid::regprocedure::text, 'SECURITY DEFINER without SET search_path'
      FROM pg_proc p
     WHERE p.prosecdef AND p.pronamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
       AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) cfg WHERE cfg LIKE 'search_path=%')
    UNION ALL
    SELECT DISTINCT 'view_bypasses_rls', v.oid::regclass::text, 'view over ' || t.oid::regclass::text || ' runs as its owner (set security_invoker = true)'
      FROM pg_class v
      JOIN pg_rewrite r ON r.ev_class = v.oid
      JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid AND d.refclassid = 'pg_class'::regclass
      JOIN pg_class t ON t.oid = d.refobjid AND t.oid <> v.oid AND t.relrowsecurity
     WHERE v.relkind IN ('v', 'm')
       AND NOT coalesce(v.reloptions @> ARRAY['security_invoker=true'] OR v.reloptions @> ARRAY['security_invoker=on'], false)
    UNION ALL
    SELECT 'tool_without_run_as', t.name, 'SQL tool whose handler has no run_as role: calls fail with TOOL_ERROR until it is re-registered with one'
      FROM ctxguard.tools t JOIN ctxguard.tool_policies p ON p.tool = t.name
     WHERE t.kind = 'sql' AND p.run_as IS NULL
    UNION ALL
    SELECT DISTINCT 'unsafe_run_as', p.run_as::text, 'run_as role is a superuser, can bypass RLS, or owns a protected table: its tools do not run'
      FROM ctxguard.tool_policies p JOIN pg_roles r ON r.oid = p.run_as
     WHERE ctxguard._run_as_unfit(r.oid)
    UNION ALL
    SELECT DISTINCT 'caller_with_table_privileges', r.rolname::text,
           'can call ctxguard.call_tool and also holds privileges on ' || t.oid::regclass::text || ' (the role that runs model calls needs EXECUTE on ctxguard only)'
      FROM pg_roles r
      JOIN pg_class t ON t.relkind IN ('r', 'p', 'v', 'm')
                     AND (t.relrowsecurity OR t.oid OPERATOR(pg_catalog.=) 'ctxguard.document_pages'::pg_catalog.regclass
                          OR t.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('ctxguard.document_terms')
                          OR t.oid IN (SELECT e.tbl FROM ctxguard.entity_types e))
     WHERE r.rolcanlogin AND NOT r.rolsuper AND r.oid <> t.relowner
       AND (has_function_privilege(r.oid, 'ctxguard.call_tool(text, jsonb)', 'EXECUTE') OR has_function_privilege(r.oid, 'ctxguard._call_tool(text, text)', 'EXECUTE'))
       AND (t.relnamespace OPERATOR(pg_catalog.<>) 'ctxguard'::pg_catalog.regnamespace
            OR t.oid OPERATOR(pg_catalog.=) 'ctxguard.document_pages'::pg_catalog.regclass
            OR t.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('ctxguard.document_terms'))
       AND (has_table_privilege(r.oid, t.oid, 'SELECT') OR has_table_privilege(r.oid, t.oid, 'INSERT')
            OR has_table_privilege(r.oid, t.oid, 'UPDATE') OR has_table_privilege(r.oid, t.oid, 'DELETE'))
    UNION ALL
    -- Policy conditions (issue 30): they run read-only as the tool's run_as role, so a VOLATILE one
    -- misleads, a SECURITY DEFINER one without a pinned search_path resolves names through the
    -- caller's, and one owned by a role that bypasses RLS sees every tenant if it is a definer.
    SELECT 'policy_condition_not_stable', f.oid::pg_catalog.regprocedure::pg_catalog.text,
           'condition of ' || string_agg(p.tool, ', ' ORDER BY p.tool) || ' is VOLATILE (conditions run read-only: make it STABLE)'
      FROM ctxguard.tool_policies p JOIN pg_proc f ON f.oid IN (p.when_fn, p.approval_when_fn)
     WHERE f.provolatile = 'v'
     GROUP BY f.oid
    UNION ALL
    SELECT 'policy_condition_definer_unpinned', f.oid::pg_catalog.regprocedure::pg_catalog.text,
           'condition of ' || string_agg(p.tool, ', ' ORDER BY p.tool) || ' is SECURITY DEFINER without SET search_path'
      FROM ctxguard.tool_policies p JOIN pg_proc f ON f.oid IN (p.when_fn, p.approval_when_fn)
     WHERE f.prosecdef AND NOT EXISTS (SELECT 1 FROM unnest(f.proconfig) c WHERE c LIKE 'search_path=%')
     GROUP BY f.oid
    UNION ALL
    SELECT 'policy_condition_privileged_owner', f.oid::pg_catalog.regprocedure::pg_catalog.text,
           'condition of ' || string_agg(p.tool, ', ' ORDER BY p.tool) || ' is owned by a superuser, a BYPASSRLS role or the extension owner'
      FROM ctxguard.tool_policies p JOIN pg_proc f ON f.oid IN (p.when_fn, p.approval_when_fn)
      JOIN pg_roles o ON o.oid = f.proowner
     WHERE o.rolsuper OR o.rolbypassrls OR o.oid IN (SELECT e.extowner FROM pg_extension e WHERE e.extname = 'ctxguard')
     GROUP BY f.oid
    UNION ALL
    SELECT 'tool_in_shadow_mode', p.tool, 'policy mode is log_only: its page, role, state and when refusals are audited as would_deny and the call runs'
      FROM ctxguard.tool_policies p
     WHERE p.mode = 'log_only'
    UNION ALL
    -- Policy credential_mode (issue 33): a tool whose server is registered with another mode (or
    -- a local tool) is neither listed nor callable.
    SELECT 'tool_credential_mode_mismatch', p.tool,
           'policy credential_mode ' || array_to_string(p.credential_modes, ', ') || ' does not include '
           || coalesce('its server''s mode ' || s.credential_mode, 'any mode of a local tool') || ': neither listed nor callable'
      FROM ctxguard.tool_policies p
      JOIN ctxguard.tools t ON t.name = p.tool
      LEFT JOIN ctxguard.mcp_servers s ON s.name = t.server
     WHERE p.credential_modes <> '{}' AND (s.credential_mode IS NULL OR NOT s.credential_mode = ANY (p.credential_modes))
    UNION ALL
    SELECT 'server_credential_mode_mismatch', s.name::pg_catalog.text,
           'default policy credential_mode does not include the server''s mode ' || s.credential_mode
           || ': its tools without a policy of their own are neither listed nor callable'
      FROM ctxguard.mcp_servers s
     WHERE s.default_policy ? 'credential_mode' AND jsonb_typeof(s.default_policy -> 'credential_mode') <> 'null'
       AND NOT (s.default_policy -> 'credential_mode') @> to_jsonb(s.credential_mode)
    UNION ALL
    SELECT 'upstream_tool_changed', t.name, 'upstream definition changed since it was accepted: disabled until ctxguard.accept_mcp_tool'
      FROM ctxguard.tools t
     WHERE t.kind = 'external' AND t.present AND t.accepted_hash IS DISTINCT FROM t.definition_hash
    UNION ALL
    SELECT 'immutable_context_reader', p.oid::regprocedure::text, 'IMMUTABLE but reads the ctxguard context (plans would cache one tenant)'
      FROM pg_proc p
     WHERE p.provolatile = 'i'
       AND (p.prosrc ~ 'ctxguard\.(context|tenant_id|user_id|roles|has_role|page_type|entity_type|entity_id|generation)\s*\('
            OR (p.pronamespace = 'ctxguard'::regnamespace AND p.proname IN ('context', 'tenant_id', 'user_id', 'roles', 'has_role', 'page_type', 'entity_type', 'entity_id', 'generation')))    UNION ALL
    -- Role-level defaults on a role that can set a context apply to every connection of every
    -- gateway using it, and the role can set them on itself (ALTER ROLE CURRENT_USER SET). Names
    -- only; the gateway pins what matters per transaction, but a default is a sign of tampering.
    SELECT 'caller_role_setting', r.rolname::pg_catalog.text,
           'role-level setting(s) ' || string_agg(split_part(cfg, '=', 1), ', ' ORDER BY cfg)
           || ' apply to every session of this role (ALTER ROLE ' || quote_ident(r.rolname) || ' RESET ...)'
      FROM pg_db_role_setting s
      JOIN pg_roles r ON r.oid = s.setrole
      CROSS JOIN LATERAL unnest(s.setconfig) cfg
     WHERE s.setdatabase IN (0, (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))
       AND NOT r.rolsuper
       AND (has_function_privilege(r.oid, 'ctxguard.set_context(text, jsonb, uuid, text)', 'EXECUTE') OR has_function_privilege(r.oid, 'ctxguard._set_context(text, text, uuid, text)', 'EXECUTE'))
       AND split_part(cfg, '=', 1) NOT IN ('statement_timeout', 'lock_timeout', 'idle_in_transaction_session_timeout', 'idle_session_timeout')
     GROUP BY r.rolname
    UNION ALL
    -- A login role that calls tools with no server-side bound on an idle transaction: one stuck
    -- client holds a pooled server connection (and its locks) forever.
    SELECT 'caller_without_timeouts', r.rolname::pg_catalog.text,
           'idle_in_transaction_session_timeout is 0 for this role (set it for the role, the database or the server)'
      FROM pg_roles r
     WHERE r.rolcanlogin AND NOT r.rolsuper
       AND (has_function_privilege(r.oid, 'ctxguard.call_tool(text, jsonb)', 'EXECUTE') OR has_function_privilege(r.oid, 'ctxguard._call_tool(text, text)', 'EXECUTE'))
       AND NOT EXISTS (SELECT 1 FROM pg_db_role_setting s CROSS JOIN LATERAL unnest(s.setconfig) cfg
                        WHERE s.setrole IN (0, r.oid)
                          AND s.setdatabase IN (0, (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))
                          AND cfg ~ '^idle_in_transaction_session_timeout=[1-9]')
       AND (SELECT st.boot_val = st.reset_val OR st.reset_val = '0' FROM pg_settings st
             WHERE st.name = 'idle_in_transaction_session_timeout')
    UNION ALL
    -- One login role used from several places (client addresses or application names): every
    -- session of a role may cancel or end every other (pg_cancel_backend, pg_terminate_backend),
    -- so gateways sharing a login role share one blast radius. Seen only while they are connected.
    SELECT 'shared_gateway_login', a.usename::pg_catalog.text,
           'sessions of this tool-calling login role come from ' || count(DISTINCT (coalesce(host(a.client_addr), 'local'), a.application_name))
           || ' client/application pairs: give each gateway instance its own login role (members of one NOLOGIN group role)'
      FROM pg_stat_activity a
      JOIN pg_roles r ON r.oid = a.usesysid
     WHERE a.backend_type = 'client backend' AND r.rolcanlogin AND NOT r.rolsuper
       AND (has_function_privilege(r.oid, 'ctxguard.call_tool(text, jsonb)', 'EXECUTE') OR has_function_privilege(r.oid, 'ctxguard._call_tool(text, text)', 'EXECUTE'))
     GROUP BY a.usename
    HAVING count(DISTINCT (coalesce(host(a.client_addr), 'local'), a.application_name)) > 1
$$;
COMMENT ON FUNCTION ctxguard.lint() IS 'Report RLS and policy hygiene problems (SECURITY_MATRIX A.7).';

-- Bookkeeping tables: RLS forced; callers see at most their own tenant's rows; only the owner writes.
ALTER TABLE ctxguard.audit_log ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.audit_log FORCE ROW LEVEL SECURITY;
CREATE POLICY audit_tenant_read ON ctxguard.audit_log FOR SELECT USING (tenant_id = (SELECT ctxguard.tenant_id()));
CREATE POLICY audit_owner_insert ON ctxguard.audit_log FOR INSERT WITH CHECK (true);  -- INSERT is granted to nobody

ALTER TABLE ctxguard.generations ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.generations FORCE ROW LEVEL SECURITY;
CREATE POLICY generations_owner ON ctxguard.generations USING (true) WITH CHECK (true);  -- no grants: owner only

ALTER TABLE ctxguard.approvals ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.approvals FORCE ROW LEVEL SECURITY;
CREATE POLICY approvals_owner ON ctxguard.approvals USING (true) WITH CHECK (true);  -- no grants: owner only

GRANT USAGE ON SCHEMA ctxguard TO PUBLIC;
GRANT SELECT ON ctxguard.page_types, ctxguard.entity_types, ctxguard.tools, ctxguard.tool_policies, ctxguard.catalog_version TO PUBLIC;
GRANT SELECT ON ctxguard.audit_log TO PUBLIC;

REVOKE EXECUTE ON FUNCTION ctxguard.register_page_type(text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard._register_tool(text, text, jsonb, oid, jsonb, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard.register_tool(text, text, jsonb, regprocedure, jsonb, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard.register_tools(jsonb) FROM PUBLIC;
COMMENT ON FUNCTION ctxguard.register_tools(jsonb) IS 'Register or update many SQL tools with their policies in one call, all or none (a JSON array of register_tool''s arguments; handlers as schema-qualified signatures). At most 64 MB and 100,000 tools.';
REVOKE EXECUTE ON FUNCTION ctxguard.protect_table(regclass, name, text, name) FROM PUBLIC;
-- Namespaces (issue 31): described by the DBA; listed and searched over Gate A's tools only.
REVOKE EXECUTE ON FUNCTION ctxguard.register_namespace(text, text, text) FROM PUBLIC;
COMMENT ON FUNCTION ctxguard.register_namespace(text, text, text) IS 'Describe a tool namespace (the first segment of tool names, or an upstream server): its description (1-4000 bytes) and optional title (1-128 characters). Upserts.';
COMMENT ON FUNCTION ctxguard.visible_namespaces() IS 'The namespaces of the tools Gate A shows under the current context, with title, description, number of visible tools and upstream server; none without a context.';
COMMENT ON FUNCTION ctxguard.find_tools(text, integer) IS 'Search Gate A''s tools under the current context: those matching query (at most 4096 bytes), the DBA''s tools by relevance before upstream tools, at most top_k (1-100).';

-- Documents: forced tenant RLS. Metadata and sections are readable (own tenant); page text is not
-- granted at all: only the document tools read it, under budgets, masking and audit.
ALTER TABLE ctxguard.documents ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.documents FORCE ROW LEVEL SECURITY;
CREATE POLICY documents_tenant ON ctxguard.documents USING (tenant_id = (SELECT ctxguard.tenant_id()));
ALTER TABLE ctxguard.document_sections ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.document_sections FORCE ROW LEVEL SECURITY;
CREATE POLICY document_sections_tenant ON ctxguard.document_sections USING (tenant_id = (SELECT ctxguard.tenant_id()));
ALTER TABLE ctxguard.document_pages ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.document_pages FORCE ROW LEVEL SECURITY;
CREATE POLICY document_pages_tenant ON ctxguard.document_pages USING (tenant_id = (SELECT ctxguard.tenant_id()));
ALTER TABLE ctxguard.document_terms ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.document_terms FORCE ROW LEVEL SECURITY;
CREATE POLICY document_terms_tenant ON ctxguard.document_terms USING (tenant_id = (SELECT ctxguard.tenant_id()));
ALTER TABLE ctxguard.document_calls ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.document_calls FORCE ROW LEVEL SECURITY;
CREATE POLICY document_calls_owner ON ctxguard.document_calls USING (true) WITH CHECK (true);  -- no grants: owner only
ALTER TABLE ctxguard.document_coverage ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.document_coverage FORCE ROW LEVEL SECURITY;
CREATE POLICY document_coverage_owner ON ctxguard.document_coverage USING (true) WITH CHECK (true);  -- no grants: owner only
ALTER TABLE ctxguard.tenant_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.tenant_limits FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_limits_owner ON ctxguard.tenant_limits USING (true) WITH CHECK (true);  -- DBA only
-- documents.boilerplate holds raw page lines (headers, footers): not readable by callers.
REVOKE SELECT ON ctxguard.documents FROM PUBLIC;
GRANT SELECT (tenant_id, id, title, status, tags, product_version, language, page_count, entity_type, entity_id,
              created_at, updated_at) ON ctxguard.documents TO PUBLIC;
GRANT SELECT ON ctxguard.document_sections TO PUBLIC;

-- Masking rules: validated on write, seeded from the built-in set.
ALTER TABLE ctxguard.mask_rules ADD CONSTRAINT mask_rules_compile CHECK (ctxguard._mask_rule_valid(name, pattern, validator));
INSERT INTO ctxguard.mask_rules (name, pattern, validator, position) SELECT * FROM ctxguard._default_mask_rules();
GRANT SELECT ON ctxguard.mask_rules TO PUBLIC;
-- mask_text is a DBA's tool for trying rules (it masks up to ctxguard.max_mask_bytes per call).
REVOKE EXECUTE ON FUNCTION ctxguard.mask_text(text) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION ctxguard.put_document(text, text, text, text[], text, text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard.put_page(text, integer, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard.put_section(text, text, text, integer, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard.set_tool_policy(text, jsonb) FROM PUBLIC;
-- A backend's catalog cache and memory (a DBA's view).
COMMENT ON FUNCTION ctxguard.catalog_stats() IS 'This backend''s catalog cache: what it keeps of the current catalog version against ctxguard.catalog_cache_size, what it has read, and the backend''s resident and peak memory.';
REVOKE EXECUTE ON FUNCTION ctxguard.catalog_stats() FROM PUBLIC;
COMMENT ON FUNCTION ctxguard.pin_settings(text[]) IS 'The gateway''s transaction frame: each setting of pins (name, value, name, value, ...) this server knows and that differs is set for the transaction (set_config(name, value, true)); returns how many. Grants nothing.';

-- Conversations: each user sees only their own turns; writes go through save_turn (context-bound).
ALTER TABLE ctxguard.conversation_turns ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.conversation_turns FORCE ROW LEVEL SECURITY;
CREATE POLICY conversation_turns_own ON ctxguard.conversation_turns FOR SELECT
    USING (tenant_id = (SELECT ctxguard.tenant_id()) AND user_id = (SELECT ctxguard.user_id()));
CREATE POLICY conversation_turns_owner_insert ON ctxguard.conversation_turns FOR INSERT WITH CHECK (true);  -- no INSERT grant
GRANT SELECT ON ctxguard.conversation_turns TO PUBLIC;

CREATE FUNCTION ctxguard.save_turn(conversation_id text, message text, answer text, tool_calls jsonb DEFAULT '[]')
    RETURNS integer LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '5s'
AS $$
DECLARE
    ctx jsonb := ctxguard.context();
    n integer;
BEGIN
    PERFORM ctxguard._refuse_inside_handler('save_turn');
    IF ctx IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '28000', MESSAGE = 'ctxguard: no context is set';
    END IF;
    IF conversation_id IS NULL OR conversation_id !~ '^[!-~]{1,128}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: conversation_id must be 1-128 printable ASCII characters';
    END IF;
    IF message IS NULL OR jsonb_typeof(coalesce(tool_calls, '[]')) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: a turn needs a message, and tool_calls must be an array';
    END IF;
    -- 54000 naming the limit: message 32 KiB, answer 256 KiB, all three ctxguard.max_turn_bytes.
    PERFORM ctxguard._check_turn_size(octet_length(message), octet_length(coalesce(answer, '')),
                                      octet_length(coalesce(tool_calls, '[]')::text));
    -- The conversation's row in conversation_heads orders its turns: a row lock only save_turn
    -- can take (no grants), waited for at most lock_timeout (this function's own setting).
    INSERT INTO ctxguard.conversation_heads AS h (tenant_id, user_id, conversation_id, turns)
    VALUES (ctx->>'tenantId', ctx->>'userId', save_turn.conversation_id,
            (SELECT coalesce(max(t.turn), 0) + 1 FROM ctxguard.conversation_turns t
              WHERE t.tenant_id = ctx->>'tenantId' AND t.user_id = ctx->>'userId'
                AND t.conversation_id = save_turn.conversation_id))
    ON CONFLICT ON CONSTRAINT conversation_heads_pkey DO UPDATE SET turns = h.turns + 1
    RETURNING h.turns INTO n;
    INSERT INTO ctxguard.conversation_turns (tenant_id, user_id, conversation_id, turn, page, generation, message, answer, tool_calls)
    VALUES (ctx->>'tenantId', ctx->>'userId', save_turn.conversation_id, n,
            jsonb_build_object('pageType', ctx->'pageType', 'entity', ctx->'entity', 'pageState', ctx->'pageState', 'states', ctx->'states'),
            (ctx->>'generation')::uuid, message, answer, coalesce(tool_calls, '[]'));
    RETURN n;
END
$$;
COMMENT ON FUNCTION ctxguard.save_turn(text, text, text, jsonb) IS 'Append a chat turn for the context''s tenant and user, with the context''s page.';

-- Upstream MCP servers: the registry is readable (it holds no secrets: bearer tokens come from the
-- gateway's environment); only the DBA writes it. Discovery and server policies are DBA functions;
-- grant sync_mcp_tools to the gateway's role so it can record what it discovers.
GRANT SELECT ON ctxguard.mcp_servers TO PUBLIC;
-- Grants name users of every tenant: owner only (the catalog cache reads them as the owner).
ALTER TABLE ctxguard.mcp_server_grants ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.mcp_server_grants FORCE ROW LEVEL SECURITY;
CREATE POLICY mcp_server_grants_owner ON ctxguard.mcp_server_grants USING (true) WITH CHECK (true);  -- no grants: owner only
ALTER TABLE ctxguard.external_calls ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.external_calls FORCE ROW LEVEL SECURITY;
CREATE POLICY external_calls_owner ON ctxguard.external_calls USING (true) WITH CHECK (true);  -- no grants: owner only
REVOKE EXECUTE ON FUNCTION ctxguard.sync_mcp_tools(text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard.set_server_policy(text, jsonb) FROM PUBLIC;

-- Definition pinning: accept an upstream tool's current definition (DBA only).
CREATE FUNCTION ctxguard.accept_mcp_tool(name text) RETURNS void
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ctxguard._refuse_inside_handler('accept_mcp_tool');
    UPDATE ctxguard.tools t SET accepted_hash = t.definition_hash, version = t.version + 1, updated_at = now()
     WHERE t.name = accept_mcp_tool.name AND t.kind = 'external';
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: no such upstream tool';
    END IF;
END
$$;
COMMENT ON FUNCTION ctxguard.accept_mcp_tool(text) IS 'Accept an upstream MCP tool''s current definition (name, description, schema) after a change disabled it.';
REVOKE EXECUTE ON FUNCTION ctxguard.accept_mcp_tool(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard._definition_hash(text, text, text) FROM PUBLIC;

-- Upstream credentials (issue 33): every function works on the verified context's own rows only.
COMMENT ON FUNCTION ctxguard.put_upstream_credential(text, text, bytea, bytea, timestamptz, bytea, bytea) IS 'Store (replace) the context user''s own connection to a user_oauth server it may use: the gateway''s ciphertext, nonce and key id, expiry and refresh token ciphertext. Audited (credential_set).';
COMMENT ON FUNCTION ctxguard.delete_upstream_credential(text) IS 'Delete the context user''s own connection to a server, answering the deleted ciphertext once (for revocation). Audited (credential_deleted).';
COMMENT ON FUNCTION ctxguard.put_tenant_secret(text, text, bytea, bytea) IS 'Set (replace) the context tenant''s secret for a tenant_secret server: only a holder of ctxguard.tenant_admin_role. Write-only. Audited (credential_set).';
COMMENT ON FUNCTION ctxguard.delete_tenant_secret(text) IS 'Delete the context tenant''s secret for a server: only a holder of ctxguard.tenant_admin_role. Audited (credential_deleted).';
COMMENT ON FUNCTION ctxguard.upstream_credential(uuid) IS 'The credential ciphertext for one upstream call Gate B authorized for the context user and not yet completed: the user''s connection or the tenant''s secret for that call''s server.';
COMMENT ON FUNCTION ctxguard.upstream_connections() IS 'The servers the context user may use that take a credential: mode, whether one is stored for this user or tenant, expiry. No ciphertext.';
