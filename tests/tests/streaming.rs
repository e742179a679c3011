//! Streamed answers (issue 32 item 1), end to end: the real gateway and PostgreSQL, with fake
//! providers that stream in the OpenAI Chat Completions and Anthropic Messages wire formats. A
//! tool call split across many deltas reaches Gate B once, whole; a hostile link split across
//! deltas never leaves uncleaned; the `answer_delta`s add up to the answer a non-streaming client
//! gets; a stream that breaks mid-answer ends the turn with an `error` event and stores nothing.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use support::*;

const ALLOW: &[&str] = &["--link-allowlist", "acme.example"];

/// What the model says, in pieces: the answer's text, hostile links cut mid-way.
const HOSTILE_PIECES: &[&str] = &[
    "Your vendors are ",
    "listed. See [the rep",
    "ort](https://evil.exa",
    "mple/x?d=secret) and ![ch",
    "art](https://evil.example/p.p",
    "ng) or https://ev",
    "il.example/raw and [docs](https://docs.acme.exa",
    "mple/a).\n\nDone, with www.evil",
    ".example/w at the end.",
];

/// One scripted reply: events (each an SSE `data`, with its `event` name for Anthropic), and
/// whether the connection then drops.
#[derive(Clone)]
struct Reply {
    events: Vec<(Option<&'static str>, Value)>,
    done: bool,
    drop: bool,
}

#[derive(Clone, Default)]
struct Fake {
    replies: Arc<Mutex<std::collections::VecDeque<Reply>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

async fn answer(State(fake): State<Fake>, Json(body): Json<Value>) -> Response {
    fake.requests.lock().unwrap().push(body);
    let Some(reply) = fake.replies.lock().unwrap().pop_front() else {
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "script spent",
        )
            .into_response();
    };
    let mut chunks: Vec<Result<String, std::io::Error>> = reply
        .events
        .iter()
        .map(|(name, data)| {
            Ok(match name {
                Some(n) => format!("event: {n}\ndata: {data}\n\n"),
                None => format!("data: {data}\n\n"),
            })
        })
        .collect();
    if reply.done {
        chunks.push(Ok("data: [DONE]\n\n".into()));
    }
    if reply.drop {
        chunks.push(Err(std::io::Error::other("connection dropped")));
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap()
}

impl Fake {
    fn new(replies: Vec<Reply>) -> Fake {
        Fake {
            replies: Arc::new(Mutex::new(replies.into())),
            ..Fake::default()
        }
    }

    async fn serve(&self) -> String {
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/messages", post(answer))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }
}

// ---- OpenAI Chat Completions chunks ----

fn oa_text(pieces: &[&str]) -> Vec<(Option<&'static str>, Value)> {
    pieces
        .iter()
        .map(|p| {
            (
                None,
                json!({"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": null}]}),
            )
        })
        .collect()
}

fn oa_finish(reason: &str) -> (Option<&'static str>, Value) {
    (
        None,
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}),
    )
}

/// A preamble, then `vendor.list` called with `{"limit": 3}`, its arguments one byte a delta.
fn oa_tool_step() -> Reply {
    let mut events = oa_text(&["Let me ", "look that up."]);
    events.push((None, json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_s1", "type": "function", "function": {"name": "vendor__list", "arguments": ""}}]}}]})));
    for ch in r#"{"limit": 3}"#.chars() {
        events.push((None, json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ch.to_string()}}]}}]})));
    }
    events.push(oa_finish("tool_calls"));
    Reply {
        events,
        done: true,
        drop: false,
    }
}

fn oa_answer_step() -> Reply {
    let mut events = oa_text(HOSTILE_PIECES);
    events.push(oa_finish("stop"));
    Reply {
        events,
        done: true,
        drop: false,
    }
}

// ---- Anthropic Messages events ----

fn an_tool_step() -> Reply {
    let mut events = vec![
        (
            Some("message_start"),
            json!({"type": "message_start", "message": {"id": "msg_1", "content": [], "stop_reason": null}}),
        ),
        (
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            Some("content_block_delta"),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me look that up."}}),
        ),
        (
            Some("content_block_stop"),
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_s1", "name": "vendor__list", "input": {}}}),
        ),
    ];
    for ch in r#"{"limit": 3}"#.chars() {
        events.push((Some("content_block_delta"), json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ch.to_string()}})));
    }
    events.extend([
        (
            Some("content_block_stop"),
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            Some("message_delta"),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
        ),
        (Some("message_stop"), json!({"type": "message_stop"})),
    ]);
    Reply {
        events,
        done: false,
        drop: false,
    }
}

fn an_answer_step() -> Reply {
    let mut events = vec![
        (
            Some("message_start"),
            json!({"type": "message_start", "message": {"id": "msg_2", "content": [], "stop_reason": null}}),
        ),
        (
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    for p in HOSTILE_PIECES {
        events.push((Some("content_block_delta"), json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}})));
        events.push((Some("ping"), json!({"type": "ping"})));
    }
    events.extend([
        (
            Some("content_block_stop"),
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            Some("message_delta"),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
        ),
        (Some("message_stop"), json!({"type": "message_stop"})),
    ]);
    Reply {
        events,
        done: false,
        drop: false,
    }
}

/// A gateway on `provider` served by `fake`.
async fn gateway_for(provider: &str, fake: &Fake) -> SocketAddr {
    let base = fake.serve().await;
    let url = if provider == "openai" {
        format!("{base}/v1")
    } else {
        base
    };
    let mut args = vec!["--provider", provider, "--llm-base-url", url.as_str()];
    args.extend_from_slice(ALLOW);
    gateway(&args).await
}

fn request(conversation: &str) -> Value {
    json!({"message": "which vendors do I have?", "pageContext": {"pageType": "vendor_table"},
        "conversationId": conversation})
}

/// Every event of a streamed turn, in order: (name, data).
async fn stream_turn(gw: SocketAddr, trace: &str, conversation: &str) -> Vec<(String, Value)> {
    let text = http()
        .post(format!("http://{gw}/v1/chat"))
        .bearer_auth(token("alice", "acme", &["ap_clerk"]))
        .header("accept", "text/event-stream")
        .header("x-request-id", trace)
        .json(&request(conversation))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.split("\n\n")
        .filter_map(|block| {
            let name = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_string(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

async fn stored_turns(conversation: &str) -> i64 {
    admin()
        .await
        .query_one(
            "SELECT count(*) FROM ctxguard.conversation_turns WHERE conversation_id = $1",
            &[&conversation],
        )
        .await
        .unwrap()
        .get(0)
}

async fn streamed_turn_is_clean_and_whole(provider: &str, tool: Reply) {
    let fake = Fake::new(vec![tool.clone(), answer_for(provider)]);
    let gw = gateway_for(provider, &fake).await;
    let trace = format!("stream-{provider}-{}", uuid::Uuid::new_v4());
    let conversation = uuid::Uuid::new_v4().to_string();
    let events = stream_turn(gw, &trace, &conversation).await;
    assert_eq!(fake.requests.lock().unwrap()[0]["stream"], true);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"context"), "{names:?}");
    assert_eq!(names.last(), Some(&"done"), "{names:?}");

    // The preamble streamed, then was dropped when the model called a tool.
    let reset = names
        .iter()
        .position(|n| *n == "answer_reset")
        .expect("answer_reset");
    assert!(names[..reset].contains(&"answer_delta"), "{names:?}");

    // The call, split across many deltas, reached Gate B once, whole.
    let calls: Vec<&Value> = events
        .iter()
        .filter(|(n, _)| n == "tool_call")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["tool"], "vendor.list");
    assert_eq!(calls[0]["arguments"], json!({"limit": 3}));
    assert_eq!(calls[0]["decision"], "allow");
    let gate_b: Vec<_> = audit(&trace)
        .await
        .into_iter()
        .filter(|(_, _, tool)| tool.as_deref() == Some("vendor.list"))
        .collect();
    assert_eq!(gate_b.len(), 1, "{gate_b:?}");

    // Every delta is clean; after the reset they add up to the answer.
    let deltas: Vec<&str> = events[reset..]
        .iter()
        .filter(|(n, _)| n == "answer_delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert!(
        deltas.len() >= 3,
        "the answer came in one piece: {deltas:?}"
    );
    for d in &deltas {
        assert!(!d.contains("evil"), "{d:?} left uncleaned");
    }
    let done = &events.last().unwrap().1;
    let answer = done["answer"].as_str().unwrap();
    assert_eq!(deltas.concat(), answer);
    let chunks: String = events
        .iter()
        .filter(|(n, _)| n == "answer")
        .map(|(_, d)| d["text"].as_str().unwrap())
        .collect();
    assert_eq!(chunks, answer, "the answer events are as before");
    assert!(
        answer.contains("(link removed)")
            && answer.contains("(image removed: chart)")
            && answer.contains("[docs](https://docs.acme.example/a)")
            && !answer.contains("evil"),
        "{answer}"
    );
    assert_eq!(stored_turns(&conversation).await, 1);

    // A client that does not stream gets the same answer for the same model output.
    let fake = Fake::new(vec![tool, answer_for(provider)]);
    let gw = gateway_for(provider, &fake).await;
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &["ap_clerk"])),
        &format!("{trace}-whole"),
        &request(&uuid::Uuid::new_v4().to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["answer"], answer);
    assert_eq!(body["toolCalls"].as_array().unwrap().len(), 1);
}

fn answer_for(provider: &str) -> Reply {
    if provider == "openai" {
        oa_answer_step()
    } else {
        an_answer_step()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streamed_turn_is_clean_whole_and_the_same_as_unstreamed() {
    streamed_turn_is_clean_and_whole("openai", oa_tool_step()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_streamed_turn_is_clean_whole_and_the_same_as_unstreamed() {
    streamed_turn_is_clean_and_whole("anthropic", an_tool_step()).await;
}

/// The stream breaks mid-answer (the connection drops, or the provider sends an error event):
/// the turn ends with an `error` event, what left was clean, and nothing is stored, as when the
/// model fails unstreamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_breaks_mid_answer_ends_the_turn_with_an_error() {
    let dropped = Reply {
        events: oa_text(&HOSTILE_PIECES[..4]),
        done: false,
        drop: true,
    };
    let mut error_event = an_answer_step();
    error_event.events.truncate(6);
    error_event.events.push((
        Some("error"),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ));
    let cut_short = Reply {
        events: oa_text(HOSTILE_PIECES),
        done: false,
        drop: false,
    };
    for (provider, reply) in [
        ("openai", dropped),
        ("anthropic", error_event),
        ("openai", cut_short),
    ] {
        let fake = Fake::new(vec![reply.clone()]);
        let gw = gateway_for(provider, &fake).await;
        let trace = format!("stream-broken-{}", uuid::Uuid::new_v4());
        let conversation = uuid::Uuid::new_v4().to_string();
        let events = stream_turn(gw, &trace, &conversation).await;
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.last(), Some(&"error"), "{provider}: {names:?}");
        assert!(
            !names.contains(&"done") && !names.contains(&"answer"),
            "{names:?}"
        );
        for (_, d) in events.iter().filter(|(n, _)| n == "answer_delta") {
            assert!(!d["delta"].as_str().unwrap().contains("evil"), "{d}");
        }
        let error = &events.last().unwrap().1;
        assert!(
            !error.to_string().contains("evil") && !error.to_string().contains("Overloaded"),
            "{error}"
        );
        assert_eq!(stored_turns(&conversation).await, 0);

        // Unstreamed, the same model output fails the same way.
        let fake = Fake::new(vec![reply]);
        let gw = gateway_for(provider, &fake).await;
        let (status, body) = post_json(
            gw,
            "/v1/chat",
            Some(&token("alice", "acme", &["ap_clerk"])),
            &format!("{trace}-whole"),
            &request(&conversation),
        )
        .await;
        assert_eq!(status, 502, "{body}");
        assert_eq!(body["error"]["code"], error["error"]["code"]);
        assert_eq!(stored_turns(&conversation).await, 0);
    }
}
