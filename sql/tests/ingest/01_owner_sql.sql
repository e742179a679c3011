-- SECURITY_MATRIX H.48 for the ingestion role (issue 11 §1: `regconfig` and `text[]` in put_document):
-- runs as ctxguard_ingest, which may execute put_document/put_page/put_section and CREATE in schema
-- `attacker_ingest`. Its hostile session must not make ctxguard's owner-run SQL run its objects, and the
-- document must come out as in a friendly session.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
SELECT ok(NOT rolsuper AND NOT rolbypassrls, 'the ingestion role is NOSUPERUSER NOBYPASSRLS') FROM pg_roles WHERE rolname = session_user;
SELECT is(current_user::text, 'ctxguard_ingest', 'runs as the ingestion role');

\set attacker attacker_ingest
\ir ../lib/attack.sql

CREATE FUNCTION pg_temp.ingest(variant pg_catalog.text, tok pg_catalog.text, doc pg_catalog.text) RETURNS SETOF pg_catalog.jsonb LANGUAGE plpgsql AS $$
DECLARE page pg_catalog.text;
BEGIN
    RETURN NEXT pg_temp.attack(variant || ' set_context', pg_catalog.format('SELECT ctxguard.set_context(%L, %L)', tok, '{"pageType": "document_library"}'));
    RETURN NEXT pg_temp.attack(variant || ' put_document', pg_catalog.format(
        'SELECT ctxguard.put_document(%L, %L, tags => ARRAY[%L, %L], product_version => %L, language => %L)',
        doc, 'Ingest test ' || variant, 'attack', 'ingest', '1.0', 'english'));
    FOR n IN 1 .. 6 LOOP
        page := 'ACME Ingest Manual, internal' || E'\n'
             || (ARRAY['The operators rotated the certificates of the gateway.', 'Backups are verified every night.',
                       'Quotas apply per tenant and per day.', 'Logs ship to the archive hourly.',
                       'Upgrades need a maintenance window.', 'Tokens expire after one hour.'])[n]
             || E'\n' || 'Page ' || n || ' of 6';
        RETURN NEXT pg_temp.attack(variant || ' put_page', pg_catalog.format('SELECT ctxguard.put_page(%L, %s, %L)', doc, n, page));
    END LOOP;
    RETURN NEXT pg_temp.attack(variant || ' put_section', pg_catalog.format('SELECT ctxguard.put_section(%L, %L, %L, 1, 2)', doc, 'intro', 'Introduction'));
    RETURN NEXT pg_temp.attack(variant || ' put_document ready', pg_catalog.format(
        'SELECT ctxguard.put_document(%L, %L, %L, ARRAY[%L, %L], %L, NULL, NULL, %L)',
        doc, 'Ingest test ' || variant, 'ready', 'attack', 'ingest', '1.0', 'english'));
END $$;

-- V1: type and relation shadows, default path, far-away settings
SET TimeZone = 'Pacific/Kiritimati';
SET DateStyle = 'SQL, DMY';
SET default_text_search_config = 'pg_catalog.simple';
SET transform_null_equals = on;
BEGIN;
CREATE TEMP TABLE v1 AS SELECT * FROM pg_temp.ingest('V1', :'tok_ingest', 'ingest_v1') AS r;
COMMIT;
-- V2: pg_temp and the attacker's functions and operators ahead of pg_catalog
SET search_path = pg_temp, attacker_ingest, public, pg_catalog;
SET TimeZone = 'Etc/GMT+12';
SET default_text_search_config = 'pg_catalog.german';
BEGIN;
CREATE TEMP TABLE v2 AS SELECT * FROM pg_temp.ingest('V2', :'tok_ingest', 'ingest_v2') AS r;
COMMIT;
RESET search_path;

SELECT is(pg_temp.ran(r), '0/0', (r->>'label') || ': no caller object ran') FROM (SELECT r FROM v1 UNION ALL SELECT r FROM v2) x;
SELECT is(r->>'code', 'ok', (r->>'label') || ': succeeded') FROM (SELECT r FROM v1 UNION ALL SELECT r FROM v2) x;
SELECT is(pg_temp.seq('pg_temp.probe_foreign'), 0::bigint, 'no caller object ever ran as another role');
SELECT is(pg_temp.seq('pg_temp.probe_hits'), 0::bigint, 'no caller object ran at all inside put_document, put_page, put_section');
SELECT ok(NOT rolsuper AND NOT rolbypassrls, 'the ingestion role is still NOSUPERUSER NOBYPASSRLS') FROM pg_roles WHERE rolname = session_user;

-- The documents are what a friendly session would have made: ready, three pages, the english
-- configuration, tags as given, the running header and footer found and stripped, the text indexed.
BEGIN;
SELECT ctxguard.set_context(:'tok_ingest', '{"pageType": "document_library"}') \g /dev/null
SELECT results_eq($$SELECT id, status, page_count, language::pg_catalog.text, tags FROM ctxguard.documents WHERE id LIKE 'ingest_v%' ORDER BY id$$,
                  $$VALUES ('ingest_v1', 'ready', 6, 'english', ARRAY['attack', 'ingest']), ('ingest_v2', 'ready', 6, 'english', ARRAY['attack', 'ingest'])$$,
                  'documents: ready, pages, language and tags as given');
SELECT ctxguard.begin_generation('ingest-check') AS g \gset
SELECT ctxguard.set_context(:'tok_ingest', '{"pageType": "document_library"}', :'g') \g /dev/null
SELECT is(ctxguard.call_tool('read_doc_pages', jsonb_build_object('doc_id', d, 'page_start', 1, 'page_end', 1))->'result'->'pages'->0->>'text',
          'The operators rotated the certificates of the gateway.', d || ': header and footer stripped')
  FROM unnest(ARRAY['ingest_v1', 'ingest_v2']) d;
SELECT is(ctxguard.call_tool('doc_local_search', jsonb_build_object('doc_id', d, 'query', 'rotating certificate'))->'result'->>'matched', 'all_words',
          d || ': indexed with english stemming')
  FROM unnest(ARRAY['ingest_v1', 'ingest_v2']) d;
COMMIT;

SELECT * FROM finish();
