-- Run one statement as another role, on a connection of its own: the DBA (postgres) setting a
-- policy or accepting a tool, the discovery role (ctxguard_discovery) syncing an upstream catalog.
-- The test's session (the gateway role) is given no function or privilege for it, so the
-- "policies are the DBA's" refusals hold for every path, not only for direct calls.
-- In:  dba_role (the role to connect as), dba_sql (one statement).
-- Out: dba_out, the statement's output (unaligned, no headers), or on failure the error's first
--      line as "ERROR:  <SQLSTATE>: <message>" (then LOCATION lines).
\set dba_out `psql -X -q -At -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -h :'HOST' -p :'PORT' -d :'DBNAME' -U :'dba_role' -c :'dba_sql' 2>&1`
