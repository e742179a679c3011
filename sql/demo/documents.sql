-- ctxguard demo documents (issue: documents). Loaded by a superuser after schema.sql.
-- psql variables: tok_ingest_acme, tok_ingest_globex (service tokens whose tenant receives the documents).
\set ON_ERROR_STOP 1
SET client_min_messages = warning;

-- Seed 004: matters with documents.
CREATE TABLE demo.matters (
    tenant_id text NOT NULL,
    id        uuid NOT NULL,
    name      text NOT NULL,
    PRIMARY KEY (tenant_id, id)
);
CREATE INDEX matters_id_idx ON demo.matters (id);
INSERT INTO demo.matters VALUES
    ('acme', '25e70284-6124-4a2b-9c89-abc123def456', 'Smith v. Jones'),
    ('acme', '6f1c2d9e-1b7a-4c55-9d2e-0a1b2c3d4e5f', 'Acme v. Wile E. Coyote'),
    ('globex', '9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d', 'Globex Merger Review');
-- Read by the tools' run_as role and by the app's screens; never by the gateway role.
GRANT SELECT ON demo.matters TO ctxguard_tools, ctxguard_app;
SELECT ctxguard.protect_table('demo.matters', 'tenant_id', 'matter', 'id');

SELECT ctxguard.register_page_type('document_viewer', 'document', 'A document viewer showing the pages of one document.');
SELECT ctxguard.register_page_type('matter_overview', 'matter', 'A legal matter with its list of documents.');
SELECT ctxguard.register_page_type('document_library', NULL, 'The document library: every document of the company.');

-- Document tools: on the pages where documents are shown (editable defaults; list_available_tools stays everywhere).
SELECT ctxguard.set_tool_policy(name,
         '{"page_types": ["invoice_detail", "document_viewer", "matter_overview", "document_library"], "entity_type": "document", "entity_param": "doc_id", "requires_entity": false}')
  FROM ctxguard.tools WHERE kind = 'builtin' AND name <> 'list_available_tools';

-- A generated 500-page administrator guide: running header and footer on every page, ten pages per
-- chapter, varied technical prose, and a few pages with secrets and personal data (masking demo).
CREATE FUNCTION demo.manual_page(n int, pages int) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    WITH topics(t) AS (VALUES ('LDAP directory integration'), ('backup scheduling'), ('restore verification'),
                              ('storage quotas'), ('TLS certificate rotation'), ('audit logging'), ('reverse proxy setup'),
                              ('cache tuning'), ('single sign-on'), ('log shipping'), ('high availability'), ('upgrades')),
         chosen AS (SELECT t, row_number() OVER () AS i FROM topics)
    SELECT 'Orion Platform Administrator Guide 4.2 — Confidential' || E'\n\n'
        || 'Chapter ' || ((n - 1) / 10 + 1) || ': ' || (SELECT t FROM chosen WHERE i = ((n - 1) / 10) % 12 + 1) || E'\n'
        || string_agg(format('%s. To configure %s on node %s, set the %s parameter to %s and restart the %s service; '
                             'verify with the %s command that replication lag stays below %s seconds.',
                             p, (SELECT t FROM chosen WHERE i = (n + p) % 12 + 1), 'srv-' || ((n * 7 + p) % 40),
                             (ARRAY['max_connections', 'retention_days', 'sync_interval', 'cipher_suite', 'quota_mb'])[1 + (n + p) % 5],
                             (n * 13 + p * 7) % 997, (ARRAY['orion-api', 'orion-worker', 'orion-sync'])[1 + (n + p) % 3],
                             (ARRAY['orion status', 'orion check', 'orion doctor'])[1 + p % 3], 1 + (n + p) % 9), E'\n')
        || CASE n
             WHEN 42 THEN E'\nSupport escalation: write to ivan.petrov@orion-support.example or call +49 30 1234 5678.'
             WHEN 77 THEN E'\nBilling test card 4111 1111 1111 1111, refunds to IBAN DE89 3704 0044 0532 0130 00.'
             WHEN 99 THEN E'\nDo not paste keys like sk-proj-abcdefghijklmnopqrstuvwx or AKIAIOSFODNN7EXAMPLE into tickets.'
             WHEN 123 THEN E'\nObfuscated contact: ｉｖａｎ＠ｏｒｉｏｎ．ｅｘａｍｐｌｅ, card ４１１１-１１１１-１１１１-１１１１.'
             ELSE '' END
        || E'\n\nPage ' || n || ' of ' || pages
      FROM generate_series(1, 6) AS p
$$;
-- Only this script (a superuser) builds the guide with it: a function is executable by PUBLIC by
-- default, and this one prints the guide's secrets for any tenant.
REVOKE EXECUTE ON FUNCTION demo.manual_page(int, int) FROM PUBLIC;

BEGIN;
SELECT ctxguard.set_context(:'tok_ingest_acme', '{"pageType": "invoice_table"}') \g /dev/null
SELECT ctxguard.put_document('acme_guide', 'Orion Platform Administrator Guide 4.2', tags => ARRAY['admin', 'orion'],
                             product_version => '4.2', language => 'english') \g /dev/null
SELECT ctxguard.put_page('acme_guide', n, demo.manual_page(n, 500)) FROM generate_series(1, 500) n \g /dev/null
SELECT ctxguard.put_section('acme_guide', 'ch' || c, 'Chapter ' || c, (c - 1) * 10 + 1, c * 10) FROM generate_series(1, 50) c \g /dev/null
SELECT ctxguard.put_section('acme_guide', 'sec_ldap', 'LDAP directory integration', 1, 3) \g /dev/null
SELECT ctxguard.put_document('acme_guide', 'Orion Platform Administrator Guide 4.2', 'ready', ARRAY['admin', 'orion'], '4.2', NULL, NULL, 'english') \g /dev/null

-- The PDF of invoice acme_inv3 (seed 000: "summarize this invoice" reads it).
SELECT ctxguard.put_document('acme_inv3_pdf', 'Invoice ACME-2026-0003.pdf', entity_type => 'invoice', entity_id => 'acme_inv3') \g /dev/null
SELECT ctxguard.put_page('acme_inv3_pdf', 1, E'Tailspin Freight GmbH — Invoice ACME-2026-0003\nIssued 2026-09-04, due 2026-10-04.\n'
    'Line 1: Freight Hamburg–Lyon, 2 pallets, 980.00 EUR\nLine 2: Insurance, 277.00 EUR\nTotal 1,257.00 EUR. '
    'Pay to IBAN DE89 3704 0044 0532 0130 00. Questions: billing4@tailspinfreight.example') \g /dev/null
SELECT ctxguard.put_document('acme_inv3_pdf', 'Invoice ACME-2026-0003.pdf', 'ready', '{}', NULL, 'invoice', 'acme_inv3') \g /dev/null

-- Seed 004: documents of the matter "Smith v. Jones", one still processing.
SELECT ctxguard.put_document('smith_agreement', 'Service Agreement.pdf', entity_type => 'matter', entity_id => '25e70284-6124-4a2b-9c89-abc123def456') \g /dev/null
SELECT ctxguard.put_page('smith_agreement', n, 'Service Agreement between Smith and Jones. Clause ' || n || ': the provider shall deliver the services described in Schedule ' || n || ' within thirty days.') FROM generate_series(1, 12) n \g /dev/null
SELECT ctxguard.put_section('smith_agreement', 'termination', 'Termination', 9, 10) \g /dev/null
SELECT ctxguard.put_document('smith_agreement', 'Service Agreement.pdf', 'ready', '{}', NULL, 'matter', '25e70284-6124-4a2b-9c89-abc123def456') \g /dev/null
SELECT ctxguard.put_document('smith_deposition', 'Deposition of J. Jones.pdf', entity_type => 'matter', entity_id => '25e70284-6124-4a2b-9c89-abc123def456') \g /dev/null
SELECT ctxguard.put_document('coyote_complaint', 'Complaint.pdf', entity_type => 'matter', entity_id => '6f1c2d9e-1b7a-4c55-9d2e-0a1b2c3d4e5f') \g /dev/null
SELECT ctxguard.put_page('coyote_complaint', 1, 'Complaint: Acme v. Wile E. Coyote.') \g /dev/null
SELECT ctxguard.put_document('coyote_complaint', 'Complaint.pdf', 'ready', '{}', NULL, 'matter', '6f1c2d9e-1b7a-4c55-9d2e-0a1b2c3d4e5f') \g /dev/null
COMMIT;

BEGIN;
SELECT ctxguard.set_context(:'tok_ingest_globex', '{"pageType": "invoice_table"}') \g /dev/null
SELECT ctxguard.put_document('glx_handbook', 'Globex Employee Handbook', language => 'english') \g /dev/null
SELECT ctxguard.put_page('glx_handbook', n, 'Globex handbook page ' || n || ': vacation policy, expense rules and the secret project codename VOLCANO.') FROM generate_series(1, 20) n \g /dev/null
SELECT ctxguard.put_document('glx_handbook', 'Globex Employee Handbook', 'ready', '{}', NULL, NULL, NULL, 'english') \g /dev/null
COMMIT;
