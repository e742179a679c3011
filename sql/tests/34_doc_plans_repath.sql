-- The document tools' kept plans stay the planner's own when PostgreSQL makes them again on its own
-- accord (issue 34; see 34_doc_plans_pinned.sql for the first plan). A kept plan is made again when
-- the plan cache finds it stale once inside (`GetCachedPlan`): an invalidation another backend sent,
-- taken in with the plan's locks, or the session's search path changed since the plan was made.
-- ctxguard pins the search path's text, but what it means grows when the session's temporary
-- schema comes into use: a session's first temporary object, after the plans were made, made
-- PostgreSQL plan the statements again under that session's settings, and the plan it kept served
-- every next client of the backend. Such a plan is now dropped and made again with the planner's
-- own settings.
--
-- Here the plans are made by a first call before this session has any temporary object (pgTAP's
-- own come after it), then a client with hostile planner settings creates one (a sequence: it
-- touches no cache that resets every plan) and calls, then the next client's reads are counted
-- (pg_stat_get_xact_tuples_returned, not time).
-- Runs as ctxguard_gateway; each file of the suite is a backend of its own.
\set QUIET 1
SET client_min_messages = warning;
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'

-- The first calls, with the defaults and no temporary object: the plans are made.
BEGIN;
\set gen test-34-repath-1
\set p first_
\ir lib/doc_plans_calls.sql
COMMIT;

-- A client with hostile planner settings and its first temporary object.
BEGIN;
\ir lib/doc_plans_hostile.sql
CREATE TEMPORARY SEQUENCE test_34_repath;
\set gen test-34-repath-2
\set p hostile_
\ir lib/doc_plans_calls.sql
COMMIT;

SELECT * FROM no_plan();
-- The next client, with the defaults.
BEGIN;
\set gen test-34-repath-3
\set p next_
\ir lib/doc_plans_calls.sql
COMMIT;

\ir lib/doc_plans_checks.sql
SELECT is(:'first_hits'::jsonb->'result'->'results', :'next_hits'::jsonb->'result'->'results', 'the search: the same results as the first client''s');
SELECT is(:'first_pages'::jsonb->'result', :'next_pages'::jsonb->'result', 'read_doc_pages: the same pages as the first client''s');

SELECT * FROM finish();
