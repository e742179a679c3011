-- Document store, budgets and masking rules (issue: documents). Runs after bootstrap.sql.

CREATE TABLE ctxguard.documents (
    tenant_id       text NOT NULL,
    id              text NOT NULL CHECK (length(id) BETWEEN 1 AND 128),
    title           text NOT NULL CHECK (length(title) BETWEEN 1 AND 500),
    status          text NOT NULL DEFAULT 'processing' CHECK (status IN ('processing', 'ready', 'failed')),
    tags            text[] NOT NULL DEFAULT '{}',
    product_version text,
    language        regconfig NOT NULL DEFAULT 'simple',
    page_count      integer NOT NULL DEFAULT 0,
    entity_type     text,
    entity_id       text,
    boilerplate     text[] NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    CHECK ((entity_type IS NULL) = (entity_id IS NULL))
);
CREATE INDEX documents_entity_idx ON ctxguard.documents (tenant_id, entity_type, entity_id);
COMMENT ON TABLE ctxguard.documents IS 'Documents (metadata); optional link to an app entity such as an invoice or a matter.';

CREATE TABLE ctxguard.document_pages (
    tenant_id text NOT NULL,
    doc_id    text NOT NULL,
    page_no   integer NOT NULL CHECK (page_no >= 1),
    body      text NOT NULL,
    clean     text,
    tsv       tsvector,
    PRIMARY KEY (tenant_id, doc_id, page_no),
    FOREIGN KEY (tenant_id, doc_id) REFERENCES ctxguard.documents (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX document_pages_tsv_idx ON ctxguard.document_pages USING gin (tsv);
-- doc_local_search reads the tsvector of up to a few hundred candidate pages per call: kept in the
-- row (a page's text goes out of line first), not de-TOASTed from a side table on every read.
ALTER TABLE ctxguard.document_pages ALTER COLUMN tsv SET STORAGE MAIN;
-- doc_local_search looks its candidates up one at a time, through a hash of the page's key: one
-- bucket page whatever the number of pages (the primary key gains a level as the table grows).
CREATE INDEX document_pages_key_hash ON ctxguard.document_pages USING hash
    (pg_catalog.hashtextextended(tenant_id OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) doc_id, page_no::pg_catalog.int8));
COMMENT ON TABLE ctxguard.document_pages IS 'Page text. Readable only through the document tools (budgets, masking, audit).';

-- doc_local_search's candidates (issue 34): for each word (lexeme) of a ready document, the pages
-- where it occurs most often (at most 100; ties: the lower page number), with its number of
-- positions on the page. A search ranks only the pages on the lists of its words, so its cost does
-- not grow with the document. Written by put_document(..., 'ready') from the pages' tsvectors.
CREATE TABLE ctxguard.document_terms (
    tenant_id text NOT NULL,
    doc_id    text NOT NULL,
    lexeme    text NOT NULL,
    hits      integer NOT NULL,
    page_no   integer NOT NULL,
    PRIMARY KEY (tenant_id, doc_id, lexeme, page_no),
    FOREIGN KEY (tenant_id, doc_id) REFERENCES ctxguard.documents (tenant_id, id) ON DELETE CASCADE
);
CREATE INDEX document_terms_rank_idx ON ctxguard.document_terms (tenant_id, doc_id, lexeme, hits DESC, page_no);
COMMENT ON TABLE ctxguard.document_terms IS 'Search candidates: per word of a document, the pages where it occurs most often. Only the document tools read it.';

CREATE TABLE ctxguard.document_sections (
    tenant_id  text NOT NULL,
    doc_id     text NOT NULL,
    section_id text NOT NULL CHECK (length(section_id) BETWEEN 1 AND 128),
    title      text NOT NULL,
    page_start integer NOT NULL CHECK (page_start >= 1),
    page_end   integer NOT NULL,
    PRIMARY KEY (tenant_id, doc_id, section_id),
    FOREIGN KEY (tenant_id, doc_id) REFERENCES ctxguard.documents (tenant_id, id) ON DELETE CASCADE,
    CHECK (page_end >= page_start)
);
-- read_doc_metadata lists a document's first sections in page order through it (the ingester decides
-- how many sections there are: without it each call sorted all of them).
CREATE INDEX document_sections_order_idx ON ctxguard.document_sections (tenant_id, doc_id, page_start, section_id);

-- Budgets. Counters live in tables so every pooled backend shares them; updates are atomic.
ALTER TABLE ctxguard.generations ADD COLUMN bytes_used bigint NOT NULL DEFAULT 0;

CREATE TABLE ctxguard.document_calls (
    generation uuid NOT NULL REFERENCES ctxguard.generations (id) ON DELETE CASCADE,
    tenant_id  text NOT NULL,
    doc_id     text NOT NULL,
    calls      integer NOT NULL,
    PRIMARY KEY (generation, doc_id)
);

CREATE TABLE ctxguard.document_coverage (
    tenant_id text NOT NULL,
    user_id   text NOT NULL,
    doc_id    text NOT NULL,
    day       date NOT NULL,
    page_no   integer NOT NULL,
    PRIMARY KEY (tenant_id, user_id, doc_id, day, page_no)
);
COMMENT ON TABLE ctxguard.document_coverage IS 'Pages each user read per document per day (the cross-generation coverage limit).';

CREATE TABLE ctxguard.tenant_limits (
    tenant_id                text PRIMARY KEY,
    max_pages_per_call       integer CHECK (max_pages_per_call > 0),
    max_calls_per_document   integer CHECK (max_calls_per_document > 0),
    max_bytes_per_generation integer CHECK (max_bytes_per_generation > 0),
    max_section_tokens       integer CHECK (max_section_tokens > 0),
    max_search_results       integer CHECK (max_search_results > 0),
    max_document_coverage    real CHECK (max_document_coverage > 0 AND max_document_coverage <= 1)
);
COMMENT ON TABLE ctxguard.tenant_limits IS 'Optional per-tenant overrides of the ctxguard.max_* settings (NULL = use the setting).';

-- Masking rules, applied to every tool result. The DBA may add, change or disable rules.
CREATE TABLE ctxguard.mask_rules (
    name      text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]*$'),
    pattern   text NOT NULL,
    validator text CHECK (validator IN ('luhn', 'iban')),
    position  integer NOT NULL DEFAULT 100,
    enabled   boolean NOT NULL DEFAULT true
);
COMMENT ON TABLE ctxguard.mask_rules IS 'Regex masking rules (Rust regex syntax) applied in position order to every tool result.';

CREATE TRIGGER mask_rules_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.mask_rules
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();

ALTER TABLE ctxguard.audit_log
    ADD COLUMN doc_id text,
    ADD COLUMN tokens integer,
    ADD COLUMN masked jsonb,
    ADD COLUMN budget jsonb;

-- Documents are an entity type: on a document viewer page, set_context checks the document is visible.
INSERT INTO ctxguard.entity_types (name, tbl, tenant_column, id_column, id_type)
VALUES ('document', 'ctxguard.documents', 'tenant_id', 'id', 'text');

-- The seed-003 built-in tools, with editable default policies (ctxguard.set_tool_policy).
-- On a page whose entity is a document, doc_id is bound to it; elsewhere the tools themselves
-- restrict doc_id to documents linked to the page's entity, or to the tenant's documents.
INSERT INTO ctxguard.tools (name, description, input_schema, handler, kind) VALUES
('read_doc_metadata',
 'Read a document''s metadata: title, status, tags, product version, page count and its sections with page ranges. Use it first to find your way in a document.',
 '{"type": "object", "properties": {"doc_id": {"type": "string", "maxLength": 128}}, "required": ["doc_id"], "additionalProperties": false}',
 NULL, 'builtin'),
('read_doc_section',
 'Read one section of a document by section_id: its text (trimmed to the section size limit), page range and token count.',
 '{"type": "object", "properties": {"doc_id": {"type": "string", "maxLength": 128}, "section_id": {"type": "string", "maxLength": 128}}, "required": ["doc_id", "section_id"], "additionalProperties": false}',
 NULL, 'builtin'),
('read_doc_pages',
 'Read pages page_start..page_end of a document, at most 5 pages per call, with running headers and footers removed.',
 '{"type": "object", "properties": {"doc_id": {"type": "string", "maxLength": 128}, "page_start": {"type": "integer", "minimum": 1}, "page_end": {"type": "integer", "minimum": 1}}, "required": ["doc_id", "page_start", "page_end"], "additionalProperties": false}',
 NULL, 'builtin'),
('doc_local_search',
 'Search inside one document: returns the best-matching pages with short snippets around the matches.',
 '{"type": "object", "properties": {"doc_id": {"type": "string", "maxLength": 128}, "query": {"type": "string", "minLength": 1, "maxLength": 200}, "max_results": {"type": "integer", "minimum": 1, "maximum": 100}}, "required": ["doc_id", "query"], "additionalProperties": false}',
 NULL, 'builtin'),
('list_available_tools',
 'List the names of the tools available on this page.',
 '{"type": "object", "properties": {}, "additionalProperties": false}',
 NULL, 'builtin');

INSERT INTO ctxguard.tool_policies (tool, page_types, requires_entity, entity_type, entity_param, read_only, danger, requires_approval, enabled, policy)
SELECT name, '{*}', false, 'document', 'doc_id', true, 'safe', false, true,
       '{"page_types": "*", "entity_type": "document", "entity_param": "doc_id", "requires_entity": false}'
  FROM ctxguard.tools WHERE kind = 'builtin' AND name <> 'list_available_tools';
INSERT INTO ctxguard.tool_policies (tool, page_types, requires_entity, read_only, danger, requires_approval, enabled, policy)
VALUES ('list_available_tools', '{*}', false, true, 'safe', false, true, '{"page_types": "*"}');
