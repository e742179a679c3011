-- ctxguard 0.1.0 -> 0.2.0: the trust core (issue 11). Frozen once released: never edit.
--
-- After this update:
-- * SQL tools' handlers run as a run_as role. Tools registered under 0.1.0 have none and answer
--   TOOL_ERROR until re-registered (register_tool / set_tool_policy with "run_as", or with
--   ctxguard.default_run_as set); ctxguard.lint() lists them as tool_without_run_as.
-- * Approvals pending from 0.1.0 (stored without their entity) are expired.
\echo Use "ALTER EXTENSION ctxguard UPDATE TO '0.2.0'" to load this file. \quit

-- Tool handlers run as a role.
ALTER TABLE ctxguard.tool_policies ADD COLUMN run_as regrole;
COMMENT ON COLUMN ctxguard.tool_policies.run_as IS 'Role a SQL tool''s handler runs as (policy run_as, or ctxguard.default_run_as at registration).';

-- Approvals are bound to the page entity they were requested on.
ALTER TABLE ctxguard.approvals
    ADD COLUMN page_type text,
    ADD COLUMN entity_type text,
    ADD COLUMN entity_id text;
COMMENT ON TABLE ctxguard.approvals IS 'Pending requires_approval calls with their bound arguments and page entity; consumed exactly once by ctxguard.approve_call from a context on the same entity.';
UPDATE ctxguard.approvals SET expires_at = now() WHERE status = 'pending' AND expires_at > now();

-- Upstream tools: kept when they vanish, pinned to an accepted definition; a per-server cap.
ALTER TABLE ctxguard.mcp_servers
    ADD COLUMN max_tools integer NOT NULL DEFAULT 200 CHECK (max_tools BETWEEN 1 AND 10000);
ALTER TABLE ctxguard.tools
    ADD COLUMN present boolean NOT NULL DEFAULT true,
    ADD COLUMN definition_hash text,
    ADD COLUMN accepted_hash text;
COMMENT ON COLUMN ctxguard.tools.present IS 'false: the upstream server no longer lists this tool (hidden and uncallable; its policy is kept).';
COMMENT ON COLUMN ctxguard.tools.accepted_hash IS 'Definition hash the DBA accepted (first sync, or ctxguard.accept_mcp_tool); a different definition_hash disables the tool.';

CREATE FUNCTION ctxguard."_definition_hash"(
	"name" TEXT, /* & str */
	"description" TEXT, /* & str */
	"input_schema" TEXT /* & str */
) RETURNS TEXT /* Option < String > */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_definition_hash_wrapper';
REVOKE EXECUTE ON FUNCTION ctxguard._definition_hash(text, text, text) FROM PUBLIC;

-- Tools discovered under 0.1.0 keep their definitions: accepted as they are now.
UPDATE ctxguard.tools
   SET definition_hash = ctxguard._definition_hash(name, description, input_schema::text),
       accepted_hash = ctxguard._definition_hash(name, description, input_schema::text)
 WHERE kind = 'external';

-- What a running handler may not call.
CREATE FUNCTION ctxguard."_refuse_inside_handler"(
	"what" TEXT /* & str */
) RETURNS void
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_refuse_inside_handler_wrapper';

-- set_context and complete_call take their JSON as text in Rust (size checked before parsing);
-- 0.1.0's definitions of both stay as they are (C functions bound to the same symbols, with their
-- privileges), and _set_context / _complete_call take the text itself.
CREATE FUNCTION ctxguard."_set_context"(
	"token" TEXT, /* Option < & str > */
	"page" TEXT, /* Option < & str > */
	"generation" uuid DEFAULT NULL, /* Option < pgrx :: Uuid > */
	"trace_id" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS jsonb /* JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'set_context_text_wrapper';
COMMENT ON FUNCTION ctxguard.set_context(text, jsonb, uuid, text) IS 'Verify the token, validate the page, and make them this transaction''s context.';

CREATE FUNCTION ctxguard."_complete_call"(
	"call_id" uuid, /* Option < pgrx :: Uuid > */
	"result" TEXT, /* Option < & str > */
	"is_error" bool DEFAULT false /* bool */
) RETURNS jsonb /* JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'complete_call_text_wrapper';
COMMENT ON FUNCTION ctxguard.complete_call(uuid, jsonb, boolean) IS 'Mask, budget and audit the result of an upstream call authorized by call_tool (once).';

-- Functions that run SQL never run in a parallel operation (their settings are pinned).
ALTER FUNCTION ctxguard.visible_tools(text, integer) PARALLEL UNSAFE;
ALTER FUNCTION ctxguard.explain_tools() PARALLEL UNSAFE;
ALTER FUNCTION ctxguard.usable_mcp_servers() PARALLEL UNSAFE;

-- documents.boilerplate holds raw page lines: not readable by callers.
REVOKE SELECT ON ctxguard.documents FROM PUBLIC;
GRANT SELECT (tenant_id, id, title, status, tags, product_version, language, page_count, entity_type, entity_id,
              created_at, updated_at) ON ctxguard.documents TO PUBLIC;

-- save_turn's size limits (SQLSTATE 54000 naming the limit; ctxguard.max_turn_bytes for the whole turn).
CREATE FUNCTION ctxguard."_check_turn_size"(
	"message_bytes" bigint, /* i64 */
	"answer_bytes" bigint, /* i64 */
	"tool_calls_bytes" bigint /* i64 */
) RETURNS void
STRICT STABLE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_check_turn_size_wrapper';

-- protect_table and save_turn refuse inside a tool handler.
CREATE OR REPLACE FUNCTION ctxguard.protect_table(tbl regclass, tenant_column name, entity_type text DEFAULT NULL, id_column name DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION ctxguard.save_turn(conversation_id text, message text, answer text, tool_calls jsonb DEFAULT '[]')
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

-- lint() reports run_as problems, roles that mix call_tool with table privileges, changed upstream tools.
CREATE OR REPLACE FUNCTION ctxguard.lint() RETURNS TABLE (kind text, object text, detail text)
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

-- Masking (issue 12): mask_text is a DBA's tool (it masks up to ctxguard.max_mask_bytes per call).
REVOKE EXECUTE ON FUNCTION ctxguard.mask_text(text) FROM PUBLIC;
-- The built-in rules use ASCII word boundaries: the regex engine's fast path on any text, and a
-- non-ASCII letter next to a secret counts as a boundary. Rules the DBA changed are left alone.
UPDATE ctxguard.mask_rules r SET pattern = d.pattern
  FROM ctxguard._default_mask_rules() d
 WHERE r.name = d.name AND r.pattern = replace(d.pattern, '(?-u:\b)', '\b');

-- The ledger (issue 13): verify_audit and ledger_stats, then the tables of ledger.sql.
CREATE FUNCTION ctxguard."verify_audit"(
	"tenant" TEXT /* core::option::Option<&str> */
) RETURNS jsonb /* pgrx::datum::json::JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'verify_audit_wrapper';
CREATE FUNCTION ctxguard."ledger_stats"() RETURNS jsonb /* pgrx::datum::json::JsonB */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ledger_stats_wrapper';

-- Result bytes per user per UTC day (ctxguard.max_bytes_per_user_day), across generations.
CREATE TABLE ctxguard.user_day_usage (
    tenant_id text NOT NULL,
    user_id   text NOT NULL,
    day       date NOT NULL,
    bytes     bigint NOT NULL,
    PRIMARY KEY (tenant_id, user_id, day)
);
COMMENT ON TABLE ctxguard.user_day_usage IS 'Result bytes each user received per UTC day (ctxguard.max_bytes_per_user_day), written by the ledger writer.';
ALTER TABLE ctxguard.user_day_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.user_day_usage FORCE ROW LEVEL SECURITY;
CREATE POLICY user_day_usage_owner ON ctxguard.user_day_usage USING (true) WITH CHECK (true);  -- no grants: owner only
ALTER TABLE ctxguard.tenant_limits ADD COLUMN max_bytes_per_user_day integer CHECK (max_bytes_per_user_day > 0);
-- Each backend keeps the tenants' limits with its catalog: a change of them moves the catalog's version.
CREATE TRIGGER tenant_limits_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.tenant_limits
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();

-- The audit chain: the writer stores, per tenant, each row's hash over its content and the
-- previous row's hash; ctxguard.verify_audit(tenant) reports the first broken link.
ALTER TABLE ctxguard.audit_log
    ADD COLUMN prev_hash text,
    ADD COLUMN row_hash text;
CREATE INDEX audit_log_tenant_id_idx ON ctxguard.audit_log (tenant_id, id);
COMMENT ON COLUMN ctxguard.audit_log.row_hash IS 'sha256 over the row''s content and prev_hash (the tenant''s previous row), set by the audit writer; NULL for rows from before 0.2.0.';
COMMENT ON FUNCTION ctxguard.verify_audit(text) IS 'Recompute a tenant''s audit hash chain: the first row whose hash does not match its content and predecessor.';
COMMENT ON FUNCTION ctxguard.ledger_stats() IS 'This database''s audit writer: pid, last durable record, batches and batch sizes; the slots and live entries of each shared-memory ledger table.';
REVOKE EXECUTE ON FUNCTION ctxguard.verify_audit(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard.ledger_stats() FROM PUBLIC;

-- Gateway edges (issue 17): per-tenant lifetimes the gateway can read, ranking that upstream text
-- cannot game (explain_tools says why a visible tool is not in the model's list).
ALTER TABLE ctxguard.tenant_limits
    ADD COLUMN generation_ttl integer CHECK (generation_ttl BETWEEN 2 AND 86400),
    ADD COLUMN approval_ttl integer CHECK (approval_ttl BETWEEN 10 AND 86400),
    ADD COLUMN external_call_ttl integer CHECK (external_call_ttl BETWEEN 5 AND 3600);
COMMENT ON TABLE ctxguard.tenant_limits IS 'Optional per-tenant overrides of the ctxguard.max_* and ctxguard.*_ttl settings (NULL = use the setting).';

CREATE FUNCTION ctxguard."effective_ttls"() RETURNS TABLE (
	"generation_ttl" INT,  /* i32 */
	"approval_ttl" INT,  /* i32 */
	"external_call_ttl" INT  /* i32 */
)
STRICT STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'effective_ttls_wrapper';

DROP FUNCTION ctxguard.explain_tools();
-- max_hidden (issue 34): every visible tool and at most that many hidden ones, without walking
-- the whole catalog (the gateway's POST /v1/tools).
CREATE FUNCTION ctxguard."explain_tools"(
	"query" TEXT DEFAULT NULL, /* Option < & str > */
	"top_k" INT DEFAULT NULL, /* Option < i32 > */
	"max_hidden" INT DEFAULT NULL /* Option < i32 > */
) RETURNS TABLE (
	"name" TEXT,  /* String */
	"visible" bool,  /* bool */
	"reason" TEXT,  /* String */
	"offered" bool,  /* Option < bool > */
	"left_out" TEXT,  /* Option < String > */
	"conditions" TEXT,  /* Option < String > */
	"namespace" TEXT  /* String */
)
STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'explain_tools_wrapper';

-- >>> sql/state.sql (issue 20), the same text as a fresh install runs
-- Shared gateway state (issue 20): each user's current page and the MCP sessions, so that any gateway
-- behind a load balancer serves any user and any session. Owner-only tables; the gateway role reaches
-- them through the functions below only. A page is written only from a transaction whose page
-- set_context validated (the page it validated, for the tenant and user of its token); everything
-- else is keyed by the caller's verified token. Changes are announced on the channel ctxguard_pages
-- with an opaque key, never a name: a user's shared page by the user's key (salted hash of tenant and
-- user), a session's own page by 's:' and the session's key (salted hash of its stored hash).
-- A session's last use is recorded here (any gateway may serve it), so that a gateway's idle timeout
-- ends only sessions idle everywhere.

CREATE TABLE ctxguard.state_salt (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    salt      text NOT NULL DEFAULT pg_catalog.gen_random_uuid()::pg_catalog.text
);
COMMENT ON TABLE ctxguard.state_salt IS 'Random salt of the keys announced on the ctxguard_pages channel (owner only).';
INSERT INTO ctxguard.state_salt DEFAULT VALUES;

CREATE TABLE ctxguard.user_pages (
    tenant_id  text NOT NULL,
    user_id    text NOT NULL,
    page       jsonb NOT NULL,
    version    bigint NOT NULL DEFAULT 1,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id)
);
COMMENT ON TABLE ctxguard.user_pages IS 'Each user''s current page (PUT /v1/context, X-Ctxguard-Page), as set_context validated it; written by ctxguard.put_user_page only (owner only).';

CREATE TABLE ctxguard.mcp_sessions (
    id_hash     text PRIMARY KEY,
    tenant_id   text NOT NULL,
    user_id     text NOT NULL,
    init_params jsonb NOT NULL,
    page        jsonb,
    ttl         integer NOT NULL CHECK (ttl BETWEEN 60 AND 86400),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    last_used_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mcp_sessions_user_idx ON ctxguard.mcp_sessions (tenant_id, user_id);
COMMENT ON TABLE ctxguard.mcp_sessions IS 'MCP sessions: sha256 of the session id, the tenant and user of the token that opened it, its initialize parameters, its own page (validated), its expiry and its last use through any gateway (owner only).';

-- No grants: owner only (the policies satisfy lint's forced-RLS rule for tables with a tenant_id).
ALTER TABLE ctxguard.user_pages ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.user_pages FORCE ROW LEVEL SECURITY;
CREATE POLICY user_pages_owner ON ctxguard.user_pages USING (true) WITH CHECK (true);
ALTER TABLE ctxguard.mcp_sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.mcp_sessions FORCE ROW LEVEL SECURITY;
CREATE POLICY mcp_sessions_owner ON ctxguard.mcp_sessions USING (true) WITH CHECK (true);

-- The opaque key of a user on the ctxguard_pages channel.
CREATE FUNCTION ctxguard._user_key(tenant_id text, user_id text) RETURNS text
    LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.substr(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
               coalesce((SELECT s.salt FROM ctxguard.state_salt s), '') || chr(31) || tenant_id || chr(31) || user_id,
               'UTF8')), 'hex'), 1, 32)
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._user_key(text, text) FROM PUBLIC;

-- The opaque key of a session (given its stored hash) on the ctxguard_pages channel, after 's:'.
CREATE FUNCTION ctxguard._session_key(id_hash text) RETURNS text
    LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.substr(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
               coalesce((SELECT s.salt FROM ctxguard.state_salt s), '') || pg_catalog.chr(31) || 'session'
               || pg_catalog.chr(31) || id_hash,
               'UTF8')), 'hex'), 1, 32)
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._session_key(text) FROM PUBLIC;

-- The page set_context validated in this transaction (NULL without one, or without the library).
CREATE FUNCTION ctxguard._validated_page() RETURNS jsonb
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- tenant_id() is NULL unless the preloaded library set a context: only then is ctxguard.page a
    -- superuser-only setting that set_context alone wrote.
    IF ctxguard.tenant_id() IS NULL OR coalesce(current_setting('ctxguard.page', true), '') = '' THEN
        RETURN NULL;
    END IF;
    RETURN pg_catalog.current_setting('ctxguard.page')::pg_catalog.jsonb;
END
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._validated_page() FROM PUBLIC;

CREATE FUNCTION ctxguard.put_user_page() RETURNS jsonb
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t text := ctxguard.tenant_id();
    u text := ctxguard.user_id();
    p jsonb := ctxguard._validated_page();
    k text;
    v bigint;
BEGIN
    PERFORM ctxguard._refuse_inside_handler('put_user_page');
    IF t IS NULL OR u IS NULL OR p IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '28000', MESSAGE = 'ctxguard: no context is set';
    END IF;
    k := ctxguard._user_key(t, u);
    INSERT INTO ctxguard.user_pages AS up (tenant_id, user_id, page) VALUES (t, u, p)
        ON CONFLICT (tenant_id, user_id) DO UPDATE
           SET page = excluded.page, version = up.version + 1, updated_at = now()
         WHERE up.page IS DISTINCT FROM excluded.page
    RETURNING up.version INTO v;
    IF v IS NOT NULL THEN
        -- Delivered at commit, to every gateway listening: nothing is announced that was not written.
        PERFORM pg_notify('ctxguard_pages', k);
    END IF;
    RETURN jsonb_build_object('key', k, 'changed', v IS NOT NULL);
END
$$;
COMMENT ON FUNCTION ctxguard.put_user_page() IS 'Make the page set_context validated in this transaction the current page of the context''s user; announces the user''s key on ctxguard_pages when it changed.';

CREATE FUNCTION ctxguard.put_session_page(session_id text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t text := ctxguard.tenant_id();
    u text := ctxguard.user_id();
    p jsonb := ctxguard._validated_page();
    h text := pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(coalesce(session_id, ''), 'UTF8')), 'hex');
BEGIN
    PERFORM ctxguard._refuse_inside_handler('put_session_page');
    IF t IS NULL OR u IS NULL OR p IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '28000', MESSAGE = 'ctxguard: no context is set';
    END IF;
    UPDATE ctxguard.mcp_sessions s SET page = p
     WHERE s.id_hash = h
       AND s.tenant_id = t AND s.user_id = u AND s.expires_at > now()
       AND s.page IS DISTINCT FROM p;
    IF FOUND THEN
        -- The session's own key, not the user's: only that session's listeners re-read its page.
        PERFORM pg_catalog.pg_notify('ctxguard_pages', 's:' || ctxguard._session_key(h));
    END IF;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION ctxguard.put_session_page(text) IS 'Make the page set_context validated in this transaction the own page of one of the context user''s live MCP sessions; announces ''s:'' and the session''s key on ctxguard_pages when it changed.';

-- Who a token is, the user's key and current page, and (given a session id) that session if it is
-- the caller's and live ("session": null otherwise, whoever's it is): its own page and its key on the
-- page channel. With touch_after_ms the call is a use of the session: recorded when the recorded last
-- use is older than that (so not every request writes), and the session is extended past half its
-- lifetime. Without, it only reads (a gateway re-reading a page it was told changed).
CREATE FUNCTION ctxguard.mcp_identity(token text, session_id text DEFAULT NULL, touch_after_ms integer DEFAULT NULL)
    RETURNS jsonb
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
    t text := who->>'tenantId';
    u text := who->>'userId';
    s record;
    res jsonb;
BEGIN
    IF touch_after_ms IS NOT NULL AND touch_after_ms NOT BETWEEN 0 AND 86400000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: touch_after_ms is 0-86400000 milliseconds';
    END IF;
    res := who || pg_catalog.jsonb_build_object(
        'key', ctxguard._user_key(t, u),
        'page', (SELECT up.page FROM ctxguard.user_pages up WHERE up.tenant_id = t AND up.user_id = u));
    IF session_id IS NULL THEN
        RETURN res;
    END IF;
    -- No session has a longer id (mcp_session_open): not worth hashing.
    IF pg_catalog.length(session_id) > 256 THEN
        RETURN res || pg_catalog.jsonb_build_object('session', NULL);
    END IF;
    SELECT ms.id_hash, ms.page, ms.ttl, ms.expires_at, ms.last_used_at INTO s FROM ctxguard.mcp_sessions ms
     WHERE ms.id_hash = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(session_id, 'UTF8')), 'hex')
       AND ms.tenant_id = t AND ms.user_id = u AND ms.expires_at > pg_catalog.now();
    IF NOT FOUND THEN
        RETURN res || pg_catalog.jsonb_build_object('session', NULL);
    END IF;
    IF touch_after_ms IS NOT NULL
       AND (s.last_used_at <= pg_catalog.now() - pg_catalog.make_interval(secs => touch_after_ms / 1000.0)
            OR s.expires_at < pg_catalog.now() + pg_catalog.make_interval(secs => s.ttl / 2)) THEN
        UPDATE ctxguard.mcp_sessions ms
           SET last_used_at = pg_catalog.now(),
               expires_at = GREATEST(ms.expires_at, pg_catalog.now() + pg_catalog.make_interval(secs => ms.ttl))
         WHERE ms.id_hash = s.id_hash;
    END IF;
    RETURN res || pg_catalog.jsonb_build_object('session',
        pg_catalog.jsonb_build_object('page', s.page, 'key', ctxguard._session_key(s.id_hash)));
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_identity(text, text, integer) IS 'The token''s identity, the user''s key and current page, and the caller''s live MCP session of that id (its own page and key; else "session": null); with touch_after_ms, records a use of the session (throttled).';

CREATE FUNCTION ctxguard.mcp_session_open(token text, session_id text, init_params jsonb, ttl integer DEFAULT 3600)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
    t text := who->>'tenantId';
    u text := who->>'userId';
BEGIN
    PERFORM ctxguard._refuse_inside_handler('mcp_session_open');
    IF session_id IS NULL OR length(session_id) NOT BETWEEN 16 AND 256 OR session_id !~ '^[!-~]+$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: a session id is 16-256 printable ASCII characters';
    END IF;
    IF init_params IS NULL OR jsonb_typeof(init_params) <> 'object' OR octet_length(init_params::pg_catalog.text) > 65536 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: init_params must be an object of at most 64 KiB';
    END IF;
    IF ttl IS NULL OR ttl NOT BETWEEN 60 AND 86400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: a session lifetime is 60-86400 seconds';
    END IF;
    DELETE FROM ctxguard.mcp_sessions ms WHERE ms.tenant_id = t AND ms.user_id = u AND ms.expires_at <= now();
    IF (SELECT count(*) FROM ctxguard.mcp_sessions ms WHERE ms.tenant_id = t AND ms.user_id = u) >= 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = 'ctxguard: a user holds at most 1000 live MCP sessions';
    END IF;
    INSERT INTO ctxguard.mcp_sessions (id_hash, tenant_id, user_id, init_params, ttl, expires_at)
    VALUES (encode(sha256(convert_to(session_id, 'UTF8')), 'hex'), t, u, init_params, ttl,
            now() + make_interval(secs => ttl))
    ON CONFLICT (id_hash) DO NOTHING;
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_open(text, text, jsonb, integer) IS 'Record an MCP session for the token''s user (any gateway can then serve it).';

CREATE FUNCTION ctxguard.mcp_session_load(token text, session_id text) RETURNS jsonb
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
BEGIN
    RETURN (SELECT ms.init_params FROM ctxguard.mcp_sessions ms
             WHERE ms.id_hash = encode(sha256(convert_to(coalesce(session_id, ''), 'UTF8')), 'hex')
               AND ms.tenant_id = who->>'tenantId' AND ms.user_id = who->>'userId' AND ms.expires_at > now());
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_load(text, text) IS 'The initialize parameters of the caller''s live MCP session of that id, or NULL (whoever''s it is).';

CREATE FUNCTION ctxguard.mcp_session_close(token text, session_id text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
BEGIN
    PERFORM ctxguard._refuse_inside_handler('mcp_session_close');
    DELETE FROM ctxguard.mcp_sessions ms
     WHERE ms.id_hash = encode(sha256(convert_to(coalesce(session_id, ''), 'UTF8')), 'hex')
       AND ms.tenant_id = who->>'tenantId' AND ms.user_id = who->>'userId';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_close(text, text) IS 'End the caller''s MCP session of that id (every gateway then answers 404 for it).';

-- A gateway's idle timeout: ends the caller's session only if no gateway used it for idle_ms (its
-- recorded last use; gateways record uses throttled, so they pass their timeout plus the throttle).
-- NULL: no such live session of the caller (ended elsewhere, expired, another user's, never was);
-- {"ended": true}: ended now; {"ended": false, "idleMs": n}: used n ms ago, it lives on.
CREATE FUNCTION ctxguard.mcp_session_expire(token text, session_id text, idle_ms integer) RETURNS jsonb
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
    used timestamptz;
    h text;
BEGIN
    PERFORM ctxguard._refuse_inside_handler('mcp_session_expire');
    IF session_id IS NULL OR pg_catalog.length(session_id) NOT BETWEEN 16 AND 256 OR session_id !~ '^[!-~]+$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: a session id is 16-256 printable ASCII characters';
    END IF;
    IF idle_ms IS NULL OR idle_ms NOT BETWEEN 1000 AND 172800000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: idle_ms is 1000-172800000 milliseconds';
    END IF;
    h := pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(session_id, 'UTF8')), 'hex');
    -- Locked: a use recorded meanwhile (mcp_identity, mcp_session_touch) waits, then finds it gone.
    SELECT ms.last_used_at INTO used FROM ctxguard.mcp_sessions ms
     WHERE ms.id_hash = h AND ms.tenant_id = who->>'tenantId' AND ms.user_id = who->>'userId'
       AND ms.expires_at > pg_catalog.now()
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF used <= pg_catalog.now() - pg_catalog.make_interval(secs => idle_ms / 1000.0) THEN
        DELETE FROM ctxguard.mcp_sessions ms WHERE ms.id_hash = h;
        RETURN pg_catalog.jsonb_build_object('ended', true);
    END IF;
    RETURN pg_catalog.jsonb_build_object('ended', false,
        'idleMs', pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now() - used) * 1000)::pg_catalog.int8);
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_expire(text, text, integer) IS 'End the caller''s MCP session of that id if no gateway used it for idle_ms; else how long ago it was used (NULL: no such live session of the caller).';

-- The sessions a gateway holds event streams on are in use: one call per tick of its reaper records
-- it for all of them (throttled as in mcp_identity), each only for its own token's user. A token
-- that no longer verifies is skipped, not an error (one user's expired token must not stop the
-- others'). Returns the given session ids (of tokens that verify) that name no live session of
-- their token's user: ended or expired, through any gateway; the gateway closes their streams.
CREATE FUNCTION ctxguard.mcp_session_touch(sessions jsonb, touch_after_ms integer) RETURNS text[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tok text;
    ids text[];
    who jsonb;
    hashes text[];
    lost text[];
    gone text[] := '{}';
BEGIN
    PERFORM ctxguard._refuse_inside_handler('mcp_session_touch');
    IF touch_after_ms IS NULL OR touch_after_ms NOT BETWEEN 0 AND 86400000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: touch_after_ms is 0-86400000 milliseconds';
    END IF;
    IF sessions IS NULL OR pg_catalog.jsonb_typeof(sessions) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects';
    END IF;
    IF pg_catalog.jsonb_array_length(sessions) > 1000 OR pg_catalog.octet_length(sessions::pg_catalog.text) > 8388608 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.jsonb_array_elements(sessions) e
                WHERE pg_catalog.jsonb_typeof(e) <> 'object'
                   OR pg_catalog.jsonb_typeof(e->'token') IS DISTINCT FROM 'string'
                   OR pg_catalog.jsonb_typeof(e->'sessionId') IS DISTINCT FROM 'string') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects';
    END IF;
    -- Each token with its ids, grouped in one pass. A pass over the whole batch per token copied
    -- every entry once per token: 1,000 entries of 1,000 distinct 8 kB tokens (within the 8 MB
    -- limit) took 12.8 s of the backend besides verifying them, 0.34 s grouped.
    FOR tok, ids IN SELECT e->>'token', pg_catalog.array_agg(e->>'sessionId')
                      FROM pg_catalog.jsonb_array_elements(sessions) e GROUP BY 1 LOOP
        BEGIN
            who := ctxguard.verify_token(tok);
        EXCEPTION WHEN invalid_authorization_specification THEN
            CONTINUE;
        END;
        -- This token's ids: the hashes of those naming a live session of its user, and the others.
        SELECT pg_catalog.array_agg(x.h) FILTER (WHERE x.live), pg_catalog.array_agg(x.id) FILTER (WHERE NOT x.live)
          INTO hashes, lost
          FROM (SELECT s.id, k.h,
                       k.h IS NOT NULL AND EXISTS (
                           SELECT FROM ctxguard.mcp_sessions ms
                            WHERE ms.id_hash = k.h AND ms.tenant_id = who->>'tenantId'
                              AND ms.user_id = who->>'userId' AND ms.expires_at > pg_catalog.now()) AS live
                  FROM pg_catalog.unnest(ids) AS s(id)
                 CROSS JOIN LATERAL (
                       SELECT CASE WHEN pg_catalog.length(s.id) <= 256
                                   THEN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(s.id, 'UTF8')), 'hex')
                              END AS h) k) x;
        gone := gone || coalesce(lost, '{}');
        UPDATE ctxguard.mcp_sessions ms
           SET last_used_at = pg_catalog.now(),
               expires_at = GREATEST(ms.expires_at, pg_catalog.now() + pg_catalog.make_interval(secs => ms.ttl))
         WHERE ms.id_hash = ANY (hashes) AND ms.tenant_id = who->>'tenantId' AND ms.user_id = who->>'userId'
           AND ms.expires_at > pg_catalog.now()
           AND (ms.last_used_at <= pg_catalog.now() - pg_catalog.make_interval(secs => touch_after_ms / 1000.0)
                OR ms.expires_at < pg_catalog.now() + pg_catalog.make_interval(secs => ms.ttl / 2));
    END LOOP;
    RETURN gone;
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_touch(jsonb, integer) IS 'Record a use of the given MCP sessions ([{token, sessionId}], at most 1000), each for its own token''s user only, when the recorded one is older than touch_after_ms; returns the given ids (of tokens that verify) that name no live session of their token''s user.';
-- save_turn's turn counter per conversation (issue 29): the row lock that orders a conversation's
-- turns. No grants, so no other role can lock it (an advisory lock key anyone could compute let
-- any role stall a user's chat turn).
CREATE TABLE ctxguard.conversation_heads (
    tenant_id       text NOT NULL,
    user_id         text NOT NULL,
    conversation_id text NOT NULL,
    turns           integer NOT NULL,
    PRIMARY KEY (tenant_id, user_id, conversation_id)
);
COMMENT ON TABLE ctxguard.conversation_heads IS 'The last turn number of each conversation; written by ctxguard.save_turn only (owner only).';
ALTER TABLE ctxguard.conversation_heads ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.conversation_heads FORCE ROW LEVEL SECURITY;
CREATE POLICY conversation_heads_owner ON ctxguard.conversation_heads USING (true) WITH CHECK (true);
-- <<< sql/state.sql

-- Tools: an optional title (issue 14), and names unique as MCP and model clients see them ('.' is
-- sent as '__'): register_tool refuses a colliding name (42710), the index is the backstop.
ALTER TABLE ctxguard.tools
    ADD COLUMN title text CHECK (title IS NULL OR (length(title) BETWEEN 1 AND 128 AND title !~ '[[:cntrl:]]'));
COMMENT ON COLUMN ctxguard.tools.title IS 'Title MCP clients show (register_tool''s title); NULL: a readable form of the name.';
CREATE UNIQUE INDEX tools_wire_name_key ON ctxguard.tools ((pg_catalog.replace(name, '.', '__')));

DROP FUNCTION ctxguard.register_tool(text, text, jsonb, regprocedure, jsonb);
DROP FUNCTION ctxguard._register_tool(text, text, jsonb, oid, jsonb);
CREATE FUNCTION ctxguard."_register_tool"(
	"name" TEXT, /* Option < & str > */
	"description" TEXT, /* Option < & str > */
	"input_schema" jsonb, /* Option < JsonB > */
	"handler" oid, /* Option < pg_sys :: Oid > */
	"policy" jsonb, /* Option < JsonB > */
	"title" TEXT /* Option < & str > */
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_register_tool_wrapper';
CREATE FUNCTION ctxguard.register_tool(name text, description text, input_schema jsonb, handler regprocedure, policy jsonb, title text DEFAULT NULL)
    RETURNS void LANGUAGE sql VOLATILE
    RETURN ctxguard._register_tool(name, description, input_schema, handler::oid, policy, title);
COMMENT ON FUNCTION ctxguard.register_tool(text, text, jsonb, regprocedure, jsonb, text) IS 'Register or update a tool with its (mandatory) policy and an optional title.';
REVOKE EXECUTE ON FUNCTION ctxguard._register_tool(text, text, jsonb, oid, jsonb, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ctxguard.register_tool(text, text, jsonb, regprocedure, jsonb, text) FROM PUBLIC;

-- Cost growth (issue 34): the catalog's version moves once per transaction (a version per
-- statement left a transaction of 20,000 registrations 20,000 row versions to scan), and each
-- backend reads the catalog lazily, within ctxguard.catalog_cache_size, reported by catalog_stats().
CREATE FUNCTION ctxguard."_catalog_written_here"() RETURNS bool
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_catalog_written_here_wrapper';
-- What each version changed, so that a backend whose cache is a few versions old reads again only
-- the tools that changed: a row per changed tool name, or one with tool NULL when anything else
-- changed (page types, entities, servers, grants, limits, mask rules, a TRUNCATE): then it reads
-- everything again. Kept for the last 100 versions (a backend further behind reads afresh).
CREATE TABLE ctxguard.catalog_changes (
    version bigint NOT NULL,
    tool    text
);
CREATE INDEX catalog_changes_version_idx ON ctxguard.catalog_changes (version);
COMMENT ON TABLE ctxguard.catalog_changes IS 'What each catalog version changed (tool names; NULL: anything else), for the backends'' catalog caches. Written by triggers, last 100 versions.';
-- Is `rel` one of ctxguard's own tables (a member of the extension)? The catalog's trigger functions
-- run as the owner, and serve no other table.
CREATE FUNCTION ctxguard._own_table(rel oid) RETURNS boolean
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                    WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                      AND d.objid OPERATOR(pg_catalog.=) rel AND d.objsubid OPERATOR(pg_catalog.=) 0
                      AND d.deptype OPERATOR(pg_catalog.=) 'e' AND e.extname OPERATOR(pg_catalog.=) 'ctxguard')
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._own_table(oid) FROM PUBLIC;
CREATE OR REPLACE FUNCTION ctxguard._bump_catalog_version() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT ctxguard._own_table(TG_RELID) THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'ctxguard: the catalog''s triggers serve ctxguard''s own tables only';
    END IF;
    -- Once per transaction: a row version per statement made a transaction of 20,000 changes
    -- leave 20,000 versions for every next statement to scan.
    IF NOT ctxguard._catalog_written_here() THEN
        UPDATE ctxguard.catalog_version SET version = version OPERATOR(pg_catalog.+) 1;
        DELETE FROM ctxguard.catalog_changes
         WHERE version OPERATOR(pg_catalog.<) (SELECT c.version OPERATOR(pg_catalog.-) 100 FROM ctxguard.catalog_version c);
    END IF;
    -- Tools and policies log the names they change (ctxguard._log_tool_changes); anything else
    -- makes the backends read the whole catalog again.
    IF TG_OP OPERATOR(pg_catalog.=) 'TRUNCATE'
       OR TG_TABLE_NAME OPERATOR(pg_catalog.<>) ALL (ARRAY['tools', 'tool_policies']::pg_catalog.name[]) THEN
        INSERT INTO ctxguard.catalog_changes (version, tool) SELECT c.version, NULL FROM ctxguard.catalog_version c;
    END IF;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._bump_catalog_version() FROM PUBLIC;
-- The tool names a statement on tools or tool_policies changed (each table's name column, by name), with
-- the version this transaction moved the catalog to. Runs after _bump_catalog_version (trigger
-- names: *_changed before *_logged_*).
CREATE FUNCTION ctxguard._log_tool_changes() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT ctxguard._own_table(TG_RELID) THEN
        RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'ctxguard: the catalog''s triggers serve ctxguard''s own tables only';
    END IF;
    -- Each table's name column by name (each branch is planned only for the table that takes it).
    IF TG_TABLE_NAME OPERATOR(pg_catalog.=) 'tools' THEN
        IF TG_OP OPERATOR(pg_catalog.<>) 'DELETE' THEN
            INSERT INTO ctxguard.catalog_changes (version, tool)
            SELECT DISTINCT c.version, n.name FROM changed_new n, ctxguard.catalog_version c;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.<>) 'INSERT' THEN
            INSERT INTO ctxguard.catalog_changes (version, tool)
            SELECT DISTINCT c.version, o.name FROM changed_old o, ctxguard.catalog_version c;
        END IF;
    ELSIF TG_TABLE_NAME OPERATOR(pg_catalog.=) 'tool_policies' THEN
        IF TG_OP OPERATOR(pg_catalog.<>) 'DELETE' THEN
            INSERT INTO ctxguard.catalog_changes (version, tool)
            SELECT DISTINCT c.version, n.tool FROM changed_new n, ctxguard.catalog_version c;
        END IF;
        IF TG_OP OPERATOR(pg_catalog.<>) 'INSERT' THEN
            INSERT INTO ctxguard.catalog_changes (version, tool)
            SELECT DISTINCT c.version, o.tool FROM changed_old o, ctxguard.catalog_version c;
        END IF;
    ELSE
        -- Not a table whose names are logged: every backend reads the whole catalog again.
        INSERT INTO ctxguard.catalog_changes (version, tool) SELECT c.version, NULL FROM ctxguard.catalog_version c;
    END IF;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._log_tool_changes() FROM PUBLIC;
CREATE TRIGGER tools_logged_insert AFTER INSERT ON ctxguard.tools REFERENCING NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._log_tool_changes('name');
CREATE TRIGGER tools_logged_update AFTER UPDATE ON ctxguard.tools REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._log_tool_changes('name');
CREATE TRIGGER tools_logged_delete AFTER DELETE ON ctxguard.tools REFERENCING OLD TABLE AS changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._log_tool_changes('name');
CREATE TRIGGER tool_policies_logged_insert AFTER INSERT ON ctxguard.tool_policies REFERENCING NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._log_tool_changes('tool');
CREATE TRIGGER tool_policies_logged_update AFTER UPDATE ON ctxguard.tool_policies REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._log_tool_changes('tool');
CREATE TRIGGER tool_policies_logged_delete AFTER DELETE ON ctxguard.tool_policies REFERENCING OLD TABLE AS changed_old
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._log_tool_changes('tool');
CREATE FUNCTION ctxguard."catalog_stats"() RETURNS jsonb /* pgrx::datum::json::JsonB */
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'catalog_stats_wrapper';
COMMENT ON FUNCTION ctxguard.catalog_stats() IS 'This backend''s catalog cache: what it keeps of the current catalog version against ctxguard.catalog_cache_size, what it has read, and the backend''s resident and peak memory.';
REVOKE EXECUTE ON FUNCTION ctxguard.catalog_stats() FROM PUBLIC;
CREATE FUNCTION ctxguard."register_tools"(
	"tools" jsonb /* core::option::Option<crate::pgutil::JsonbArg> */
) RETURNS INT /* i32 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'register_tools_wrapper';
REVOKE EXECUTE ON FUNCTION ctxguard.register_tools(jsonb) FROM PUBLIC;
COMMENT ON FUNCTION ctxguard.register_tools(jsonb) IS 'Register or update many SQL tools with their policies in one call, all or none (a JSON array of register_tool''s arguments; handlers as schema-qualified signatures). At most 64 MB and 100,000 tools.';
-- doc_local_search reads the candidates' tsvectors in the row (sql/documents.sql). Rows written
-- from now on (put_page, put_document(..., 'ready')) are stored so; existing pages keep their
-- out-of-line tsvector (same results, slower search) until their document is made ready again.
ALTER TABLE ctxguard.document_pages ALTER COLUMN tsv SET STORAGE MAIN;
-- doc_local_search looks its candidates up one at a time, through a hash of the page's key: one
-- bucket page whatever the number of pages (the primary key gains a level as the table grows).
CREATE INDEX document_pages_key_hash ON ctxguard.document_pages USING hash
    (pg_catalog.hashtextextended(tenant_id OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) doc_id, page_no::pg_catalog.int8));
-- doc_local_search's candidates (issue 34; sql/documents.sql): per word of a ready document, the
-- pages where it occurs most often. Filled here for the documents that are ready already.
CREATE TABLE ctxguard.document_terms (
    tenant_id text NOT NULL,
    doc_id    text NOT NULL,
    lexeme    text NOT NULL,
    hits      integer NOT NULL,
    page_no   integer NOT NULL,
    PRIMARY KEY (tenant_id, doc_id, lexeme, page_no),
    FOREIGN KEY (tenant_id, doc_id) REFERENCES ctxguard.documents (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX document_terms_rank_idx ON ctxguard.document_terms (tenant_id, doc_id, lexeme, hits DESC, page_no);
COMMENT ON TABLE ctxguard.document_terms IS 'Search candidates: per word of a document, the pages where it occurs most often. Only the document tools read it.';
ALTER TABLE ctxguard.document_terms ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.document_terms FORCE ROW LEVEL SECURITY;
CREATE POLICY document_terms_tenant ON ctxguard.document_terms USING (tenant_id = (SELECT ctxguard.tenant_id()));
INSERT INTO ctxguard.document_terms (tenant_id, doc_id, lexeme, hits, page_no)
SELECT tenant_id, doc_id, lexeme, hits, page_no
  FROM (SELECT p.tenant_id, p.doc_id, u.lexeme, coalesce(pg_catalog.cardinality(u.positions), 1) AS hits, p.page_no,
               pg_catalog.row_number() OVER (PARTITION BY p.tenant_id, p.doc_id, u.lexeme
                                             ORDER BY coalesce(pg_catalog.cardinality(u.positions), 1) DESC, p.page_no) AS r
          FROM ctxguard.document_pages p
          JOIN ctxguard.documents d ON d.tenant_id = p.tenant_id AND d.id = p.doc_id AND d.status = 'ready'
          CROSS JOIN LATERAL pg_catalog.unnest(p.tsv) AS u
         WHERE p.tsv IS NOT NULL) t
 WHERE r <= 100;

-- Policies that look at the call (issue 30): conditions ("when", "approval_when": predicates run as
-- the tool's run_as role), shadow mode ("mode": "log_only", audited as would_deny) and dry runs
-- (explain_call, audited as dry_run).
ALTER TABLE ctxguard.tool_policies
    ADD COLUMN when_fn regprocedure,
    ADD COLUMN approval_when_fn regprocedure,
    ADD COLUMN mode text NOT NULL DEFAULT 'enforce' CHECK (mode IN ('enforce', 'log_only')),
    ADD COLUMN approver_roles text[] NOT NULL DEFAULT '{}';
COMMENT ON COLUMN ctxguard.tool_policies.when_fn IS 'Policy "when": a STABLE function (args jsonb) RETURNS boolean that must return true for a call to run (run as run_as, read-only).';
COMMENT ON COLUMN ctxguard.tool_policies.approval_when_fn IS 'Policy "approval_when": a STABLE function (args jsonb) RETURNS boolean; true: the call needs an approval.';
COMMENT ON COLUMN ctxguard.tool_policies.mode IS 'enforce, or log_only (shadow mode): a would-be denial by the page, role or state conditions or by "when" is audited as would_deny and the call runs.';
ALTER TABLE ctxguard.audit_log DROP CONSTRAINT audit_log_decision_check;
ALTER TABLE ctxguard.audit_log ADD CONSTRAINT audit_log_decision_check
    CHECK (decision IN ('allow', 'deny', 'pending', 'error', 'authorized', 'would_deny', 'dry_run', 'granted', 'rejected', 'credential_set', 'credential_deleted'));
-- Approvals by someone else (four eyes): who may decide, who did, and why a call was rejected.
ALTER TABLE ctxguard.approvals
    ADD COLUMN approver_roles text[],
    ADD COLUMN decided_by text,
    ADD COLUMN decided_at timestamptz,
    ADD COLUMN reason text CHECK (octet_length(reason) <= 500);
ALTER TABLE ctxguard.approvals DROP CONSTRAINT approvals_status_check;
ALTER TABLE ctxguard.approvals ADD CONSTRAINT approvals_status_check
    CHECK (status IN ('pending', 'approved', 'granted', 'rejected'));
COMMENT ON COLUMN ctxguard.approvals.approver_roles IS 'Four eyes (policy approver_roles, copied when the call was requested): who may grant or reject it; NULL: the requester approves.';
COMMENT ON COLUMN ctxguard.approvals.status IS 'pending; granted (by an approver, not yet run); approved (run, exactly once); rejected.';
-- An approver's list (pending_approvals) reads its own tenant's pending calls, oldest first: not
-- another tenant's, nor the calls already decided (approvals are kept).
CREATE INDEX approvals_pending_idx ON ctxguard.approvals (tenant_id, created_at, call_id) WHERE status = 'pending';
-- read_doc_metadata lists a document's first sections in page order through it (the ingester decides
-- how many sections there are: without it each call sorted all of them).
CREATE INDEX document_sections_order_idx ON ctxguard.document_sections (tenant_id, doc_id, page_start, section_id);
CREATE FUNCTION ctxguard."_explain_call"(
	"name" TEXT, /* Option < & str > */
	"args" TEXT /* Option < & str > */
) RETURNS jsonb /* JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', '_explain_call_wrapper';
CREATE FUNCTION ctxguard.explain_call(tool text, args jsonb DEFAULT '{}'::pg_catalog.jsonb) RETURNS jsonb
    LANGUAGE sql VOLATILE PARALLEL UNSAFE
    RETURN ctxguard._explain_call(tool, args::pg_catalog.text);
COMMENT ON FUNCTION ctxguard.explain_call(text, jsonb) IS 'Dry run of Gate B under the current context: the decision, its code and rule; runs and charges nothing; audited as dry_run.';
-- Four eyes: reject or withdraw a pending call; what the context's user may decide.
CREATE FUNCTION ctxguard."reject_call"(
	"call_id" uuid, /* Option < pgrx :: Uuid > */
	"reason" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS jsonb /* JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'reject_call_wrapper';
CREATE FUNCTION ctxguard."pending_approvals"() RETURNS TABLE (
	"call_id" uuid,  /* pgrx :: Uuid */
	"tool" TEXT,  /* String */
	"requested_by" TEXT,  /* String */
	"page_type" TEXT,  /* Option < String > */
	"entity_type" TEXT,  /* Option < String > */
	"entity_id" TEXT,  /* Option < String > */
	"args" jsonb,  /* JsonB */
	"requested_at" timestamp with time zone,  /* pgrx :: datum :: TimestampWithTimeZone */
	"expires_at" timestamp with time zone  /* pgrx :: datum :: TimestampWithTimeZone */
)
STRICT STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'pending_approvals_wrapper';

-- Quotas in time windows (issue 30): policy "rate_limit", counted in the shared-memory ledger.
ALTER TABLE ctxguard.tool_policies ADD COLUMN rate_limits jsonb;
COMMENT ON COLUMN ctxguard.tool_policies.rate_limits IS 'Policy "rate_limit": quotas in fixed UTC windows, [{"per": "user" | "tenant", "calls": n, "window": "1m" | "1h" | "1d"}], counted in the shared-memory ledger (NULL: none).';

-- Calls counted in each quota window (policy "rate_limit", issue 30): the latest window of each
-- (tenant, user, tool, window kind), written by the ledger writer; user_id '' is the tenant's own
-- count ("per": "tenant"). Read when a quota's counter is missing from shared memory (a restart).
CREATE TABLE ctxguard.quota_usage (
    tenant_id    text NOT NULL,
    user_id      text NOT NULL,
    tool         text NOT NULL,
    win          text NOT NULL CHECK (win IN ('1m', '1h', '1d')),
    window_start timestamptz NOT NULL,
    calls        integer NOT NULL,
    PRIMARY KEY (tenant_id, user_id, tool, win, window_start)
);
COMMENT ON TABLE ctxguard.quota_usage IS 'Calls counted per quota window (policy rate_limit; user_id empty: the tenant''s count), written by the ledger writer.';
ALTER TABLE ctxguard.quota_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.quota_usage FORCE ROW LEVEL SECURITY;
CREATE POLICY quota_usage_owner ON ctxguard.quota_usage USING (true) WITH CHECK (true);  -- no grants: owner only

-- Namespaces and tool search (issue 31): the DBA describes namespaces (register_namespace); the
-- gateway lists those of Gate A's tools (visible_namespaces) and searches Gate A's tools
-- (find_tools); visible_tools and explain_tools name each tool's namespace.
-- >>> sql/namespaces.sql, the same text as a fresh install runs
-- Namespaces (issue 31): what the DBA says about a group of tools. A tool's namespace is the first
-- segment of its name (`invoice` for invoice.get and invoice.mark_paid), an upstream tool's its
-- server's; a namespace needs no row here to exist. Written by ctxguard.register_namespace (a
-- DBA's function); read through each backend's catalog cache by ctxguard.visible_namespaces(),
-- which lists a namespace only where Gate A shows one of its tools.
CREATE TABLE ctxguard.namespaces (
    name        text PRIMARY KEY CHECK (length(name) <= 64 AND name ~ '^[a-z][a-z0-9_-]*$'),
    title       text CHECK (title IS NULL OR (length(title) BETWEEN 1 AND 128 AND title !~ '[[:cntrl:]]')),
    description text NOT NULL CHECK (octet_length(description) BETWEEN 1 AND 4000),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE ctxguard.namespaces IS 'Titles and descriptions of tool namespaces (the first segment of tool names; an upstream server''s tools are in its namespace), written by ctxguard.register_namespace.';
-- Catalog data: a change moves the catalog's version, and every backend reads its catalog again.
CREATE TRIGGER namespaces_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.namespaces
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
GRANT SELECT ON ctxguard.namespaces TO PUBLIC;
-- <<< sql/namespaces.sql
CREATE FUNCTION ctxguard."register_namespace"(
	"name" TEXT, /* Option < & str > */
	"description" TEXT, /* Option < & str > */
	"title" TEXT DEFAULT NULL /* Option < & str > */
) RETURNS void
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'register_namespace_wrapper';
CREATE FUNCTION ctxguard."visible_namespaces"() RETURNS TABLE (
	"namespace" TEXT,  /* String */
	"title" TEXT,  /* Option < String > */
	"description" TEXT,  /* Option < String > */
	"tools" INT,  /* i32 */
	"server" TEXT  /* Option < String > */
)
STRICT STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'visible_namespaces_wrapper';
CREATE FUNCTION ctxguard."find_tools"(
	"query" TEXT, /* Option < & str > */
	"top_k" INT DEFAULT 5 /* Option < i32 > */
) RETURNS TABLE (
	"name" TEXT,  /* String */
	"description" TEXT,  /* String */
	"input_schema" jsonb,  /* JsonbBytes */
	"read_only" bool,  /* bool */
	"danger" TEXT,  /* String */
	"requires_approval" bool,  /* bool */
	"server" TEXT,  /* Option < String > */
	"namespace" TEXT,  /* String */
	"score" real  /* f32 */
)
STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'find_tools_wrapper';
-- visible_tools gains its last column, namespace (a new result type: dropped and created again).
DROP FUNCTION ctxguard.visible_tools(text, integer);
CREATE FUNCTION ctxguard."visible_tools"(
	"query" TEXT DEFAULT NULL, /* Option < & str > */
	"top_k" INT DEFAULT NULL /* Option < i32 > */
) RETURNS TABLE (
	"name" TEXT,  /* String */
	"description" TEXT,  /* String */
	"input_schema" jsonb,  /* crate :: pgutil :: JsonbBytes */
	"read_only" bool,  /* bool */
	"danger" TEXT,  /* String */
	"requires_approval" bool,  /* bool */
	"server" TEXT,  /* Option < String > */
	"namespace" TEXT  /* String */
)
STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'visible_tools_wrapper';
REVOKE EXECUTE ON FUNCTION ctxguard.register_namespace(text, text, text) FROM PUBLIC;
COMMENT ON FUNCTION ctxguard.register_namespace(text, text, text) IS 'Describe a tool namespace (the first segment of tool names, or an upstream server): its description (1-4000 bytes) and optional title (1-128 characters). Upserts.';
COMMENT ON FUNCTION ctxguard.visible_namespaces() IS 'The namespaces of the tools Gate A shows under the current context, with title, description, number of visible tools and upstream server; none without a context.';
COMMENT ON FUNCTION ctxguard.find_tools(text, integer) IS 'Search Gate A''s tools under the current context: those matching query (at most 4096 bytes), the DBA''s tools by relevance before upstream tools, at most top_k (1-100).';

-- Upstream credentials (issue 33): credential modes in the registry, the encrypted credentials
-- (ciphertext only, owner only), the functions that read and write each context user's own, and two
-- new audit decisions (credential_set, credential_deleted: the audit_log CHECK above).
-- >>> sql/credentials.sql, the same text as a fresh install runs
-- Upstream credentials (issue 33): how the gateway authenticates to each upstream MCP server, and
-- the encrypted credentials of the modes that need one stored. The gateway encrypts them with a key
-- the database never sees (CTXGUARD_CREDENTIAL_KEY_FILE); this table holds ciphertext, the nonce and
-- the id of the key, bound (as AEAD associated data) to tenant, user, server and mode. It is read and
-- written only by ctxguard's functions (credentials.rs), each for the verified context's own user
-- (or, for a tenant secret, the context's tenant): no grant reaches it.
ALTER TABLE ctxguard.mcp_servers
    ADD COLUMN credential_mode text NOT NULL DEFAULT 'static'
        CHECK (credential_mode IN ('static', 'tenant_secret', 'user_oauth', 'token_exchange')),
    ADD COLUMN credential_config jsonb NOT NULL DEFAULT '{}'
        CHECK (jsonb_typeof(credential_config) = 'object' AND octet_length(credential_config::pg_catalog.text) <= 4096),
    ADD COLUMN requires_connection boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT mcp_servers_credential_mode_http CHECK (credential_mode = 'static' OR (transport = 'http' AND bearer_token_env IS NULL)),
    ADD CONSTRAINT mcp_servers_requires_connection_user_oauth CHECK (NOT requires_connection OR credential_mode = 'user_oauth');
COMMENT ON COLUMN ctxguard.mcp_servers.credential_mode IS 'How the gateway authenticates upstream: static (bearer_token_env, one account for everyone), tenant_secret (one secret per tenant, set by its tenant admin), user_oauth (each user''s own OAuth connection), token_exchange (RFC 8693 exchange of the user''s verified token).';
COMMENT ON COLUMN ctxguard.mcp_servers.credential_config IS 'Per-mode settings, no secrets (at most 4 KiB): issuer, authorization_endpoint, token_endpoint, revocation_endpoint, client_id, client_secret_env, scopes, audience, resource.';
COMMENT ON COLUMN ctxguard.mcp_servers.requires_connection IS 'user_oauth only: Gate A hides the server''s tools from a user without a connection (false: shown, and a call answers CONNECTION_REQUIRED).';

CREATE TABLE ctxguard.upstream_credentials (
    tenant_id          text NOT NULL CHECK (octet_length(tenant_id) BETWEEN 1 AND 128),
    user_id            text NOT NULL CHECK (octet_length(user_id) <= 128),
    server             text NOT NULL REFERENCES ctxguard.mcp_servers (name) ON DELETE CASCADE,
    mode               text NOT NULL CHECK (mode IN ('tenant_secret', 'user_oauth')),
    key_id             text NOT NULL CHECK (key_id ~ '^[A-Za-z0-9_-]{1,64}$'),
    ciphertext         bytea NOT NULL CHECK (octet_length(ciphertext) BETWEEN 17 AND 16400),
    nonce              bytea NOT NULL CHECK (octet_length(nonce) = 24),
    expires_at         timestamptz,
    refresh_ciphertext bytea CHECK (octet_length(refresh_ciphertext) BETWEEN 17 AND 16400),
    refresh_nonce      bytea CHECK (octet_length(refresh_nonce) = 24),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, server, user_id),
    CONSTRAINT upstream_credentials_refresh_pair CHECK ((refresh_ciphertext IS NULL) = (refresh_nonce IS NULL)),
    CONSTRAINT upstream_credentials_tenant_row CHECK ((mode = 'tenant_secret') = (user_id = ''))
);
COMMENT ON TABLE ctxguard.upstream_credentials IS 'Encrypted upstream credentials: a user''s OAuth connection (user_id set) or a tenant''s secret (user_id empty). Ciphertext only, under a gateway key (key_id); owner only, through ctxguard''s functions.';
ALTER TABLE ctxguard.upstream_credentials ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.upstream_credentials FORCE ROW LEVEL SECURITY;
CREATE POLICY upstream_credentials_owner ON ctxguard.upstream_credentials USING (true) WITH CHECK (true);  -- no grants: owner only
REVOKE ALL ON ctxguard.upstream_credentials FROM PUBLIC;
-- <<< sql/credentials.sql
CREATE FUNCTION ctxguard."put_upstream_credential"(
	"server" TEXT, /* Option < & str > */
	"key_id" TEXT, /* Option < & str > */
	"ciphertext" bytea, /* Option < & [u8] > */
	"nonce" bytea, /* Option < & [u8] > */
	"expires_at" timestamp with time zone DEFAULT NULL, /* Option < TimestampWithTimeZone > */
	"refresh_ciphertext" bytea DEFAULT NULL, /* Option < & [u8] > */
	"refresh_nonce" bytea DEFAULT NULL /* Option < & [u8] > */
) RETURNS jsonb /* JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'put_upstream_credential_wrapper';
CREATE FUNCTION ctxguard."delete_upstream_credential"(
	"server" TEXT /* Option < & str > */
) RETURNS TABLE (
	"key_id" TEXT,  /* String */
	"ciphertext" bytea,  /* Vec < u8 > */
	"nonce" bytea,  /* Vec < u8 > */
	"refresh_ciphertext" bytea,  /* :: std :: option :: Option < Vec < u8 > > */
	"refresh_nonce" bytea  /* :: std :: option :: Option < Vec < u8 > > */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delete_upstream_credential_wrapper';
CREATE FUNCTION ctxguard."put_tenant_secret"(
	"server" TEXT, /* Option < & str > */
	"key_id" TEXT, /* Option < & str > */
	"ciphertext" bytea, /* Option < & [u8] > */
	"nonce" bytea /* Option < & [u8] > */
) RETURNS jsonb /* JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'put_tenant_secret_wrapper';
CREATE FUNCTION ctxguard."delete_tenant_secret"(
	"server" TEXT /* Option < & str > */
) RETURNS jsonb /* JsonB */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delete_tenant_secret_wrapper';
CREATE FUNCTION ctxguard."upstream_credential"(
	"call_id" uuid /* Option < pgrx :: Uuid > */
) RETURNS TABLE (
	"server" TEXT,  /* String */
	"mode" TEXT,  /* String */
	"key_id" TEXT,  /* String */
	"ciphertext" bytea,  /* Vec < u8 > */
	"nonce" bytea,  /* Vec < u8 > */
	"expires_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"refresh_ciphertext" bytea,  /* :: std :: option :: Option < Vec < u8 > > */
	"refresh_nonce" bytea  /* :: std :: option :: Option < Vec < u8 > > */
)
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'upstream_credential_wrapper';
CREATE FUNCTION ctxguard."upstream_connections"() RETURNS TABLE (
	"server" TEXT,  /* String */
	"mode" TEXT,  /* String */
	"connected" bool,  /* bool */
	"expires_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT STABLE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'upstream_connections_wrapper';
-- Upstream credentials (issue 33): every function works on the verified context's own rows only.
COMMENT ON FUNCTION ctxguard.put_upstream_credential(text, text, bytea, bytea, timestamptz, bytea, bytea) IS 'Store (replace) the context user''s own connection to a user_oauth server it may use: the gateway''s ciphertext, nonce and key id, expiry and refresh token ciphertext. Audited (credential_set).';
COMMENT ON FUNCTION ctxguard.delete_upstream_credential(text) IS 'Delete the context user''s own connection to a server, answering the deleted ciphertext once (for revocation). Audited (credential_deleted).';
COMMENT ON FUNCTION ctxguard.put_tenant_secret(text, text, bytea, bytea) IS 'Set (replace) the context tenant''s secret for a tenant_secret server: only a holder of ctxguard.tenant_admin_role. Write-only. Audited (credential_set).';
COMMENT ON FUNCTION ctxguard.delete_tenant_secret(text) IS 'Delete the context tenant''s secret for a server: only a holder of ctxguard.tenant_admin_role. Audited (credential_deleted).';
COMMENT ON FUNCTION ctxguard.upstream_credential(uuid) IS 'The credential ciphertext for one upstream call Gate B authorized for the context user and not yet completed: the user''s connection or the tenant''s secret for that call''s server.';
COMMENT ON FUNCTION ctxguard.upstream_connections() IS 'The servers the context user may use that take a credential: mode, whether one is stored for this user or tenant, expiry. No ciphertext.';

-- A policy can require the upstream credential mode of its tool's server (issue 33).
ALTER TABLE ctxguard.tool_policies ADD COLUMN credential_modes text[] NOT NULL DEFAULT '{}' CHECK (credential_modes OPERATOR(pg_catalog.<@) ARRAY['static', 'tenant_secret', 'user_oauth', 'token_exchange']::pg_catalog.text[]);
COMMENT ON COLUMN ctxguard.tool_policies.credential_modes IS 'Policy "credential_mode" (issue 33): the upstream credential modes a call may go out with; the tool''s server must be registered with one of them, or the tool is neither listed nor callable (credential_mode_mismatch). Empty: any.';

-- The gateway's transaction frame pins its settings with one function call (issue 34): what the
-- frame's SELECT of set_config over a VALUES list did, without parsing and planning it each time.
CREATE FUNCTION ctxguard."pin_settings"(
	"pins" TEXT[]  /* core::option::Option<pgrx::datum::array::Array<'_, &str>> */
) RETURNS INT /* i32 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'pin_settings_wrapper';
COMMENT ON FUNCTION ctxguard.pin_settings(text[]) IS 'The gateway''s transaction frame: each setting of pins (name, value, name, value, ...) this server knows and that differs is set for the transaction (set_config(name, value, true)); returns how many. Grants nothing.';

-- call_tool is a C function that takes the jsonb itself (as its text), as set_context and
-- complete_call are (issue 34): a SQL wrapper is inlined by the planner in each client statement
-- that calls it, its body read from the catalog and folded every time. CREATE OR REPLACE keeps its
-- privileges and comment.
CREATE OR REPLACE FUNCTION ctxguard.call_tool(name text, args jsonb DEFAULT '{}'::pg_catalog.jsonb) RETURNS jsonb
    LANGUAGE c VOLATILE PARALLEL UNSAFE
    AS 'MODULE_PATHNAME', 'call_tool_jsonb_wrapper';
