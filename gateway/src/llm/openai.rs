//! OpenAI-compatible chat completions with tools (OpenAI, vLLM, Ollama, llama.cpp server).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{
    parse_arguments, send_with_retry, tool_name_from_wire, wire_name, ChatModel, Completion,
    Endpoint, LlmError, Message, ToolCall, ToolSpec,
};

pub struct OpenAi(pub Endpoint);

impl OpenAi {
    pub fn new(base_url: &str, api_key: Option<String>, model: &str, timeout: Duration) -> OpenAi {
        OpenAi(Endpoint::new(base_url, api_key, model, timeout))
    }
}

fn wire_messages(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| match m {
            Message::System(t) => json!({"role": "system", "content": t}),
            Message::User(t) => json!({"role": "user", "content": t}),
            Message::Assistant { text, tool_calls, .. } if tool_calls.is_empty() => {
                json!({"role": "assistant", "content": text})
            }
            Message::Assistant { text, tool_calls, .. } => json!({
                "role": "assistant",
                "content": if text.is_empty() { Value::Null } else { Value::String(text.clone()) },
                "tool_calls": tool_calls.iter().map(|c| json!({
                    "id": c.id, "type": "function",
                    "function": {"name": wire_name(&c.name), "arguments": c.arguments.to_string()},
                })).collect::<Vec<_>>(),
            }),
            Message::Tool {
                call_id, content, ..
            } => json!({"role": "tool", "tool_call_id": call_id, "content": content}),
        })
        .collect()
}

#[async_trait]
impl ChatModel for OpenAi {
    fn provider(&self) -> &'static str {
        "openai"
    }

    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
    ) -> Result<Completion, LlmError> {
        let mut body = json!({"model": self.0.model, "messages": wire_messages(messages)});
        if !tools.is_empty() {
            body["tools"] = tools
                .iter()
                .map(|t| json!({"type": "function", "function": {
                    "name": wire_name(&t.name), "description": t.description, "parameters": t.input_schema}}))
                .collect();
        }
        let url = format!("{}/chat/completions", self.0.base_url);
        let resp = send_with_retry(
            || {
                let r = self.0.client.post(&url).json(&body);
                match &self.0.api_key {
                    Some(k) => r.bearer_auth(k),
                    None => r,
                }
            },
            self.0.timeout,
        )
        .await?;
        let msg = resp
            .pointer("/choices/0/message")
            .ok_or_else(|| LlmError::BadResponse("no choices[0].message".into()))?;
        let text = msg
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let tool_calls = msg
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| ToolCall {
                        id: c
                            .get("id")
                            .and_then(Value::as_str)
                            .map_or_else(|| format!("call_{i}"), str::to_string),
                        name: tool_name_from_wire(
                            c.pointer("/function/name")
                                .and_then(Value::as_str)
                                .unwrap_or_default(),
                            tools,
                        ),
                        arguments: parse_arguments(
                            c.pointer("/function/arguments")
                                .and_then(Value::as_str)
                                .unwrap_or("{}"),
                        ),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Completion {
            text,
            tool_calls,
            ..Completion::default()
        })
    }
}
