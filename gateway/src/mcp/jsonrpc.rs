//! JSON-RPC errors per the spec on `/mcp`, before rmcp parses a POST body (rmcp answers a body it
//! cannot parse with HTTP 415, and a `tools/call` without a usable `name` as an unknown method):
//!
//! - not JSON: HTTP 400, `-32700` (parse error), `id: null`;
//! - a batch (an array): HTTP 400, `-32600`: no protocol revision ctxguard offers has batches
//!   (2025-03-26, the one that had them, is not offered);
//! - not a JSON-RPC 2.0 message (no `"jsonrpc": "2.0"`, an `id` that is not a string or an integer,
//!   a `method` that is not a string, a response without `result` or `error`): HTTP 400, `-32600`;
//! - a request of a method ctxguard serves with unusable params (`tools/call` without a string
//!   `name` or with non-object `arguments`, a `cursor` that is not a string, params rmcp cannot
//!   read): HTTP 200, `-32602` with the request's `id`.
//!
//! Unknown methods go on to rmcp (`-32601`). Messages never echo the offending values.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rmcp::model::ClientJsonRpcMessage;
use serde_json::{json, Value};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;

/// Methods whose params rmcp reads: a request of one that does not parse is `-32602`.
const KNOWN_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "subscriptions/listen",
    "server/discover",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
];

/// A refused message.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    pub status: StatusCode,
    pub id: Value,
    pub code: i64,
    pub message: &'static str,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({
                "jsonrpc": "2.0",
                "id": self.id,
                "error": {"code": self.code, "message": self.message},
            })),
        )
            .into_response()
    }
}

fn invalid_request(id: Value, message: &'static str) -> Refusal {
    Refusal {
        status: StatusCode::BAD_REQUEST,
        id,
        code: INVALID_REQUEST,
        message,
    }
}

fn invalid_params(id: Value, message: &'static str) -> Refusal {
    Refusal {
        status: StatusCode::OK,
        id,
        code: INVALID_PARAMS,
        message,
    }
}

/// Judge one POST body.
pub fn check(body: &[u8]) -> Result<(), Refusal> {
    let value: Value = serde_json::from_slice(body).map_err(|_| Refusal {
        status: StatusCode::BAD_REQUEST,
        id: Value::Null,
        code: PARSE_ERROR,
        message: "Parse error: the body is not JSON",
    })?;
    let object = match &value {
        Value::Object(o) => o,
        Value::Array(_) => {
            return Err(invalid_request(
                Value::Null,
                "Invalid Request: batches are not supported (protocol 2025-06-18 and later)",
            ))
        }
        _ => {
            return Err(invalid_request(
                Value::Null,
                "Invalid Request: a JSON-RPC message is an object",
            ))
        }
    };
    let id = match object.get("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id.clone()),
        Some(id @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(id.clone()),
        Some(_) => {
            return Err(invalid_request(
                Value::Null,
                "Invalid Request: id must be a string or an integer",
            ))
        }
    };
    let reply_id = id.clone().unwrap_or(Value::Null);
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid_request(
            reply_id,
            "Invalid Request: jsonrpc must be \"2.0\"",
        ));
    }
    let Some(method) = object.get("method") else {
        // A response or error to a request of the server's.
        let answers = object.contains_key("result") != object.contains_key("error");
        if id.is_none() || !answers {
            return Err(invalid_request(
                reply_id,
                "Invalid Request: a message needs a method, or an id and a result or an error",
            ));
        }
        return parsed(value, Value::Null, false);
    };
    let Some(method) = method.as_str() else {
        return Err(invalid_request(
            reply_id,
            "Invalid Request: method must be a string",
        ));
    };
    let known = KNOWN_METHODS.contains(&method);
    if let (Some(id), true) = (&id, known) {
        let params = object.get("params");
        if params.is_some_and(|p| !p.is_object()) {
            return Err(invalid_params(
                id.clone(),
                "Invalid params: params must be an object",
            ));
        }
        let field = |name: &str| params.and_then(|p| p.get(name));
        match method {
            "tools/call" => {
                let named = field("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| !n.is_empty());
                if !named {
                    return Err(invalid_params(
                        id.clone(),
                        "Invalid params: tools/call needs the tool's name (a string)",
                    ));
                }
                if field("arguments").is_some_and(|a| !a.is_object() && !a.is_null()) {
                    return Err(invalid_params(
                        id.clone(),
                        "Invalid params: arguments must be an object",
                    ));
                }
            }
            "tools/list" if field("cursor").is_some_and(|c| !c.is_string() && !c.is_null()) => {
                return Err(invalid_params(
                    id.clone(),
                    "Invalid params: cursor must be a string",
                ));
            }
            _ => {}
        }
    }
    parsed(value, reply_id, known && id.is_some())
}

/// Whatever rmcp cannot read as a client message is refused here, not as 415.
fn parsed(value: Value, id: Value, known_request: bool) -> Result<(), Refusal> {
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(_) => Ok(()),
        Err(_) if known_request => Err(invalid_params(
            id,
            "Invalid params: the request's params do not fit its method",
        )),
        Err(_) => Err(invalid_request(
            id,
            "Invalid Request: not a JSON-RPC message MCP knows",
        )),
    }
}

/// Middleware on `/mcp` (after authentication): POST bodies declared as JSON are judged here.
/// Bodies are already bounded by `limit_body`.
pub async fn validate(req: Request, next: Next) -> Response {
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if req.method() != Method::POST || !json {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return crate::error::ApiError::BadRequest("the request body could not be read".into())
            .into_response();
    };
    if let Err(refusal) = check(&bytes) {
        return refusal.into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(body: &str) -> Option<(u16, i64, Value)> {
        check(body.as_bytes())
            .err()
            .map(|r| (r.status.as_u16(), r.code, r.id))
    }

    #[test]
    fn each_kind_of_bad_message_gets_its_code() {
        assert_eq!(code("{not json"), Some((400, PARSE_ERROR, Value::Null)));
        assert_eq!(
            code(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            Some((400, INVALID_REQUEST, Value::Null))
        );
        assert_eq!(code("42"), Some((400, INVALID_REQUEST, Value::Null)));
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":7,"method":"ping"}"#),
            Some((400, INVALID_REQUEST, json!(7)))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#),
            Some((400, INVALID_REQUEST, Value::Null))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#),
            Some((400, INVALID_REQUEST, Value::Null))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":42}"#),
            Some((400, INVALID_REQUEST, json!(1)))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1}"#),
            Some((400, INVALID_REQUEST, json!(1)))
        );
        for params in [
            r#"{}"#,
            r#"{"name":42}"#,
            r#"{"name":""}"#,
            r#"{"name":"x","arguments":[1]}"#,
        ] {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{params}}}"#);
            assert_eq!(
                code(&body),
                Some((200, INVALID_PARAMS, json!("a"))),
                "{params}"
            );
        }
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call"}"#),
            Some((200, INVALID_PARAMS, json!(3)))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":5}}"#),
            Some((200, INVALID_PARAMS, json!(3)))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":[1]}"#),
            Some((200, INVALID_PARAMS, json!(3)))
        );
    }

    #[test]
    fn good_messages_and_unknown_methods_pass() {
        for ok in [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/list","params":{"cursor":"c"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"invoice__get"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a","arguments":{"b":1}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":9,"method":"no/such/method"}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{}}"#,
        ] {
            assert_eq!(check(ok.as_bytes()), Ok(()), "{ok}");
        }
    }
}
