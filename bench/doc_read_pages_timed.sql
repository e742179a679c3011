-- As doc_read_pages.sql, with the call timed inside the database (docbench.timed_call).
\set p random(1, 496)
BEGIN;
SELECT ctxguard.set_context(c.token, '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}', c.generation) FROM docbench.clients c WHERE c.client_id = :client_id;
SELECT docbench.timed_call(:run, 'read_doc_pages', jsonb_build_object('page_start', :p::int, 'page_end', :p::int + 4));
COMMIT;
