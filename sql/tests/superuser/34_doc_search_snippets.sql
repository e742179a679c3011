-- doc_local_search's snippets (issue 34): made by the extension (ctxguard_core::docs::headline) in
-- one pass over each page, with only the words that start like a query word stemmed by the
-- document's text search configuration, instead of ts_headline parsing and stemming every word.
-- What they must keep: every word of a snippet that is a query word (as the configuration stems it)
-- is marked and no other word is; at most two fragments of at most 24 words, joined by " … ", where
-- the query's words are closest; the whole page is searched, however long; a word longer than
-- PostgreSQL indexes is never a query word.
-- Runs as the superuser: it writes a document of its own straight into the tables (rolled back);
-- the calls run as tok_ranker, a user of its own.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
\set viewer '{"pageType": "document_viewer", "entity": {"type": "document", "id": "snippet_lab"}}'

BEGIN;
INSERT INTO ctxguard.documents (tenant_id, id, title, status, language, page_count)
VALUES ('acme', 'snippet_lab', 'Snippet lab', 'ready', 'english', 3);
INSERT INTO ctxguard.document_pages (tenant_id, doc_id, page_no, body, clean, tsv)
SELECT 'acme', 'snippet_lab', n, body, body, pg_catalog.to_tsvector('english', body)
  FROM (VALUES
    -- Two places with both words; "Certified" starts like "certificate" but is not its stem.
    (1, 'Certified auditors review the certificate rotation plan. '
        || pg_catalog.repeat('lorem ipsum dolor sit amet ', 12)
        || 'Certificates are rotated monthly by the operators. '
        || pg_catalog.repeat('consectetur adipiscing elit ', 12)
        || 'A certificate alone.'),
    -- A long page: the words only at its end, past 200 KB of other text.
    (2, pg_catalog.repeat('sed do eiusmod tempor incididunt ', 7000) || 'Finally the certificate rotation happens.'),
    -- A word longer than PostgreSQL indexes, starting like "certificate": not stemmed, not marked.
    (3, 'certi' || pg_catalog.repeat('x', 5000) || ' then the certificate rotation.')
  ) AS p(n, body);

SELECT ctxguard.set_context(:'tok_ranker', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation('test-34-snippets') AS g \gset
SELECT ctxguard.set_context(:'tok_ranker', :'viewer', :'g') \g /dev/null

SELECT ctxguard.call_tool('doc_local_search', '{"query": "certificate rotation"}') AS hits \gset
SELECT is(:'hits'::jsonb->>'status', 'ok', 'the search answers');
SELECT is((SELECT pg_catalog.array_agg((r->>'page')::int ORDER BY (r->>'page')::int)
             FROM pg_catalog.jsonb_array_elements(:'hits'::jsonb->'result'->'results') r), '{1,2,3}'::int[],
          'the three pages are found');
CREATE TEMP TABLE snippets AS
SELECT (r->>'page')::int AS page, r->>'snippet' AS snippet
  FROM pg_catalog.jsonb_array_elements(:'hits'::jsonb->'result'->'results') r;

-- The words of a text, in order (runs of letters and digits).
CREATE FUNCTION pg_temp.words(t text) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(pg_catalog.array_agg(m[1] ORDER BY o), '{}')
      FROM pg_catalog.regexp_matches(t, '([[:alnum:]]+)', 'g') WITH ORDINALITY AS x(m, o) $$;
-- The words of a text that are query words: their english lexemes meet the query's.
CREATE FUNCTION pg_temp.query_words(t text, query text) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(pg_catalog.array_agg(w ORDER BY o), '{}')
      FROM pg_catalog.unnest(pg_temp.words(t)) WITH ORDINALITY AS x(w, o)
     WHERE pg_catalog.tsvector_to_array(pg_catalog.to_tsvector('english', w))
           OPERATOR(pg_catalog.&&) pg_catalog.tsvector_to_array(pg_catalog.to_tsvector('english', query)) $$;
-- The marked words of a snippet, in order.
CREATE FUNCTION pg_temp.marked(s text) RETURNS text[] LANGUAGE sql AS $$
    SELECT coalesce(pg_catalog.array_agg(m[1] ORDER BY o), '{}')
      FROM pg_catalog.regexp_matches(s, '«([^»]*)»', 'g') WITH ORDINALITY AS x(m, o) $$;

SELECT is(pg_temp.marked(snippet), pg_temp.query_words(pg_catalog.translate(snippet, '«»', ''), 'certificate rotation'),
          'page ' || page || ': exactly the query words are marked (' || snippet || ')')
  FROM snippets ORDER BY page;
SELECT is(pg_temp.marked(snippet), '{certificate,rotation,Certificates,rotated}',
          'page 1: the query words and their other forms are marked, in order')
  FROM snippets WHERE page = 1;
SELECT ok(pg_catalog.strpos(snippet, 'Certified') > 0 AND pg_catalog.strpos(snippet, '«Certified»') = 0,
          'page 1: a word that only starts like a query word is shown unmarked')
  FROM snippets WHERE page = 1;
SELECT is(pg_catalog.array_length(pg_catalog.string_to_array(snippet, ' … '), 1), 2,
          'page 1: two fragments, one per place with both words')
  FROM snippets WHERE page = 1;
SELECT ok(pg_catalog.strpos(snippet, 'A «certificate» alone') = 0,
          'page 1: a place with one of the words makes no fragment of its own')
  FROM snippets WHERE page = 1;
SELECT ok(bool_and(pg_catalog.cardinality(pg_temp.words(f)) BETWEEN 1 AND 24),
          'page 1: each fragment holds at most 24 words')
  FROM snippets, pg_catalog.unnest(pg_catalog.string_to_array(snippet, ' … ')) f WHERE page = 1;
SELECT is(snippet, 'do eiusmod tempor incididunt sed do eiusmod tempor incididunt sed do eiusmod tempor incididunt sed do eiusmod tempor incididunt Finally the «certificate» «rotation» happens',
          'page 2: the words at the end of a long page, with the words before them')
  FROM snippets WHERE page = 2;
SELECT is(pg_temp.marked(snippet), '{certificate,rotation}', 'page 3: the query words marked, not the long word before them')
  FROM snippets WHERE page = 3;
SELECT * FROM finish();
ROLLBACK;
