//! Every `ctxguard.*` setting in one place.
//!
//! Two groups:
//! - **context** settings hold the verified context of the current transaction. They are `SUSET`,
//!   excluded from `RESET ALL`, and written only by `ctxguard.set_context` with `GUC_ACTION_LOCAL`,
//!   so a non-superuser can neither `SET`, `SET LOCAL`, `RESET` nor `set_config` them, and they
//!   vanish at COMMIT/ROLLBACK (or ROLLBACK TO SAVEPOINT).
//! - **configuration** settings are set by the DBA (postgresql.conf, `ALTER SYSTEM`,
//!   `ALTER DATABASE ... SET`). Key material is `SUPERUSER_ONLY`: non-superusers cannot read it.

use std::ffi::{CStr, CString};

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

pub static TENANT_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static USER_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static ROLES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static PAGE_TYPE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static ENTITY_TYPE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static ENTITY_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static GENERATION: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static TRACE_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static CONTEXT: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// The page set_context validated, as JSON (what `ctxguard.put_user_page` stores).
pub static PAGE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

pub static JWT_SECRET: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static JWT_PUBLIC_KEY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static JWT_SECRET_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static JWT_PUBLIC_KEY_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);
pub static DEFAULT_RUN_AS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static MAX_EXTERNAL_RESULT_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);
pub static JWT_AUDIENCE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static JWT_ISSUER: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static JWKS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static JWKS_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static CLAIM_TENANT: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"tenant_id"));
pub static CLAIM_ROLES: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"roles"));
pub static JWT_LEEWAY: GucSetting<i32> = GucSetting::<i32>::new(30);
pub static MAX_ARG_BYTES: GucSetting<i32> = GucSetting::<i32>::new(16 * 1024);
pub static GENERATION_TTL: GucSetting<i32> = GucSetting::<i32>::new(3600);
pub static APPROVAL_TTL: GucSetting<i32> = GucSetting::<i32>::new(900);
pub static EXTERNAL_CALL_TTL: GucSetting<i32> = GucSetting::<i32>::new(300);
pub static MAX_OFFERED_TOOLS_PER_SERVER: GucSetting<i32> = GucSetting::<i32>::new(8);
/// Most memory (kB) a backend keeps of the catalog (see `cache.rs`).
pub static CATALOG_CACHE_SIZE: GucSetting<i32> = GucSetting::<i32>::new(8 * 1024);
pub static MCP_ADMIN_ROLE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"admin"));

/// The context role of a tenant's admin: may set and delete the tenant's upstream secrets
/// (`credentials.rs`).
pub static TENANT_ADMIN_ROLE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"tenant_admin"));

pub static MAX_PAGES_PER_CALL: GucSetting<i32> = GucSetting::<i32>::new(5);
pub static MAX_CALLS_PER_DOCUMENT: GucSetting<i32> = GucSetting::<i32>::new(10);
pub static MAX_BYTES_PER_GENERATION: GucSetting<i32> = GucSetting::<i32>::new(20 * 1024);
pub static MAX_SECTION_TOKENS: GucSetting<i32> = GucSetting::<i32>::new(2000);
pub static MAX_SEARCH_RESULTS: GucSetting<i32> = GucSetting::<i32>::new(5);
pub static MAX_DOCUMENT_COVERAGE: GucSetting<f64> = GucSetting::<f64>::new(0.3);
pub static MAX_BYTES_PER_USER_DAY: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024 * 1024);
pub static AUDIT_WAIT: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static AUDIT_WAIT_TIMEOUT: GucSetting<i32> = GucSetting::<i32>::new(10);
pub static SEARCH_RANK_CHECK: GucSetting<bool> = GucSetting::<bool>::new(false);
pub static AUDIT_WRITER_IDLE: GucSetting<i32> = GucSetting::<i32>::new(60);
pub static LEDGER_GENERATIONS: GucSetting<i32> = GucSetting::<i32>::new(262_144);
pub static LEDGER_DOCUMENT_CALLS: GucSetting<i32> = GucSetting::<i32>::new(262_144);
pub static LEDGER_COVERAGE: GucSetting<i32> = GucSetting::<i32>::new(16_384);
pub static LEDGER_USER_DAYS: GucSetting<i32> = GucSetting::<i32>::new(32_768);
pub static LEDGER_QUOTAS: GucSetting<i32> = GucSetting::<i32>::new(65_536);
pub static LEDGER_OWNERS: GucSetting<i32> = GucSetting::<i32>::new(65_536);
pub static LEDGER_TENANT_SHARE: GucSetting<i32> = GucSetting::<i32>::new(25);
pub static LEDGER_USER_SHARE: GucSetting<i32> = GucSetting::<i32>::new(5);
pub static MAX_MASK_BYTES: GucSetting<i32> = GucSetting::<i32>::new(8 * 1024 * 1024);
pub static MAX_TURN_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

/// `(setting, GUC name)` of every context setting, in the order `set_context` writes them.
pub const CONTEXT_GUCS: [(&GucSetting<Option<CString>>, &CStr); 10] = [
    (&TENANT_ID, c"ctxguard.tenant_id"),
    (&USER_ID, c"ctxguard.user_id"),
    (&ROLES, c"ctxguard.roles"),
    (&PAGE_TYPE, c"ctxguard.page_type"),
    (&ENTITY_TYPE, c"ctxguard.entity_type"),
    (&ENTITY_ID, c"ctxguard.entity_id"),
    (&GENERATION, c"ctxguard.generation"),
    (&TRACE_ID, c"ctxguard.trace_id"),
    (&CONTEXT, c"ctxguard.context"),
    (&PAGE, c"ctxguard.page"),
];

/// (name, description, setting, min, max, flags) of an integer limit.
type IntGuc = (
    &'static CStr,
    &'static CStr,
    &'static GucSetting<i32>,
    i32,
    i32,
    GucFlags,
);

/// The shares of the ledger's tables one tenant and one user may hold (reloadable).
fn init_ledger_shares() {
    GucRegistry::define_int_guc(
        c"ctxguard.ledger_tenant_share",
        c"Percent of each shared-memory ledger table (and of ctxguard.ledger_owners) one tenant may hold.",
        c"A tenant at its share gets CAPACITY_EXCEEDED for new entries; other tenants keep theirs.",
        &LEDGER_TENANT_SHARE,
        1,
        100,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"ctxguard.ledger_user_share",
        c"Percent of each shared-memory ledger table one user may hold (at most the tenant's share).",
        c"A user at their share gets CAPACITY_EXCEEDED for new entries; other users keep theirs.",
        &LEDGER_USER_SHARE,
        1,
        100,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

pub fn init() {
    init_ledger_shares();
    let ctx_flags = GucFlags::NO_RESET_ALL | GucFlags::NOT_WHILE_SEC_REST | GucFlags::NO_SHOW_ALL;
    for (setting, name) in CONTEXT_GUCS {
        GucRegistry::define_string_guc(
            name,
            c"ctxguard context (set only by ctxguard.set_context)",
            c"Transaction-local; written by ctxguard.set_context with GUC_ACTION_LOCAL. Read it through the ctxguard.* reader functions.",
            setting,
            GucContext::Suset,
            ctx_flags,
        );
    }
    let secret = GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL;
    GucRegistry::define_string_guc(
        c"ctxguard.jwt_secret",
        c"HS256 shared secret for context tokens (at least 32 bytes).",
        c"Superuser-only. Empty disables HS256.",
        &JWT_SECRET,
        GucContext::Suset,
        secret,
    );
    GucRegistry::define_string_guc(
        c"ctxguard.jwt_public_key",
        c"Ed25519 public key for EdDSA context tokens (PEM or base64url raw key).",
        c"Superuser-only. Empty disables EdDSA.",
        &JWT_PUBLIC_KEY,
        GucContext::Suset,
        secret,
    );
    GucRegistry::define_string_guc(
        c"ctxguard.jwt_secret_file",
        c"File holding the HS256 shared secret (read by the server; used instead of ctxguard.jwt_secret).",
        c"postgresql.conf only. The key itself never appears in a setting that SHOW or pg_settings could reveal.",
        &JWT_SECRET_FILE,
        GucContext::Sighup,
        secret,
    );
    GucRegistry::define_string_guc(
        c"ctxguard.jwt_public_key_file",
        c"File holding the Ed25519 public key (read by the server; used instead of ctxguard.jwt_public_key).",
        c"postgresql.conf only.",
        &JWT_PUBLIC_KEY_FILE,
        GucContext::Sighup,
        secret,
    );
    GucRegistry::define_string_guc(
        c"ctxguard.jwks",
        c"JWKS document (RFC 7517) with the identity provider's public keys, inline.",
        c"Superuser-only. RS256/384/512, PS256/384/512 (RSA 2048-4096 bits), ES256, ES384, EdDSA; the key is chosen by kid. Prefer ctxguard.jwks_file.",
        &JWKS,
        GucContext::Suset,
        secret,
    );
    GucRegistry::define_string_guc(
        c"ctxguard.jwks_file",
        c"File holding the identity provider's JWKS (read by the server; used instead of ctxguard.jwks).",
        c"postgresql.conf only. Re-read when the file changes; after replacing it, SELECT pg_reload_conf(). Keep it current with ctxguard-gateway jwks-sync.",
        &JWKS_FILE,
        GucContext::Sighup,
        secret,
    );
    GucRegistry::define_string_guc(
        c"ctxguard.jwt_issuer",
        c"When set, tokens must carry exactly this issuer in iss.",
        c"",
        &JWT_ISSUER,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"ctxguard.claim_tenant",
        c"Path of the tenant claim in a token (dotted; a segment containing dots in double quotes).",
        c"Examples: tenant_id, app_metadata.tenant_id, \"https://acme.example/tenant\".",
        &CLAIM_TENANT,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"ctxguard.claim_roles",
        c"Path of the roles claim in a token (an array, or a string of space-separated roles).",
        c"Examples: roles, realm_access.roles, scope, \"https://acme.example/roles\".",
        &CLAIM_ROLES,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"ctxguard.default_run_as",
        c"Role that tool handlers run as when a tool's policy names no run_as (read at registration).",
        c"Must be NOSUPERUSER NOBYPASSRLS and own no protected table.",
        &DEFAULT_RUN_AS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"ctxguard.max_external_result_bytes",
        c"Largest upstream MCP result complete_call accepts, in bytes (checked before parsing).",
        c"",
        &MAX_EXTERNAL_RESULT_BYTES,
        1024,
        64 * 1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_string_guc(
        c"ctxguard.jwt_audience",
        c"When set, tokens must carry one of these audiences (comma-separated list) in aud.",
        c"",
        &JWT_AUDIENCE,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"ctxguard.jwt_leeway",
        c"Clock skew allowed for exp/nbf, in seconds.",
        c"",
        &JWT_LEEWAY,
        0,
        300,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.max_arg_bytes",
        c"Largest accepted tool-argument document, in bytes.",
        c"",
        &MAX_ARG_BYTES,
        64,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.generation_ttl",
        c"Lifetime of a generation id minted by ctxguard.begin_generation, in seconds.",
        c"",
        &GENERATION_TTL,
        2,
        86400,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    let limits: [IntGuc; 5] = [
        (
            c"ctxguard.max_pages_per_call",
            c"Most pages one read_doc_pages call may return.",
            &MAX_PAGES_PER_CALL,
            1,
            100,
            GucFlags::default(),
        ),
        (
            c"ctxguard.max_calls_per_document",
            c"Most document-tool calls per document per generation.",
            &MAX_CALLS_PER_DOCUMENT,
            1,
            1000,
            GucFlags::default(),
        ),
        (
            c"ctxguard.max_bytes_per_generation",
            c"Most bytes of tool results returned per generation (all tools).",
            &MAX_BYTES_PER_GENERATION,
            256,
            64 * 1024 * 1024,
            GucFlags::UNIT_BYTE,
        ),
        (
            c"ctxguard.max_section_tokens",
            c"Sections longer than this many (estimated) tokens are trimmed.",
            &MAX_SECTION_TOKENS,
            16,
            100_000,
            GucFlags::default(),
        ),
        (
            c"ctxguard.max_search_results",
            c"Most results one doc_local_search call may return.",
            &MAX_SEARCH_RESULTS,
            1,
            100,
            GucFlags::default(),
        ),
    ];
    for (name, desc, setting, min, max, flags) in limits {
        GucRegistry::define_int_guc(
            name,
            desc,
            c"Per-tenant overrides: ctxguard.tenant_limits.",
            setting,
            min,
            max,
            GucContext::Suset,
            flags,
        );
    }
    GucRegistry::define_float_guc(
        c"ctxguard.max_document_coverage",
        c"Largest share of a document's pages one user may read per day (0..1].",
        c"Stops page iteration spread over many generations. Per-tenant overrides: ctxguard.tenant_limits.",
        &MAX_DOCUMENT_COVERAGE,
        0.01,
        1.0,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"ctxguard.max_bytes_per_user_day",
        c"Most result bytes one user may receive per UTC day, across generations, pages and endpoints.",
        c"Charged in shared memory before a result is returned; no rollback refunds it. Per-tenant overrides: ctxguard.tenant_limits.",
        &MAX_BYTES_PER_USER_DAY,
        1,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_bool_guc(
        c"ctxguard.audit_wait",
        c"call_tool, complete_call and approve_call return only once their audit record is durable.",
        c"off: they return at once; a crash may lose the audit records (and ledger changes) of the last moments.",
        &AUDIT_WAIT,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"ctxguard.search_rank_check",
        c"doc_local_search also ranks every candidate page with ts_rank_cd and fails if the extension's rank differs (a check for tests).",
        c"",
        &SEARCH_RANK_CHECK,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"ctxguard.audit_wait_timeout",
        c"How long a call waits for its audit record to become durable before it fails closed (AUDIT_UNAVAILABLE).",
        c"",
        &AUDIT_WAIT_TIMEOUT,
        1,
        3600,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.audit_writer_idle",
        c"Seconds without work after which a database's audit writer exits (it restarts on demand).",
        c"",
        &AUDIT_WRITER_IDLE,
        1,
        86400,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.approval_ttl",
        c"Lifetime of a pending approval, in seconds.",
        c"",
        &APPROVAL_TTL,
        10,
        86400,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.external_call_ttl",
        c"Time an upstream MCP call authorized by Gate B has to be completed, in seconds.",
        c"",
        &EXTERNAL_CALL_TTL,
        5,
        3600,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.max_mask_bytes",
        c"Most bytes of text masked for one tool result or one mask_text call.",
        c"A larger result is refused (RESULT_TOO_LARGE; mask_text: SQLSTATE 54000), never returned unmasked. Document tools count the page text they mask before trimming it.",
        &MAX_MASK_BYTES,
        64 * 1024,
        1024 * 1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.max_turn_bytes",
        c"Largest chat turn save_turn stores: message, answer and tool_calls (as JSON text) together, in bytes.",
        c"A larger turn is refused with SQLSTATE 54000.",
        &MAX_TURN_BYTES,
        1024,
        64 * 1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.catalog_cache_size",
        c"Most memory each backend keeps of the catalog (tools, page types' tool lists, page types).",
        c"What calls read of the catalog is kept up to this size, then dropped and read again as needed; a page type's tool list larger than this is read for each call. See ctxguard.catalog_stats().",
        &CATALOG_CACHE_SIZE,
        256,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"ctxguard.max_offered_tools_per_server",
        c"Most tools of one upstream MCP server in the list visible_tools(query, top_k) offers.",
        c"Upstream servers share what the page's own tools leave of top_k, taking turns.",
        &MAX_OFFERED_TOOLS_PER_SERVER,
        1,
        1000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"ctxguard.mcp_admin_role",
        c"Context role that may use every enabled upstream MCP server; empty disables it.",
        c"",
        &MCP_ADMIN_ROLE,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"ctxguard.tenant_admin_role",
        c"Context role that may set and delete its own tenant's upstream secrets (tenant_secret servers); empty disables it.",
        c"A token's roles name it; it gives nothing else, and no one can read a secret back.",
        &TENANT_ADMIN_ROLE,
        GucContext::Suset,
        GucFlags::default(),
    );
}

/// Non-empty string value of a setting.
pub fn get(setting: &GucSetting<Option<CString>>) -> Option<String> {
    setting
        .get()
        .and_then(|c| c.into_string().ok())
        .filter(|s| !s.is_empty())
}

/// The sizes of the ledger's tables: server-start settings, so defined only while
/// `shared_preload_libraries` is processed (PostgreSQL refuses a PGC_POSTMASTER setting created
/// later, and a library loaded later has no ledger).
pub fn init_ledger_sizes() {
    // The ledger's tables, sized once at server start (shared memory). A table fills to about
    // 85 % before an insert can find both of its key's buckets full; then calls that need a new
    // entry fail closed (AUDIT_UNAVAILABLE, the log names the setting to raise).
    for (name, desc, setting) in [
        (
            c"ctxguard.ledger_generations",
            c"Live generations the shared-memory ledger tracks (their byte budgets); about 48 bytes each.",
            &LEDGER_GENERATIONS,
        ),
        (
            c"ctxguard.ledger_document_calls",
            c"Live (generation, document) call counters in the shared-memory ledger; about 48 bytes each.",
            &LEDGER_DOCUMENT_CALLS,
        ),
        (
            c"ctxguard.ledger_coverage",
            c"Live (user, document, UTC day) coverage bitmaps in the shared-memory ledger; about 176 bytes each.",
            &LEDGER_COVERAGE,
        ),
        (
            c"ctxguard.ledger_user_days",
            c"Live (user, UTC day) byte totals in the shared-memory ledger; about 48 bytes each.",
            &LEDGER_USER_DAYS,
        ),
        (
            c"ctxguard.ledger_quotas",
            c"Live call quota counters (tenant, user or none, tool, window) in the shared-memory ledger; about 48 bytes each.",
            &LEDGER_QUOTAS,
        ),
        (
            c"ctxguard.ledger_owners",
            c"Tenants and users holding entries in the shared-memory ledger (their shares); about 96 bytes each.",
            &LEDGER_OWNERS,
        ),
    ] {
        GucRegistry::define_int_guc(
            name,
            desc,
            c"Rounded up to whole buckets of 16. Takes effect at server start.",
            setting,
            16,
            16_777_216,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
}
