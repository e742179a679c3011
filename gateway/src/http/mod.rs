//! **Room `http/`** (top): where a request enters. Owns the router and the `/v1` handlers
//! (this file), [`AppState`] and its construction from the config, `/mcp`'s host and origin guard
//! (`origin.rs`) and body cap, the demo routes (`demo.rs`), the upstream connection routes
//! (`connections.rs`), the OAuth resource metadata routes, and [`serve`]. It may use every room
//! below; no room may use it (`mcp` gets [`mcp::McpState`] from [`AppState::mcp_state`]).
//!
//! The gateway authenticates the caller (by handing the bearer token to the database), sets the
//! context for each short transaction, runs the LLM loop and reports. Every decision stays in
//! PostgreSQL. `app(state)` builds the router; `main.rs` only wires config, tracing, pool and serve.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, MatchedPath, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use tracing::Instrument;

pub mod connections;
pub mod demo;
pub mod origin;

use crate::catalog::{compact, disclosure};
use crate::chat::legacy;
use crate::config::{oauth, public_url};
use crate::upstream::credentials;
use crate::{chat, db, limits, llm, mcp, pages, secrets, telemetry, tools, upstream};

use crate::auth::bearer;
use crate::chat::{ChatRequest, UserClaim};
use crate::config::{Config, Provider};
use crate::db::{Db, Scope};
use crate::error::ApiError;
use crate::llm::ChatModel;
use crate::metrics::Metrics;
use crate::services::Services;

/// The default of `CTXGUARD_MAX_BODY_BYTES`, the largest request body on every route (larger: 413
/// before any database work).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The `route` label of requests no route matched (random paths must not grow `/metrics`).
pub const UNMATCHED_ROUTE: &str = "unmatched";
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

pub struct AppState {
    /// What chat, tool calls and MCP share: database, model, settings, metrics, upstreams,
    /// credentials, tool search, public URL (`services.rs`).
    pub core: Arc<Services>,
    /// Each user's shared page and page views, and who to tell when a page changes (MCP).
    pub pages: Arc<mcp::PageHub>,
    /// MCP session records: owner, own page, use (`mcp/sessions.rs`).
    pub mcp_sessions: Arc<mcp::sessions::SessionStore>,
    pub mcp_session_metrics: mcp::sessions::SessionMetrics,
    /// Demo mode's token minting and screens' pool (`None` unless `CTXGUARD_DEMO=true`).
    pub demo: Option<demo::Demo>,
    /// HTTP timeouts, the connection cap and each user's open event streams.
    pub limits: Arc<limits::Limits>,
    /// Authorization servers and scopes advertised to MCP clients (`config/oauth.rs`).
    pub oauth: oauth::OAuth,
    /// Hosts and origins `/mcp` accepts.
    pub mcp_guard: origin::Guard,
}

impl AppState {
    /// Build the state from config: pools (lazy; no connection is made here) and provider.
    pub fn from_config(config: Config) -> Result<AppState, String> {
        let db = Db::connect(
            &config.database_url,
            config.pool_size,
            config.db_timeout(),
            config.db_statements,
        )?
        .with_turn_commit(config.turn_commit)
        .with_limits(config.db_limits());
        // Discovery records a server's tools once per (re)connection: two connections are plenty.
        let discovery = config
            .discovery_url()
            .map(|url| {
                Db::connect(url, 2, config.db_timeout(), config.db_statements)
                    .map(|db| db.with_limits(config.db_limits()))
            })
            .transpose()?;
        let model: Arc<dyn ChatModel> = match config.provider {
            Provider::Offline => Arc::new(llm::offline::Offline),
            Provider::Openai => Arc::new(
                llm::openai::OpenAi::new(
                    config.llm_base_url.as_deref().unwrap_or_default(),
                    config.llm_api_key.clone(),
                    &config.model,
                    config.llm_timeout(),
                )
                .with_api(config.openai_api),
            ),
            Provider::Anthropic => Arc::new(llm::anthropic::Anthropic::new(
                config.llm_base_url.as_deref().unwrap_or_default(),
                config.llm_api_key.clone(),
                &config.model,
                config.llm_timeout(),
            )),
        };
        let demo = demo::Demo::from_config(&config)?;
        let stdio_user = match config.mcp_stdio_user.as_deref().filter(|u| !u.is_empty()) {
            Some(spec) => secrets::StdioUser::resolve(spec)?,
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        let limits = Arc::new(limits::Limits::new(&config, &metrics));
        let oauth = oauth::OAuth::from_config(&config)?;
        let public = public_url::PublicUrl::new(
            config.public_url.as_deref(),
            config.listen,
            config.mcp_documentation_url.as_deref(),
        )?;
        let mcp_guard = origin::Guard::new(&config, &public);
        let mcp_sessions = Arc::new(mcp::sessions::SessionStore::default());
        let mcp_session_metrics = mcp::sessions::SessionMetrics::new(&metrics);
        let pages = Arc::new(mcp::PageHub::new(
            mcp_sessions.clone(),
            db.clone(),
            &metrics,
        ));
        let tool_search = disclosure::semantic::from_config(&config);
        let keys = match config
            .credential_key_file
            .as_deref()
            .filter(|f| !f.is_empty())
        {
            Some(path) => crate::seal::KeyRing::from_file(std::path::Path::new(path))?,
            None => crate::seal::KeyRing::empty(),
        };
        let credentials = Arc::new(credentials::Credentials::new(
            keys,
            config.mcp_call_timeout(),
        ));
        let config = Arc::new(config);
        let upstreams = Arc::new(
            upstream::Upstreams::new(
                config.mcp_connect_timeout(),
                config.mcp_call_timeout(),
                discovery,
            )
            .with_stdio_user(stdio_user),
        );
        Ok(AppState {
            core: Arc::new(Services {
                db,
                model,
                config,
                metrics,
                upstreams,
                public,
                tool_search,
                credentials,
            }),
            oauth,
            pages,
            mcp_sessions,
            mcp_session_metrics,
            mcp_guard,
            demo,
            limits,
        })
    }

    /// What the MCP server needs of this state (`mcp::McpState`): the shared services, the page
    /// hub and sessions, the stream limits, the OAuth metadata and the hosts `/mcp` answers to.
    pub fn mcp_state(&self) -> mcp::McpState {
        mcp::McpState {
            core: self.core.clone(),
            pages: self.pages.clone(),
            mcp_sessions: self.mcp_sessions.clone(),
            mcp_session_metrics: self.mcp_session_metrics.clone(),
            limits: self.limits.clone(),
            oauth: self.oauth.clone(),
            hosts: self.mcp_guard.hosts().to_vec(),
        }
    }
}

/// JSON body extractor whose rejections use the API's error format (400 / 413 / 415).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::BytesRejection(r))
                if r.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(ApiError::TooLarge)
            }
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::BadRequest(
                "expected Content-Type: application/json".into(),
            )),
            Err(e) => Err(ApiError::BadRequest(format!(
                "invalid JSON body: {}",
                e.body_text().chars().take(200).collect::<String>()
            ))),
        }
    }
}

pub(crate) fn trace_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| chat::is_valid_id(v))
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string)
}

pub(crate) fn page_from(v: Option<Value>) -> Result<Value, ApiError> {
    match v {
        Some(p @ Value::Object(_)) => Ok(p),
        Some(_) => Err(ApiError::Unprocessable(
            "pageContext must be an object".into(),
        )),
        None => Err(ApiError::Unprocessable(
            "pageContext is required (or a [CONTEXT] message)".into(),
        )),
    }
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let want = env!("CARGO_PKG_VERSION");
    let (status, body) = match state.core.db.extension_version().await {
        Ok(Some(v)) if v == want => (
            StatusCode::OK,
            json!({"status": "ready", "extension": v, "statements": state.core.db.statements(),
                   "pageNotifications": state.pages.following()}),
        ),
        Ok(Some(v)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": {"code": "EXTENSION_VERSION", "message": format!("ctxguard extension is {v}, the gateway expects {want}")}}),
        ),
        Ok(None) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": {"code": "EXTENSION_MISSING", "message": "ctxguard is not installed"}}),
        ),
        Err(e) => (e.status(), e.body()),
    };
    (status, Json(body)).into_response()
}

async fn metrics_endpoint(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let (size, available) = state.core.db.status();
    state.core.metrics.pool_size.set(size as i64);
    state.core.metrics.pool_available.set(available as i64);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.core.metrics.render(),
    )
}

/// Whether the caller named its request (a valid `x-request-id` of its own), set before
/// [`SetRequestIdLayer`] makes one up.
#[derive(Debug, Clone, Copy)]
struct CallerNamedRequest(bool);

async fn mark_caller_request_id(mut req: Request, next: Next) -> Response {
    let named = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .is_some_and(chat::is_valid_id);
    req.extensions_mut().insert(CallerNamedRequest(named));
    next.run(req).await
}

/// `POST /v1/chat`: the HTTP server span (continuing an incoming `traceparent`) around the turn.
/// The turn's audit `trace_id` is the trace's id, unless the caller named the request with its own
/// `x-request-id` and sent no `traceparent` (then that id, as before, also on the span as
/// `ctxguard.trace_id`); when the caller named none, the response's `x-request-id` is the trace id.
async fn chat_endpoint(
    State(state): State<Arc<AppState>>,
    named: Option<axum::Extension<CallerNamedRequest>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Response {
    let remote = telemetry::Remote::from_headers(&headers);
    let span = crate::otel_span!(
        "POST /v1/chat",
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        "http.request.method" = "POST",
        "http.route" = "/v1/chat",
        "http.response.status_code" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        "ctxguard.trace_id" = tracing::field::Empty,
    );
    let traced = telemetry::begin(&span, remote.as_ref());
    let named = named.is_some_and(|n| n.0 .0);
    let trace = if named && remote.is_none() {
        trace_id(&headers)
    } else {
        traced
    };
    span.record("ctxguard.trace_id", trace.as_str());
    // Not entered while the turn runs (each poll of an entered span's future costs every layer an
    // enter and an exit): the turn's span names it as its parent.
    let mut resp = match chat_turn(state, headers, req, trace.clone(), &span).await {
        Ok(r) => r,
        Err(e) => {
            telemetry::record_error(&span, e.code());
            e.into_response()
        }
    };
    span.record(
        "http.response.status_code",
        i64::from(resp.status().as_u16()),
    );
    if !named {
        if let Ok(v) = header::HeaderValue::from_str(&trace) {
            resp.headers_mut().insert(REQUEST_ID, v);
        }
    }
    resp
}

/// The span of one turn (GenAI `invoke_agent`), a child of the request's.
fn turn_span(state: &AppState, request: &tracing::Span) -> tracing::Span {
    crate::otel_span!(
        parent: request,
        "invoke_agent",
        otel.name = "invoke_agent ctxguard",
        otel.status_code = tracing::field::Empty,
        "gen_ai.operation.name" = "invoke_agent",
        "gen_ai.agent.name" = "ctxguard",
        "gen_ai.provider.name" = telemetry::provider_name(state.core.model.provider()),
        "gen_ai.request.model" = state.core.config.model.as_str(),
        "gen_ai.conversation.id" = tracing::field::Empty,
        "ctxguard.steps" = tracing::field::Empty,
        "ctxguard.tool_calls" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    )
}

/// Record a finished turn on its span.
fn record_turn(span: &tracing::Span, turn: &Result<chat::ChatResponse, ApiError>) {
    match turn {
        Ok(r) => {
            span.record("gen_ai.conversation.id", r.conversation_id.as_str());
            // Integers as i64: tracing-opentelemetry records other integer types as text.
            span.record("ctxguard.steps", i64::from(r.steps));
            span.record("ctxguard.tool_calls", telemetry::count(r.tool_calls.len()));
        }
        Err(e) => telemetry::record_error(span, e.code()),
    }
}

async fn chat_turn(
    state: Arc<AppState>,
    headers: HeaderMap,
    req: ChatRequest,
    trace: String,
    request_span: &tracing::Span,
) -> Result<Response, ApiError> {
    let token = bearer(&headers)?;
    chat::validate(&req)?;
    let (page, question) = match legacy::parse(&req.message).map_err(ApiError::BadRequest)? {
        Some((page, q)) if req.page_context.is_none() => (
            page,
            if q.is_empty() {
                "What is on this page?".to_string()
            } else {
                q
            },
        ),
        Some(_) => {
            return Err(ApiError::BadRequest(
                "send either pageContext or a [CONTEXT] message, not both".into(),
            ))
        }
        None => (page_from(req.page_context.clone())?, req.message.clone()),
    };
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"));
    let span = turn_span(&state, request_span);
    if !wants_stream {
        let resp = chat::run_turn(state.core.clone(), token, trace, req, page, question, None)
            .instrument(span.clone())
            .await;
        record_turn(&span, &resp);
        return Ok(Json(resp?).into_response());
    }
    // A stream counts against its user's open event streams (the database says who that is).
    let identity = state.core.db.verify_token(&token).await?;
    let who = (
        identity["tenantId"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        identity["userId"].as_str().unwrap_or_default().to_string(),
    );
    let Some(slot) = state.limits.reserve_stream(&who) else {
        return Ok(limits::too_many_streams());
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<chat::Event>(32);
    let (etx, erx) = tokio::sync::oneshot::channel::<ApiError>();
    tokio::spawn(async move {
        let turn = chat::run_turn(
            state.core.clone(),
            token,
            trace,
            req,
            page,
            question,
            Some(tx),
        )
        .instrument(span.clone())
        .await;
        record_turn(&span, &turn);
        if let Err(e) = turn {
            let _ = etx.send(e);
        }
    });
    let events = futures::stream::unfold((rx, Some(erx)), |(mut rx, erx)| async move {
        match rx.recv().await {
            Some(e) => Some((
                Ok::<_, std::convert::Infallible>(
                    SseEvent::default()
                        .event(e.name())
                        .data(e.data().to_string()),
                ),
                (rx, erx),
            )),
            None => {
                let err = erx?.await.ok()?;
                Some((
                    Ok(SseEvent::default()
                        .event("error")
                        .data(err.body().to_string())),
                    (rx, None),
                ))
            }
        }
    });
    Ok(slot.hold(
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response(),
    ))
}

/// A body that names only a page: `{"pageContext": {...}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct PageRequest {
    pub page_context: Value,
}

impl PageRequest {
    /// The page of a body that names more than its page.
    fn of(page_context: Value) -> PageRequest {
        PageRequest { page_context }
    }

    /// The scope of a request that names only a page: bearer token, page, request id.
    pub(crate) fn scope(self, headers: &HeaderMap) -> Result<Scope, ApiError> {
        Ok(Scope {
            token: bearer(headers)?,
            page: page_from(Some(self.page_context))?,
            generation: None,
            trace_id: trace_id(headers),
        })
    }
}

/// `POST /v1/tools` body: the page, and optionally the message the model's list is ranked by.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ToolsRequest {
    page_context: Value,
    #[serde(default)]
    message: Option<String>,
}

/// `POST /v1/tools`: what the assistant can do on a page, and why not the rest: the validated
/// context, the page description, and every visible tool and at most `CTXGUARD_EXPLAIN_MAX_HIDDEN`
/// hidden ones (`hiddenMore`: whether there are others) with Gate A's verdict and reason, and
/// whether it is in the model's list (the top `CTXGUARD_MAX_TOOLS`, ranked by `message`), and if
/// not, why (`leftOut`).
async fn tools_endpoint(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ToolsRequest>,
) -> Result<Json<Value>, ApiError> {
    if req
        .message
        .as_ref()
        .is_some_and(|m| m.chars().count() > chat::MAX_MESSAGE_CHARS)
    {
        return Err(ApiError::Unprocessable(format!(
            "message exceeds {} characters",
            chat::MAX_MESSAGE_CHARS
        )));
    }
    let scope = PageRequest::of(req.page_context).scope(&headers)?;
    let max_hidden = state.core.config.explain_max_hidden;
    let (explained, ranked, overview) = state
        .core
        .db
        .explain_page(
            &scope,
            req.message.as_deref(),
            state.core.config.max_tools,
            max_hidden,
        )
        .await?;
    Ok(Json(with_budget(
        at_most_hidden(explained, max_hidden),
        &compact::offer(state.core.config.tool_budget, ranked, &overview),
        state.core.config.tool_budget,
        &overview,
    )))
}

/// `explained` with at most `max_hidden` hidden tools (the first by name: `EXPLAIN_PAGE` lists
/// them last, in name order), and `hiddenMore`: whether the catalog holds others (the database
/// was asked for one more).
fn at_most_hidden(mut explained: Value, max_hidden: i32) -> Value {
    let limit = usize::try_from(max_hidden).unwrap_or(0);
    let mut hidden = 0usize;
    if let Some(tools) = explained["tools"].as_array_mut() {
        tools.retain(|t| {
            if t["visible"] == true {
                return true;
            }
            hidden += 1;
            hidden <= limit
        });
    }
    explained["hiddenMore"] = json!(hidden > limit);
    explained
}

/// `explain_page`'s answer with the tool budget's decision: `budget` (the limit, whether the list
/// is compact, the visible tools and their estimated tokens, what is offered), `namespaces`, and
/// per tool `budget`: `offered` (in the model's list), `find_tools` (compact: reachable through the
/// search), `left_out` (within the budget, below the `CTXGUARD_MAX_TOOLS` cut) or `hidden` (not
/// visible: `reason` says why). Offered tools first, then the other visible ones, then the rest.
fn with_budget(
    mut explained: Value,
    offer: &compact::Offer,
    budget: crate::config::budget::Budget,
    overview: &compact::Overview,
) -> Value {
    if let Some(tools) = explained["tools"].as_array_mut() {
        for t in tools.iter_mut() {
            let standing = if t["visible"] != true {
                "hidden"
            } else if offer.compact {
                compact::standing(offer, t["name"].as_str().unwrap_or_default())
            } else if t["offered"] == true {
                "offered"
            } else {
                "left_out"
            };
            t["budget"] = json!(standing);
        }
        let rank = |t: &Value| match t["budget"].as_str() {
            Some("offered") => 0,
            Some("hidden") => 2,
            _ => 1,
        };
        tools.sort_by_key(rank);
    }
    explained["budget"] = json!({
        "limit": budget.to_string(),
        "compact": offer.compact,
        "visibleTools": overview.tools(),
        "estimatedTokens": overview.tokens(),
        "offered": offer.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
    });
    explained["namespaces"] = overview
        .namespaces
        .iter()
        .map(|n| {
            json!({"name": n.name, "title": n.title, "description": n.description,
                   "tools": n.tools, "server": n.server})
        })
        .collect();
    explained
}

/// `POST /v1/tools/explain` body: the page, the tool (catalog or wire name) and its arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExplainRequest {
    page_context: Value,
    tool: String,
    #[serde(default)]
    arguments: Option<Value>,
}

/// `POST /v1/tools/explain`: Gate B's dry run (`ctxguard.explain_call`): the decision, its code and
/// rule, without running, approving or charging anything.
async fn explain_endpoint(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ExplainRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.tool.len() > 200 {
        return Err(ApiError::Unprocessable(
            "tool is longer than 200 bytes".into(),
        ));
    }
    let args = req.arguments.unwrap_or_else(|| serde_json::json!({}));
    let scope = PageRequest::of(req.page_context).scope(&headers)?;
    Ok(Json(
        state.core.db.explain_call(&scope, &req.tool, &args).await?,
    ))
}

/// `POST /v1/approvals`: the pending calls the caller may approve or reject (four eyes), with
/// their bound arguments masked.
async fn approvals_endpoint(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PageRequest>,
) -> Result<Json<Value>, ApiError> {
    let scope = req.scope(&headers)?;
    Ok(Json(state.core.db.pending_approvals(&scope).await?))
}

/// `POST /v1/approvals/{call_id}/reject` body: the page, and an optional reason (at most 500 bytes).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RejectRequest {
    page_context: Value,
    #[serde(default)]
    reason: Option<String>,
}

async fn reject_endpoint(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(call_id): Path<String>,
    ApiJson(req): ApiJson<RejectRequest>,
) -> Result<Json<Value>, ApiError> {
    let call_id = uuid::Uuid::parse_str(&call_id)
        .map_err(|_| ApiError::BadRequest("call_id must be a UUID".into()))?;
    let scope = PageRequest::of(req.page_context).scope(&headers)?;
    Ok(Json(
        state
            .core
            .db
            .reject(&scope, call_id, req.reason.as_deref())
            .await?,
    ))
}

async fn approve_endpoint(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(call_id): Path<String>,
    ApiJson(req): ApiJson<PageRequest>,
) -> Result<Json<Value>, ApiError> {
    let scope = req.scope(&headers)?;
    let call_id = uuid::Uuid::parse_str(&call_id)
        .map_err(|_| ApiError::BadRequest("call_id must be a UUID".into()))?;
    let envelope = tools::approve(&state.core, &scope, call_id).await?;
    Ok(Json(envelope))
}

/// Seed 003's request: `{tool_name, arguments, user?, trace_id?, pageContext?, generation_id?}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteRequest {
    tool_name: String,
    #[serde(default)]
    arguments: Value,
    #[serde(default)]
    user: Option<UserClaim>,
    #[serde(default)]
    trace_id: Option<String>,
    #[serde(default, rename = "pageContext")]
    page_context: Option<Value>,
    #[serde(default)]
    generation_id: Option<uuid::Uuid>,
}

async fn execute_endpoint(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ExecuteRequest>,
) -> Result<Json<Value>, ApiError> {
    let token = bearer(&headers)?;
    let trace = req
        .trace_id
        .clone()
        .filter(|t| chat::is_valid_id(t))
        .unwrap_or_else(|| trace_id(&headers));
    let page = page_from(req.page_context)?;
    let scope = Scope {
        token,
        page,
        generation: req.generation_id,
        trace_id: trace.clone(),
    };
    // The caller's generation, or a new one; one the database refuses (lapsed) is renewed once,
    // and the new id returned (pages.rs).
    let mut view = pages::View::named(scope, &trace);
    // Identity comes from the token only: a disagreeing `user` in the body is refused.
    let db = &state.core.db;
    let context = view
        .run(db, |s| async move { db.context(&s).await })
        .await?;
    chat::check_claim(req.user.as_ref(), &context)?;
    if view.generation().is_none() {
        view.renew(db).await?;
    }
    let arguments = if req.arguments.is_null() {
        json!({})
    } else {
        req.arguments
    };
    let envelope = tools::call(
        &state.core,
        &mut view,
        db::ToolName::Catalog(&req.tool_name),
        &arguments,
    )
    .await?;
    let code = envelope
        .pointer("/error/code")
        .and_then(Value::as_str)
        .unwrap_or("OK");
    state
        .core
        .metrics
        .tool_decisions
        .with_label_values(&[code])
        .inc();
    let mut out = json!({"status": envelope["status"], "trace_id": trace, "generation_id": view.generation().map(|g| g.to_string())});
    if envelope["status"] == "ok" {
        out["result"] = envelope["result"].clone();
    } else {
        out["error"] = envelope["error"].clone();
    }
    // A call waiting for an approval is approved (or granted, rejected) by its id.
    if envelope.pointer("/error/code") == Some(&json!("APPROVAL_REQUIRED")) {
        out["call_id"] = envelope["call_id"].clone();
    }
    Ok(Json(out))
}

/// `PUT /v1/context`: set the caller's current page for their MCP sessions (body: a page context).
pub async fn put_context(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(page): ApiJson<Value>,
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
        trace_id: uuid::Uuid::new_v4().to_string(),
    };
    let (context, put) = state.core.db.put_user_page(&scope).await?;
    let who = (
        context["tenantId"].as_str().unwrap_or_default().to_string(),
        context["userId"].as_str().unwrap_or_default().to_string(),
    );
    let key = put["key"].as_str().unwrap_or_default().to_string();
    let changed = put["changed"].as_bool().unwrap_or(true);
    state.pages.set_shared(who, key, page, changed);
    Ok(Json(
        json!({"status": "ok", "pageType": context["pageType"]}),
    ))
}

/// Count each request under its route's template (`/v1/approvals/{call_id}`), so that the label
/// set is the router's; requests no route matched share [`UNMATCHED_ROUTE`].
async fn count_requests(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED_ROUTE, |m| {
            // A nested service (`/mcp`) matches as its prefix plus axum's private tail parameter.
            let path = m.as_str();
            path.find("/{*").map_or(path, |tail| &path[..tail])
        });
    let route = route.to_string();
    let resp = next.run(req).await;
    state
        .core
        .metrics
        .requests
        .with_label_values(&[&route, resp.status().as_str()])
        .inc();
    resp
}

/// The body limit for a service that reads its own body (rmcp at `/mcp`), as the JSON extractor
/// applies it everywhere else: a body over `CTXGUARD_MAX_BODY_BYTES` is 413 PAYLOAD_TOO_LARGE
/// before the service or the database sees the request.
async fn limit_body(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    use futures::StreamExt;
    let max = state.core.config.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return ApiError::TooLarge.into_response();
    }
    let (parts, body) = req.into_parts();
    let mut chunks = body.into_data_stream();
    let mut read: Vec<u8> = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let Ok(chunk) = chunk else {
            return ApiError::BadRequest("the request body could not be read".into())
                .into_response();
        };
        if read.len() + chunk.len() > max {
            return ApiError::TooLarge.into_response();
        }
        read.extend_from_slice(&chunk);
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(read)))
        .await
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint".into())
}

/// RFC 9728 metadata at each well-known path the public URL derives (`config/public_url.rs`).
fn metadata_routes(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    state.core.public.metadata_routes().into_iter().fold(
        Router::new(),
        |router, (path, resource)| {
            // The authorization servers and scopes of `CTXGUARD_OAUTH_ISSUER`/`_SCOPES` (`config/oauth.rs`).
            let body = state.oauth.metadata(state.core.public.metadata(&resource));
            router.route(&path, get(move || async move { Json(body) }))
        },
    )
}

/// The router, with request ids (propagated to audit rows as trace ids), tracing and body limits.
pub fn app(state: Arc<AppState>) -> Router {
    // The MCP room's own state, provided by this one (`AppState::mcp_state`).
    let mcp = Arc::new(state.mcp_state());
    let demo = if state.demo.is_some() {
        demo::routes(state.clone())
    } else {
        Router::new()
    };
    Router::new()
        .merge(demo)
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_endpoint))
        .route("/v1/chat", post(chat_endpoint))
        .route("/v1/tools", post(tools_endpoint))
        .route("/v1/tools/explain", post(explain_endpoint))
        .route("/v1/approvals", post(approvals_endpoint))
        .route("/v1/approvals/{call_id}", post(approve_endpoint))
        .route("/v1/approvals/{call_id}/reject", post(reject_endpoint))
        .route("/internal/mcp/execute", post(execute_endpoint))
        .route("/v1/connections", post(connections::list))
        .route("/v1/connections/callback", get(connections::callback))
        .route("/v1/connections/{server}", post(connections::start))
        .route(
            "/v1/connections/{server}/disconnect",
            post(connections::disconnect),
        )
        .route(
            "/v1/tenant-secrets/{server}",
            axum::routing::put(connections::put_secret),
        )
        .route(
            "/v1/tenant-secrets/{server}/delete",
            post(connections::delete_secret),
        )
        .route("/v1/context", axum::routing::put(put_context))
        .merge(metadata_routes(&state))
        .nest_service(
            "/mcp",
            tower::ServiceBuilder::new()
                .layer(middleware::from_fn_with_state(state.clone(), origin::guard))
                .layer(middleware::from_fn_with_state(state.clone(), limit_body))
                .layer(middleware::from_fn_with_state(
                    mcp.clone(),
                    mcp::authenticate,
                ))
                .layer(middleware::from_fn(mcp::jsonrpc::validate))
                .service(mcp::service(mcp)),
        )
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(DefaultBodyLimit::max(state.core.config.max_body_bytes))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(TraceLayer::new_for_http())
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(middleware::from_fn(mark_caller_request_id))
        .layer(middleware::from_fn(limits::track))
        .with_state(state)
}

/// Serve until SIGINT/SIGTERM, then drain in-flight requests; with the HTTP limits of `limits.rs`.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    // Page changes made through other gateways (one listening connection, reconnecting), from
    // the first MCP session or subscription on.
    let follower = {
        let state = state.clone();
        tokio::spawn(async move {
            state.pages.wanted().await;
            if let Some(url) = mcp::follow::notify_url(&state.core).await {
                mcp::follow::follow(url, state.pages.clone()).await;
            }
        })
    };
    let _stop_following = AbortOnDrop(follower);
    let limits = state.limits.clone();
    limits::serve(listener, app(state), limits, shutdown_signal()).await
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down");
    tokio::time::sleep(Duration::from_millis(10)).await;
}
