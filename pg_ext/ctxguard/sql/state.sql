-- Shared gateway state (issue 20): each user's current page and the MCP sessions, so that any gateway
-- behind a load balancer serves any user and any session. Owner-only tables; the gateway role reaches
-- them through the functions below only. A page is written only from a transaction whose page
-- set_context validated (the page it validated, for the tenant and user of its token); everything
-- else is keyed by the caller's verified token. Changes are announced on the channel ctxguard_pages
-- with an opaque key, never a name: a user's shared page by the user's key (salted hash of tenant and
-- user), a session's own page by 's:' and the session's key (salted hash of its stored hash).
-- A session's last use is recorded here (any gateway may serve it), so that a gateway's idle timeout
-- ends only sessions idle everywhere.

CREATE TABLE ctxguard.state_salt (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    salt      text NOT NULL DEFAULT pg_catalog.gen_random_uuid()::pg_catalog.text
);
COMMENT ON TABLE ctxguard.state_salt IS 'Random salt of the keys announced on the ctxguard_pages channel (owner only).';
INSERT INTO ctxguard.state_salt DEFAULT VALUES;

CREATE TABLE ctxguard.user_pages (
    tenant_id  text NOT NULL,
    user_id    text NOT NULL,
    page       jsonb NOT NULL,
    version    bigint NOT NULL DEFAULT 1,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id)
);
COMMENT ON TABLE ctxguard.user_pages IS 'Each user''s current page (PUT /v1/context, X-Ctxguard-Page), as set_context validated it; written by ctxguard.put_user_page only (owner only).';

CREATE TABLE ctxguard.mcp_sessions (
    id_hash     text PRIMARY KEY,
    tenant_id   text NOT NULL,
    user_id     text NOT NULL,
    init_params jsonb NOT NULL,
    page        jsonb,
    ttl         integer NOT NULL CHECK (ttl BETWEEN 60 AND 86400),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    last_used_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX mcp_sessions_user_idx ON ctxguard.mcp_sessions (tenant_id, user_id);
COMMENT ON TABLE ctxguard.mcp_sessions IS 'MCP sessions: sha256 of the session id, the tenant and user of the token that opened it, its initialize parameters, its own page (validated), its expiry and its last use through any gateway (owner only).';

-- No grants: owner only (the policies satisfy lint's forced-RLS rule for tables with a tenant_id).
ALTER TABLE ctxguard.user_pages ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.user_pages FORCE ROW LEVEL SECURITY;
CREATE POLICY user_pages_owner ON ctxguard.user_pages USING (true) WITH CHECK (true);
ALTER TABLE ctxguard.mcp_sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.mcp_sessions FORCE ROW LEVEL SECURITY;
CREATE POLICY mcp_sessions_owner ON ctxguard.mcp_sessions USING (true) WITH CHECK (true);

-- The opaque key of a user on the ctxguard_pages channel.
CREATE FUNCTION ctxguard._user_key(tenant_id text, user_id text) RETURNS text
    LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.substr(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
               coalesce((SELECT s.salt FROM ctxguard.state_salt s), '') || chr(31) || tenant_id || chr(31) || user_id,
               'UTF8')), 'hex'), 1, 32)
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._user_key(text, text) FROM PUBLIC;

-- The opaque key of a session (given its stored hash) on the ctxguard_pages channel, after 's:'.
CREATE FUNCTION ctxguard._session_key(id_hash text) RETURNS text
    LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.substr(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
               coalesce((SELECT s.salt FROM ctxguard.state_salt s), '') || pg_catalog.chr(31) || 'session'
               || pg_catalog.chr(31) || id_hash,
               'UTF8')), 'hex'), 1, 32)
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._session_key(text) FROM PUBLIC;

-- The page set_context validated in this transaction (NULL without one, or without the library).
CREATE FUNCTION ctxguard._validated_page() RETURNS jsonb
    LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- tenant_id() is NULL unless the preloaded library set a context: only then is ctxguard.page a
    -- superuser-only setting that set_context alone wrote.
    IF ctxguard.tenant_id() IS NULL OR coalesce(current_setting('ctxguard.page', true), '') = '' THEN
        RETURN NULL;
    END IF;
    RETURN pg_catalog.current_setting('ctxguard.page')::pg_catalog.jsonb;
END
$$;
REVOKE EXECUTE ON FUNCTION ctxguard._validated_page() FROM PUBLIC;

CREATE FUNCTION ctxguard.put_user_page() RETURNS jsonb
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t text := ctxguard.tenant_id();
    u text := ctxguard.user_id();
    p jsonb := ctxguard._validated_page();
    k text;
    v bigint;
BEGIN
    PERFORM ctxguard._refuse_inside_handler('put_user_page');
    IF t IS NULL OR u IS NULL OR p IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '28000', MESSAGE = 'ctxguard: no context is set';
    END IF;
    k := ctxguard._user_key(t, u);
    INSERT INTO ctxguard.user_pages AS up (tenant_id, user_id, page) VALUES (t, u, p)
        ON CONFLICT (tenant_id, user_id) DO UPDATE
           SET page = excluded.page, version = up.version + 1, updated_at = now()
         WHERE up.page IS DISTINCT FROM excluded.page
    RETURNING up.version INTO v;
    IF v IS NOT NULL THEN
        -- Delivered at commit, to every gateway listening: nothing is announced that was not written.
        PERFORM pg_notify('ctxguard_pages', k);
    END IF;
    RETURN jsonb_build_object('key', k, 'changed', v IS NOT NULL);
END
$$;
COMMENT ON FUNCTION ctxguard.put_user_page() IS 'Make the page set_context validated in this transaction the current page of the context''s user; announces the user''s key on ctxguard_pages when it changed.';

CREATE FUNCTION ctxguard.put_session_page(session_id text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    t text := ctxguard.tenant_id();
    u text := ctxguard.user_id();
    p jsonb := ctxguard._validated_page();
    h text := pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(coalesce(session_id, ''), 'UTF8')), 'hex');
BEGIN
    PERFORM ctxguard._refuse_inside_handler('put_session_page');
    IF t IS NULL OR u IS NULL OR p IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '28000', MESSAGE = 'ctxguard: no context is set';
    END IF;
    UPDATE ctxguard.mcp_sessions s SET page = p
     WHERE s.id_hash = h
       AND s.tenant_id = t AND s.user_id = u AND s.expires_at > now()
       AND s.page IS DISTINCT FROM p;
    IF FOUND THEN
        -- The session's own key, not the user's: only that session's listeners re-read its page.
        PERFORM pg_catalog.pg_notify('ctxguard_pages', 's:' || ctxguard._session_key(h));
    END IF;
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION ctxguard.put_session_page(text) IS 'Make the page set_context validated in this transaction the own page of one of the context user''s live MCP sessions; announces ''s:'' and the session''s key on ctxguard_pages when it changed.';

-- Who a token is, the user's key and current page, and (given a session id) that session if it is
-- the caller's and live ("session": null otherwise, whoever's it is): its own page and its key on the
-- page channel. With touch_after_ms the call is a use of the session: recorded when the recorded last
-- use is older than that (so not every request writes), and the session is extended past half its
-- lifetime. Without, it only reads (a gateway re-reading a page it was told changed).
CREATE FUNCTION ctxguard.mcp_identity(token text, session_id text DEFAULT NULL, touch_after_ms integer DEFAULT NULL)
    RETURNS jsonb
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
    t text := who->>'tenantId';
    u text := who->>'userId';
    s record;
    res jsonb;
BEGIN
    IF touch_after_ms IS NOT NULL AND touch_after_ms NOT BETWEEN 0 AND 86400000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: touch_after_ms is 0-86400000 milliseconds';
    END IF;
    res := who || pg_catalog.jsonb_build_object(
        'key', ctxguard._user_key(t, u),
        'page', (SELECT up.page FROM ctxguard.user_pages up WHERE up.tenant_id = t AND up.user_id = u));
    IF session_id IS NULL THEN
        RETURN res;
    END IF;
    -- No session has a longer id (mcp_session_open): not worth hashing.
    IF pg_catalog.length(session_id) > 256 THEN
        RETURN res || pg_catalog.jsonb_build_object('session', NULL);
    END IF;
    SELECT ms.id_hash, ms.page, ms.ttl, ms.expires_at, ms.last_used_at INTO s FROM ctxguard.mcp_sessions ms
     WHERE ms.id_hash = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(session_id, 'UTF8')), 'hex')
       AND ms.tenant_id = t AND ms.user_id = u AND ms.expires_at > pg_catalog.now();
    IF NOT FOUND THEN
        RETURN res || pg_catalog.jsonb_build_object('session', NULL);
    END IF;
    IF touch_after_ms IS NOT NULL
       AND (s.last_used_at <= pg_catalog.now() - pg_catalog.make_interval(secs => touch_after_ms / 1000.0)
            OR s.expires_at < pg_catalog.now() + pg_catalog.make_interval(secs => s.ttl / 2)) THEN
        UPDATE ctxguard.mcp_sessions ms
           SET last_used_at = pg_catalog.now(),
               expires_at = GREATEST(ms.expires_at, pg_catalog.now() + pg_catalog.make_interval(secs => ms.ttl))
         WHERE ms.id_hash = s.id_hash;
    END IF;
    RETURN res || pg_catalog.jsonb_build_object('session',
        pg_catalog.jsonb_build_object('page', s.page, 'key', ctxguard._session_key(s.id_hash)));
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_identity(text, text, integer) IS 'The token''s identity, the user''s key and current page, and the caller''s live MCP session of that id (its own page and key; else "session": null); with touch_after_ms, records a use of the session (throttled).';

CREATE FUNCTION ctxguard.mcp_session_open(token text, session_id text, init_params jsonb, ttl integer DEFAULT 3600)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
    t text := who->>'tenantId';
    u text := who->>'userId';
BEGIN
    PERFORM ctxguard._refuse_inside_handler('mcp_session_open');
    IF session_id IS NULL OR length(session_id) NOT BETWEEN 16 AND 256 OR session_id !~ '^[!-~]+$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: a session id is 16-256 printable ASCII characters';
    END IF;
    IF init_params IS NULL OR jsonb_typeof(init_params) <> 'object' OR octet_length(init_params::pg_catalog.text) > 65536 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: init_params must be an object of at most 64 KiB';
    END IF;
    IF ttl IS NULL OR ttl NOT BETWEEN 60 AND 86400 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: a session lifetime is 60-86400 seconds';
    END IF;
    DELETE FROM ctxguard.mcp_sessions ms WHERE ms.tenant_id = t AND ms.user_id = u AND ms.expires_at <= now();
    IF (SELECT count(*) FROM ctxguard.mcp_sessions ms WHERE ms.tenant_id = t AND ms.user_id = u) >= 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '54000', MESSAGE = 'ctxguard: a user holds at most 1000 live MCP sessions';
    END IF;
    INSERT INTO ctxguard.mcp_sessions (id_hash, tenant_id, user_id, init_params, ttl, expires_at)
    VALUES (encode(sha256(convert_to(session_id, 'UTF8')), 'hex'), t, u, init_params, ttl,
            now() + make_interval(secs => ttl))
    ON CONFLICT (id_hash) DO NOTHING;
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_open(text, text, jsonb, integer) IS 'Record an MCP session for the token''s user (any gateway can then serve it).';

CREATE FUNCTION ctxguard.mcp_session_load(token text, session_id text) RETURNS jsonb
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
BEGIN
    RETURN (SELECT ms.init_params FROM ctxguard.mcp_sessions ms
             WHERE ms.id_hash = encode(sha256(convert_to(coalesce(session_id, ''), 'UTF8')), 'hex')
               AND ms.tenant_id = who->>'tenantId' AND ms.user_id = who->>'userId' AND ms.expires_at > now());
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_load(text, text) IS 'The initialize parameters of the caller''s live MCP session of that id, or NULL (whoever''s it is).';

CREATE FUNCTION ctxguard.mcp_session_close(token text, session_id text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
BEGIN
    PERFORM ctxguard._refuse_inside_handler('mcp_session_close');
    DELETE FROM ctxguard.mcp_sessions ms
     WHERE ms.id_hash = encode(sha256(convert_to(coalesce(session_id, ''), 'UTF8')), 'hex')
       AND ms.tenant_id = who->>'tenantId' AND ms.user_id = who->>'userId';
    RETURN FOUND;
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_close(text, text) IS 'End the caller''s MCP session of that id (every gateway then answers 404 for it).';

-- A gateway's idle timeout: ends the caller's session only if no gateway used it for idle_ms (its
-- recorded last use; gateways record uses throttled, so they pass their timeout plus the throttle).
-- NULL: no such live session of the caller (ended elsewhere, expired, another user's, never was);
-- {"ended": true}: ended now; {"ended": false, "idleMs": n}: used n ms ago, it lives on.
CREATE FUNCTION ctxguard.mcp_session_expire(token text, session_id text, idle_ms integer) RETURNS jsonb
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    who jsonb := ctxguard.verify_token(token);
    used timestamptz;
    h text;
BEGIN
    PERFORM ctxguard._refuse_inside_handler('mcp_session_expire');
    IF session_id IS NULL OR pg_catalog.length(session_id) NOT BETWEEN 16 AND 256 OR session_id !~ '^[!-~]+$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: a session id is 16-256 printable ASCII characters';
    END IF;
    IF idle_ms IS NULL OR idle_ms NOT BETWEEN 1000 AND 172800000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: idle_ms is 1000-172800000 milliseconds';
    END IF;
    h := pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(session_id, 'UTF8')), 'hex');
    -- Locked: a use recorded meanwhile (mcp_identity, mcp_session_touch) waits, then finds it gone.
    SELECT ms.last_used_at INTO used FROM ctxguard.mcp_sessions ms
     WHERE ms.id_hash = h AND ms.tenant_id = who->>'tenantId' AND ms.user_id = who->>'userId'
       AND ms.expires_at > pg_catalog.now()
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF used <= pg_catalog.now() - pg_catalog.make_interval(secs => idle_ms / 1000.0) THEN
        DELETE FROM ctxguard.mcp_sessions ms WHERE ms.id_hash = h;
        RETURN pg_catalog.jsonb_build_object('ended', true);
    END IF;
    RETURN pg_catalog.jsonb_build_object('ended', false,
        'idleMs', pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now() - used) * 1000)::pg_catalog.int8);
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_expire(text, text, integer) IS 'End the caller''s MCP session of that id if no gateway used it for idle_ms; else how long ago it was used (NULL: no such live session of the caller).';

-- The sessions a gateway holds event streams on are in use: one call per tick of its reaper records
-- it for all of them (throttled as in mcp_identity), each only for its own token's user. A token
-- that no longer verifies is skipped, not an error (one user's expired token must not stop the
-- others'). Returns the given session ids (of tokens that verify) that name no live session of
-- their token's user: ended or expired, through any gateway; the gateway closes their streams.
CREATE FUNCTION ctxguard.mcp_session_touch(sessions jsonb, touch_after_ms integer) RETURNS text[]
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tok text;
    ids text[];
    who jsonb;
    hashes text[];
    lost text[];
    gone text[] := '{}';
BEGIN
    PERFORM ctxguard._refuse_inside_handler('mcp_session_touch');
    IF touch_after_ms IS NULL OR touch_after_ms NOT BETWEEN 0 AND 86400000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: touch_after_ms is 0-86400000 milliseconds';
    END IF;
    IF sessions IS NULL OR pg_catalog.jsonb_typeof(sessions) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects';
    END IF;
    IF pg_catalog.jsonb_array_length(sessions) > 1000 OR pg_catalog.octet_length(sessions::pg_catalog.text) > 8388608 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.jsonb_array_elements(sessions) e
                WHERE pg_catalog.jsonb_typeof(e) <> 'object'
                   OR pg_catalog.jsonb_typeof(e->'token') IS DISTINCT FROM 'string'
                   OR pg_catalog.jsonb_typeof(e->'sessionId') IS DISTINCT FROM 'string') THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'ctxguard: sessions is an array of at most 1000 {token, sessionId} objects';
    END IF;
    -- Each token with its ids, grouped in one pass. A pass over the whole batch per token copied
    -- every entry once per token: 1,000 entries of 1,000 distinct 8 kB tokens (within the 8 MB
    -- limit) took 12.8 s of the backend besides verifying them, 0.34 s grouped.
    FOR tok, ids IN SELECT e->>'token', pg_catalog.array_agg(e->>'sessionId')
                      FROM pg_catalog.jsonb_array_elements(sessions) e GROUP BY 1 LOOP
        BEGIN
            who := ctxguard.verify_token(tok);
        EXCEPTION WHEN invalid_authorization_specification THEN
            CONTINUE;
        END;
        -- This token's ids: the hashes of those naming a live session of its user, and the others.
        SELECT pg_catalog.array_agg(x.h) FILTER (WHERE x.live), pg_catalog.array_agg(x.id) FILTER (WHERE NOT x.live)
          INTO hashes, lost
          FROM (SELECT s.id, k.h,
                       k.h IS NOT NULL AND EXISTS (
                           SELECT FROM ctxguard.mcp_sessions ms
                            WHERE ms.id_hash = k.h AND ms.tenant_id = who->>'tenantId'
                              AND ms.user_id = who->>'userId' AND ms.expires_at > pg_catalog.now()) AS live
                  FROM pg_catalog.unnest(ids) AS s(id)
                 CROSS JOIN LATERAL (
                       SELECT CASE WHEN pg_catalog.length(s.id) <= 256
                                   THEN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(s.id, 'UTF8')), 'hex')
                              END AS h) k) x;
        gone := gone || coalesce(lost, '{}');
        UPDATE ctxguard.mcp_sessions ms
           SET last_used_at = pg_catalog.now(),
               expires_at = GREATEST(ms.expires_at, pg_catalog.now() + pg_catalog.make_interval(secs => ms.ttl))
         WHERE ms.id_hash = ANY (hashes) AND ms.tenant_id = who->>'tenantId' AND ms.user_id = who->>'userId'
           AND ms.expires_at > pg_catalog.now()
           AND (ms.last_used_at <= pg_catalog.now() - pg_catalog.make_interval(secs => touch_after_ms / 1000.0)
                OR ms.expires_at < pg_catalog.now() + pg_catalog.make_interval(secs => ms.ttl / 2));
    END LOOP;
    RETURN gone;
END
$$;
COMMENT ON FUNCTION ctxguard.mcp_session_touch(jsonb, integer) IS 'Record a use of the given MCP sessions ([{token, sessionId}], at most 1000), each for its own token''s user only, when the recorded one is older than touch_after_ms; returns the given ids (of tokens that verify) that name no live session of their token''s user.';

-- save_turn's turn counter per conversation (issue 29): the row lock that orders a conversation's
-- turns. No grants, so no other role can lock it (an advisory lock key anyone could compute let
-- any role stall a user's chat turn).
CREATE TABLE ctxguard.conversation_heads (
    tenant_id       text NOT NULL,
    user_id         text NOT NULL,
    conversation_id text NOT NULL,
    turns           integer NOT NULL,
    PRIMARY KEY (tenant_id, user_id, conversation_id)
);
COMMENT ON TABLE ctxguard.conversation_heads IS 'The last turn number of each conversation; written by ctxguard.save_turn only (owner only).';
ALTER TABLE ctxguard.conversation_heads ENABLE ROW LEVEL SECURITY;
ALTER TABLE ctxguard.conversation_heads FORCE ROW LEVEL SECURITY;
CREATE POLICY conversation_heads_owner ON ctxguard.conversation_heads USING (true) WITH CHECK (true);
