-- The hostile session's toolkit (SECURITY_MATRIX H.48, issue 11 §1), included by 08_owner_sql.sql
-- and ingest/01_owner_sql.sql. Set the psql variable `attacker` to a schema the role can CREATE in.
--
-- A probe, pg_temp.probe(tag, value), counts every run in temporary sequences (nextval survives any
-- rollback, so a probe that ran inside a subtransaction ctxguard rolled back is still counted) and
-- notes who it ran as. It is wired into:
--   * a DOMAIN over each common pg_catalog type, created in pg_temp under the type's own name, with
--     CHECK (pg_temp.probe(...)): pg_temp comes first for type names unless the path says otherwise,
--     so any SQL that writes `::uuid`, `::jsonb`, `text[]`, ... resolved through the caller's path
--     runs the probe (the array types _text, _uuid, ... come with the domains);
--   * temporary views and tables named like ctxguard's, the demo's and the catalogs' relations;
--   * functions, an aggregate and operators in the attacker's schema, shadowing pg_catalog's for a
--     path that puts that schema first.
-- If the probe ever runs as a superuser, it does what an attacker would: ALTER ROLE session_user
-- SUPERUSER. It only counts while armed, i.e. inside pg_temp.attack(label, statement), which runs
-- one statement and reports {code, value, message, detail, hits, foreign, who}.
-- Everything here names types and operators with their schema, so the toolkit itself is immune.

CREATE TEMP SEQUENCE probe_hits;
CREATE TEMP SEQUENCE probe_foreign;
CREATE TEMP SEQUENCE probe_who;
CREATE TEMP TABLE probe_log (label pg_catalog.text, tag pg_catalog.text, cur pg_catalog.text, sess pg_catalog.text);
-- Another role running the probe in this backend must be able to record itself.
GRANT ALL ON pg_temp.probe_hits, pg_temp.probe_foreign, pg_temp.probe_who, pg_temp.probe_log TO PUBLIC;

CREATE FUNCTION pg_temp.probe(tag pg_catalog.text, v anyelement) RETURNS pg_catalog.bool LANGUAGE plpgsql AS $$
DECLARE
    lbl pg_catalog.text := pg_catalog.current_setting('attack.label', true);
BEGIN
    IF lbl IS NULL OR lbl OPERATOR(pg_catalog.=) '' THEN
        RETURN true;
    END IF;
    PERFORM pg_catalog.nextval('pg_temp.probe_hits'::pg_catalog.regclass);
    IF current_user OPERATOR(pg_catalog.<>) session_user THEN
        PERFORM pg_catalog.nextval('pg_temp.probe_foreign'::pg_catalog.regclass);
        PERFORM pg_catalog.setval('pg_temp.probe_who'::pg_catalog.regclass,
                                  (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user)::pg_catalog.int8);
        IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
            EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', session_user);
        END IF;
    END IF;
    INSERT INTO pg_temp.probe_log VALUES (lbl, tag, current_user, session_user);
    RETURN true;
END
$$;
CREATE FUNCTION pg_temp.probe_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_temp.probe(TG_TABLE_NAME::pg_catalog.text, 1);
    RETURN NULL;
END
$$;
CREATE FUNCTION pg_temp.seq(s pg_catalog.regclass) RETURNS pg_catalog.int8 LANGUAGE plpgsql AS $$
DECLARE n pg_catalog.int8; called pg_catalog.bool;
BEGIN
    EXECUTE pg_catalog.format('SELECT last_value, is_called FROM %s', s) INTO n, called;
    RETURN CASE WHEN called THEN n ELSE 0 END;
END
$$;

-- Run one statement armed; report what it returned or raised, and what the probe saw meanwhile.
CREATE FUNCTION pg_temp.attack(label pg_catalog.text, stmt pg_catalog.text) RETURNS pg_catalog.jsonb LANGUAGE plpgsql AS $$
DECLARE
    h0 pg_catalog.int8 := pg_temp.seq('pg_temp.probe_hits');
    f0 pg_catalog.int8 := pg_temp.seq('pg_temp.probe_foreign');
    v pg_catalog.text;
    code pg_catalog.text := 'ok';
    msg pg_catalog.text;
    det pg_catalog.text;
BEGIN
    PERFORM pg_catalog.setval('pg_temp.probe_who'::pg_catalog.regclass, 1, false);
    PERFORM pg_catalog.set_config('attack.label', label, false);
    BEGIN
        EXECUTE stmt INTO v;
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
    END;
    PERFORM pg_catalog.set_config('attack.label', '', false);
    RETURN pg_catalog.jsonb_build_object(
        'label', label, 'code', code, 'value', v, 'message', msg, 'detail', det,
        'hits', pg_temp.seq('pg_temp.probe_hits') OPERATOR(pg_catalog.-) h0,
        'foreign', pg_temp.seq('pg_temp.probe_foreign') OPERATOR(pg_catalog.-) f0,
        'who', (SELECT r.rolname FROM pg_catalog.pg_roles r
                 WHERE r.oid OPERATOR(pg_catalog.=) pg_temp.seq('pg_temp.probe_who')::pg_catalog.oid),
        'tags', (SELECT pg_catalog.string_agg(DISTINCT l.tag OPERATOR(pg_catalog.||) '@' OPERATOR(pg_catalog.||) l.cur, ' ')
                   FROM pg_temp.probe_log l WHERE l.label OPERATOR(pg_catalog.=) attack.label));
END
$$;
-- The outcome of an attacked call: the SQLSTATE if it raised, else the envelope's error code or status,
-- else 'ok'.
CREATE FUNCTION pg_temp.outcome(r pg_catalog.jsonb) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$
DECLARE j pg_catalog.jsonb;
BEGIN
    IF r OPERATOR(pg_catalog.->>) 'code' OPERATOR(pg_catalog.<>) 'ok' THEN
        RETURN r OPERATOR(pg_catalog.->>) 'code';
    END IF;
    BEGIN
        j := (r OPERATOR(pg_catalog.->>) 'value')::pg_catalog.jsonb;
    EXCEPTION WHEN OTHERS THEN
        RETURN 'ok';
    END;
    IF pg_catalog.jsonb_typeof(j) OPERATOR(pg_catalog.<>) 'object' THEN
        RETURN 'ok';
    END IF;
    RETURN coalesce(j OPERATOR(pg_catalog.#>>) '{error,code}', j OPERATOR(pg_catalog.->>) 'status', 'ok');
END
$$;
-- The attacked call's returned value as jsonb (NULL if it raised or is not JSON).
CREATE FUNCTION pg_temp.val(r pg_catalog.jsonb) RETURNS pg_catalog.jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN (r OPERATOR(pg_catalog.->>) 'value')::pg_catalog.jsonb;
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END
$$;
-- "hits/foreign" for an attack: 0/0 means no object of the caller ran at all. Otherwise the role it
-- last ran as and the objects that ran (those the probe could log) follow.
CREATE FUNCTION pg_temp.ran(r pg_catalog.jsonb) RETURNS pg_catalog.text LANGUAGE sql AS $$
    SELECT pg_catalog.concat(r OPERATOR(pg_catalog.->>) 'hits', '/', r OPERATOR(pg_catalog.->>) 'foreign',
                             ' as ' OPERATOR(pg_catalog.||) (r OPERATOR(pg_catalog.->>) 'who'),
                             ' (' OPERATOR(pg_catalog.||) (r OPERATOR(pg_catalog.->>) 'tags') OPERATOR(pg_catalog.||) ')')
$$;

-- Functions, an aggregate and operators in the attacker's schema that shadow pg_catalog's for a
-- path that lists the schema first. Each runs the probe, then does what the original does.
SELECT set_config('attack.schema', :'attacker', false) \g /dev/null
DO $do$
DECLARE
    s pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_setting('attack.schema'));
    f pg_catalog.record;
BEGIN
    FOR f IN SELECT * FROM (VALUES
        ('now', '', 'pg_catalog.timestamptz', 'pg_catalog.now()'),
        ('clock_timestamp', '', 'pg_catalog.timestamptz', 'pg_catalog.clock_timestamp()'),
        ('statement_timestamp', '', 'pg_catalog.timestamptz', 'pg_catalog.statement_timestamp()'),
        ('transaction_timestamp', '', 'pg_catalog.timestamptz', 'pg_catalog.transaction_timestamp()'),
        ('gen_random_uuid', '', 'pg_catalog.uuid', 'pg_catalog.gen_random_uuid()'),
        ('lower', 'a pg_catalog.text', 'pg_catalog.text', 'pg_catalog.lower(a)'),
        ('upper', 'a pg_catalog.text', 'pg_catalog.text', 'pg_catalog.upper(a)'),
        ('length', 'a pg_catalog.text', 'pg_catalog.int4', 'pg_catalog.length(a)'),
        ('octet_length', 'a pg_catalog.text', 'pg_catalog.int4', 'pg_catalog.octet_length(a)'),
        ('md5', 'a pg_catalog.text', 'pg_catalog.text', 'pg_catalog.md5(a)'),
        ('sha256', 'a pg_catalog.bytea', 'pg_catalog.bytea', 'pg_catalog.sha256(a)'),
        ('encode', 'a pg_catalog.bytea, b pg_catalog.text', 'pg_catalog.text', 'pg_catalog.encode(a, b)'),
        ('split_part', 'a pg_catalog.text, b pg_catalog.text, c pg_catalog.int4', 'pg_catalog.text', 'pg_catalog.split_part(a, b, c)'),
        ('substr', 'a pg_catalog.text, b pg_catalog.int4', 'pg_catalog.text', 'pg_catalog.substr(a, b)'),
        ('strpos', 'a pg_catalog.text, b pg_catalog.text', 'pg_catalog.int4', 'pg_catalog.strpos(a, b)'),
        ('quote_ident', 'a pg_catalog.text', 'pg_catalog.text', 'pg_catalog.quote_ident(a)'),
        ('current_setting', 'a pg_catalog.text', 'pg_catalog.text', 'pg_catalog.current_setting(a)'),
        ('current_setting', 'a pg_catalog.text, b pg_catalog.bool', 'pg_catalog.text', 'pg_catalog.current_setting(a, b)'),
        ('set_config', 'a pg_catalog.text, b pg_catalog.text, c pg_catalog.bool', 'pg_catalog.text', 'pg_catalog.set_config(a, b, c)'),
        ('hashtextextended', 'a pg_catalog.text, b pg_catalog.int8', 'pg_catalog.int8', 'pg_catalog.hashtextextended(a, b)'),
        ('pg_advisory_xact_lock', 'a pg_catalog.int8', 'pg_catalog.void', 'pg_catalog.pg_advisory_xact_lock(a)'),
        ('jsonb_typeof', 'a pg_catalog.jsonb', 'pg_catalog.text', 'pg_catalog.jsonb_typeof(a)'),
        ('jsonb_array_length', 'a pg_catalog.jsonb', 'pg_catalog.int4', 'pg_catalog.jsonb_array_length(a)'),
        ('jsonb_build_object', 'a pg_catalog.text, b pg_catalog.text', 'pg_catalog.jsonb', 'pg_catalog.jsonb_build_object(a, b)'),
        ('jsonb_build_object', 'a pg_catalog.text, b pg_catalog.jsonb', 'pg_catalog.jsonb', 'pg_catalog.jsonb_build_object(a, b)'),
        ('to_jsonb', 'a anyelement', 'pg_catalog.jsonb', 'pg_catalog.to_jsonb(a)'),
        ('to_tsvector', 'a pg_catalog.regconfig, b pg_catalog.text', 'pg_catalog.tsvector', 'pg_catalog.to_tsvector(a, b)'),
        ('to_tsquery', 'a pg_catalog.regconfig, b pg_catalog.text', 'pg_catalog.tsquery', 'pg_catalog.to_tsquery(a, b)'),
        ('plainto_tsquery', 'a pg_catalog.regconfig, b pg_catalog.text', 'pg_catalog.tsquery', 'pg_catalog.plainto_tsquery(a, b)'),
        ('websearch_to_tsquery', 'a pg_catalog.regconfig, b pg_catalog.text', 'pg_catalog.tsquery', 'pg_catalog.websearch_to_tsquery(a, b)'),
        ('ts_rank', 'a pg_catalog.tsvector, b pg_catalog.tsquery', 'pg_catalog.float4', 'pg_catalog.ts_rank(a, b)'),
        ('ts_headline', 'a pg_catalog.regconfig, b pg_catalog.text, c pg_catalog.tsquery, d pg_catalog.text', 'pg_catalog.text', 'pg_catalog.ts_headline(a, b, c, d)'),
        ('array_length', 'a anyarray, b pg_catalog.int4', 'pg_catalog.int4', 'pg_catalog.array_length(a, b)'),
        ('f_texteq', 'a pg_catalog.text, b pg_catalog.text', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.=) b'),
        ('f_textne', 'a pg_catalog.text, b pg_catalog.text', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.<>) b'),
        ('f_textcat', 'a pg_catalog.text, b pg_catalog.text', 'pg_catalog.text', 'a OPERATOR(pg_catalog.||) b'),
        ('f_uuideq', 'a pg_catalog.uuid, b pg_catalog.uuid', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.=) b'),
        ('f_int8eq', 'a pg_catalog.int8, b pg_catalog.int8', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.=) b'),
        ('f_int8pl', 'a pg_catalog.int8, b pg_catalog.int8', 'pg_catalog.int8', 'a OPERATOR(pg_catalog.+) b'),
        ('f_int4eq', 'a pg_catalog.int4, b pg_catalog.int4', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.=) b'),
        ('f_tsgt', 'a pg_catalog.timestamptz, b pg_catalog.timestamptz', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.>) b'),
        ('f_tslt', 'a pg_catalog.timestamptz, b pg_catalog.timestamptz', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.<) b'),
        ('f_jsonb_get_text', 'a pg_catalog.jsonb, b pg_catalog.text', 'pg_catalog.text', 'a OPERATOR(pg_catalog.->>) b'),
        ('f_jsonb_get', 'a pg_catalog.jsonb, b pg_catalog.text', 'pg_catalog.jsonb', 'a OPERATOR(pg_catalog.->) b'),
        ('f_jsonb_contains', 'a pg_catalog.jsonb, b pg_catalog.jsonb', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.@>) b'),
        ('f_jsonb_exists', 'a pg_catalog.jsonb, b pg_catalog.text', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.?) b'),
        ('f_ts_match', 'a pg_catalog.tsvector, b pg_catalog.tsquery', 'pg_catalog.bool', 'a OPERATOR(pg_catalog.@@) b'),
        ('f_count', 'a pg_catalog.int8', 'pg_catalog.int8', 'a OPERATOR(pg_catalog.+) 1')) AS v(name, args, ret, body)
    LOOP
        EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION %s.%I(%s) RETURNS %s LANGUAGE sql VOLATILE AS %L',
                                  s, f.name, f.args, f.ret,
                                  pg_catalog.format('SELECT CASE WHEN pg_temp.probe(%L, 1) THEN %s END', s OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) f.name, f.body));
    END LOOP;
    FOR f IN SELECT * FROM (VALUES
        ('=', 'pg_catalog.text', 'pg_catalog.text', 'f_texteq'), ('<>', 'pg_catalog.text', 'pg_catalog.text', 'f_textne'),
        ('||', 'pg_catalog.text', 'pg_catalog.text', 'f_textcat'), ('=', 'pg_catalog.uuid', 'pg_catalog.uuid', 'f_uuideq'),
        ('=', 'pg_catalog.int8', 'pg_catalog.int8', 'f_int8eq'), ('+', 'pg_catalog.int8', 'pg_catalog.int8', 'f_int8pl'),
        ('=', 'pg_catalog.int4', 'pg_catalog.int4', 'f_int4eq'),
        ('>', 'pg_catalog.timestamptz', 'pg_catalog.timestamptz', 'f_tsgt'), ('<', 'pg_catalog.timestamptz', 'pg_catalog.timestamptz', 'f_tslt'),
        ('->>', 'pg_catalog.jsonb', 'pg_catalog.text', 'f_jsonb_get_text'), ('->', 'pg_catalog.jsonb', 'pg_catalog.text', 'f_jsonb_get'),
        ('@>', 'pg_catalog.jsonb', 'pg_catalog.jsonb', 'f_jsonb_contains'), ('?', 'pg_catalog.jsonb', 'pg_catalog.text', 'f_jsonb_exists'),
        ('@@', 'pg_catalog.tsvector', 'pg_catalog.tsquery', 'f_ts_match')) AS v(op, l, r, fn)
    LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_operator o
                        WHERE o.oprnamespace OPERATOR(pg_catalog.=) pg_catalog.current_setting('attack.schema')::pg_catalog.regnamespace
                          AND o.oprname OPERATOR(pg_catalog.=) f.op AND o.oprleft OPERATOR(pg_catalog.=) f.l::pg_catalog.regtype
                          AND o.oprright OPERATOR(pg_catalog.=) f.r::pg_catalog.regtype) THEN
            EXECUTE pg_catalog.format('CREATE OPERATOR %s.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %s.%I)', s, f.op, f.l, f.r, s, f.fn);
        END IF;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.current_setting('attack.schema')::pg_catalog.regnamespace
                                                          AND p.proname OPERATOR(pg_catalog.=) 'count' AND p.prokind OPERATOR(pg_catalog.=) 'a') THEN
        EXECUTE pg_catalog.format('CREATE AGGREGATE %s.count(*) (SFUNC = %s.f_count, STYPE = pg_catalog.int8, INITCOND = ''0'')', s, s);
    END IF;
END
$do$;

-- Relations named like ctxguard's, the demo's and the catalogs': views that run the probe on every
-- row read (over the real rows where this role may read them), INSTEAD OF triggers for writes.
DO $do$
DECLARE
    n pg_catalog.text;
    src pg_catalog.text;
BEGIN
    FOR n, src IN SELECT * FROM (VALUES
        ('tools', 'ctxguard.tools'), ('tool_policies', 'ctxguard.tool_policies'), ('catalog_version', 'ctxguard.catalog_version'),
        ('page_types', 'ctxguard.page_types'), ('entity_types', 'ctxguard.entity_types'), ('mask_rules', 'ctxguard.mask_rules'),
        ('mcp_servers', 'ctxguard.mcp_servers'), ('namespaces', 'ctxguard.namespaces'), ('audit_log', NULL), ('generations', NULL), ('approvals', NULL),
        ('documents', NULL), ('document_pages', NULL), ('document_sections', NULL), ('document_calls', NULL),
        ('document_coverage', NULL), ('tenant_limits', NULL), ('external_calls', NULL), ('mcp_server_grants', NULL),
        ('conversation_turns', NULL), ('invoices', NULL), ('vendors', NULL), ('matters', NULL), ('touches', NULL),
        ('pg_class', 'pg_catalog.pg_class'), ('pg_proc', 'pg_catalog.pg_proc'), ('pg_roles', 'pg_catalog.pg_roles'),
        ('pg_namespace', 'pg_catalog.pg_namespace'), ('pg_type', 'pg_catalog.pg_type'), ('pg_attribute', '(SELECT attrelid, attname, atttypid, atttypmod, attnum, attnotnull, attisdropped FROM pg_catalog.pg_attribute) AS a'),
        ('pg_extension', 'pg_catalog.pg_extension'), ('pg_ts_config', 'pg_catalog.pg_ts_config'),
        ('pg_settings', 'pg_catalog.pg_settings'), ('pg_database', 'pg_catalog.pg_database')) AS v(n, src)
    LOOP
        EXECUTE pg_catalog.format('CREATE TEMP VIEW %I AS SELECT * FROM %s WHERE pg_temp.probe(%L, 1)',
                                  n, coalesce(src, '(SELECT NULL::pg_catalog.text AS tenant_id, NULL::pg_catalog.text AS id) AS x'), n);
        EXECUTE pg_catalog.format('CREATE FUNCTION pg_temp.%I() RETURNS trigger LANGUAGE plpgsql AS %L',
                                  'instead_' OPERATOR(pg_catalog.||) n,
                                  pg_catalog.format('BEGIN PERFORM pg_temp.probe(%L, 1); RETURN NULL; END', n));
        EXECUTE pg_catalog.format('CREATE TRIGGER probe INSTEAD OF INSERT OR UPDATE OR DELETE ON pg_temp.%I FOR EACH ROW EXECUTE FUNCTION pg_temp.%I()',
                                  n, 'instead_' OPERATOR(pg_catalog.||) n);
    END LOOP;
END
$do$;

-- Last, the type shadows (after them, an unqualified type name in this session means the domain).
DO $do$
DECLARE t pg_catalog.text;
BEGIN
    FOREACH t IN ARRAY ARRAY['uuid', 'jsonb', 'json', 'text', 'varchar', 'bpchar', 'float8', 'float4', 'numeric', 'int2', 'int4', 'int8',
                             'bool', 'regconfig', 'regclass', 'regtype', 'regproc', 'regprocedure', 'regrole', 'regnamespace',
                             'tsvector', 'tsquery', 'timestamptz', 'timestamp', 'date', 'interval', 'oid', 'name', 'bytea']
    LOOP
        EXECUTE pg_catalog.format('CREATE DOMAIN pg_temp.%I AS pg_catalog.%I CHECK (pg_temp.probe(%L, VALUE))', t, t, t);
    END LOOP;
END
$do$;
