-- One pass over every SQL entry point the gateway role can execute, each call armed (see
-- lib/attack.sql). Included by 08_owner_sql.sql once per hostile session setup.
-- psql variables: variant (a label), tok (an ap_clerk's token in acme), inv (an acme invoice that is
-- not paid yet; its mark_paid is approved here), conv (a conversation id).
\set detail '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "' :inv '"}}'
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'

-- Positive control: the caller's own SQL does resolve to the shadows (a type, or a function on the
-- path), so the probe is alive and counting in this setup.
SELECT pg_temp.attack(:'variant' || ' control', $$SELECT '00000000-0000-4000-8000-000000000001'::uuid, now()$$) AS r \gset
SELECT ok((:'r'::jsonb->>'hits')::int > 0 AND (:'r'::jsonb->>'foreign')::int = 0, :'variant' || ' control: the caller''s own SQL runs its shadows, as itself');

-- The armed statements name no type, function or operator that the caller's path could resolve.
SELECT pg_temp.attack(:'variant' || ' call_tool without context', $$SELECT ctxguard.call_tool('invoice.get', '{}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' call_tool without context: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'CONTEXT_MISSING', :'variant' || ' call_tool without context: CONTEXT_MISSING');
SELECT pg_temp.attack(:'variant' || ' approve_call without context', $$SELECT ctxguard.approve_call('00000000-0000-4000-8000-0000000000ff')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' approve_call without context: no caller object ran');

BEGIN;
SELECT pg_temp.attack(:'variant' || ' set_context', format('SELECT ctxguard.set_context(%L, %L)', :'tok', :'detail')) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' set_context: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'ok', :'variant' || ' set_context: accepted');
SELECT pg_temp.attack(:'variant' || ' begin_generation', format('SELECT ctxguard.begin_generation(%L)', :'conv')) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' begin_generation: no caller object ran');
SELECT :'r'::jsonb->>'value' AS gen \gset
SELECT ok(:'gen' ~ '^[0-9a-f-]{36}$', :'variant' || ' begin_generation: a generation id');
SELECT pg_temp.attack(:'variant' || ' set_context with generation', format('SELECT ctxguard.set_context(%L, %L, %L, %L)', :'tok', :'detail', :'gen', 'trace-' || :'variant')) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' set_context with generation: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'ok', :'variant' || ' set_context with generation: accepted');
SELECT pg_temp.attack(:'variant' || ' readers', $$SELECT pg_catalog.concat_ws('|', ctxguard.tenant_id(), ctxguard.user_id(), ctxguard.page_type(),
    ctxguard.entity_type(), ctxguard.entity_id(), ctxguard.generation(), ctxguard.has_role('ap_clerk'), ctxguard.roles(), ctxguard.context() IS NOT NULL)$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' readers: no caller object ran');
SELECT is(:'r'::jsonb->>'value', concat_ws('|', 'acme', 'alice', 'invoice_detail', 'invoice', :'inv', :'gen', 't', '{ap_clerk}', 't'),
          :'variant' || ' readers: the context as set');
SELECT pg_temp.attack(:'variant' || ' visible_tools', $$SELECT name FROM ctxguard.visible_tools('mark this invoice as paid', 1)$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' visible_tools: no caller object ran');
SELECT is(:'r'::jsonb->>'value', 'invoice.mark_paid', :'variant' || ' visible_tools: ranked as usual');
SELECT pg_temp.attack(:'variant' || ' explain_tools', $$SELECT reason FROM ctxguard.explain_tools() WHERE name OPERATOR(pg_catalog.=) 'invoice.list'$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' explain_tools: no caller object ran');
SELECT is(:'r'::jsonb->>'value', 'wrong_page', :'variant' || ' explain_tools: reasons as usual');
SELECT pg_temp.attack(:'variant' || ' find_tools', $$SELECT pg_catalog.string_agg(name OPERATOR(pg_catalog.||) '@' OPERATOR(pg_catalog.||) namespace, ',')
    FROM ctxguard.find_tools('mark this invoice as paid', 1)$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' find_tools: no caller object ran');
SELECT is(:'r'::jsonb->>'value', 'invoice.mark_paid@invoice', :'variant' || ' find_tools: found as usual');
SELECT pg_temp.attack(:'variant' || ' visible_namespaces', $$SELECT pg_catalog.string_agg(namespace OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) tools::pg_catalog.text
    OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) CASE WHEN description IS NULL THEN '-' ELSE description END, ',' ORDER BY namespace)
    FROM ctxguard.visible_namespaces() WHERE namespace OPERATOR(pg_catalog.=) ANY ('{invoice,up,ghost,legacy,nslab}'::pg_catalog.text[])$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' visible_namespaces: no caller object ran');
SELECT is(:'r'::jsonb->>'value', 'invoice:2:-,up:1:Echo service', :'variant' || ' visible_namespaces: counted as usual');
SELECT pg_temp.attack(:'variant' || ' usable_mcp_servers', $$SELECT pg_catalog.count(*) FROM ctxguard.usable_mcp_servers()$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' usable_mcp_servers: no caller object ran');

SELECT pg_temp.attack(:'variant' || ' call_tool sql tool', $$SELECT ctxguard.call_tool('invoice.get', '{}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' call_tool sql tool: no caller object ran');
SELECT is(pg_temp.val(:'r')->'result'->>'id', :'inv', :'variant' || ' call_tool sql tool: the page''s invoice');
SELECT pg_temp.attack(:'variant' || ' call_tool denied', $$SELECT ctxguard.call_tool('invoice.list', '{}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' call_tool denied: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'TOOL_NOT_VISIBLE', :'variant' || ' call_tool denied: TOOL_NOT_VISIBLE');
SELECT pg_temp.attack(:'variant' || ' call_tool entity mismatch', $$SELECT ctxguard.call_tool('invoice.get', '{"invoice_id": "glx_inv3"}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' call_tool entity mismatch: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'ENTITY_MISMATCH', :'variant' || ' call_tool entity mismatch: ENTITY_MISMATCH');
SELECT pg_temp.attack(:'variant' || ' call_tool invalid argument', $$SELECT ctxguard.call_tool('invoice.get', '{"zz": 1}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' call_tool invalid argument: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'INVALID_ARGUMENT', :'variant' || ' call_tool invalid argument: INVALID_ARGUMENT');
SELECT pg_temp.attack(:'variant' || ' call_tool unknown tool', $$SELECT ctxguard.call_tool('no.such_tool', '{}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' call_tool unknown tool: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'TOOL_NOT_FOUND', :'variant' || ' call_tool unknown tool: TOOL_NOT_FOUND');

SELECT pg_temp.attack(:'variant' || ' call_tool needing approval', $$SELECT ctxguard.call_tool('invoice.mark_paid', '{}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' call_tool needing approval: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'APPROVAL_REQUIRED', :'variant' || ' call_tool needing approval: APPROVAL_REQUIRED');
SELECT pg_temp.val(:'r')->>'call_id' AS cid \gset
SELECT pg_temp.attack(:'variant' || ' approve_call', format('SELECT ctxguard.approve_call(%L)', :'cid')) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' approve_call: no caller object ran');
SELECT is(pg_temp.val(:'r')->'result', jsonb_build_object('invoice_id', :'inv', 'updated', 1), :'variant' || ' approve_call: ran once, on the page''s invoice');

SELECT pg_temp.attack(:'variant' || ' call_tool external', $$SELECT ctxguard.call_tool('up.echo', '{"text": "hello"}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' call_tool external: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'authorized', :'variant' || ' call_tool external: authorized');
SELECT pg_temp.val(:'r')->>'call_id' AS xid \gset
SELECT pg_temp.attack(:'variant' || ' complete_call', format('SELECT ctxguard.complete_call(%L, %L)', :'xid',
    '{"content": [{"type": "text", "text": "card 4111 1111 1111 1111"}]}')) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' complete_call: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'ok', :'variant' || ' complete_call: ok');
SELECT unalike(:'r'::jsonb->>'value', '%4111 1111%', :'variant' || ' complete_call: masked');

SELECT pg_temp.attack(:'variant' || ' set_context viewer', format('SELECT ctxguard.set_context(%L, %L, %L, %L)', :'tok', :'viewer', :'gen', 'trace-' || :'variant')) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' set_context viewer: no caller object ran');
SELECT pg_temp.attack(:'variant' || ' read_doc_metadata', $$SELECT ctxguard.call_tool('read_doc_metadata', '{}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' read_doc_metadata: no caller object ran');
SELECT is(pg_temp.val(:'r')->'result'->>'page_count', '500', :'variant' || ' read_doc_metadata: page count');
SELECT pg_temp.attack(:'variant' || ' read_doc_pages', $$SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 42}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' read_doc_pages: no caller object ran');
SELECT is(jsonb_array_length(pg_temp.val(:'r')->'result'->'pages'), 2, :'variant' || ' read_doc_pages: two pages');
SELECT unalike(pg_temp.val(:'r')->'result'->>'pages', '%Confidential%', :'variant' || ' read_doc_pages: header stripped');
SELECT pg_temp.attack(:'variant' || ' read_doc_section', $$SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' read_doc_section: no caller object ran');
SELECT is(pg_temp.val(:'r')->'result'->>'page_end', '3', :'variant' || ' read_doc_section: its pages');
SELECT pg_temp.attack(:'variant' || ' doc_local_search', $$SELECT ctxguard.call_tool('doc_local_search', '{"query": "certificate rotation"}')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' doc_local_search: no caller object ran');
SELECT is(pg_temp.val(:'r')->'result'->>'matched', 'all_words', :'variant' || ' doc_local_search: english stemming, all words');
SELECT ok(jsonb_array_length(pg_temp.val(:'r')->'result'->'results') > 0, :'variant' || ' doc_local_search: finds pages');

SELECT pg_temp.attack(:'variant' || ' save_turn', format('SELECT ctxguard.save_turn(%L, %L, %L)', :'conv', 'hello', 'world')) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' save_turn: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), 'ok', :'variant' || ' save_turn: saved');
SELECT pg_temp.attack(:'variant' || ' verify_token', format('SELECT ctxguard.verify_token(%L)', :'tok')) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' verify_token: no caller object ran');
-- mask_text is a DBA's tool (issue 12): refused before anything runs.
SELECT pg_temp.attack(:'variant' || ' mask_text', $$SELECT ctxguard.mask_text('mail ops@acme.example')$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' mask_text: no caller object ran');
SELECT is(pg_temp.outcome(:'r'), '42501', :'variant' || ' mask_text: not executable by the gateway role');
SELECT pg_temp.attack(:'variant' || ' lint', $$SELECT pg_catalog.count(*) FROM ctxguard.lint()$$) AS r \gset
SELECT is(pg_temp.ran(:'r'), '0/0', :'variant' || ' lint: no caller object ran');
COMMIT;

-- What ctxguard wrote as its owner is right: every call of the generation audited once, for alice
-- in acme, with the page's entity and trace; the turn carries the generation.
BEGIN;
SELECT ctxguard.set_context(:'tok', '{"pageType": "invoice_table"}') \g /dev/null
SELECT set_eq(format($$SELECT tool, decision, coalesce(code, '') FROM ctxguard.audit_log WHERE generation = %L AND code IS DISTINCT FROM 'TOOL_NOT_FOUND'$$, :'gen'),
              $$VALUES ('invoice.get', 'allow', ''), ('invoice.list', 'deny', 'TOOL_NOT_VISIBLE'), ('invoice.get', 'deny', 'ENTITY_MISMATCH'),
                       ('invoice.get', 'deny', 'INVALID_ARGUMENT'), ('invoice.mark_paid', 'pending', 'APPROVAL_REQUIRED'),
                       ('invoice.mark_paid', 'allow', ''), ('up.echo', 'authorized', ''), ('up.echo', 'allow', ''),
                       ('read_doc_metadata', 'allow', ''), ('read_doc_pages', 'allow', ''), ('read_doc_section', 'allow', ''),
                       ('doc_local_search', 'allow', '')$$,
              :'variant' || ' audit: each decision recorded as usual');
SELECT is((SELECT count(*)::int FROM ctxguard.audit_log WHERE generation = :'gen'
             AND (tenant_id <> 'acme' OR user_id <> 'alice' OR trace_id <> 'trace-' || :'variant')), 0,
          :'variant' || ' audit: tenant, user and trace as in the context');
SELECT ok((SELECT bool_and(at BETWEEN now() - interval '10 minutes' AND now() + interval '1 minute') FROM ctxguard.audit_log WHERE generation = :'gen'),
          :'variant' || ' audit: timestamps are the real time whatever TimeZone says');
SELECT is((SELECT count(*)::int FROM ctxguard.conversation_turns WHERE conversation_id = :'conv' AND generation = :'gen'::uuid), 1,
          :'variant' || ' save_turn: one turn, with the generation');
COMMIT;
