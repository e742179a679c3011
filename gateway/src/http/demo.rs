//! Demo mode (`CTXGUARD_DEMO=true`, loopback only): the screen-aware demo app at `/`, the data of
//! its screens, and tokens for its demo users. Without demo mode none of these routes exist.
//!
//! The app is three static files compiled into the binary (no build step, no dependencies). Its
//! screens read their data through `demo.page_data()` after the same `set_context` the assistant
//! uses, so a screen shows exactly what the page context it sends allows. They read it through
//! their own pool (`CTXGUARD_DEMO_DATABASE_URL`, role ctxguard_app): the screens show raw page
//! text, so the role that runs the model's calls cannot execute `demo.page_data()` at all.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use jsonwebtoken::{EncodingKey, Header};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::http::{ApiJson, AppState, PageRequest};

/// Lifetime of a minted demo token.
const TOKEN_TTL_SECS: u64 = 3600;

/// A demo user: who the switcher offers. Tokens carry exactly these claims.
struct DemoUser {
    id: &'static str,
    name: &'static str,
    tenant: &'static str,
    roles: &'static [&'static str],
}

const USERS: &[DemoUser] = &[
    DemoUser {
        id: "alice",
        name: "Alice (Acme, AP clerk)",
        tenant: "acme",
        roles: &["ap_clerk"],
    },
    DemoUser {
        id: "maria",
        name: "Maria (Acme, AP manager)",
        tenant: "acme",
        roles: &["ap_manager"],
    },
    DemoUser {
        id: "bob",
        name: "Bob (Acme, viewer)",
        tenant: "acme",
        roles: &["viewer"],
    },
    DemoUser {
        id: "carol",
        name: "Carol (Globex, AP clerk)",
        tenant: "globex",
        roles: &["ap_clerk"],
    },
];

/// Demo mode: the database's HS256 secret (read once at start-up) to sign demo users' tokens, and
/// the pool of the role the screens read through.
pub struct Demo {
    key: EncodingKey,
    audience: Option<String>,
    db: crate::db::Db,
}

impl Demo {
    pub fn from_config(config: &crate::config::Config) -> Result<Option<Demo>, String> {
        if !config.demo {
            return Ok(None);
        }
        let path = config
            .demo_jwt_secret_file
            .as_ref()
            .ok_or("CTXGUARD_DEMO needs CTXGUARD_DEMO_JWT_SECRET_FILE")?;
        let secret = std::fs::read_to_string(path)
            .map_err(|e| format!("CTXGUARD_DEMO_JWT_SECRET_FILE {}: {e}", path.display()))?;
        let secret = secret.trim();
        if secret.len() < 32 {
            return Err("CTXGUARD_DEMO_JWT_SECRET_FILE holds fewer than 32 bytes".into());
        }
        let url = config
            .demo_url()
            .ok_or("CTXGUARD_DEMO needs CTXGUARD_DEMO_DATABASE_URL")?;
        Ok(Some(Demo {
            key: EncodingKey::from_secret(secret.as_bytes()),
            audience: config.demo_jwt_audience.clone().filter(|a| !a.is_empty()),
            db: crate::db::Db::connect(
                url,
                config.pool_size.min(8),
                config.db_timeout(),
                config.db_statements,
            )?
            .with_limits(config.db_limits()),
        }))
    }

    fn mint(&self, user: &DemoUser) -> Result<String, ApiError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .as_secs();
        let mut claims = json!({
            "sub": user.id,
            "tenant_id": user.tenant,
            "roles": user.roles,
            "iat": now,
            "exp": now + TOKEN_TTL_SECS,
        });
        if let Some(aud) = &self.audience {
            claims["aud"] = json!(aud);
        }
        jsonwebtoken::encode(&Header::default(), &claims, &self.key)
            .map_err(|e| ApiError::Internal(format!("minting a demo token: {e}")))
    }
}

fn user_json(u: &DemoUser) -> Value {
    json!({"id": u.id, "name": u.name, "tenant": u.tenant, "roles": u.roles})
}

async fn users() -> Json<Value> {
    Json(json!({"users": USERS.iter().map(user_json).collect::<Vec<_>>()}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequest {
    user: String,
}

async fn token(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<TokenRequest>,
) -> Result<Json<Value>, ApiError> {
    let demo = state
        .demo
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("no such endpoint".into()))?;
    let user = USERS
        .iter()
        .find(|u| u.id == req.user)
        .ok_or_else(|| ApiError::NotFound("no such demo user".into()))?;
    Ok(Json(json!({
        "token": demo.mint(user)?,
        "expiresIn": TOKEN_TTL_SECS,
        "user": user_json(user),
    })))
}

/// `POST /demo/page`: the validated context and the data of the screen it names, read through
/// the screens' own pool.
async fn page(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PageRequest>,
) -> Result<Json<Value>, ApiError> {
    let demo = state
        .demo
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("no such endpoint".into()))?;
    Ok(Json(demo.db.demo_page(&req.scope(&headers)?).await?))
}

const INDEX_HTML: &str = include_str!("../../demo/index.html");
const APP_JS: &str = include_str!("../../demo/app.js");
const APP_CSS: &str = include_str!("../../demo/app.css");

/// Static responses: no caching (the binary is the version), a strict CSP (the app renders every
/// answer as text, and nothing may load from elsewhere), no sniffing, no framing.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// Whether a `Host` header names one of the allowed hosts (`name` or `name:port` entries).
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None if host.matches(':').count() == 1 => host.split(':').next().unwrap_or_default(),
        None => host,
    };
    !name.is_empty()
        && allowed
            .iter()
            .any(|a| a.eq_ignore_ascii_case(name) || a.eq_ignore_ascii_case(host))
}

/// DNS-rebinding protection for demo mode: a page on another site that resolves its own name to
/// 127.0.0.1 could otherwise mint tokens and read the app. Same hosts as `/mcp`.
async fn same_host(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if host_allowed(host, state.mcp_guard.hosts()) {
        next.run(req).await
    } else {
        ApiError::HostNotAllowed.into_response()
    }
}

/// The app's screen URLs: each serves the app, whose router reads the path.
const SCREENS: &[&str] = &[
    "/",
    "/vendors",
    "/invoices",
    "/invoices/{id}",
    "/documents",
    "/documents/{id}",
    "/matters/{id}",
];

/// The demo routes, merged into the router only in demo mode.
pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    SCREENS
        .iter()
        .fold(Router::new(), |r, path| r.route(path, get(index)))
        .route(
            "/demo/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/demo/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route("/demo/users", get(users))
        .route("/demo/token", post(token))
        .route("/demo/page", post(page))
        .route_layer(middleware::from_fn_with_state(state, same_host))
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn hosts_are_matched_by_name_or_name_and_port() {
        let allowed: Vec<String> = ["localhost", "127.0.0.1", "::1", "demo.internal:8443"]
            .iter()
            .map(ToString::to_string)
            .collect();
        for ok in [
            "localhost",
            "localhost:8088",
            "127.0.0.1:8088",
            "[::1]:8088",
            "[::1]",
            "LOCALHOST:1",
            "demo.internal:8443",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "evil.example:8088",
            "127.0.0.1.evil.example",
            "demo.internal:80",
            "localhost.:8088",
            "[::2]:8088",
        ] {
            assert!(!host_allowed(bad, &allowed), "{bad}");
        }
    }
}
