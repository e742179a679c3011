//! OpenAI-compatible models with tools: Chat Completions (OpenAI, vLLM, Ollama, llama.cpp server),
//! or OpenAI's Responses API with its hosted tool search (`CTXGUARD_OPENAI_API`).
//!
//! Deferred tools ([`ToolSpec::deferred`]): Chat Completions has no tool search, so they are left
//! out (the loop's `find_tools` reaches them). The Responses API gets them with
//! `"defer_loading": true`, those of a namespace (`invoice.get`, `invoice.mark_paid`) grouped in a
//! `{"type": "namespace"}` entry, beside `{"type": "tool_search"}`. OpenAI searches only the tools
//! of this request, which are the ones Gate A listed; a tool it loads comes back as an ordinary
//! `function_call`, which runs through Gate B like any other. The search (`tool_search_call`,
//! `tool_search_output`) comes back as [`Completion::provider_items`] and goes back in the next
//! request's `input`. An endpoint that refuses any of it (a `400` naming tool search,
//! `defer_loading` or namespaces) gets the request again without them, and so does every later
//! request of this provider.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{
    open_stream, parse_arguments, refuses_tool_search, send_with_retry, tool_name_from_wire,
    wire_name, Arguments, ChatModel, Completion, Endpoint, LlmError, Message, Reply, StreamLimits,
    ToolCall, ToolSpec,
};
use crate::config::OpenAiApi;

/// Most function definitions one request carries: OpenAI's documented cap ("a max of 128
/// functions"). Past it, the last-ranked deferred tools are left out first.
pub const MAX_FUNCTIONS: usize = 128;
/// The Responses API's output and input items of a tool search, sent back as they came.
const SEARCH_ITEMS: [&str; 2] = ["tool_search_call", "tool_search_output"];

pub struct OpenAi {
    endpoint: Endpoint,
    api: OpenAiApi,
    /// Cleared for good when the endpoint refuses tool search (Responses API only).
    tool_search: AtomicBool,
}

impl OpenAi {
    pub fn new(base_url: &str, api_key: Option<String>, model: &str, timeout: Duration) -> OpenAi {
        OpenAi {
            endpoint: Endpoint::new(base_url, api_key, model, timeout),
            api: OpenAiApi::Chat,
            tool_search: AtomicBool::new(true),
        }
    }

    pub fn with_api(mut self, api: OpenAiApi) -> OpenAi {
        self.api = api;
        self
    }

    /// One Chat Completions step, streamed (or read whole from an endpoint that ignores
    /// `stream`).
    async fn chat_stream(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        limits: StreamLimits,
        text: mpsc::Sender<String>,
    ) -> Result<Completion, LlmError> {
        let mut body = chat_body(&self.endpoint.model, messages, tools);
        body["stream"] = Value::Bool(true);
        let url = format!("{}/chat/completions", self.endpoint.base_url);
        let read = async {
            let reply = open_stream(
                || {
                    let r = self.endpoint.client.post(&url).json(&body);
                    match &self.endpoint.api_key {
                        Some(k) => r.bearer_auth(k),
                        None => r,
                    }
                },
                self.endpoint.timeout,
                limits.max_bytes,
            )
            .await?;
            let mut events = match reply {
                Reply::Json(resp) => {
                    let out = read_chat(&resp, tools)?;
                    if !out.text.is_empty() {
                        let _ = text.send(out.text.clone()).await;
                    }
                    return Ok(out);
                }
                Reply::Events(events) => events,
            };
            let mut stream = ChatStream::default();
            while let Some(event) = events.next().await {
                let piece = stream.read(&event?.data, &limits)?;
                if !piece.is_empty() {
                    let _ = text.send(piece).await;
                }
                if stream.finished {
                    break;
                }
            }
            stream.completion(tools)
        };
        tokio::time::timeout(self.endpoint.timeout, read)
            .await
            .map_err(|_| LlmError::Timeout)?
    }

    async fn send(&self, path: &str, body: &Value) -> Result<Value, LlmError> {
        let url = format!("{}/{path}", self.endpoint.base_url);
        send_with_retry(
            || {
                let r = self.endpoint.client.post(&url).json(body);
                match &self.endpoint.api_key {
                    Some(k) => r.bearer_auth(k),
                    None => r,
                }
            },
            self.endpoint.timeout,
        )
        .await
    }
}

/// The tools one request may define, in the loop's order: at most `cap`, the loaded ones before
/// (with `search`) the deferred ones.
fn offered(tools: &[ToolSpec], search: bool, cap: usize) -> Vec<&ToolSpec> {
    let loaded = tools.iter().filter(|t| !t.deferred).count();
    let mut loaded_room = cap;
    let mut deferred_room = if search {
        cap.saturating_sub(loaded)
    } else {
        0
    };
    let take = |room: &mut usize| {
        let fits = *room > 0;
        *room = room.saturating_sub(1);
        fits
    };
    tools
        .iter()
        .filter(|t| {
            if t.deferred {
                take(&mut deferred_room)
            } else {
                take(&mut loaded_room)
            }
        })
        .collect()
}

// ---- Chat Completions ----

fn wire_messages(messages: &[Message]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| match m {
            Message::System(t) => json!({"role": "system", "content": t}),
            Message::User(t) => json!({"role": "user", "content": t}),
            Message::Assistant {
                text, tool_calls, ..
            } if tool_calls.is_empty() => {
                json!({"role": "assistant", "content": text})
            }
            Message::Assistant {
                text, tool_calls, ..
            } => json!({
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

/// A Chat Completions request: the loaded tools only (no tool search there).
pub fn chat_body(model: &str, messages: &[Message], tools: &[ToolSpec]) -> Value {
    let mut body = json!({"model": model, "messages": wire_messages(messages)});
    let tools = offered(tools, false, MAX_FUNCTIONS);
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|t| json!({"type": "function", "function": {
                "name": wire_name(&t.name), "description": t.description, "parameters": t.input_schema}}))
            .collect();
    }
    body
}

pub fn read_chat(resp: &Value, tools: &[ToolSpec]) -> Result<Completion, LlmError> {
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

/// A Chat Completions stream (`"stream": true`) as it is read: the text, and each tool call
/// assembled from its deltas (by `index`) until the response ends.
#[derive(Debug, Default)]
pub struct ChatStream {
    text: String,
    calls: BTreeMap<u64, (String, String, Arguments)>,
    finished: bool,
}

impl ChatStream {
    /// Read one event's data; returns the text it adds (empty for none).
    pub fn read(&mut self, data: &str, limits: &StreamLimits) -> Result<String, LlmError> {
        if data.trim() == "[DONE]" {
            self.finished = true;
            return Ok(String::new());
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|_| LlmError::BadResponse("an event that is not JSON".into()))?;
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Err(LlmError::BadResponse(
                "the provider sent an error event".into(),
            ));
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            // Usage chunks and the like.
            return Ok(String::new());
        };
        let delta = &choice["delta"];
        let text = delta
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        self.text.push_str(&text);
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            if !self.calls.contains_key(&index) && self.calls.len() >= limits.max_tool_calls {
                return Err(LlmError::BadResponse("too many tool calls".into()));
            }
            let (id, name, args) = self.calls.entry(index).or_default();
            if let Some(i) = call.get("id").and_then(Value::as_str) {
                if id.is_empty() {
                    id.push_str(&i[..i.len().min(1024)]);
                }
            }
            if let Some(n) = call.pointer("/function/name").and_then(Value::as_str) {
                if name.len() + n.len() <= 1024 {
                    name.push_str(n);
                }
            }
            if let Some(a) = call.pointer("/function/arguments").and_then(Value::as_str) {
                args.push(a, limits.max_argument_bytes);
            }
        }
        if choice.get("finish_reason").is_some_and(|r| r.is_string()) {
            self.finished = true;
        }
        Ok(text)
    }

    /// The step, once the stream has ended; a stream cut before its end is an error.
    pub fn completion(self, tools: &[ToolSpec]) -> Result<Completion, LlmError> {
        if !self.finished {
            return Err(LlmError::BadResponse("the stream ended early".into()));
        }
        let tool_calls = self
            .calls
            .into_values()
            .enumerate()
            .map(|(i, (id, name, args))| ToolCall {
                id: if id.is_empty() {
                    format!("call_{i}")
                } else {
                    id
                },
                name: tool_name_from_wire(&name, tools),
                arguments: args.value(),
            })
            .collect();
        Ok(Completion {
            text: self.text,
            tool_calls,
            ..Completion::default()
        })
    }
}

// ---- Responses API ----

/// The namespace a tool is grouped in on the wire, and its name inside it: `invoice.mark_paid` in
/// `invoice` is `mark_paid` there. Only a tool whose name starts with its namespace and a dot is
/// grouped (a namespace of one undotted tool is just that tool).
fn grouped(t: &ToolSpec) -> Option<(&str, &str)> {
    let ns = t.namespace.as_deref().filter(|ns| !ns.is_empty())?;
    let inner = t.name.strip_prefix(ns)?.strip_prefix('.')?;
    (!inner.is_empty()).then_some((ns, inner))
}

fn function(name: &str, t: &ToolSpec) -> Value {
    // `strict` is sent: the Responses API otherwise applies strict validation, which our schemas
    // (optional properties) are not written for.
    let mut f = json!({"type": "function", "name": name, "description": t.description,
        "parameters": t.input_schema, "strict": false});
    if t.deferred {
        f["defer_loading"] = Value::Bool(true);
    }
    f
}

/// The `tools` of a Responses request. With `search` and a deferred tool: namespaces that hold a
/// deferred tool become `namespace` entries (with every tool of theirs this request offers), the
/// rest are top-level functions, and `tool_search` is last. Without: the loaded tools as
/// top-level functions.
fn responses_tools(tools: &[ToolSpec], search: bool) -> Vec<Value> {
    let search = search && tools.iter().any(|t| t.deferred);
    let cap = if search {
        MAX_FUNCTIONS - 1
    } else {
        MAX_FUNCTIONS
    };
    let offered = offered(tools, search, cap);
    let mut members: BTreeMap<&str, Vec<&ToolSpec>> = BTreeMap::new();
    if search {
        for t in &offered {
            if let Some((ns, _)) = grouped(t) {
                members.entry(ns).or_default().push(t);
            }
        }
        members.retain(|_, ts| ts.iter().any(|t| t.deferred));
    }
    let mut out: Vec<Value> = Vec::new();
    let mut placed: Vec<&str> = Vec::new();
    for t in &offered {
        match grouped(t).filter(|(ns, _)| members.contains_key(ns)) {
            Some((ns, _)) if placed.contains(&ns) => {}
            Some((ns, _)) => {
                placed.push(ns);
                let group = &members[ns];
                let inner: Vec<&str> = group
                    .iter()
                    .filter_map(|t| grouped(t))
                    .map(|g| g.1)
                    .collect();
                let description: String = format!("{} tools: {}.", ns, inner.join(", "))
                    .chars()
                    .take(1024)
                    .collect();
                let functions: Vec<Value> = group
                    .iter()
                    .filter_map(|t| grouped(t).map(|(_, name)| function(&wire_name(name), t)))
                    .collect();
                out.push(json!({"type": "namespace", "name": wire_name(ns),
                    "description": description, "tools": functions}));
            }
            None => out.push(function(&wire_name(&t.name), t)),
        }
    }
    if search {
        out.push(json!({"type": "tool_search"}));
    }
    out
}

/// One step's output items as `input` items, in the order the API gave them: its tool search
/// (with `search`), its text, its function calls as the loop kept them.
fn assistant_items(
    text: &str,
    tool_calls: &[ToolCall],
    provider_items: &[Value],
    search: bool,
    out: &mut Vec<Value>,
) {
    if search {
        for item in provider_items.iter().filter(|i| {
            i.get("type")
                .and_then(Value::as_str)
                .is_some_and(|k| SEARCH_ITEMS.contains(&k))
        }) {
            // Without the output item's `id`: the request stands on its own (`store: false`).
            let mut item = item.clone();
            if let Some(fields) = item.as_object_mut() {
                fields.remove("id");
            }
            out.push(item);
        }
    }
    if !text.is_empty() {
        out.push(json!({"role": "assistant", "content": text}));
    }
    for c in tool_calls {
        // A call of a namespaced tool goes back with the name and namespace the API gave it.
        let named = provider_items.iter().find(|i| {
            i.get("type").and_then(Value::as_str) == Some("function_call")
                && i.get("call_id").and_then(Value::as_str) == Some(c.id.as_str())
        });
        let mut call = json!({"type": "function_call", "call_id": c.id,
            "name": wire_name(&c.name), "arguments": c.arguments.to_string()});
        if let (true, Some(named)) = (search, named) {
            call["name"] = named["name"].clone();
            call["namespace"] = named["namespace"].clone();
        }
        out.push(call);
    }
}

/// A Responses API request. `search`: whether tool search is in use for this provider.
pub fn responses_body(
    model: &str,
    messages: &[Message],
    tools: &[ToolSpec],
    search: bool,
) -> Value {
    let instructions: Vec<&str> = messages
        .iter()
        .filter_map(|m| match m {
            Message::System(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    let mut input: Vec<Value> = Vec::new();
    for m in messages {
        match m {
            Message::System(_) => {}
            Message::User(t) => input.push(json!({"role": "user", "content": t})),
            Message::Assistant {
                text,
                tool_calls,
                provider_items,
            } => assistant_items(text, tool_calls, provider_items, search, &mut input),
            Message::Tool {
                call_id, content, ..
            } => input.push(
                json!({"type": "function_call_output", "call_id": call_id, "output": content}),
            ),
        }
    }
    let mut body = json!({"model": model, "input": input, "store": false});
    if !instructions.is_empty() {
        body["instructions"] = Value::String(instructions.join("\n\n"));
    }
    let tools = responses_tools(tools, search);
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    body
}

/// The dotted tool a `function_call` names: `namespace__name` when that is a tool of this request
/// (or `name` alone is not), else `name`; the database judges whatever it is.
fn called_tool(name: &str, namespace: Option<&str>, tools: &[ToolSpec]) -> String {
    let sent = |wire: &str| tools.iter().any(|t| wire_name(&t.name) == wire);
    match namespace.filter(|ns| !ns.is_empty()) {
        Some(ns) => {
            let qualified = format!("{ns}__{name}");
            if sent(&qualified) || !sent(name) {
                tool_name_from_wire(&qualified, tools)
            } else {
                tool_name_from_wire(name, tools)
            }
        }
        None => tool_name_from_wire(name, tools),
    }
}

pub fn read_responses(resp: &Value, tools: &[ToolSpec]) -> Result<Completion, LlmError> {
    let items = resp
        .get("output")
        .and_then(Value::as_array)
        .ok_or_else(|| LlmError::BadResponse("no output".into()))?;
    let mut out = Completion::default();
    for (i, item) in items.iter().enumerate() {
        let str_of = |k: &str| item.get(k).and_then(Value::as_str);
        match str_of("type") {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let text = match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => part.get("text"),
                        Some("refusal") => part.get("refusal"),
                        _ => None,
                    };
                    out.text
                        .push_str(text.and_then(Value::as_str).unwrap_or_default());
                }
            }
            Some("function_call") => {
                let id = str_of("call_id")
                    .or_else(|| str_of("id"))
                    .map_or_else(|| format!("call_{i}"), str::to_string);
                let name = str_of("name").unwrap_or_default();
                if let Some(ns) = str_of("namespace") {
                    out.provider_items.push(json!({"type": "function_call",
                        "call_id": id, "name": name, "namespace": ns}));
                }
                out.tool_calls.push(ToolCall {
                    name: called_tool(name, str_of("namespace"), tools),
                    arguments: parse_arguments(str_of("arguments").unwrap_or("{}")),
                    id,
                });
            }
            Some(kind) if SEARCH_ITEMS.contains(&kind) => out.provider_items.push(item.clone()),
            // Reasoning and anything else stay with the provider.
            _ => {}
        }
    }
    Ok(out)
}

#[async_trait]
impl ChatModel for OpenAi {
    fn provider(&self) -> &'static str {
        "openai"
    }

    /// The Responses API, until the endpoint refuses tool search; Chat Completions never.
    fn native_tool_search(&self) -> bool {
        self.api == OpenAiApi::Responses && self.tool_search.load(Ordering::Relaxed)
    }

    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
    ) -> Result<Completion, LlmError> {
        let model = &self.endpoint.model;
        if self.api == OpenAiApi::Chat {
            // Nobody listens: the text is only in the completion.
            let (tx, rx) = mpsc::channel(1);
            drop(rx);
            return self
                .chat_stream(messages, tools, StreamLimits::default(), tx)
                .await;
        }
        let search = self.tool_search.load(Ordering::Relaxed) && tools.iter().any(|t| t.deferred);
        let resp = match self
            .send("responses", &responses_body(model, messages, tools, search))
            .await
        {
            Err(e) if search && refuses_tool_search(&e) => {
                tracing::warn!(error = %e, "the Responses endpoint refuses tool search: deferred tools are left out from now on");
                self.tool_search.store(false, Ordering::Relaxed);
                self.send("responses", &responses_body(model, messages, tools, false))
                    .await?
            }
            r => r?,
        };
        read_responses(&resp, tools)
    }

    /// Chat Completions streams; the Responses API is read whole (its text in one piece).
    async fn stream(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        limits: StreamLimits,
        text: mpsc::Sender<String>,
    ) -> Result<Completion, LlmError> {
        if self.api == OpenAiApi::Chat {
            return self.chat_stream(messages, tools, limits, text).await;
        }
        let completion = self.complete(messages, tools).await?;
        if !completion.text.is_empty() {
            let _ = text.send(completion.text.clone()).await;
        }
        Ok(completion)
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

    fn tools() -> Vec<ToolSpec> {
        vec![
            spec("invoice.get", false),
            spec("invoice.mark_paid", true),
            spec("read_doc_pages", true),
            spec("vendor.list", false),
        ]
    }

    #[test]
    fn chat_completions_get_the_loaded_tools_only() {
        let body = chat_body("gpt-test", &messages(), &tools());
        let names: Vec<&str> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["invoice__get", "vendor__list"]);
        assert!(!body.to_string().contains("defer_loading"));
        // Nothing deferred: every tool, as before.
        let all: Vec<ToolSpec> = tools()
            .into_iter()
            .map(|t| ToolSpec {
                deferred: false,
                ..t
            })
            .collect();
        assert_eq!(
            chat_body("gpt-test", &messages(), &all)["tools"]
                .as_array()
                .unwrap()
                .len(),
            4
        );
    }

    #[test]
    fn responses_requests_have_the_recorded_shapes() {
        let recorded = fixture("openai_responses_tool_search.json");
        let schema = &recorded["request_schema"];
        let body = responses_body("gpt-test", &messages(), &tools(), true);
        assert_eq!(body["store"], json!(false));
        assert_eq!(body["instructions"], "You are on invoice_detail.");
        let wire = body["tools"].as_array().unwrap();
        let kinds: Vec<&str> = wire.iter().map(|t| t["type"].as_str().unwrap()).collect();
        // invoice.* grouped (it holds a deferred tool), the lone read_doc_pages deferred at the
        // top level, vendor.list (no deferred tool in vendor) a plain function, tool_search last.
        assert_eq!(kinds, ["namespace", "function", "function", "tool_search"]);
        let check = |value: &Value, required: &str| {
            for k in schema[required].as_array().unwrap() {
                let k = k.as_str().unwrap();
                assert!(value.get(k).is_some(), "{k} missing in {value}");
            }
        };
        let ns = &wire[0];
        check(ns, "namespace_required");
        assert_eq!(ns["name"], "invoice");
        assert_eq!(
            ns.get("defer_loading"),
            None,
            "defer_loading goes on the functions inside"
        );
        let inner = ns["tools"].as_array().unwrap();
        for f in inner {
            check(f, "function_required");
        }
        assert_eq!(
            inner
                .iter()
                .map(|f| (f["name"].as_str().unwrap(), f.get("defer_loading").cloned()))
                .collect::<Vec<_>>(),
            [("get", None), ("mark_paid", Some(json!(true)))]
        );
        check(&wire[1], "function_required");
        assert_eq!(
            (wire[1]["name"].as_str(), &wire[1]["defer_loading"]),
            (Some("read_doc_pages"), &json!(true))
        );
        assert_eq!(wire[2]["name"], "vendor__list");
        assert_eq!(wire[2].get("defer_loading"), None);
        assert_eq!(wire[3], recorded["request"]["tools"][1]);
        // The recorded request's own entries pass the same checks.
        check(&recorded["request"]["tools"][0], "namespace_required");
        for f in recorded["request"]["tools"][0]["tools"].as_array().unwrap() {
            check(f, "function_required");
        }
        // Refused by the endpoint: the loaded tools as top-level functions, nothing else.
        let fallback = responses_body("gpt-test", &messages(), &tools(), false);
        let names: Vec<&str> = fallback["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["invoice__get", "vendor__list"]);
        assert!(!fallback.to_string().contains("defer_loading"));
        assert!(!fallback.to_string().contains("tool_search"));
    }

    #[test]
    fn a_recorded_search_then_namespaced_call_reads_as_one_tool_call_and_goes_back() {
        let recorded = fixture("openai_responses_tool_search.json");
        let tools = tools();
        let out = read_responses(&recorded["response"], &tools).unwrap();
        assert_eq!(
            out.tool_calls,
            [ToolCall {
                id: "call_abc123".into(),
                name: "invoice.mark_paid".into(),
                arguments: json!({"note": "paid by wire"}),
            }]
        );
        let mut history = messages();
        history.push(Message::Assistant {
            text: out.text.clone(),
            tool_calls: out.tool_calls.clone(),
            provider_items: out.provider_items.clone(),
        });
        history.push(Message::Tool {
            call_id: "call_abc123".into(),
            name: "invoice.mark_paid".into(),
            content: "{\"status\":\"ok\"}".into(),
        });
        let next = responses_body("gpt-test", &history, &tools, true);
        let input = next["input"].as_array().unwrap();
        let kinds: Vec<&str> = input
            .iter()
            .map(|i| i["type"].as_str().or(i["role"].as_str()).unwrap())
            .collect();
        assert_eq!(
            kinds,
            [
                "user",
                "tool_search_call",
                "tool_search_output",
                "function_call",
                "function_call_output"
            ]
        );
        // The search items as they came, without their output ids.
        let mut search_call = recorded["response"]["output"][0].clone();
        search_call.as_object_mut().unwrap().remove("id");
        assert_eq!(input[1], search_call);
        assert_eq!(
            input[2]["tools"],
            recorded["response"]["output"][1]["tools"]
        );
        // The function call with the name and namespace the API gave it.
        let call = &input[3];
        for k in recorded["request_schema"]["function_call_required"]
            .as_array()
            .unwrap()
        {
            assert!(call.get(k.as_str().unwrap()).is_some(), "{k} in {call}");
        }
        assert_eq!(
            (call["name"].as_str(), call["namespace"].as_str()),
            (Some("mark_paid"), Some("invoice"))
        );
        assert_eq!(input[4]["output"], "{\"status\":\"ok\"}");
    }

    #[test]
    fn names_are_decoded_as_sent_and_unsent_ones_left_for_the_database() {
        let tools = tools();
        assert_eq!(
            called_tool("mark_paid", Some("invoice"), &tools),
            "invoice.mark_paid"
        );
        assert_eq!(
            called_tool("invoice__get", Some("invoice"), &tools),
            "invoice.get"
        );
        assert_eq!(
            called_tool("read_doc_pages", None, &tools),
            "read_doc_pages"
        );
        // Never sent (Gate A hid it): decoded the same way, and Gate B refuses it.
        assert_eq!(called_tool("drop", Some("admin"), &tools), "admin.drop");
        assert_eq!(called_tool("admin__drop", None, &tools), "admin.drop");
    }

    #[test]
    fn no_request_defines_more_than_the_cap() {
        let many: Vec<ToolSpec> = (0..300)
            .map(|i| spec(&format!("bulk.t{i}"), i >= 100))
            .collect();
        let body = responses_body("gpt-test", &messages(), &many, true);
        let functions: usize = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["tools"].as_array().map_or(1, Vec::len))
            .sum();
        // One namespace of 127 functions (all 100 loaded ones first) and tool_search.
        assert_eq!(functions, MAX_FUNCTIONS);
        let chat = chat_body("gpt-test", &messages(), &many);
        assert_eq!(chat["tools"].as_array().unwrap().len(), 100);
    }

    fn limits() -> StreamLimits {
        StreamLimits {
            max_argument_bytes: 1024,
            ..StreamLimits::default()
        }
    }

    #[test]
    fn a_recorded_stream_gives_its_text_in_pieces_and_its_tool_call_once_whole() {
        let data =
            crate::llm::tests::sse_data(&crate::llm::tests::sse_fixture("openai_chat_stream.sse"));
        let mut stream = ChatStream::default();
        let mut pieces = Vec::new();
        for d in &data {
            pieces.push(stream.read(d, &limits()).unwrap());
        }
        let out = stream.completion(&tools()).unwrap();
        assert_eq!(pieces.concat(), "Let me check.");
        assert_eq!(out.text, "Let me check.");
        assert_eq!(
            out.tool_calls,
            [ToolCall {
                id: "call_abc123".into(),
                name: "invoice.get".into(),
                arguments: json!({"note": "paid by wire"}),
            }]
        );
    }

    #[test]
    fn calls_are_assembled_per_index_however_their_deltas_interleave() {
        let args = r#"{"note": "a long note, cut into one-byte deltas"}"#;
        let mut stream = ChatStream::default();
        for (index, name) in [(0, "invoice__get"), (1, "vendor__list")] {
            stream
                .read(&json!({"choices": [{"delta": {"tool_calls": [{"index": index, "id": format!("c{index}"), "function": {"name": name}}]}}]}).to_string(), &limits())
                .unwrap();
        }
        for ch in args.chars() {
            for index in [1, 0] {
                stream
                    .read(&json!({"choices": [{"delta": {"tool_calls": [{"index": index, "function": {"arguments": ch.to_string()}}]}}]}).to_string(), &limits())
                    .unwrap();
            }
        }
        stream.read("[DONE]", &limits()).unwrap();
        let out = stream.completion(&tools()).unwrap();
        assert_eq!(out.tool_calls.len(), 2);
        for (call, name) in out.tool_calls.iter().zip(["invoice.get", "vendor.list"]) {
            assert_eq!(call.name, name);
            assert_eq!(
                call.arguments,
                json!({"note": "a long note, cut into one-byte deltas"})
            );
        }
    }

    #[test]
    fn streams_past_their_limits_or_cut_short_fail() {
        // Cut before finish_reason or [DONE].
        let mut stream = ChatStream::default();
        stream
            .read(r#"{"choices":[{"delta":{"content":"Hel"}}]}"#, &limits())
            .unwrap();
        assert!(matches!(
            stream.completion(&tools()),
            Err(LlmError::BadResponse(_))
        ));
        // An error event, and a malformed one.
        let mut stream = ChatStream::default();
        assert!(stream
            .read(r#"{"error":{"message":"overloaded"}}"#, &limits())
            .is_err());
        assert!(stream.read("{not json", &limits()).is_err());
        // More calls than the cap.
        let mut stream = ChatStream::default();
        let few = StreamLimits {
            max_tool_calls: 3,
            ..limits()
        };
        let result: Result<Vec<String>, LlmError> = (0..4)
            .map(|i| stream.read(&json!({"choices": [{"delta": {"tool_calls": [{"index": i, "function": {"name": "vendor__list"}}]}}]}).to_string(), &few))
            .collect();
        assert!(result.is_err());
        // Arguments past the limit: kept as a string just past it (the loop refuses the call).
        let mut stream = ChatStream::default();
        for _ in 0..100 {
            stream
                .read(&json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "x".repeat(100)}}]}}]}).to_string(), &limits())
                .unwrap();
        }
        stream.read("[DONE]", &limits()).unwrap();
        let out = stream.completion(&tools()).unwrap();
        assert_eq!(
            out.tool_calls[0].arguments.as_str().map(str::len),
            Some(1025)
        );
    }

    #[tokio::test]
    async fn over_http_text_streams_and_a_dropped_connection_fails() {
        use crate::llm::tests::{raw_server, sse_fixture, sse_head};
        let body = sse_fixture("openai_chat_stream.sse").into_bytes();
        let url = raw_server(sse_head(), body.clone()).await;
        let model = OpenAi::new(&url, None, "gpt-test", Duration::from_secs(5));
        let (tx, mut rx) = mpsc::channel(64);
        let out = model
            .stream(&messages(), &tools(), limits(), tx)
            .await
            .unwrap();
        let mut pieces = Vec::new();
        while let Some(p) = rx.recv().await {
            pieces.push(p);
        }
        assert_eq!(pieces, ["Let me ", "check."]);
        assert_eq!(out.tool_calls.len(), 1);
        // The connection drops in the middle of the arguments.
        let cut = body.len() / 2;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let url = raw_server(head, body[..cut].to_vec()).await;
        let model = OpenAi::new(&url, None, "gpt-test", Duration::from_secs(5));
        let (tx, _rx) = mpsc::channel(64);
        assert!(model
            .stream(&messages(), &tools(), limits(), tx)
            .await
            .is_err());
        // The same body without its end: ended early.
        let url = raw_server(sse_head(), body[..cut].to_vec()).await;
        let model = OpenAi::new(&url, None, "gpt-test", Duration::from_secs(5));
        let (tx, _rx) = mpsc::channel(64);
        assert!(matches!(
            model.stream(&messages(), &tools(), limits(), tx).await,
            Err(LlmError::BadResponse(_))
        ));
        // Larger than the response limit.
        let url = raw_server(sse_head(), body).await;
        let model = OpenAi::new(&url, None, "gpt-test", Duration::from_secs(5));
        let (tx, _rx) = mpsc::channel(64);
        let tiny = StreamLimits {
            max_bytes: 600,
            ..limits()
        };
        assert!(model.stream(&messages(), &tools(), tiny, tx).await.is_err());
    }
}
