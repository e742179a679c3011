//! The database settings' types: how statements are sent, how turns commit, and the bounds every
//! transaction pins (`db/` uses them; they are settings, so they live here).

/// How statements are sent (`CTXGUARD_DB_STATEMENTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatementMode {
    /// `prepared` when the gateway is connected to PostgreSQL itself, `unnamed` otherwise
    /// (a pooler, a proxy, or when it cannot tell).
    Auto,
    /// Named prepared statements, cached per connection: PostgreSQL directly, or pgbouncer 1.21+
    /// with `max_prepared_statements` set, or pgbouncer in session mode.
    Prepared,
    /// Unnamed statements only: any pgbouncer pool mode and version.
    Unnamed,
}

/// How a transaction commits (`CTXGUARD_TURN_COMMIT` for the turn's transactions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Commit {
    /// Wait for the WAL flush (`synchronous_commit = on`, pinned: a client's `off` does not
    /// carry over).
    Durable,
    /// Do not wait for it (`SET LOCAL synchronous_commit = off`): a crash may lose the last
    /// fraction of a second of such commits, never a later commit and never half of one.
    Lazy,
}

/// The bounds the gateway puts on each of its transactions (gateway configuration:
/// `CTXGUARD_DB_STATEMENT_TIMEOUT_MS`, `CTXGUARD_DB_LOCK_TIMEOUT_MS`,
/// `CTXGUARD_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub statement_timeout_ms: u64,
    pub lock_timeout_ms: u64,
    pub idle_in_transaction_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            statement_timeout_ms: 15_000,
            lock_timeout_ms: 5_000,
            idle_in_transaction_timeout_ms: 15_000,
        }
    }
}
