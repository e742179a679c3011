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
    CHECK (entity_param IS NULL OR entity_type IS NOT NULL),
    CHECK (NOT requires_entity OR entity_type IS NOT NULL),
    CHECK (NOT (read_only AND danger = 'destructive'))
);
CREATE INDEX tool_policies_page_types_idx ON ctxguard.tool_policies USING gin (page_types);
COMMENT ON TABLE ctxguard.tool_policies IS 'Policy of each tool (written by ctxguard.register_tool, validated there).';
COMMENT ON COLUMN ctxguard.tool_policies.run_as IS 'Role a SQL tool''s handler runs as (policy run_as, or ctxguard.default_run_as at registration).';

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
    status     text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'approved')),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    used_at    timestamptz,
    page_type  text,
    entity_type text,
    entity_id  text
);
COMMENT ON TABLE ctxguard.approvals IS 'Pending requires_approval calls with their bound arguments and page entity; consumed exactly once by ctxguard.approve_call from a context on the same entity.';

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
    decision     text NOT NULL CHECK (decision IN ('allow', 'deny', 'pending', 'error', 'authorized')),
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
CREATE FUNCTION ctxguard._bump_catalog_version() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Once per transaction: a row version per statement made a transaction of 20,000 changes
    -- leave 20,000 versions for every next statement to scan.
    IF NOT ctxguard._catalog_written_here() THEN
        UPDATE ctxguard.catalog_version SET version = version OPERATOR(pg_catalog.+) 1;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER page_types_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.page_types
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
CREATE TRIGGER entity_types_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.entity_types
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
CREATE TRIGGER tools_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.tools
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
CREATE TRIGGER tool_policies_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.tool_policies
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();

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
