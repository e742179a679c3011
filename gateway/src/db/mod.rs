//! **Room `db/`**: the only SQL (`sql.rs`) and the pool that sends it (this file). It may use
//! `catalog` (the rows it returns), `config` (database settings), `seal`, `error`; nothing above.
//!
//! Database access. Every step is one short transaction that starts with `ctxguard.set_context`;
//! no transaction is held while the model thinks. The gateway decides nothing: the database does.
//! A transaction goes out in one round trip: `BEGIN`, `set_context`, its statements and `COMMIT`,
//! pipelined (`Db::transaction`).
//!
//! Statements: with `CTXGUARD_DB_STATEMENTS=prepared` each connection keeps named prepared
//! statements for its life (parsed once per connection); with `unnamed` every statement is sent as
//! one unnamed Parse/Bind/Execute (tokio-postgres `query_typed`: the same single round trip, no
//! statement outlives its Sync), which is what a transaction-mode pooler (pgbouncer before 1.21, or
//! without `max_prepared_statements`) needs: consecutive transactions of one gateway connection
//! run on different server connections there. `auto` (the default) probes once which it is talking
//! to (see [`probe_direct`]) and takes `prepared` only when it sees PostgreSQL itself.
//! No statement here sets session state (`SET`, temporary objects, `LISTEN`, advisory locks):
//! ctxguard's context lives in transaction-local settings, and so do the settings the gateway pins.
//!
//! A server connection is hostile ground (a pooler's previous client, role defaults): every SQL
//! text is in [`crate::db::sql`], fully schema-qualified, and every statement runs inside a transaction
//! that starts `BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE` (or `READ ONLY`) with the
//! settings of [`crate::db::sql::PINS`] pinned for the transaction in the same message ([`crate::db::sql::begin`]):
//! the statements without a context ([`Db::verify_token`], the MCP session records, discovery),
//! the probe, and in prepared mode the Parse of a named statement too.
//!
//! A `Db` is one pool, connected as one role. The gateway holds up to three: the gateway role's
//! (model calls: EXECUTE on ctxguard's API only), the discovery role's (`sync_mcp_tools` only) and,
//! in demo mode, the demo screens' role (`demo_page`). Each method says which pool it is for.

pub mod sql;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{
    ManagerConfig, ObjectId, Pool, PoolError, RecyclingMethod, Runtime, Timeouts,
};
use serde_json::Value;
use tokio::sync::OnceCell;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use crate::catalog::compact::{Namespace, Overview};
use crate::catalog::ToolSpec;
use crate::config::database::{Commit, Limits, StatementMode};
use crate::db::sql::Access;
use crate::error::ApiError;
use crate::seal::Sealed;

/// One row of `ctxguard.mcp_servers`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub transport: String,
    pub url: Option<String>,
    pub command: Option<String>,
    pub args: Vec<String>,
    pub env: HashMap<String, String>,
    pub cwd: Option<String>,
    pub headers: HashMap<String, String>,
    pub bearer_token_env: Option<String>,
    /// `static`, `tenant_secret`, `user_oauth` or `token_exchange` (`credentials/`).
    pub credential_mode: String,
    /// The mode's settings (`credentials::oauth::ModeConfig`).
    pub credential_config: Value,
}

/// Who and where: the caller's token and page, plus the turn's generation and trace id.
#[derive(Debug, Clone)]
pub struct Scope {
    pub token: String,
    pub page: Value,
    pub generation: Option<Uuid>,
    pub trace_id: String,
}

/// A tool as a caller names it: by its catalog name (`invoice.get`), or by the name MCP and model
/// clients see (`invoice__get`: `catalog::wire_name`), which the database maps back.
#[derive(Debug, Clone, Copy)]
pub enum ToolName<'a> {
    Catalog(&'a str),
    Wire(&'a str),
}

/// What a turn starts from (read in one transaction).
#[derive(Debug, Clone)]
pub struct TurnStart {
    pub context: Value,
    pub generation: Uuid,
    /// How long the database keeps `generation` (the tenant's generation lifetime).
    pub generation_ttl: Duration,
    pub page_description: String,
    pub tools: Vec<ToolSpec>,
    /// The page's namespaces, for the tool budget (`catalog/compact.rs`).
    pub overview: Overview,
    pub history: Vec<(String, String)>,
}

/// A statement's parameters with their types (so that an unnamed statement needs no Describe).
pub type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

#[derive(Clone)]
pub struct Db {
    pool: Pool,
    mode: StatementMode,
    /// `auto`, once resolved: whether statements are sent unnamed.
    unnamed: Arc<OnceCell<bool>>,
    url: Arc<String>,
    /// How transactions that mint a generation or save a turn commit (`CTXGUARD_TURN_COMMIT`).
    turn_commit: Commit,
    /// The timeouts every transaction pins.
    limits: Limits,
    /// The transaction frames (`sql::begin`), built once: [access][commit].
    begins: Arc<[[String; 2]; 2]>,
    /// Prepared mode: the statements already parsed on each pooled connection (so that a Parse is
    /// sent inside a pinned transaction the first time only).
    parsed: Arc<Mutex<HashSet<(ObjectId, &'static str)>>>,
}

/// The frames of [`sql::begin`] for `limits`, indexed [access][commit].
fn begins(limits: &Limits) -> Arc<[[String; 2]; 2]> {
    let b = |a, c| sql::begin(a, c, limits);
    Arc::new([
        [
            b(Access::ReadWrite, Commit::Durable),
            b(Access::ReadWrite, Commit::Lazy),
        ],
        [
            b(Access::ReadOnly, Commit::Durable),
            b(Access::ReadOnly, Commit::Lazy),
        ],
    ])
}

/// A pipelined transaction's first error, and whether it was the frame (`BEGIN` and the pins)
/// cancelled by a `statement_timeout` the connection carried.
struct Failed {
    error: tokio_postgres::Error,
    frame_cancelled: bool,
}

/// One request of a pipelined transaction ([`Db::transaction`]).
type Step<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a>,
>;

/// The one row of a statement's answer (else INTERNAL: the statements here always return one).
fn one_row(mut rows: Vec<Row>) -> Result<Row, ApiError> {
    if rows.len() != 1 {
        return Err(ApiError::Internal(format!(
            "expected one row, got {}",
            rows.len()
        )));
    }
    Ok(rows.remove(0))
}

/// A tool of a row whose columns from `at` on are name, description, input_schema, read_only,
/// danger, requires_approval, server, title, namespace ([`sql::PAGE_TOOLS`], [`sql::FIND_TOOLS`]).
fn spec_at(r: &Row, at: usize) -> ToolSpec {
    ToolSpec {
        name: r.get(at),
        description: r.get(at + 1),
        input_schema: r.get(at + 2),
        read_only: r.get(at + 3),
        danger: r.get(at + 4),
        requires_approval: r.get(at + 5),
        server: r.get(at + 6),
        title: r.get(at + 7),
        namespace: r.get(at + 8),
        deferred: false,
    }
}

/// What a `find_tools` search ranks ([`Db::search_candidates`]).
#[derive(Debug, Default)]
pub struct SearchCandidates {
    pub overview: Overview,
    /// The names `ctxguard.find_tools` matched lexically, best first.
    pub lexical: Vec<String>,
    /// Every Gate-A-visible tool of the page, in `visible_tools`' order.
    pub visible: Vec<ToolSpec>,
}

/// The tools and the page description of [`sql::PAGE_TOOLS`]'s rows.
fn tool_specs(rows: &[Row]) -> (Vec<ToolSpec>, String) {
    let description = rows
        .first()
        .map(|r| r.get::<_, String>(0))
        .unwrap_or_default();
    let tools = rows
        .iter()
        .filter(|r| r.get::<_, Option<String>>(1).is_some())
        .map(|r| spec_at(r, 1))
        .collect();
    (tools, description)
}

/// The page's namespaces of [`sql::NAMESPACES`]' rows.
fn overview(rows: &[Row]) -> Overview {
    Overview {
        namespaces: rows
            .iter()
            .map(|r| Namespace {
                name: r.get(0),
                title: r.get(1),
                description: r.get(2),
                tools: usize::try_from(r.get::<_, i32>(3)).unwrap_or(0),
                server: r.get(4),
                bytes: usize::try_from(r.get::<_, i64>(5)).unwrap_or(0),
            })
            .collect(),
    }
}

/// A stored upstream credential as `ctxguard.upstream_credential` answers it (sealed).
#[derive(Debug, Clone)]
pub struct StoredCredential {
    pub server: String,
    pub mode: String,
    pub access: Sealed,
    /// Unix seconds.
    pub expires_at: Option<f64>,
    pub refresh: Option<Sealed>,
}

fn sealed_opt(key_id: String, ct: Option<Vec<u8>>, nonce: Option<Vec<u8>>) -> Option<Sealed> {
    Some(Sealed {
        key_id,
        ciphertext: ct?,
        nonce: nonce?,
    })
}

fn stored(r: &Row) -> StoredCredential {
    let key_id: String = r.get(2);
    StoredCredential {
        server: r.get(0),
        mode: r.get(1),
        access: Sealed {
            key_id: key_id.clone(),
            ciphertext: r.get(3),
            nonce: r.get(4),
        },
        expires_at: r.get(5),
        refresh: sealed_opt(key_id, r.get(6), r.get(7)),
    }
}

/// Is `url` PostgreSQL itself, with nothing in between? A connection of our own asks the server
/// what it sees: over TCP, our own source port as its client port (a pooler or proxy connects from
/// its own) and the port we dialled as its own; over a Unix socket, no client port and its own
/// `port` the one we dialled (a pooler on the same host listens on a port of its own). Any doubt
/// answers `false`.
pub async fn probe_direct(url: &str) -> Result<bool, String> {
    use tokio_postgres::config::Host;
    let config: tokio_postgres::Config = url.parse().map_err(|e| format!("database URL: {e}"))?;
    let host = config
        .get_hosts()
        .first()
        .cloned()
        .ok_or("database URL names no host")?;
    let port = config.get_ports().first().copied().unwrap_or(5432);
    // In a pinned read-only transaction like every other statement (its answer is the one row).
    let sql = format!(
        "{}; {}; {}",
        sql::begin(Access::ReadOnly, Commit::Durable, &Limits::default()),
        sql::PROBE,
        sql::COMMIT
    );
    let sql = sql.as_str();
    let timeout = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(5));
    let probe = async {
        match host {
            Host::Tcp(name) => {
                let stream = tokio::net::TcpStream::connect((name.as_str(), port))
                    .await
                    .map_err(|e| e.to_string())?;
                let local = stream.local_addr().map_err(|e| e.to_string())?.port();
                let (client, conn) = config
                    .connect_raw(stream, NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                let task = tokio::spawn(conn);
                let r = client.simple_query(sql).await.map_err(|e| {
                    e.as_db_error()
                        .map_or_else(|| e.to_string(), |d| d.message().to_string())
                });
                drop(client);
                let _ = task.await;
                let r = probe_row(r?)?;
                Ok(
                    r[0].as_deref().and_then(|p| p.parse::<u16>().ok()) == Some(local)
                        && r[1].as_deref().and_then(|p| p.parse::<u16>().ok()) == Some(port),
                )
            }
            Host::Unix(dir) => {
                let path = dir.join(format!(".s.PGSQL.{port}"));
                let stream = tokio::net::UnixStream::connect(&path)
                    .await
                    .map_err(|e| e.to_string())?;
                let (client, conn) = config
                    .connect_raw(stream, NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                let task = tokio::spawn(conn);
                let r = client.simple_query(sql).await.map_err(|e| {
                    e.as_db_error()
                        .map_or_else(|| e.to_string(), |d| d.message().to_string())
                });
                drop(client);
                let _ = task.await;
                let r = probe_row(r?)?;
                Ok(r[0].is_none()
                    && r[2].as_deref().and_then(|p| p.parse::<u16>().ok()) == Some(port))
            }
        }
    };
    tokio::time::timeout(timeout, probe)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// The probe's row: the last row of the frame's answers (the frame's own pins may return rows).
fn probe_row(msgs: Vec<tokio_postgres::SimpleQueryMessage>) -> Result<Vec<Option<String>>, String> {
    msgs.into_iter()
        .rev()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .ok_or_else(|| "no row".to_string())
}

/// A lifetime in seconds from the database (never below a second).
fn ttl_secs(secs: i32) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0).max(1))
}

pub fn map_pg(e: tokio_postgres::Error) -> ApiError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
            return ApiError::Unauthorized(
                db.message().trim_start_matches("ctxguard: ").to_string(),
            );
        }
        if *code == SqlState::INVALID_PARAMETER_VALUE {
            return ApiError::Unprocessable(
                db.message().trim_start_matches("ctxguard: ").to_string(),
            );
        }
        if code.code().starts_with("57")
            || code.code().starts_with("08")
            || *code == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE
        {
            return ApiError::DatabaseUnavailable;
        }
        return ApiError::Internal(format!("{}: {}", code.code(), db.message()));
    }
    // No SQLSTATE: the error is the client's own (connection refused or closed, I/O, protocol).
    tracing::warn!(error = %e, "database connection error");
    ApiError::DatabaseUnavailable
}

/// `save_turn`'s size refusals: SQLSTATE 54000 naming the limit (0.1.0 and early 0.2.0 said
/// "turn too large" with 22023), which would otherwise read as an internal or page-context error.
fn turn_error(e: ApiError) -> ApiError {
    match e {
        ApiError::Internal(detail) if detail.starts_with("54000") => {
            tracing::warn!(%detail, "save_turn refused the turn's size");
            ApiError::TurnTooLarge
        }
        ApiError::Unprocessable(m) if m.starts_with("turn too large") => {
            tracing::warn!(detail = %m, "save_turn refused the turn's size");
            ApiError::TurnTooLarge
        }
        other => other,
    }
}

fn map_pool(e: PoolError) -> ApiError {
    match e {
        PoolError::Backend(e) => map_pg(e),
        PoolError::Timeout(_) | PoolError::Closed | PoolError::NoRuntimeSpecified => {
            ApiError::DatabaseUnavailable
        }
        PoolError::PostCreateHook(_) => ApiError::DatabaseUnavailable,
    }
}

impl Db {
    pub fn connect(
        url: &str,
        size: usize,
        timeout: Duration,
        mode: StatementMode,
    ) -> Result<Db, String> {
        let mut cfg = deadpool_postgres::Config::new();
        cfg.url = Some(url.to_string());
        cfg.manager = Some(ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        });
        let mut pool_cfg = deadpool_postgres::PoolConfig::new(size);
        pool_cfg.timeouts = Timeouts {
            wait: Some(timeout),
            create: Some(timeout),
            recycle: Some(timeout),
        };
        cfg.pool = Some(pool_cfg);
        let pool = cfg
            .create_pool(Some(Runtime::Tokio1), NoTls)
            .map_err(|e| e.to_string())?;
        Ok(Db::from_pool(pool, url, mode))
    }

    /// A `Db` on a pool made elsewhere (its connections to `url`); tests hand it connections a
    /// previous client used.
    pub fn from_pool(pool: Pool, url: &str, mode: StatementMode) -> Db {
        let limits = Limits::default();
        Db {
            pool,
            mode,
            unnamed: Arc::new(OnceCell::new()),
            url: Arc::new(url.to_string()),
            turn_commit: Commit::Durable,
            limits,
            begins: begins(&limits),
            parsed: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    /// Commit the transactions that mint a generation or save a turn this way (else durably).
    pub fn with_turn_commit(mut self, commit: Commit) -> Db {
        self.turn_commit = commit;
        self
    }

    /// Pin these timeouts in every transaction (else [`Limits::default`]).
    pub fn with_limits(mut self, limits: Limits) -> Db {
        self.limits = limits;
        self.begins = begins(&limits);
        self
    }

    /// The timeouts every transaction pins.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn begin(&self, access: Access, commit: Commit) -> &str {
        let a = match access {
            Access::ReadWrite => 0,
            Access::ReadOnly => 1,
        };
        let c = match commit {
            Commit::Durable => 0,
            Commit::Lazy => 1,
        };
        &self.begins[a][c]
    }

    /// Whether statements go unnamed. `auto` probes once (a failed probe is not remembered, and
    /// that request goes unnamed: safe everywhere).
    pub async fn unnamed(&self) -> bool {
        match self.mode {
            StatementMode::Prepared => false,
            StatementMode::Unnamed => true,
            StatementMode::Auto => {
                if let Some(v) = self.unnamed.get() {
                    return *v;
                }
                match probe_direct(&self.url).await {
                    Ok(direct) => {
                        let v = *self.unnamed.get_or_init(|| async { !direct }).await;
                        tracing::info!(
                            statements = if v { "unnamed" } else { "prepared" },
                            "CTXGUARD_DB_STATEMENTS=auto: {}",
                            if v {
                                "not connected to PostgreSQL directly (a pooler or proxy)"
                            } else {
                                "connected to PostgreSQL directly"
                            }
                        );
                        v
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not probe the database connection: unnamed statements for now");
                        true
                    }
                }
            }
        }
    }

    /// The mode in force (`auto` resolved, when it was).
    pub fn statements(&self) -> &'static str {
        match (self.mode, self.unnamed.get()) {
            (StatementMode::Prepared, _) | (StatementMode::Auto, Some(false)) => "prepared",
            (StatementMode::Unnamed, _) | (StatementMode::Auto, Some(true)) => "unnamed",
            (StatementMode::Auto, None) => "auto",
        }
    }

    pub fn status(&self) -> (usize, usize) {
        let s = self.pool.status();
        (s.size, s.available)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, ApiError> {
        self.pool.get().await.map_err(map_pool)
    }

    /// One transaction in one round trip: `BEGIN` with the pins, `set_context` with the scope,
    /// `stmts`, `COMMIT`, sent together (pipelined) and answered in order. Returns the context and
    /// each statement's rows. The first error in that order is the answer: after a failed step the
    /// later statements fail (25P02) and the `COMMIT` rolls back, so nothing of a failed
    /// transaction stays. `Commit::Lazy` commits without waiting for the WAL flush.
    async fn transaction(
        &self,
        scope: &Scope,
        commit: Commit,
        stmts: &[(&'static str, &Params<'_>)],
    ) -> Result<(Value, Vec<Vec<Row>>), ApiError> {
        let set_context: &Params<'_> = &[
            (&scope.token, Type::TEXT),
            (&scope.page, Type::JSONB),
            (&scope.generation, Type::UUID),
            (&scope.trace_id, Type::TEXT),
        ];
        let all: Vec<(&'static str, &Params<'_>)> =
            std::iter::once((sql::SET_CONTEXT, set_context))
                .chain(stmts.iter().copied())
                .collect();
        let mut out = self
            .pipeline(Access::ReadWrite, commit, &all)
            .await?
            .into_iter();
        let context = one_row(out.next().unwrap_or_default())?.get(0);
        Ok((context, out.collect()))
    }

    /// `stmts` in one pinned transaction ([`sql::begin`] … `COMMIT`), pipelined in one round trip;
    /// each statement's rows. In prepared mode, statements not yet parsed on the connection are
    /// parsed first, in a pinned read-only transaction of their own.
    async fn pipeline(
        &self,
        access: Access,
        commit: Commit,
        all: &[(&'static str, &Params<'_>)],
    ) -> Result<Vec<Vec<Row>>, ApiError> {
        let unnamed = self.unnamed().await;
        let client = self.client().await?;
        let begin = self.begin(access, commit);
        let mut prepared = Vec::with_capacity(all.len());
        if !unnamed {
            prepared = self.prepare(&client, all).await?;
        }
        self.send_framed(&client, begin, all, &prepared).await
    }

    /// [`Db::send`], and once more if the frame was cancelled: its first statements run under
    /// whatever `statement_timeout` the connection carries until the pin lands (a previous client's
    /// 1 ms, say), and a frame cancelled by it did nothing (its transaction's later statements fail
    /// or find no context).
    async fn send_framed(
        &self,
        client: &deadpool_postgres::Client,
        begin: &str,
        all: &[(&'static str, &Params<'_>)],
        prepared: &[tokio_postgres::Statement],
    ) -> Result<Vec<Vec<Row>>, ApiError> {
        match self.send(client, begin, all, prepared).await {
            Err(e) if e.frame_cancelled => self.send(client, begin, all, prepared).await,
            r => r,
        }
        .map_err(|e| map_pg(e.error))
    }

    /// One attempt of [`Db::pipeline`].
    async fn send(
        &self,
        client: &deadpool_postgres::Client,
        begin: &str,
        all: &[(&'static str, &Params<'_>)],
        prepared: &[tokio_postgres::Statement],
    ) -> Result<Vec<Vec<Row>>, Failed> {
        let pg: &tokio_postgres::Client = client;
        // Each request is queued when its future is first polled; join_all polls them in order
        // (and all of them before any answer can arrive), so they go out in this order.
        let mut steps: Vec<Step<'_>> = Vec::with_capacity(all.len() + 2);
        steps.push(Box::pin(async move {
            pg.batch_execute(begin).await.map(|()| Vec::new())
        }));
        for (i, (sql, params)) in all.iter().enumerate() {
            steps.push(match prepared.get(i) {
                Some(stmt) => Box::pin(async move {
                    let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
                    pg.query(stmt, &values).await
                }),
                None => Box::pin(pg.query_typed(sql, params)),
            });
        }
        steps.push(Box::pin(async move {
            pg.batch_execute(sql::COMMIT).await.map(|()| Vec::new())
        }));
        // The first error in the order sent is the answer.
        let mut results = Vec::with_capacity(all.len() + 2);
        for (i, r) in futures::future::join_all(steps)
            .await
            .into_iter()
            .enumerate()
        {
            match r {
                Ok(rows) => results.push(rows),
                Err(error) => {
                    let frame_cancelled = i == 0
                        && error.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED);
                    return Err(Failed {
                        error,
                        frame_cancelled,
                    });
                }
            }
        }
        // BEGIN, the statements, COMMIT.
        Ok(results.into_iter().skip(1).take(all.len()).collect())
    }

    /// Prepared mode: the named statements of `all`, from the connection's cache. Those not yet
    /// parsed on this connection are parsed inside a pinned read-only transaction (sent with it,
    /// one round trip per statement as before), so that no Parse runs under a previous client's
    /// settings either.
    async fn prepare(
        &self,
        client: &deadpool_postgres::Client,
        all: &[(&'static str, &Params<'_>)],
    ) -> Result<Vec<tokio_postgres::Statement>, ApiError> {
        let id = deadpool_postgres::Object::id(client);
        let known = {
            let parsed = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
            all.iter().all(|(sql, _)| parsed.contains(&(id, *sql)))
        };
        let prepare = |sql: &'static str, params: &Params<'_>| {
            let types: Vec<Type> = params.iter().map(|(_, t)| t.clone()).collect();
            async move { client.prepare_typed_cached(sql, &types).await }
        };
        if known {
            let mut out = Vec::with_capacity(all.len());
            for (sql, params) in all {
                out.push(prepare(sql, params).await.map_err(map_pg)?);
            }
            return Ok(out);
        }
        let pg: &tokio_postgres::Client = client;
        let begin = self.begin(Access::ReadOnly, Commit::Durable);
        // Polled in order, so sent in order: BEGIN, every Parse, COMMIT (one round trip).
        let (opened, parsed, closed) = futures::join!(
            pg.batch_execute(begin),
            futures::future::join_all(all.iter().map(|(sql, params)| prepare(sql, params))),
            pg.batch_execute(sql::COMMIT)
        );
        opened.map_err(map_pg)?;
        let out = parsed
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(map_pg)?;
        closed.map_err(map_pg)?;
        let mut known = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
        // Connections come and go: forget them all now and then (a re-parse costs one round trip).
        if known.len() > 16_384 {
            known.clear();
        }
        known.extend(all.iter().map(|(sql, _)| (id, *sql)));
        Ok(out)
    }

    /// `SELECT extversion` of ctxguard, for readiness.
    pub async fn extension_version(&self) -> Result<Option<String>, ApiError> {
        // In a frame of its own that calls nothing of the extension ([`sql::probe_begin`]): the
        // pinned frame calls `ctxguard.pin_settings`, which a database without ctxguard lacks.
        let client = self.client().await?;
        let begin = sql::probe_begin(&self.limits);
        let all: &[(&'static str, &Params<'_>)] = &[(sql::EXTENSION_VERSION, &[])];
        let mut r = self.send_framed(&client, &begin, all, &[]).await?;
        Ok(r.pop().unwrap_or_default().first().map(|r| r.get(0)))
    }

    /// Mint a generation (it becomes the transaction's context generation), read Gate A (ranked
    /// by the message, cut at `max_tools`; `None`: every visible tool), the page's namespaces,
    /// the page description and, for a continuing conversation, recent history.
    pub async fn open_turn(
        &self,
        scope: &Scope,
        conversation_id: &str,
        continuing: bool,
        message: &str,
        max_tools: Option<i32>,
    ) -> Result<TurnStart, ApiError> {
        let mint: &Params<'_> = &[(&conversation_id, Type::TEXT)];
        let gate_a: &Params<'_> = &[(&Some(message), Type::TEXT), (&max_tools, Type::INT4)];
        let mut stmts = vec![
            (sql::OPEN_TURN_MINT, mint),
            (sql::PAGE_TOOLS, gate_a),
            (sql::NAMESPACES, &[][..]),
        ];
        if continuing {
            stmts.push((sql::HISTORY, mint));
        }
        // The generation row may be lost in a crash before its WAL is flushed (Commit::Lazy): a
        // call under it is then refused and the page view mints another (pages.rs).
        let (_, mut results) = self.transaction(scope, self.turn_commit, &stmts).await?;
        let mut history: Vec<(String, String)> = results
            .get_mut(3)
            .map(std::mem::take)
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        history.reverse();
        let (tools, page_description) = tool_specs(&results[1]);
        let overview = overview(&results[2]);
        let r = one_row(std::mem::take(&mut results[0]))?;
        let (generation, context, ttl): (Uuid, Value, i32) = (r.get(0), r.get(1), r.get(2));
        Ok(TurnStart {
            context,
            generation,
            generation_ttl: ttl_secs(ttl),
            page_description,
            tools,
            overview,
            history,
        })
    }

    /// One statement returning one value, in its own transaction with the scope's context.
    pub(crate) async fn one<T>(
        &self,
        scope: &Scope,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<T, ApiError>
    where
        T: for<'r> tokio_postgres::types::FromSql<'r>,
    {
        self.one_with(scope, Commit::Durable, sql, params).await
    }

    async fn one_with<T>(
        &self,
        scope: &Scope,
        commit: Commit,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<T, ApiError>
    where
        T: for<'r> tokio_postgres::types::FromSql<'r>,
    {
        let (_, mut results) = self.transaction(scope, commit, &[(sql, params)]).await?;
        Ok(one_row(results.pop().unwrap_or_default())?.get(0))
    }

    /// One statement without a context (in a pinned transaction of its own), returning one value.
    async fn bare<T>(
        &self,
        access: Access,
        sql: &'static str,
        params: &Params<'_>,
    ) -> Result<T, ApiError>
    where
        T: for<'r> tokio_postgres::types::FromSql<'r>,
    {
        let mut r = self
            .pipeline(access, Commit::Durable, &[(sql, params)])
            .await?;
        Ok(one_row(r.pop().unwrap_or_default())?.get(0))
    }

    /// The validated context, the page description, and every visible tool with Gate A's verdict
    /// (`explain_tools`) and its policy flags, and whether it is in the model's list for `query`
    /// and `top_k` (and if not, why), then at most `max_hidden + 1` hidden tools (the first by
    /// name; the one more says whether there are others). Offered first, then visible. With it,
    /// in the same transaction, the model's ranked list (`visible_tools(query, top_k)`) and the
    /// page's namespaces, from which the tool budget's decision follows (`catalog/compact.rs`).
    pub async fn explain_page(
        &self,
        scope: &Scope,
        query: Option<&str>,
        top_k: i32,
        max_hidden: i32,
    ) -> Result<(Value, Vec<ToolSpec>, Overview), ApiError> {
        let ranked: &Params<'_> = &[(&query, Type::TEXT), (&Some(top_k), Type::INT4)];
        let hidden = max_hidden.saturating_add(1);
        let (_, mut results) = self
            .transaction(
                scope,
                Commit::Durable,
                &[
                    (
                        sql::EXPLAIN_PAGE,
                        &[
                            (&query, Type::TEXT),
                            (&top_k, Type::INT4),
                            (&hidden, Type::INT4),
                        ],
                    ),
                    (sql::PAGE_TOOLS, ranked),
                    (sql::NAMESPACES, &[]),
                ],
            )
            .await?;
        let explained = one_row(std::mem::take(&mut results[0]))?.get(0);
        Ok((explained, tool_specs(&results[1]).0, overview(&results[2])))
    }

    /// The page's namespaces (what the tool budget is judged on).
    pub async fn overview(&self, scope: &Scope) -> Result<Overview, ApiError> {
        let (_, results) = self
            .transaction(scope, Commit::Durable, &[(sql::NAMESPACES, &[])])
            .await?;
        Ok(overview(results.first().map_or(&[][..], Vec::as_slice)))
    }

    /// What a `find_tools` search ranks, read in one transaction under the scope's context: the
    /// page's namespaces (whether the page is over the budget is decided on the same reading), the
    /// names `ctxguard.find_tools(query)` matches lexically (best first, at most
    /// [`compact::FIND_NAMESPACE_CANDIDATES`]) and every Gate-A-visible tool of the page (the only
    /// tools a search may return).
    pub async fn search_candidates(
        &self,
        scope: &Scope,
        query: &str,
    ) -> Result<SearchCandidates, ApiError> {
        let lexical_k = crate::catalog::compact::FIND_NAMESPACE_CANDIDATES;
        let none: (Option<&str>, Option<i32>) = (None, None);
        let (_, mut results) = self
            .transaction(
                scope,
                Commit::Durable,
                &[
                    (sql::NAMESPACES, &[]),
                    (
                        sql::FIND_TOOL_NAMES,
                        &[(&query, Type::TEXT), (&lexical_k, Type::INT4)],
                    ),
                    (
                        sql::PAGE_TOOLS,
                        &[(&none.0, Type::TEXT), (&none.1, Type::INT4)],
                    ),
                ],
            )
            .await?;
        let (visible, _) = tool_specs(&results[2]);
        Ok(SearchCandidates {
            overview: overview(&results[0]),
            lexical: std::mem::take(&mut results[1])
                .into_iter()
                .map(|r| r.get(0))
                .collect(),
            visible,
        })
    }

    /// Gate B for one tool call, in its own transaction. Returns the envelope.
    pub async fn call_tool(
        &self,
        scope: &Scope,
        name: &ToolName<'_>,
        args: &Value,
    ) -> Result<Value, ApiError> {
        match name {
            ToolName::Catalog(name) => {
                self.one(
                    scope,
                    sql::CALL_TOOL,
                    &[(name, Type::TEXT), (args, Type::JSONB)],
                )
                .await
            }
            ToolName::Wire(wire) => {
                self.one(
                    scope,
                    sql::CALL_TOOL_WIRE,
                    &[(wire, Type::TEXT), (args, Type::JSONB)],
                )
                .await
            }
        }
    }

    /// A demo screen: the validated context and the data of the screen it names. Only on the demo
    /// screens' pool (`CTXGUARD_DEMO_DATABASE_URL`): the gateway role cannot (`42501`).
    pub async fn demo_page(&self, scope: &Scope) -> Result<Value, ApiError> {
        self.one(scope, sql::DEMO_PAGE, &[]).await
    }

    /// Run a pending approval exactly once (the database consumes it atomically).
    /// What Gate B would decide for `tool(args)` on the scope's page (`ctxguard.explain_call`).
    pub async fn explain_call(
        &self,
        scope: &Scope,
        tool: &str,
        args: &Value,
    ) -> Result<Value, ApiError> {
        self.one(
            scope,
            sql::EXPLAIN_CALL,
            &[(&tool, Type::TEXT), (args, Type::JSONB)],
        )
        .await
    }

    /// Reject (an approver) or withdraw (the requester) a pending call.
    pub async fn reject(
        &self,
        scope: &Scope,
        call_id: Uuid,
        reason: Option<&str>,
    ) -> Result<Value, ApiError> {
        self.one(
            scope,
            sql::REJECT_CALL,
            &[(&call_id, Type::UUID), (&reason, Type::TEXT)],
        )
        .await
    }

    /// The pending calls the scope's user may decide (`ctxguard.pending_approvals()`).
    pub async fn pending_approvals(&self, scope: &Scope) -> Result<Value, ApiError> {
        self.one(scope, sql::PENDING_APPROVALS, &[]).await
    }

    pub async fn approve(&self, scope: &Scope, call_id: Uuid) -> Result<Value, ApiError> {
        self.one(scope, sql::APPROVE_CALL, &[(&call_id, Type::UUID)])
            .await
    }

    /// Verify the token and page, returning the context (who the database says the caller is).
    pub async fn context(&self, scope: &Scope) -> Result<Value, ApiError> {
        Ok(self.transaction(scope, Commit::Durable, &[]).await?.0)
    }

    /// Mint a generation for a conversation: its id and how long the database keeps it.
    pub async fn mint_generation(
        &self,
        scope: &Scope,
        conversation_id: &str,
    ) -> Result<(Uuid, Duration), ApiError> {
        let (_, mut results) = self
            .transaction(
                scope,
                self.turn_commit,
                &[(sql::MINT_GENERATION, &[(&conversation_id, Type::TEXT)])],
            )
            .await?;
        let r = one_row(results.pop().unwrap_or_default())?;
        Ok((r.get(0), ttl_secs(r.get(1))))
    }

    /// Persist a finished turn (tenant- and user-scoped, with its page context). A turn over the
    /// database's size limits is TURN_TOO_LARGE, never a page-context error.
    pub async fn save_turn(
        &self,
        scope: &Scope,
        conversation_id: &str,
        message: &str,
        answer: &str,
        calls: &Value,
    ) -> Result<i32, ApiError> {
        self.one_with(
            scope,
            self.turn_commit,
            sql::SAVE_TURN,
            &[
                (&conversation_id, Type::TEXT),
                (&message, Type::TEXT),
                (&answer, Type::TEXT),
                (calls, Type::JSONB),
            ],
        )
        .await
        .map_err(turn_error)
    }

    /// Verify a bearer token without a page (for MCP requests): the identity, or 401.
    pub async fn verify_token(&self, token: &str) -> Result<Value, ApiError> {
        self.bare(Access::ReadOnly, sql::VERIFY_TOKEN, &[(&token, Type::TEXT)])
            .await
    }

    /// Who a token is (401 otherwise), the user's key and current page (`user_pages`), and with a
    /// session id that session (its own page and its key on the page channel) if it is the
    /// caller's and live (`"session": null` otherwise). With `touch_after_ms` this is a use of the
    /// session, recorded in the database when the recorded one is older than that.
    pub async fn mcp_identity(
        &self,
        token: &str,
        session_id: Option<&str>,
        touch_after_ms: Option<i32>,
    ) -> Result<Value, ApiError> {
        self.bare(
            Access::ReadWrite,
            sql::MCP_IDENTITY,
            &[
                (&token, Type::TEXT),
                (&session_id, Type::TEXT),
                (&touch_after_ms, Type::INT4),
            ],
        )
        .await
    }

    /// End the caller's session of that id if no gateway used it for `idle_ms`: `None` when there
    /// is no such live session of the caller, else `{"ended": true}` or `{"ended": false, "idleMs"}`.
    pub async fn mcp_session_expire(
        &self,
        token: &str,
        session_id: &str,
        idle_ms: i32,
    ) -> Result<Option<Value>, ApiError> {
        self.bare(
            Access::ReadWrite,
            sql::MCP_SESSION_EXPIRE,
            &[
                (&token, Type::TEXT),
                (&session_id, Type::TEXT),
                (&idle_ms, Type::INT4),
            ],
        )
        .await
    }

    /// Record a use of the sessions this gateway holds streams on (`[{token, sessionId}]`, at most
    /// 1000), throttled by `touch_after_ms`: the ids (of tokens that verify) whose session is gone
    /// (ended or expired through any gateway).
    pub async fn mcp_session_touch(
        &self,
        sessions: &Value,
        touch_after_ms: i32,
    ) -> Result<Vec<String>, ApiError> {
        self.bare(
            Access::ReadWrite,
            sql::MCP_SESSION_TOUCH,
            &[(sessions, Type::JSONB), (&touch_after_ms, Type::INT4)],
        )
        .await
    }

    /// Validate the scope's page (`set_context`) and, in the same transaction, make it the user's
    /// current page (`put_user_page`: announced to every gateway at commit when it changed).
    /// Returns the context and `{key, changed}`.
    pub async fn put_user_page(&self, scope: &Scope) -> Result<(Value, Value), ApiError> {
        let (context, mut results) = self
            .transaction(scope, Commit::Durable, &[(sql::PUT_USER_PAGE, &[])])
            .await?;
        Ok((context, one_row(results.pop().unwrap_or_default())?.get(0)))
    }

    /// Validate the scope's page and make it the own page of the caller's MCP session.
    pub async fn put_session_page(
        &self,
        scope: &Scope,
        session_id: &str,
    ) -> Result<bool, ApiError> {
        self.one(scope, sql::PUT_SESSION_PAGE, &[(&session_id, Type::TEXT)])
            .await
    }

    /// Record an MCP session for the token's user, so that any gateway can serve it.
    pub async fn mcp_session_open(
        &self,
        token: &str,
        session_id: &str,
        init_params: &Value,
        ttl_secs: i32,
    ) -> Result<(), ApiError> {
        self.pipeline(
            Access::ReadWrite,
            Commit::Durable,
            &[(
                sql::MCP_SESSION_OPEN,
                &[
                    (&token, Type::TEXT),
                    (&session_id, Type::TEXT),
                    (init_params, Type::JSONB),
                    (&ttl_secs, Type::INT4),
                ],
            )],
        )
        .await?;
        Ok(())
    }

    /// The initialize parameters of the caller's live session of that id, if any.
    pub async fn mcp_session_load(
        &self,
        token: &str,
        session_id: &str,
    ) -> Result<Option<Value>, ApiError> {
        self.bare(
            Access::ReadOnly,
            sql::MCP_SESSION_LOAD,
            &[(&token, Type::TEXT), (&session_id, Type::TEXT)],
        )
        .await
    }

    /// End the caller's session of that id; whether there was one.
    pub async fn mcp_session_close(&self, token: &str, session_id: &str) -> Result<bool, ApiError> {
        self.bare(
            Access::ReadWrite,
            sql::MCP_SESSION_CLOSE,
            &[(&token, Type::TEXT), (&session_id, Type::TEXT)],
        )
        .await
    }

    /// Every tool Gate A shows (in the database's tiered order), the page type's description and
    /// the page's namespaces, in one transaction (an MCP client's list).
    pub async fn page_listing(
        &self,
        scope: &Scope,
    ) -> Result<(Vec<ToolSpec>, String, Overview), ApiError> {
        let none: (Option<&str>, Option<i32>) = (None, None);
        let (_, results) = self
            .transaction(
                scope,
                Commit::Durable,
                &[
                    (
                        sql::PAGE_TOOLS,
                        &[(&none.0, Type::TEXT), (&none.1, Type::INT4)],
                    ),
                    (sql::NAMESPACES, &[]),
                ],
            )
            .await?;
        let (tools, description) = tool_specs(&results[0]);
        Ok((tools, description, overview(&results[1])))
    }

    /// Gate A (optionally ranked by `query` and cut at `top_k`) and the page type's description.
    pub async fn page_tools(
        &self,
        scope: &Scope,
        query: Option<&str>,
        top_k: Option<i32>,
    ) -> Result<(Vec<ToolSpec>, String), ApiError> {
        let (_, results) = self
            .transaction(
                scope,
                Commit::Durable,
                &[(
                    sql::PAGE_TOOLS,
                    &[(&query, Type::TEXT), (&top_k, Type::INT4)],
                )],
            )
            .await?;
        Ok(tool_specs(results.first().map_or(&[][..], Vec::as_slice)))
    }

    /// Second half of a forwarded upstream call: mask, charge and audit the result.
    pub async fn complete_call(
        &self,
        scope: &Scope,
        call_id: Uuid,
        result: &Value,
        is_error: bool,
    ) -> Result<Value, ApiError> {
        self.one(
            scope,
            sql::COMPLETE_CALL,
            &[
                (&call_id, Type::UUID),
                (result, Type::JSONB),
                (&is_error, Type::BOOL),
            ],
        )
        .await
    }

    /// Enabled upstream servers from the registry (all, or those named).
    pub async fn mcp_servers(
        &self,
        names: Option<&[String]>,
    ) -> Result<Vec<ServerConfig>, ApiError> {
        let names: Option<Vec<String>> = names.map(<[String]>::to_vec);
        let rows = self
            .pipeline(
                Access::ReadOnly,
                Commit::Durable,
                &[(sql::MCP_SERVERS, &[(&names, Type::TEXT_ARRAY)])],
            )
            .await?
            .pop()
            .unwrap_or_default();
        let strings = |v: Value| -> std::collections::HashMap<String, String> {
            v.as_object()
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(rows
            .into_iter()
            .map(|r| ServerConfig {
                name: r.get(0),
                transport: r.get(1),
                url: r.get(2),
                command: r.get(3),
                args: r.get(4),
                env: strings(r.get(5)),
                cwd: r.get(6),
                headers: strings(r.get(7)),
                bearer_token_env: r.get(8),
                credential_mode: r.get(9),
                credential_config: r.get(10),
            })
            .collect())
    }

    /// The credential (sealed) of upstream call `call_id`, authorized for the scope's user and not
    /// completed (`ctxguard.upstream_credential`), with the verified context it was read under.
    pub async fn upstream_credential(
        &self,
        scope: &Scope,
        call_id: Uuid,
    ) -> Result<(Value, Option<StoredCredential>), ApiError> {
        let (context, mut results) = self
            .transaction(
                scope,
                Commit::Durable,
                &[(sql::UPSTREAM_CREDENTIAL, &[(&call_id, Type::UUID)])],
            )
            .await?;
        let row = results.pop().unwrap_or_default().into_iter().next();
        Ok((context, row.map(|r| stored(&r))))
    }

    /// Store the scope's user's own connection to `server` (sealed); the envelope.
    pub async fn put_upstream_credential(
        &self,
        scope: &Scope,
        server: &str,
        access: &Sealed,
        expires_at: Option<f64>,
        refresh: Option<&Sealed>,
    ) -> Result<Value, ApiError> {
        let refresh_ct = refresh.map(|r| r.ciphertext.as_slice());
        let refresh_nonce = refresh.map(|r| r.nonce.as_slice());
        let (ct, nonce) = (access.ciphertext.as_slice(), access.nonce.as_slice());
        self.one(
            scope,
            sql::PUT_UPSTREAM_CREDENTIAL,
            &[
                (&server, Type::TEXT),
                (&access.key_id, Type::TEXT),
                (&ct, Type::BYTEA),
                (&nonce, Type::BYTEA),
                (&expires_at, Type::FLOAT8),
                (&refresh_ct, Type::BYTEA),
                (&refresh_nonce, Type::BYTEA),
            ],
        )
        .await
    }

    /// Delete the scope's user's own connection to `server`: what was deleted (to revoke it),
    /// with the verified context.
    pub async fn delete_upstream_credential(
        &self,
        scope: &Scope,
        server: &str,
    ) -> Result<(Value, Option<StoredCredential>), ApiError> {
        let (context, mut results) = self
            .transaction(
                scope,
                Commit::Durable,
                &[(sql::DELETE_UPSTREAM_CREDENTIAL, &[(&server, Type::TEXT)])],
            )
            .await?;
        let row = results.pop().unwrap_or_default().into_iter().next();
        Ok((
            context,
            row.map(|r| StoredCredential {
                server: server.to_string(),
                mode: "user_oauth".into(),
                access: Sealed {
                    key_id: r.get(0),
                    ciphertext: r.get(1),
                    nonce: r.get(2),
                },
                expires_at: None,
                refresh: sealed_opt(r.get(0), r.get(3), r.get(4)),
            }),
        ))
    }

    /// Set the scope's tenant's secret for `server` (its tenant admin only; sealed).
    pub async fn put_tenant_secret(
        &self,
        scope: &Scope,
        server: &str,
        secret: &Sealed,
    ) -> Result<Value, ApiError> {
        let (ct, nonce) = (secret.ciphertext.as_slice(), secret.nonce.as_slice());
        self.one(
            scope,
            sql::PUT_TENANT_SECRET,
            &[
                (&server, Type::TEXT),
                (&secret.key_id, Type::TEXT),
                (&ct, Type::BYTEA),
                (&nonce, Type::BYTEA),
            ],
        )
        .await
    }

    /// Delete the scope's tenant's secret for `server` (its tenant admin only).
    pub async fn delete_tenant_secret(
        &self,
        scope: &Scope,
        server: &str,
    ) -> Result<Value, ApiError> {
        self.one(scope, sql::DELETE_TENANT_SECRET, &[(&server, Type::TEXT)])
            .await
    }

    /// The servers the scope's user may use that take a credential, and whether one is stored.
    pub async fn upstream_connections(&self, scope: &Scope) -> Result<Value, ApiError> {
        self.one(scope, sql::UPSTREAM_CONNECTIONS, &[]).await
    }

    /// Record a server's discovered tools in the catalog, without a context. Only on the discovery
    /// pool (`CTXGUARD_DISCOVERY_DATABASE_URL`): the gateway role cannot (`42501`).
    pub async fn sync_mcp_tools(&self, server: &str, tools: &Value) -> Result<Value, ApiError> {
        self.bare(
            Access::ReadWrite,
            sql::SYNC_MCP_TOOLS,
            &[(&server, Type::TEXT), (tools, Type::JSONB)],
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_over_the_size_limits_is_turn_too_large() {
        let limit = ApiError::Internal(
            "54000: ctxguard: a turn's answer is limited to 262144 bytes".into(),
        );
        assert_eq!(turn_error(limit).code(), "TURN_TOO_LARGE");
        let old = ApiError::Unprocessable("turn too large or malformed".into());
        assert_eq!(turn_error(old).code(), "TURN_TOO_LARGE");
        let page = ApiError::Unprocessable("page context: unknown pageType".into());
        assert_eq!(turn_error(page).code(), "INVALID_PAGE_CONTEXT");
        let other = ApiError::Internal("XX000: boom".into());
        assert_eq!(turn_error(other).code(), "INTERNAL");
    }
}
