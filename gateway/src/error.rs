//! **Floor** (uses no other room).
//!
//! One error type for every endpoint: `{"error": {"code", "message"}}` with a fitting status.
//! Internal details are logged, never returned.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unprocessable(String),
    #[error("request body too large")]
    TooLarge,
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("this host name is not allowed")]
    HostNotAllowed,
    #[error("this origin is not allowed")]
    OriginNotAllowed,
    #[error("database unavailable")]
    DatabaseUnavailable,
    #[error("model upstream failed")]
    UpstreamFailed,
    #[error("model upstream timed out")]
    UpstreamTimeout,
    /// `ctxguard.save_turn` refused the turn's size: the gateway's bounds
    /// (`CTXGUARD_MAX_ANSWER_BYTES`, tool-call caps) are above the database's.
    #[error("the turn is larger than the database stores")]
    TurnTooLarge,
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "BAD_REQUEST",
            ApiError::Unprocessable(_) => "INVALID_PAGE_CONTEXT",
            ApiError::TooLarge => "PAYLOAD_TOO_LARGE",
            ApiError::Unauthorized(_) => "UNAUTHENTICATED",
            ApiError::Forbidden(_) => "IDENTITY_MISMATCH",
            ApiError::NotFound(_) => "NOT_FOUND",
            ApiError::HostNotAllowed => "HOST_NOT_ALLOWED",
            ApiError::OriginNotAllowed => "ORIGIN_NOT_ALLOWED",
            ApiError::DatabaseUnavailable => "DATABASE_UNAVAILABLE",
            ApiError::UpstreamFailed => "UPSTREAM_FAILED",
            ApiError::UpstreamTimeout => "UPSTREAM_TIMEOUT",
            ApiError::TurnTooLarge => "TURN_TOO_LARGE",
            ApiError::Internal(_) => "INTERNAL",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::HostNotAllowed | ApiError::OriginNotAllowed => StatusCode::FORBIDDEN,
            ApiError::DatabaseUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::UpstreamFailed => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ApiError::TurnTooLarge => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn body(&self) -> serde_json::Value {
        let message = match self {
            ApiError::Internal(_) => "internal error".to_string(),
            other => other.to_string(),
        };
        json!({"error": {"code": self.code(), "message": message}})
    }
}

/// Tool calls the gateway refuses itself, before the database sees them (the model's output is
/// bounded): reported like the database's refusals, with these codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Past `CTXGUARD_MAX_TOOL_CALLS_PER_STEP` in one model step, or past
    /// `CTXGUARD_MAX_TOOL_CALLS_PER_TURN` in the turn: not run.
    ToolCallLimit,
    /// Arguments over `CTXGUARD_MAX_TOOL_ARGUMENT_BYTES` (or an id or tool name over 256 bytes):
    /// not run, and the arguments are neither echoed nor stored.
    ToolCallTooLarge,
}

impl Refusal {
    pub fn code(self) -> &'static str {
        match self {
            Refusal::ToolCallLimit => "TOOL_CALL_LIMIT_EXCEEDED",
            Refusal::ToolCallTooLarge => "TOOL_CALL_TOO_LARGE",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::ToolCallLimit => {
                "too many tool calls: this one was not run; answer from the results you have"
            }
            Refusal::ToolCallTooLarge => "the tool call is too large: it was not run",
        }
    }

    /// The refusal as a tool result envelope (what the model is told).
    pub fn envelope(self) -> serde_json::Value {
        json!({"status": "error", "error": {"code": self.code(), "message": self.message()}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(detail) = &self {
            tracing::error!(%detail, "internal error");
        }
        (self.status(), Json(self.body())).into_response()
    }
}
