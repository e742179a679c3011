-- read_doc_pages, 5 pages from a random start, on the document viewer page of the 500-page
-- acme_guide (Gate B binds doc_id to the page's document). Each pgbench client uses its own
-- user token and generation from docbench.clients (see doc_setup.sql).
\set p random(1, 496)
BEGIN;
SELECT ctxguard.set_context(c.token, '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}', c.generation) FROM docbench.clients c WHERE c.client_id = :client_id;
SELECT ctxguard.call_tool('read_doc_pages', jsonb_build_object('page_start', :p::int, 'page_end', :p::int + 4));
COMMIT;
