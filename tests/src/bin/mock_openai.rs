//! `mock_openai`: a tiny, fast, stateless OpenAI-compatible chat completions server for benchmarks
//! (`bench/gateway_bench.sh`). It never sleeps and keeps no script:
//!
//! - `POST /v1/chat/completions` whose `messages` hold no `role: "tool"` message: one tool call,
//!   `MOCK_OPENAI_TOOL` (wire name, default `vendor__list`, the demo's `vendor.list`) with
//!   `MOCK_OPENAI_ARGS` (a JSON object, default `{}`);
//! - with a tool message: a short final answer.
//!
//! Usage: `mock_openai [LISTEN]` (default `127.0.0.1:18089`, or `MOCK_OPENAI_LISTEN`).
//! With `MOCK_OPENAI_CAPTURE=DIR` it writes the first body of each kind it receives to
//! `DIR/step1.json` (tool-call step) and `DIR/step2.json` (final step), so that a benchmark can send
//! the mock exactly what the gateway sends. One thread (`current_thread` runtime): the work per
//! request is a few microseconds, and the benchmark machine has few cores to share.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

struct Mock {
    /// The step-1 answer, serialised once.
    tool_call: Bytes,
    /// The step-2 answer, serialised once.
    answer: Bytes,
    capture: Option<PathBuf>,
    captured: [AtomicBool; 2],
}

impl Mock {
    fn capture(&self, step: usize, body: &[u8]) {
        let Some(dir) = &self.capture else { return };
        if !self.captured[step].swap(true, Ordering::Relaxed) {
            let path = dir.join(format!("step{}.json", step + 1));
            if let Err(e) = std::fs::write(&path, body) {
                eprintln!("mock_openai: cannot write {}: {e}", path.display());
            }
        }
    }
}

fn json_response(body: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn completions(State(mock): State<Arc<Mock>>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")).into_response(),
    };
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return (StatusCode::BAD_REQUEST, "messages is required").into_response();
    };
    let has_tool_result = messages
        .iter()
        .any(|m| m.get("role").and_then(Value::as_str) == Some("tool"));
    if has_tool_result {
        mock.capture(1, &body);
        json_response(mock.answer.clone())
    } else {
        mock.capture(0, &body);
        json_response(mock.tool_call.clone())
    }
}

async fn health() -> &'static str {
    "ok"
}

fn main() {
    let listen = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("MOCK_OPENAI_LISTEN").ok())
        .unwrap_or_else(|| "127.0.0.1:18089".to_string());
    let tool = std::env::var("MOCK_OPENAI_TOOL").unwrap_or_else(|_| "vendor__list".to_string());
    let args = std::env::var("MOCK_OPENAI_ARGS").unwrap_or_else(|_| "{}".to_string());
    if !matches!(serde_json::from_str::<Value>(&args), Ok(Value::Object(_))) {
        eprintln!("mock_openai: MOCK_OPENAI_ARGS must be a JSON object");
        std::process::exit(2);
    }
    let tool_call = json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "model": "mock",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "call_mock_0", "type": "function",
                            "function": {"name": tool, "arguments": args}}]}}],
    });
    let answer = json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "model": "mock",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": "Here is what the tool returned."}}],
    });
    let mock = Arc::new(Mock {
        tool_call: Bytes::from(tool_call.to_string()),
        answer: Bytes::from(answer.to_string()),
        capture: std::env::var_os("MOCK_OPENAI_CAPTURE").map(PathBuf::from),
        captured: [AtomicBool::new(false), AtomicBool::new(false)],
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/health", get(health))
        .with_state(mock);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(&listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("mock_openai: cannot listen on {listen}: {e}");
                std::process::exit(2);
            }
        };
        eprintln!("mock_openai: listening on {listen}");
        let shutdown = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            eprintln!("mock_openai: {e}");
            std::process::exit(1);
        }
    });
}
