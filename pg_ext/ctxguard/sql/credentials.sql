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
