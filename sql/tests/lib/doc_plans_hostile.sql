-- For the document-plan tests (34_doc_plans_*.sql), inside a transaction: the planner settings of
-- a hostile client (any role may set them): no index scans, index and page reads a million times
-- dearer, JIT for every statement.
SET LOCAL enable_indexscan = off;
SET LOCAL enable_indexonlyscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL random_page_cost = 1000000;
SET LOCAL cpu_index_tuple_cost = 1000000;
SET LOCAL jit_above_cost = 0;
-- Still in force when the calls return (doc_plans_checks.sql checks enable_indexscan): the client's own.
