//! **Room `llm/`**: model providers behind one trait ([`ChatModel`]): OpenAI-compatible,
//! Anthropic, offline. It may use `catalog` (the tools it offers), `config` and `bounded`; it may not touch
//! the database, the loop (`chat`) or HTTP routes.
//!
//! Model providers behind one trait. The gateway never trusts a model: every tool call it asks for
//! goes through `ctxguard.call_tool` in the database.

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;

use crate::bounded::BodyError as BoundedError;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

pub mod anthropic;
pub mod offline;
pub mod openai;

use crate::catalog::{tool_name_from_wire, wire_name, ToolSpec};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

#[derive(Debug, Clone)]
pub enum Message {
    System(String),
    User(String),
    Assistant {
        text: String,
        tool_calls: Vec<ToolCall>,
        /// The provider's own items of this step, sent back with it as they came: its server-side
        /// tool search and what it loaded ([`Completion::provider_items`]). Empty for most steps.
        provider_items: Vec<Value>,
    },
    Tool {
        call_id: String,
        name: String,
        content: String,
    },
}

#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    /// What the provider did itself in this step and needs to see again in the next request
    /// (Anthropic's `server_tool_use` and `tool_search_tool_result` blocks, the Responses API's
    /// `tool_search_call` and `tool_search_output` items): opaque to the loop, which hands them
    /// back in [`Message::Assistant`]. Never a tool call: those are `tool_calls`, and only they run.
    pub provider_items: Vec<Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("model request timed out")]
    Timeout,
    #[error("model upstream answered {0}")]
    Upstream(u16),
    /// `400`, with the provider's own message (cut to [`MAX_REFUSAL_CHARS`]), so that a provider
    /// can tell a feature the endpoint lacks (tool search) from any other bad request.
    #[error("model upstream refused the request (400): {0}")]
    Refused(String),
    #[error("model transport error: {0}")]
    Transport(String),
    #[error("model answered something unreadable: {0}")]
    BadResponse(String),
}

#[async_trait]
pub trait ChatModel: Send + Sync {
    /// Provider label for metrics.
    fn provider(&self) -> &'static str;
    /// Whether this provider searches deferred tools itself (`ToolSpec::deferred`, e.g. Anthropic's
    /// `defer_loading`, OpenAI Responses' `tool_search`). When it does, the loop hands it the
    /// deferred tools along with the offered ones; otherwise only the offered ones (the compact
    /// list, with `find_tools`).
    fn native_tool_search(&self) -> bool {
        false
    }
    /// One model step.
    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
    ) -> Result<Completion, LlmError>;
    /// One model step, its text sent to `text` as it comes (the pieces add up to
    /// [`Completion::text`]); tool calls only in the completion, each whole. A provider without a
    /// streaming API sends its text in one piece.
    async fn stream(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        limits: StreamLimits,
        text: mpsc::Sender<String>,
    ) -> Result<Completion, LlmError> {
        let _ = limits;
        let completion = self.complete(messages, tools).await?;
        if !completion.text.is_empty() {
            let _ = text.send(completion.text.clone()).await;
        }
        Ok(completion)
    }
}

/// The most bytes one model response may have, streamed or not: past it the step fails.
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;
/// The most tool calls one streamed response may assemble: past it the step fails (the loop
/// refuses those past `CTXGUARD_MAX_TOOL_CALLS_PER_STEP` as it always did).
pub const MAX_STREAM_TOOL_CALLS: usize = 1024;

/// What one streamed model response may hold.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Bytes of the whole response ([`MAX_RESPONSE_BYTES`]).
    pub max_bytes: usize,
    /// Tool calls assembled ([`MAX_STREAM_TOOL_CALLS`]).
    pub max_tool_calls: usize,
    /// Argument bytes kept of one call (`CTXGUARD_MAX_TOOL_ARGUMENT_BYTES`): a call past them
    /// keeps that many and one more, as a string, which the loop refuses as TOOL_CALL_TOO_LARGE.
    pub max_argument_bytes: usize,
    /// Someone reads the answer as it is written (a client asked for `text/event-stream`): the
    /// offline model then paces its words as a hosted model would; otherwise it answers at once.
    pub listener: bool,
}

impl Default for StreamLimits {
    fn default() -> StreamLimits {
        StreamLimits {
            max_bytes: MAX_RESPONSE_BYTES,
            max_tool_calls: MAX_STREAM_TOOL_CALLS,
            max_argument_bytes: 64 * 1024,
            listener: false,
        }
    }
}

/// A tool call's arguments as they stream in, kept within their limit.
#[derive(Debug, Default, Clone)]
pub struct Arguments {
    raw: String,
    over: bool,
}

impl Arguments {
    pub fn push(&mut self, piece: &str, max: usize) {
        if self.over {
            return;
        }
        if self.raw.len() + piece.len() > max {
            let mut end = (max + 1).saturating_sub(self.raw.len()).min(piece.len());
            while !piece.is_char_boundary(end) {
                end -= 1;
            }
            self.raw.push_str(&piece[..end]);
            self.over = true;
        } else {
            self.raw.push_str(piece);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// The arguments as the loop judges them: parsed, or (past the limit) the text as a string
    /// longer than the limit.
    pub fn value(&self) -> Value {
        if self.over {
            Value::String(self.raw.clone())
        } else if self.raw.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            parse_arguments(&self.raw)
        }
    }
}

/// A model response: a JSON body (an endpoint that ignores `stream`), or its events.
pub enum Reply {
    Json(Value),
    Events(Events),
}

pub type Events = Pin<Box<dyn Stream<Item = Result<eventsource_stream::Event, LlmError>> + Send>>;

fn transport(e: reqwest::Error) -> LlmError {
    if e.is_timeout() {
        LlmError::Timeout
    } else {
        LlmError::Transport(e.without_url().to_string())
    }
}

/// Most bytes of an error body read (a 400's message; only its start is kept).
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// A response's body, at most `max` bytes ([`crate::bounded::body`]).
async fn body_capped(resp: reqwest::Response, max: usize) -> Result<Vec<u8>, LlmError> {
    crate::bounded::body(resp, max).await.map_err(|e| match e {
        BoundedError::TooLarge => LlmError::BadResponse("the response is too large".into()),
        BoundedError::Timeout => LlmError::Timeout,
        BoundedError::Transport => LlmError::Transport("the response could not be read".into()),
    })
}

/// A response that is not a success, on attempt `try_no`: a `400` is the endpoint's refusal; a
/// `429` or `5xx` on the first attempt is retried after the wait returned (`Retry-After`, capped
/// at 10 s); anything else is the upstream's failure.
async fn not_ok(resp: reqwest::Response, try_no: u32) -> Result<Duration, LlmError> {
    let status = resp.status();
    if status == reqwest::StatusCode::BAD_REQUEST {
        // Only the start of the message is kept (`refusal_message`): a larger body is not read.
        let message = match body_capped(resp, MAX_ERROR_BODY_BYTES).await {
            Ok(body) => refusal_message(&String::from_utf8_lossy(&body)),
            Err(_) => "a refusal too large to read".into(),
        };
        return Err(LlmError::Refused(message));
    }
    let retryable = status.as_u16() == 429 || status.is_server_error();
    if try_no == 0 && retryable {
        return Ok(resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(Duration::from_millis(250), Duration::from_secs)
            .min(Duration::from_secs(10)));
    }
    Err(LlmError::Upstream(status.as_u16()))
}

/// Send a streaming request with at most one retry before the response starts (as
/// [`send_with_retry`]); the response's bytes are counted and past `max_bytes` the stream fails.
pub async fn open_stream(
    build: impl Fn() -> reqwest::RequestBuilder,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Reply, LlmError> {
    let attempt = async {
        for try_no in 0..2 {
            let resp = build().send().await.map_err(transport)?;
            let status = resp.status();
            if status.is_success() {
                let events = resp
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
                let mut total = 0usize;
                let bytes = resp.bytes_stream().map(move |chunk| {
                    let chunk = chunk.map_err(transport)?;
                    total += chunk.len();
                    if total > max_bytes {
                        return Err(LlmError::BadResponse("the response is too large".into()));
                    }
                    Ok(chunk)
                });
                if !events {
                    let mut body = Vec::new();
                    let mut bytes = std::pin::pin!(bytes);
                    while let Some(chunk) = bytes.next().await {
                        body.extend_from_slice(&chunk?);
                    }
                    return serde_json::from_slice(&body)
                        .map(Reply::Json)
                        .map_err(|_| LlmError::BadResponse("the body is not JSON".into()));
                }
                let events = bytes.eventsource().map(|e| {
                    e.map_err(|e| match e {
                        EventStreamError::Transport(e) => e,
                        _ => LlmError::BadResponse("a malformed event".into()),
                    })
                });
                return Ok(Reply::Events(Box::pin(events)));
            }
            let wait = not_ok(resp, try_no).await?;
            tokio::time::sleep(wait).await;
        }
        unreachable!("two attempts at most")
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| LlmError::Timeout)?
}

/// Where and how to reach a hosted model (shared by the HTTP providers).
pub struct Endpoint {
    pub client: reqwest::Client,
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    pub timeout: Duration,
}

impl Endpoint {
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        model: &str,
        timeout: Duration,
    ) -> Endpoint {
        Endpoint {
            client: reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .expect("http client"),
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
            model: model.to_string(),
            timeout,
        }
    }
}

/// The longest provider message a [`LlmError::Refused`] keeps.
pub const MAX_REFUSAL_CHARS: usize = 500;

/// The message of a provider's `400` body (`{"error": {"message"}}` for both OpenAI and Anthropic),
/// or the body's start.
fn refusal_message(body: &str) -> String {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.to_string());
    message.chars().take(MAX_REFUSAL_CHARS).collect()
}

/// Whether a `400` says the endpoint does not support the provider's tool search (the search tool,
/// `defer_loading` or namespaces), so the request is worth sending again without them.
pub fn refuses_tool_search(error: &LlmError) -> bool {
    let LlmError::Refused(message) = error else {
        return false;
    };
    let message = message.to_ascii_lowercase();
    [
        "tool_search",
        "tool search",
        "defer_loading",
        "namespace",
        "tool_reference",
    ]
    .iter()
    .any(|word| message.contains(word))
}

/// Send a request with at most one retry, on 429 or 5xx, honouring `Retry-After` (capped).
/// The whole exchange is bounded by `timeout`. Tool calls are never executed here, so a retry can
/// never run a tool twice.
pub async fn send_with_retry(
    build: impl Fn() -> reqwest::RequestBuilder,
    timeout: Duration,
) -> Result<Value, LlmError> {
    let attempt = async {
        for try_no in 0..2 {
            let resp = build().send().await.map_err(|e| {
                if e.is_timeout() {
                    LlmError::Timeout
                } else {
                    LlmError::Transport(e.without_url().to_string())
                }
            })?;
            let status = resp.status();
            if status.is_success() {
                let body = body_capped(resp, MAX_RESPONSE_BYTES).await?;
                return serde_json::from_slice(&body)
                    .map_err(|_| LlmError::BadResponse("the body is not JSON".into()));
            }
            let wait = not_ok(resp, try_no).await?;
            tokio::time::sleep(wait).await;
        }
        unreachable!("two attempts at most")
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| LlmError::Timeout)?
}

/// Parse a tool-call argument string; invalid JSON becomes a JSON string, which the database
/// refuses as INVALID_ARGUMENT (and audits) rather than the gateway guessing.
pub fn parse_arguments(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tool as Gate A would list it, in the namespace of its first name segment.
    pub(crate) fn spec(name: &str, deferred: bool) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("{name} does it"),
            input_schema: serde_json::json!({"type": "object",
                "properties": {"note": {"type": "string"}}}),
            read_only: false,
            danger: "safe".into(),
            requires_approval: false,
            server: None,
            title: None,
            namespace: name.split('.').next().map(str::to_string),
            deferred,
        }
    }

    /// A recorded provider shape (`gateway/tests/fixtures/llm/`; each file says where it is from).
    pub(crate) fn fixture(name: &str) -> Value {
        let path = format!("{}/tests/fixtures/llm/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A recorded stream (`gateway/tests/fixtures/llm/*.sse`).
    pub(crate) fn sse_fixture(name: &str) -> String {
        let path = format!("{}/tests/fixtures/llm/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The `data` of each event of a recorded stream.
    pub(crate) fn sse_data(stream: &str) -> Vec<String> {
        stream
            .split("\n\n")
            .filter_map(|e| {
                e.lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .map(str::to_string)
            })
            .collect()
    }

    /// A model endpoint that answers every request with `head` and `body` as raw bytes, then
    /// closes the connection (a `content-length` larger than `body` is a connection dropped
    /// mid-stream). Returns the base URL.
    pub(crate) async fn raw_server(head: String, body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (head, body) = (head.clone(), body.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut seen = Vec::new();
                    // The request: its head, then its content-length of body.
                    loop {
                        let n = conn.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&seen).to_string();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let length = text[..end]
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                                })
                                .unwrap_or(0);
                            if seen.len() >= end + 4 + length {
                                break;
                            }
                        }
                    }
                    let _ = conn.write_all(head.as_bytes()).await;
                    for piece in body.chunks(7) {
                        let _ = conn.write_all(piece).await;
                        let _ = conn.flush().await;
                    }
                    let _ = conn.shutdown().await;
                });
            }
        });
        format!("http://{addr}")
    }

    /// The head of an event stream that runs until the connection closes.
    pub(crate) fn sse_head() -> String {
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".into()
    }

    #[tokio::test]
    async fn bodies_past_their_limit_are_refused_unread() {
        let send = |url: String| {
            send_with_retry(
                move || reqwest::Client::new().post(&url),
                Duration::from_secs(10),
            )
        };
        // A whole response past MAX_RESPONSE_BYTES: declared, or only streamed (no length).
        let big = vec![b' '; MAX_RESPONSE_BYTES + 1];
        let declared = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            big.len()
        );
        let err = send(raw_server(declared, big.clone()).await)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LlmError::BadResponse(m) if m.contains("too large")),
            "{err:?}"
        );
        let undeclared =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
        let err = send(raw_server(undeclared.into(), big).await)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, LlmError::BadResponse(m) if m.contains("too large")),
            "{err:?}"
        );
        // A JSON body within it is read.
        let ok = send(raw_server(undeclared.into(), br#"{"ok": true}"#.to_vec()).await)
            .await
            .unwrap();
        assert_eq!(ok["ok"], true);
        // A 400 whose body is past MAX_ERROR_BODY_BYTES: refused without its message.
        let mut body = br#"{"error": {"message": "#.to_vec();
        body.extend(std::iter::repeat_n(b'x', MAX_ERROR_BODY_BYTES));
        let head = "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
        match send(raw_server(head.into(), body).await).await.unwrap_err() {
            LlmError::Refused(m) => assert_eq!(m, "a refusal too large to read"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arguments_past_their_limit_are_kept_as_a_longer_string() {
        let mut a = Arguments::default();
        for piece in ["{\"note\": \"", &"x".repeat(300), "\"}"] {
            a.push(piece, 256);
        }
        let Value::String(kept) = a.value() else {
            panic!("a string");
        };
        assert_eq!(kept.len(), 257);
        let mut a = Arguments::default();
        a.push("{\"a\":", 256);
        a.push("1}", 256);
        assert_eq!(a.value(), serde_json::json!({"a": 1}));
        assert_eq!(Arguments::default().value(), serde_json::json!({}));
    }

    #[test]
    fn a_400_naming_tool_search_is_told_apart() {
        let refused = |m: &str| LlmError::Refused(refusal_message(m));
        assert!(refuses_tool_search(&refused(
            r#"{"error": {"type": "invalid_request_error", "message": "Unknown parameter: 'tools[3].defer_loading'."}}"#
        )));
        assert!(refuses_tool_search(&refused(
            r#"{"type": "error", "error": {"type": "invalid_request_error", "message": "tools.0: Input tag 'tool_search_tool_bm25_20251119' found using 'type' does not match any of the expected tags"}}"#
        )));
        assert!(!refuses_tool_search(&refused(
            r#"{"error": {"message": "max_tokens: must be at most 8192"}}"#
        )));
        assert!(!refuses_tool_search(&LlmError::Upstream(500)));
        let long = refusal_message(&"x".repeat(5000));
        assert_eq!(long.chars().count(), MAX_REFUSAL_CHARS);
    }

    #[test]
    fn wire_names_round_trip() {
        let tools = vec![ToolSpec {
            name: "invoice.get".into(),
            description: String::new(),
            input_schema: Value::Null,
            read_only: true,
            danger: "safe".into(),
            requires_approval: false,
            server: None,
            title: None,
            namespace: None,
            deferred: false,
        }];
        assert_eq!(wire_name("invoice.get"), "invoice__get");
        assert_eq!(tool_name_from_wire("invoice__get", &tools), "invoice.get");
        assert_eq!(tool_name_from_wire("admin__drop", &tools), "admin.drop");
        assert_eq!(parse_arguments("{\"a\":1}"), serde_json::json!({"a": 1}));
        assert_eq!(
            parse_arguments("not json"),
            Value::String("not json".into())
        );
    }
}
