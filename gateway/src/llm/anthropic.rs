//! Anthropic Messages API with tools, and Anthropic's own tool search for deferred tools.
//!
//! Tools the loop marks deferred ([`ToolSpec::deferred`]) go out with `"defer_loading": true`
//! beside the tool search server tool ([`TOOL_SEARCH_TYPE`], BM25: the model searches in plain
//! words). Anthropic then searches only the tools of this request, which are the ones Gate A
//! listed; a tool it finds comes back as an ordinary `tool_use`, which runs through Gate B like
//! any other. The search itself (`server_tool_use`, `tool_search_tool_result` with its
//! `tool_reference`s) comes back as [`Completion::provider_items`] and is sent back with the step,
//! so that the tools it loaded stay loaded. With no deferred tool the request is what it always
//! was. An endpoint or model without tool search (a `400` naming it) gets the same request again
//! with the deferred tools left out, and so does every later request of this provider.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{
    refuses_tool_search, send_with_retry, tool_name_from_wire, wire_name, ChatModel, Completion,
    Endpoint, LlmError, Message, ToolCall, ToolSpec,
};

/// The tool search server tool: its type and the name it must have (`ToolSearchToolBm25_20251119Param`
/// in anthropic-sdk-python; generally available, no beta header).
pub const TOOL_SEARCH_TYPE: &str = "tool_search_tool_bm25_20251119";
pub const TOOL_SEARCH_NAME: &str = "tool_search_tool_bm25";
/// The block type of a tool search result as requests accept it.
const TOOL_SEARCH_RESULT: &str = "tool_search_tool_result";
/// How many times one step is continued after `stop_reason: "pause_turn"` (the API paused its own
/// server-tool loop and asks to be sent the conversation again).
const MAX_CONTINUATIONS: usize = 2;

pub struct Anthropic {
    endpoint: Endpoint,
    /// Cleared for good when the endpoint refuses tool search.
    tool_search: AtomicBool,
}

impl Anthropic {
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        model: &str,
        timeout: Duration,
    ) -> Anthropic {
        Anthropic {
            endpoint: Endpoint::new(base_url, api_key, model, timeout),
            tool_search: AtomicBool::new(true),
        }
    }

    async fn send(&self, body: &Value) -> Result<Value, LlmError> {
        let url = format!("{}/v1/messages", self.endpoint.base_url);
        send_with_retry(
            || {
                let r = self
                    .endpoint
                    .client
                    .post(&url)
                    .header("anthropic-version", "2023-06-01")
                    .json(body);
                match &self.endpoint.api_key {
                    Some(k) => r.header("x-api-key", k),
                    None => r,
                }
            },
            self.endpoint.timeout,
        )
        .await
    }
}

/// The tool definitions of one request. With `search`, deferred tools carry `defer_loading` and
/// the tool search tool comes first; without, deferred tools are left out. No deferred tool: the
/// definitions as they always were.
fn wire_tools(tools: &[ToolSpec], search: bool) -> Vec<Value> {
    let search = search && tools.iter().any(|t| t.deferred);
    let mut out: Vec<Value> = Vec::new();
    if search {
        out.push(json!({"type": TOOL_SEARCH_TYPE, "name": TOOL_SEARCH_NAME}));
    }
    for t in tools.iter().filter(|t| search || !t.deferred) {
        let mut tool = json!({"name": wire_name(&t.name), "description": t.description, "input_schema": t.input_schema});
        if t.deferred {
            tool["defer_loading"] = Value::Bool(true);
        }
        out.push(tool);
    }
    out
}

/// The request body of one step. `search`: whether tool search is in use for this provider (the
/// server blocks of earlier steps are sent back only then).
pub fn request_body(model: &str, messages: &[Message], tools: &[ToolSpec], search: bool) -> Value {
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
            Message::Assistant {
                text,
                tool_calls,
                provider_items,
            } => {
                let mut content: Vec<Value> = Vec::new();
                if !text.is_empty() {
                    content.push(json!({"type": "text", "text": text}));
                }
                if search {
                    content.extend(provider_items.iter().cloned());
                }
                for c in tool_calls {
                    content.push(json!({"type": "tool_use", "id": c.id, "name": wire_name(&c.name), "input": c.arguments}));
                }
                Some(json!({"role": "assistant", "content": content}))
            }
            Message::Tool {
                call_id, content, ..
            } => Some(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": content}]})),
        })
        .collect();
    let mut body = json!({"model": model, "max_tokens": 1024, "system": system.join("\n\n"), "messages": wire});
    let tools = wire_tools(tools, search);
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    body
}

/// A server block to keep for the next request, in the shape requests accept
/// (`ServerToolUseBlockParam`, `ToolSearchToolResultBlockParam`), or `None` for any other block.
fn server_block(block: &Value) -> Option<Value> {
    let kind = block.get("type").and_then(Value::as_str)?;
    if kind == "server_tool_use" {
        return Some(json!({
            "type": "server_tool_use",
            "id": block.get("id").cloned().unwrap_or(Value::Null),
            "name": block.get("name").cloned().unwrap_or(Value::Null),
            "input": block.get("input").cloned().unwrap_or_else(|| json!({})),
        }));
    }
    // The documented type is `tool_search_tool_result`; a variant-named one
    // (`tool_search_tool_bm25_tool_result`) is kept under the documented name.
    if kind.starts_with("tool_search_tool") && kind.ends_with("_result") {
        return Some(json!({
            "type": TOOL_SEARCH_RESULT,
            "tool_use_id": block.get("tool_use_id").cloned().unwrap_or(Value::Null),
            "content": block.get("content").cloned().unwrap_or(Value::Null),
        }));
    }
    None
}

/// Read one response into `out`. Returns whether the API paused its turn (`pause_turn`).
pub fn read_response(
    resp: &Value,
    tools: &[ToolSpec],
    out: &mut Completion,
) -> Result<bool, LlmError> {
    let blocks = resp
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| LlmError::BadResponse("no content".into()))?;
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
            _ => out.provider_items.extend(server_block(b)),
        }
    }
    Ok(resp.get("stop_reason").and_then(Value::as_str) == Some("pause_turn"))
}

#[async_trait]
impl ChatModel for Anthropic {
    fn provider(&self) -> &'static str {
        "anthropic"
    }

    /// Until the endpoint refuses tool search (then deferred tools are left out: the compact
    /// list's `find_tools` still reaches them).
    fn native_tool_search(&self) -> bool {
        self.tool_search.load(Ordering::Relaxed)
    }

    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
    ) -> Result<Completion, LlmError> {
        let mut search =
            self.tool_search.load(Ordering::Relaxed) && tools.iter().any(|t| t.deferred);
        let mut body = request_body(&self.endpoint.model, messages, tools, search);
        let mut resp = match self.send(&body).await {
            Err(e) if search && refuses_tool_search(&e) => {
                tracing::warn!(error = %e, "the Anthropic endpoint refuses tool search: deferred tools are left out from now on");
                self.tool_search.store(false, Ordering::Relaxed);
                search = false;
                body = request_body(&self.endpoint.model, messages, tools, false);
                self.send(&body).await?
            }
            r => r?,
        };
        let asked = body["messages"].as_array().map_or(0, Vec::len);
        let mut out = Completion::default();
        for continuation in 0..=MAX_CONTINUATIONS {
            let paused = read_response(&resp, tools, &mut out)?;
            if !paused || !out.tool_calls.is_empty() || continuation == MAX_CONTINUATIONS {
                break;
            }
            // Continue the paused turn: the conversation again, with what it said so far.
            let mut content: Vec<Value> = Vec::new();
            if !out.text.is_empty() {
                content.push(json!({"type": "text", "text": out.text}));
            }
            if search {
                content.extend(out.provider_items.iter().cloned());
            }
            if let Some(wire) = body["messages"].as_array_mut() {
                wire.truncate(asked);
                wire.push(json!({"role": "assistant", "content": content}));
            }
            resp = self.send(&body).await?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::tests::{fixture, spec};

    fn messages() -> Vec<Message> {
        vec![
            Message::System("You are on invoice_detail.".into()),
            Message::User("pay this invoice".into()),
        ]
    }

    #[test]
    fn without_deferred_tools_the_request_is_as_before() {
        let tools = vec![spec("invoice.get", false), spec("vendor.list", false)];
        let body = request_body("claude-test", &messages(), &tools, true);
        assert_eq!(
            body["tools"],
            json!([
                {"name": "invoice__get", "description": "invoice.get does it", "input_schema": tools[0].input_schema},
                {"name": "vendor__list", "description": "vendor.list does it", "input_schema": tools[1].input_schema},
            ])
        );
        assert!(!body.to_string().contains("defer_loading"));
        assert!(!body.to_string().contains("tool_search"));
    }

    #[test]
    fn deferred_tools_go_out_for_tool_search_as_the_recorded_request_has_them() {
        let recorded = fixture("anthropic_tool_search.json");
        let tools = vec![spec("invoice.get", false), spec("invoice.mark_paid", true)];
        let body = request_body("claude-test", &messages(), &tools, true);
        let wire = body["tools"].as_array().unwrap();
        let search = &wire[0];
        // The search tool exactly as the recorded request has it, and never deferred.
        assert_eq!(*search, recorded["request"]["tools"][0]);
        let schema = &recorded["request_schema"];
        assert!(schema["search_tool_types"]
            .as_array()
            .unwrap()
            .contains(&search["type"]));
        for k in schema["search_tool_required"].as_array().unwrap() {
            assert!(search.get(k.as_str().unwrap()).is_some(), "{k} in {search}");
        }
        assert_eq!(search.get("defer_loading"), None);
        // Every client tool has the recorded keys with their types; defer_loading only where the
        // loop deferred, and on the tool itself.
        let keys = recorded["request_schema"]["tool_required"]
            .as_array()
            .unwrap();
        for tool in &wire[1..] {
            for k in keys {
                assert!(tool.get(k.as_str().unwrap()).is_some(), "{k} in {tool}");
            }
            assert!(tool["name"].is_string() && tool["description"].is_string());
            assert!(tool["input_schema"].is_object());
        }
        assert_eq!(wire[1].get("defer_loading"), None);
        assert_eq!(wire[2]["defer_loading"], json!(true));
        assert_eq!(
            recorded["request"]["tools"][1]["defer_loading"],
            json!(true)
        );
        // Without tool search (the endpoint refused it) the deferred tools are left out.
        let fallback = request_body("claude-test", &messages(), &tools, false);
        assert_eq!(fallback["tools"].as_array().unwrap().len(), 1);
        assert_eq!(fallback["tools"][0]["name"], "invoice__get");
        assert!(!fallback.to_string().contains("tool_search"));
    }

    #[test]
    fn a_recorded_search_then_deferred_call_reads_as_one_tool_call_and_goes_back_as_it_came() {
        let recorded = fixture("anthropic_tool_search.json");
        let tools = vec![spec("invoice.get", false), spec("invoice.mark_paid", true)];
        let mut out = Completion::default();
        let paused = read_response(&recorded["response"], &tools, &mut out).unwrap();
        assert!(!paused);
        assert_eq!(
            out.tool_calls,
            [ToolCall {
                id: "toolu_01XYZ789".into(),
                name: "invoice.mark_paid".into(),
                arguments: json!({"note": "paid by wire"}),
            }]
        );
        assert!(out.text.contains("search"));
        let kinds: Vec<&str> = out
            .provider_items
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["server_tool_use", "tool_search_tool_result"]);
        let schema = &recorded["request_schema"];
        for (item, required) in out.provider_items.iter().zip([
            "server_tool_use_required",
            "tool_search_tool_result_required",
        ]) {
            for k in schema[required].as_array().unwrap() {
                assert!(item.get(k.as_str().unwrap()).is_some(), "{k} in {item}");
            }
        }
        // The next request carries the search back before the tool_use, then the tool_result.
        let mut history = messages();
        history.push(Message::Assistant {
            text: out.text.clone(),
            tool_calls: out.tool_calls.clone(),
            provider_items: out.provider_items.clone(),
        });
        history.push(Message::Tool {
            call_id: "toolu_01XYZ789".into(),
            name: "invoice.mark_paid".into(),
            content: "{\"status\":\"ok\"}".into(),
        });
        let next = request_body("claude-test", &history, &tools, true);
        let assistant = &next["messages"][1]["content"];
        let kinds: Vec<&str> = assistant
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "text",
                "server_tool_use",
                "tool_search_tool_result",
                "tool_use"
            ]
        );
        // The server blocks go back exactly as the recorded response had them.
        assert_eq!(assistant[1], recorded["response"]["content"][1]);
        assert_eq!(assistant[2], recorded["response"]["content"][2]);
        assert_eq!(assistant[3]["name"], "invoice__mark_paid");
        assert_eq!(next["messages"][2]["content"][0]["type"], "tool_result");
        // A provider that no longer searches does not send the search back.
        let fallback = request_body("claude-test", &history, &tools, false);
        assert!(!fallback.to_string().contains("server_tool_use"));
    }

    /// A fake Messages endpoint: answers in order, keeps every request body.
    async fn fake(
        answers: Vec<(u16, Value)>,
    ) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
        use std::sync::{Arc, Mutex};
        let answers = Arc::new(Mutex::new(std::collections::VecDeque::from(answers)));
        let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
        let kept = seen.clone();
        let app = axum::Router::new().route(
            "/v1/messages",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let (answers, seen) = (answers.clone(), seen.clone());
                async move {
                    seen.lock().unwrap().push(body);
                    let (status, body) = answers.lock().unwrap().pop_front().unwrap();
                    (
                        axum::http::StatusCode::from_u16(status).unwrap(),
                        axum::Json(body),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), kept)
    }

    #[tokio::test]
    async fn a_refused_search_is_dropped_for_good_and_a_paused_turn_is_continued() {
        let refused = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "tools.0: tool_search_tool_bm25_20251119 is not supported on this model"}});
        let paused =
            json!({"content": [{"type": "text", "text": "Looking"}], "stop_reason": "pause_turn"});
        let call = json!({"content": [{"type": "tool_use", "id": "t1", "name": "invoice__mark_paid", "input": {}}],
            "stop_reason": "tool_use"});
        let (url, seen) = fake(vec![(400, refused), (200, paused), (200, call)]).await;
        let model = Anthropic::new(&url, None, "claude-test", Duration::from_secs(5));
        let tools = vec![spec("invoice.get", false), spec("invoice.mark_paid", true)];
        let out = model.complete(&messages(), &tools).await.unwrap();
        assert_eq!(out.text, "Looking");
        assert_eq!(out.tool_calls[0].name, "invoice.mark_paid");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert!(seen[0].to_string().contains("defer_loading"));
        // Sent again without the deferred tool, and continued with what it said so far.
        for again in &seen[1..] {
            assert!(!again.to_string().contains("tool_search"), "{again}");
            assert_eq!(again["tools"].as_array().unwrap().len(), 1);
        }
        assert_eq!(seen[1]["messages"].as_array().unwrap().len(), 1);
        assert_eq!(
            seen[2]["messages"][1],
            json!({"role": "assistant", "content": [{"type": "text", "text": "Looking"}]})
        );
        assert!(!model.tool_search.load(Ordering::Relaxed));
    }

    #[test]
    fn a_name_that_was_never_sent_is_decoded_for_the_database_to_judge() {
        let tools = vec![spec("invoice.get", false)];
        let resp = json!({"content": [{"type": "tool_use", "id": "t1", "name": "vendor__list", "input": {}}], "stop_reason": "tool_use"});
        let mut out = Completion::default();
        read_response(&resp, &tools, &mut out).unwrap();
        assert_eq!(out.tool_calls[0].name, "vendor.list");
    }

    #[test]
    fn variant_named_results_are_kept_under_the_documented_name() {
        let block = json!({"type": "tool_search_tool_bm25_tool_result", "tool_use_id": "srvtoolu_1",
            "content": {"type": "tool_search_tool_search_result", "tool_references": []}, "extra": 1});
        let kept = server_block(&block).unwrap();
        assert_eq!(kept["type"], "tool_search_tool_result");
        assert_eq!(kept.get("extra"), None);
        assert!(server_block(&json!({"type": "thinking", "thinking": "x"})).is_none());
    }
}
