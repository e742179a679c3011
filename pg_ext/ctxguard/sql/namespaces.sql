-- Namespaces (issue 31): what the DBA says about a group of tools. A tool's namespace is the first
-- segment of its name (`invoice` for invoice.get and invoice.mark_paid), an upstream tool's its
-- server's; a namespace needs no row here to exist. Written by ctxguard.register_namespace (a
-- DBA's function); read through each backend's catalog cache by ctxguard.visible_namespaces(),
-- which lists a namespace only where Gate A shows one of its tools.
CREATE TABLE ctxguard.namespaces (
    name        text PRIMARY KEY CHECK (length(name) <= 64 AND name ~ '^[a-z][a-z0-9_-]*$'),
    title       text CHECK (title IS NULL OR (length(title) BETWEEN 1 AND 128 AND title !~ '[[:cntrl:]]')),
    description text NOT NULL CHECK (octet_length(description) BETWEEN 1 AND 4000),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE ctxguard.namespaces IS 'Titles and descriptions of tool namespaces (the first segment of tool names; an upstream server''s tools are in its namespace), written by ctxguard.register_namespace.';
-- Catalog data: a change moves the catalog's version, and every backend reads its catalog again.
CREATE TRIGGER namespaces_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ctxguard.namespaces
    FOR EACH STATEMENT EXECUTE FUNCTION ctxguard._bump_catalog_version();
GRANT SELECT ON ctxguard.namespaces TO PUBLIC;
