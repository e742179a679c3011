//! **Floor** (uses `error`): the caller's bearer token, taken from the request before any database work (the
//! database verifies it; the gateway only checks its shape). Used by the HTTP routes and `/mcp`.

use axum::http::{header, HeaderMap};

use crate::error::ApiError;

/// The bearer token, required before any database work.
pub fn bearer(headers: &HeaderMap) -> Result<String, ApiError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match value.strip_prefix("Bearer ").map(str::trim) {
        Some(t) if !t.is_empty() && t.len() <= 8192 && t.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(t.to_string())
        }
        _ => Err(ApiError::Unauthorized("a bearer token is required".into())),
    }
}
