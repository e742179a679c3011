//! **Room `upstream/`**: owns the registry of connections to upstream MCP servers (this file:
//! per credential mode, stdio isolation) and their credentials (`credentials/`). It may use `db`,
//! `pages`, `telemetry`, `seal`, `secrets`, `config`, `error`; it may not touch `services`, `tools`,
//! `chat`, `mcp` or `http` (what it needs of the gateway's state comes lent, `credentials::Deps`).
//!
//! Upstream MCP servers (seed 002), as an MCP client.
//!
//! The registry and the per-server access rules live in the database (`ctxguard.mcp_servers`,
//! `ctxguard.mcp_server_grants`); this module only keeps connections. A connection is opened
//! lazily, the first time a caller who may use the server needs it (or for every enabled server
//! at start-up, when discovery is on), and each (re)connection re-reads the server's tools into
//! the catalog with `ctxguard.sync_mcp_tools`, through the discovery role's own pool
//! (`CTXGUARD_DISCOVERY_DATABASE_URL`), never the gateway role's. Without that pool nothing is
//! recorded (one warning); tools already in the catalog keep working. A server that fails is
//! excluded with a warning and retried after a back-off; the others keep working. The caller's
//! token is never sent upstream: HTTP servers get the server's own bearer token, read from the
//! variable the registry names or from the file named by `<variable>_FILE` (`secrets.rs`).
//! Stdio servers start with only `PATH` and their registry `env`, in their own process group, with
//! `SIGKILL` as their parent-death signal, optionally as another OS user
//! (`CTXGUARD_MCP_STDIO_USER`); [`Upstreams::shutdown`] ends their groups with the gateway.

pub mod credentials;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, RequestParamsMeta, Tool};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio::sync::Mutex;
use tracing::Instrument;

use crate::db::{Db, ServerConfig};
use crate::secrets::StdioUser;
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};

type Client = RunningService<RoleClient, ()>;

#[derive(Default)]
struct Slot {
    client: Option<Arc<Client>>,
    retry_after: Option<Instant>,
    /// A stdio server's process group (its leader's pid).
    pgid: Option<u32>,
}

/// A per-user connection's key: the server, whose credential (`credentials::Auth::Bearer`'s
/// owner) and a hash of the token itself (a refreshed token opens a new connection).
type UserKey = (String, [u8; 32], [u8; 32]);

/// Most per-user connections kept open (least recently used closed first).
pub const MAX_USER_CONNECTIONS: usize = 256;

pub struct Upstreams {
    slots: Mutex<HashMap<String, Slot>>,
    /// The registry rows last read, by server (the credential mode and its settings).
    configs: Mutex<HashMap<String, ServerConfig>>,
    /// Connections that carry one user's (or tenant's) credential: never shared with anyone else.
    users: Mutex<HashMap<UserKey, (Arc<Client>, Instant)>>,
    /// Servers whose tools were recorded from a per-user connection (once per gateway start).
    primed: Mutex<HashSet<String>>,
    connect_timeout: Duration,
    call_timeout: Duration,
    retry_backoff: Duration,
    /// The discovery role's pool: the only one `sync_mcp_tools` runs through.
    discovery: Option<Db>,
    /// Whether "discovered tools are not recorded" was logged (once).
    warned_unrecorded: AtomicBool,
    /// The OS user stdio servers run as (`None`: the gateway's own).
    stdio_user: Option<StdioUser>,
}

/// Why a forwarded call produced no upstream result. Messages are fixed: no upstream detail.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("the upstream MCP server is unavailable")]
    Unavailable,
    #[error("the upstream MCP server did not answer in time")]
    Timeout,
}

impl Upstreams {
    /// `discovery`: the discovery role's pool, or `None` to record no discovered tools.
    pub fn new(
        connect_timeout: Duration,
        call_timeout: Duration,
        discovery: Option<Db>,
    ) -> Upstreams {
        Upstreams {
            slots: Mutex::new(HashMap::new()),
            configs: Mutex::new(HashMap::new()),
            users: Mutex::new(HashMap::new()),
            primed: Mutex::new(HashSet::new()),
            connect_timeout,
            call_timeout,
            retry_backoff: Duration::from_secs(10),
            discovery,
            warned_unrecorded: AtomicBool::new(false),
            stdio_user: None,
        }
    }

    /// Run stdio servers as `user` (see `secrets::StdioUser::resolve`).
    pub fn with_stdio_user(mut self, user: Option<StdioUser>) -> Upstreams {
        self.stdio_user = user;
        self
    }

    /// End every stdio server's process group (`SIGTERM`, then `SIGKILL` after a grace period)
    /// and drop every connection. Called when the gateway shuts down.
    pub async fn shutdown(&self) {
        let groups: Vec<u32> = {
            let mut slots = self.slots.lock().await;
            slots
                .values_mut()
                .filter_map(|s| {
                    s.client = None;
                    s.pgid.take()
                })
                .collect()
        };
        futures::future::join_all(
            groups
                .into_iter()
                .map(|g| crate::secrets::end_group(g, Duration::from_secs(3))),
        )
        .await;
    }

    /// Record a server's tools through the discovery role (or, without it, warn once).
    async fn record(&self, server: &str, tools: &[Tool]) {
        let Some(discovery) = &self.discovery else {
            if !self.warned_unrecorded.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    server,
                    "CTXGUARD_DISCOVERY_DATABASE_URL is not set: discovered MCP tools are not recorded \
                     (tools already in the catalog keep working)"
                );
            }
            return;
        };
        if let Err(e) = discovery.sync_mcp_tools(server, &tools_json(tools)).await {
            tracing::warn!(server, error = %e, "could not record the server's tools");
        }
    }

    /// Connect to every enabled server (start-up discovery). Returns the names that answered.
    /// `db` (the gateway role's pool) reads the registry; tools are recorded through the
    /// discovery pool.
    pub async fn discover(&self, db: &Db) -> HashSet<String> {
        match db.mcp_servers(None).await {
            Ok(configs) => {
                let names: Vec<String> = configs.iter().map(|c| c.name.clone()).collect();
                self.connect_all(configs).await;
                self.healthy(&names).await
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not read the MCP server registry");
                HashSet::new()
            }
        }
    }

    /// Of `names` (servers the caller may use, per the database), the ones that are connected,
    /// connecting those that are not (unless they failed within the back-off).
    pub async fn ensure(&self, db: &Db, names: &[String]) -> HashSet<String> {
        if names.is_empty() {
            return HashSet::new();
        }
        let missing: Vec<String> = {
            let slots = self.slots.lock().await;
            let configs = self.configs.lock().await;
            let now = Instant::now();
            names
                .iter()
                .filter(|n| {
                    configs
                        .get(*n)
                        .is_none_or(|c| c.credential_mode == "static")
                })
                .filter(|n| {
                    slots.get(*n).is_none_or(|s| {
                        s.client.is_none() && s.retry_after.is_none_or(|t| t <= now)
                    })
                })
                .cloned()
                .collect()
        };
        if !missing.is_empty() {
            match db.mcp_servers(Some(&missing)).await {
                Ok(configs) => self.connect_all(configs).await,
                Err(e) => tracing::warn!(error = %e, "could not read the MCP server registry"),
            }
        }
        self.healthy(names).await
    }

    /// Connected static servers, and every known server of a per-user mode (its calls connect
    /// with the caller's credential, or answer why they cannot).
    async fn healthy(&self, names: &[String]) -> HashSet<String> {
        let slots = self.slots.lock().await;
        let configs = self.configs.lock().await;
        names
            .iter()
            .filter(|n| {
                slots.get(*n).is_some_and(|s| s.client.is_some())
                    || configs
                        .get(*n)
                        .is_some_and(|c| c.credential_mode != "static")
            })
            .cloned()
            .collect()
    }

    /// The registry row of `server` (read when not known yet).
    pub async fn config(&self, db: &Db, server: &str) -> Option<ServerConfig> {
        if let Some(c) = self.configs.lock().await.get(server) {
            return Some(c.clone());
        }
        let rows = db.mcp_servers(Some(&[server.to_string()])).await.ok()?;
        let cfg = rows.into_iter().find(|c| c.name == server)?;
        self.configs
            .lock()
            .await
            .insert(cfg.name.clone(), cfg.clone());
        Some(cfg)
    }

    /// The registry row of `server` for a call Gate B authorized under credential mode `mode`
    /// (the `authorized` envelope's `credential_mode`: the server's mode at that moment). A kept
    /// row with another mode is read again and the server's connections, opened under the old
    /// mode's credential, are dropped. `None` when the registry still disagrees, or has no such
    /// server: the call must not go out (issue 33; never a shared static connection for a server
    /// the DBA moved to a per-user or per-tenant mode).
    pub async fn config_for_mode(&self, db: &Db, server: &str, mode: &str) -> Option<ServerConfig> {
        // An envelope naming no mode (an extension older than this gateway) touches nothing.
        if !ctxguard_core::policy::CREDENTIAL_MODES.contains(&mode) {
            return None;
        }
        if let Some(cfg) = self.config(db, server).await {
            if cfg.credential_mode == mode {
                return Some(cfg);
            }
        }
        let rows = db.mcp_servers(Some(&[server.to_string()])).await.ok()?;
        let cfg = rows.into_iter().find(|c| c.name == server)?;
        tracing::info!(
            server,
            mode = %cfg.credential_mode,
            "the server's credential mode changed: its registration was read again"
        );
        self.configs
            .lock()
            .await
            .insert(cfg.name.clone(), cfg.clone());
        // The shared connection was opened under the old registration: closed, and a stdio
        // server's process group ended (a stdio server is always static, so a mode that moved
        // means its transport moved too).
        let group = self.slots.lock().await.get_mut(server).and_then(|slot| {
            slot.client = None;
            slot.pgid.take()
        });
        if let Some(pgid) = group {
            crate::secrets::end_group(pgid, Duration::from_secs(3)).await;
        }
        self.forget(server).await;
        (cfg.credential_mode == mode).then_some(cfg)
    }

    /// Close the per-user connections to `server` (a credential was deleted or replaced).
    pub async fn forget(&self, server: &str) {
        self.users.lock().await.retain(|(s, _, _), _| s != server);
    }

    /// Open a connection with `auth` and record the server's tools from it (once per gateway
    /// start for a per-user server: its tools are not discovered at start-up, no one's
    /// credential being there).
    pub async fn prime(&self, cfg: &ServerConfig, auth: &crate::upstream::credentials::Auth) {
        if self.primed.lock().await.contains(&cfg.name) {
            return;
        }
        let Ok(client) = self.user_client(cfg, auth).await else {
            return;
        };
        if let Ok(Ok(tools)) =
            tokio::time::timeout(self.call_timeout, client.list_all_tools()).await
        {
            self.record(&cfg.name, &tools).await;
            self.primed.lock().await.insert(cfg.name.clone());
        }
    }

    /// The connection that carries `auth` to `cfg` (opened if needed; the least recently used is
    /// closed past [`MAX_USER_CONNECTIONS`]).
    async fn user_client(
        &self,
        cfg: &ServerConfig,
        auth: &crate::upstream::credentials::Auth,
    ) -> Result<Arc<Client>, ForwardError> {
        use sha2::Digest as _;
        let crate::upstream::credentials::Auth::Bearer { token, owner } = auth else {
            return Err(ForwardError::Unavailable);
        };
        let key: UserKey = (
            cfg.name.clone(),
            *owner,
            sha2::Sha256::digest(token.as_bytes()).into(),
        );
        if let Some((client, used)) = self.users.lock().await.get_mut(&key) {
            *used = Instant::now();
            return Ok(client.clone());
        }
        let connected = tokio::time::timeout(self.connect_timeout, connect_with(cfg, Some(token)))
            .await
            .map_err(|_| ForwardError::Timeout)?
            .map_err(|e| {
                tracing::warn!(server = %cfg.name, error = %e, "per-user MCP connection failed");
                ForwardError::Unavailable
            })?;
        let client = Arc::new(connected);
        let mut users = self.users.lock().await;
        // This owner's connections to this server with an older token are done with.
        users.retain(|(s, o, _), _| !(s == &cfg.name && o == owner));
        if users.len() >= MAX_USER_CONNECTIONS {
            if let Some(oldest) = users
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                users.remove(&oldest);
            }
        }
        users.insert(key, (client.clone(), Instant::now()));
        Ok(client)
    }

    /// Forward one authorized call with the credential the verified context chose: the
    /// server's static configuration, or the caller's own (a connection of its own).
    pub async fn forward_as(
        &self,
        cfg: &ServerConfig,
        tool: &str,
        args: Value,
        auth: &crate::upstream::credentials::Auth,
        trace_id: &str,
    ) -> Result<Value, ForwardError> {
        let server = cfg.name.as_str();
        if *auth == crate::upstream::credentials::Auth::Static {
            return self.forward(server, tool, args, trace_id).await;
        }
        let span = call_span(server, tool);
        let traceparent = crate::telemetry::traceparent(&span, trace_id);
        let result = self
            .forward_user(cfg, tool, args, auth, traceparent)
            .instrument(span.clone())
            .await;
        record_outcome(&span, &result);
        result
    }

    /// A call with a per-user or per-tenant credential, under the registration `settle` checked
    /// against Gate B's authorization (never one read again in between).
    async fn forward_user(
        &self,
        cfg: &ServerConfig,
        tool: &str,
        args: Value,
        auth: &crate::upstream::credentials::Auth,
        traceparent: Option<String>,
    ) -> Result<Value, ForwardError> {
        let server = cfg.name.as_str();
        let client = self.user_client(cfg, auth).await?;
        if !self.primed.lock().await.contains(server) {
            if let Ok(Ok(tools)) =
                tokio::time::timeout(self.call_timeout, client.list_all_tools()).await
            {
                self.record(server, &tools).await;
                self.primed.lock().await.insert(server.to_string());
            }
        }
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        if let Some(tp) = &traceparent {
            params.set_traceparent(tp);
        }
        match tokio::time::timeout(self.call_timeout, client.call_tool(params)).await {
            Ok(Ok(result)) => Ok(serde_json::to_value(result).unwrap_or(Value::Null)),
            Ok(Err(e)) => {
                tracing::warn!(server, error = %e, "upstream call failed; dropping the per-user connection");
                self.users
                    .lock()
                    .await
                    .retain(|_, (c, _)| !Arc::ptr_eq(c, &client));
                Err(ForwardError::Unavailable)
            }
            Err(_) => Err(ForwardError::Timeout),
        }
    }

    async fn connect_all(&self, configs: Vec<ServerConfig>) {
        {
            let mut known = self.configs.lock().await;
            for cfg in &configs {
                known.insert(cfg.name.clone(), cfg.clone());
            }
        }
        // Servers of a per-user mode have no connection of their own: each call opens (or reuses)
        // one with its caller's credential (`forward_as`).
        let configs: Vec<ServerConfig> = configs
            .into_iter()
            .filter(|c| c.credential_mode == "static")
            .collect();
        let attempts = configs.into_iter().map(|cfg| async move {
            let result =
                tokio::time::timeout(self.connect_timeout, connect(&cfg, self.stdio_user)).await;
            let client = match result {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    tracing::warn!(server = %cfg.name, error = %e, "MCP server excluded: connection failed");
                    return (cfg.name, None);
                }
                Err(_) => {
                    tracing::warn!(server = %cfg.name, "MCP server excluded: connection timed out");
                    return (cfg.name, None);
                }
            };
            let (client, pgid) = client;
            match tokio::time::timeout(self.call_timeout, client.list_all_tools()).await {
                Ok(Ok(tools)) => {
                    self.record(&cfg.name, &tools).await;
                    (cfg.name, Some((Arc::new(client), pgid)))
                }
                _ => {
                    tracing::warn!(server = %cfg.name, "MCP server excluded: tools/list failed");
                    (cfg.name, None)
                }
            }
        });
        let results = futures::future::join_all(attempts).await;
        let mut slots = self.slots.lock().await;
        for (name, connected) in results {
            if connected.is_some() {
                tracing::info!(server = %name, "MCP server connected");
            }
            let slot = slots.entry(name).or_default();
            slot.retry_after = connected
                .is_none()
                .then(|| Instant::now() + self.retry_backoff);
            (slot.client, slot.pgid) = match connected {
                Some((client, pgid)) => (Some(client), pgid),
                None => (None, None),
            };
        }
    }

    /// Forward one authorized call. A transport failure drops the connection (reconnected on the
    /// next `ensure`); the upstream's own tool errors come back as results with `isError`. The
    /// call is an MCP client span; its context goes upstream as `_meta.traceparent` (the request's
    /// `trace_id` when spans are not exported: `telemetry::traceparent`).
    pub async fn forward(
        &self,
        server: &str,
        tool: &str,
        args: Value,
        trace_id: &str,
    ) -> Result<Value, ForwardError> {
        let span = call_span(server, tool);
        let traceparent = crate::telemetry::traceparent(&span, trace_id);
        let result = self
            .forward_traced(server, tool, args, traceparent)
            .instrument(span.clone())
            .await;
        record_outcome(&span, &result);
        result
    }

    async fn forward_traced(
        &self,
        server: &str,
        tool: &str,
        args: Value,
        traceparent: Option<String>,
    ) -> Result<Value, ForwardError> {
        let client = {
            let slots = self.slots.lock().await;
            slots.get(server).and_then(|s| s.client.clone())
        };
        let Some(client) = client else {
            return Err(ForwardError::Unavailable);
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Value::Object(map) = args {
            params = params.with_arguments(map);
        }
        if let Some(tp) = &traceparent {
            params.set_traceparent(tp);
        }
        match tokio::time::timeout(self.call_timeout, client.call_tool(params)).await {
            Ok(Ok(result)) => Ok(serde_json::to_value(result).unwrap_or(Value::Null)),
            Ok(Err(e)) => {
                tracing::warn!(server, error = %e, "upstream call failed; dropping the connection");
                self.drop_client(server).await;
                Err(ForwardError::Unavailable)
            }
            Err(_) => Err(ForwardError::Timeout),
        }
    }

    async fn drop_client(&self, server: &str) {
        let mut slots = self.slots.lock().await;
        if let Some(s) = slots.get_mut(server) {
            s.client = None;
            s.retry_after = None;
        }
    }
}

/// The MCP client span of one forwarded call.
fn call_span(server: &str, tool: &str) -> tracing::Span {
    crate::otel_span!(
        "tools/call",
        otel.name = format!("tools/call {tool}"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        "mcp.method.name" = "tools/call",
        "gen_ai.operation.name" = "execute_tool",
        "gen_ai.tool.name" = tool,
        "ctxguard.mcp.server" = server,
        "error.type" = tracing::field::Empty,
    )
}

/// A forwarded call's outcome on its span.
fn record_outcome(span: &tracing::Span, result: &Result<Value, ForwardError>) {
    match result {
        Ok(r) if r["isError"] == true => crate::telemetry::record_error(span, "tool_error"),
        Ok(_) => {}
        Err(ForwardError::Unavailable) => crate::telemetry::record_error(span, "unavailable"),
        Err(ForwardError::Timeout) => crate::telemetry::record_error(span, "timeout"),
    }
}

/// The tools as `ctxguard.sync_mcp_tools` expects them (the MCP `tools/list` shape).
fn tools_json(tools: &[Tool]) -> Value {
    serde_json::to_value(tools).unwrap_or(Value::Array(Vec::new()))
}

/// Connect to a server: the client and, for a stdio server, its process group.
async fn connect(
    cfg: &ServerConfig,
    stdio_user: Option<StdioUser>,
) -> Result<(Client, Option<u32>), String> {
    match cfg.transport.as_str() {
        "http" => {
            if cfg.credential_mode != "static" {
                return Err("a per-user server is connected with its caller's credential".into());
            }
            Ok((connect_with(cfg, None).await?, None))
        }
        "stdio" => {
            let program = cfg.command.clone().ok_or("stdio server without command")?;
            let mut cmd = tokio::process::Command::new(program);
            // The child gets only PATH and its configured variables: never the gateway's secrets.
            cmd.env_clear();
            if let Ok(path) = std::env::var("PATH") {
                cmd.env("PATH", path);
            }
            cmd.args(&cfg.args).envs(&cfg.env);
            if let Some(dir) = &cfg.cwd {
                cmd.current_dir(dir);
            }
            crate::secrets::isolate(&mut cmd, stdio_user);
            // Its own process group: killing the server kills everything it started.
            let mut wrapped = CommandWrap::from(cmd);
            wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
            let transport = TokioChildProcess::new(wrapped).map_err(|e| e.to_string())?;
            let pgid = transport.id();
            let client = ().serve(transport).await.map_err(|e| e.to_string())?;
            Ok((client, pgid))
        }
        other => Err(format!("unknown transport {other}")),
    }
}

/// Connect to an HTTP server: with `bearer` (a caller's credential), or with the server's static
/// token (`bearer_token_env`), and its configured headers.
async fn connect_with(cfg: &ServerConfig, bearer: Option<&str>) -> Result<Client, String> {
    if cfg.transport != "http" {
        return Err("only http servers take a per-user credential".into());
    }
    let url = cfg.url.clone().ok_or("http server without url")?;
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    match bearer {
        Some(token) => config = config.auth_header(token.to_string()),
        None => {
            if let Some(var) = &cfg.bearer_token_env {
                config = config.auth_header(crate::secrets::token(var)?);
            }
        }
    }
    let mut headers = HashMap::new();
    for (k, v) in &cfg.headers {
        let name = axum::http::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| "invalid header name".to_string())?;
        if bearer.is_some() && name == axum::http::header::AUTHORIZATION {
            continue;
        }
        let value =
            axum::http::HeaderValue::from_str(v).map_err(|_| "invalid header value".to_string())?;
        headers.insert(name, value);
    }
    config.custom_headers = headers;
    let transport = StreamableHttpClientTransport::from_config(config);
    ().serve(transport).await.map_err(|e| e.to_string())
}
