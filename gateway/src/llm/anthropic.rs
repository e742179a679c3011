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

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{
    open_stream, refuses_tool_search, tool_name_from_wire, wire_name, Arguments, ChatModel,
    Completion, Endpoint, LlmError, Message, Reply, StreamLimits, ToolCall, ToolSpec,
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

    /// One request, streamed: the response as the Messages API would have given it whole (read
    /// from its events, or whole from an endpoint that ignores `stream`), its text sent to `text`
    /// as it comes.
    async fn send(
        &self,
        body: &Value,
        limits: &StreamLimits,
        text: &mpsc::Sender<String>,
    ) -> Result<Value, LlmError> {
        let url = format!("{}/v1/messages", self.endpoint.base_url);
        let mut body = body.clone();
        body["stream"] = Value::Bool(true);
        let read = async {
            let reply = open_stream(
                || {
                    let r = self
                        .endpoint
                        .client
                        .post(&url)
                        .header("anthropic-version", "2023-06-01")
                        .json(&body);
                    match &self.endpoint.api_key {
                        Some(k) => r.header("x-api-key", k),
                        None => r,
                    }
                },
                self.endpoint.timeout,
                limits.max_bytes,
            )
            .await?;
            let mut events = match reply {
                Reply::Json(resp) => {
                    for b in resp
                        .get("content")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(t) = b.get("text").and_then(Value::as_str) {
                            if b["type"] == "text" && !t.is_empty() {
                                let _ = text.send(t.to_string()).await;
                            }
                        }
                    }
                    return Ok(resp);
                }
                Reply::Events(events) => events,
            };
            let mut stream = MessageStream::default();
            while let Some(event) = events.next().await {
                let piece = stream.read(&event?.data, limits)?;
                if !piece.is_empty() {
                    let _ = text.send(piece).await;
                }
                if stream.stopped {
                    break;
                }
            }
            stream.response()
        };
        tokio::time::timeout(self.endpoint.timeout, read)
            .await
            .map_err(|_| LlmError::Timeout)?
    }
}

/// A Messages stream (`"stream": true`) as it is read: each content block assembled from its
/// deltas until its `content_block_stop`, then kept whole.
#[derive(Debug, Default)]
pub struct MessageStream {
    open: BTreeMap<u64, (Value, Arguments)>,
    done: BTreeMap<u64, Value>,
    tool_calls: usize,
    stop_reason: Option<String>,
    stopped: bool,
}

impl MessageStream {
    /// Read one event's data; returns the text it adds (empty for none).
    pub fn read(&mut self, data: &str, limits: &StreamLimits) -> Result<String, LlmError> {
        let event: Value = serde_json::from_str(data)
            .map_err(|_| LlmError::BadResponse("an event that is not JSON".into()))?;
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        match event.get("type").and_then(Value::as_str) {
            Some("content_block_start") => {
                let block = event.get("content_block").cloned().unwrap_or(Value::Null);
                if self.open.contains_key(&index) || self.done.contains_key(&index) {
                    return Err(LlmError::BadResponse("a content block twice".into()));
                }
                if block["type"] == "tool_use" {
                    self.tool_calls += 1;
                    if self.tool_calls > limits.max_tool_calls {
                        return Err(LlmError::BadResponse("too many tool calls".into()));
                    }
                }
                let text = match (block["type"].as_str(), block["text"].as_str()) {
                    (Some("text"), Some(t)) => t.to_string(),
                    _ => String::new(),
                };
                self.open.insert(index, (block, Arguments::default()));
                Ok(text)
            }
            Some("content_block_delta") => {
                let Some((block, args)) = self.open.get_mut(&index) else {
                    return Err(LlmError::BadResponse("a delta of no open block".into()));
                };
                let delta = &event["delta"];
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") if block["type"] == "text" => {
                        let t = delta["text"].as_str().unwrap_or_default();
                        let mut all = block["text"].as_str().unwrap_or_default().to_string();
                        all.push_str(t);
                        block["text"] = Value::String(all);
                        Ok(t.to_string())
                    }
                    Some("input_json_delta") => {
                        let piece = delta["partial_json"].as_str().unwrap_or_default();
                        args.push(piece, limits.max_argument_bytes);
                        Ok(String::new())
                    }
                    // Citations, thinking and signatures stay with the provider.
                    _ => Ok(String::new()),
                }
            }
            Some("content_block_stop") => {
                let Some((mut block, args)) = self.open.remove(&index) else {
                    return Err(LlmError::BadResponse("a stop of no open block".into()));
                };
                if !args.is_empty() {
                    block["input"] = args.value();
                }
                self.done.insert(index, block);
                Ok(String::new())
            }
            Some("message_delta") => {
                if let Some(r) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(r.to_string());
                }
                Ok(String::new())
            }
            Some("message_stop") => {
                self.stopped = true;
                Ok(String::new())
            }
            Some("error") => Err(LlmError::BadResponse(
                "the provider sent an error event".into(),
            )),
            // message_start, ping and events added later.
            _ => Ok(String::new()),
        }
    }

    /// The response as the API gives it whole, once the stream has ended; a stream cut before
    /// its `message_stop`, or with a block left open, is an error.
    pub fn response(self) -> Result<Value, LlmError> {
        if !self.stopped || !self.open.is_empty() {
            return Err(LlmError::BadResponse("the stream ended early".into()));
        }
        Ok(json!({
            "content": self.done.into_values().collect::<Vec<_>>(),
            "stop_reason": self.stop_reason,
        }))
    }
}

impl Anthropic {
    /// One model step with its text streamed (see [`ChatModel::stream`]).
    async fn step(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        limits: StreamLimits,
        text: mpsc::Sender<String>,
    ) -> Result<Completion, LlmError> {
        let mut search =
            self.tool_search.load(Ordering::Relaxed) && tools.iter().any(|t| t.deferred);
        let mut body = request_body(&self.endpoint.model, messages, tools, search);
        let mut resp = match self.send(&body, &limits, &text).await {
            Err(e) if search && refuses_tool_search(&e) => {
                tracing::warn!(error = %e, "the Anthropic endpoint refuses tool search: deferred tools are left out from now on");
                self.tool_search.store(false, Ordering::Relaxed);
                search = false;
                body = request_body(&self.endpoint.model, messages, tools, false);
                self.send(&body, &limits, &text).await?
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
            resp = self.send(&body, &limits, &text).await?;
        }
        Ok(out)
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
        // Nobody listens: the text is only in the completion.
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        self.step(messages, tools, StreamLimits::default(), tx)
            .await
    }

    async fn stream(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        limits: StreamLimits,
        text: mpsc::Sender<String>,
    ) -> Result<Completion, LlmError> {
        self.step(messages, tools, limits, text).await
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

    fn limits() -> StreamLimits {
        StreamLimits {
            max_argument_bytes: 1024,
            ..StreamLimits::default()
        }
    }

    fn read_all(stream: &mut MessageStream, data: &[String]) -> Result<String, LlmError> {
        let mut text = String::new();
        for d in data {
            text.push_str(&stream.read(d, &limits())?);
        }
        Ok(text)
    }

    #[test]
    fn a_recorded_stream_gives_its_text_in_pieces_and_its_tool_call_once_whole() {
        let data = crate::llm::tests::sse_data(&crate::llm::tests::sse_fixture(
            "anthropic_messages_stream.sse",
        ));
        let mut stream = MessageStream::default();
        assert_eq!(read_all(&mut stream, &data).unwrap(), "Let me check.");
        let tools = vec![spec("invoice.get", false), spec("invoice.mark_paid", true)];
        let mut out = Completion::default();
        read_response(&stream.response().unwrap(), &tools, &mut out).unwrap();
        assert_eq!(out.text, "Let me check.");
        assert_eq!(
            out.tool_calls,
            [ToolCall {
                id: "toolu_01".into(),
                name: "invoice.mark_paid".into(),
                arguments: json!({"note": "paid by wire"}),
            }]
        );
    }

    #[test]
    fn server_blocks_stream_through_to_provider_items() {
        let recorded = fixture("anthropic_tool_search.json");
        let blocks = recorded["response"]["content"].as_array().unwrap();
        let mut data = Vec::new();
        for (i, b) in blocks.iter().enumerate() {
            // Each block starts empty where the API streams it, and is filled by deltas.
            let mut start = b.clone();
            let mut deltas = Vec::new();
            match b["type"].as_str() {
                Some("text") => {
                    start["text"] = json!("");
                    for piece in b["text"].as_str().unwrap().split_inclusive(' ') {
                        deltas.push(json!({"type": "text_delta", "text": piece}));
                    }
                }
                Some("tool_use" | "server_tool_use") => {
                    start["input"] = json!({});
                    let input = b["input"].to_string();
                    for piece in input.as_bytes().chunks(3) {
                        deltas.push(json!({"type": "input_json_delta", "partial_json": String::from_utf8(piece.to_vec()).unwrap()}));
                    }
                }
                _ => {}
            }
            data.push(
                json!({"type": "content_block_start", "index": i, "content_block": start})
                    .to_string(),
            );
            for d in deltas {
                data.push(
                    json!({"type": "content_block_delta", "index": i, "delta": d}).to_string(),
                );
            }
            data.push(json!({"type": "content_block_stop", "index": i}).to_string());
        }
        data.push(json!({"type": "message_delta", "delta": {"stop_reason": recorded["response"]["stop_reason"]}}).to_string());
        data.push(json!({"type": "message_stop"}).to_string());
        let mut stream = MessageStream::default();
        read_all(&mut stream, &data).unwrap();
        let tools = vec![spec("invoice.get", false), spec("invoice.mark_paid", true)];
        let (mut streamed, mut whole) = (Completion::default(), Completion::default());
        read_response(&stream.response().unwrap(), &tools, &mut streamed).unwrap();
        read_response(&recorded["response"], &tools, &mut whole).unwrap();
        assert_eq!(streamed.text, whole.text);
        assert_eq!(streamed.tool_calls, whole.tool_calls);
        assert_eq!(streamed.provider_items, whole.provider_items);
        assert!(!streamed.provider_items.is_empty());
    }

    #[test]
    fn broken_or_oversized_streams_fail() {
        let data = crate::llm::tests::sse_data(&crate::llm::tests::sse_fixture(
            "anthropic_messages_stream.sse",
        ));
        // Cut anywhere before message_stop.
        for cut in 0..data.len() - 1 {
            let mut stream = MessageStream::default();
            let _ = read_all(&mut stream, &data[..cut]);
            assert!(stream.response().is_err(), "cut at {cut}");
        }
        // An error event.
        let mut stream = MessageStream::default();
        let mut broken = data[..4].to_vec();
        broken.push(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}).to_string());
        assert!(read_all(&mut stream, &broken).is_err());
        // A delta of a block never opened, a block opened twice.
        let mut stream = MessageStream::default();
        assert!(stream
            .read(r#"{"type":"content_block_delta","index":5,"delta":{"type":"text_delta","text":"x"}}"#, &limits())
            .is_err());
        let mut stream = MessageStream::default();
        let start =
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
        stream.read(start, &limits()).unwrap();
        assert!(stream.read(start, &limits()).is_err());
        // More tool calls than the cap.
        let few = StreamLimits {
            max_tool_calls: 2,
            ..limits()
        };
        let mut stream = MessageStream::default();
        let result: Result<Vec<String>, LlmError> = (0..3)
            .map(|i| stream.read(&json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": format!("t{i}"), "name": "vendor__list", "input": {}}}).to_string(), &few))
            .collect();
        assert!(result.is_err());
    }

    #[tokio::test]
    async fn over_http_text_streams_and_a_dropped_connection_fails() {
        use crate::llm::tests::{raw_server, sse_fixture, sse_head};
        let body = sse_fixture("anthropic_messages_stream.sse").into_bytes();
        let url = raw_server(sse_head(), body.clone()).await;
        let model = Anthropic::new(&url, None, "claude-test", Duration::from_secs(5));
        let tools = vec![spec("invoice.get", false), spec("invoice.mark_paid", false)];
        let (tx, mut rx) = mpsc::channel(64);
        let out = model
            .stream(&messages(), &tools, limits(), tx)
            .await
            .unwrap();
        let mut pieces = Vec::new();
        while let Some(p) = rx.recv().await {
            pieces.push(p);
        }
        assert_eq!(pieces, ["Let me ", "check."]);
        assert_eq!(out.tool_calls[0].arguments, json!({"note": "paid by wire"}));
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let url = raw_server(head, body[..body.len() / 2].to_vec()).await;
        let model = Anthropic::new(&url, None, "claude-test", Duration::from_secs(5));
        let (tx, _rx) = mpsc::channel(64);
        assert!(model
            .stream(&messages(), &tools, limits(), tx)
            .await
            .is_err());
    }
}
