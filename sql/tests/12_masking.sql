-- Masking that markers cannot split, that covers every JSON value, and that stays bounded
-- (issue 12 §1, §2, §3, §5, §6; SECURITY_MATRIX J.56, J.57, J.59). Runs as ctxguard_gateway against
-- the fixture document mask_secrets (sql/tests/fixtures.sql): one secret of each built-in rule per
-- page, in forms whose parts a search query hits.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set library '{"pageType": "document_library"}'
\set lab '{"pageType": "mask_lab"}'
CREATE FUNCTION pg_temp.code(env jsonb) RETURNS text LANGUAGE sql AS $$ SELECT coalesce(env->'error'->>'code', env->>'status') $$;
CREATE FUNCTION pg_temp.gen(tok text, page jsonb) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE g uuid;
BEGIN
    PERFORM ctxguard.set_context(tok, page);
    g := ctxguard.begin_generation('masking');
    PERFORM ctxguard.set_context(tok, page, g);
    RETURN g;
END $$;

-- J.56 Every built-in rule, searched with a query that hits part of the secret: the snippet's
-- highlight markers never split a secret past the rules (`card 4111` gave `«4111» 1111 1111 1111`).
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'library') \g /dev/null
CREATE TEMP TABLE hits AS
SELECT rule, query, forbidden,
       ctxguard.call_tool('doc_local_search', jsonb_build_object('doc_id', 'mask_secrets', 'query', query)) AS r
  FROM (VALUES
    ('card_number', 'card 4111', ARRAY['4111', '1111']),
    ('iban', '3704', ARRAY['DE89', '3704', '0044', '0532', '0130']),
    ('phone', 'hotline 1234', ARRAY['+49', '1234', '5678']),
    ('email', 'escalations example', ARRAY['ivan', '(at)']),
    ('aws_access_key', 'iosf', ARRAY['AKIA', 'IOSF', 'ODNN', '7EXA', 'MPLE']),
    ('openai_key', 'paste proj', ARRAY['sk-proj', 'abcdefghijklmnopqrstuvwx']),
    ('jwt', 'session NryP4J3jVmNHl0w5N', ARRAY['eyJ', 'dozjg', 'NryP4J3jVmNHl0w5N', 'XgL0n3I9']),
    ('bearer_token', 'authorization bearer', ARRAY['abcdefghijklmnop', '1234567890'])
  ) AS v(rule, query, forbidden);
SELECT is(pg_temp.code(r), 'ok', rule || ': the search runs') FROM hits ORDER BY rule;
SELECT ok(jsonb_array_length(r->'result'->'results') > 0, rule || ': the query finds the page') FROM hits ORDER BY rule;
SELECT ok(strpos(r::text, '[REDACTED:' || rule) > 0, rule || ': the snippet shows the secret masked (' || (r->'result'->'results'->0->>'snippet') || ')')
  FROM hits ORDER BY rule;
-- (Not the random call_id: '1111' turns up in one uuid in about 2,000.)
SELECT is(ARRAY(SELECT f FROM unnest(forbidden) f WHERE strpos((r - 'call_id')::text, f) > 0), '{}'::text[],
          rule || ': no part of the secret is returned, marked or not')
  FROM hits ORDER BY rule;
SELECT ok(strpos(r::text, 'REDACTED:«') = 0 AND strpos(r::text, '«REDACTED') = 0, rule || ': no highlight inside a placeholder')
  FROM hits ORDER BY rule;
SELECT ok(bool_or(strpos(r->'result'->'results'->0->>'snippet', '«') > 0), 'positive control: snippets still mark the query words') FROM hits;
SELECT is((SELECT masked FROM ctxguard.audit_log WHERE call_id = (SELECT (r->>'call_id')::uuid FROM hits WHERE rule = 'card_number')),
          '{"card_number": 1}'::jsonb, 'the audit row counts the masked card once (the page, not the snippet again)');
COMMIT;

-- J.56 Budget cuts come after masking: a cut that falls inside a card number returns neither part.
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'library') \g /dev/null
SELECT ctxguard.call_tool('read_doc_section', '{"doc_id": "mask_secrets", "section_id": "long"}') AS sec \gset
SELECT is(:'sec'::jsonb->'result'->>'trimmed', 'section_tokens', 'read_doc_section: the section is cut (at ~8000 bytes, inside the card number)');
SELECT ok(strpos(:'sec'::jsonb::text, '4111') = 0 AND strpos(:'sec'::jsonb::text, '1111') = 0, 'read_doc_section: no digits of the card before the cut');
COMMIT;
BEGIN;
SELECT pg_temp.gen(:'tok_alice', :'library') \g /dev/null
SELECT ctxguard.call_tool('read_doc_pages', '{"doc_id": "mask_secrets", "page_start": 10, "page_end": 10}') AS pg10 \gset
SELECT is(:'pg10'::jsonb->'result'->>'trimmed', 'bytes_per_generation', 'read_doc_pages: the page is cut by the byte budget (inside the card number)');
SELECT ok(strpos(:'pg10'::jsonb::text, '4111') = 0 AND strpos(:'pg10'::jsonb::text, '1111') = 0, 'read_doc_pages: no digits of the card before the cut');
COMMIT;

-- J.56 Object keys and numbers: a handler's result and an upstream result
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT ctxguard.call_tool('test.secret_shapes', '{}') AS shapes \gset
SELECT is(:'shapes'::jsonb->'result',
          '{"[REDACTED:email]": {"card": "[REDACTED:card_number]", "iban [REDACTED:iban]": ["[REDACTED:card_number]", 42]},
            "exp": "[REDACTED:card_number]", "total": 1257.50, "count": 3}'::jsonb,
          'handler result: keys masked, card numbers as JSON numbers become masked strings, other numbers kept exactly');
SELECT is((SELECT masked FROM ctxguard.audit_log WHERE call_id = (:'shapes'::jsonb->>'call_id')::uuid),
          '{"email": 1, "iban": 1, "card_number": 3}'::jsonb, 'the audit row counts keys and numbers');
SELECT ctxguard.call_tool('up.echo', '{"text": "hi"}') AS auth \gset
SELECT is(pg_temp.code(:'auth'::jsonb), 'authorized', 'the upstream call is authorized');
SELECT ctxguard.complete_call((:'auth'::jsonb->>'call_id')::uuid,
    '{"content": [{"type": "text", "text": "done"}], "ivan.petrov@example.com": {"card": 4111111111111111, "n": 7}}') AS done \gset
SELECT is(:'done'::jsonb->'result', '{"content": [{"type": "text", "text": "done"}], "[REDACTED:email]": {"card": "[REDACTED:card_number]", "n": 7}}'::jsonb,
          'complete_call: keys and numbers of the upstream result are masked');
COMMIT;

-- Results are built as jsonb directly, not printed and parsed again: an upstream call's arguments
-- and its result come back the same to the text (numbers as written, any script, escapes, empty
-- containers, keys of every length), in the call's answer and in its completion's.
CREATE TEMP TABLE shapes AS SELECT $j${"text": "plain",
    "n": [0, -0, 1.50, 1e3, 1E-7, -2.5e+10, 12345678901234567890123456789.000, 9223372036854775807, 9223372036854775808,
          -9223372036854775808, 18446744073709551616, 0.1, 100, 1e400, -0.000],
    "s": ["", "é ü 漢字 🎉", "quote \" backslash \\ tab \t nl \n", "\u0001 ctrl \u007f"],
    "nested": {"a": {"b": [[], {}, null, true, false, [[[]]]]}}, "k": {"bb": 1, "a": 2, "ccc": 3, "": 4, "é": 5}}$j$::jsonb AS v;
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT ctxguard.call_tool('up.echo', '{"text": "é ü 漢字 🎉 \" \\ \u0001"}') AS auth \gset
SELECT is((:'auth'::jsonb->'args')::text, '{"text": "é ü 漢字 🎉 \" \\ \u0001"}', 'an upstream call''s arguments come back to the text');
SELECT is((ctxguard.complete_call((:'auth'::jsonb->>'call_id')::uuid, v)->'result')::text, v::text,
          'and so does its result') FROM shapes;
COMMIT;

-- J.57 mask_text is a DBA's tool
SELECT throws_ok($$SELECT ctxguard.mask_text('ivan.petrov@example.com')$$, '42501', NULL, 'mask_text is not executable by the gateway role');
SELECT ok(NOT has_function_privilege('public', 'ctxguard.mask_text(text)', 'EXECUTE'), 'nor by PUBLIC');

-- §6 Page state: control, bidi and zero-width characters are refused like in ids (22023)
BEGIN;
SELECT throws_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', json_build_object('pageType', 'mask_lab', 'pageState', json_build_object('filters', json_build_object('q', v)))),
                 '22023', 'ctxguard: invalid page context: pageState.filters values must not contain control, bidi or zero-width characters',
                 'page state: ' || label || ' refused')
  FROM (VALUES ('right-to-left override', E'invoice\u202Efdp.exe'), ('zero-width space', E'op\u200Ben'), ('zero-width joiner', E'a\u200Db'),
               ('bidi isolate', E'\u2066x\u2069'), ('byte order mark', E'\uFEFFx'), ('line separator', E'a\u2028b'),
               ('tab', E'a\tb'), ('newline in a list', E'a\nb')) AS c(label, v);
SELECT lives_ok(format('SELECT ctxguard.set_context(%L, %L)', :'tok_alice', '{"pageType": "mask_lab", "pageState": {"filters": {"q": "Настройка LDAP", "tags": ["a b"]}, "tab": "open"}}'),
                'page state: ordinary text in any script is accepted');
COMMIT;

-- J.59 save_turn: a size limit with its own error (54000, naming the limit, not the value)
BEGIN;
SELECT ctxguard.set_context(:'tok_alice', :'lab') \g /dev/null
SELECT throws_ok($$SELECT ctxguard.save_turn('conv-big', 'question', 'answer', (SELECT jsonb_agg(repeat('x', 1000)) FROM generate_series(1, 2000)))$$,
                 '54000', 'ctxguard: a turn (message, answer and tool_calls) is larger than ctxguard.max_turn_bytes',
                 'save_turn: 2 MB of tool calls refused (ctxguard.max_turn_bytes)');
SELECT throws_ok($$SELECT ctxguard.save_turn('conv-big', 'question', repeat('a', 300000))$$,
                 '54000', 'ctxguard: a turn''s answer is limited to 262144 bytes', 'save_turn: a 300 KB answer refused by its own limit');
SELECT throws_ok($$SELECT ctxguard.save_turn('conv-big', repeat('q', 40000), 'answer')$$,
                 '54000', 'ctxguard: a turn''s message is limited to 32768 bytes', 'save_turn: a 40 KB message refused');
SELECT throws_ok($$SELECT ctxguard.save_turn('conv-big', 'question', 'answer', '{"not": "an array"}')$$,
                 '22023', NULL, 'save_turn: malformed tool_calls are still 22023');
SELECT is((SELECT count(*) FROM ctxguard.conversation_turns
            WHERE conversation_id = 'conv-big' AND (octet_length(answer) > 262144 OR octet_length(message) > 32768 OR octet_length(tool_calls::text) > 1500000)),
          0::bigint, 'save_turn: none of the refused turns was stored');
SELECT ok(ctxguard.save_turn('conv-big', 'question', repeat('a', 200000), (SELECT jsonb_agg(repeat('x', 1000)) FROM generate_series(1, 500))) >= 1,
          'save_turn: a 700 KB turn within the limits is stored');
COMMIT;

SELECT * FROM finish();
