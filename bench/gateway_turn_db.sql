-- The database work of one gateway turn with one tool call (page vendor_table, tool vendor.list),
-- statement for statement as gateway/src/db/mod.rs sends it: open_turn, call_tool and save_turn, each
-- its own transaction (keep the two in step when gateway/src/db/mod.rs changes). Diagnostic for bench/gateway_bench.sh: what the turn's database round trips
-- cost without HTTP, JSON or the model.
-- The gateway sends each transaction in one round trip (pipelined) and commits open_turn and
-- save_turn without waiting for the WAL flush (CTXGUARD_TURN_COMMIT=lazy). So does this script,
-- except open_turn, which it sends statement by statement: pgbench cannot \gset in a pipeline.
-- :token is a pgbench variable (-D token=...). A new conversation per turn, as when the gateway is
-- called without a conversationId; :conv doubles as the trace id.
\set conv random(1, 9000000000000000000)
-- open_turn (Db::transaction: set_context, the mint, PAGE_TOOLS; no history for a new conversation)
BEGIN;
SET LOCAL synchronous_commit TO off;
SELECT ctxguard.set_context(:token, '{"pageType": "vendor_table", "entity": null}', NULL, 'gwbench-' || :conv);
SELECT ctxguard.begin_generation('gwbench-' || :conv) AS gen, ctxguard.context(),
       (SELECT generation_ttl FROM ctxguard.effective_ttls()) \gset
SELECT pt.description, v.name, v.description, v.input_schema, v.read_only, v.danger,
       v.requires_approval, v.server
  FROM ctxguard.page_types pt
  LEFT JOIN LATERAL ctxguard.visible_tools('what vendors do I have?', 24) WITH ORDINALITY v ON true
 WHERE pt.name = ctxguard.page_type()
 ORDER BY v.ordinality;
COMMIT;
-- call_tool (Db::one: set_context with the generation, then the call)
\startpipeline
BEGIN;
SELECT ctxguard.set_context(:token, '{"pageType": "vendor_table", "entity": null}', :gen, 'gwbench-' || :conv);
SELECT ctxguard.call_tool('vendor.list', '{}');
COMMIT;
\endpipeline
-- save_turn (Db::one_with, lazy)
\startpipeline
BEGIN;
SET LOCAL synchronous_commit TO off;
SELECT ctxguard.set_context(:token, '{"pageType": "vendor_table", "entity": null}', :gen, 'gwbench-' || :conv);
SELECT ctxguard.save_turn('gwbench-' || :conv, 'what vendors do I have?', 'Here is what the tool returned.', '[{"id": "call_mock_0", "tool": "vendor.list", "arguments": {}, "decision": "allow", "code": null, "callId": null}]');
COMMIT;
\endpipeline
