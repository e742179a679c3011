-- SECURITY_MATRIX H.48 (issue 11 §1): the caller's session is hostile. Runs as ctxguard_gateway,
-- which may CREATE in schema `attacker` (fixtures) and has TEMP on the database.
-- Every SQL entry point the gateway role can execute is called with the caller's objects in the way:
-- domains with CHECK probes under the names of pg_catalog's types, relations named like ctxguard's,
-- functions and operators in a schema on the path, and odd settings. ctxguard's own SQL must run none
-- of them (a probe that ran as the owner would make this role a superuser), and every result and
-- audit row must be what it is in a friendly session.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
SELECT ok(NOT rolsuper, 'the session starts as a non-superuser') FROM pg_roles WHERE rolname = session_user;

\set attacker attacker
\ir lib/attack.sql
SELECT is((SELECT count(*)::int FROM pg_type WHERE typnamespace = pg_my_temp_schema() AND typtype = 'd'), 29, 'the type shadows exist');

-- V1: the type and relation shadows with the default path (pg_temp is searched first for types and
-- relations when the path does not name it), and settings far from ctxguard's.
SET TimeZone = 'Pacific/Kiritimati';
SET DateStyle = 'SQL, DMY';
SET IntervalStyle = 'sql_standard';
SET default_text_search_config = 'pg_catalog.simple';
SET extra_float_digits = -15;
SET transform_null_equals = on;
SET bytea_output = 'escape';
\set variant V1
\set tok :tok_alice
\set inv acme_inv2
\set conv conv-owner-v1
\ir lib/owner_matrix.sql

-- V2: pg_temp named first, the attacker's functions and operators before pg_catalog.
SET search_path = pg_temp, attacker, public, pg_catalog;
SET TimeZone = 'Etc/GMT+12';
SET DateStyle = 'German';
SET IntervalStyle = 'iso_8601';
SET default_text_search_config = 'pg_catalog.german';
\set variant V2
\set inv acme_inv5
\set conv conv-owner-v2
\ir lib/owner_matrix.sql

-- V3: the attacker's schema first and pg_temp last (only functions and operators shadow), in
-- serializable transactions.
SET search_path = attacker, pg_catalog, public, pg_temp;
SET default_transaction_isolation = 'serializable';
SET TimeZone = 'America/St_Johns';
SET DateStyle = 'Postgres, MDY';
SET IntervalStyle = 'postgres_verbose';
\set variant V3
\set inv acme_inv8
\set conv conv-owner-v3
\ir lib/owner_matrix.sql

RESET search_path;
RESET default_transaction_isolation;
SELECT is(pg_temp.seq('pg_temp.probe_foreign'), 0::bigint, 'no caller object ever ran as another role (owner, run_as role)');
SELECT is_empty('SELECT DISTINCT label, tag, cur FROM pg_temp.probe_log WHERE cur <> sess', 'the probe log names no other role');
SELECT is((SELECT count(*)::int FROM pg_temp.probe_log WHERE label NOT LIKE '% control'), 0, 'no caller object ran at all inside any ctxguard entry point');
SELECT ok(NOT rolsuper AND NOT rolbypassrls, 'the session''s role is still NOSUPERUSER NOBYPASSRLS') FROM pg_roles WHERE rolname = session_user;

SELECT * FROM finish();
