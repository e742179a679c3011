-- ctxguard.pin_settings (issue 34): the gateway's transaction frame pins its settings with one call
-- (gateway/src/db/sql.rs `begin`) instead of a SELECT of set_config over a VALUES list. It must do
-- what that statement did: set for the transaction each setting that differs, skip one this server
-- does not know, and grant nothing the caller could not do with set_config itself.
-- Runs as ctxguard_gateway.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

SET lock_timeout = '7777';
BEGIN;
SET LOCAL jit = on;
SET LOCAL extra_float_digits = 3;
SELECT is(ctxguard.pin_settings('{lock_timeout,5000,jit,off,extra_float_digits,1,ctxguard_test.no_such_setting,1,row_security,on}'),
          3, 'the three that differ are set (an unknown setting is skipped, one that holds is left)');
SELECT is(pg_catalog.current_setting('lock_timeout'), '5s', 'lock_timeout pinned');
SELECT is(pg_catalog.current_setting('jit'), 'off', 'jit pinned');
SELECT is(pg_catalog.current_setting('extra_float_digits'), '1', 'extra_float_digits pinned');
SELECT is(pg_catalog.current_setting('ctxguard_test.no_such_setting', true), NULL, 'an unknown setting is not made');
SELECT is(ctxguard.pin_settings('{lock_timeout,5s,jit,off,extra_float_digits,1}'), 0,
          'again in the same transaction: all hold (as current_setting shows them), none set');
SELECT is(ctxguard.pin_settings('{lock_timeout,5000}'), 1,
          'a value compared as current_setting shows it, as the frame''s statement compared it: 5000 is not 5s, set again');
COMMIT;
SELECT is(pg_catalog.current_setting('lock_timeout'), '7777ms', 'for the transaction only: the session''s own value is back');

-- Refused with 22023, before anything is set: not pairs, too many, NULLs.
BEGIN;
SELECT throws_ok($$SELECT ctxguard.pin_settings('{lock_timeout}')$$, '22023', NULL, 'an odd number of elements');
SELECT throws_ok($$SELECT ctxguard.pin_settings(NULL)$$, '22023', NULL, 'NULL');
SELECT throws_ok($$SELECT ctxguard.pin_settings('{lock_timeout,NULL}')$$, '22023', NULL, 'a NULL value');
SELECT throws_ok($$SELECT ctxguard.pin_settings(pg_catalog.array_fill('jit'::text, ARRAY[258]))$$, '22023', NULL,
                 'more than 256 elements');
COMMIT;

-- Grants nothing: a setting only a superuser may set is refused as set_config refuses it.
BEGIN;
SELECT throws_ok($$SELECT ctxguard.pin_settings('{log_parameter_max_length,0}')$$, '42501', NULL,
                 'a superuser''s setting stays a superuser''s');
SELECT throws_ok($$SELECT pg_catalog.set_config('log_parameter_max_length', '0', true)$$, '42501', NULL,
                 'positive control: set_config refuses it too');
COMMIT;

SELECT * FROM finish();
