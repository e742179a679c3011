-- verify_audit walks a tenant's chain in bounded memory, reading only that tenant's rows (issue 34:
-- cost as the work grows, without a crash). It read every chained row of the tenant into memory
-- first (the rows of one statement, then a copy of each in the extension), and hashed them after:
-- a DBA verifying a tenant of a few million audit rows grew the backend by gigabytes, until the OOM
-- killer ended it and the postmaster restarted every backend of every tenant.
--
-- Here 40,000 rows of 4 kB each (a canonical text of about 160 MB) are verified in a transaction
-- rolled back at the end; the backend's peak resident memory (VmHWM, through catalog_stats) may
-- grow by at most 64 MB over its peak before the call. A chain of 2,500 valid rows, built here
-- with the writer's hash (ctxguard-core `chain_hash`), checks that a walk in pieces still finds the
-- first broken link and counts every row.
-- Runs as the superuser (verify_audit is the DBA's tool).
\set QUIET 1
SET client_min_messages = warning;
SELECT * FROM no_plan();

-- n as 8 little-endian bytes (the chain hashes lengths as u64 LE).
CREATE FUNCTION pg_temp.le8(n bigint) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT decode(string_agg(lpad(to_hex((n >> (8 * i)) & 255), 2, '0'), '' ORDER BY i), 'hex')
      FROM generate_series(0, 7) i
$$;
-- ctxguard-core's chain_hash(prev, [canon]).
CREATE FUNCTION pg_temp.chain_hash(prev text, canon text) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(sha256(convert_to('ctxguard-audit-v1', 'UTF8') || '\x00'::bytea
                         || pg_temp.le8(octet_length(prev)) || convert_to(prev, 'UTF8')
                         || '\x01'::bytea || pg_temp.le8(octet_length(canon)) || convert_to(canon, 'UTF8')), 'hex')
$$;
-- A chain of n valid rows for tenant t, after whatever t has (nothing here).
CREATE FUNCTION pg_temp.chain(t text, n int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    prev text := '';
    rid bigint;
    canon text;
BEGIN
    FOR i IN 1..n LOOP
        INSERT INTO ctxguard.audit_log (call_id, tenant_id, user_id, tool, decision, args_hash, result_bytes, prev_hash)
        VALUES (gen_random_uuid(), t, 'u' || i, 'invoice.get', 'allow', md5(i::text), i, prev)
        RETURNING id INTO rid;
        SELECT jsonb_build_array(r.call_id, r.tenant_id, r.user_id, r.page_type, r.entity_type, r.entity_id,
                                 r.tool, r.decision, r.code, r.args_hash, r.result_bytes, r.generation,
                                 r.trace_id, r.doc_id, r.tokens, r.masked, r.budget,
                                 (EXTRACT(epoch FROM r.at) * 1000000)::int8)::text
          INTO canon FROM ctxguard.audit_log r WHERE r.id = rid;
        prev := pg_temp.chain_hash(prev, canon);
        UPDATE ctxguard.audit_log SET row_hash = prev WHERE id = rid;
    END LOOP;
END $$;
CREATE FUNCTION pg_temp.peak_kb() RETURNS bigint LANGUAGE sql AS $$
    SELECT (ctxguard.catalog_stats()->>'backend_peak_kb')::bigint
$$;

BEGIN;
-- 1. A chain longer than one piece of the walk.
SELECT pg_temp.chain('verify-chain', 2500);
SELECT ctxguard.verify_audit('verify-chain') AS whole \gset
SELECT id AS victim FROM ctxguard.audit_log WHERE tenant_id = 'verify-chain' ORDER BY id OFFSET 2299 LIMIT 1 \gset
UPDATE ctxguard.audit_log SET result_bytes = result_bytes + 1 WHERE id = :victim;
SELECT ctxguard.verify_audit('verify-chain') AS edited \gset
UPDATE ctxguard.audit_log SET result_bytes = result_bytes - 1 WHERE id = :victim;
SELECT ctxguard.verify_audit('verify-chain') AS mended \gset
SELECT id AS gone FROM ctxguard.audit_log WHERE tenant_id = 'verify-chain' ORDER BY id OFFSET 999 LIMIT 1 \gset
SELECT id AS after_gone FROM ctxguard.audit_log WHERE tenant_id = 'verify-chain' ORDER BY id OFFSET 1000 LIMIT 1 \gset
DELETE FROM ctxguard.audit_log WHERE id = :gone;
SELECT ctxguard.verify_audit('verify-chain') AS deleted \gset

-- 2. 40,000 rows of 4 kB: the walk's memory.
INSERT INTO ctxguard.audit_log (call_id, tenant_id, user_id, tool, decision, args_hash, prev_hash, row_hash)
SELECT gen_random_uuid(), 'verify-big', 'u', 'invoice.get', 'allow', repeat(md5(i::text), 128), '', 'x'
  FROM generate_series(1, 40000) i;
SELECT min(id) AS big_first FROM ctxguard.audit_log WHERE tenant_id = 'verify-big' \gset
SELECT pg_temp.peak_kb() AS peak_before \gset
SELECT ctxguard.verify_audit('verify-big') AS big \gset
SELECT pg_temp.peak_kb() - :peak_before AS grew_kb \gset
ROLLBACK;
-- The rolled-back rows' index entries gone, for the tests after this one.
VACUUM ctxguard.audit_log;

SELECT is(:'whole'::jsonb, jsonb_build_object('tenant_id', 'verify-chain', 'rows', 2500, 'intact', true, 'first_broken_id', NULL),
          'a valid chain of 2,500 rows holds, every row counted');
SELECT is(:'edited'::jsonb, jsonb_build_object('tenant_id', 'verify-chain', 'rows', 2500, 'intact', false, 'first_broken_id', :victim::bigint),
          'an edited row past the first pieces is the first broken link, and every row is still counted');
SELECT is(:'mended'::jsonb, :'whole'::jsonb, 'the row put back, the chain holds again');
SELECT is(:'deleted'::jsonb, jsonb_build_object('tenant_id', 'verify-chain', 'rows', 2499, 'intact', false, 'first_broken_id', :after_gone::bigint),
          'the 1,000th row deleted: the 1,001st is the first broken link');
SELECT is((:'big'::jsonb)->>'rows', '40000', 'all 40,000 rows of the large tenant counted');
SELECT is((:'big'::jsonb)->>'first_broken_id', :'big_first', 'its first row is its first broken link');
SELECT cmp_ok(:grew_kb::bigint, '<', 65536::bigint,
              format('verifying 160 MB of audit rows grew the backend''s peak memory by less than 64 MB (%s kB)', :grew_kb));

SELECT * FROM finish();
