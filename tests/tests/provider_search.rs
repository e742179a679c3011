//! The providers' own tool search (issue 31 item 4), end to end: the real gateway and PostgreSQL,
//! and a fake Anthropic / OpenAI Responses endpoint (a real HTTP server) that answers the first
//! request with a tool search and calls of the tools it "found". The loop's deferral (which tools
//! are beyond the budget) is stood in for by a model wrapper that marks tools deferred before the
//! real provider sends them. What the fake model calls runs through Gate B: a deferred tool that
//! Gate A listed is allowed, a tool Gate A never sent is TOOL_NOT_VISIBLE.

mod support;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser;
use ctxguard_gateway::catalog::ToolSpec;
use ctxguard_gateway::config::Config;
use ctxguard_gateway::http::AppState;
use ctxguard_gateway::llm::{ChatModel, Completion, LlmError, Message};
use serde_json::{json, Value};
use support::*;

/// The fake provider: scripted `(status, body)` answers, every request body kept.
#[derive(Clone, Default)]
struct Fake {
    answers: Arc<Mutex<VecDeque<(u16, Value)>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

async fn answer(State(fake): State<Fake>, Json(body): Json<Value>) -> Response {
    fake.requests.lock().unwrap().push(body);
    let next = fake.answers.lock().unwrap().pop_front();
    match next {
        Some((status, body)) => (StatusCode::from_u16(status).unwrap(), Json(body)).into_response(),
        None => (StatusCode::INTERNAL_SERVER_ERROR, "script spent").into_response(),
    }
}

impl Fake {
    fn new(answers: Vec<(u16, Value)>) -> Fake {
        Fake {
            answers: Arc::new(Mutex::new(answers.into())),
            ..Fake::default()
        }
    }

    /// Serve on a random local port; returns `http://addr`.
    async fn serve(&self) -> String {
        let app = Router::new()
            .route("/v1/messages", post(answer))
            .route("/v1/responses", post(answer))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    fn request(&self, i: usize) -> Value {
        self.requests.lock().unwrap()[i].clone()
    }
}

/// Stands in for the loop's compact list: the named tools are deferred (and every tool gets the
/// namespace of its first name segment), then the real provider sends them.
struct Deferring {
    inner: Arc<dyn ChatModel>,
    deferred: &'static [&'static str],
}

#[async_trait]
impl ChatModel for Deferring {
    fn provider(&self) -> &'static str {
        self.inner.provider()
    }

    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
    ) -> Result<Completion, LlmError> {
        let tools: Vec<ToolSpec> = tools
            .iter()
            .cloned()
            .map(|mut t| {
                t.deferred = self.deferred.contains(&t.name.as_str());
                t.namespace = Some(t.name.split('.').next().unwrap_or_default().to_string());
                t
            })
            .collect();
        self.inner.complete(messages, &tools).await
    }
}

/// The real gateway on the test database, its provider wrapped in [`Deferring`] (none: the
/// provider as configured, the loop's own deferral).
async fn gateway_deferring(args: &[&str], deferred: &'static [&'static str]) -> SocketAddr {
    gateway_with(args, Some(deferred)).await
}

async fn gateway_with(args: &[&str], deferred: Option<&'static [&'static str]>) -> SocketAddr {
    let mut all = vec![
        "ctxguard-gateway",
        "--database-url",
        support::env("CTXGUARD_TEST_DATABASE_URL").leak(),
    ];
    all.extend_from_slice(args);
    let config = Config::try_parse_from(all).unwrap();
    config.validate().unwrap();
    let mut state = AppState::from_config(config).unwrap();
    if let Some(deferred) = deferred {
        let core = Arc::get_mut(&mut state.core).expect("the services are not shared yet");
        core.model = Arc::new(Deferring {
            inner: core.model.clone(),
            deferred,
        });
    }
    let state = Arc::new(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        ctxguard_gateway::http::serve(listener, state)
            .await
            .unwrap()
    });
    addr
}

async fn chat(gw: SocketAddr, trace: &str) -> Value {
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &["ap_clerk"])),
        trace,
        &json!({"message": "summarize this invoice", "pageContext": invoice_page("acme_inv5")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

fn codes(rows: &[(String, Option<String>, Option<String>)]) -> Vec<(String, String)> {
    rows.iter()
        .map(|(d, c, t)| {
            (
                t.clone().unwrap_or_default(),
                c.clone().unwrap_or_else(|| d.clone()),
            )
        })
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_searches_and_calls_a_deferred_tool_through_gate_b() {
    let fake = Fake::new(vec![
        (
            200,
            json!({"content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_bm25", "input": {"query": "invoice"}},
                {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1", "content": {
                    "type": "tool_search_tool_search_result",
                    "tool_references": [{"type": "tool_reference", "tool_name": "invoice__get"}]}},
                {"type": "tool_use", "id": "toolu_found", "name": "invoice__get", "input": {}},
                {"type": "tool_use", "id": "toolu_hidden", "name": "vendor__list", "input": {}}
            ], "stop_reason": "tool_use"}),
        ),
        (
            200,
            json!({"content": [{"type": "text", "text": "Invoice ACME-2026-0005."}], "stop_reason": "end_turn"}),
        ),
    ]);
    let root = fake.serve().await;
    let gw = gateway_deferring(
        &[
            "--provider",
            "anthropic",
            "--llm-base-url",
            &root,
            "--model",
            "claude-test",
        ],
        &["invoice.get"],
    )
    .await;
    let trace = format!("provider-search-anthropic-{}", uuid::Uuid::new_v4());
    chat(gw, &trace).await;
    assert_eq!(
        codes(&audit(&trace).await),
        pairs(&[
            ("invoice.get", "allow"),
            ("vendor.list", "TOOL_NOT_VISIBLE")
        ])
    );
    let first = fake.request(0);
    let tools = first["tools"].as_array().unwrap();
    assert_eq!(
        tools[0],
        json!({"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"})
    );
    let get = tools.iter().find(|t| t["name"] == "invoice__get").unwrap();
    assert_eq!(get["defer_loading"], json!(true));
    assert!(
        tools.iter().all(|t| t["name"] != "vendor__list"),
        "Gate A hid vendor.list on this page: never sent"
    );
    assert!(
        tools
            .iter()
            .filter(|t| t["name"] != "invoice__get")
            .all(|t| t.get("defer_loading").is_none()),
        "{tools:?}"
    );
    // The search goes back with the step, before the calls, and the results after.
    let second = fake.request(1);
    let assistant = &second["messages"][1];
    assert_eq!(assistant["role"], "assistant");
    let kinds: Vec<&str> = assistant["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "server_tool_use",
            "tool_search_tool_result",
            "tool_use",
            "tool_use"
        ]
    );
    assert_eq!(second["messages"][2]["content"][0]["type"], "tool_result");
}

/// The loop's own deferral: over the tool budget, Anthropic gets the compact list (one page tool
/// and `find_tools`) and every other tool Gate A shows deferred; a deferred tool it calls is judged
/// by Gate B, a tool Gate A hid was never sent and is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_budget_the_loop_defers_the_other_visible_tools_to_anthropic_search() {
    let fake = Fake::new(vec![
        (
            200,
            json!({"content": [
                {"type": "tool_use", "id": "toolu_a", "name": "list_available_tools", "input": {}},
                {"type": "tool_use", "id": "toolu_b", "name": "vendor__list", "input": {}}
            ], "stop_reason": "tool_use"}),
        ),
        (
            200,
            json!({"content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn"}),
        ),
    ]);
    let root = fake.serve().await;
    let gw = gateway_with(
        &[
            "--provider",
            "anthropic",
            "--llm-base-url",
            &root,
            "--model",
            "claude-test",
            "--tool-budget",
            "3",
        ],
        None,
    )
    .await;
    let trace = format!("provider-search-loop-{}", uuid::Uuid::new_v4());
    let body = chat(gw, &trace).await;
    let first = fake.request(0);
    let tools = first["tools"].as_array().unwrap();
    assert_eq!(
        tools[0]["type"], "tool_search_tool_bm25_20251119",
        "{tools:?}"
    );
    let direct: Vec<&str> = tools[1..]
        .iter()
        .filter(|t| t.get("defer_loading").is_none())
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    let deferred: Vec<&str> = tools[1..]
        .iter()
        .filter(|t| t["defer_loading"] == json!(true))
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    // The compact list: one page tool and find_tools, as the context event says.
    assert_eq!(direct.len(), 2, "{direct:?}");
    assert_eq!(direct[1], "find_tools");
    assert_eq!(body["visibleTools"].as_array().unwrap().len(), 2, "{body}");
    assert!(deferred.len() >= 2, "{deferred:?}");
    assert!(deferred.contains(&"list_available_tools"), "{deferred:?}");
    assert!(
        !tools.iter().any(|t| t["name"] == "vendor__list"),
        "Gate A hid vendor.list on this page: never sent"
    );
    assert_eq!(
        codes(&audit(&trace).await),
        pairs(&[
            ("list_available_tools", "allow"),
            ("vendor.list", "TOOL_NOT_VISIBLE")
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_responses_searches_and_calls_a_deferred_tool_through_gate_b() {
    let fake = Fake::new(vec![
        (
            200,
            json!({"output": [
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "tool_search_call", "id": "tsc_1", "arguments": {"paths": ["invoice"]}, "execution": "server", "status": "completed"},
                {"type": "tool_search_output", "id": "tso_1", "execution": "server", "status": "completed", "tools": [
                    {"type": "namespace", "name": "invoice", "description": "invoice tools: get.", "tools": [
                        {"type": "function", "name": "get", "parameters": {"type": "object"}, "strict": false, "defer_loading": true}]}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_found", "namespace": "invoice", "name": "get", "arguments": "{}"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_hidden", "name": "vendor__list", "arguments": "{}"}
            ]}),
        ),
        (
            200,
            json!({"output": [{"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Invoice ACME-2026-0005."}]}]}),
        ),
    ]);
    let base = format!("{}/v1", fake.serve().await);
    let gw = gateway_deferring(
        &[
            "--provider",
            "openai",
            "--openai-api",
            "responses",
            "--llm-base-url",
            &base,
            "--model",
            "gpt-test",
        ],
        &["invoice.get"],
    )
    .await;
    let trace = format!("provider-search-responses-{}", uuid::Uuid::new_v4());
    let body = chat(gw, &trace).await;
    assert_eq!(body["answer"], "Invoice ACME-2026-0005.");
    assert_eq!(
        codes(&audit(&trace).await),
        pairs(&[
            ("invoice.get", "allow"),
            ("vendor.list", "TOOL_NOT_VISIBLE")
        ])
    );
    let first = fake.request(0);
    assert_eq!(first["store"], json!(false));
    let tools = first["tools"].as_array().unwrap();
    assert_eq!(tools.last().unwrap(), &json!({"type": "tool_search"}));
    let invoice = tools
        .iter()
        .find(|t| t["type"] == "namespace" && t["name"] == "invoice")
        .unwrap();
    let get = invoice["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "get")
        .unwrap();
    assert_eq!(get["defer_loading"], json!(true));
    assert!(!first.to_string().contains("vendor__list"));
    // The search and both calls go back (the reasoning item does not), then both outputs.
    let second = fake.request(1);
    let kinds: Vec<&str> = second["input"]
        .as_array()
        .unwrap()
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
            "function_call",
            "function_call_output",
            "function_call_output"
        ]
    );
    let found = &second["input"][3];
    assert_eq!(
        (found["namespace"].as_str(), found["name"].as_str()),
        (Some("invoice"), Some("get"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_without_tool_search_gets_the_loaded_tools_and_gate_b_still_judges() {
    let fake = Fake::new(vec![
        (
            400,
            json!({"error": {"type": "invalid_request_error", "message": "Unknown parameter: 'tools[0].tools[0].defer_loading'."}}),
        ),
        (
            200,
            json!({"output": [{"type": "function_call", "call_id": "call_1", "name": "invoice__get", "arguments": "{}"}]}),
        ),
        (
            200,
            json!({"output": [{"type": "message", "content": [{"type": "output_text", "text": "Done."}]}]}),
        ),
        (
            200,
            json!({"output": [{"type": "message", "content": [{"type": "output_text", "text": "Again."}]}]}),
        ),
    ]);
    let base = format!("{}/v1", fake.serve().await);
    let gw = gateway_deferring(
        &[
            "--provider",
            "openai",
            "--openai-api",
            "responses",
            "--llm-base-url",
            &base,
            "--model",
            "gpt-test",
        ],
        &["invoice.get"],
    )
    .await;
    let trace = format!("provider-search-fallback-{}", uuid::Uuid::new_v4());
    chat(gw, &trace).await;
    // The refused request had the search; the one sent again has neither it nor the deferred tool.
    assert!(fake.request(0).to_string().contains("tool_search"));
    let again = fake.request(1);
    assert!(!again.to_string().contains("tool_search"), "{again}");
    assert!(!again.to_string().contains("defer_loading"), "{again}");
    assert!(!again.to_string().contains("invoice__get"), "{again}");
    // The model called the deferred tool anyway: Gate A lists it, so Gate B allows it.
    assert_eq!(
        codes(&audit(&trace).await),
        pairs(&[("invoice.get", "allow")])
    );
    // The provider remembers: the next turn goes out without tool search at once.
    chat(gw, &format!("{trace}-2")).await;
    assert_eq!(fake.requests.lock().unwrap().len(), 4);
    assert!(!fake.request(3).to_string().contains("tool_search"));
}
