-- pg_temp.rows_returned(rel): the entries this transaction's scans of table `rel` and of its
-- indexes have returned so far (pg_stat_get_xact_tuples_returned: this backend's own, the owner's
-- reads inside ctxguard's functions included). Tests count the work a call does with it, not time.
CREATE FUNCTION pg_temp.rows_returned(rel regclass) RETURNS bigint LANGUAGE sql AS $$
    SELECT pg_catalog.sum(pg_catalog.pg_stat_get_xact_tuples_returned(r))::bigint
      FROM (SELECT rel
            UNION ALL SELECT i.indexrelid::pg_catalog.regclass FROM pg_catalog.pg_index i
                       WHERE i.indrelid = rel) AS x(r)
$$;
