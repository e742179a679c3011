-- ctxguard_pipelined.sql with the gateway's transaction start (gateway/src/sql.rs PINS, issue 29):
-- BEGIN with its isolation and access mode, then every pinned setting with SET LOCAL. The gateway
-- sends these as one simple-query message; pgbench prepares each, pipelined, so this costs at
-- least what the gateway's pins cost.
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;
SET LOCAL statement_timeout TO 30000;
SET LOCAL lock_timeout TO 5000;
SET LOCAL idle_in_transaction_session_timeout TO 30000;
SET LOCAL log_parameter_max_length_on_error TO 0;
SET LOCAL search_path TO pg_catalog, pg_temp;
SET LOCAL role TO none;
SET LOCAL row_security TO on;
SET LOCAL default_transaction_read_only TO off;
SET LOCAL default_transaction_isolation TO 'read committed';
SET LOCAL synchronous_commit TO on;
SET LOCAL debug_print_parse TO off;
SET LOCAL debug_print_rewritten TO off;
SET LOCAL debug_print_plan TO off;
SET LOCAL client_min_messages TO warning;
SET LOCAL jit TO off;
SET LOCAL max_parallel_workers_per_gather TO 0;
SET LOCAL standard_conforming_strings TO on;
SET LOCAL transform_null_equals TO off;
SET LOCAL array_nulls TO on;
SET LOCAL TimeZone TO UTC;
SET LOCAL DateStyle TO 'ISO, YMD';
SET LOCAL IntervalStyle TO postgres;
SET LOCAL extra_float_digits TO 1;
SET LOCAL bytea_output TO hex;
SET LOCAL default_text_search_config TO 'pg_catalog.english';
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT count(*) FROM ctxguard.visible_tools();
SELECT ctxguard.call_tool('invoice.get', '{}');
COMMIT;
\endpipeline
