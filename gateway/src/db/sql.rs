//! Every SQL text the gateway sends, in one place, and the settings each of its transactions pins.
//!
//! A server connection is hostile ground: behind a pooler (pgbouncer in transaction mode) the
//! previous client of the same server connection may have left temporary types, domains and
//! tables, session settings (`SET …`, `SET SESSION CHARACTERISTICS …`) or an open lock, and any
//! client of the gateway's role may have given the role defaults (`ALTER ROLE CURRENT_USER SET …`).
//! So:
//!
//! - every statement names every type, function, operator and table by schema (`pg_catalog.text`,
//!   `ctxguard.call_tool(…)`, `OPERATOR(pg_catalog.=)`, `ctxguard.tools`): nothing is looked up
//!   through `search_path`, where `pg_temp` comes first for types and relations.
//!   `gateway/tests/qualified_sql.rs` parses each of [`all_statements`] with PostgreSQL's own
//!   parser (libpg_query) and fails on any unqualified name;
//! - every transaction starts with [`begin`]: `BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE`
//!   (or `READ ONLY` where it only reads) and, in the same simple-query message, pins every
//!   setting in [`PINS`] for the transaction (`SET LOCAL statement_timeout`, then the rest by
//!   `set_config(…, true)` in one `SELECT`), so that nothing a previous client or a role default set can change
//!   a transaction's outcome, write its parameters (the caller's token) to the server log, or hold
//!   a server connection or a lock without bound. Nothing is sent outside such a transaction (the
//!   probe, the LISTEN connection and, in prepared mode, the Parse of a named statement included).
//!
//! Settings a client can set that are NOT pinned, and why ([`UNPINNED`] lists them by name, and
//! `tests/tests/next_client.rs` checks that every user-settable setting of the server is in one of
//! the two lists).

use std::fmt::Write as _;

use crate::config::database::{Commit, Limits};

/// Whether a transaction writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    ReadOnly,
}

/// A pinned setting's value.
#[derive(Debug, Clone, Copy)]
pub enum Value {
    /// This value, as `set_config` takes it.
    Fixed(&'static str),
    /// `Limits::statement_timeout_ms`.
    StatementTimeout,
    /// `Limits::lock_timeout_ms`.
    LockTimeout,
    /// `Limits::idle_in_transaction_timeout_ms`.
    IdleInTransactionTimeout,
    /// `on` for [`Commit::Durable`], `off` for [`Commit::Lazy`].
    SynchronousCommit,
}

/// The settings every gateway transaction pins for itself (as `SET LOCAL` would), in this order, right after its
/// `BEGIN` (which itself fixes `transaction_isolation`, `transaction_read_only` and
/// `transaction_deferrable`), with why.
pub const PINS: &[(&str, Value, &str)] = &[
    (
        "statement_timeout",
        Value::StatementTimeout,
        "first, so that every later statement is bounded: a client's 0 (unbounded) or 1 (every call fails) does not carry over",
    ),
    (
        "lock_timeout",
        Value::LockTimeout,
        "a lock any role can take (or a client's 0) cannot stall a call for longer than this",
    ),
    (
        "idle_in_transaction_session_timeout",
        Value::IdleInTransactionTimeout,
        "a transaction left open (a gateway stalled mid-pipeline) ends and frees its server connection and locks",
    ),
    (
        "log_parameter_max_length_on_error",
        Value::Fixed("0"),
        "an error's log line never carries the statement's parameters (the caller's bearer token, page, arguments)",
    ),
    (
        "search_path",
        Value::Fixed("pg_catalog, pg_temp"),
        "names resolved at run time find the catalog's objects first and the session's temporary schema last",
    ),
    (
        "role",
        Value::Fixed("none"),
        "the transaction runs as the login role, whatever SET ROLE a client of the same login left",
    ),
    (
        "row_security",
        Value::Fixed("on"),
        "with off, a query that row-level security filters fails instead (42501)",
    ),
    (
        "default_transaction_read_only",
        Value::Fixed("off"),
        "a client's on (or SET SESSION CHARACTERISTICS … READ ONLY) does not reach anything this transaction starts",
    ),
    (
        "default_transaction_isolation",
        Value::Fixed("read committed"),
        "likewise for a client's SET SESSION CHARACTERISTICS … ISOLATION LEVEL",
    ),
    (
        "synchronous_commit",
        Value::SynchronousCommit,
        "a durable commit waits for its WAL flush whatever a client set (off only for CTXGUARD_TURN_COMMIT=lazy's transactions)",
    ),
    (
        "debug_print_parse",
        Value::Fixed("off"),
        "would log the statement's parse tree",
    ),
    (
        "debug_print_rewritten",
        Value::Fixed("off"),
        "would log the rewritten tree",
    ),
    (
        "debug_print_plan",
        Value::Fixed("off"),
        "would log the plan, with bound parameter values (the token) as constants",
    ),
    (
        "client_min_messages",
        Value::Fixed("warning"),
        "no debug messages (which can quote values) are sent to the gateway",
    ),
    (
        "jit",
        Value::Fixed("off"),
        "with jit_above_cost = 0 every small statement would be compiled (tens of milliseconds each)",
    ),
    (
        "max_parallel_workers_per_gather",
        Value::Fixed("0"),
        "parallel workers come from max_worker_processes, which ctxguard's audit writer needs too; the gateway's statements are small",
    ),
    (
        "standard_conforming_strings",
        Value::Fixed("on"),
        "string literals mean what they say (backslashes are not escapes)",
    ),
    (
        "transform_null_equals",
        Value::Fixed("off"),
        "`x = NULL` keeps its SQL meaning in anything parsed during the transaction",
    ),
    (
        "array_nulls",
        Value::Fixed("on"),
        "an array literal's NULL is NULL",
    ),
    (
        "exit_on_error",
        Value::Fixed("off"),
        "a client's on would turn the next caller's ordinary refusal (an ERROR) into FATAL: a dropped connection instead of its documented error",
    ),
    (
        "quote_all_identifiers",
        Value::Fixed("off"),
        "names that SQL prints (`regclass` output, `quote_ident`, `format('%I')`) read the same for every caller; ctxguard pins it in its own SQL too (owner.rs PINNED)",
    ),
    (
        "TimeZone",
        Value::Fixed("UTC"),
        "timestamps in answers do not depend on who used the connection before (as the extension pins for its own SQL)",
    ),
    (
        "DateStyle",
        Value::Fixed("ISO, YMD"),
        "likewise for dates rendered as text",
    ),
    (
        "IntervalStyle",
        Value::Fixed("postgres"),
        "likewise for intervals",
    ),
    (
        "extra_float_digits",
        Value::Fixed("1"),
        "likewise for floating-point numbers",
    ),
    (
        "bytea_output",
        Value::Fixed("hex"),
        "likewise for bytea",
    ),
    (
        "default_text_search_config",
        Value::Fixed("pg_catalog.english"),
        "text search without an explicit configuration ranks the same for every caller",
    ),
];

/// Settings only some PostgreSQL majors know, pinned where the server knows them (`set_config`
/// refuses a setting it does not know):
/// - `transaction_timeout` (17+) = 0: a client's 1 would end the next caller's session; the pinned
///   statement and idle timeouts bound a gateway transaction;
/// - `force_parallel_mode` (up to 15) and `debug_parallel_query` (16+) = off: they would start
///   parallel workers for every statement, whatever `max_parallel_workers_per_gather` says;
/// - `restrict_nonsystem_relation_kind` (15.8, 16.4, 17 and later) = empty: a client's `view`
///   would make the next caller's statements that read a view (a DBA's handler, a policy
///   condition) fail.
pub const OPTIONAL_PINS: &[(&str, &str)] = &[
    ("transaction_timeout", "0"),
    ("force_parallel_mode", "off"),
    ("debug_parallel_query", "off"),
    ("restrict_nonsystem_relation_kind", ""),
];

/// User-settable settings (`pg_settings.context = 'user'`) the gateway deliberately does not pin,
/// by group, with why. (The test in `tests/tests/next_client.rs` fails on a setting in neither list.)
pub const UNPINNED: &[(&[&str], &str)] = &[
    (
        &["transaction_isolation", "transaction_read_only", "transaction_deferrable"],
        "fixed by the BEGIN itself",
    ),
    (
        &["transaction_timeout", "force_parallel_mode", "debug_parallel_query", "restrict_nonsystem_relation_kind"],
        "pinned where the server knows them (OPTIONAL_PINS: 0, off, off, empty)",
    ),
    (
        &["default_transaction_deferrable"],
        "only affects SERIALIZABLE READ ONLY transactions; the gateway's are READ COMMITTED",
    ),
    (
        &["client_encoding"],
        "the gateway's connections ask for UTF8 at startup (a startup value outranks role defaults) and pgbouncer restores each client's own before serving it",
    ),
    (
        &["gin_fuzzy_search_limit"],
        "caps the rows a GIN index scan returns, at random: ctxguard pins it to 0 in every statement its functions run (owner.rs PINNED), where its GIN indexes (tool_policies.page_types, document_pages.tsv) are read; the gateway's own statements read no GIN index",
    ),
    (
        &["application_name"],
        "a label in pg_stat_activity and the log prefix; no outcome",
    ),
    (
        &["idle_session_timeout", "tcp_keepalives_count", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_user_timeout", "client_connection_check_interval"],
        "act between transactions or on the connection, not on a transaction (SET LOCAL would be undone before they apply): at worst the server connection closes, which a pool replaces",
    ),
    (
        &[
            "enable_async_append", "enable_bitmapscan", "enable_gathermerge", "enable_hashagg",
            "enable_hashjoin", "enable_incremental_sort", "enable_indexonlyscan", "enable_indexscan",
            "enable_material", "enable_memoize", "enable_mergejoin", "enable_nestloop",
            "enable_parallel_append", "enable_parallel_hash", "enable_partition_pruning",
            "enable_partitionwise_aggregate", "enable_partitionwise_join", "enable_presorted_aggregate",
            "enable_seqscan", "enable_sort", "enable_tidscan", "enable_group_by_reordering",
            "enable_distinct_reordering", "enable_self_join_elimination",
            "cpu_index_tuple_cost", "cpu_operator_cost", "cpu_tuple_cost", "cursor_tuple_fraction",
            "effective_cache_size", "random_page_cost", "seq_page_cost", "parallel_setup_cost",
            "parallel_tuple_cost", "min_parallel_index_scan_size", "min_parallel_table_scan_size",
            "constraint_exclusion", "default_statistics_target", "from_collapse_limit",
            "join_collapse_limit", "geqo", "geqo_effort", "geqo_generations", "geqo_pool_size",
            "geqo_seed", "geqo_selection_bias", "geqo_threshold", "plan_cache_mode",
            "recursive_worktable_factor", "jit_above_cost", "jit_inline_above_cost",
            "jit_optimize_above_cost", "parallel_leader_participation", "max_parallel_workers",
            "effective_io_concurrency", "maintenance_io_concurrency", "io_combine_limit",
            "backend_flush_after", "synchronize_seqscans", "hash_mem_multiplier", "work_mem",
            "commit_siblings", "stats_fetch_consistency",
            "enable_distinct_reordering",
        ],
        "planner and executor tuning: the same rows come out; a plan made slow is bounded by the pinned statement_timeout, and work_mem / hash_mem_multiplier only cap memory that the gateway's small statements do not reach. Every plan made while ctxguard's functions run (their statements, kept or not, and a handler's) is made with the planner's own settings whatever these are (pg_ext owner.rs planner_settings), and ctxguard pins plan_cache_mode in its statements (PINNED)",
    ),
    (
        &[
            "maintenance_work_mem", "logical_decoding_work_mem", "max_parallel_maintenance_workers",
            "temp_buffers", "temp_tablespaces", "default_tablespace", "default_table_access_method",
            "default_toast_compression", "gin_pending_list_limit", "vacuum_cost_delay",
            "vacuum_cost_limit", "vacuum_cost_page_dirty", "vacuum_cost_page_hit",
            "vacuum_cost_page_miss", "vacuum_failsafe_age", "vacuum_freeze_min_age",
            "vacuum_freeze_table_age", "vacuum_multixact_failsafe_age",
            "vacuum_multixact_freeze_min_age", "vacuum_multixact_freeze_table_age",
            "vacuum_buffer_usage_limit", "wal_skip_threshold", "wal_sender_timeout",
            "check_function_bodies", "password_encryption", "createrole_self_grant",
            "local_preload_libraries", "debug_pretty_print",
            "jit_expressions", "jit_tuple_deforming", "trace_notify", "trace_sort",
            "vacuum_truncate", "vacuum_max_eager_freeze_failure_rate",
            "md5_password_warnings",
        ],
        "used only by statements the gateway does not send (DDL, VACUUM, maintenance, replication, new sessions), by what is pinned off (debug_pretty_print: debug_print_*; jit_*: jit), or developer traces without values (trace_sort, trace_notify at DEBUG1, which client_min_messages pinned to warning does not send)",
    ),
    (
        &[
            "lc_monetary", "lc_numeric", "lc_time", "timezone_abbreviations", "xmlbinary",
            "xmloption", "escape_string_warning", "backslash_quote",
        ],
        "formatting the gateway's and ctxguard's statements do not use (no money, to_char or XML; no backslashes in literals, and standard_conforming_strings is pinned on)",
    ),
];

/// An element of a `text[]` literal: double-quoted, with `"` and `\\` escaped as `array_in` reads them.
fn array_element(v: &str) -> String {
    format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A time setting of `ms` milliseconds as `current_setting` shows it (the largest unit that holds it
/// exactly, as PostgreSQL prints a `GUC_UNIT_MS` value): the form `ctxguard.pin_settings` compares,
/// so that a timeout that holds already is not set again in every transaction.
fn shown_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1_000, "s"),
        (1, "ms"),
    ];
    if ms == 0 {
        return "0".to_string();
    }
    let (n, unit) = UNITS
        .iter()
        .find(|(n, _)| ms.is_multiple_of(*n))
        .copied()
        .unwrap_or((1, "ms"));
    format!("{}{unit}", ms / n)
}

/// The dollar quote of the frame's `text[]` literal: not affected by `standard_conforming_strings`
/// (which a previous client may have turned off), and in no pin's name or value.
const PINS_QUOTE: &str = "$ctxguard_pins$";

/// `BEGIN` and the pins, as one simple-query string (one round trip, pipelined with the rest):
/// `SET LOCAL statement_timeout` first, so that what follows is bounded whatever a previous client
/// left, `SET LOCAL ROLE NONE` (the rest runs as the login role whatever `SET ROLE` a previous
/// client left), then every other pin by one call of `ctxguard.pin_settings` with the names and values in
/// one `text[]` constant. It sets, for the transaction (`set_config(…, true)`, as `SET LOCAL`),
/// each one the server knows and that differs: on a clean connection most pins already hold, and
/// each one set costs a GUC save and restore. One constant instead of a `VALUES` list that the
/// server parsed and planned in every transaction: about half that statement's server CPU
/// (BENCHMARKS.md, the clients reading).
pub fn begin(access: Access, commit: Commit, limits: &Limits) -> String {
    let mut s = String::from(match access {
        Access::ReadWrite => "BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE",
        Access::ReadOnly => "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY",
    });
    let mut pins = Vec::with_capacity(2 * (PINS.len() + OPTIONAL_PINS.len()));
    for (name, value, _) in PINS {
        let v = match value {
            Value::Fixed(v) => (*v).to_string(),
            Value::StatementTimeout => limits.statement_timeout_ms.to_string(),
            Value::LockTimeout => shown_ms(limits.lock_timeout_ms),
            Value::IdleInTransactionTimeout => shown_ms(limits.idle_in_transaction_timeout_ms),
            Value::SynchronousCommit => match commit {
                Commit::Durable => "on".to_string(),
                Commit::Lazy => "off".to_string(),
            },
        };
        if *name == "statement_timeout" {
            let _ = write!(s, "; SET LOCAL statement_timeout TO {v}");
        } else if *name == "role" {
            // Before the call: its EXECUTE privilege is then the login role's, whatever role a
            // previous client switched to.
            debug_assert_eq!(v, "none");
            s.push_str("; SET LOCAL ROLE NONE");
        } else {
            pins.push(array_element(name));
            pins.push(array_element(&v));
        }
    }
    for (name, v) in OPTIONAL_PINS {
        pins.push(array_element(name));
        pins.push(array_element(v));
    }
    let list = pins.join(",");
    debug_assert!(!list.contains(PINS_QUOTE));
    let _ = write!(
        s,
        "; SELECT ctxguard.pin_settings({PINS_QUOTE}{{{list}}}{PINS_QUOTE}::pg_catalog.text[])"
    );
    s
}

/// The frame of the extension's version probe ([`EXTENSION_VERSION`], `/ready`): read-only, the
/// statement timeout and the login role pinned, nothing of the extension called, so that a database
/// without ctxguard (or with one older than the gateway's frame) is reported as such, not as an
/// error. The probe's statement names only the catalog (schema-qualified), takes no parameter and
/// writes nothing: the other pins change nothing about it.
pub fn probe_begin(limits: &Limits) -> String {
    format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY; SET LOCAL statement_timeout TO {}; SET LOCAL ROLE NONE",
        limits.statement_timeout_ms
    )
}

pub const COMMIT: &str = "COMMIT";

/// Every gateway transaction's first statement: verify the token and page, set the context.
pub const SET_CONTEXT: &str = "SELECT ctxguard.set_context($1, $2, $3, $4)";

/// Gate A (ranked by `$1`, cut at `$2`) and the page type's description, in one statement. The
/// page type's row comes out once even when no tool is visible.
pub const PAGE_TOOLS: &str =
    "SELECT pt.description, v.name, v.description, v.input_schema, v.read_only, v.danger,
        v.requires_approval, v.server, t.title, v.namespace
   FROM ctxguard.page_types pt
   LEFT JOIN LATERAL ctxguard.visible_tools($1, $2) WITH ORDINALITY v ON true
   LEFT JOIN ctxguard.tools t ON t.name OPERATOR(pg_catalog.=) v.name
  WHERE pt.name OPERATOR(pg_catalog.=) ctxguard.page_type()
  ORDER BY v.ordinality";

/// The page's namespaces (`visible_namespaces`, in name order) with the bytes of their visible
/// tools' definitions (name, description, schema): what the tool budget is judged on
/// (`catalog/compact.rs`).
pub const NAMESPACES: &str = "SELECT n.namespace, n.title, n.description, n.tools, n.server,
        coalesce(b.bytes, 0)::pg_catalog.int8
   FROM ctxguard.visible_namespaces() n
   LEFT JOIN (SELECT v.namespace,
                     pg_catalog.sum(pg_catalog.octet_length(v.name)
                         OPERATOR(pg_catalog.+) pg_catalog.octet_length(v.description)
                         OPERATOR(pg_catalog.+) pg_catalog.octet_length(v.input_schema::pg_catalog.text)) AS bytes
                FROM ctxguard.visible_tools() v GROUP BY v.namespace) b
     ON b.namespace OPERATOR(pg_catalog.=) n.namespace
  ORDER BY n.namespace";

/// The gateway's `find_tools`: the names of Gate A's tools matching `$1` lexically, best first,
/// at most `$2` (`ctxguard.find_tools`); the gateway's ranker orders them with the page's other
/// visible tools (`catalog/compact.rs`).
pub const FIND_TOOL_NAMES: &str = "SELECT f.name
   FROM ctxguard.find_tools($1, $2) WITH ORDINALITY f
  ORDER BY f.ordinality";

/// Mint a generation, with the context and the generation lifetime (a turn's first statement).
pub const OPEN_TURN_MINT: &str = "SELECT ctxguard.begin_generation($1), ctxguard.context(),
        (SELECT e.generation_ttl FROM ctxguard.effective_ttls() e)";

/// A conversation's last turns (newest first).
pub const HISTORY: &str =
    "SELECT ct.message, coalesce(ct.answer, '') FROM ctxguard.conversation_turns ct
  WHERE ct.conversation_id OPERATOR(pg_catalog.=) $1 ORDER BY ct.turn DESC LIMIT 6";

pub const EXPLAIN_PAGE: &str = "SELECT pg_catalog.jsonb_build_object(
     'context', ctxguard.context(),
     'page', (SELECT pg_catalog.jsonb_build_object('type', pt.name, 'description', pt.description)
                FROM ctxguard.page_types pt WHERE pt.name OPERATOR(pg_catalog.=) ctxguard.page_type()),
     'tools', (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                          'name', e.name, 'visible', e.visible, 'reason', e.reason,
                          'offered', e.offered, 'leftOut', e.left_out, 'conditions', e.conditions,
                          'namespace', e.namespace,
                          'description', t.description, 'readOnly', v.read_only,
                          'danger', v.danger, 'requiresApproval', v.requires_approval)
                          ORDER BY NOT e.visible, e.offered IS NOT TRUE, e.name), '[]')
                 FROM ctxguard.explain_tools($1, $2, $3) e
                 JOIN ctxguard.tools t ON t.name OPERATOR(pg_catalog.=) e.name
                 LEFT JOIN ctxguard.visible_tools() v ON v.name OPERATOR(pg_catalog.=) e.name))";

pub const CALL_TOOL: &str = "SELECT ctxguard.call_tool($1, $2)";

/// Gate B by wire name: the catalog name whose wire form this is (unique: `tools_wire_name_key`);
/// a name that is no tool's wire form goes to Gate B as it is (TOOL_NOT_FOUND).
pub const CALL_TOOL_WIRE: &str = "SELECT ctxguard.call_tool(coalesce(
     (SELECT t.name FROM ctxguard.tools t
       WHERE pg_catalog.replace(t.name, '.', '__') OPERATOR(pg_catalog.=) $1), $1), $2)";

pub const DEMO_PAGE: &str =
    "SELECT pg_catalog.jsonb_build_object('context', ctxguard.context(), 'data', demo.page_data())";

pub const APPROVE_CALL: &str = "SELECT ctxguard.approve_call($1)";

pub const REJECT_CALL: &str = "SELECT ctxguard.reject_call($1, $2)";

/// What the context's user may approve or reject (four eyes), as one JSON array.
pub const PENDING_APPROVALS: &str = "SELECT pg_catalog.jsonb_build_object('approvals',
        COALESCE(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(p.*)), '[]'::pg_catalog.jsonb))
   FROM ctxguard.pending_approvals() p";

/// Gate B's dry run (`POST /v1/tools/explain`), by catalog or wire name as `CALL_TOOL_WIRE`.
pub const EXPLAIN_CALL: &str = "SELECT ctxguard.explain_call(coalesce(
     (SELECT t.name FROM ctxguard.tools t
       WHERE pg_catalog.replace(t.name, '.', '__') OPERATOR(pg_catalog.=) $1), $1), $2)";

pub const MINT_GENERATION: &str = "SELECT ctxguard.begin_generation($1),
        (SELECT e.generation_ttl FROM ctxguard.effective_ttls() e)";

pub const SAVE_TURN: &str = "SELECT ctxguard.save_turn($1, $2, $3, $4)";

pub const VERIFY_TOKEN: &str = "SELECT ctxguard.verify_token($1)";

pub const MCP_IDENTITY: &str = "SELECT ctxguard.mcp_identity($1, $2, $3)";

pub const MCP_SESSION_EXPIRE: &str = "SELECT ctxguard.mcp_session_expire($1, $2, $3)";

pub const MCP_SESSION_TOUCH: &str = "SELECT ctxguard.mcp_session_touch($1, $2)";

pub const PUT_USER_PAGE: &str = "SELECT ctxguard.put_user_page()";

pub const PUT_SESSION_PAGE: &str = "SELECT ctxguard.put_session_page($1)";

/// (`mcp_session_open` returns void: as text, a type every client library decodes.)
pub const MCP_SESSION_OPEN: &str =
    "SELECT ctxguard.mcp_session_open($1, $2, $3, $4)::pg_catalog.text";

pub const MCP_SESSION_LOAD: &str = "SELECT ctxguard.mcp_session_load($1, $2)";

pub const MCP_SESSION_CLOSE: &str = "SELECT ctxguard.mcp_session_close($1, $2)";

pub const COMPLETE_CALL: &str = "SELECT ctxguard.complete_call($1, $2, $3)";

pub const MCP_SERVERS: &str =
    "SELECT s.name, s.transport, s.url, s.command, s.args, s.env, s.cwd, s.headers, s.bearer_token_env,
        s.credential_mode, s.credential_config
   FROM ctxguard.mcp_servers s
  WHERE s.enabled AND ($1::pg_catalog.text[] IS NULL OR s.name OPERATOR(pg_catalog.=) ANY ($1))
  ORDER BY s.name";

/// Upstream credentials (issue 33): ciphertext only, each the context user's own
/// (`credentials/`). Expiries travel as Unix seconds.
pub const UPSTREAM_CREDENTIAL: &str = "SELECT c.server, c.mode, c.key_id, c.ciphertext, c.nonce,
        pg_catalog.date_part('epoch', c.expires_at)::pg_catalog.float8, c.refresh_ciphertext, c.refresh_nonce
   FROM ctxguard.upstream_credential($1) AS c";

pub const PUT_UPSTREAM_CREDENTIAL: &str = "SELECT ctxguard.put_upstream_credential($1, $2, $3, $4,
        pg_catalog.to_timestamp($5), $6, $7)";

pub const DELETE_UPSTREAM_CREDENTIAL: &str =
    "SELECT d.key_id, d.ciphertext, d.nonce, d.refresh_ciphertext, d.refresh_nonce
   FROM ctxguard.delete_upstream_credential($1) AS d";

pub const PUT_TENANT_SECRET: &str = "SELECT ctxguard.put_tenant_secret($1, $2, $3, $4)";

pub const DELETE_TENANT_SECRET: &str = "SELECT ctxguard.delete_tenant_secret($1)";

pub const UPSTREAM_CONNECTIONS: &str = "SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
        'server', c.server, 'mode', c.mode, 'connected', c.connected,
        'expiresAt', pg_catalog.date_part('epoch', c.expires_at)) ORDER BY c.server), '[]'::pg_catalog.jsonb)
   FROM ctxguard.upstream_connections() AS c";

pub const SYNC_MCP_TOOLS: &str = "SELECT ctxguard.sync_mcp_tools($1, $2)";

pub const EXTENSION_VERSION: &str = "SELECT x.extversion FROM pg_catalog.pg_extension x
  WHERE x.extname OPERATOR(pg_catalog.=) 'ctxguard'";

/// `db::probe_direct`'s question (sent in a simple query between [`begin`] and [`COMMIT`]).
pub const PROBE: &str = "SELECT pg_catalog.inet_client_port(), pg_catalog.inet_server_port(),
        pg_catalog.current_setting('port')::pg_catalog.int4";

/// The channel `ctxguard.put_user_page` announces a user's key on, and `put_session_page` a
/// session's (`s:<key>`).
pub const CHANNEL: &str = "ctxguard_pages";

/// The page-change listener's statement (`mcp/follow.rs`), on its own connection.
pub const LISTEN_PAGES: &str = "LISTEN ctxguard_pages";

/// Every SQL text the gateway sends, named: the statements, and the transaction frames as sent
/// (with the default limits, for each access and commit mode).
pub fn all_statements() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = [
        ("SET_CONTEXT", SET_CONTEXT),
        ("PAGE_TOOLS", PAGE_TOOLS),
        ("NAMESPACES", NAMESPACES),
        ("FIND_TOOL_NAMES", FIND_TOOL_NAMES),
        ("OPEN_TURN_MINT", OPEN_TURN_MINT),
        ("HISTORY", HISTORY),
        ("EXPLAIN_PAGE", EXPLAIN_PAGE),
        ("CALL_TOOL", CALL_TOOL),
        ("CALL_TOOL_WIRE", CALL_TOOL_WIRE),
        ("DEMO_PAGE", DEMO_PAGE),
        ("APPROVE_CALL", APPROVE_CALL),
        ("REJECT_CALL", REJECT_CALL),
        ("PENDING_APPROVALS", PENDING_APPROVALS),
        ("EXPLAIN_CALL", EXPLAIN_CALL),
        ("MINT_GENERATION", MINT_GENERATION),
        ("SAVE_TURN", SAVE_TURN),
        ("VERIFY_TOKEN", VERIFY_TOKEN),
        ("MCP_IDENTITY", MCP_IDENTITY),
        ("MCP_SESSION_EXPIRE", MCP_SESSION_EXPIRE),
        ("MCP_SESSION_TOUCH", MCP_SESSION_TOUCH),
        ("PUT_USER_PAGE", PUT_USER_PAGE),
        ("PUT_SESSION_PAGE", PUT_SESSION_PAGE),
        ("MCP_SESSION_OPEN", MCP_SESSION_OPEN),
        ("MCP_SESSION_LOAD", MCP_SESSION_LOAD),
        ("MCP_SESSION_CLOSE", MCP_SESSION_CLOSE),
        ("COMPLETE_CALL", COMPLETE_CALL),
        ("MCP_SERVERS", MCP_SERVERS),
        ("SYNC_MCP_TOOLS", SYNC_MCP_TOOLS),
        ("UPSTREAM_CREDENTIAL", UPSTREAM_CREDENTIAL),
        ("PUT_UPSTREAM_CREDENTIAL", PUT_UPSTREAM_CREDENTIAL),
        ("DELETE_UPSTREAM_CREDENTIAL", DELETE_UPSTREAM_CREDENTIAL),
        ("PUT_TENANT_SECRET", PUT_TENANT_SECRET),
        ("DELETE_TENANT_SECRET", DELETE_TENANT_SECRET),
        ("UPSTREAM_CONNECTIONS", UPSTREAM_CONNECTIONS),
        ("EXTENSION_VERSION", EXTENSION_VERSION),
        ("PROBE", PROBE),
        ("LISTEN_PAGES", LISTEN_PAGES),
        ("COMMIT", COMMIT),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s.to_string()))
    .collect();
    out.push(("probe_begin".to_string(), probe_begin(&Limits::default())));
    for access in [Access::ReadWrite, Access::ReadOnly] {
        for commit in [Commit::Durable, Commit::Lazy] {
            out.push((
                format!("begin({access:?}, {commit:?})"),
                begin(access, commit, &Limits::default()),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_follow_the_begin_in_one_string_with_the_configured_limits() {
        let limits = Limits {
            statement_timeout_ms: 1234,
            lock_timeout_ms: 56,
            idle_in_transaction_timeout_ms: 789,
        };
        let s = begin(Access::ReadOnly, Commit::Lazy, &limits);
        assert!(
            s.starts_with("BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY; SET LOCAL statement_timeout TO 1234; SET LOCAL ROLE NONE; SELECT ctxguard.pin_settings($ctxguard_pins${\"lock_timeout\",\"56ms\",\"idle_in_transaction_session_timeout\",\"789ms\","),
            "{s}"
        );
        assert!(s.contains(r#""search_path","pg_catalog, pg_temp""#));
        assert!(s.contains(r#""synchronous_commit","off""#));
        assert!(s.contains(r#""log_parameter_max_length_on_error","0""#));
        assert!(s.contains(r#""default_transaction_isolation","read committed""#));
        assert!(s.contains(r#""transaction_timeout","0""#));
        assert!(s.contains(r#""restrict_nonsystem_relation_kind","""#));
        assert!(s.contains(r#""exit_on_error","off""#));
        assert!(s.contains(r#""quote_all_identifiers","off""#));
        assert!(s.ends_with("}$ctxguard_pins$::pg_catalog.text[])"), "{s}");
        let d = begin(Access::ReadWrite, Commit::Durable, &limits);
        assert!(d.starts_with("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;"));
        assert!(d.contains(r#""synchronous_commit","on""#));
        // Every pin but the timeout and the role, as a name and a value.
        assert_eq!(
            d.matches("\",\"").count(),
            2 * (PINS.len() - 2 + OPTIONAL_PINS.len()) - 1
        );
        assert!(!d.contains("\"role\""));
        assert_eq!(array_element(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn timeouts_are_pinned_as_current_setting_shows_them() {
        for (ms, shown) in [
            (0, "0"),
            (1, "1ms"),
            (1234, "1234ms"),
            (5000, "5s"),
            (15_000, "15s"),
            (60_000, "1min"),
            (90_000, "90s"),
            (3_600_000, "1h"),
            (86_400_000, "1d"),
            (2_147_483_647, "2147483647ms"),
        ] {
            assert_eq!(shown_ms(ms), shown, "{ms}");
        }
    }

    #[test]
    fn the_version_probe_frame_needs_nothing_of_the_extension() {
        let limits = Limits {
            statement_timeout_ms: 1234,
            lock_timeout_ms: 56,
            idle_in_transaction_timeout_ms: 789,
        };
        assert_eq!(
            probe_begin(&limits),
            "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY; SET LOCAL statement_timeout TO 1234; SET LOCAL ROLE NONE"
        );
        assert!(!EXTENSION_VERSION.contains("ctxguard."));
    }

    #[test]
    fn the_listen_statement_names_the_pages_channel() {
        assert_eq!(LISTEN_PAGES, format!("LISTEN {}", CHANNEL));
    }

    #[test]
    fn no_setting_is_both_pinned_and_unpinned() {
        for (name, _, _) in PINS {
            assert!(
                !UNPINNED.iter().any(|(names, _)| names.contains(name)),
                "{name}"
            );
        }
    }
}
