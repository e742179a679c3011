-- The search's baseline (docbench.timed_plain_search): PostgreSQL's full-text search alone over the
-- same pages and the same four queries, timed inside the database.
\set q random(1, 4)
SELECT docbench.timed_plain_search(:run, (ARRAY['LDAP directory integration', 'TLS certificate rotation', 'backup scheduling', 'replication lag'])[:q::int]);
