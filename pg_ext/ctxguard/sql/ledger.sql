-- The ledger (issue 13): charges live in shared memory and reach these tables through the audit
-- writer, a background worker per database; nothing here is written in a caller's transaction.

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
