//! Model providers behind one trait. The gateway never trusts a model: every tool call it asks for
//! goes through `ctxguard.call_tool` in the database.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod anthropic;
pub mod offline;
pub mod openai;

/// A tool as Gate A showed it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub read_only: bool,
    pub danger: String,
    pub requires_approval: bool,
    /// The upstream MCP server of an external tool (`None` for database tools).
    #[serde(skip)]
    pub server: Option<String>,
    /// The catalog's title (`register_tool`'s `title`), if any.
    #[serde(skip)]
    pub title: Option<String>,
    /// The tool's namespace (`visible_tools`' column: its name's first segment, or its upstream
    /// server); `None` for the gateway's own `find_tools`.
    #[serde(skip)]
    pub namespace: Option<String>,
    /// Beyond the tool budget and not offered directly (`compact.rs`): a provider with native tool
    /// search may send it deferred (loaded on demand); any other provider is not given it.
    #[serde(skip)]
    pub deferred: bool,
}

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
}

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("model request timed out")]
    Timeout,
    #[error("model upstream answered {0}")]
    Upstream(u16),
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

/// Tool names as providers accept them (`^[a-zA-Z0-9_-]{1,64}$`): dots become `__`. The mapping back
/// prefers the offered tools; any other name is decoded the same way and the database judges it
/// (an invisible tool is audited as TOOL_NOT_VISIBLE, an unknown one as TOOL_NOT_FOUND).
pub fn wire_name(name: &str) -> String {
    name.replace('.', "__")
}

pub fn tool_name_from_wire(wire: &str, tools: &[ToolSpec]) -> String {
    tools
        .iter()
        .find(|t| wire_name(&t.name) == wire)
        .map_or_else(|| wire.replace("__", "."), |t| t.name.clone())
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
                return resp
                    .json::<Value>()
                    .await
                    .map_err(|e| LlmError::BadResponse(e.without_url().to_string()));
            }
            let retryable = status.as_u16() == 429 || status.is_server_error();
            if try_no == 0 && retryable {
                let wait = resp
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map_or(Duration::from_millis(250), Duration::from_secs)
                    .min(Duration::from_secs(10));
                tokio::time::sleep(wait).await;
                continue;
            }
            return Err(LlmError::Upstream(status.as_u16()));
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
mod tests {
    use super::*;

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
