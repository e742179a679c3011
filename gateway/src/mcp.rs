//! ctxguard as an MCP server (Streamable HTTP at `/mcp`, via `rmcp`).
//!
//! - **Auth**: every request carries `Authorization: Bearer <context token>`; the database verifies
//!   it (`ctxguard.verify_token`) before rmcp sees the request. A missing or bad token is a 401 with
//!   `WWW-Authenticate` pointing at the protected-resource metadata, as the MCP authorization spec
//!   expects. The token is never passed to upstream servers.
//! - **Page context**: the `X-Ctxguard-Page` header (a JSON page context, or base64url of one) on
//!   any request sets the caller's current page; `PUT /v1/context` sets it out of band (e.g. from
//!   the app the user is looking at). The page is kept per (tenant, user) in the database
//!   (`ctxguard.user_pages`, written by `put_user_page` in the transaction whose `set_context`
//!   validated it), so every MCP session of that user follows the screen, through any gateway.
//!   When it changes, each of the user's sessions (and `subscriptions/listen` streams) gets
//!   `notifications/tools/list_changed`: on this gateway at once, on the others through
//!   `NOTIFY ctxguard_pages` (pages.rs `follow`).
//! - **Sessions** live in the database too (`ctxguard.mcp_sessions`: a hash of the id, the tenant
//!   and user, the initialize parameters, the expiry): a session opened through one gateway is
//!   restored by rmcp on any other ([`DbSessionStore`]), a session that is not the caller's or no
//!   longer exists is 404 on every gateway, and a DELETE through one ends it everywhere.
//! - **tools/list** is Gate A for the current page; **tools/call** is Gate B (denials come back as
//!   tool errors carrying the ctxguard code). Without a page nothing is listed and nothing runs.
//!   Each page view gets its own generation, so byte and document budgets apply per page view.

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
    PaginatedRequestParams, ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
    ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{
    SessionId, SessionManager, SessionState, SessionStore, SessionStoreError,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::db::Scope;
use crate::error::ApiError;
use crate::llm::{wire_name, ToolSpec};
use crate::pages::{Lease, View};
use crate::{bearer, AppState};

/// The header carrying the page context on MCP requests.
pub const PAGE_HEADER: &str = "x-ctxguard-page";
/// The Streamable HTTP session header.
const SESSION_HEADER: &str = "mcp-session-id";

/// The verified caller of an MCP request (inserted by [`authenticate`]), with the user's current
/// page as the database had it when the request came in.
#[derive(Clone, Debug)]
pub struct Caller {
    token: String,
    who: Who,
    page: Option<Value>,
}

/// The opaque key of a user (tenant and user) the database announces page changes under.
type Who = String;

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

#[derive(Default)]
struct Entry {
    page: Option<Value>,
    /// The page view's generation (renewed before the database's lifetime for it runs out).
    generation: Option<Lease>,
    listeners: Vec<(u64, Listener)>,
}

/// The current page of each user, and who to tell when it changes.
#[derive(Default)]
pub struct PageHub {
    entries: Mutex<HashMap<Who, Entry>>,
    next_id: AtomicU64,
    /// 0 off, 1 lost, 2 listening (see [`PageHub::following`]).
    following: AtomicU64,
    /// Signalled when the first listener registers: the listening connection starts then (a
    /// gateway without MCP sessions holds no extra connection).
    wanted: tokio::sync::Notify,
}

impl PageHub {
    /// Record `page` (if given) as `who`'s current page; returns the page now in effect.
    fn observe(self: &Arc<Self>, who: &Who, page: Option<Value>) -> Option<Value> {
        let mut entries = self.entries.lock().expect("page hub lock");
        let entry = entries.entry(who.clone()).or_default();
        if let Some(page) = page {
            if entry.page.as_ref() != Some(&page) {
                entry.page = Some(page);
                entry.generation = None;
                let listeners = entry.listeners.clone();
                if !listeners.is_empty() {
                    tokio::spawn(self.clone().notify(who.clone(), listeners));
                }
            }
        }
        entry.page.clone()
    }

    /// Set `who`'s page out of band (`PUT /v1/context`).
    pub fn set(self: &Arc<Self>, who: Who, page: Value) {
        self.observe(&who, Some(page));
    }

    /// Another gateway changed `who`'s page (a notification): tell `who`'s listeners here.
    pub fn changed(self: &Arc<Self>, who: &str) {
        let mut entries = self.entries.lock().expect("page hub lock");
        if let Some(entry) = entries.get_mut(who) {
            entry.generation = None;
            let listeners = entry.listeners.clone();
            if !listeners.is_empty() {
                tokio::spawn(self.clone().notify(who.to_string(), listeners));
            }
        }
    }

    /// Notifications may have been missed (the listening connection was lost): every listener
    /// here is told to re-list.
    pub fn resync(self: &Arc<Self>) {
        let mut entries = self.entries.lock().expect("page hub lock");
        for (who, entry) in entries.iter_mut() {
            entry.generation = None;
            if !entry.listeners.is_empty() {
                tokio::spawn(self.clone().notify(who.clone(), entry.listeners.clone()));
            }
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
            if !ok {
                gone.push(id);
            }
        }
        if !gone.is_empty() {
            self.remove(&who, &gone);
        }
    }

    /// Add a listener. `seen` is the page the listener's client last listed tools for: if the
    /// user's page is another one by now (another request changed it while this listener was
    /// being set up), the listener is told at once. With no page recorded yet, nothing was listed. Under the same lock as `observe`, so a change is
    /// reported exactly once, by whichever of the two runs second.
    fn listen(self: &Arc<Self>, who: &Who, l: Listener, seen: Option<&Value>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.want();
        let mut entries = self.entries.lock().expect("page hub lock");
        let entry = entries.entry(who.clone()).or_default();
        entry.listeners.retain(|(_, l)| match l {
            Listener::Session(p) => !p.is_transport_closed(),
            Listener::Subscription(_) => true,
        });
        if entry.page.is_some() && seen.is_some() && entry.page.as_ref() != seen {
            tokio::spawn(self.clone().notify(who.clone(), vec![(id, l.clone())]));
        }
        entry.listeners.push((id, l));
        id
    }

    fn remove(&self, who: &Who, ids: &[u64]) {
        if let Some(e) = self.entries.lock().expect("page hub lock").get_mut(who) {
            e.listeners.retain(|(id, _)| !ids.contains(id));
        }
    }

    /// The generation of `who`'s view of `page`, unless it is time to renew it.
    fn generation(&self, who: &Who, page: &Value) -> Option<Lease> {
        let entries = self.entries.lock().expect("page hub lock");
        let e = entries.get(who)?;
        e.generation
            .filter(|l| e.page.as_ref() == Some(page) && !l.due())
    }

    fn set_generation(&self, who: &Who, page: &Value, lease: Lease) {
        if let Some(e) = self.entries.lock().expect("page hub lock").get_mut(who) {
            if e.page.as_ref() == Some(page) {
                e.generation = Some(lease);
            }
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

/// 401 with a bearer challenge (RFC 6750: `error="invalid_token"` only when a token was sent).
fn unauthorized(headers: &HeaderMap, message: &str, token_sent: bool) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let error = if token_sent {
        ", error=\"invalid_token\""
    } else {
        ""
    };
    let challenge = format!(
        "Bearer realm=\"ctxguard\"{error}, resource_metadata=\"http://{host}/.well-known/oauth-protected-resource/mcp\""
    );
    let mut resp = ApiError::Unauthorized(message.into()).into_response();
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    resp
}

/// Middleware on `/mcp`: verify the bearer token in the database, then hand the caller to rmcp.
pub async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let headers = req.headers().clone();
    let token = match bearer(&headers) {
        Ok(t) => t,
        Err(_) => return unauthorized(&headers, "a bearer token is required", false),
    };
    let session = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let identity = match state.db.mcp_identity(&token, session.as_deref()).await {
        Ok(v) => v,
        Err(ApiError::Unauthorized(m)) => return unauthorized(&headers, &m, true),
        Err(e) => return e.into_response(),
    };
    if let Some(id) = &session {
        if identity["session"].is_null() {
            // Not the caller's, expired, or ended through any gateway: gone here too.
            let _ = state
                .mcp_sessions
                .close_session(&SessionId::from(id.as_str()))
                .await;
            return ApiError::NotFound("no such MCP session".into()).into_response();
        }
    }
    let user = (
        identity["tenantId"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        identity["userId"].as_str().unwrap_or_default().to_string(),
    );
    let caller = Caller {
        token,
        who: identity["key"].as_str().unwrap_or_default().to_string(),
        page: Some(identity["page"].clone()).filter(Value::is_object),
    };
    req.extensions_mut().insert(caller.clone());
    // An event stream (a GET stream, a streamed answer, a subscription) counts against the user's.
    let response = MCP_CALLER.scope(caller, next.run(req)).await;
    state.limits.hold_stream(&user, response)
}

/// `GET /.well-known/oauth-protected-resource[/mcp]` (RFC 9728): how to authenticate to `/mcp`.
pub async fn protected_resource(headers: HeaderMap) -> Json<Value> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    Json(json!({
        "resource": format!("http://{host}/mcp"),
        "bearer_methods_supported": ["header"],
        "authorization_servers": [],
        "resource_documentation": "Context tokens (HS256 or EdDSA JWTs with sub, tenant_id, roles) are minted by your application; see the ctxguard README.",
    }))
}

/// `PUT /v1/context`: set the caller's current page for their MCP sessions (body: a page context).
pub async fn put_context(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    crate::ApiJson(page): crate::ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    let token = bearer(&headers)?;
    if !page.is_object() {
        return Err(ApiError::Unprocessable(
            "the page context must be an object".into(),
        ));
    }
    // Validate the page (and the token) in the database before anyone is notified.
    let scope = Scope {
        token,
        page: page.clone(),
        generation: None,
        trace_id: Uuid::new_v4().to_string(),
    };
    let (context, put) = state.db.put_user_page(&scope).await?;
    let who = put["key"].as_str().unwrap_or_default().to_string();
    state.pages.set(who, page);
    Ok(Json(
        json!({"status": "ok", "pageType": context["pageType"]}),
    ))
}

/// The rmcp service at `/mcp`.
pub fn service(state: Arc<AppState>) -> StreamableHttpService<Server, LocalSessionManager> {
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .with_allowed_hosts(state.config.mcp_allowed_hosts());
    config.session_store = Some(Arc::new(DbSessionStore {
        db: state.db.clone(),
        ttl_secs: state.config.mcp_session_ttl_secs,
    }));
    let sessions = state.mcp_sessions.clone();
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

fn store_error(e: ApiError) -> SessionStoreError {
    Box::new(std::io::Error::other(e.code()))
}

fn current_caller() -> Result<Caller, SessionStoreError> {
    MCP_CALLER
        .try_with(Clone::clone)
        .map_err(|_| Box::new(std::io::Error::other("no MCP caller")) as SessionStoreError)
}

#[async_trait::async_trait]
impl SessionStore for DbSessionStore {
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
    state: Arc<AppState>,
}

const INSTRUCTIONS: &str = "ctxguard tools follow the page the user is on: the list changes with \
the page (you will get notifications/tools/list_changed), ids of the entity on the page are filled \
in for you, and every call is re-checked, masked, budgeted and audited by the database. A refused \
call is a tool error carrying a stable code (e.g. TOOL_NOT_VISIBLE, ENTITY_MISMATCH, \
APPROVAL_REQUIRED, RATE_LIMIT_EXCEEDED, RESULT_TOO_LARGE).";

fn caller_of(ext: &rmcp::model::Extensions) -> Result<(Caller, Option<Value>), McpError> {
    let parts = ext
        .get::<axum::http::request::Parts>()
        .ok_or_else(|| McpError::internal_error("no HTTP request", None))?;
    let caller = parts
        .extensions
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| McpError::invalid_request("not authenticated", None))?;
    let page = parse_page_header(&parts.headers).map_err(|m| McpError::invalid_params(m, None))?;
    Ok((caller, page))
}

fn api_error(e: ApiError) -> McpError {
    match e {
        ApiError::Unauthorized(m) | ApiError::Unprocessable(m) | ApiError::BadRequest(m) => {
            McpError::invalid_params(m, None)
        }
        other => McpError::internal_error(other.to_string(), None),
    }
}

fn to_tool(t: &ToolSpec) -> Tool {
    let schema: Map<String, Value> = match &t.input_schema {
        Value::Object(o) => o.clone(),
        _ => Map::new(),
    };
    let mut annotations = ToolAnnotations::new();
    annotations.title = Some(t.name.clone());
    annotations.read_only_hint = Some(t.read_only);
    annotations.destructive_hint = Some(t.danger == "destructive");
    let mut description = t.description.clone();
    if t.requires_approval {
        description.push_str(" (Runs only after the user approves the call.)");
    }
    Tool::new(wire_name(&t.name), description, Arc::new(schema)).annotate(annotations)
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
    /// The scope of a request: the verified caller and the page in effect (None: no page yet).
    /// A new page from the header is checked by the database (`set_context`) before it replaces
    /// the user's page and the user's sessions are told, so a bad page changes nothing.
    async fn scope(
        &self,
        ext: &rmcp::model::Extensions,
    ) -> Result<(Caller, Option<Scope>), McpError> {
        let (caller, header_page) = caller_of(ext)?;
        let scope_for = |page: Value| Scope {
            token: caller.token.clone(),
            page,
            generation: None,
            trace_id: Uuid::new_v4().to_string(),
        };
        let pages = &self.state.pages;
        let page = match header_page {
            Some(p) if caller.page.as_ref() != Some(&p) => {
                self.state
                    .db
                    .put_user_page(&scope_for(p.clone()))
                    .await
                    .map_err(api_error)?;
                pages.observe(&caller.who, Some(p.clone()));
                Some(p)
            }
            // The database's page (any gateway may have set it): listeners here that saw another
            // one are told.
            _ => {
                pages.observe(&caller.who, caller.page.clone());
                caller.page.clone()
            }
        };
        let scope = page.map(scope_for);
        Ok((caller, scope))
    }

    async fn run_call(
        &self,
        caller: &Caller,
        scope: Scope,
        request: CallToolRequestParams,
    ) -> Result<CallToolResult, ApiError> {
        let state = &self.state;
        // The page view's generation: kept while it has time, renewed before the database's
        // lifetime for it runs out, and once more if the database refuses it (pages.rs).
        let mut view = match state.pages.generation(&caller.who, &scope.page) {
            Some(lease) => View::leased(scope, "mcp", lease),
            None => View::fresh(&state.db, scope, "mcp").await?,
        };
        // Accept both the wire name (`invoice__get`) and the catalog name (`invoice.get`).
        let name = request.name.replace("__", ".");
        let args = Value::Object(request.arguments.unwrap_or_default());
        let envelope = crate::tools::call(state, &mut view, &name, &args).await;
        if let Some(lease) = view.lease() {
            state
                .pages
                .set_generation(&caller.who, &view.scope.page, lease);
        }
        let envelope = envelope?;
        let code = envelope.pointer("/error/code").and_then(Value::as_str);
        state
            .metrics
            .tool_decisions
            .with_label_values(&[code.unwrap_or("OK")])
            .inc();
        let call_id = envelope["call_id"].clone();
        if envelope["status"] == "ok" {
            let result = envelope["result"].clone();
            // An upstream tool's result is already an MCP CallToolResult (masked by the database).
            if let Ok(r) = serde_json::from_value::<CallToolResult>(result.clone()) {
                if result.get("content").is_some() {
                    return Ok(r);
                }
            }
            let mut r = CallToolResult::success(vec![ContentBlock::text(result.to_string())]);
            if result.is_object() {
                r.structured_content = Some(result);
            }
            return Ok(r);
        }
        let error = &envelope["error"];
        let mut extra = json!({"call_id": call_id});
        if let Some(d) = error.get("details") {
            extra["details"] = d.clone();
        }
        if let Some(r) = envelope.get("result") {
            extra["result"] = r.clone();
        }
        Ok(tool_error(
            error["code"].as_str().unwrap_or("TOOL_ERROR"),
            error["message"].as_str().unwrap_or("the call was refused"),
            extra,
        ))
    }
}

impl ServerHandler for Server {
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
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        // Name the page in the instructions when the client already says where the user is.
        if let Ok((_, Some(scope))) = self.scope(&context.extensions).await {
            if let Ok((_, description)) = self.state.db.page_tools(&scope, None, Some(0)).await {
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

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if let Ok((caller, _)) = caller_of(&context.extensions) {
            self.state
                .pages
                .listen(&caller.who, Listener::Session(context.peer.clone()), None);
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
        let (caller, seen) = caller_of(&context.request_context().extensions)?;
        let id = self.state.pages.listen(
            &caller.who,
            Listener::Subscription(context.sink().clone()),
            seen.as_ref(),
        );
        context.cancelled().await;
        self.state.pages.remove(&caller.who, &[id]);
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let (_, scope) = self.scope(&context.extensions).await?;
        let tools = match scope {
            // Fail closed: without a page there is nothing to show.
            None => Vec::new(),
            Some(scope) => {
                let (specs, _) = self
                    .state
                    .db
                    .page_tools(&scope, None, None)
                    .await
                    .map_err(api_error)?;
                crate::tools::reachable(&self.state, specs)
                    .await
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

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let (caller, scope) = self.scope(&context.extensions).await?;
        let Some(scope) = scope else {
            return Ok(tool_error(
                "CONTEXT_MISSING",
                "no page context: send the X-Ctxguard-Page header or PUT /v1/context first",
                json!({}),
            )
            .into());
        };
        match self.run_call(&caller, scope, request).await {
            Ok(r) => Ok(r.into()),
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

    #[test]
    fn page_header_refuses_non_objects_and_garbage_without_echoing_it() {
        for bad in ["[1,2]", "\"x\"", "{not json", "%%%", "bnVsbA"] {
            let err = parse_page_header(&headers(bad)).unwrap_err();
            assert!(!err.contains(bad), "{err}");
        }
    }
}
