//! **Room `config/`** (bottom floor): the settings (this file) and the values parsed from them:
//! the public URL (`public_url.rs`), the OAuth metadata (`oauth.rs`), host and origin entries
//! (`hosts.rs`), the tool budget (`budget.rs`), the database settings (`database.rs`). It may use
//! `secrets` only; every other room may read it.
//!
//! Configuration: environment variables (optionally loaded from a file), validated at startup.

pub mod budget;
pub mod database;
pub mod hosts;
pub mod oauth;
pub mod public_url;

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Provider {
    /// Deterministic, no network: picks among the visible tools from the message and answers only
    /// from tool results. The default.
    Offline,
    /// Any OpenAI-compatible chat completions API with tools (OpenAI, vLLM, Ollama, llama.cpp).
    Openai,
    /// Anthropic Messages API.
    Anthropic,
}

/// Where tool search's embeddings come from (`disclosure/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmbedProvider {
    /// The offline model in `CTXGUARD_EMBED_MODEL_DIR` (installed by scripts/setup.sh); without
    /// it, lexical matching only. The default.
    Offline,
    /// An OpenAI-compatible `/v1/embeddings` endpoint (`CTXGUARD_EMBED_BASE_URL`).
    Openai,
    /// Lexical matching only.
    None,
}

/// Which API the OpenAI-compatible provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OpenAiApi {
    /// Chat Completions (`POST /chat/completions`): every OpenAI-compatible server. Deferred
    /// tools are left out (the loop's `find_tools` reaches them). The default.
    Chat,
    /// The Responses API (`POST /responses`): deferred tools go out with `defer_loading`, grouped
    /// in their namespaces, beside the hosted `tool_search` tool; an endpoint that refuses those
    /// (a `400` naming them) is treated as `chat` does.
    Responses,
}

/// ctxguard gateway settings. Every flag also reads its `CTXGUARD_*` environment variable; a file of
/// `KEY=value` lines given with `--config` (or `CTXGUARD_CONFIG`) fills in variables not already set.
#[derive(Debug, Clone, Parser)]
#[command(name = "ctxguard-gateway", version, about)]
pub struct Config {
    /// Optional file of KEY=value lines (environment variables take precedence).
    #[arg(long, env = "CTXGUARD_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// PostgreSQL URL; connect as the non-superuser gateway role (e.g. ctxguard_gateway), which
    /// needs EXECUTE on ctxguard's API and nothing else. Every model call runs through it.
    #[arg(long, env = "CTXGUARD_DATABASE_URL")]
    pub database_url: String,
    /// PostgreSQL URL of the discovery role (e.g. ctxguard_discovery: EXECUTE on
    /// `ctxguard.sync_mcp_tools` only), which records the tools of upstream MCP servers. Optional:
    /// without it discovered tools are not recorded, and tools already in the catalog keep working.
    #[arg(long, env = "CTXGUARD_DISCOVERY_DATABASE_URL")]
    pub discovery_database_url: Option<String>,
    /// PostgreSQL URL of the one connection that listens for page changes made through other
    /// gateways (`LISTEN ctxguard_pages`). Must reach PostgreSQL directly (or a session-mode
    /// pool): never a transaction-mode pooler. Default: the database URL when it reaches
    /// PostgreSQL directly; behind a pooler, unset means MCP sessions hear only this gateway's
    /// page changes.
    #[arg(long, env = "CTXGUARD_NOTIFY_DATABASE_URL")]
    pub notify_database_url: Option<String>,
    /// How long an MCP session lives without requests, in seconds (its record in the database
    /// lets any gateway serve it until then).
    #[arg(long, env = "CTXGUARD_MCP_SESSION_TTL_SECS", default_value_t = 3600)]
    pub mcp_session_ttl_secs: i32,
    /// Address to listen on.
    #[arg(long, env = "CTXGUARD_LISTEN", default_value = "127.0.0.1:8088")]
    pub listen: SocketAddr,
    /// LLM provider.
    #[arg(long, env = "CTXGUARD_PROVIDER", value_enum, default_value = "offline")]
    pub provider: Provider,
    /// The OpenAI-compatible provider's API: `chat` (Chat Completions) or `responses` (the
    /// Responses API, whose tool search loads deferred tools).
    #[arg(long, env = "CTXGUARD_OPENAI_API", value_enum, default_value = "chat")]
    pub openai_api: OpenAiApi,
    /// Model name for the provider.
    #[arg(long, env = "CTXGUARD_MODEL", default_value = "offline-1")]
    pub model: String,
    /// Base URL of the provider API (e.g. https://api.openai.com/v1, http://localhost:11434/v1).
    #[arg(long, env = "CTXGUARD_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,
    /// API key for the provider.
    #[arg(long, env = "CTXGUARD_LLM_API_KEY", hide_env_values = true)]
    pub llm_api_key: Option<String>,
    /// Most model steps (model calls) per turn.
    #[arg(long, env = "CTXGUARD_MAX_STEPS", default_value_t = 6)]
    pub max_steps: u32,
    /// Deadline for one model request, in milliseconds.
    #[arg(long, env = "CTXGUARD_LLM_TIMEOUT_MS", default_value_t = 60_000)]
    pub llm_timeout_ms: u64,
    /// Longest wait for a database connection, in milliseconds.
    #[arg(long, env = "CTXGUARD_DB_TIMEOUT_MS", default_value_t = 2_000)]
    pub db_timeout_ms: u64,
    /// Longest a statement of the gateway may run, in milliseconds (`SET LOCAL statement_timeout`
    /// in every transaction: a setting a previous client of a pooled connection left, or a role
    /// default, does not apply). A statement over it fails (503, `DB_UNAVAILABLE`).
    #[arg(
        long,
        env = "CTXGUARD_DB_STATEMENT_TIMEOUT_MS",
        default_value_t = 15_000
    )]
    pub db_statement_timeout_ms: u64,
    /// Longest a statement of the gateway waits for a lock, in milliseconds (`SET LOCAL
    /// lock_timeout`): a lock some other session holds cannot stall a call for longer.
    #[arg(long, env = "CTXGUARD_DB_LOCK_TIMEOUT_MS", default_value_t = 5_000)]
    pub db_lock_timeout_ms: u64,
    /// Longest a gateway transaction may sit idle, in milliseconds (`SET LOCAL
    /// idle_in_transaction_session_timeout`): a gateway stalled mid-transaction gives back its
    /// server connection and locks.
    #[arg(
        long,
        env = "CTXGUARD_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
        default_value_t = 15_000
    )]
    pub db_idle_in_transaction_timeout_ms: u64,
    /// How statements are sent to the database: `prepared` (named prepared statements cached per
    /// connection: PostgreSQL directly, pgbouncer in session mode, or pgbouncer 1.21+ with
    /// `max_prepared_statements`), `unnamed` (one unnamed statement per query: any pooler, e.g.
    /// pgbouncer in transaction mode of any version), or `auto`: `prepared` when a probe connection
    /// sees PostgreSQL itself (its own client and server ports), `unnamed` otherwise.
    #[arg(
        long,
        env = "CTXGUARD_DB_STATEMENTS",
        value_enum,
        default_value = "auto"
    )]
    pub db_statements: database::StatementMode,
    /// How the transactions that mint a turn's generation and save the turn commit: `lazy`
    /// (default) does not wait for their WAL flush, so a crash may lose the last fraction of a
    /// second of saved turns (never an audit record, a charge or a tool's effect: those commit
    /// durably); `durable` waits, one flush more per turn and per generation.
    #[arg(long, env = "CTXGUARD_TURN_COMMIT", value_enum, default_value = "lazy")]
    pub turn_commit: database::Commit,
    /// Database connection pool size.
    #[arg(long, env = "CTXGUARD_POOL_SIZE", default_value_t = 16)]
    pub pool_size: usize,
    /// Most visible tools offered to the model per turn (ranked by the message).
    #[arg(long, env = "CTXGUARD_MAX_TOOLS", default_value_t = 24)]
    pub max_tools: i32,
    /// Most hidden tools `POST /v1/tools` lists (the first by name; `hiddenMore` says whether there
    /// are others): every visible tool is listed, and the request costs what the page and this
    /// need, not the catalog.
    #[arg(long, env = "CTXGUARD_EXPLAIN_MAX_HIDDEN", default_value_t = 200)]
    pub explain_max_hidden: i32,
    /// Tool search's embeddings: `offline` (the model directory), `openai` (an embeddings
    /// endpoint) or `none` (lexical only).
    #[arg(
        long,
        env = "CTXGUARD_EMBED_PROVIDER",
        value_enum,
        default_value = "offline"
    )]
    pub embed_provider: EmbedProvider,
    /// The offline embedding model's directory (config.json, vocab.txt, model.safetensors).
    /// Default: where scripts/setup.sh installs it, `$CTXGUARD_PG_CACHE/embed/all-MiniLM-L6-v2`
    /// (the cache is /var/cache/ctxguard for root, else `$XDG_CACHE_HOME/ctxguard`).
    #[arg(long, env = "CTXGUARD_EMBED_MODEL_DIR")]
    pub embed_model_dir: Option<std::path::PathBuf>,
    /// Base URL of the embeddings endpoint (`…/v1`) with `CTXGUARD_EMBED_PROVIDER=openai`.
    #[arg(long, env = "CTXGUARD_EMBED_BASE_URL")]
    pub embed_base_url: Option<String>,
    /// Embedding model name at the endpoint.
    #[arg(
        long,
        env = "CTXGUARD_EMBED_MODEL",
        default_value = "text-embedding-3-small"
    )]
    pub embed_model: String,
    /// API key of the embeddings endpoint.
    #[arg(long, env = "CTXGUARD_EMBED_API_KEY", hide_env_values = true)]
    pub embed_api_key: Option<String>,
    /// When a page's visible tools exceed this, the model and MCP clients get the compact list
    /// (the page's own tools, `find_tools` naming the page's namespaces) instead of every tool:
    /// a number of tools (`30`), or of estimated tokens of their definitions (`4000t`).
    #[arg(long, env = "CTXGUARD_TOOL_BUDGET", default_value = "30")]
    pub tool_budget: budget::Budget,
    /// Comma-separated hosts whose links and images may appear in answers.
    #[arg(long, env = "CTXGUARD_LINK_ALLOWLIST", default_value = "")]
    pub link_allowlist: String,

    /// Host names (or host:port) the MCP endpoint answers to (DNS-rebinding protection).
    #[arg(
        long,
        env = "CTXGUARD_MCP_ALLOWED_HOSTS",
        default_value = "localhost,127.0.0.1,::1"
    )]
    pub mcp_allowed_hosts: String,

    /// The gateway's public URL, `http(s)://host[:port][/prefix]`: what clients connect to (behind
    /// TLS or a reverse proxy, the proxy's URL). Everything the gateway advertises (the MCP resource,
    /// its metadata, the 401 challenge) is built from it, never from request headers. Its host is
    /// always allowed on `/mcp`. Unset: `http://` and the listen address.
    #[arg(long, env = "CTXGUARD_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Documentation of the MCP resource (`resource_documentation` in its metadata), a URL.
    #[arg(long, env = "CTXGUARD_MCP_DOCUMENTATION_URL")]
    pub mcp_documentation_url: Option<String>,

    /// Browser origins (`scheme://host[:port]`, `scheme://host:*`, or `null`) allowed to call `/mcp`.
    /// A request with any other `Origin` gets 403 `ORIGIN_NOT_ALLOWED`; requests without `Origin`
    /// (non-browser clients) are not affected. Empty: no browser origin.
    #[arg(long, env = "CTXGUARD_MCP_ALLOWED_ORIGINS", default_value = "")]
    pub mcp_allowed_origins: String,

    /// An MCP session with no request and no open stream for this long ends (its id then gets 404,
    /// and the client initializes again), in milliseconds. A session with an open GET stream lives
    /// as long as the stream.
    #[arg(
        long,
        env = "CTXGUARD_MCP_SESSION_IDLE_TIMEOUT_MS",
        default_value_t = 300_000
    )]
    pub mcp_session_idle_timeout_ms: u64,

    /// Interval of keep-alive comments on MCP event streams, in milliseconds (keeps proxies from
    /// closing a quiet stream, and finds streams whose client went away).
    #[arg(long, env = "CTXGUARD_MCP_KEEPALIVE_MS", default_value_t = 15_000)]
    pub mcp_keepalive_ms: u64,

    /// Connect to every enabled upstream MCP server at start-up and record its tools.
    #[arg(long, env = "CTXGUARD_MCP_DISCOVER", default_value_t = true, action = clap::ArgAction::Set)]
    pub mcp_discover: bool,

    /// OpenID provider(s) issuing the tokens `/mcp` accepts: issuer URLs, comma-separated, exactly
    /// as each provider's `issuer` reads. Listed as `authorization_servers` in the protected
    /// resource metadata, so MCP clients sign users in there (`oauth.rs`). The database verifies
    /// the tokens (`ctxguard.jwks_file`, `ctxguard.jwt_issuer`).
    #[arg(long, env = "CTXGUARD_OAUTH_ISSUER")]
    pub oauth_issuer: Option<String>,

    /// Scopes MCP clients should request (comma- or space-separated): `scopes_supported` in the
    /// metadata and `scope` in the 401 challenge.
    #[arg(long, env = "CTXGUARD_OAUTH_SCOPES")]
    pub oauth_scopes: Option<String>,

    #[arg(long, env = "CTXGUARD_MCP_CONNECT_TIMEOUT_MS", default_value_t = 5_000)]
    pub mcp_connect_timeout_ms: u64,

    #[arg(long, env = "CTXGUARD_MCP_CALL_TIMEOUT_MS", default_value_t = 30_000)]
    pub mcp_call_timeout_ms: u64,

    /// Demo mode: serve the screen-aware demo app at `/` and mint tokens for its demo users.
    /// Never in production: anyone who reaches the gateway can then act as a demo user. Only
    /// allowed on a loopback address.
    #[arg(long, env = "CTXGUARD_DEMO", default_value_t = false, action = clap::ArgAction::Set)]
    pub demo: bool,

    /// Demo mode only: file holding the HS256 secret the database verifies tokens with
    /// (`ctxguard.jwt_secret`).
    #[arg(long, env = "CTXGUARD_DEMO_JWT_SECRET_FILE")]
    pub demo_jwt_secret_file: Option<std::path::PathBuf>,

    /// Demo mode only: the `aud` claim of minted tokens (`ctxguard.jwt_audience`), if any.
    #[arg(long, env = "CTXGUARD_DEMO_JWT_AUDIENCE")]
    pub demo_jwt_audience: Option<String>,

    /// Demo mode only (required there): PostgreSQL URL of the role the demo app's human screens
    /// read through (e.g. ctxguard_app). Never the gateway role: screens show raw page text.
    #[arg(long, env = "CTXGUARD_DEMO_DATABASE_URL")]
    pub demo_database_url: Option<String>,

    /// Largest request body on every route, `/mcp` included, in bytes (larger: 413
    /// PAYLOAD_TOO_LARGE before any database work).
    #[arg(long, env = "CTXGUARD_MAX_BODY_BYTES", default_value_t = 64 * 1024)]
    pub max_body_bytes: usize,

    /// Most tool calls run from one model step; the step's further calls are refused
    /// (TOOL_CALL_LIMIT_EXCEEDED), reported and not run.
    #[arg(long, env = "CTXGUARD_MAX_TOOL_CALLS_PER_STEP", default_value_t = 8)]
    pub max_tool_calls_per_step: usize,

    /// Most tool calls run in one turn; further calls are refused like those past the step cap.
    #[arg(long, env = "CTXGUARD_MAX_TOOL_CALLS_PER_TURN", default_value_t = 24)]
    pub max_tool_calls_per_turn: usize,

    /// Largest tool call the model may ask for (its JSON arguments, in bytes); a larger one is
    /// refused (TOOL_CALL_TOO_LARGE) before its arguments are sent anywhere, echoed or stored.
    /// Above the database's `ctxguard.max_arg_bytes` (16 KiB), which judges and audits the rest.
    #[arg(long, env = "CTXGUARD_MAX_TOOL_ARGUMENT_BYTES", default_value_t = 64 * 1024)]
    pub max_tool_argument_bytes: usize,

    /// Longest answer, in bytes: a longer one is cut, and ends with a visible marker.
    #[arg(long, env = "CTXGUARD_MAX_ANSWER_BYTES", default_value_t = 64 * 1024)]
    pub max_answer_bytes: usize,

    /// Longest a client may take to send a request's head (request line and headers), in
    /// milliseconds, counted from its first byte (from `accept` for a new connection).
    #[arg(
        long,
        env = "CTXGUARD_HTTP_HEADER_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub http_header_timeout_ms: u64,

    /// Longest a client may take to send a request's body, in milliseconds, after its head.
    #[arg(long, env = "CTXGUARD_HTTP_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    pub http_body_timeout_ms: u64,

    /// Longest a kept-alive connection may sit idle between requests, in milliseconds.
    #[arg(long, env = "CTXGUARD_HTTP_IDLE_TIMEOUT_MS", default_value_t = 60_000)]
    pub http_idle_timeout_ms: u64,

    /// Most client connections open at once; more are answered 503 and closed at once.
    #[arg(long, env = "CTXGUARD_HTTP_MAX_CONNECTIONS", default_value_t = 512)]
    pub http_max_connections: usize,

    /// Most event streams (SSE: streamed chat turns, MCP streams) one user may hold open.
    #[arg(long, env = "CTXGUARD_HTTP_MAX_STREAMS_PER_USER", default_value_t = 16)]
    pub http_max_streams_per_user: usize,

    /// OS user (name or uid) stdio upstream MCP servers run as, instead of the gateway's own. The
    /// gateway needs to be root or hold CAP_SETUID and CAP_SETGID (and CAP_KILL to end them).
    #[arg(long, env = "CTXGUARD_MCP_STDIO_USER")]
    pub mcp_stdio_user: Option<String>,

    /// File of the keys that seal upstream credentials (tenant secrets, users' OAuth connections):
    /// one `key_id:base64` (32 bytes) per line; the first seals, all open (rotation: a new key
    /// first, the old ones after it). Unset: `tenant_secret` and `user_oauth` servers answer that
    /// no credential is available. The database never sees these keys.
    #[arg(long, env = "CTXGUARD_CREDENTIAL_KEY_FILE")]
    pub credential_key_file: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Parse the command line and environment (after loading `--config`), then validate.
    pub fn load() -> Result<Config, ConfigError> {
        // `--help` and `--version` need no configuration: answered (exit 0) before anything is read.
        if let Err(e) = Config::try_parse() {
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) {
                e.exit();
            }
        }
        let file = std::env::args()
            .skip_while(|a| a != "--config")
            .nth(1)
            .or_else(|| std::env::var("CTXGUARD_CONFIG").ok());
        if let Some(path) = file {
            dotenvy::from_path(&path)
                .map_err(|e| ConfigError::Invalid(format!("config file {path}: {e}")))?;
        }
        // Secrets given as files (`CTXGUARD_LLM_API_KEY_FILE`, ...): see `secrets.rs`.
        crate::secrets::files_to_env().map_err(ConfigError::Invalid)?;
        let c = Config::try_parse().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// The offline embedding model's directory: the setting, or where setup installs it.
    pub fn embed_model_dir(&self) -> std::path::PathBuf {
        if let Some(dir) = &self.embed_model_dir {
            return dir.clone();
        }
        let cache = std::env::var_os("CTXGUARD_PG_CACHE")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                if nix::unistd::Uid::effective().is_root() {
                    "/var/cache/ctxguard".into()
                } else {
                    std::env::var_os("XDG_CACHE_HOME")
                        .map(std::path::PathBuf::from)
                        .or_else(|| {
                            std::env::var_os("HOME")
                                .map(|h| std::path::Path::new(&h).join(".cache"))
                        })
                        .unwrap_or_else(|| "/tmp".into())
                        .join("ctxguard")
                }
            });
        cache.join("embed/all-MiniLM-L6-v2")
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError::Invalid(m.to_string()));
        if self.embed_provider == EmbedProvider::Openai
            && self.embed_base_url.as_deref().is_none_or(str::is_empty)
        {
            return bad("CTXGUARD_EMBED_PROVIDER=openai needs CTXGUARD_EMBED_BASE_URL");
        }
        if !(1..=32).contains(&self.max_steps) {
            return bad("CTXGUARD_MAX_STEPS must be 1..32");
        }
        if !(60..=86_400).contains(&self.mcp_session_ttl_secs) {
            return bad("CTXGUARD_MCP_SESSION_TTL_SECS must be 60..86400");
        }
        if !(1..=512).contains(&self.pool_size) {
            return bad("CTXGUARD_POOL_SIZE must be 1..512");
        }
        if self.llm_timeout_ms < 100 || self.db_timeout_ms < 10 {
            return bad("timeouts are too small");
        }
        for (name, ms) in [
            (
                "CTXGUARD_DB_STATEMENT_TIMEOUT_MS",
                self.db_statement_timeout_ms,
            ),
            ("CTXGUARD_DB_LOCK_TIMEOUT_MS", self.db_lock_timeout_ms),
            (
                "CTXGUARD_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS",
                self.db_idle_in_transaction_timeout_ms,
            ),
        ] {
            // 0 would mean "no limit" to PostgreSQL: never.
            if !(100..=3_600_000).contains(&ms) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be 100..3600000 (milliseconds)"
                )));
            }
        }
        if self.db_lock_timeout_ms > self.db_statement_timeout_ms {
            return bad(
                "CTXGUARD_DB_LOCK_TIMEOUT_MS must not exceed CTXGUARD_DB_STATEMENT_TIMEOUT_MS",
            );
        }
        if self.provider != Provider::Offline {
            if self.llm_base_url.as_deref().unwrap_or("").is_empty() {
                return bad(
                    "CTXGUARD_LLM_BASE_URL is required for the openai and anthropic providers",
                );
            }
            let url = self.llm_base_url.as_deref().unwrap_or("");
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return bad("CTXGUARD_LLM_BASE_URL must be an http(s) URL");
            }
        }
        if !(1024..=16 * 1024 * 1024).contains(&self.max_body_bytes) {
            return bad("CTXGUARD_MAX_BODY_BYTES must be 1024..16777216");
        }
        if !(1..=256).contains(&self.max_tool_calls_per_step) {
            return bad("CTXGUARD_MAX_TOOL_CALLS_PER_STEP must be 1..256");
        }
        if !(1..=1024).contains(&self.max_tool_calls_per_turn) {
            return bad("CTXGUARD_MAX_TOOL_CALLS_PER_TURN must be 1..1024");
        }
        if !(256..=1024 * 1024).contains(&self.max_tool_argument_bytes) {
            return bad("CTXGUARD_MAX_TOOL_ARGUMENT_BYTES must be 256..1048576");
        }
        // ctxguard.save_turn stores answers of at most 256 KiB.
        if !(1024..=256 * 1024).contains(&self.max_answer_bytes) {
            return bad("CTXGUARD_MAX_ANSWER_BYTES must be 1024..262144");
        }
        oauth::OAuth::from_config(self).map_err(ConfigError::Invalid)?;
        if let Some(h) = self
            .link_allowlist
            .split(',')
            .map(str::trim)
            .find(|h| !h.is_empty() && hosts::normalise_host(h).is_none())
        {
            return Err(ConfigError::Invalid(format!(
                "CTXGUARD_LINK_ALLOWLIST: {h:?} is not a host name"
            )));
        }
        for (name, ms) in [
            (
                "CTXGUARD_HTTP_HEADER_TIMEOUT_MS",
                self.http_header_timeout_ms,
            ),
            ("CTXGUARD_HTTP_BODY_TIMEOUT_MS", self.http_body_timeout_ms),
            ("CTXGUARD_HTTP_IDLE_TIMEOUT_MS", self.http_idle_timeout_ms),
        ] {
            if !(100..=3_600_000).contains(&ms) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be 100..3600000 (milliseconds)"
                )));
            }
        }
        public_url::PublicUrl::new(
            self.public_url.as_deref(),
            self.listen,
            self.mcp_documentation_url.as_deref(),
        )
        .map_err(ConfigError::Invalid)?;
        if let Some(o) = self
            .mcp_allowed_origins()
            .iter()
            .find(|o| hosts::parse_allowed(o).is_none())
        {
            return Err(ConfigError::Invalid(format!(
                "CTXGUARD_MCP_ALLOWED_ORIGINS: {o:?} is not scheme://host[:port|:*] or null"
            )));
        }
        if !(1_000..=86_400_000).contains(&self.mcp_session_idle_timeout_ms) {
            return bad("CTXGUARD_MCP_SESSION_IDLE_TIMEOUT_MS must be 1000..86400000");
        }
        if !(100..=3_600_000).contains(&self.mcp_keepalive_ms) {
            return bad("CTXGUARD_MCP_KEEPALIVE_MS must be 100..3600000");
        }
        if !(1..=1_000_000).contains(&self.http_max_connections) {
            return bad("CTXGUARD_HTTP_MAX_CONNECTIONS must be 1..1000000");
        }
        if !(1..=10_000).contains(&self.http_max_streams_per_user) {
            return bad("CTXGUARD_HTTP_MAX_STREAMS_PER_USER must be 1..10000");
        }
        if !(0..=10_000).contains(&self.explain_max_hidden) {
            return bad("CTXGUARD_EXPLAIN_MAX_HIDDEN must be 0..10000");
        }
        if self.demo {
            if !self.listen.ip().is_loopback() {
                return bad(
                    "CTXGUARD_DEMO mints tokens for anyone: it needs a loopback CTXGUARD_LISTEN",
                );
            }
            if self.demo_jwt_secret_file.is_none() {
                return bad("CTXGUARD_DEMO needs CTXGUARD_DEMO_JWT_SECRET_FILE");
            }
            if self.demo_url().is_none() {
                return bad(
                    "CTXGUARD_DEMO needs CTXGUARD_DEMO_DATABASE_URL (the demo screens' own role, e.g. ctxguard_app)",
                );
            }
        } else if self.demo_jwt_secret_file.is_some() {
            return bad(
                "CTXGUARD_DEMO_JWT_SECRET_FILE is only read in demo mode (CTXGUARD_DEMO=true)",
            );
        } else if self.demo_database_url.is_some() {
            return bad(
                "CTXGUARD_DEMO_DATABASE_URL is only read in demo mode (CTXGUARD_DEMO=true)",
            );
        }
        Ok(())
    }

    /// The discovery role's URL, if set (an empty value counts as unset).
    pub fn discovery_url(&self) -> Option<&str> {
        self.discovery_database_url
            .as_deref()
            .filter(|u| !u.is_empty())
    }

    /// Secret values of this configuration (database URLs, the provider key), so that copies
    /// given on the command line can be overwritten (`secrets::seal`).
    pub fn secret_values(&self) -> Vec<&str> {
        [
            Some(self.database_url.as_str()),
            self.discovery_database_url.as_deref(),
            self.notify_database_url.as_deref(),
            self.demo_database_url.as_deref(),
            self.llm_api_key.as_deref(),
            self.embed_api_key.as_deref(),
        ]
        .into_iter()
        .flatten()
        .filter(|v| !v.is_empty())
        .collect()
    }

    /// The listening connection's URL, if set (an empty value counts as unset).
    pub fn notify_url(&self) -> Option<&str> {
        self.notify_database_url
            .as_deref()
            .filter(|u| !u.is_empty())
    }

    /// The demo screens' URL, if set (an empty value counts as unset).
    pub fn demo_url(&self) -> Option<&str> {
        self.demo_database_url.as_deref().filter(|u| !u.is_empty())
    }

    pub fn llm_timeout(&self) -> Duration {
        Duration::from_millis(self.llm_timeout_ms)
    }

    pub fn db_timeout(&self) -> Duration {
        Duration::from_millis(self.db_timeout_ms)
    }

    /// The timeouts every database transaction pins.
    pub fn db_limits(&self) -> database::Limits {
        database::Limits {
            statement_timeout_ms: self.db_statement_timeout_ms,
            lock_timeout_ms: self.db_lock_timeout_ms,
            idle_in_transaction_timeout_ms: self.db_idle_in_transaction_timeout_ms,
        }
    }

    pub fn mcp_connect_timeout(&self) -> Duration {
        Duration::from_millis(self.mcp_connect_timeout_ms)
    }

    pub fn mcp_call_timeout(&self) -> Duration {
        Duration::from_millis(self.mcp_call_timeout_ms)
    }

    pub fn mcp_allowed_hosts(&self) -> Vec<String> {
        self.mcp_allowed_hosts
            .split(',')
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect()
    }

    pub fn mcp_allowed_origins(&self) -> Vec<String> {
        self.mcp_allowed_origins
            .split(',')
            .map(|o| o.trim().to_string())
            .filter(|o| !o.is_empty())
            .collect()
    }

    pub fn mcp_session_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.mcp_session_idle_timeout_ms)
    }

    pub fn mcp_keepalive(&self) -> Duration {
        Duration::from_millis(self.mcp_keepalive_ms)
    }

    pub fn allowed_hosts(&self) -> Vec<String> {
        self.link_allowlist
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect()
    }
}
