-- ctxguard_pipelined.sql with the gateway's transaction start (gateway/src/sql.rs `begin`, issue 29):
-- BEGIN with its isolation and access mode, SET LOCAL statement_timeout, then every other pinned
-- setting by set_config(..., true) in one SELECT, pipelined with the rest as the gateway sends it.
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;
SET LOCAL statement_timeout TO 15000;
SELECT pg_catalog.set_config(v.n, v.v, true) FROM (VALUES ('lock_timeout', '5000', false), ('idle_in_transaction_session_timeout', '15000', false), ('log_parameter_max_length_on_error', '0', false), ('search_path', 'pg_catalog, pg_temp', false), ('role', 'none', false), ('row_security', 'on', false), ('default_transaction_read_only', 'off', false), ('default_transaction_isolation', 'read committed', false), ('synchronous_commit', 'on', false), ('debug_print_parse', 'off', false), ('debug_print_rewritten', 'off', false), ('debug_print_plan', 'off', false), ('client_min_messages', 'warning', false), ('jit', 'off', false), ('max_parallel_workers_per_gather', '0', false), ('standard_conforming_strings', 'on', false), ('transform_null_equals', 'off', false), ('array_nulls', 'on', false), ('TimeZone', 'UTC', false), ('DateStyle', 'ISO, YMD', false), ('IntervalStyle', 'postgres', false), ('extra_float_digits', '1', false), ('bytea_output', 'hex', false), ('default_text_search_config', 'pg_catalog.english', false), ('transaction_timeout', '0', true), ('force_parallel_mode', 'off', true), ('debug_parallel_query', 'off', true)) v(n, v, optional) WHERE NOT v.optional OR pg_catalog.current_setting(v.n, true) IS NOT NULL;
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT count(*) FROM ctxguard.visible_tools();
SELECT ctxguard.call_tool('invoice.get', '{}');
COMMIT;
\endpipeline
