-- doc_local_search on the 500-page acme_guide, one of four realistic queries at random
-- ('replication lag' matches every page, the others a share of them).
\set q random(1, 4)
BEGIN;
SELECT ctxguard.set_context(c.token, '{"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}}', c.generation) FROM docbench.clients c WHERE c.client_id = :client_id;
SELECT ctxguard.call_tool('doc_local_search', jsonb_build_object('query', (ARRAY['LDAP directory integration', 'TLS certificate rotation', 'backup scheduling', 'replication lag'])[:q::int]));
COMMIT;
