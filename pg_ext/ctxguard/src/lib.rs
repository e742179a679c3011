//! ctxguard: the database as the truth layer for LLM tool use.
//!
//! This crate is the thin pgrx adapter. Decisions (token checks, page validation, policy
//! evaluation, entity binding, argument validation) live in `ctxguard-core`.
//!
//! - `gucs`: every `ctxguard.*` setting.
//! - `context`: `set_context`, the context readers, `begin_generation`.
//! - `catalog`: `register_page_type`, `register_tool` (policies are validated there).
//! - `gates`: Gate A (`visible_tools`, `explain_tools`) and Gate B (`call_tool`, `approve_call`), audit.
//! - `documents`: document ingestion and the seed-003 built-in document tools.
//! - `budget`: byte, call, page and coverage limits (charged in the ledger).
//! - `ledger`: shared-memory charges no rollback undoes, the audit queue and its background writer.
//! - `ttls`: the lifetimes of generations, approvals and authorized upstream calls per tenant.
//! - `namespaces`: `register_namespace`, `visible_namespaces` and `find_tools` (over Gate A's tools).
//! - `credentials`: upstream credentials (ciphertext only), each context user's own; CONNECTION_REQUIRED.
//! - `mcp`: upstream MCP servers: tool discovery (`sync_mcp_tools`), server policies, `complete_call`.
//! - `masking`: the per-backend masker over `ctxguard.mask_rules`.
//! - `cache`: per-backend catalog cache.
//! - `owner`: the one way SQL runs: pinned settings, and as the extension owner where it must.
//! - `handler`: tool handlers: run_as role, depth, what a running handler may not call.
//! - `keys`: verification keys from settings or files.
//! - `log_guard`: no token (nor, where a token was seen, error context) in the server log.
//! - `pgutil`: the few other `unsafe` Postgres internals (local GUC writes, subtransactions).
//! - `compat`: what differs between PostgreSQL majors; the only place with `cfg(feature = "pgNN")`.
#![allow(
    unsafe_code,
    reason = "FFI with Postgres is confined to pgutil.rs, compat.rs and _PG_init"
)]

use pgrx::prelude::*;

mod approvals;
mod budget;
mod cache;
mod catalog;
mod compat;
mod context;
mod credentials;
mod documents;
mod gates;
mod gucs;
mod handler;
mod keys;
mod ledger;
mod log_guard;
mod masking;
mod mcp;
mod namespaces;
mod owner;
mod pgutil;
mod quota;
mod ttls;

pgrx::pg_module_magic!();

pgrx::extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
pgrx::extension_sql_file!(
    "../sql/documents.sql",
    name = "documents",
    requires = ["bootstrap"]
);
pgrx::extension_sql_file!("../sql/mcp.sql", name = "mcp", requires = ["bootstrap"]);
pgrx::extension_sql_file!("../sql/state.sql", name = "state", requires = ["bootstrap"]);
pgrx::extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // No error that reaches SQL carries a Rust backtrace: pgrx's panic hook captures one only
    // when the environment asks for it, and this takes precedence over RUST_BACKTRACE. Set in
    // the postmaster (preloaded), before any backend exists.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none_or(|v| v != "0") {
        // SAFETY-free in edition 2021; no other thread exists while a library is being loaded.
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    gucs::init();
    owner::init_planner();
    cache::init();
    let preloaded = pgutil::loaded_at_startup();
    if preloaded {
        // Defined before the prefix is reserved: a setting defined after it would be refused,
        // and postgresql.conf's value of it dropped ("invalid configuration parameter name").
        gucs::init_ledger_sizes();
    }
    pgutil::reserve_prefix();
    if preloaded {
        context::PRELOADED.store(true, std::sync::atomic::Ordering::Relaxed);
        ledger::shmem::init();
        ledger::register_flush_at_transaction_end();
        log_guard::init();
    }
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'ctxguard'"]
    }
}
