-- Context + Gate A only: what a gateway pays to learn which tools to offer the model.
BEGIN;
SELECT ctxguard.set_context(:token, '{"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}}');
SELECT count(*) FROM ctxguard.visible_tools();
COMMIT;
