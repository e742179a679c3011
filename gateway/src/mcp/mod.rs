//! **Room `mcp/`** (below `http`): owns the MCP server at `/mcp` (this file), its sessions
//! (`sessions.rs`), the JSON-RPC edge (`jsonrpc.rs`) and the page notifications from other gateways
//! (`follow.rs`). It works on [`McpState`], which `http` provides; it may use `chat`, `tools`,
//! `services`, `upstream`, `pages`, `db`, `catalog`, `telemetry`, `limits`, `auth`, `config`,
//! `metrics`, `error`; it may not touch `http` (routes, `AppState`).
//!
//! ctxguard as an MCP server (Streamable HTTP at `/mcp`, via `rmcp`).
//!
//! - **Auth**: every request carries `Authorization: Bearer <context token>`; the database verifies
//!   it (`ctxguard.verify_token`) before rmcp sees the request. A missing or bad token is a 401 with
//!   `WWW-Authenticate` pointing at the protected-resource metadata, as the MCP authorization spec
//!   expects. The token is never passed to upstream servers.
//! - **Page context** (issue 14's semantics): a page in the `X-Ctxguard-Page` header (a JSON page
//!   context, or base64url of one) is the request's and, in a session, that session's own page from
//!   then on (`put_session_page` records it in the session's database record, so any gateway serving
//!   the session uses it); `PUT /v1/context` sets the user's shared page (`ctxguard.user_pages`,
//!   written by `put_user_page` in the transaction whose `set_context` validated it), which
//!   sessions without their own page and `subscriptions/listen` streams follow. When the page a
//!   listener follows changes it gets `notifications/tools/list_changed`: a session's own page here
//!   at once, and through `NOTIFY ctxguard_pages` (`s:` and the session's opaque key) on every
//!   other gateway, which re-reads that session's page; the shared page through `NOTIFY
//!   ctxguard_pages` (the user's opaque key) on every gateway (pages.rs `follow`; here directly
//!   while this gateway does not follow the channel).
//! - **Sessions** (`sessions.rs`) are bound to their user and live in the database too
//!   (`ctxguard.mcp_sessions`: a hash of the client-facing id, the tenant and user, the initialize
//!   parameters, the own page, the expiry): a session opened through one gateway is restored on any
//!   other ([`DbSessionStore`], `BoundSessions::restore_session`), a session that is not the
//!   caller's or no longer exists is 404 on every gateway, a DELETE through one ends it everywhere.
//!   Its use through any gateway is recorded in the database (throttled), so the idle reaper of a
//!   gateway ends it, everywhere, only once no gateway used it for the idle timeout.
//! - **tools/list** is Gate A for the current page; **tools/call** is Gate B (denials come back as
//!   tool errors carrying the ctxguard code). Without a page nothing is listed and nothing runs.
//!   Each page view gets its own generation, so byte and document budgets apply per page view.

pub mod follow;
pub mod jsonrpc;
pub mod sessions;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock,
    Implementation, InitializeRequestParams, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ResultType, ServerCapabilities, ServerConfig,
    SubscriptionFilter, Tool, ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore as RmcpSessionStore, SessionStoreError,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use tracing::Instrument;

use crate::auth::bearer;
use crate::catalog::compact;
use crate::catalog::{wire_name, ToolSpec};
use crate::config::oauth::OAuth;
use crate::db::{Scope, ToolName};
use crate::error::ApiError;
use crate::limits::Limits;
use crate::mcp::sessions::{BoundSessions, SessionKey, SessionMetrics, SessionStore, Who};
use crate::pages::{Lease, View};
use crate::services::Services;

/// What the MCP server needs of the gateway's state; `http` provides it
/// (`http::McpState::mcp_state`), this room never reaches up for the rest.
pub struct McpState {
    /// The services chat, tool calls and MCP share (`services.rs`).
    pub core: Arc<Services>,
    /// Each user's shared page and page views, and who to tell when a page changes.
    pub pages: Arc<PageHub>,
    /// MCP session records: owner, own page, use (`sessions.rs`).
    pub mcp_sessions: Arc<SessionStore>,
    pub mcp_session_metrics: SessionMetrics,
    /// Each user's open event streams count against `CTXGUARD_HTTP_MAX_STREAMS_PER_USER`.
    pub limits: Arc<Limits>,
    /// Authorization servers and scopes, for the bearer challenge (`config/oauth.rs`).
    pub oauth: OAuth,
    /// The hosts `/mcp` answers to (`http::origin::Guard`).
    pub hosts: Vec<String>,
}

/// The header carrying the page context on MCP requests.
pub const PAGE_HEADER: &str = "x-ctxguard-page";

/// The verified caller of an MCP request (inserted by [`authenticate`]), with the user's current
/// page as the database had it when the request came in.
#[derive(Clone, Debug)]
pub struct Caller {
    pub(crate) token: String,
    pub(crate) who: Who,
    /// The user's opaque key on the page channel (`ctxguard_pages`).
    key: String,
    /// The user's shared page (`PUT /v1/context`) as the database had it when the request came in.
    shared: Option<Value>,
    /// The session's own page as the database had it (any gateway may have set it).
    session_page: Option<Value>,
    /// The session's opaque key on the page channel (`s:<key>` announces its own page changed).
    session_tag: Option<String>,
}

tokio::task_local! {
    /// The caller of the MCP request being served, for [`DbSessionStore`] (rmcp calls the store
    /// inside the request, without its extensions).
    static MCP_CALLER: Caller;
}

#[derive(Clone)]
enum Listener {
    Session(Peer<RoleServer>),
    Subscription(SubscriptionSink),
}

/// Page views a user keeps generations for (their budgets): the most recent ones.
const GENERATIONS_PER_USER: usize = 8;

#[derive(Default)]
struct Entry {
    /// The user's shared page (`PUT /v1/context`), which sessions without their own page follow.
    shared: Option<Value>,
    /// The generation of each recent page view of the user (renewed before the database's lifetime
    /// for it runs out), newest last.
    generations: Vec<(Value, Lease)>,
    /// Who to tell when a page changes: sessions (with their key) and subscriptions.
    listeners: Vec<(u64, Listener, Option<SessionKey>)>,
}

/// Each user's shared page, the generations of their page views, and who to tell when a page
/// changes. A session's own page lives in its record ([`SessionStore`]).
///
/// - A page in a request's `X-Ctxguard-Page` header belongs to that request, and in a session to the
///   session from then on: it never changes the user's shared page or another session's.
/// - `PUT /v1/context` sets the user's shared page: sessions without a page of their own and
///   `subscriptions/listen` streams follow it.
///
/// So two clients of one user on different screens each keep their own list, and re-listing after
/// `list_changed` changes nothing (no notification storm).
pub struct PageHub {
    sessions: Arc<SessionStore>,
    /// To re-read a session's own page when another gateway announces it changed.
    db: crate::db::Db,
    entries: Mutex<HashMap<Who, Entry>>,
    next_id: AtomicU64,
    notified: prometheus::IntCounter,
    /// The user of each page-channel key seen here (notifications name keys, not users).
    keys: Mutex<HashMap<String, Who>>,
    /// The session of each session key on the page channel, for the sessions listening here.
    session_tags: Mutex<HashMap<String, SessionKey>>,
    /// 0 off, 1 lost, 2 listening (see [`PageHub::following`]).
    following: AtomicU64,
    /// Signalled when the first listener registers: the listening connection starts then (a
    /// gateway without MCP sessions holds no extra connection).
    wanted: tokio::sync::Notify,
}

impl PageHub {
    pub fn new(
        sessions: Arc<SessionStore>,
        db: crate::db::Db,
        metrics: &crate::metrics::Metrics,
    ) -> PageHub {
        let notified = prometheus::IntCounter::new(
            "ctxguard_mcp_list_changed_total",
            "notifications/tools/list_changed sent to MCP sessions and subscriptions",
        )
        .expect("metric");
        metrics.register(Box::new(notified.clone()));
        PageHub {
            sessions,
            db,
            entries: Mutex::default(),
            next_id: AtomicU64::new(0),
            notified,
            keys: Mutex::default(),
            session_tags: Mutex::default(),
            following: AtomicU64::new(0),
            wanted: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Who, Entry>> {
        self.entries.lock().expect("page hub lock")
    }

    /// The page in effect for a session (its own, else the user's shared one), or for a request
    /// outside sessions (the shared one).
    fn page_for(&self, who: &Who, session: Option<&SessionKey>) -> Option<Value> {
        if let Some(own) = session
            .and_then(|k| self.sessions.get(&k.0))
            .and_then(|r| r.page)
        {
            return Some(own);
        }
        self.lock().get(who).and_then(|e| e.shared.clone())
    }

    /// Set `who`'s shared page (`PUT /v1/context`); its followers are told if it changed.
    /// The page itself is in the database (`put_user_page`), which announces the change to every
    /// gateway; while this gateway follows the announcements, its followers are told through them
    /// (once), otherwise here.
    pub fn set_shared(self: &Arc<Self>, who: Who, key: String, page: Value, changed: bool) {
        self.know(key, &who);
        let mut entries = self.lock();
        let entry = entries.entry(who.clone()).or_default();
        entry.shared = Some(page);
        if !changed || self.following() == "listening" {
            return;
        }
        let followers = self.followers(entry);
        drop(entries);
        self.spawn_notify(who, followers);
    }

    /// Remember whose key `key` is (notifications name keys).
    fn know(&self, key: String, who: &Who) {
        self.keys
            .lock()
            .expect("page keys lock")
            .insert(key, who.clone());
    }

    /// The listeners that follow the user's shared page: subscriptions, and sessions without a
    /// page of their own.
    fn followers(&self, entry: &Entry) -> Vec<(u64, Listener)> {
        entry
            .listeners
            .iter()
            .filter(|(_, _, session)| match session {
                None => true,
                Some(k) => self.sessions.get(&k.0).is_some_and(|r| r.page.is_none()),
            })
            .map(|(id, l, _)| (*id, l.clone()))
            .collect()
    }

    /// Give a session its own page; the session is told if its page in effect changed.
    fn set_session_page(self: &Arc<Self>, who: &Who, session: &SessionKey, page: Value) {
        let before = self.page_for(who, Some(session));
        self.sessions.set_page(&session.0, page.clone());
        if before.as_ref() == Some(&page) {
            return;
        }
        let listeners = self.session_listeners(who, session);
        self.spawn_notify(who.clone(), listeners);
    }

    /// The listeners of one session.
    fn session_listeners(&self, who: &Who, session: &SessionKey) -> Vec<(u64, Listener)> {
        self.lock()
            .get(who)
            .map(|e| {
                e.listeners
                    .iter()
                    .filter(|(_, _, k)| k.as_ref() == Some(session))
                    .map(|(id, l, _)| (*id, l.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A session's own page changed (announced by the database, from any gateway, this one
    /// included): re-read it, and tell the session's listeners here if the page in effect for it
    /// changed (not when this gateway made the change: it told them already). If it cannot be
    /// re-read (the token kept for it no longer verifies, the database is away), they are told
    /// anyway: the list they then ask for comes from the database.
    async fn session_changed(self: Arc<Self>, session: SessionKey) {
        let Some(record) = self.sessions.get(&session.0) else {
            return;
        };
        let who = record.who.clone();
        let reread = match &record.token {
            Some(token) => self.db.mcp_identity(token, Some(&session.0), None).await,
            None => Err(ApiError::Unauthorized("no token".into())),
        };
        match reread {
            Ok(identity) => {
                let Some(page) = identity["session"]
                    .get("page")
                    .filter(|p| p.is_object())
                    .cloned()
                else {
                    // Ended, or without a page of its own: nothing to re-list for.
                    return;
                };
                let before = self.page_for(&who, Some(&session));
                self.sessions.set_page(&session.0, page.clone());
                if before.as_ref() == Some(&page) {
                    return;
                }
            }
            Err(e) => tracing::info!(
                code = e.code(),
                "re-reading an MCP session's page failed: its listeners re-list"
            ),
        }
        let listeners = self.session_listeners(&who, &session);
        self.notify(who, listeners).await;
    }

    fn spawn_notify(self: &Arc<Self>, who: Who, listeners: Vec<(u64, Listener)>) {
        if !listeners.is_empty() {
            tokio::spawn(self.clone().notify(who, listeners));
        }
    }

    /// An announcement on the page channel (from any gateway, this one included): `s:<key>` a
    /// session's own page (see [`PageHub::session_changed`]), else a user's shared page: the
    /// user's followers here are told. Keys name users and sessions opaquely; the pages themselves
    /// are read from the database on every request.
    pub fn changed(self: &Arc<Self>, key: &str) {
        if let Some(tag) = key.strip_prefix("s:") {
            let session = self
                .session_tags
                .lock()
                .expect("session tags lock")
                .get(tag)
                .cloned();
            if let Some(session) = session {
                tokio::spawn(self.clone().session_changed(session));
            }
            return;
        }
        let Some(who) = self.keys.lock().expect("page keys lock").get(key).cloned() else {
            return;
        };
        let followers = match self.lock().get(&who) {
            Some(entry) => self.followers(entry),
            None => return,
        };
        self.spawn_notify(who, followers);
    }

    /// Notifications may have been missed (the listening connection was lost): every listener
    /// here is told to re-list.
    pub fn resync(self: &Arc<Self>) {
        let all: Vec<_> = self
            .lock()
            .iter()
            .map(|(who, e)| {
                (
                    who.clone(),
                    e.listeners
                        .iter()
                        .map(|(id, l, _)| (*id, l.clone()))
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        for (who, listeners) in all {
            self.spawn_notify(who, listeners);
        }
    }

    /// Ask for the listening connection (at the first listener; idempotent).
    pub fn want(&self) {
        self.wanted.notify_one();
    }

    /// Until someone asked for the listening connection.
    pub async fn wanted(&self) {
        self.wanted.notified().await;
    }

    /// Whether the listening connection is up (for `/ready` and `/metrics`).
    pub fn set_following(&self, up: bool) {
        self.following
            .store(if up { 2 } else { 1 }, Ordering::Relaxed);
    }

    /// `off` (no listening connection configured), `listening` or `lost`.
    pub fn following(&self) -> &'static str {
        match self.following.load(Ordering::Relaxed) {
            0 => "off",
            2 => "listening",
            _ => "lost",
        }
    }

    async fn notify(self: Arc<Self>, who: Who, listeners: Vec<(u64, Listener)>) {
        let mut gone = Vec::new();
        for (id, l) in listeners {
            let ok = match l {
                Listener::Session(peer) => peer.notify_tool_list_changed().await.is_ok(),
                Listener::Subscription(sink) => sink.notify_tool_list_changed().await.is_ok(),
            };
            if ok {
                self.notified.inc();
            } else {
                gone.push(id);
            }
        }
        if !gone.is_empty() {
            self.remove(&who, &gone);
        }
    }

    /// Add a listener: a session's peer (with its key), or a subscription stream (following the
    /// user's shared page).
    fn listen(&self, caller: &Caller, l: Listener, session: Option<SessionKey>) -> u64 {
        let who = &caller.who;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.know(caller.key.clone(), who);
        if let (Some(session), Some(tag)) = (&session, &caller.session_tag) {
            self.session_tags
                .lock()
                .expect("session tags lock")
                .insert(tag.clone(), session.clone());
        }
        self.want();
        let mut entries = self.lock();
        let entry = entries.entry(who.clone()).or_default();
        entry.listeners.retain(|(_, l, _)| match l {
            Listener::Session(p) => !p.is_transport_closed(),
            Listener::Subscription(_) => true,
        });
        entry.listeners.push((id, l, session));
        id
    }

    fn remove(&self, who: &Who, ids: &[u64]) {
        if let Some(e) = self.lock().get_mut(who) {
            e.listeners.retain(|(id, _, _)| !ids.contains(id));
        }
    }

    /// A session ended: drop its listeners.
    pub fn forget_session(&self, session: &SessionKey) {
        for e in self.lock().values_mut() {
            e.listeners.retain(|(_, _, k)| k.as_ref() != Some(session));
        }
        self.session_tags
            .lock()
            .expect("session tags lock")
            .retain(|_, k| k != session);
    }

    /// The generation of `who`'s view of `page`, unless it is time to renew it.
    fn generation(&self, who: &Who, page: &Value) -> Option<Lease> {
        let entries = self.lock();
        entries
            .get(who)?
            .generations
            .iter()
            .find(|(p, _)| p == page)
            .map(|(_, l)| *l)
            .filter(|l| !l.due())
    }

    fn set_generation(&self, who: &Who, page: &Value, lease: Lease) {
        let mut entries = self.lock();
        let generations = &mut entries.entry(who.clone()).or_default().generations;
        generations.retain(|(p, _)| p != page);
        generations.push((page.clone(), lease));
        if generations.len() > GENERATIONS_PER_USER {
            generations.remove(0);
        }
    }
}

/// Parse the page header: a JSON object, or base64url (no padding) of one.
pub fn parse_page_header(headers: &HeaderMap) -> Result<Option<Value>, String> {
    let Some(raw) = headers.get(PAGE_HEADER) else {
        return Ok(None);
    };
    let text = raw
        .to_str()
        .map_err(|_| "X-Ctxguard-Page must be ASCII")?
        .trim();
    let json = if text.starts_with('{') {
        text.to_string()
    } else {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text.trim_end_matches('='))
            .map_err(|_| "X-Ctxguard-Page must be a JSON object or base64url of one")?;
        String::from_utf8(bytes).map_err(|_| "X-Ctxguard-Page is not UTF-8")?
    };
    match serde_json::from_str::<Value>(&json) {
        Ok(v @ Value::Object(_)) => Ok(Some(v)),
        _ => Err("X-Ctxguard-Page must be a JSON object or base64url of one".into()),
    }
}

/// 401 with a bearer challenge pointing at the metadata (`config/public_url.rs`).
fn unauthorized(state: &McpState, message: &str, token_sent: bool) -> Response {
    let mut resp = ApiError::Unauthorized(message.into()).into_response();
    // The configured scopes (`config/oauth.rs`) join the challenge (RFC 6750 §3 `scope`).
    let challenge = format!(
        "{}{}",
        state.core.public.challenge(token_sent),
        state.oauth.challenge_scope()
    );
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    resp
}

/// The session header of the session-based protocol revisions.
const SESSION_HEADER: &str = "mcp-session-id";

/// 404 for a session that does not exist, ended, or is another user's (the same answer for all).
fn session_not_found() -> Response {
    (
        axum::http::StatusCode::NOT_FOUND,
        Json(json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {"code": -32001, "message": "Session not found: initialize a new session",
                      "data": {"code": "SESSION_NOT_FOUND"}},
        })),
    )
        .into_response()
}

/// Middleware on `/mcp`: verify the bearer token in the database, then hand the caller to rmcp.
pub async fn authenticate(
    State(state): State<Arc<McpState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let headers = req.headers().clone();
    let token = match bearer(&headers) {
        Ok(t) => t,
        Err(_) => return unauthorized(&state, "a bearer token is required", false),
    };
    let session = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // A request in a session is a use of it, recorded in the database (at most once per
    // touch_after), so that no gateway's idle timeout ends a session used through another.
    let touch_after =
        crate::mcp::sessions::touch_after(state.core.config.mcp_session_idle_timeout());
    let touch_after_ms = i32::try_from(touch_after.as_millis()).unwrap_or(i32::MAX);
    let identity = match state
        .core
        .db
        .mcp_identity(&token, session.as_deref(), Some(touch_after_ms))
        .await
    {
        Ok(v) => v,
        Err(ApiError::Unauthorized(m)) => return unauthorized(&state, &m, true),
        Err(e) => return e.into_response(),
    };
    let user = (
        identity["tenantId"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        identity["userId"].as_str().unwrap_or_default().to_string(),
    );
    // A session is answered only to the user who initialized it (the database's record, which any
    // gateway may have written: `session` is null for another user's, an ended or an expired one),
    // as an unknown one (404), and nothing of it is touched.
    if let Some(id) = &session {
        let local_other = state.mcp_sessions.get(id).is_some_and(|r| r.who != user);
        if identity["session"].is_null() || local_other {
            return session_not_found();
        }
        // The freshest token keeps the session's record (its upkeep outlives this request).
        state.mcp_sessions.set_token(id, &token);
    }
    let caller = Caller {
        token,
        who: user.clone(),
        key: identity["key"].as_str().unwrap_or_default().to_string(),
        shared: Some(identity["page"].clone()).filter(Value::is_object),
        session_page: Some(identity["session"]["page"].clone()).filter(Value::is_object),
        session_tag: identity["session"]["key"].as_str().map(str::to_string),
    };
    req.extensions_mut().insert(caller.clone());
    // An event stream (a GET stream, a streamed answer, a subscription) counts against the user's.
    let response = MCP_CALLER.scope(caller, next.run(req)).await;
    state.limits.hold_stream(&user, response)
}

/// The rmcp service at `/mcp`, on sessions bound to their users (`sessions.rs`).
pub fn service(state: Arc<McpState>) -> StreamableHttpService<Server, BoundSessions> {
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .with_sse_keep_alive(Some(state.core.config.mcp_keepalive()))
        .with_allowed_hosts(state.hosts.clone())
        .with_allowed_origins(state.core.config.mcp_allowed_origins())
        .enforce_origin_validation();
    config.session_store = Some(Arc::new(DbSessionStore {
        db: state.core.db.clone(),
        ttl_secs: state.core.config.mcp_session_ttl_secs,
    }));
    let pages = state.pages.clone();
    let sessions = Arc::new(
        BoundSessions::new(
            state.mcp_sessions.clone(),
            state.mcp_session_metrics.clone(),
            move |key| pages.forget_session(key),
        )
        // A session ends when it is idle in the database (no gateway used it), and there too: no
        // gateway restores it (its id gets 404).
        .with_records(Arc::new(DbSessionRecords {
            db: state.core.db.clone(),
        })),
    );
    BoundSessions::spawn_reaper(&sessions, state.core.config.mcp_session_idle_timeout());
    StreamableHttpService::new(
        move || {
            Ok(Server {
                state: state.clone(),
            })
        },
        sessions,
        config,
    )
}

/// MCP sessions in the database (`ctxguard.mcp_sessions`), keyed by a hash of the id and bound to
/// the token's tenant and user: rmcp records a session after its handshake, restores one it does
/// not hold in memory (replaying the recorded `initialize`), and removes one on DELETE. Every call
/// runs as the caller of the request being served ([`MCP_CALLER`]).
struct DbSessionStore {
    db: crate::db::Db,
    ttl_secs: i32,
}

/// The sessions' records as the idle reaper keeps them (`sessions.rs`): their use by open
/// streams, their expiry. Each call runs with the token kept for the session.
struct DbSessionRecords {
    db: crate::db::Db,
}

/// Milliseconds for the database (which bounds them).
fn millis(d: std::time::Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[async_trait::async_trait]
impl crate::mcp::sessions::SessionRecords for DbSessionRecords {
    async fn expire(
        &self,
        id: &str,
        token: &str,
        idle: std::time::Duration,
    ) -> crate::mcp::sessions::Expiry {
        use crate::mcp::sessions::Expiry;
        match self.db.mcp_session_expire(token, id, millis(idle)).await {
            Ok(None) => Expiry::Gone,
            Ok(Some(v)) if v["ended"] == true => Expiry::Ended,
            Ok(Some(v)) => Expiry::Used(std::time::Duration::from_millis(
                v["idleMs"].as_u64().unwrap_or(0),
            )),
            Err(ApiError::Unauthorized(_)) => Expiry::Unverified,
            Err(e) => {
                tracing::warn!(code = e.code(), "expiring an idle MCP session failed");
                Expiry::Unavailable
            }
        }
    }

    async fn touch(
        &self,
        sessions: &[(Arc<str>, String)],
        touch_after: std::time::Duration,
    ) -> Vec<Arc<str>> {
        let mut gone = Vec::new();
        // The database takes at most 1000 a call.
        for chunk in sessions.chunks(1000) {
            let batch: Vec<Value> = chunk
                .iter()
                .map(|(id, token)| json!({"token": token, "sessionId": &**id}))
                .collect();
            match self
                .db
                .mcp_session_touch(&Value::Array(batch), millis(touch_after))
                .await
            {
                // Only ids this gateway sent (the answer names nothing else).
                Ok(ids) => gone.extend(
                    chunk
                        .iter()
                        .filter(|(id, _)| ids.iter().any(|g| g == &**id))
                        .map(|(id, _)| id.clone()),
                ),
                Err(e) => tracing::warn!(
                    code = e.code(),
                    "recording the use of streamed MCP sessions failed"
                ),
            }
        }
        gone
    }
}

fn store_error(e: ApiError) -> SessionStoreError {
    Box::new(std::io::Error::other(e.code()))
}

fn current_caller() -> Result<Caller, SessionStoreError> {
    MCP_CALLER
        .try_with(Clone::clone)
        .map_err(|_| Box::new(std::io::Error::other("no MCP caller")) as SessionStoreError)
}

#[async_trait::async_trait]
impl RmcpSessionStore for DbSessionStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let caller = current_caller()?;
        let Some(params) = self
            .db
            .mcp_session_load(&caller.token, session_id)
            .await
            .map_err(store_error)?
        else {
            return Ok(None);
        };
        Ok(serde_json::from_value(params).ok().map(SessionState::new))
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let caller = current_caller()?;
        let params = serde_json::to_value(&state.initialize_params)?;
        self.db
            .mcp_session_open(&caller.token, session_id, &params, self.ttl_secs)
            .await
            .map_err(store_error)
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        let caller = current_caller()?;
        self.db
            .mcp_session_close(&caller.token, session_id)
            .await
            .map(|_| ())
            .map_err(store_error)
    }
}

#[derive(Clone)]
pub struct Server {
    state: Arc<McpState>,
}

const INSTRUCTIONS: &str = "ctxguard tools follow the page the user is on: the list changes with \
the page (you will get notifications/tools/list_changed), ids of the entity on the page are filled \
in for you, and every call is re-checked, masked, budgeted and audited by the database. A refused \
call is a tool error carrying a stable code (e.g. TOOL_NOT_VISIBLE, ENTITY_MISMATCH, \
APPROVAL_REQUIRED, RATE_LIMIT_EXCEEDED, RESULT_TOO_LARGE).";

/// The verified caller, the page header (if any) and the session (if any) of a message.
fn caller_of(
    ext: &rmcp::model::Extensions,
) -> Result<(Caller, Option<Value>, Option<SessionKey>), McpError> {
    let parts = ext
        .get::<axum::http::request::Parts>()
        .ok_or_else(|| McpError::internal_error("no HTTP request", None))?;
    let caller = parts
        .extensions
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| McpError::invalid_request("not authenticated", None))?;
    let page = parse_page_header(&parts.headers)
        .map_err(|m| McpError::invalid_params(m, Some(json!({"code": "INVALID_PAGE_CONTEXT"}))))?;
    Ok((caller, page, ext.get::<SessionKey>().cloned()))
}

/// A JSON-RPC error for the API's, carrying its stable code in `data.code`.
fn api_error(e: ApiError) -> McpError {
    let data = Some(json!({"code": e.code()}));
    match e {
        ApiError::Unauthorized(m) | ApiError::Unprocessable(m) | ApiError::BadRequest(m) => {
            McpError::invalid_params(m, data)
        }
        ApiError::Internal(detail) => {
            tracing::error!(%detail, "internal error");
            McpError::internal_error("internal error", data)
        }
        other => McpError::internal_error(other.to_string(), data),
    }
}

/// A readable title from a catalog name: `invoice.mark_paid` → `Invoice: mark paid`.
pub fn readable_title(name: &str) -> String {
    let words = |s: &str| s.replace(['_', '-'], " ");
    let mut parts: Vec<String> = name.split('.').map(words).collect();
    let last = parts.pop().unwrap_or_default();
    let title = if parts.is_empty() {
        last
    } else {
        format!("{}: {last}", parts.join(" "))
    };
    let mut chars = title.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => title,
    }
}

/// A listed tool: its wire name, the catalog's title, and hints from its policy. `destructiveHint` is
/// true for `danger: destructive`, false only for read-only tools (for other writes it is left to
/// the client's default, true); read-only tools are idempotent; upstream tools reach an open world,
/// the database's own tools do not.
fn to_tool(t: &ToolSpec) -> Tool {
    let schema: Map<String, Value> = match &t.input_schema {
        Value::Object(o) => o.clone(),
        _ => Map::new(),
    };
    let title = t
        .title
        .clone()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| readable_title(&t.name));
    let mut annotations = ToolAnnotations::new();
    annotations.title = Some(title.clone());
    annotations.read_only_hint = Some(t.read_only);
    annotations.destructive_hint = if t.danger == "destructive" {
        Some(true)
    } else if t.read_only {
        Some(false)
    } else {
        None
    };
    annotations.idempotent_hint = t.read_only.then_some(true);
    annotations.open_world_hint = Some(t.server.is_some());
    let mut description = t.description.clone();
    if t.requires_approval {
        description.push_str(" (Runs only after the user approves the call.)");
    }
    Tool::new(wire_name(&t.name), description, Arc::new(schema))
        .with_title(title)
        .annotate(annotations)
}

fn tool_error(code: &str, message: &str, extra: Value) -> CallToolResult {
    let mut error = json!({"code": code, "message": message});
    if let Value::Object(m) = extra {
        error.as_object_mut().expect("object").extend(m);
    }
    let mut r = CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))]);
    r.structured_content = Some(json!({"error": error}));
    r
}

impl Server {
    /// A session's own page: as the database had it when the request came in (any gateway may
    /// have set it), else as recorded here (set by a request here since). One the database has
    /// and this gateway did not know is recorded here too, so that its notifications treat the
    /// session as no longer following the shared page.
    fn session_page(&self, caller: &Caller, session: &SessionKey) -> Option<Value> {
        let sessions = &self.state.mcp_sessions;
        let here = sessions.get(&session.0).and_then(|r| r.page);
        match (caller.session_page.clone(), here) {
            (Some(own), None) => {
                sessions.set_page(&session.0, own.clone());
                Some(own)
            }
            (Some(own), Some(_)) => Some(own),
            (None, here) => here,
        }
    }

    /// The scope of a request: the verified caller and the page in effect (None: no page yet).
    /// A page from the header is the request's; in a session it becomes the session's own page,
    /// checked by the database (`set_context`) first, so a bad page changes nothing. Without a
    /// header: the session's own page, else the user's shared page (`PUT /v1/context`).
    /// `trace_id` is the request's ([`request_span`]).
    async fn scope(
        &self,
        ext: &rmcp::model::Extensions,
        trace_id: &str,
    ) -> Result<(Caller, Option<Scope>), McpError> {
        let (caller, header_page, session) = caller_of(ext)?;
        let scope_for = |page: Value| Scope {
            token: caller.token.clone(),
            page,
            generation: None,
            trace_id: trace_id.to_string(),
        };
        let pages = &self.state.pages;
        let page = match (header_page, session) {
            (Some(p), Some(session)) => {
                let own = self.session_page(&caller, &session);
                if own.as_ref() != Some(&p) {
                    // Checked first (a bad page changes nothing), then this session's own page here
                    // (so the database's announcement finds it no longer following the shared
                    // page), then in the database for every gateway.
                    self.state
                        .core
                        .db
                        .context(&scope_for(p.clone()))
                        .await
                        .map_err(api_error)?;
                    pages.set_session_page(&caller.who, &session, p.clone());
                    self.state
                        .core
                        .db
                        .put_session_page(&scope_for(p.clone()), &session.0)
                        .await
                        .map_err(api_error)?;
                }
                Some(p)
            }
            // Outside a session (2026-07-28): the request's alone; every statement checks it.
            (Some(p), None) => Some(p),
            (None, Some(session)) => self
                .session_page(&caller, &session)
                .or_else(|| caller.shared.clone()),
            (None, None) => caller.shared.clone(),
        };
        let scope = page.map(scope_for);
        Ok((caller, scope))
    }

    /// `find_tools` of the compact list: `None` when the page is within the budget (no search
    /// is offered there). The tools found come back as their definitions, in the shape
    /// `tools/list` gives (`structuredContent.tools`, and the same JSON as text), to be called by
    /// name with `tools/call` (Gate B decides). Nothing is remembered: a later `tools/list`
    /// gives the same compact list.
    async fn find_tools(
        &self,
        scope: &Scope,
        request: &CallToolRequestParams,
    ) -> Result<Option<CallToolResult>, ApiError> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        let budget = self.state.core.config.tool_budget;
        let args = match compact::find_args(&args) {
            Ok(a) => a,
            // Refused before the search, over the budget only (within it the name is Gate B's).
            Err(m) => {
                let overview = self.state.core.db.overview(scope).await?;
                return Ok(budget
                    .exceeded_by(&overview)
                    .then(|| tool_error("INVALID_ARGUMENT", m, json!({}))));
            }
        };
        let read = self
            .state
            .core
            .db
            .search_candidates(scope, &args.query)
            .await?;
        if !budget.exceeded_by(&read.overview) {
            return Ok(None);
        }
        let found = crate::tools::find(&self.state.core, &args, read).await;
        let tools: Vec<Value> = found
            .iter()
            .map(|t| serde_json::to_value(to_tool(t)).unwrap_or(Value::Null))
            .collect();
        let result = json!({"tools": tools});
        let mut r = CallToolResult::success(vec![ContentBlock::text(result.to_string())]);
        r.structured_content = Some(result);
        Ok(Some(r))
    }

    async fn run_call(
        &self,
        caller: &Caller,
        scope: Scope,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ApiError> {
        let state = &self.state;
        // The page view's generation: kept while it has time, renewed before the database's
        // lifetime for it runs out, and once more if the database refuses it (pages.rs).
        let mut view = match state.pages.generation(&caller.who, &scope.page) {
            Some(lease) => View::leased(scope, "mcp", lease),
            None => View::fresh(&state.core.db, scope, "mcp").await?,
        };
        // The name it was listed under (`invoice__get`, `vendor__report__daily`): the database maps
        // it back to the catalog's; a catalog name (`invoice.get`) is its own.
        let retried = request
            .input_responses
            .as_ref()
            .is_some_and(|r| !r.is_empty());
        let args = Value::Object(request.arguments.unwrap_or_default());
        let name = if request.name.contains('.') {
            ToolName::Catalog(&request.name)
        } else {
            ToolName::Wire(&request.name)
        };
        let envelope = crate::tools::call(&state.core, &mut view, name, &args).await;
        if let Some(lease) = view.lease() {
            state
                .pages
                .set_generation(&caller.who, &view.scope.page, lease);
        }
        let envelope = envelope?;
        let (decision, code) = crate::chat::decision_of(&envelope);
        crate::telemetry::record_decision(&tracing::Span::current(), &decision, code.as_deref());
        let code = envelope.pointer("/error/code").and_then(Value::as_str);
        state
            .core
            .metrics
            .tool_decisions
            .with_label_values(&[code.unwrap_or("OK")])
            .inc();
        let call_id = envelope["call_id"].clone();
        if envelope["status"] == "ok" {
            let result = envelope["result"].clone();
            // An upstream tool's result is already an MCP CallToolResult (masked by the database).
            if let Ok(mut r) = serde_json::from_value::<CallToolResult>(result.clone()) {
                if result.get("content").is_some() {
                    // An upstream of an earlier revision sends no `resultType`; 2026-07-28
                    // clients need it (rmcp's own constructors set it).
                    r.result_type.get_or_insert(ResultType::COMPLETE);
                    return Ok(r.into());
                }
            }
            let mut r = CallToolResult::success(vec![ContentBlock::text(result.to_string())]);
            if result.is_object() {
                r.structured_content = Some(result);
            }
            return Ok(r.into());
        }
        let error = &envelope["error"];
        let mut extra = json!({"call_id": call_id});
        if let Some(d) = error.get("details") {
            extra["details"] = d.clone();
        }
        if let Some(r) = envelope.get("result") {
            extra["result"] = r.clone();
        }
        let refused = tool_error(
            error["code"].as_str().unwrap_or("TOOL_ERROR"),
            error["message"].as_str().unwrap_or("the call was refused"),
            extra,
        );
        // A connection the user has not made: the connect URL, as the client's revision asks.
        if let Some(hint) = crate::upstream::credentials::connect_hint(
            &state.core.credential_deps(),
            &view.scope,
            &envelope,
        )
        .await
        {
            let r = crate::upstream::credentials::mcp::missing_connection(
                context, hint, refused, retried,
            );
            return Ok(r.await);
        }
        Ok(refused.into())
    }
}

/// The server span of one MCP request (continuing `_meta.traceparent`, else the HTTP
/// `traceparent` header), and the request's trace id (the audit's `trace_id`). The session id is
/// hashed: the id itself lets its holder use the session.
fn request_span(
    method: &'static str,
    tool: Option<&str>,
    context: &RequestContext<RoleServer>,
) -> (tracing::Span, String) {
    let remote = crate::telemetry::Remote::from_meta(&context.meta.0 .0).or_else(|| {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| crate::telemetry::Remote::from_headers(&p.headers))
    });
    let tool = tool.map(|t| crate::telemetry::clip(t, 256));
    let span = crate::otel_span!(
        "mcp",
        otel.name = tool.map_or_else(|| method.to_string(), |t| format!("{method} {t}")),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        "mcp.method.name" = method,
        "jsonrpc.request.id" = crate::telemetry::clip(&context.id.to_string(), 128),
        "mcp.session.id" = context
            .extensions
            .get::<SessionKey>()
            .map(|k| crate::telemetry::session_hash(&k.0)),
        "gen_ai.operation.name" = tool.map(|_| "execute_tool"),
        "gen_ai.tool.name" = tool,
        "network.transport" = "tcp",
        "network.protocol.name" = "http",
        "ctxguard.decision" = tracing::field::Empty,
        "ctxguard.code" = tracing::field::Empty,
        "rpc.response.status_code" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    );
    let trace = crate::telemetry::begin(&span, remote.as_ref());
    (span, trace)
}

/// Record a JSON-RPC error on an MCP request's span (its code: `error.type`).
fn record_rpc<T>(span: &tracing::Span, result: &Result<T, McpError>) {
    if let Err(e) = result {
        let code = e.code.0.to_string();
        span.record("rpc.response.status_code", code.as_str());
        crate::telemetry::record_error(span, &code);
    }
}

/// The protocol revisions offered: all rmcp knows but 2025-03-26, the one whose clients may send
/// JSON-RPC batches (`jsonrpc.rs` refuses batches).
const OFFERED_VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2024_11_05,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

impl ServerHandler for Server {
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(OFFERED_VERSIONS)
    }

    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("ctxguard", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        let (span, trace) = request_span("initialize", None, &context);
        let result = self
            .initialize_traced(request, context, &trace)
            .instrument(span.clone())
            .await;
        record_rpc(&span, &result);
        result
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Ok((caller, _, Some(session))) = caller_of(&context.extensions) {
            self.state.pages.listen(
                &caller,
                Listener::Session(context.peer.clone()),
                Some(session),
            );
        }
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        // No database work before registering: a page change racing this request must not slip
        // between the subscription being acknowledged and the listener being in place.
        let (caller, _, _) = caller_of(&context.request_context().extensions)?;
        let id = self.state.pages.listen(
            &caller,
            Listener::Subscription(context.sink().clone()),
            None,
        );
        context.cancelled().await;
        self.state.pages.remove(&caller.who, &[id]);
        Ok(())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let (span, trace) = request_span("tools/list", None, &context);
        let result = self
            .list_tools_traced(request, context, &trace)
            .instrument(span.clone())
            .await;
        record_rpc(&span, &result);
        result
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let (span, trace) = request_span("tools/call", Some(&request.name), &context);
        let result = self
            .call_tool_traced(request, context, &trace)
            .instrument(span.clone())
            .await;
        record_rpc(&span, &result);
        result
    }
}

/// The MCP requests, each inside its span (`request_span`), `trace` being its trace id.
impl Server {
    async fn initialize_traced(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
        trace: &str,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        // Name the page in the instructions when the client already says where the user is.
        if let Ok((_, Some(scope))) = self.scope(&context.extensions, trace).await {
            if let Ok((_, description)) = self.state.core.db.page_tools(&scope, None, Some(0)).await
            {
                let page = scope.page["pageType"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                result.instructions = Some(format!(
                    "{INSTRUCTIONS}\n\nThe user is on the page \"{page}\": {description}"
                ));
            }
        }
        Ok(result)
    }

    async fn list_tools_traced(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
        trace: &str,
    ) -> Result<ListToolsResult, McpError> {
        // Every tool is listed at once: no cursor was ever handed out, so none is valid.
        if request.is_some_and(|r| r.cursor.is_some()) {
            return Err(McpError::invalid_params(
                "invalid cursor: this server lists every tool in one page",
                None,
            ));
        }
        let (_, scope) = self.scope(&context.extensions, trace).await?;
        let tools = match scope {
            // Fail closed: without a page there is nothing to show.
            None => Vec::new(),
            Some(scope) => {
                let (specs, _, overview) = self
                    .state
                    .core
                    .db
                    .page_listing(&scope)
                    .await
                    .map_err(api_error)?;
                let specs = crate::tools::reachable(&self.state.core, specs).await;
                // Over the budget: the page's own tools and find_tools (catalog/compact.rs), decided by
                // the token and page alone (nothing of a session or connection), so a 2026-07-28
                // client gets the same list for the same token and page on every request.
                compact::offer(self.state.core.config.tool_budget, specs, &overview)
                    .tools
                    .iter()
                    .map(to_tool)
                    .collect()
            }
        };
        // Never cacheable across page changes or users.
        Ok(ListToolsResult::with_all_items(tools)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    async fn call_tool_traced(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        trace: &str,
    ) -> Result<CallToolResponse, McpError> {
        let (caller, scope) = self.scope(&context.extensions, trace).await?;
        let Some(scope) = scope else {
            tracing::Span::current().record("ctxguard.code", "CONTEXT_MISSING");
            return Ok(tool_error(
                "CONTEXT_MISSING",
                "no page context: send the X-Ctxguard-Page header or PUT /v1/context first",
                json!({}),
            )
            .into());
        };
        if request.name == compact::FIND_TOOLS {
            match self.find_tools(&scope, &request).await {
                Ok(Some(r)) => return Ok(r.into()),
                // Within the budget there is no search: the name goes to Gate B as any other.
                Ok(None) => {}
                Err(ApiError::Unauthorized(m)) | Err(ApiError::Unprocessable(m)) => {
                    return Ok(tool_error("CONTEXT_INVALID", &m, json!({})).into())
                }
                Err(e) => return Err(api_error(e)),
            }
        }
        match self.run_call(&caller, scope, request, &context).await {
            Ok(r) => Ok(r),
            Err(ApiError::Unauthorized(m)) | Err(ApiError::Unprocessable(m)) => {
                Ok(tool_error("CONTEXT_INVALID", &m, json!({})).into())
            }
            Err(e) => Err(api_error(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(PAGE_HEADER, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn page_header_accepts_json_and_base64url_json() {
        let page =
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "acme_inv3"}});
        let raw = page.to_string();
        assert_eq!(
            parse_page_header(&headers(&raw)).unwrap(),
            Some(page.clone())
        );
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw.as_bytes());
        assert_eq!(
            parse_page_header(&headers(&b64)).unwrap(),
            Some(page.clone())
        );
        assert_eq!(
            parse_page_header(&headers(&format!("{b64}=="))).unwrap(),
            Some(page)
        );
        assert_eq!(parse_page_header(&HeaderMap::new()).unwrap(), None);
    }

    fn spec(name: &str, read_only: bool, danger: &str, server: Option<&str>) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: "d".into(),
            input_schema: json!({"type": "object"}),
            read_only,
            danger: danger.into(),
            requires_approval: false,
            server: server.map(Into::into),
            title: None,
            namespace: None,
            deferred: false,
        }
    }

    #[test]
    fn titles_and_hints_come_from_the_catalog_and_the_policy() {
        assert_eq!(readable_title("invoice.mark_paid"), "Invoice: mark paid");
        assert_eq!(readable_title("read_doc_metadata"), "Read doc metadata");
        assert_eq!(readable_title("scans.read-scan"), "Scans: read scan");
        let get = to_tool(&spec("invoice.get", true, "safe", None));
        let a = get.annotations.clone().unwrap();
        assert_eq!(get.name, "invoice__get");
        assert_eq!(get.title.as_deref(), Some("Invoice: get"));
        assert_eq!(
            (
                a.read_only_hint,
                a.destructive_hint,
                a.idempotent_hint,
                a.open_world_hint
            ),
            (Some(true), Some(false), Some(true), Some(false))
        );
        let write = to_tool(&spec("invoice.mark_paid", false, "moderate", None));
        let a = write.annotations.unwrap();
        assert_eq!((a.destructive_hint, a.idempotent_hint), (None, None));
        let drop = to_tool(&spec("x.purge", false, "destructive", Some("up")));
        let a = drop.annotations.unwrap();
        assert_eq!(
            (a.destructive_hint, a.open_world_hint),
            (Some(true), Some(true))
        );
        let mut titled = spec("vendor.report__daily", true, "safe", None);
        titled.title = Some("Daily vendor report".into());
        let t = to_tool(&titled);
        assert_eq!(
            (t.name.as_ref(), t.title.as_deref()),
            ("vendor__report__daily", Some("Daily vendor report"))
        );
    }

    #[test]
    fn page_header_refuses_non_objects_and_garbage_without_echoing_it() {
        for bad in ["[1,2]", "\"x\"", "{not json", "%%%", "bnVsbA"] {
            let err = parse_page_header(&headers(bad)).unwrap_err();
            assert!(!err.contains(bad), "{err}");
        }
    }
}
