-- pg_temp.rows_returned(rel): the entries this transaction's scans of table `rel` and of its
-- indexes have returned so far (pg_stat_get_xact_tuples_returned: this backend's own, the owner's
-- reads inside ctxguard's functions included). Tests count the work a call does with it, not time.
-- pg_temp.blocks_fetched(rel): likewise the blocks they fetched (pg_stat_get_xact_blocks_fetched):
-- a btree condition on a column after one the statement lacks is checked inside the scan, so the
-- entries it skips are not returned, but the pages it reads are fetched.
CREATE FUNCTION pg_temp.table_and_indexes(rel regclass) RETURNS SETOF regclass LANGUAGE sql AS $$
    SELECT rel UNION ALL SELECT i.indexrelid::pg_catalog.regclass FROM pg_catalog.pg_index i WHERE i.indrelid = rel
$$;
CREATE FUNCTION pg_temp.rows_returned(rel regclass) RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_catalog.sum(pg_catalog.pg_stat_get_xact_tuples_returned(r))::bigint FROM pg_temp.table_and_indexes(rel) r
$$;
CREATE FUNCTION pg_temp.blocks_fetched(rel regclass) RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_catalog.sum(pg_catalog.pg_stat_get_xact_blocks_fetched(r))::bigint FROM pg_temp.table_and_indexes(rel) r
$$;
