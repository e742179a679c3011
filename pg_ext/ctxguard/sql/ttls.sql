-- Lifetimes per tenant (issue 17): of a generation, a pending approval and an authorized upstream
-- call; NULL uses the setting. Added after the ledger's column, as ctxguard--0.1.0--0.2.0.sql adds
-- them, so that an updated and a fresh install list the columns in the same order.
ALTER TABLE ctxguard.tenant_limits
    ADD COLUMN generation_ttl integer CHECK (generation_ttl BETWEEN 2 AND 86400),
    ADD COLUMN approval_ttl integer CHECK (approval_ttl BETWEEN 10 AND 86400),
    ADD COLUMN external_call_ttl integer CHECK (external_call_ttl BETWEEN 5 AND 3600);
COMMENT ON TABLE ctxguard.tenant_limits IS 'Optional per-tenant overrides of the ctxguard.max_* and ctxguard.*_ttl settings (NULL = use the setting).';
