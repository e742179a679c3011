#!/usr/bin/env bash
# Masking throughput: ctxguard.mask_text with the 8 built-in rules on mixed text, against md5() of
# the same text in the same run (in-database, as the superuser: mask_text is a DBA's tool).
#
#   bench/mask_bench.sh            # build+install (release), set up, verify, measure, print a table
#   bench/mask_bench.sh --write    # ... and rewrite the mask_bench results block of BENCHMARKS.md
#
# Environment:
#   BENCH_REPS       timed repetitions per text (default 5; the median is reported)
#   BENCH_MIXED_MB   size of the mixed and the secret-free texts in MB (default 8)
#   BENCH_EMAIL_MB   size of the e-mail list in MB (default 8; the masker before issue 12 needs
#                    minutes for 8 MB of e-mail addresses: use 1 to measure it)
#   BENCH_RUN        cluster directory (default /tmp/ctxguard-bench, shared with the other benches)
#   BENCH_PGPORT     cluster port (default 54339)
#   CTXGUARD_PROFILE build profile (default release)
#
# Texts (generated in SQL, deterministic; lines of about 90 bytes):
#   - mixed: English, Russian and Japanese lines of technical prose; every 8th line holds a secret,
#     the 8 rules in turn (e-mail, card, IBAN, phone, OpenAI key, AWS key, JWT, fullwidth e-mail with
#     a bearer token): ~1 secret per 730 bytes;
#   - prose: the same lines without secrets (what most document pages are);
#   - e-mail list: one address per line (the shape that made the old masker quadratic).
# Each is masked BENCH_REPS times with ctxguard.mask_text (the call, including turning the masked
# text into its jsonb result) and hashed as many times with md5() (the baseline: one pass over the
# same bytes in C); both are timed with clock_timestamp() inside one PL/pgSQL function.
#
# Only talks to the local cluster. Idempotent: the database ctxguard_maskbench is recreated each run.
set -euo pipefail

BENCH_NAME=mask_bench
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DB=ctxguard_maskbench
REPS=${BENCH_REPS:-5}
MIXED_MB=${BENCH_MIXED_MB:-8}
EMAIL_MB=${BENCH_EMAIL_MB:-8}
bench_args "$@"

OUT=$(bench_out)

# ------------------------------------------------------------------------------------------------
# 1. Build, install, cluster, database, texts.
# ------------------------------------------------------------------------------------------------
bench_cluster
psql_su -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
log "generating the texts (mixed and prose ${MIXED_MB} MB, e-mail list ${EMAIL_MB} MB)"
psql_su -d "$DB" -o /dev/null -v mixed_bytes=$((MIXED_MB * 1000000)) -v email_bytes=$((EMAIL_MB * 1000000)) <<'SQL'
SET client_min_messages = warning;
CREATE EXTENSION ctxguard;
CREATE SCHEMA maskbench;
CREATE FUNCTION maskbench.prose(i int) RETURNS text LANGUAGE sql IMMUTABLE RETURN CASE i % 4
    WHEN 0 THEN format('To configure node srv-%s, set quota_mb to %s and restart the orion-api service; verify with orion status.', i % 40, i % 997)
    WHEN 1 THEN format('Настройка узла srv-%s: установите quota_mb в %s и перезапустите службу orion-api.', i % 40, i % 997)
    WHEN 2 THEN format('Invoice ACME-2026-%s totals %s.00 EUR, due 2026-10-04; see section 4.2.1 on page 17.', i % 9000, i % 5000)
    ELSE format('ノード srv-%s の設定: quota_mb を %s にしてから orion-api を再起動します。', i % 40, i % 997) END;
CREATE FUNCTION maskbench.secret(i int) RETURNS text LANGUAGE sql IMMUTABLE RETURN CASE (i / 8) % 8
    WHEN 0 THEN format('Contact ivan.petrov%s@example.com for access to the staging cluster.', i)
    WHEN 1 THEN 'The card 4111 1111 1111 1111 was charged for the annual support plan.'
    WHEN 2 THEN 'Refunds go to IBAN DE89 3704 0044 0532 0130 00 at the end of the month.'
    WHEN 3 THEN format('Call the hotline on +49 30 1234 %s during business hours.', 1000 + i % 9000)
    WHEN 4 THEN format('Never paste sk-proj-abcdefghijklmnop%s into a ticket.', i)
    WHEN 5 THEN 'The AWS key AKIAIOSFODNN7EXAMPLE was rotated after the incident.'
    WHEN 6 THEN 'Session eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U expired.'
    ELSE 'Obfuscated ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ, header Authorization: Bearer abcdefghijklmnop1234567890.' END;
CREATE TABLE maskbench.texts (kind text PRIMARY KEY, t text NOT NULL);
-- Whole lines, as many as fit in the size.
CREATE FUNCTION maskbench.text_of(lines text[], bytes int) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(l, E'\n' ORDER BY i) FROM (
        SELECT i, l, sum(octet_length(l) + 1) OVER (ORDER BY i) AS upto FROM unnest(lines) WITH ORDINALITY AS u(l, i)) x
     WHERE upto <= bytes + 1
$$;
INSERT INTO maskbench.texts
SELECT 'mixed', maskbench.text_of(array_agg(CASE WHEN i % 8 = 7 THEN maskbench.secret(i) ELSE maskbench.prose(i) END ORDER BY i), :mixed_bytes)
  FROM generate_series(1, :mixed_bytes / 60) i;
INSERT INTO maskbench.texts
SELECT 'prose', maskbench.text_of(array_agg(maskbench.prose(i) ORDER BY i), :mixed_bytes) FROM generate_series(1, :mixed_bytes / 60) i;
INSERT INTO maskbench.texts
SELECT 'emails', maskbench.text_of(array_agg(format('user%s@mail%s.example.com', i, i % 97) ORDER BY i), :email_bytes)
  FROM generate_series(1, :email_bytes / 20) i;

CREATE UNLOGGED TABLE maskbench.timings (kind text, what text, rep int, ms float8);
-- Raise ctxguard.max_mask_bytes for this session (a build without the setting has no cap).
CREATE FUNCTION maskbench.raise_cap() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('ctxguard.max_mask_bytes', '1GB', false);
EXCEPTION WHEN OTHERS THEN
    NULL;
END $$;
-- Each repetition: mask_text, then md5, of the same (already detoasted) text.
CREATE FUNCTION maskbench.run(reps int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r record;
    t0 timestamptz;
    m jsonb;
BEGIN
    PERFORM maskbench.raise_cap();
    FOR r IN SELECT kind, t FROM maskbench.texts ORDER BY kind LOOP
        m := ctxguard.mask_text(r.t);   -- warm-up (compiles the rules)
        FOR i IN 1 .. reps LOOP
            t0 := clock_timestamp();
            m := ctxguard.mask_text(r.t);
            INSERT INTO maskbench.timings VALUES (r.kind, 'mask_text', i, extract(epoch FROM clock_timestamp() - t0) * 1000);
            t0 := clock_timestamp();
            PERFORM md5(r.t);
            INSERT INTO maskbench.timings VALUES (r.kind, 'md5', i, extract(epoch FROM clock_timestamp() - t0) * 1000);
        END LOOP;
    END LOOP;
END $$;
SQL

# ------------------------------------------------------------------------------------------------
# 2. Correctness before speed: every secret of the mixed text is masked, the prose is untouched.
# ------------------------------------------------------------------------------------------------
log "verifying the masking of the texts"
check=$(psql_su -d "$DB" -At -F '|' <<'SQL'
SELECT maskbench.raise_cap() \g /dev/null
WITH m AS (SELECT kind, ctxguard.mask_text(t) AS r, (length(t) - length(replace(t, E'\n', ''))) + 1 AS lines
             FROM maskbench.texts)
SELECT kind, lines,
       coalesce((SELECT sum(v::int) FROM jsonb_each_text(r->'masked') AS e(k, v)), 0),
       (r->>'text') ~ '(4111 1111|DE89 3704|ivan\.petrov|\+49 30 1234|sk-proj-|AKIAIOSF|eyJhbGci|ｉｖａｎ|Bearer abcdef)'
  FROM m ORDER BY kind;
SQL
)
while IFS='|' read -r kind lines masked leaked; do
  case $kind in
    emails) [ "$masked" = "$lines" ] || die "e-mail list: $masked of $lines addresses masked" ;;
    prose) [ "$masked" = 0 ] || die "prose: $masked matches in text without secrets" ;;
    # Every 8th line holds one secret, the last kind two (a fullwidth e-mail and a bearer token).
    mixed) want=$(( (lines / 8) + (lines / 64) ))
           [ $(( masked - want )) -le 2 ] && [ $(( want - masked )) -le 2 ] || die "mixed: $masked masked, want about $want" ;;
  esac
  [ "$leaked" = f ] || die "$kind: a secret is left in the masked text"
done <<<"$check"
log "ok: every secret masked, nothing in the prose"

# ------------------------------------------------------------------------------------------------
# 3. Measure.
# ------------------------------------------------------------------------------------------------
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "measuring ($REPS repetitions per text)"
psql_su -d "$DB" -o /dev/null -c "SELECT maskbench.run($REPS)"

# ------------------------------------------------------------------------------------------------
# 4. Report.
# ------------------------------------------------------------------------------------------------
# The backticks below are Markdown code spans, not command substitutions.
# shellcheck disable=SC2016
report() {
  printf '| text | MB | secrets masked | `mask_text` median ms | `mask_text` MB/s | `md5` median ms | `md5` MB/s | `mask_text` / `md5` time |\n'
  printf '|---|---:|---:|---:|---:|---:|---:|---:|\n'
  psql_su -d "$DB" -At -F '|' <<'SQL' | while IFS='|' read -r label mb masked mask_ms mask_mbs md5_ms md5_mbs ratio; do
SELECT maskbench.raise_cap() \g /dev/null
WITH med AS (
  SELECT kind, what, percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS ms FROM maskbench.timings GROUP BY kind, what
), sizes AS (
  SELECT kind, octet_length(t) / 1e6 AS mb,
         (SELECT coalesce(sum(v::int), 0) FROM jsonb_each_text(ctxguard.mask_text(t)->'masked') AS e(k, v)) AS masked
    FROM maskbench.texts
)
SELECT CASE s.kind WHEN 'mixed' THEN 'mixed: prose in 3 scripts, a secret every ~730 bytes'
                   WHEN 'prose' THEN 'prose without secrets' ELSE 'e-mail addresses, one per line' END,
       round(s.mb, 1), s.masked,
       round(a.ms::numeric, 1), round((s.mb / (a.ms / 1000))::numeric, 0),
       round(b.ms::numeric, 1), round((s.mb / (b.ms / 1000))::numeric, 0),
       round((a.ms / b.ms)::numeric, 1)
  FROM sizes s JOIN med a ON a.kind = s.kind AND a.what = 'mask_text' JOIN med b ON b.kind = s.kind AND b.what = 'md5'
 ORDER BY s.kind DESC;
SQL
    printf '| %s | %s | %s | %s | %s | %s | %s | %s× |\n' "$label" "$mb" "$masked" "$mask_ms" "$mask_mbs" "$md5_ms" "$md5_mbs" "$ratio"
  done
  printf '\nRun: %s, commit %s, %s build, %s repetitions per text (median), `ctxguard.max_mask_bytes` raised to 1 GB for the run, load average before: %s.\n' \
    "$(date -u +%Y-%m-%dT%H:%MZ)" "$(bench_rev pg_ext)" "$PROFILE" "$REPS" "$load_before"
  bench_machine "in-database timing with clock_timestamp()"
}

bench_report report
