-- As doc_search.sql, with the call timed inside the database (docbench.timed_call).
\set q random(1, 4)
BEGIN;
SELECT ctxguard.set_context(c.token, '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}', c.generation) FROM docbench.clients c WHERE c.client_id = :client_id;
SELECT docbench.timed_call(:run, 'doc_local_search', jsonb_build_object('query', (ARRAY['LDAP directory integration', 'TLS certificate rotation', 'backup scheduling', 'replication lag'])[:q::int]));
COMMIT;
