//! The credential endpoints. Each acts for the bearer token's user as the database verifies it;
//! none answers a credential.
//!
//! - `POST /v1/connections` `{pageContext}`: the servers the user may use that take a credential,
//!   each `{server, mode, connected, expiresAt}`.
//! - `POST /v1/connections/{server}` `{pageContext}`: start connecting a `user_oauth` server:
//!   `{authorizeUrl}` to open in the user's browser.
//! - `GET /v1/connections/callback?code&state`: where the authorization server sends the browser
//!   back; stores the connection; a small page says whether it worked (no detail).
//! - `POST /v1/connections/{server}/disconnect` `{pageContext}`: delete the user's connection and
//!   revoke its tokens at the authorization server: `{disconnected}`.
//! - `PUT /v1/tenant-secrets/{server}` `{pageContext, secret}`: the tenant admin sets the tenant's
//!   secret (write-only): `{status: "ok", server, changed}`.
//! - `POST /v1/tenant-secrets/{server}/delete` `{pageContext}`: the tenant admin deletes it.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::http::{ApiJson, AppState, PageRequest};
use crate::upstream::credentials;

/// Most bytes of a tenant secret.
pub const MAX_SECRET_BYTES: usize = 16 * 1024;

/// The database's 42501 (not the tenant's admin) as a 403, with its fixed message.
fn admin_only(e: ApiError) -> ApiError {
    match e {
        ApiError::Internal(d) if d.starts_with("42501") => {
            ApiError::Forbidden("only the tenant's admin may change its upstream secrets".into())
        }
        other => other,
    }
}

fn check_server(server: &str) -> Result<(), ApiError> {
    let ok = !server.is_empty()
        && server.len() <= 32
        && server
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::Unprocessable("no such upstream server".into()))
    }
}

pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PageRequest>,
) -> Result<Json<Value>, ApiError> {
    let scope = req.scope(&headers)?;
    let connections = state.core.db.upstream_connections(&scope).await?;
    Ok(Json(json!({"connections": connections})))
}

pub(crate) async fn start(
    State(state): State<Arc<AppState>>,
    Path(server): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PageRequest>,
) -> Result<Json<Value>, ApiError> {
    check_server(&server)?;
    let scope = req.scope(&headers)?;
    // The server must be one this user may use (the database says which).
    let connections = state.core.db.upstream_connections(&scope).await?;
    let usable = connections.as_array().is_some_and(|a| {
        a.iter()
            .any(|c| c["server"] == server.as_str() && c["mode"] == "user_oauth")
    });
    if !usable {
        return Err(ApiError::Unprocessable(
            "no such upstream server takes a connection for this user".into(),
        ));
    }
    let cfg = state
        .core
        .upstreams
        .config(&state.core.db, &server)
        .await
        .ok_or_else(|| ApiError::Unprocessable("no such upstream server".into()))?;
    let url = credentials::connect_url(&state.core.credential_deps(), &scope, &cfg)
        .await
        .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
    Ok(Json(json!({"server": server, "authorizeUrl": url})))
}

#[derive(Debug, Deserialize)]
pub(crate) struct Callback {
    code: Option<String>,
    state: Option<String>,
}

fn page(status: StatusCode, text: &str) -> Response {
    let body = format!(
        "<!doctype html><meta charset=utf-8><title>ctxguard</title><p>{text}</p>\
         <script>window.opener&&window.opener.postMessage('ctxguard-connection','*');</script>"
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

pub(crate) async fn callback(
    State(state): State<Arc<AppState>>,
    Query(q): Query<Callback>,
) -> Response {
    let valid = |s: &Option<String>| {
        s.as_ref()
            .filter(|v| !v.is_empty() && v.len() <= 2048 && v.bytes().all(|b| b.is_ascii_graphic()))
            .cloned()
    };
    let (Some(code), Some(st)) = (valid(&q.code), valid(&q.state)) else {
        return page(StatusCode::BAD_REQUEST, "The connection was not made.");
    };
    match credentials::complete_connection(&state.core.credential_deps(), &st, &code).await {
        Ok(_) => page(
            StatusCode::OK,
            "Connected. You can close this window and retry.",
        ),
        Err(_) => page(StatusCode::BAD_REQUEST, "The connection was not made."),
    }
}

pub(crate) async fn disconnect(
    State(state): State<Arc<AppState>>,
    Path(server): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PageRequest>,
) -> Result<Json<Value>, ApiError> {
    check_server(&server)?;
    let scope = req.scope(&headers)?;
    let disconnected =
        credentials::disconnect(&state.core.credential_deps(), &scope, &server).await?;
    Ok(Json(
        json!({"server": server, "disconnected": disconnected}),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SecretRequest {
    page_context: Value,
    secret: String,
}

pub(crate) async fn put_secret(
    State(state): State<Arc<AppState>>,
    Path(server): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<SecretRequest>,
) -> Result<Json<Value>, ApiError> {
    check_server(&server)?;
    if req.secret.is_empty()
        || req.secret.len() > MAX_SECRET_BYTES
        || !req.secret.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(ApiError::Unprocessable(format!(
            "secret must be 1-{MAX_SECRET_BYTES} printable ASCII characters"
        )));
    }
    let scope = PageRequest {
        page_context: req.page_context,
    }
    .scope(&headers)?;
    Ok(Json(
        credentials::set_tenant_secret(&state.core.credential_deps(), &scope, &server, &req.secret)
            .await
            .map_err(admin_only)?,
    ))
}

pub(crate) async fn delete_secret(
    State(state): State<Arc<AppState>>,
    Path(server): Path<String>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PageRequest>,
) -> Result<Json<Value>, ApiError> {
    check_server(&server)?;
    let scope = req.scope(&headers)?;
    let out = state
        .core
        .db
        .delete_tenant_secret(&scope, &server)
        .await
        .map_err(admin_only)?;
    state.core.upstreams.forget(&server).await;
    Ok(Json(out))
}
