//! The real gateway over HTTP against a real PostgreSQL, with a mock OpenAI-compatible model that
//! scripts hostile tool calls. Assertions are on the database outcome (audit rows, rows touched),
//! never on model text. SECURITY_MATRIX F and G.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

fn codes(rows: &[(String, Option<String>, Option<String>)]) -> Vec<String> {
    rows.iter()
        .map(|(d, c, _)| c.clone().unwrap_or_else(|| d.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_tool_calls_are_refused_by_the_database() {
    let huge = "x".repeat(20_000);
    let mock = Mock::new(vec![
        Step::Tools(vec![
            ("invoice__get", json!({"invoice_id": "acme_inv4"})),
            ("invoice__get", json!({"invoice_id": "glx_inv3"})),
            ("vendor__list", json!({})),
            ("legacy__export_all", json!({})),
            ("admin__drop_everything", json!({})),
            (
                "invoice__get",
                json!({"invoice_id": "'; DROP TABLE demo.invoices; --"}),
            ),
            ("invoice__get", json!({"tenant_id": "globex"})),
            ("invoice__get", json!({"note": huge})),
        ]),
        Step::Tools(vec![("test__injector", json!({}))]),
        // The "injected" instruction: the model obeys it; the database does not.
        Step::Tools(vec![("invoice__get", json!({"invoice_id": "glx_inv3"}))]),
        Step::Answer(
            "Here you go ![x](https://evil.example/p.png?d=1) [more](https://evil.example)",
        ),
    ]);
    let gw = openai_gateway(&mock, &["--model", "mock"]).await;
    let trace = format!("hostile-{}", uuid::Uuid::new_v4());
    let alice = token("alice", "acme", &["ap_clerk"]);
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&alice),
        &trace,
        &json!({"message": "summarize this invoice", "pageContext": invoice_page("acme_inv5")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let rows = audit(&trace).await;
    assert_eq!(
        codes(&rows),
        [
            "ENTITY_MISMATCH",
            "ENTITY_MISMATCH",
            "TOOL_NOT_VISIBLE",
            "TOOL_NOT_FOUND",
            "TOOL_NOT_FOUND",
            "ENTITY_MISMATCH",
            "INVALID_ARGUMENT",
            "INVALID_ARGUMENT",
            "allow",
            "ENTITY_MISMATCH"
        ],
        "{rows:?}"
    );
    // The only allowed call was the injector; no invoice was ever read for anyone.
    assert_eq!(
        rows.iter()
            .filter(|r| r.0 == "allow")
            .map(|r| r.2.clone().unwrap())
            .collect::<Vec<_>>(),
        ["test.injector"]
    );
    let n: i64 = admin()
        .await
        .query_one("SELECT count(*) FROM demo.invoices", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 24, "the refused calls touched nothing");
    // SQL text that does reach a handler stays data: test.note stores it as it is, and the table
    // it names is intact (the handler counts acme's 12 invoices after the insert; the admin's count
    // below sees all 24).
    let hostile = "x'); DROP TABLE demo.invoices; --";
    let (status, note) = post_json(gw, "/internal/mcp/execute", Some(&alice), &format!("{trace}-note"),
        &json!({"tool_name": "test.note", "arguments": {"note": hostile}, "pageContext": {"pageType": "invoice_table"}})).await;
    assert_eq!(status, 200, "{note}");
    assert_eq!(
        (
            note["result"]["stored"].as_str(),
            note["result"]["invoices"].as_i64()
        ),
        (Some(hostile), Some(12)),
        "the handler ran with the text as data: {note}"
    );
    let stored: i64 = admin()
        .await
        .query_one("SELECT count(*) FROM t.notes WHERE note = $1", &[&hostile])
        .await
        .unwrap()
        .get(0);
    assert!(stored >= 1, "the note was stored");
    let n: i64 = admin()
        .await
        .query_one("SELECT count(*) FROM demo.invoices", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 24, "SQL text in arguments stayed data");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        !answer.contains("evil.example"),
        "links neutralised: {answer}"
    );
    // The model never saw the bound parameter in the tool schema.
    let first = mock.requests.lock().unwrap()[0].clone();
    let get = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "invoice__get")
        .unwrap()
        .clone();
    assert!(
        get["function"]["parameters"]["properties"]
            .get("invoice_id")
            .is_none(),
        "{get}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_tool_loop_stops_at_the_step_limit() {
    let mock = Mock::new(vec![]);
    *mock.repeat.lock().unwrap() = Some(Step::Tools(vec![("vendor__list", json!({}))]));
    let gw = openai_gateway(&mock, &["--max-steps", "3"]).await;
    let trace = format!("loop-{}", uuid::Uuid::new_v4());
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &[])),
        &trace,
        &json!({"message": "list vendors forever", "pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["stoppedByStepLimit"], true);
    assert_eq!(mock.request_count(), 3);
    assert_eq!(
        audit(&trace).await.len(),
        3,
        "one audited call per step, no more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_retry_once_and_never_rerun_a_tool() {
    // Step 1: a tool call. Step 2: 503 then (retry) 500 → 502; the tool ran exactly once.
    let mock = Mock::new(vec![
        Step::Tools(vec![("vendor__list", json!({}))]),
        Step::Status(503, Some("0")),
        Step::Status(500, None),
    ]);
    let gw = openai_gateway(&mock, &[]).await;
    let trace = format!("upstream-{}", uuid::Uuid::new_v4());
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &[])),
        &trace,
        &json!({"message": "vendors?", "pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("UPSTREAM_FAILED"))
    );
    assert_eq!(mock.request_count(), 3, "one retry, not more");
    assert_eq!(
        codes(&audit(&trace).await),
        ["allow"],
        "the tool call ran and was audited exactly once"
    );

    // A 429 with Retry-After followed by success recovers.
    let mock = Mock::new(vec![Step::Status(429, Some("1")), Step::Answer("fine")]);
    let gw = openai_gateway(&mock, &[]).await;
    let started = Instant::now();
    let (status, _) = post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &[])),
        "retry-ok",
        &json!({"message": "hello", "pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_times_out_with_504_after_auditing_once() {
    let mock = Mock::new(vec![
        Step::Tools(vec![("vendor__list", json!({}))]),
        Step::Sleep(Duration::from_secs(3)),
    ]);
    let gw = openai_gateway(&mock, &["--llm-timeout-ms", "500"]).await;
    let trace = format!("slow-{}", uuid::Uuid::new_v4());
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &[])),
        &trace,
        &json!({"message": "vendors?", "pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (504, Some("UPSTREAM_TIMEOUT"))
    );
    assert_eq!(codes(&audit(&trace).await), ["allow"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_comes_only_from_the_token() {
    let gw = gateway(&[]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let page = invoice_page("acme_inv2");
    let (status, body) = post_json(gw, "/internal/mcp/execute", Some(&alice), "idm-1",
        &json!({"tool_name": "invoice.get", "arguments": {}, "user": {"user_id": "carol", "tenant_id": "globex"}, "pageContext": page})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("IDENTITY_MISMATCH"))
    );
    assert!(audit("idm-1").await.is_empty(), "nothing was called");
    let (status, body) = post_json(gw, "/internal/mcp/execute", Some(&alice), "idm-2",
        &json!({"tool_name": "invoice.get", "arguments": {}, "user": {"user_id": "alice", "tenant_id": "acme"}, "trace_id": "abc-def-123", "pageContext": page})).await;
    assert_eq!(
        (status, body["status"].as_str(), body["trace_id"].as_str()),
        (200, Some("ok"), Some("abc-def-123"))
    );
    assert_eq!(body["result"]["id"], "acme_inv2");
    let (status, _) = post_json(
        gw,
        "/v1/chat",
        None,
        "nobody",
        &json!({"message": "hi", "pageContext": page}),
    )
    .await;
    assert_eq!(status, 401);
    let forged = format!("{}x", alice);
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&forged),
        "forged",
        &json!({"message": "hi", "pageContext": page}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("UNAUTHENTICATED"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_interleaved_over_a_pool_of_one_never_mix() {
    let gw = gateway(&["--pool-size", "1", "--db-timeout-ms", "10000"]).await;
    let users = [
        ("alice", "acme", "Northwind Traders"),
        ("carol", "globex", "Initech Supplies"),
    ];
    let tokens: Vec<String> = users.iter().map(|(u, t, _)| token(u, t, &[])).collect();
    // 1,000 requests, alternating tenants, 16 in flight over the single connection.
    use futures::StreamExt;
    futures::stream::iter(0..1000)
        .map(|i| {
            let k = i % 2;
            let tok = tokens[k].clone();
            async move {
                let (_, tenant, marker) = users[k];
                let (status, body) = post_json(gw, "/internal/mcp/execute", Some(&tok), &format!("mix-{i}"),
                    &json!({"tool_name": "vendor.list", "arguments": {}, "pageContext": {"pageType": "vendor_table"}})).await;
                assert_eq!(status, 200, "{body}");
                let names: Vec<String> =
                    body["result"]["vendors"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_string()).collect();
                assert!(names.iter().any(|n| n == marker), "{tenant} saw {names:?}");
                let other = users[1 - k].2;
                assert!(!names.iter().any(|n| n == other), "cross-tenant rows for {tenant}: {names:?}");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

/// The advisory lock `t.slow` (sql/tests/fixtures.sql) waits for: a test that holds it decides when
/// the slow tool finishes.
const SLOW_TOOL_LOCK: i64 = 15_150_015;

/// Wait until a gateway backend is blocked in `t.slow` on [`SLOW_TOOL_LOCK`] (the server's state,
/// read from pg_locks). Panics after `guard` (a hang guard, not a timing assertion).
async fn wait_for_slow_tool(db: &tokio_postgres::Client, guard: Duration) {
    let deadline = Instant::now() + guard;
    loop {
        let waiting: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                  WHERE l.locktype = 'advisory' AND NOT l.granted AND a.usename = 'ctxguard_gateway'
                    AND (l.classid::bigint << 32) | l.objid::bigint = $1",
                &[&SLOW_TOOL_LOCK],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the slow tool never reached its lock: the connection is not held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_answers_503_fast_and_bad_requests_take_no_connection() {
    // The slow tool blocks on an advisory lock this test holds: the only connection stays taken
    // until the test lets it go, however slow the machine.
    let lock = admin().await;
    lock.execute("SELECT pg_advisory_lock($1)", &[&SLOW_TOOL_LOCK])
        .await
        .unwrap();
    let mock = Mock::new(vec![
        Step::Tools(vec![("test__slow", json!({}))]),
        Step::Answer("ok"),
    ]);
    let gw = openai_gateway(&mock, &["--pool-size", "1", "--db-timeout-ms", "200"]).await;
    let alice = token("alice", "acme", &[]);
    let holder_trace = format!("holder-{}", uuid::Uuid::new_v4());
    let holder = {
        let (alice, holder_trace) = (alice.clone(), holder_trace.clone());
        tokio::spawn(async move {
            post_json(
                gw,
                "/v1/chat",
                Some(&alice),
                &holder_trace,
                &json!({"message": "sleep", "pageContext": {"pageType": "vendor_table"}}),
            )
            .await
        })
    };
    // Until the slow tool waits for the lock, on the pool's only connection.
    wait_for_slow_tool(&lock, Duration::from_secs(60)).await;
    let (status, body) = post_json(gw, "/internal/mcp/execute", Some(&alice), "starved",
        &json!({"tool_name": "vendor.list", "arguments": {}, "pageContext": {"pageType": "vendor_table"}})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("DATABASE_UNAVAILABLE"))
    );
    // Invalid requests never wait for a connection: had they, the pool would have answered 503.
    // The codes, not only the statuses.
    let (s1, b1) = post_json(
        gw,
        "/v1/chat",
        None,
        "bad-1",
        &json!({"message": "x", "pageContext": {}}),
    )
    .await;
    let (s2, b2) = post_json(
        gw,
        "/v1/chat",
        Some(&alice),
        "bad-2",
        &json!({"pageContext": {}}),
    )
    .await;
    let (s3, b3) = post_json(
        gw,
        "/v1/chat",
        Some(&alice),
        "bad-3",
        &json!({"message": "x".repeat(70_000), "pageContext": {}}),
    )
    .await;
    assert_eq!(
        [
            (s1, b1["error"]["code"].as_str()),
            (s2, b2["error"]["code"].as_str()),
            (s3, b3["error"]["code"].as_str())
        ],
        [
            (401, Some("UNAUTHENTICATED")),
            (400, Some("BAD_REQUEST")),
            (413, Some("PAYLOAD_TOO_LARGE"))
        ]
    );
    // All of it while the slow call still held the only connection (it cannot finish before the
    // lock is released).
    wait_for_slow_tool(&lock, Duration::from_secs(1)).await;
    assert!(!holder.is_finished(), "the holder finished while blocked");
    lock.execute("SELECT pg_advisory_unlock($1)", &[&SLOW_TOOL_LOCK])
        .await
        .unwrap();
    let (status, body) = holder.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        codes(&audit(&holder_trace).await),
        ["allow"],
        "the slow tool ran once, after the lock was released"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_model_answers_seed_000_from_tools() {
    let gw = gateway(&[]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let trace = format!("seed0-{}", uuid::Uuid::new_v4());
    let (status, body) = post_json(gw, "/v1/chat", Some(&alice), &trace,
        &json!({"message": "what vendors do I have?", "pageContext": {"pageType": "vendor_table", "entity": null}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["toolCalls"][0]["tool"], "vendor.list");
    let trace2 = format!("seed0b-{}", uuid::Uuid::new_v4());
    let (_, body) = post_json(gw, "/v1/chat", Some(&alice), &trace2,
        &json!({"message": "summarize this invoice", "pageContext": invoice_page("acme_inv3"), "conversationId": body["conversationId"]})).await;
    let tools: Vec<&str> = body["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["invoice.get", "read_doc_pages"],
        "the invoice, then its PDF"
    );
    assert_eq!(codes(&audit(&trace2).await), ["allow", "allow"]);
    assert_eq!(
        body["turn"], 2,
        "the conversation continues on the new page"
    );
    let turns: Vec<Value> = admin()
        .await
        .query(
            "SELECT page FROM ctxguard.conversation_turns WHERE conversation_id = $1 ORDER BY turn",
            &[&body["conversationId"].as_str().unwrap()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        turns
            .iter()
            .map(|p| p["pageType"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["vendor_table", "invoice_detail"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_provider_goes_through_the_same_gates() {
    let mock = Mock::new(vec![
        Step::Tools(vec![
            ("invoice__get", json!({})),
            ("invoice__get", json!({"invoice_id": "acme_inv9"})),
        ]),
        Step::Answer("The invoice is ACME-2026-0002."),
    ]);
    let base = mock.serve().await;
    let root = base.trim_end_matches("/v1").to_string();
    let gw = gateway(&[
        "--provider",
        "anthropic",
        "--llm-base-url",
        &root,
        "--model",
        "claude-test",
    ])
    .await;
    let trace = format!("anthropic-{}", uuid::Uuid::new_v4());
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &[])),
        &trace,
        &json!({"message": "summarize this invoice", "pageContext": invoice_page("acme_inv2")}),
    )
    .await;
    assert_eq!(
        status,
        200,
        "{body} after {} mock requests: {:?}",
        mock.request_count(),
        mock.requests.lock().unwrap()
    );
    assert_eq!(codes(&audit(&trace).await), ["allow", "ENTITY_MISMATCH"]);
    let first = mock.requests.lock().unwrap()[0].clone();
    assert!(
        first["system"].as_str().unwrap().contains("invoice_detail"),
        "page in the system prompt"
    );
    assert!(first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "invoice__get"));
    // The second request carries the tool results back as tool_result blocks.
    let second = mock.requests.lock().unwrap()[1].clone();
    assert!(second.to_string().contains("tool_result"), "{second}");
}

/// Each of the gateway's transactions goes out in one round trip (BEGIN, set_context, the
/// statements, COMMIT, pipelined). The answer is the first step that failed, not the `25P02` of
/// the steps after it; a failed transaction leaves nothing behind, and the one pooled connection
/// serves the next transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_step_of_a_pipelined_transaction_answers_with_its_own_error() {
    use ctxguard_gateway::db::Scope;
    use ctxguard_gateway::error::ApiError;
    let (_, state) = gateway_with_state(&["--pool-size", "1"]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let scope = |token: &str| Scope {
        token: token.to_string(),
        page: json!({"pageType": "vendor_table"}),
        generation: None,
        trace_id: "pipelined".to_string(),
    };
    let db = admin().await;
    let run = format!("pipelined-{}", std::process::id());
    let conv = |n: u32| format!("{run}-{n}");

    // set_context fails: 401, though every statement after it failed too.
    let e = state
        .core
        .db
        .save_turn(&scope("forged.token.value"), &conv(1), "q", "a", &json!([]))
        .await
        .unwrap_err();
    assert!(matches!(e, ApiError::Unauthorized(_)), "{e:?}");
    // A statement after set_context fails (a message over save_turn's 32 KiB): its own error.
    let e = state
        .core
        .db
        .save_turn(
            &scope(&alice),
            &conv(2),
            &"x".repeat(40_000),
            "a",
            &json!([]),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, ApiError::TurnTooLarge), "{e:?}");
    // The pool's only connection is not left in the failed transaction: it serves the next one
    // (inside an aborted transaction its set_context would fail with 25P02), in which the
    // context holds.
    let n = state
        .core
        .db
        .save_turn(&scope(&alice), &conv(3), "q", "a", &json!([]))
        .await
        .unwrap();
    assert_eq!(n, 1);
    let context = state.core.db.context(&scope(&alice)).await.unwrap();
    assert_eq!(context["userId"], "alice");
    assert_eq!(context["pageType"], "vendor_table");
    let saved: Vec<String> = db
        .query(
            "SELECT conversation_id FROM ctxguard.conversation_turns WHERE conversation_id LIKE $1 || '-%' ORDER BY 1",
            &[&run],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(saved, vec![conv(3)]);
}
