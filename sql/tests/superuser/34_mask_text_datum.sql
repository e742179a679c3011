-- mask_text's jsonb is laid out by ctxguard, not by PostgreSQL (issue 34 item 4: masking within 3x
-- md5; the text of a long result is written into the datum once, not copied through a masked
-- string and a buffer grown by doubling). The datum must be the one jsonb_in makes from the same
-- text: equal, the same size, the same hash, and read the same way by every accessor, for texts
-- whose length leaves each of the four paddings before the `masked` object, with and without
-- secrets, with several rules' counts, empty, and long (8 MB, with the size cap raised).
-- Runs as the superuser: mask_text is a DBA's tool.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

CREATE TEMP TABLE samples (name text, t text);
INSERT INTO samples VALUES
    ('empty', ''),
    ('no secret', 'nothing to hide here'),
    ('no secret, one more byte', 'nothing to hide here.'),
    ('no secret, two more bytes', 'nothing to hide here..'),
    ('no secret, three more bytes', 'nothing to hide here...'),
    ('one e-mail', 'mail ivan.petrov@example.com now'),
    ('one e-mail, one more byte', 'mail ivan.petrov@example.com now!'),
    ('one e-mail, two more bytes', 'mail ivan.petrov@example.com now!!'),
    ('one e-mail, three more bytes', 'mail ivan.petrov@example.com now!!!'),
    ('only a secret', 'ivan.petrov@example.com'),
    ('several rules', 'card 4111 1111 1111 1111, IBAN DE89 3704 0044 0532 0130 00, key AKIAIOSFODNN7EXAMPLE, '
                      || 'mail a@example.com and b@example.com, call +49 30 1234 5678'),
    ('fullwidth and scripts', 'Настройка ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ ノード　設定 "quoted" \ back\slash' || E'\n\ttab');

-- Every sample, and the same texts around the padding boundary built from repeats.
INSERT INTO samples
SELECT format('%s x %s', s.name, n), repeat(s.t || ' ', n)
  FROM samples s, generate_series(2, 5) n
 WHERE s.name IN ('one e-mail', 'several rules', 'fullwidth and scripts');

SELECT is(
    (SELECT string_agg(name, ', ' ORDER BY name) FROM samples
      WHERE NOT (ctxguard.mask_text(t) = (ctxguard.mask_text(t)::text)::jsonb)),
    NULL, 'every sample: mask_text equals jsonb_in of its own text');
SELECT is(
    (SELECT string_agg(name, ', ' ORDER BY name) FROM samples
      WHERE pg_column_size(ctxguard.mask_text(t)) <> pg_column_size((ctxguard.mask_text(t)::text)::jsonb)),
    NULL, 'every sample: the same size as jsonb_in''s datum (the same layout)');
SELECT is(
    (SELECT string_agg(name, ', ' ORDER BY name) FROM samples
      WHERE jsonb_hash_extended(ctxguard.mask_text(t), 7) <> jsonb_hash_extended((ctxguard.mask_text(t)::text)::jsonb, 7)),
    NULL, 'every sample: the same hash');
SELECT is(
    (SELECT count(DISTINCT (octet_length(ctxguard.mask_text(t)->>'text') + 34) % 4) FROM samples s
      WHERE ctxguard.mask_text(t)->'masked' <> '{}'),
    4::bigint, 'the samples with masks cover all four paddings');
SELECT is(
    (SELECT string_agg(name, ', ' ORDER BY name) FROM samples s,
            LATERAL (SELECT ctxguard.mask_text(s.t) AS m) x
      WHERE x.m->>'text' IS DISTINCT FROM (x.m::text)::jsonb->>'text'
         OR x.m->'masked' IS DISTINCT FROM (x.m::text)::jsonb->'masked'
         OR (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(x.m) k) <> ARRAY['masked', 'text']
         OR jsonb_typeof(x.m->'masked') <> 'object'
         OR NOT x.m @> jsonb_build_object('text', x.m->>'text')
         OR NOT x.m ? 'text'
         OR jsonb_path_query_first(x.m, '$.text') IS DISTINCT FROM to_jsonb(x.m->>'text')
         OR jsonb_pretty(x.m) <> jsonb_pretty((x.m::text)::jsonb)),
    NULL, 'every sample: read the same by ->, ->>, keys, @>, ?, jsonpath and jsonb_pretty');

SELECT is(ctxguard.mask_text('mail ivan.petrov@example.com now'),
          '{"text": "mail [REDACTED:email] now", "masked": {"email": 1}}'::jsonb, 'one e-mail: the expected value');
SELECT is(ctxguard.mask_text(''), '{"text": "", "masked": {}}'::jsonb, 'empty text: the expected value');
SELECT is((SELECT ctxguard.mask_text(t)->'masked' FROM samples WHERE name = 'several rules'),
          '{"card_number": 1, "iban": 1, "email": 2, "phone": 1, "aws_access_key": 1}'::jsonb, 'several rules: each rule''s count');

-- Stored and read back (the datum goes to disk as it is, and is TOASTed when large).
CREATE TEMP TABLE stored AS SELECT name, ctxguard.mask_text(t) AS m FROM samples;
SELECT is((SELECT count(*) FROM stored s JOIN samples USING (name) WHERE s.m = (ctxguard.mask_text(samples.t)::text)::jsonb),
          (SELECT count(*) FROM samples), 'stored and read back: every sample still equal');

-- Long: 8 MB of mixed lines with a secret in every eighth (the masking bench's shape).
SET ctxguard.max_mask_bytes = '64MB';
CREATE TEMP TABLE long_text AS
SELECT string_agg(CASE WHEN i % 8 = 7 THEN format('Contact ivan.petrov%s@example.com or +49 30 1234 %s.', i, 1000 + i % 9000)
                       ELSE format('ノード srv-%s の設定: quota_mb を %s にしてから orion-api を再起動します。', i % 40, i % 997) END,
                  E'\n' ORDER BY i) AS t
  FROM generate_series(1, 110000) i;
SELECT ok((SELECT octet_length(t) > 8000000 FROM long_text), 'the long text holds more than 8 MB');
CREATE TEMP TABLE long_masked AS SELECT ctxguard.mask_text(t) AS m FROM long_text;
SELECT ok((SELECT m = (m::text)::jsonb FROM long_masked), 'long: equal to jsonb_in of its own text');
SELECT is((SELECT pg_column_size(m) - pg_column_size((m::text)::jsonb) FROM (SELECT ctxguard.mask_text(t) AS m FROM long_text) x), 0,
          'long: the same size (as made, before storage compresses it)');
SELECT is((SELECT m->'masked' FROM long_masked), '{"email": 13750, "phone": 13750}'::jsonb, 'long: every secret counted');
SELECT is((SELECT (m->>'text') ~ 'ivan\.petrov|1234 [0-9]' FROM long_masked), false, 'long: no secret left');
RESET ctxguard.max_mask_bytes;

SELECT * FROM finish();
