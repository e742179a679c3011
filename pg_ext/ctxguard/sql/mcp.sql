-- Upstream MCP servers (seed 002): the registry, per-server grants, and external tools.
-- Secrets never live here: `bearer_token_env` names an environment variable of the gateway.

CREATE TABLE ctxguard.mcp_servers (
    name             text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_-]{0,31}$'),
    transport        text NOT NULL CHECK (transport IN ('http', 'stdio')),
    url              text CHECK (url ~ '^https?://'),
    command          text,
    args             text[] NOT NULL DEFAULT '{}',
    env              jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(env) = 'object'),
    cwd              text,
    headers          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    bearer_token_env text CHECK (bearer_token_env ~ '^[A-Za-z_][A-Za-z0-9_]*$'),
    description      text NOT NULL DEFAULT '',
    default_access   text NOT NULL DEFAULT 'deny' CHECK (default_access IN ('allow', 'deny')),
    enabled          boolean NOT NULL DEFAULT true,
    default_policy   jsonb,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    max_tools        integer NOT NULL DEFAULT 200 CHECK (max_tools BETWEEN 1 AND 10000),
    CHECK (CASE transport WHEN 'http' THEN url IS NOT NULL AND command IS NULL
                          ELSE command IS NOT NULL AND url IS NULL END)
);
COMMENT ON TABLE ctxguard.mcp_servers IS 'Upstream MCP servers the gateway may connect to. default_policy (set by ctxguard.set_server_policy) applies to each of the server''s tools without a policy of its own.';

CREATE TABLE ctxguard.mcp_server_grants (
    server     text NOT NULL REFERENCES ctxguard.mcp_servers (name) ON DELETE CASCADE ON UPDATE CASCADE,
    tenant_id  text,
    principal  text NOT NULL CHECK (principal ~ '^(user|role):[!-~]{1,128}$'),
    access     text NOT NULL CHECK (access IN ('allow', 'deny')),
    UNIQUE NULLS NOT DISTINCT (server, tenant_id, principal)
);
COMMENT ON TABLE ctxguard.mcp_server_grants IS 'Per-server allow/deny for a user (''user:<id>'') or a role (''role:<name>''), optionally in one tenant. Deny wins; the admin role (ctxguard.mcp_admin_role) sees every enabled server.';

ALTER TABLE ctxguard.tools
    ADD COLUMN server text REFERENCES ctxguard.mcp_servers (name) ON DELETE CASCADE,
    ADD COLUMN upstream_name text,
    ADD COLUMN present boolean NOT NULL DEFAULT true,
    ADD COLUMN definition_hash text,
    ADD COLUMN accepted_hash text,
    ADD CONSTRAINT tools_external_has_server CHECK ((kind = 'external') = (server IS NOT NULL AND upstream_name IS NOT NULL)),
    ADD CONSTRAINT tools_external_namespaced CHECK (server IS NULL OR starts_with(name, server || '.'));
CREATE INDEX tools_server_idx ON ctxguard.tools (server) WHERE server IS NOT NULL;
COMMENT ON COLUMN ctxguard.tools.present IS 'false: the upstream server no longer lists this tool (hidden and uncallable; its policy is kept).';
COMMENT ON COLUMN ctxguard.tools.accepted_hash IS 'Definition hash the DBA accepted (first sync, or ctxguard.accept_mcp_tool); a different definition_hash disables the tool.';

-- Tools: an optional title, and names unique as MCP and model clients see them ('.' sent as '__').
ALTER TABLE ctxguard.tools
    ADD COLUMN title text CHECK (title IS NULL OR (length(title) BETWEEN 1 AND 128 AND title !~ '[[:cntrl:]]'));
COMMENT ON COLUMN ctxguard.tools.title IS 'Title MCP clients show (register_tool''s title); NULL: a readable form of the name.';
CREATE UNIQUE INDEX tools_wire_name_key ON ctxguard.tools ((pg_catalog.replace(name, '.', '__')));

-- Upstream calls authorized by Gate B and not yet completed: complete_call consumes one exactly once.
CREATE TABLE ctxguard.external_calls (
    call_id     uuid PRIMARY KEY,
    tenant_id   text NOT NULL,
    user_id     text NOT NULL,
    tool        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    completed_at timestamptz
);
COMMENT ON TABLE ctxguard.external_calls IS 'Authorized upstream MCP calls awaiting ctxguard.complete_call (owner only).';

CREATE TRIGGER mcp_servers_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.mcp_servers
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
CREATE TRIGGER mcp_server_grants_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.mcp_server_grants
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();

