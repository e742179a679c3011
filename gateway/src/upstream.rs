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

use crate::db::Db;
use crate::secrets::StdioUser;
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};

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
}

type Client = RunningService<RoleClient, ()>;

#[derive(Default)]
struct Slot {
    client: Option<Arc<Client>>,
    retry_after: Option<Instant>,
    /// A stdio server's process group (its leader's pid).
    pgid: Option<u32>,
}

pub struct Upstreams {
    slots: Mutex<HashMap<String, Slot>>,
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
            let now = Instant::now();
            names
                .iter()
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

    async fn healthy(&self, names: &[String]) -> HashSet<String> {
        let slots = self.slots.lock().await;
        names
            .iter()
            .filter(|n| slots.get(*n).is_some_and(|s| s.client.is_some()))
            .cloned()
            .collect()
    }

    async fn connect_all(&self, configs: Vec<ServerConfig>) {
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
        let span = crate::otel_span!(
            "tools/call",
            otel.name = format!("tools/call {tool}"),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            "mcp.method.name" = "tools/call",
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = tool,
            "ctxguard.mcp.server" = server,
            "error.type" = tracing::field::Empty,
        );
        let traceparent = crate::telemetry::traceparent(&span, trace_id);
        let result = self
            .forward_traced(server, tool, args, traceparent)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(r) if r["isError"] == true => crate::telemetry::record_error(&span, "tool_error"),
            Ok(_) => {}
            Err(ForwardError::Unavailable) => crate::telemetry::record_error(&span, "unavailable"),
            Err(ForwardError::Timeout) => crate::telemetry::record_error(&span, "timeout"),
        }
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
            let url = cfg.url.clone().ok_or("http server without url")?;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url);
            if let Some(var) = &cfg.bearer_token_env {
                config = config.auth_header(crate::secrets::token(var)?);
            }
            let mut headers = HashMap::new();
            for (k, v) in &cfg.headers {
                let name = axum::http::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| "invalid header name".to_string())?;
                let value = axum::http::HeaderValue::from_str(v)
                    .map_err(|_| "invalid header value".to_string())?;
                headers.insert(name, value);
            }
            config.custom_headers = headers;
            let transport = StreamableHttpClientTransport::from_config(config);
            let client = ().serve(transport).await.map_err(|e| e.to_string())?;
            Ok((client, None))
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
