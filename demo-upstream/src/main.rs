//! Demo Notes: the demo's upstream MCP server that needs each user's own connection
//! (`credential_mode = 'user_oauth'`), with the small OAuth 2.1 authorization server it trusts, in
//! one process on one port. scripts/demo.sh and tests/ui/run.sh start it; no Node or Python.
//!
//! - `GET /.well-known/oauth-authorization-server` (RFC 8414): the authorization server's metadata.
//! - `GET /authorize`: a sign-in page ("Sign in to Demo Notes as: …", Allow / Deny) for the one
//!   registered client and redirect URI, PKCE S256 required; `POST /authorize` sends the browser
//!   back with a code (or `access_denied`) and the state.
//! - `POST /token`: authorization code + PKCE verifier, or a refresh token (rotated), for an opaque
//!   access token (`--access-ttl`, default 10 minutes) and a refresh token.
//! - `POST /revoke` (RFC 7009).
//! - `GET /.well-known/oauth-protected-resource[/mcp]` (RFC 9728): the MCP endpoint names its
//!   authorization server.
//! - `/mcp`: MCP over Streamable HTTP (JSON answers, no sessions). Every request needs
//!   `Authorization: Bearer <access token>` this server issued: else 401 with
//!   `WWW-Authenticate: Bearer resource_metadata="…"`. Tools `whoami` and `my_notes` answer for
//!   the user the token was issued to, never for anything in the arguments.
//!
//! `ctxguard-demo-upstream --redirect-uri http://127.0.0.1:8088/v1/connections/callback`
//! (`--listen`, default 127.0.0.1:8089); `--print-tools` prints the `tools/list` tools as JSON
//! (what scripts/demo.sh records with `ctxguard.sync_mcp_tools`). The log names users, never a
//! code or token.

mod auth;
mod notes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use clap::Parser;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;

use auth::{AuthorizeError, AuthorizeParams, OAuthError, Server, TokenParams};

#[derive(Debug, Parser)]
#[command(
    about = "Demo Notes: an MCP server that needs each user's own connection, with its OAuth 2.1 authorization server"
)]
struct Args {
    /// Where to listen.
    #[arg(long, env = "DEMO_UPSTREAM_LISTEN", default_value = "127.0.0.1:8089")]
    listen: SocketAddr,
    /// The issuer and base URL of every endpoint (default: http://<listen>).
    #[arg(long, env = "DEMO_UPSTREAM_PUBLIC_URL")]
    public_url: Option<String>,
    /// The one client's id (a public client: PKCE, no secret).
    #[arg(long, env = "DEMO_UPSTREAM_CLIENT_ID", default_value = "ctxguard-demo")]
    client_id: String,
    /// The client's one redirect URI (the gateway's <CTXGUARD_PUBLIC_URL>/v1/connections/callback).
    #[arg(
        long,
        env = "DEMO_UPSTREAM_REDIRECT_URI",
        required_unless_present = "print_tools"
    )]
    redirect_uri: Option<String>,
    /// Access token lifetime, seconds.
    #[arg(long, env = "DEMO_UPSTREAM_ACCESS_TTL", default_value_t = 600)]
    access_ttl: u64,
    /// Print the tools (`tools/list`'s `tools`, JSON) and exit.
    #[arg(long)]
    print_tools: bool,
}

/// The user an MCP request's access token belongs to (set by [`bearer`], read by the tools).
#[derive(Debug, Clone)]
pub struct TokenUser(pub String);

struct App {
    auth: Server,
    /// The RFC 9728 metadata URL named in 401 answers.
    resource_metadata: String,
    /// The `Content-Security-Policy` of the sign-in page.
    csp: HeaderValue,
}

fn log(line: impl AsRef<str>) {
    eprintln!("demo-upstream: {}", line.as_ref());
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if args.print_tools {
        println!(
            "{}",
            serde_json::to_string(&notes::tools()).unwrap_or_default()
        );
        return;
    }
    let issuer = args
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", args.listen))
        .trim_end_matches('/')
        .to_string();
    let redirect_uri = args.redirect_uri.clone().unwrap_or_default();
    let Ok(redirect) = url::Url::parse(&redirect_uri) else {
        eprintln!("--redirect-uri must be an absolute URL");
        std::process::exit(2);
    };
    let app = Arc::new(App {
        auth: Server::new(auth::Config {
            issuer: issuer.clone(),
            client_id: args.client_id.clone(),
            redirect_uri: redirect_uri.clone(),
            resource: format!("{issuer}/mcp"),
            access_ttl: Duration::from_secs(args.access_ttl),
            refresh_ttl: Duration::from_secs(7 * 24 * 3600),
            code_ttl: Duration::from_secs(60),
        }),
        resource_metadata: format!("{issuer}/.well-known/oauth-protected-resource/mcp"),
        // Chromium applies form-action to the redirect after the form, so the client's origin too.
        csp: HeaderValue::from_str(&format!(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self' {}; frame-ancestors 'none'; base-uri 'none'",
            redirect.origin().ascii_serialization()
        ))
        .unwrap_or(HeaderValue::from_static("default-src 'none'")),
    });
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    log(format!(
        "Demo Notes on {issuer} (MCP at {issuer}/mcp; client {}; redirect URI {redirect_uri})",
        args.client_id
    ));
    if let Err(e) = axum::serve(listener, router(app)).await {
        eprintln!("server error: {e}");
        std::process::exit(1);
    }
}

fn router(app: Arc<App>) -> Router {
    let host = app
        .auth
        .cfg
        .issuer
        .split_once("://")
        .map(|(_, h)| h.to_string())
        .unwrap_or_default();
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(["127.0.0.1".to_string(), "localhost".to_string(), host]);
    let mcp = StreamableHttpService::new(
        || Ok(notes::Notes),
        Arc::new(NeverSessionManager::default()),
        mcp_config,
    );
    let protected = Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(app.clone(), bearer));
    Router::new()
        .route("/.well-known/oauth-authorization-server", get(as_metadata))
        .route(
            "/.well-known/oauth-protected-resource",
            get(resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/mcp",
            get(resource_metadata),
        )
        .route("/authorize", get(authorize_page).post(authorize_decision))
        .route("/token", post(token))
        .route("/revoke", post(revoke))
        .merge(protected)
        .with_state(app)
}

async fn as_metadata(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let i = &app.auth.cfg.issuer;
    Json(json!({
        "issuer": i,
        "authorization_endpoint": format!("{i}/authorize"),
        "token_endpoint": format!("{i}/token"),
        "revocation_endpoint": format!("{i}/revoke"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none"],
        "revocation_endpoint_auth_methods_supported": ["none"],
        "scopes_supported": [auth::SCOPE],
        "authorization_response_iss_parameter_supported": true,
    }))
}

async fn resource_metadata(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({
        "resource": app.auth.cfg.resource,
        "resource_name": "Demo Notes",
        "authorization_servers": [app.auth.cfg.issuer],
        "scopes_supported": [auth::SCOPE],
        "bearer_methods_supported": ["header"],
    }))
}

/// `/mcp` only for a valid access token of this server; its user goes to the tools.
async fn bearer(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let user = given.and_then(|t| app.auth.user_of(t));
    let Some(user) = user else {
        let challenge = match given {
            Some(_) => format!(
                "Bearer error=\"invalid_token\", resource_metadata=\"{}\"",
                app.resource_metadata
            ),
            None => format!("Bearer resource_metadata=\"{}\"", app.resource_metadata),
        };
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
            Json(json!({"error": "invalid_token", "error_description": "a Demo Notes access token is required"})),
        )
            .into_response();
    };
    req.extensions_mut().insert(TokenUser(user));
    next.run(req).await
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn html(app: &App, status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (header::CONTENT_SECURITY_POLICY, app.csp.clone()),
        ],
        body,
    )
        .into_response()
}

const STYLE: &str = "body{font:15px/1.4 system-ui,sans-serif;background:#f4f1ea;margin:0}\
main{max-width:26rem;margin:4rem auto;background:#fff;border:1px solid #ddd;border-radius:8px;padding:1.5rem 2rem}\
h1{font-size:1.3rem;margin:0 0 .3rem}.muted{color:#666;font-size:.9rem}\
label{display:block;margin:1rem 0}select{font:inherit;padding:.3rem;margin-left:.4rem}\
button{font:inherit;padding:.45rem 1.2rem;margin-right:.5rem;border-radius:5px;border:1px solid #888;cursor:pointer}\
button[value=allow]{background:#2d6a4f;color:#fff;border-color:#2d6a4f}";

fn error_page(app: &App, text: &str) -> Response {
    html(
        app,
        StatusCode::BAD_REQUEST,
        format!(
            "<!doctype html><meta charset=utf-8><title>Demo Notes</title><style>{STYLE}</style>\
             <main><h1>Demo Notes</h1><p id=error>{}</p></main>",
            escape(text)
        ),
    )
}

/// Send the browser back to the client: 303 to the registered redirect URI with `pairs`, the
/// state and the issuer (RFC 9207).
fn back_to_client(
    app: &App,
    redirect_uri: &str,
    pairs: &[(&str, &str)],
    state: Option<&str>,
) -> Response {
    let Ok(mut u) = url::Url::parse(redirect_uri) else {
        return error_page(app, "The application's redirect URI is not valid.");
    };
    {
        let mut q = u.query_pairs_mut();
        for (k, v) in pairs {
            q.append_pair(k, v);
        }
        if let Some(s) = state {
            q.append_pair("state", s);
        }
        q.append_pair("iss", &app.auth.cfg.issuer);
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, u.to_string()),
            (header::CACHE_CONTROL, "no-store".to_string()),
            (header::REFERRER_POLICY, "no-referrer".to_string()),
        ],
    )
        .into_response()
}

fn refused(app: &App, e: AuthorizeError) -> Response {
    match e {
        AuthorizeError::Untrusted => error_page(
            app,
            "This sign-in request does not come from the application registered with Demo Notes (unknown client or redirect URI).",
        ),
        AuthorizeError::Redirect {
            redirect_uri,
            state,
            error,
        } => back_to_client(app, &redirect_uri, &[("error", error.code())], state.as_deref()),
    }
}

/// The sign-in and consent page: the request's parameters ride along as hidden fields, checked
/// again when the form comes back.
async fn authorize_page(State(app): State<Arc<App>>, Query(p): Query<AuthorizeParams>) -> Response {
    if let Err(e) = app.auth.check_authorize(&p) {
        return refused(&app, e);
    }
    let hidden: String = [
        ("response_type", &p.response_type),
        ("client_id", &p.client_id),
        ("redirect_uri", &p.redirect_uri),
        ("state", &p.state),
        ("code_challenge", &p.code_challenge),
        ("code_challenge_method", &p.code_challenge_method),
        ("scope", &p.scope),
        ("resource", &p.resource),
    ]
    .iter()
    .filter_map(|(k, v)| {
        v.as_ref()
            .map(|v| format!("<input type=hidden name={k} value=\"{}\">", escape(v)))
    })
    .collect();
    let options: String = auth::USERS
        .iter()
        .map(|(id, name)| format!("<option value={id}>{name} ({id})</option>"))
        .collect();
    let client = escape(&app.auth.cfg.client_id);
    html(
        &app,
        StatusCode::OK,
        format!(
            "<!doctype html><meta charset=utf-8><title>Sign in to Demo Notes</title><style>{STYLE}</style>\
             <main><h1>Sign in to Demo Notes</h1>\
             <p class=muted><b>{client}</b> asks to read your notes (<code>{scope}</code>) on your behalf.</p>\
             <form method=post action=/authorize>{hidden}\
             <label>Sign in to Demo Notes as: <select name=user id=user>{options}</select></label>\
             <button type=submit name=decision value=allow id=allow>Allow</button>\
             <button type=submit name=decision value=deny id=deny>Deny</button></form>\
             <p class=muted>A demo: no password. In real life this is the upstream's own sign-in.</p></main>",
            scope = auth::SCOPE,
        ),
    )
}

#[derive(Debug, serde::Deserialize)]
struct Decision {
    #[serde(flatten)]
    params: AuthorizeParams,
    user: Option<String>,
    decision: Option<String>,
}

async fn authorize_decision(State(app): State<Arc<App>>, Form(d): Form<Decision>) -> Response {
    let req = match app.auth.check_authorize(&d.params) {
        Ok(r) => r,
        Err(e) => return refused(&app, e),
    };
    let user = d.user.unwrap_or_default();
    if d.decision.as_deref() != Some("allow") {
        log("authorize: the user denied the request");
        let denied = OAuthError::AccessDenied.code();
        return back_to_client(
            &app,
            &req.redirect_uri,
            &[("error", denied)],
            req.state.as_deref(),
        );
    }
    match app.auth.issue_code(&req, &user) {
        Ok(code) => {
            log(format!("authorize: code issued for {user}"));
            back_to_client(
                &app,
                &req.redirect_uri,
                &[("code", &code)],
                req.state.as_deref(),
            )
        }
        Err(e) => back_to_client(
            &app,
            &req.redirect_uri,
            &[("error", e.code())],
            req.state.as_deref(),
        ),
    }
}

/// The client id: HTTP Basic's user name (a secret, if any, is ignored: a public client), else
/// the form's `client_id`.
fn client_id(headers: &HeaderMap, form: Option<&str>) -> Option<String> {
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.split_once(':').map(|(id, _)| id.to_string()));
    basic.or_else(|| form.map(str::to_string))
}

fn oauth_error(e: OAuthError) -> Response {
    let status = if e == OAuthError::InvalidClient {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::BAD_REQUEST
    };
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        Json(json!({"error": e.code()})),
    )
        .into_response()
}

async fn token(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(p): Form<TokenParams>,
) -> Response {
    let client = client_id(&headers, p.client_id.as_deref());
    // Only the two grants it serves are named in the log (the value is the caller's).
    let grant = p
        .grant_type
        .as_deref()
        .filter(|g| matches!(*g, "authorization_code" | "refresh_token"))
        .unwrap_or("other");
    match app.auth.token(&p, client.as_deref()) {
        Ok(t) => {
            log(format!("token: {grant} grant for {}", t.user));
            (
                [
                    (header::CACHE_CONTROL, "no-store"),
                    (header::PRAGMA, "no-cache"),
                ],
                Json(json!({
                    "access_token": t.access_token,
                    "token_type": "Bearer",
                    "expires_in": t.expires_in,
                    "refresh_token": t.refresh_token,
                    "scope": t.scope,
                })),
            )
                .into_response()
        }
        Err(e) => {
            log(format!("token: {grant} grant refused ({})", e.code()));
            oauth_error(e)
        }
    }
}

#[derive(Debug, serde::Deserialize)]
struct RevokeParams {
    token: Option<String>,
    client_id: Option<String>,
    // `token_type_hint` is not read: both kinds are looked up anyway.
}

async fn revoke(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(p): Form<RevokeParams>,
) -> Response {
    let client = client_id(&headers, p.client_id.as_deref());
    let Some(token) = p.token else {
        return oauth_error(OAuthError::InvalidRequest);
    };
    match app.auth.revoke(&token, client.as_deref()) {
        Ok(what) => {
            log(format!(
                "revoke: {}",
                what.unwrap_or("unknown token (nothing to do)")
            ));
            StatusCode::OK.into_response()
        }
        Err(e) => oauth_error(e),
    }
}

#[cfg(test)]
mod tests;
