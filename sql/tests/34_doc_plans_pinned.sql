-- The document tools' kept plans are not the caller's to shape (issue 34). The search's candidates,
-- read_doc_pages' range and read_doc_section's batches run on one generic plan, made at a backend's
-- first call and kept for its life: through a pooler, for every later client of that server
-- connection, whatever tenant. Planner settings are any role's to set (and a pooled connection
-- keeps them for its next client). Made under a session's hostile settings (no index scans, page
-- reads a million times dearer), the plan read every page of the table for each of the search's
-- 100 candidates, for every next client of the backend. The plans are now made with the planner's
-- own settings whatever the session's; a session that slows planning (`plan_cache_mode`) or JIT
-- still pays only for its own calls.
--
-- Here the first calls of this backend run under such settings; then, as the next client of the
-- backend would, with the defaults, the entries the calls' scans of ctxguard.document_pages and its
-- indexes return are counted (pg_stat_get_xact_tuples_returned, not time).
-- Runs as ctxguard_gateway; each file of the suite is a backend of its own.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'

-- The first client: hostile planner settings, then one call of each tool.
BEGIN;
\ir lib/doc_plans_hostile.sql
\set gen test-34-pinned-1
\set p hostile_
\ir lib/doc_plans_calls.sql
COMMIT;

-- The next client, with the defaults.
BEGIN;
\set gen test-34-pinned-2
\set p next_
\ir lib/doc_plans_calls.sql
COMMIT;

\ir lib/doc_plans_checks.sql

SELECT * FROM finish();
