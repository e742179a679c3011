-- doc_local_search ranks as PostgreSQL's ts_rank_cd does (issue 34): the rank of a query of words
-- is computed by the extension from the page's tsvector (ctxguard_core::tsrank), a query with a
-- phrase is ranked by ts_rank_cd itself. For each query below the tool's pages, in order, and their
-- scores are those of a reference statement: ts_rank_cd over the same candidates (each query word's
-- list in ctxguard.document_terms; every page for a query of negations only), ORDER BY score DESC,
-- page_no. Queries of one, two and three words, OR, negation, phrases (quoted, and a hyphenated word,
-- which the parser makes a phrase), negations only, and the any-word retry.
-- With ctxguard.search_rank_check on, PostgreSQL also ranks every candidate of each search and the
-- search fails unless the extension ranked every page of a query without a phrase to the same bits:
-- so the searches below check the whole candidate lists, not only the five pages shown.
-- Runs as the superuser (the reference reads the page vectors, the check is a superuser setting);
-- the calls run as tok_ranker, a user of its own, so the daily coverage of other tests' users is
-- not this file's.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}'

-- The reference: "page:score" of the best five, best first, for the all-words or any-word query.
CREATE FUNCTION pg_temp.reference(query text, any_word boolean) RETURNS text LANGUAGE sql AS $$
    WITH q AS (
        SELECT CASE WHEN any_word THEN pg_catalog.to_tsquery('english', coalesce(nullif(pg_catalog.array_to_string(ARRAY(
                        SELECT '''' || pg_catalog.replace(l, '''', '''''') || '''' FROM pg_catalog.unnest(pg_catalog.tsvector_to_array(
                            pg_catalog.to_tsvector('english', query))) l), ' | '), ''), ''''''))
                    ELSE pg_catalog.websearch_to_tsquery('english', query) END AS q),
    c AS (
        SELECT t.page_no FROM ctxguard.document_terms t
         WHERE t.tenant_id = 'acme' AND t.doc_id = 'acme_guide'
           AND t.lexeme = ANY (pg_catalog.tsvector_to_array(pg_catalog.to_tsvector('english', query)))
        UNION
        SELECT p.page_no FROM ctxguard.document_pages p, q
         WHERE p.tenant_id = 'acme' AND p.doc_id = 'acme_guide' AND pg_catalog.querytree(q.q) = 'T'),
    ranked AS (
        SELECT p.page_no, pg_catalog.ts_rank_cd(p.tsv, q.q) AS score
          FROM ctxguard.document_pages p JOIN c USING (page_no), q
         WHERE p.tenant_id = 'acme' AND p.doc_id = 'acme_guide' AND p.tsv @@ q.q
         ORDER BY 2 DESC, 1 LIMIT 5)
    SELECT coalesce(pg_catalog.string_agg(page_no || ':' || score, ',' ORDER BY score DESC, page_no), '') FROM ranked $$;

-- The tool's answer in the same shape, with each score replaced by the reference's when the two are
-- within the tool's rounding (three decimals), so that the comparison is of pages, order and scores.
CREATE FUNCTION pg_temp.answer(hits jsonb, reference text) RETURNS text LANGUAGE sql AS $$
    WITH r AS (SELECT pg_catalog.split_part(e, ':', 1)::int AS page, pg_catalog.split_part(e, ':', 2)::float8 AS score, o
                 FROM pg_catalog.unnest(pg_catalog.string_to_array(nullif(reference, ''), ',')) WITH ORDINALITY AS x(e, o))
    SELECT coalesce(pg_catalog.string_agg(
               (h->>'page') || ':' || CASE WHEN pg_catalog.abs((h->>'score')::float8 - r.score) <= 0.00051
                                           THEN r.score::text ELSE h->>'score' END, ',' ORDER BY o), '')
      FROM pg_catalog.jsonb_array_elements(hits->'result'->'results') WITH ORDINALITY AS a(h, o)
      LEFT JOIN r USING (o) $$;

CREATE TEMP TABLE queries (query text, path text);
INSERT INTO queries VALUES
    ('LDAP directory integration', 'all_words'), ('TLS certificate rotation', 'all_words'),
    ('backup scheduling', 'all_words'), ('replication lag', 'all_words'), ('certificate', 'all_words'),
    ('certificate -rotation', NULL), ('certificate or ldap', 'all_words'),
    ('backup or restore or snapshot', 'all_words'), ('"certificate rotation"', 'all_words'),
    ('read-only replica', NULL), ('-ldap', 'all_words'), ('search for certificate rotation', 'any_word'),
    ('password policy', NULL), ('audit log retention', NULL), ('cluster upgrade rollback', NULL);
CREATE TEMP TABLE answers (query text, hits jsonb);

-- Each query in a generation of its own (a generation allows a few calls per document).
CREATE FUNCTION pg_temp.search(tok text, query text) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE viewer jsonb := '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}';
BEGIN
    PERFORM ctxguard.set_context(tok, viewer);
    PERFORM ctxguard.set_context(tok, viewer, ctxguard.begin_generation('test-34-rank'));
    RETURN ctxguard.call_tool('doc_local_search', pg_catalog.jsonb_build_object('query', query));
END $$;
BEGIN;
SET LOCAL ctxguard.search_rank_check = on;
INSERT INTO answers SELECT query, pg_temp.search(:'tok_ranker', query) FROM queries;
COMMIT;

SELECT is(a.hits->>'status', 'ok', 'search succeeds: ' || q.query) FROM queries q JOIN answers a USING (query);
SELECT is(a.hits->'result'->>'matched', q.path, 'the path expected: ' || q.query)
  FROM queries q JOIN answers a USING (query) WHERE q.path IS NOT NULL;
SELECT is(pg_temp.answer(a.hits, pg_temp.reference(q.query, a.hits->'result'->>'matched' = 'any_word')),
          pg_temp.reference(q.query, a.hits->'result'->>'matched' = 'any_word'),
          'the pages, their order and scores of ts_rank_cd: ' || q.query)
  FROM queries q JOIN answers a USING (query);
-- The comparison has something to compare: most queries find five pages, and the scores differ.
SELECT cmp_ok((SELECT count(*) FROM answers WHERE jsonb_array_length(hits->'result'->'results') = 5), '>=', 10::bigint,
              'most queries find five pages');
SELECT cmp_ok((SELECT count(DISTINCT r->>'score') FROM answers, jsonb_array_elements(hits->'result'->'results') r), '>=', 8::bigint,
              'the scores differ between queries and pages');
SELECT * FROM finish();
