-- ctxguard_pipelined.sql with the gateway's transaction start (gateway/src/db/sql.rs `begin`, issue 29):
-- BEGIN with its isolation and access mode, SET LOCAL statement_timeout, SET LOCAL ROLE NONE, then every
-- other pinned setting by one call of ctxguard.pin_settings, pipelined with the rest as the gateway sends it.
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;
SET LOCAL statement_timeout TO 15000;
SET LOCAL ROLE NONE;
SELECT ctxguard.pin_settings($ctxguard_pins${"lock_timeout","5s","idle_in_transaction_session_timeout","15s","log_parameter_max_length_on_error","0","search_path","pg_catalog, pg_temp","row_security","on","default_transaction_read_only","off","default_transaction_isolation","read committed","synchronous_commit","on","debug_print_parse","off","debug_print_rewritten","off","debug_print_plan","off","client_min_messages","warning","jit","off","max_parallel_workers_per_gather","0","standard_conforming_strings","on","transform_null_equals","off","array_nulls","on","exit_on_error","off","quote_all_identifiers","off","TimeZone","UTC","DateStyle","ISO, YMD","IntervalStyle","postgres","extra_float_digits","1","bytea_output","hex","default_text_search_config","pg_catalog.english","transaction_timeout","0","force_parallel_mode","off","debug_parallel_query","off","restrict_nonsystem_relation_kind",""}$ctxguard_pins$::pg_catalog.text[]);
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT count(*) FROM ctxguard.visible_tools();
SELECT ctxguard.call_tool('invoice.get', '{}');
COMMIT;
\endpipeline
