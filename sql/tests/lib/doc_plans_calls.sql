-- For the document-plan tests (34_doc_plans_*.sql), inside a transaction: as :'tok_alice' on the
-- acme_guide viewer page, in a new generation named :'gen', one call of each document tool whose
-- statements keep a plan (doc_local_search, read_doc_pages, read_doc_section). Sets, prefixed with
-- :p, `hits`, `pages` and `sec` (the envelopes) and `search_read`, `pages_read`, `sec_read`: the
-- entries the call's scans of ctxguard.document_pages and its indexes returned
-- (pg_stat_get_xact_tuples_returned, this backend's, the owner's reads inside the calls included).
-- Creates no temporary object (34_doc_plans_repath.sql calls it before the session has one).
\set returned 'SELECT pg_catalog.sum(pg_catalog.pg_stat_get_xact_tuples_returned(x.r))::pg_catalog.int8 AS n FROM (SELECT \'ctxguard.document_pages\'::pg_catalog.regclass UNION ALL SELECT i.indexrelid::pg_catalog.regclass FROM pg_catalog.pg_index i WHERE i.indrelid OPERATOR(pg_catalog.=) \'ctxguard.document_pages\'::pg_catalog.regclass) AS x(r)'
SELECT ctxguard.set_context(:'tok_alice', :'viewer') \g /dev/null
SELECT ctxguard.begin_generation(:'gen') AS g \gset
SELECT ctxguard.set_context(:'tok_alice', :'viewer', :'g') \g /dev/null
:returned \gset r0_
SELECT ctxguard.call_tool('doc_local_search', '{"query": "LDAP directory integration"}') AS hits \gset :p
:returned \gset r1_
SELECT ctxguard.call_tool('read_doc_pages', '{"page_start": 41, "page_end": 43}') AS pages \gset :p
:returned \gset r2_
SELECT ctxguard.call_tool('read_doc_section', '{"section_id": "sec_ldap"}') AS sec \gset :p
:returned \gset r3_
SELECT :r1_n - :r0_n AS search_read, :r2_n - :r1_n AS pages_read, :r3_n - :r2_n AS sec_read \gset :p
SELECT pg_catalog.current_setting('enable_indexscan') AS indexscan \gset :p
