-- Issue 31: what register_namespace accepts, as the DBA (postgres); what it registers is removed at the end.
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();
BEGIN;
SELECT lives_ok($$SELECT ctxguard.register_namespace('vendor', 'The company''s vendors.', 'Vendors')$$, 'a namespace with a title');
SELECT lives_ok($$SELECT ctxguard.register_namespace('report_2-x', 'Reports.')$$, 'one without (name characters as in tool names)');
SELECT results_eq($$SELECT name, title, description FROM ctxguard.namespaces WHERE name IN ('vendor', 'report_2-x') ORDER BY 1$$,
                  $$VALUES ('report_2-x', NULL, 'Reports.'), ('vendor', 'Vendors', 'The company''s vendors.')$$, 'stored');
SELECT lives_ok($$SELECT ctxguard.register_namespace('vendor', 'Vendors, again.')$$, 'registering again updates it');
SELECT is((SELECT title FROM ctxguard.namespaces WHERE name = 'vendor'), NULL, 'the title too (now none)');
SELECT is((SELECT description FROM ctxguard.namespaces WHERE name = 'vendor'), 'Vendors, again.', 'and the description');

-- Refusals: 22023, naming the rule, never the value.
SELECT throws_ok(format('SELECT ctxguard.register_namespace(%L, %L, %L)', n, d, t), '22023', m, label)
  FROM (VALUES
    (NULL, 'x', NULL, 'ctxguard: invalid namespace name (one segment of a tool name, such as ''invoice'')', 'no name'),
    ('vendor.list', 'x', NULL, 'ctxguard: invalid namespace name (one segment of a tool name, such as ''invoice'')', 'a dotted name'),
    ('Vendor', 'x', NULL, 'ctxguard: invalid namespace name (one segment of a tool name, such as ''invoice'')', 'upper case'),
    (E'ven\u200bdor', 'x', NULL, 'ctxguard: invalid namespace name (one segment of a tool name, such as ''invoice'')', 'an invisible character'),
    (repeat('v', 65), 'x', NULL, 'ctxguard: invalid namespace name (one segment of a tool name, such as ''invoice'')', 'over 64 bytes'),
    ('vendor', NULL, NULL, 'ctxguard: description must be non-empty and at most 4000 bytes', 'no description'),
    ('vendor', '   ', NULL, 'ctxguard: description must be non-empty and at most 4000 bytes', 'a blank description'),
    ('vendor', repeat('x', 4001), NULL, 'ctxguard: description must be non-empty and at most 4000 bytes', 'a description over 4000 bytes'),
    ('vendor', repeat('é', 2001), NULL, 'ctxguard: description must be non-empty and at most 4000 bytes', 'the limit is in bytes'),
    ('vendor', 'x', '', 'ctxguard: title must be 1-128 characters without control characters', 'an empty title'),
    ('vendor', 'x', repeat('t', 129), 'ctxguard: title must be 1-128 characters without control characters', 'a title over 128 characters'),
    ('vendor', 'x', E'Ven\ndors', 'ctxguard: title must be 1-128 characters without control characters', 'a control character in the title'),
    ('vendor', 'x', repeat('t', 1000000), 'ctxguard: title must be 1-128 characters without control characters', 'a huge title')
  ) AS c(n, d, t, m, label);
SELECT is((SELECT description FROM ctxguard.namespaces WHERE name = 'vendor'), 'Vendors, again.', 'a refusal changes nothing');
SELECT throws_ok($$INSERT INTO ctxguard.namespaces (name, description) VALUES ('a.b', 'x')$$, '23514', NULL,
                 'the table''s checks are the backstop');

-- A namespace is catalog data: registering one moves the catalog's version.
SELECT version AS v0 FROM ctxguard.catalog_version \gset
COMMIT;
BEGIN;
SELECT ctxguard.register_namespace('vendor', 'Vendors, once more.') \g /dev/null
COMMIT;
SELECT ok((SELECT version FROM ctxguard.catalog_version) > :v0, 'register_namespace moves the catalog version');
SELECT is((SELECT tool FROM ctxguard.catalog_changes WHERE version = (SELECT version FROM ctxguard.catalog_version) LIMIT 1), NULL,
          'as a change that is not a tool''s (every backend reads its catalog again)');
DELETE FROM ctxguard.namespaces WHERE name IN ('vendor', 'report_2-x');

SELECT * FROM finish();
