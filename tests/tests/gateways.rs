//! Many gateways, one truth (issue 20): two gateways behind pgbouncer in transaction mode share
//! each user's page and the MCP sessions through the database. A page set through one gateway
//! reaches an MCP session held by the other (`notifications/tools/list_changed`, then its tools);
//! a session opened through one gateway is served, and ended, through the other; a session used
//! through one gateway is not ended by the other's idle timeout, while a truly idle one ends
//! everywhere; a session's own page changed through one gateway reaches its GET stream on the other.
//!
//! Needs `CTXGUARD_TEST_POOLER_URL` besides the usual variables.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxguard_gateway::http::AppState;
use futures::StreamExt;
use serde_json::{json, Value};
use support::*;

const ACCEPT: &str = "application/json, text/event-stream";

/// Two gateways through pgbouncer, each listening for page changes on a direct connection (from
/// its first MCP session on).
async fn two_gateways() -> (SocketAddr, SocketAddr, Arc<AppState>) {
    let (a, _, b, sb) = two_gateways_with(&[]).await;
    (a, b, sb)
}

/// Two gateways as [`two_gateways`], with more settings: (A, its state, B, its state).
async fn two_gateways_with(
    extra: &[&str],
) -> (SocketAddr, Arc<AppState>, SocketAddr, Arc<AppState>) {
    let pooled = env("CTXGUARD_TEST_POOLER_URL");
    let direct = env("CTXGUARD_TEST_DATABASE_URL");
    let mut args = vec!["--notify-database-url", direct.as_str()];
    args.extend_from_slice(extra);
    let (a, sa) = gateway_at(&pooled, &args).await;
    let (b, sb) = gateway_at(&pooled, &args).await;
    (a, sa, b, sb)
}

/// Wait (on the state, not the clock) until the gateway follows notifications.
async fn listening(state: &AppState) {
    for _ in 0..400 {
        if state.pages.following() == "listening" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("not listening: {}", state.pages.following());
}

/// The JSON-RPC message answering `id` in an SSE (or JSON) body.
fn answer(body: &str, id: i64) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return v;
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id} in {body}"))
}

/// POST one JSON-RPC message to `/mcp`; (status, session id header, body).
async fn rpc(
    gw: SocketAddr,
    tok: &str,
    session: Option<&str>,
    msg: &Value,
) -> (u16, Option<String>, String) {
    rpc_on_page(gw, tok, session, None, msg).await
}

/// [`rpc`] with an `X-Ctxguard-Page` header when `page` is given.
async fn rpc_on_page(
    gw: SocketAddr,
    tok: &str,
    session: Option<&str>,
    page: Option<&Value>,
    msg: &Value,
) -> (u16, Option<String>, String) {
    let mut r = http()
        .post(format!("http://{gw}/mcp"))
        .bearer_auth(tok)
        .header("accept", ACCEPT)
        .header("content-type", "application/json")
        .json(msg);
    if let Some(s) = session {
        r = r
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-06-18");
    }
    if let Some(p) = page {
        r = r.header("x-ctxguard-page", p.to_string());
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    (status, sid, resp.text().await.unwrap())
}

/// Initialise a session through `gw`: its id.
async fn initialize(gw: SocketAddr, tok: &str) -> String {
    let (status, sid, body) = rpc(gw, tok, None, &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "gateways-test", "version": "1"}}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(answer(&body, 1)["result"]["serverInfo"]["name"], "ctxguard");
    let sid = sid.expect("a session id");
    let (status, _, body) = rpc(
        gw,
        tok,
        Some(&sid),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    sid
}

async fn tool_names(gw: SocketAddr, tok: &str, sid: &str) -> Vec<String> {
    tool_names_on(gw, tok, sid, None).await
}

/// `tools/list` in a session, with a page header when `page` is given (the session's own page
/// from then on).
async fn tool_names_on(gw: SocketAddr, tok: &str, sid: &str, page: Option<&Value>) -> Vec<String> {
    let (status, _, body) = rpc_on_page(
        gw,
        tok,
        Some(sid),
        page,
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut names: Vec<String> = answer(&body, 7)["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

async fn put_page(gw: SocketAddr, tok: &str, page: &Value) {
    let resp = http()
        .put(format!("http://{gw}/v1/context"))
        .bearer_auth(tok)
        .json(page)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_set_through_one_gateway_reaches_a_session_on_the_other_within_a_second() {
    let (a, b, state_b) = two_gateways().await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let tok = token(&format!("mcp-{run}"), "acme", &["ap_clerk"]);
    put_page(a, &tok, &json!({"pageType": "vendor_table"})).await;
    let sid = initialize(b, &tok).await;
    // B's first session started its listening connection.
    listening(&state_b).await;
    let names = tool_names(b, &tok, &sid).await;
    assert!(names.contains(&"vendor__list".to_string()), "{names:?}");
    assert!(!names.contains(&"invoice__get".to_string()), "{names:?}");

    // The session's GET stream on B.
    let (watcher, rx) = watch(b, &tok, &sid).await;
    // The same page again changes nothing and announces nothing; then a new page.
    put_page(a, &tok, &json!({"pageType": "vendor_table"})).await;
    let put_at = Instant::now();
    put_page(a, &tok, &invoice_page("acme_inv3")).await;
    let heard = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .expect("list_changed on gateway B")
        .unwrap();
    assert!(
        heard.duration_since(put_at) < Duration::from_secs(1),
        "list_changed {:?} after the PUT on A",
        heard.duration_since(put_at)
    );
    watcher.abort();
    let names = tool_names(b, &tok, &sid).await;
    assert!(names.contains(&"invoice__get".to_string()), "{names:?}");
    assert!(!names.contains(&"vendor__list".to_string()), "{names:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_on_one_gateway_is_used_and_ended_on_the_other() {
    let (a, b, _) = two_gateways().await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let tok = token(&format!("mcp-{run}"), "acme", &["ap_clerk"]);
    put_page(a, &tok, &invoice_page("acme_inv3")).await;
    let sid = initialize(a, &tok).await;

    // Another user's token never reaches the session, on either gateway (as if it did not exist).
    let mallory = token(&format!("mallory-{run}"), "acme", &["ap_clerk"]);
    let (status, _, _) = rpc(
        b,
        &mallory,
        Some(&sid),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    assert_eq!(status, 404);

    // B serves the session it never saw initialised.
    assert!(tool_names(b, &tok, &sid)
        .await
        .contains(&"invoice__get".to_string()));
    let (status, _, body) = rpc(
        b,
        &tok,
        Some(&sid),
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "invoice__get", "arguments": {}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let result = answer(&body, 3)["result"].clone();
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["id"], "acme_inv3", "{result}");

    // Ended through B: A no longer knows it.
    end_session(b, &tok, &sid).await;
    let (status, _, body) = rpc(
        a,
        &tok,
        Some(&sid),
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (status, _, _) = rpc(
        b,
        &tok,
        Some(&sid),
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
    )
    .await;
    assert_eq!(status, 404);
    let rows: i64 = admin()
        .await
        .query_one(
            "SELECT count(*) FROM ctxguard.mcp_sessions WHERE user_id = $1",
            &[&format!("mcp-{run}")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_through_one_gateway_closes_its_stream_on_the_other() {
    // The idle timeout sets the reaper's tick (a quarter of it): A notices within a tick or two.
    let (a, _, b, _) = two_gateways_with(&["--mcp-session-idle-timeout-ms", "2000"]).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let tok = token(&format!("ended-{run}"), "acme", &["ap_clerk"]);
    put_page(a, &tok, &invoice_page("acme_inv3")).await;
    let sid = initialize(a, &tok).await;
    let stream = open_stream(a, &tok, &sid).await;
    let closed = tokio::spawn(async move {
        let mut body = stream.bytes_stream();
        while let Some(Ok(_)) = body.next().await {}
    });
    // A stream of a live session stays open (keep-alives only).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!closed.is_finished(), "the stream of a live session closed");

    end_session(b, &tok, &sid).await;
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the session ended through B, and its GET stream on A is still open")
        .unwrap();
}

/// End the session through `gw` (`DELETE /mcp`).
async fn end_session(gw: SocketAddr, tok: &str, sid: &str) {
    let resp = http()
        .delete(format!("http://{gw}/mcp"))
        .bearer_auth(tok)
        .header("mcp-session-id", sid)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
}

/// The session's GET stream on `gw`, opened (200).
async fn open_stream(gw: SocketAddr, tok: &str, sid: &str) -> reqwest::Response {
    let stream = http()
        .get(format!("http://{gw}/mcp"))
        .bearer_auth(tok)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", sid)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status().as_u16(), 200);
    stream
}

/// Open the session's GET stream on `gw`: a task reading it, and when it first heard
/// `notifications/tools/list_changed`.
async fn watch(
    gw: SocketAddr,
    tok: &str,
    sid: &str,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<Instant>,
) {
    let stream = open_stream(gw, tok, sid).await;
    let (tx, rx) = tokio::sync::oneshot::channel::<Instant>();
    let watcher = tokio::spawn(async move {
        let mut body = stream.bytes_stream();
        let mut seen = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("notifications/tools/list_changed") {
                let _ = tx.send(Instant::now());
                return;
            }
        }
    });
    (watcher, rx)
}

/// The user's session records in the database (read as the owner: no gateway sees it).
async fn session_rows(user: &str) -> i64 {
    admin()
        .await
        .query_one(
            "SELECT count(*) FROM ctxguard.mcp_sessions WHERE user_id = $1",
            &[&user],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_used_through_one_gateway_is_not_ended_by_the_idle_timeout_of_the_other() {
    let idle = Duration::from_millis(2000);
    let (a, _, b, _) = two_gateways_with(&["--mcp-session-idle-timeout-ms", "2000"]).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let user = format!("idle-{run}");
    let tok = token(&user, "acme", &["ap_clerk"]);
    put_page(a, &tok, &invoice_page("acme_inv3")).await;
    let sid = initialize(a, &tok).await;

    // Used only through B for four idle timeouts: A, which last saw it at its start, must not end
    // it (B would answer 404).
    let until = Instant::now() + idle * 4;
    while Instant::now() < until {
        let names = tool_names(b, &tok, &sid).await;
        assert!(names.contains(&"invoice__get".to_string()), "{names:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A still serves it (from its memory, or restored from the database). The use is when the
    // request is made: the gateway decides whether to record it then, not when its answer arrives
    // here (a loaded machine's answer took 80 ms, and the check below came out that much short).
    let last_use = Instant::now();
    let names = tool_names(a, &tok, &sid).await;
    assert!(names.contains(&"invoice__get".to_string()), "{names:?}");

    // Truly idle now: its record ends (watched in the database: a request would be a use), not
    // before an idle timeout, and both gateways answer 404.
    let deadline = Instant::now() + Duration::from_secs(20);
    while session_rows(&user).await > 0 {
        assert!(Instant::now() < deadline, "the idle session never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        last_use.elapsed() >= idle,
        "ended {:?} after its last use",
        last_use.elapsed()
    );
    for gw in [a, b] {
        let (status, _, body) = rpc(
            gw,
            &tok,
            Some(&sid),
            &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}),
        )
        .await;
        assert_eq!(status, 404, "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_held_on_one_gateway_keeps_its_session_alive_on_the_other() {
    let idle = Duration::from_millis(2000);
    let (a, _, b, _) = two_gateways_with(&["--mcp-session-idle-timeout-ms", "2000"]).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let user = format!("stream-{run}");
    let tok = token(&user, "acme", &["ap_clerk"]);
    put_page(a, &tok, &invoice_page("acme_inv3")).await;
    let sid = initialize(a, &tok).await;
    let (watcher, _) = watch(a, &tok, &sid).await;
    // B knows it too (one request), then nothing but A's open stream for three idle timeouts:
    // B's idle timeout must not end it.
    assert!(tool_names(b, &tok, &sid)
        .await
        .contains(&"invoice__get".to_string()));
    tokio::time::sleep(idle * 3).await;
    assert_eq!(
        session_rows(&user).await,
        1,
        "the streamed session's record"
    );
    for gw in [b, a] {
        let names = tool_names(gw, &tok, &sid).await;
        assert!(names.contains(&"invoice__get".to_string()), "{names:?}");
    }
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_page_changed_through_one_gateway_reaches_its_stream_on_the_other() {
    let (a, state_a, b, _) = two_gateways_with(&[]).await;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let tok = token(&format!("own-{run}"), "acme", &["ap_clerk"]);
    let vendors = json!({"pageType": "vendor_table"});
    put_page(a, &tok, &vendors).await;
    // Two sessions on A: one with a page of its own (set on A), one following the shared page.
    let sid = initialize(a, &tok).await;
    let other = initialize(a, &tok).await;
    listening(&state_a).await;
    let names = tool_names_on(a, &tok, &sid, Some(&vendors)).await;
    assert!(names.contains(&"vendor__list".to_string()), "{names:?}");
    let (watcher, heard) = watch(a, &tok, &sid).await;
    let (other_watcher, mut other_heard) = watch(a, &tok, &other).await;

    // The session's own page changed through B: its stream on A hears it within a second.
    let changed_at = Instant::now();
    let names = tool_names_on(b, &tok, &sid, Some(&invoice_page("acme_inv3"))).await;
    assert!(names.contains(&"invoice__get".to_string()), "{names:?}");
    let at = tokio::time::timeout(Duration::from_secs(5), heard)
        .await
        .expect("list_changed on gateway A")
        .unwrap();
    assert!(
        at.duration_since(changed_at) < Duration::from_secs(1),
        "list_changed {:?} after the change on B",
        at.duration_since(changed_at)
    );
    // A now lists the session's new page (no header), and the user's other session, which
    // follows the unchanged shared page, was not told anything.
    let names = tool_names(a, &tok, &sid).await;
    assert!(names.contains(&"invoice__get".to_string()), "{names:?}");
    assert!(!names.contains(&"vendor__list".to_string()), "{names:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        other_heard.try_recv().is_err(),
        "the other session was told to re-list"
    );
    assert!(tool_names(a, &tok, &other)
        .await
        .contains(&"vendor__list".to_string()));
    watcher.abort();
    other_watcher.abort();
}
