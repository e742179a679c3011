//! Anthropic Messages API with tools.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{
    send_with_retry, tool_name_from_wire, wire_name, ChatModel, Completion, Endpoint, LlmError,
    Message, ToolCall, ToolSpec,
};

pub struct Anthropic(pub Endpoint);

impl Anthropic {
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        model: &str,
        timeout: Duration,
    ) -> Anthropic {
        Anthropic(Endpoint::new(base_url, api_key, model, timeout))
    }
}

#[async_trait]
impl ChatModel for Anthropic {
    fn provider(&self) -> &'static str {
        "anthropic"
    }

    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
    ) -> Result<Completion, LlmError> {
        let system: Vec<&str> = messages
            .iter()
            .filter_map(|m| {
                if let Message::System(s) = m {
                    Some(s.as_str())
                } else {
                    None
                }
            })
            .collect();
        let wire: Vec<Value> = messages
            .iter()
            .filter_map(|m| match m {
                Message::System(_) => None,
                Message::User(t) => Some(json!({"role": "user", "content": t})),
                Message::Assistant { text, tool_calls, .. } => {
                    let mut content: Vec<Value> = Vec::new();
                    if !text.is_empty() {
                        content.push(json!({"type": "text", "text": text}));
                    }
                    for c in tool_calls {
                        content.push(json!({"type": "tool_use", "id": c.id, "name": wire_name(&c.name), "input": c.arguments}));
                    }
                    Some(json!({"role": "assistant", "content": content}))
                }
                Message::Tool { call_id, content, .. } => Some(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": call_id, "content": content}]})),
            })
            .collect();
        let mut body = json!({"model": self.0.model, "max_tokens": 1024, "system": system.join("\n\n"), "messages": wire});
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|t| json!({"name": wire_name(&t.name), "description": t.description, "input_schema": t.input_schema}))
                .collect();
        }
        let url = format!("{}/v1/messages", self.0.base_url);
        let resp = send_with_retry(
            || {
                let r = self
                    .0
                    .client
                    .post(&url)
                    .header("anthropic-version", "2023-06-01")
                    .json(&body);
                match &self.0.api_key {
                    Some(k) => r.header("x-api-key", k),
                    None => r,
                }
            },
            self.0.timeout,
        )
        .await?;
        let blocks = resp
            .get("content")
            .and_then(Value::as_array)
            .ok_or_else(|| LlmError::BadResponse("no content".into()))?;
        let mut out = Completion::default();
        for b in blocks {
            match b.get("type").and_then(Value::as_str) {
                Some("text") => out
                    .text
                    .push_str(b.get("text").and_then(Value::as_str).unwrap_or_default()),
                Some("tool_use") => out.tool_calls.push(ToolCall {
                    id: b
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    name: tool_name_from_wire(
                        b.get("name").and_then(Value::as_str).unwrap_or_default(),
                        tools,
                    ),
                    arguments: b.get("input").cloned().unwrap_or(Value::Null),
                }),
                _ => {}
            }
        }
        Ok(out)
    }
}
