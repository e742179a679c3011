-- ctxguard catalog and bookkeeping tables. Created before any function.
-- Everything here is owned by the extension owner; roles get only what is granted in finalize.sql.

CREATE TABLE ctxguard.page_types (
    name        text PRIMARY KEY CHECK (length(name) <= 64 AND name ~ '^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$'),
    entity_type text CHECK (entity_type IS NULL OR (length(entity_type) <= 64 AND entity_type ~ '^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$')),
    description text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE ctxguard.page_types IS 'Page types the UI may report; entity_type NULL = list page. Descriptions are used in prompts.';

CREATE TABLE ctxguard.entity_types (
    name          text PRIMARY KEY,
    tbl           regclass NOT NULL,
    tenant_column name NOT NULL,
    id_column     name NOT NULL,
    id_type       regtype NOT NULL
);
COMMENT ON TABLE ctxguard.entity_types IS 'Entity types mapped to protected tables (by ctxguard.protect_table); set_context checks the entity is visible.';

CREATE TABLE ctxguard.tools (
    name         text PRIMARY KEY CHECK (length(name) <= 64 AND name ~ '^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$'),
    description  text NOT NULL,
    input_schema jsonb NOT NULL,
    handler      regprocedure,
    kind         text NOT NULL DEFAULT 'sql' CHECK (kind IN ('sql', 'builtin', 'external')),
    search       tsvector GENERATED ALWAYS AS
                     (to_tsvector('english'::regconfig, translate(name, '._-', '   ') || ' ' || description)) STORED,
    version      bigint NOT NULL DEFAULT 1,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE ctxguard.tools IS 'Catalogued tools. A tool without a row in tool_policies is invisible and uncallable.';

CREATE TABLE ctxguard.tool_policies (
    tool              text PRIMARY KEY REFERENCES ctxguard.tools (name) ON DELETE CASCADE,
    page_types        text[] NOT NULL CHECK (cardinality(page_types) > 0),
    requires_entity   boolean NOT NULL,
    entity_type       text,
    entity_param      text,
    roles             text[] NOT NULL DEFAULT '{}',
    required_states   text[] NOT NULL DEFAULT '{}',
    read_only         boolean NOT NULL,
    danger            text NOT NULL CHECK (danger IN ('safe', 'moderate', 'destructive')),
    requires_approval boolean NOT NULL,
    enabled           boolean NOT NULL,
    policy            jsonb NOT NULL,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    run_as            regrole,
    when_fn           regprocedure,
    approval_when_fn  regprocedure,
    mode              text NOT NULL DEFAULT 'enforce' CHECK (mode IN ('enforce', 'log_only')),
    approver_roles    text[] NOT NULL DEFAULT '{}',
    rate_limits       jsonb,
    credential_modes  text[] NOT NULL DEFAULT '{}' CHECK (credential_modes OPERATOR(pg_catalog.<@) ARRAY['static', 'tenant_secret', 'user_oauth', 'token_exchange']::pg_catalog.text[]),
    CHECK (entity_param IS NULL OR entity_type IS NOT NULL),
    CHECK (NOT requires_entity OR entity_type IS NOT NULL),
    CHECK (NOT (read_only AND danger = 'destructive'))
);
CREATE INDEX tool_policies_page_types_idx ON ctxguard.tool_policies USING gin (page_types);
COMMENT ON TABLE ctxguard.tool_policies IS 'Policy of each tool (written by ctxguard.register_tool, validated there).';
COMMENT ON COLUMN ctxguard.tool_policies.run_as IS 'Role a SQL tool''s handler runs as (policy run_as, or ctxguard.default_run_as at registration).';
COMMENT ON COLUMN ctxguard.tool_policies.when_fn IS 'Policy "when": a STABLE function (args jsonb) RETURNS boolean that must return true for a call to run (run as run_as, read-only).';
COMMENT ON COLUMN ctxguard.tool_policies.approval_when_fn IS 'Policy "approval_when": a STABLE function (args jsonb) RETURNS boolean; true: the call needs an approval.';
COMMENT ON COLUMN ctxguard.tool_policies.mode IS 'enforce, or log_only (shadow mode): a would-be denial by the page, role or state conditions or by "when" is audited as would_deny and the call runs.';
COMMENT ON COLUMN ctxguard.tool_policies.rate_limits IS 'Policy "rate_limit": quotas in fixed UTC windows, [{"per": "user" | "tenant", "calls": n, "window": "1m" | "1h" | "1d"}], counted in the shared-memory ledger (NULL: none).';
COMMENT ON COLUMN ctxguard.tool_policies.credential_modes IS 'Policy "credential_mode" (issue 33): the upstream credential modes a call may go out with; the tool''s server must be registered with one of them, or the tool is neither listed nor callable (credential_mode_mismatch). Empty: any.';

CREATE TABLE ctxguard.generations (
    id              uuid PRIMARY KEY,
    tenant_id       text NOT NULL,
    user_id         text NOT NULL,
    conversation_id text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);

CREATE TABLE ctxguard.approvals (
    call_id    uuid PRIMARY KEY,
    tenant_id  text NOT NULL,
    user_id    text NOT NULL,
    tool       text NOT NULL,
    args       jsonb NOT NULL,
    args_hash  text NOT NULL,
    status     text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'approved', 'granted', 'rejected')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at    timestamptz,
    page_type  text,
    entity_type text,
    entity_id  text,
    approver_roles text[],
    decided_by text,
    decided_at timestamptz,
    reason     text CHECK (octet_length(reason) <= 500)
);
COMMENT ON COLUMN ctxguard.approvals.approver_roles IS 'Four eyes (policy approver_roles, copied when the call was requested): who may grant or reject it; NULL: the requester approves.';
COMMENT ON COLUMN ctxguard.approvals.status IS 'pending; granted (by an approver, not yet run); approved (run, exactly once); rejected.';
COMMENT ON TABLE ctxguard.approvals IS 'Pending requires_approval calls with their bound arguments and page entity; consumed exactly once by ctxguard.approve_call from a context on the same entity.';
-- An approver's list (pending_approvals) reads its own tenant's pending calls, oldest first: not
-- another tenant's, nor the calls already decided (approvals are kept).
CREATE INDEX approvals_pending_idx ON ctxguard.approvals (tenant_id, created_at, call_id) WHERE status = 'pending';

CREATE TABLE ctxguard.audit_log (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    call_id      uuid NOT NULL,
    tenant_id    text,
    user_id      text,
    page_type    text,
    entity_type  text,
    entity_id    text,
    tool         text,
    decision     text NOT NULL CHECK (decision IN ('allow', 'deny', 'pending', 'error', 'authorized', 'would_deny', 'dry_run', 'granted', 'rejected', 'credential_set', 'credential_deleted')),
    code         text,
    args_hash    text,
    result_bytes integer,
    generation   uuid,
    trace_id     text
);
CREATE INDEX audit_log_tenant_at_idx ON ctxguard.audit_log (tenant_id, at);
CREATE INDEX audit_log_call_id_idx ON ctxguard.audit_log (call_id);
COMMENT ON TABLE ctxguard.audit_log IS 'Every Gate B decision. Hashes and sizes only: never argument values or results.';

-- One counter moved by any catalog change, once per transaction: each backend caches what it read
-- of the catalog (page types, entity mappings, tools, policies, mask rules, tenant limits) and drops
-- it when (version, xmin) of this row moves (in the transaction that moved it, at every command).
CREATE TABLE ctxguard.catalog_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   bigint NOT NULL
);
INSERT INTO ctxguard.catalog_version VALUES (true, 1);
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
CREATE FUNCTION ctxguard._bump_catalog_version() RETURNS trigger
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
CREATE TRIGGER page_types_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.page_types
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
CREATE TRIGGER entity_types_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.entity_types
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
CREATE TRIGGER tools_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.tools
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
CREATE TRIGGER tool_policies_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.tool_policies
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
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

-- Conversations (for the gateway): one row per turn with the page context it was asked on.
CREATE TABLE ctxguard.conversation_turns (
    tenant_id       text NOT NULL,
    user_id         text NOT NULL,
    conversation_id text NOT NULL CHECK (conversation_id ~ '^[!-~]{1,128}$'),
    turn            integer NOT NULL,
    page            jsonb NOT NULL,
    generation      uuid,
    message         text NOT NULL,
    answer          text,
    tool_calls      jsonb NOT NULL DEFAULT '[]',
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id, conversation_id, turn)
);
COMMENT ON TABLE ctxguard.conversation_turns IS 'Chat turns, tenant- and user-scoped; written by ctxguard.save_turn.';
