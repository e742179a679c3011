//! Promises of the README that had no test (issue 15): conversations are per user, budgets accumulate
//! over a reused `generation_id`, a 500 carries no detail, `/ready` checks the extension's version,
//! `/mcp` answers only to allowed hosts, and the lifetimes of generations, approvals and authorized
//! upstream calls follow `tenant_limits` and end.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

fn viewer() -> Value {
    json!({"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}})
}

/// Every request body the mock model received, as text.
fn seen(mock: &Mock, i: usize) -> String {
    mock.requests.lock().unwrap()[i].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_user_reusing_a_conversation_id_sees_none_of_its_history() {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (question, answer) = (
        format!("alice-question-{run}"),
        format!("alice-answer-{run}"),
    );
    let answer: &'static str = Box::leak(answer.into_boxed_str());
    let mock = Mock::new(vec![
        Step::Answer(answer),
        Step::Answer("bob's answer"),
        Step::Answer("carol's answer"),
        Step::Answer("alice's second answer"),
    ]);
    let gw = openai_gateway(&mock, &[]).await;
    let conv = format!("shared-{run}");
    let ask = |who: (&'static str, &'static str), message: String| {
        let (tok, conv) = (token(who.0, who.1, &[]), conv.clone());
        async move {
            post_json(gw, "/v1/chat", Some(&tok), &format!("{conv}-{}", who.0),
                &json!({"message": message, "pageContext": {"pageType": "vendor_table"}, "conversationId": conv})).await
        }
    };
    let (status, first) = ask(("alice", "acme"), question.clone()).await;
    assert_eq!((status, first["turn"].as_i64()), (200, Some(1)), "{first}");
    // The same id from another user of the same tenant, and from another tenant.
    for (i, who) in [(1, ("bob", "acme")), (2, ("carol", "globex"))] {
        let (status, body) = ask(who, "what did we talk about?".into()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["turn"], 1, "{}: a conversation of their own", who.0);
        let request = seen(&mock, i);
        assert!(
            !request.contains(&question) && !request.contains(answer),
            "{} saw alice's history: {request}",
            who.0
        );
    }
    // Positive control: alice's own next turn carries her history to the model.
    let (status, body) = ask(("alice", "acme"), "and then?".into()).await;
    assert_eq!((status, body["turn"].as_i64()), (200, Some(2)), "{body}");
    let request = seen(&mock, 3);
    assert!(
        request.contains(&question) && request.contains(answer),
        "alice's history reaches the model: {request}"
    );
    // Each user's turns are stored as their own.
    let rows: Vec<(String, String, i32)> = admin()
        .await
        .query(
            "SELECT tenant_id, user_id, turn FROM ctxguard.conversation_turns WHERE conversation_id = $1
              ORDER BY tenant_id, user_id, turn",
            &[&conv],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expected: Vec<(String, String, i32)> = [
        ("acme", "alice", 1),
        ("acme", "alice", 2),
        ("acme", "bob", 1),
        ("globex", "carol", 1),
    ]
    .iter()
    .map(|(t, u, n)| (t.to_string(), u.to_string(), *n))
    .collect();
    assert_eq!(rows, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_accumulate_over_a_reused_generation_id_on_execute() {
    let gw = gateway(&[]).await;
    // A user of its own: the daily budgets of other tests are not touched.
    let user = format!("genreuse-{}", uuid::Uuid::new_v4().simple());
    let tok = token(&user, "acme", &["viewer"]);
    let exec = |generation: Option<String>, i: usize| {
        let tok = tok.clone();
        async move {
            post_json(gw, "/internal/mcp/execute", Some(&tok), &format!("genreuse-{i}"),
                &json!({"tool_name": "doc_local_search", "arguments": {"query": "zzqqxxyy"}, "pageContext": viewer(),
                        "generation_id": generation})).await
        }
    };
    let (status, first) = exec(None, 0).await;
    assert_eq!(
        (status, first["status"].as_str()),
        (200, Some("ok")),
        "{first}"
    );
    let g = first["generation_id"].as_str().unwrap().to_string();
    // Ten calls per document per generation: nine more pass, all in the same generation ...
    for i in 1..10 {
        let (status, body) = exec(Some(g.clone()), i).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (200, Some("ok")),
            "{body}"
        );
        assert_eq!(body["generation_id"].as_str(), Some(g.as_str()), "reused");
    }
    // ... and the eleventh is refused by that limit.
    let (status, body) = exec(Some(g.clone()), 10).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["error"]["code"].as_str(),
        Some("RATE_LIMIT_EXCEEDED"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("calls_per_document:"),
        "{body}"
    );
    // Positive control: without the id, each call gets a fresh generation and budget.
    let (status, body) = exec(None, 11).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ok")),
        "{body}"
    );
    assert_ne!(body["generation_id"].as_str(), Some(g.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_carries_no_detail() {
    // save_turn fails for this user only (a CHECK the test adds): an internal error whose detail
    // (SQLSTATE, constraint, table, user) must stay in the log.
    let user = format!("nodetail-{}", uuid::Uuid::new_v4().simple());
    let constraint = format!("test_{}", user.replace('-', "_"));
    let db = admin().await;
    db.batch_execute(&format!(
        "ALTER TABLE ctxguard.conversation_turns ADD CONSTRAINT {constraint} CHECK (user_id <> '{user}') NOT VALID"
    ))
    .await
    .unwrap();
    let gw = gateway(&[]).await;
    let trace = format!("{user}-trace");
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token(&user, "acme", &[])),
        &trace,
        &json!({"message": "what vendors do I have?", "pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    db.batch_execute(&format!(
        "ALTER TABLE ctxguard.conversation_turns DROP CONSTRAINT {constraint}"
    ))
    .await
    .unwrap();
    assert_eq!(status, 500, "{body}");
    assert_eq!(
        body,
        json!({"error": {"code": "INTERNAL", "message": "internal error"}}),
        "nothing but the code and a fixed message"
    );
    // Positive control: the same request for another user goes through (the 500 was the CHECK).
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token(&format!("{user}-ok"), "acme", &[])),
        &format!("{trace}-ok"),
        &json!({"message": "what vendors do I have?", "pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// `CTXGUARD_TEST_DATABASE_URL` with another database name.
fn url_for(database: &str) -> String {
    support::with_dbname(&env("CTXGUARD_TEST_DATABASE_URL"), database)
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, Value) {
    let r = http()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_requires_the_extension_at_the_gateways_version() {
    const DB: &str = "ctxguard_ready_check";
    let admin = admin().await;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"))
        .await
        .unwrap();
    admin
        .batch_execute(&format!("CREATE DATABASE {DB}"))
        .await
        .unwrap();
    let url = url_for(DB);
    let (gw, _) = gateway_on(&url, &[]).await;
    let (status, body) = get(gw, "/ready").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("EXTENSION_MISSING")),
        "{body}"
    );
    let scratch = connect_as(
        &env("CTXGUARD_TEST_ADMIN_URL")
            .replace(&format!("dbname={}", env_db()), &format!("dbname={DB}")),
    )
    .await;
    scratch
        .batch_execute(
            "SET client_min_messages = warning; CREATE EXTENSION ctxguard VERSION '0.1.0'",
        )
        .await
        .unwrap();
    let (status, body) = get(gw, "/ready").await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("EXTENSION_VERSION")),
        "an older extension: {body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("0.1.0"),
        "{body}"
    );
    // Positive control: updated to the gateway's version, the same gateway is ready.
    scratch
        .batch_execute("ALTER EXTENSION ctxguard UPDATE")
        .await
        .unwrap();
    let (status, body) = get(gw, "/ready").await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ready")),
        "{body}"
    );
    drop(scratch);
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {DB} WITH (FORCE)"))
        .await
        .unwrap();
}

/// The test database's name (from `CTXGUARD_TEST_ADMIN_URL`).
fn env_db() -> String {
    env("CTXGUARD_TEST_ADMIN_URL")
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("dbname=").map(str::to_string))
        .expect("dbname in CTXGUARD_TEST_ADMIN_URL")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_answers_only_to_allowed_hosts() {
    let gw = gateway(&[
        "--mcp-allowed-hosts",
        "localhost,127.0.0.1,assistant.acme.example",
    ])
    .await;
    let tok = token("alice", "acme", &[]);
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "host-test", "version": "1"}}});
    let post = |host: &'static str| {
        let (tok, initialize) = (tok.clone(), initialize.clone());
        async move {
            let r = http()
                .post(format!("http://{gw}/mcp"))
                .header("host", host)
                .header("accept", "application/json, text/event-stream")
                .bearer_auth(tok)
                .json(&initialize)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    };
    // A DNS-rebinding page: its own name, resolved to the gateway's address.
    for host in [
        "evil.example",
        "evil.example:80",
        "assistant.acme.example.evil.example",
    ] {
        let (status, body) = post(host).await;
        assert_eq!(status, 403, "{host}: {body}");
        assert!(!body.contains("serverInfo"), "{host}: no session: {body}");
    }
    // Positive controls: the configured names are served.
    for host in ["127.0.0.1", "assistant.acme.example"] {
        let (status, body) = post(host).await;
        assert_eq!(status, 200, "{host}: {body}");
        assert!(body.contains("serverInfo"), "{host}: initialized: {body}");
    }
}

/// Seconds from `from` to `to` (timestamps read as text), computed by the database.
async fn seconds_between(db: &tokio_postgres::Client, from: &str, to: &str) -> f64 {
    db.query_one(
        "SELECT extract(epoch FROM ($2::text::timestamptz - $1::text::timestamptz))::float8",
        &[&from, &to],
    )
    .await
    .unwrap()
    .get(0)
}

/// What one tenant's user starts on the lifetime page: a generation, an authorized upstream call
/// and a pending approval, and the transaction's `now()` they were stamped with.
struct Started {
    tok: String,
    generation: String,
    external: String,
    approval: String,
    now: String,
}

async fn start(db: &mut tokio_postgres::Client, tenant: &str) -> Started {
    let tok = token("ttl-user", tenant, &["ap_clerk"]);
    let page = json!({"pageType": "ttl_lab"});
    let tx = db.transaction().await.unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &page])
        .await
        .unwrap();
    let generation: String = tx
        .query_one("SELECT ctxguard.begin_generation('ttl')::text", &[])
        .await
        .unwrap()
        .get(0);
    tx.execute(
        "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
        &[&tok, &page, &generation],
    )
    .await
    .unwrap();
    let external: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('up.echo', '{\"text\": \"hi\"}')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(external["status"], "authorized", "{external}");
    let approval: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('test.needs_approval', '{\"note\": \"later\"}')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(approval["error"]["code"], "APPROVAL_REQUIRED", "{approval}");
    let now: String = tx
        .query_one("SELECT now()::text", &[])
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    Started {
        tok,
        generation,
        external: external["call_id"].as_str().unwrap().to_string(),
        approval: approval["call_id"].as_str().unwrap().to_string(),
        now,
    }
}

/// (generation accepted, approval outcome, completion outcome) once the lifetimes are checked.
async fn finish(db: &mut tokio_postgres::Client, s: &Started) -> (bool, String, String) {
    let page = json!({"pageType": "ttl_lab"});
    let tx = db.transaction().await.unwrap();
    let generation_ok = tx
        .execute(
            "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
            &[&s.tok, &page, &s.generation],
        )
        .await
        .is_ok();
    tx.rollback().await.unwrap();
    let tx = db.transaction().await.unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&s.tok, &page])
        .await
        .unwrap();
    let code = |v: Value| {
        v["error"]["code"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v["status"].as_str().unwrap_or_default().to_string())
    };
    let approved: Value = tx
        .query_one(
            "SELECT ctxguard.approve_call($1::text::uuid)",
            &[&s.approval],
        )
        .await
        .unwrap()
        .get(0);
    let completed: Value = tx
        .query_one(
            "SELECT ctxguard.complete_call($1::text::uuid, '{\"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}')",
            &[&s.external],
        )
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    (generation_ok, code(approved), code(completed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifetimes_follow_tenant_limits_and_end() {
    let run = uuid::Uuid::new_v4().simple().to_string();
    // A tenant with the shortest lifetimes allowed, and a control tenant with the settings.
    let (short, control) = (format!("ttl-short-{run}"), format!("ttl-ctl-{run}"));
    let admin = admin().await;
    admin
        .execute(
            "INSERT INTO ctxguard.tenant_limits (tenant_id, generation_ttl, approval_ttl, external_call_ttl) VALUES ($1, 2, 10, 5)",
            &[&short],
        )
        .await
        .unwrap();
    let mut db = connect_as(&env("CTXGUARD_TEST_DATABASE_URL")).await;
    let s = start(&mut db, &short).await;
    let c = start(&mut db, &control).await;

    // The override decides each expiry, exactly; the control tenant gets the settings.
    let expiry = |table: &'static str, id: String| {
        let admin = &admin;
        async move {
            let at: String = admin
                .query_one(
                    &format!(
                        "SELECT expires_at::text FROM ctxguard.{table} WHERE {} = $1::text::uuid",
                        if table == "generations" {
                            "id"
                        } else {
                            "call_id"
                        }
                    ),
                    &[&id],
                )
                .await
                .unwrap()
                .get(0);
            at
        }
    };
    let settings: (i32, i32, i32) = admin
        .query_one(
            "SELECT generation_ttl, approval_ttl, external_call_ttl FROM ctxguard.effective_ttls()",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    let mut last_short = String::new();
    for (who, st, ttls) in [
        ("short", &s, (2.0, 10.0, 5.0)),
        (
            "control",
            &c,
            (
                f64::from(settings.0),
                f64::from(settings.1),
                f64::from(settings.2),
            ),
        ),
    ] {
        let g = expiry("generations", st.generation.clone()).await;
        let a = expiry("approvals", st.approval.clone()).await;
        let e = expiry("external_calls", st.external.clone()).await;
        assert_eq!(
            (
                seconds_between(&admin, &st.now, &g).await,
                seconds_between(&admin, &st.now, &a).await,
                seconds_between(&admin, &st.now, &e).await
            ),
            ttls,
            "{who}: generation, approval and upstream call lifetimes"
        );
        if who == "short" {
            last_short = a;
        }
    }
    assert!(
        settings.0 > 12 && settings.1 > 12 && settings.2 > 12,
        "the control outlives the wait: {settings:?}"
    );

    // Wait until the database's clock is past the short tenant's last expiry (its approval's):
    // the event is the server's time, read from the server.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let past: bool = admin
            .query_one("SELECT now() > $1::text::timestamptz", &[&last_short])
            .await
            .unwrap()
            .get(0);
        if past {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the database clock never passed {last_short}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    assert_eq!(
        finish(&mut db, &s).await,
        (
            false,
            "APPROVAL_INVALID".to_string(),
            "NOT_FOUND".to_string()
        ),
        "the short tenant's generation, approval and upstream call have lapsed"
    );
    assert_eq!(
        finish(&mut db, &c).await,
        (true, "ok".to_string(), "ok".to_string()),
        "positive control: the control tenant's, started at the same time, still work"
    );
    admin
        .execute(
            "DELETE FROM ctxguard.tenant_limits WHERE tenant_id = $1",
            &[&short],
        )
        .await
        .unwrap();
}

/// One JSON-RPC exchange with `/mcp` (session-based protocol): the response's JSON-RPC message
/// (from a JSON body or the first `data:` line of an event stream) and the session id header.
async fn mcp_rpc(
    gw: std::net::SocketAddr,
    tok: &str,
    session: Option<&str>,
    body: &Value,
) -> (u16, Option<Value>, Option<String>) {
    let mut r = http()
        .post(format!("http://{gw}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .bearer_auth(tok)
        .json(body);
    if let Some(s) = session {
        r = r
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = resp.text().await.unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text).ok().or_else(|| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m.get("id").is_some())
    });
    (status, message, sid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_on_a_stored_page_that_no_longer_passes_is_context_invalid() {
    let run = uuid::Uuid::new_v4().simple().to_string();
    let invoice = format!("acme_ctxinv_{run}");
    let admin = admin().await;
    admin
        .execute(
            "INSERT INTO demo.invoices (tenant_id, id, vendor_id, number, amount, status, issued_on, due_on)
             VALUES ('acme', $1, 'acme_v1', 'ACME-CTX-1', 10, 'open', current_date, current_date)",
            &[&invoice],
        )
        .await
        .unwrap();
    let gw = gateway(&[]).await;
    // A user of its own: the stored page is this test's alone.
    let tok = token(&format!("ctxinv-{run}"), "acme", &["ap_clerk"]);
    let page = json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": invoice}});
    let resp = http()
        .put(format!("http://{gw}/v1/context"))
        .bearer_auth(&tok)
        .json(&page)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "the page is stored");
    let (status, init, sid) = mcp_rpc(gw, &tok, None, &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "ctx-test", "version": "1"}}})).await;
    assert_eq!(status, 200, "{init:?}");
    let sid = sid.expect("a session id");
    mcp_rpc(
        gw,
        &tok,
        Some(&sid),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "invoice__get", "arguments": {}}});
    // Positive control: on the stored page the call runs.
    let (status, ok, _) = mcp_rpc(gw, &tok, Some(&sid), &call).await;
    let ok = ok.expect("a response");
    assert_eq!(status, 200, "{ok}");
    assert_ne!(ok["result"]["isError"], true, "{ok}");
    assert_eq!(
        ok["result"]["structuredContent"]["id"],
        invoice.as_str(),
        "{ok}"
    );
    // The entity goes away: the stored page no longer passes set_context.
    admin
        .execute(
            "DELETE FROM demo.invoices WHERE tenant_id = 'acme' AND id = $1",
            &[&invoice],
        )
        .await
        .unwrap();
    let (status, refused, _) = mcp_rpc(gw, &tok, Some(&sid), &call).await;
    let refused = refused.expect("a response");
    assert_eq!(status, 200, "{refused}");
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert_eq!(
        refused["result"]["structuredContent"]["error"]["code"], "CONTEXT_INVALID",
        "{refused}"
    );
}
