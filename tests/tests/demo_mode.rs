//! Demo mode and `POST /v1/tools` against the real gateway router and a real PostgreSQL.
//! Demo mode mints tokens for its demo users, so it exists only when asked for, only on loopback,
//! and its tokens are ordinary tokens the database verifies like any other.

mod support;

use clap::Parser;
use ctxguard_gateway::config::Config;
use serde_json::{json, Value};
use support::*;

/// The test's signing secret in a file only its owner reads, removed when dropped (the gateway
/// reads it once, at start).
struct SecretFile(std::path::PathBuf);

impl SecretFile {
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn secret_file() -> SecretFile {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::env::temp_dir().join(format!("ctxguard-demo-secret-{}", uuid::Uuid::new_v4()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(env("CTXGUARD_TEST_JWT_SECRET").as_bytes()))
        .unwrap();
    SecretFile(path)
}

/// A gateway in demo mode whose screens read through `screens_url`.
async fn demo_gateway_reading_as(screens_url: &str) -> std::net::SocketAddr {
    let secret = secret_file();
    gateway(&[
        "--demo",
        "true",
        "--demo-jwt-secret-file",
        secret.path(),
        "--demo-jwt-audience",
        "ctxguard-tests",
        "--demo-database-url",
        screens_url,
    ])
    .await
}

/// A gateway in demo mode as the demo runs it: screens through the app's role (ctxguard_app).
async fn demo_gateway() -> std::net::SocketAddr {
    demo_gateway_reading_as(&app_url()).await
}

async fn get(addr: std::net::SocketAddr, path: &str) -> reqwest::Response {
    http()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .unwrap()
}

async fn demo_token(addr: std::net::SocketAddr, user: &str) -> (u16, Value) {
    post_json(addr, "/demo/token", None, "demo", &json!({"user": user})).await
}

fn config(args: &[&str]) -> Result<(), String> {
    let mut all = vec!["ctxguard-gateway", "--database-url", "host=/nowhere"];
    all.extend_from_slice(args);
    Config::try_parse_from(all)
        .map_err(|e| e.to_string())?
        .validate()
        .map_err(|e| e.to_string())
}

#[test]
fn demo_mode_is_opt_in_loopback_only_and_needs_the_secret_and_the_screens_role() {
    let file = secret_file();
    let secret = file.path();
    let screens = ["--demo-database-url", "host=/nowhere user=ctxguard_app"];
    assert!(config(&[]).is_ok());
    let demo = |extra: &[&str]| {
        let mut args = vec!["--demo", "true"];
        args.extend_from_slice(extra);
        config(&args)
    };
    assert!(demo(&["--demo-jwt-secret-file", secret, screens[0], screens[1]]).is_ok());
    let err = demo(&[screens[0], screens[1]]).unwrap_err();
    assert!(err.contains("CTXGUARD_DEMO_JWT_SECRET_FILE"), "{err}");
    // The screens read raw page text: never through the gateway role's pool.
    for missing in [
        &["--demo-jwt-secret-file", secret][..],
        &["--demo-jwt-secret-file", secret, "--demo-database-url", ""],
    ] {
        let err = demo(missing).unwrap_err();
        assert!(err.contains("CTXGUARD_DEMO_DATABASE_URL"), "{err}");
    }
    let err = demo(&[
        "--demo-jwt-secret-file",
        secret,
        screens[0],
        screens[1],
        "--listen",
        "0.0.0.0:8088",
    ])
    .unwrap_err();
    assert!(err.contains("loopback"), "{err}");
    let err = config(&["--demo-jwt-secret-file", secret]).unwrap_err();
    assert!(err.contains("only read in demo mode"), "{err}");
    let err = config(&screens).unwrap_err();
    assert!(
        err.contains("CTXGUARD_DEMO_DATABASE_URL") && err.contains("only read in demo mode"),
        "{err}"
    );
}

#[test]
fn demo_mode_does_not_start_without_the_screens_role() {
    // Even a config that skipped validation builds no demo state without the screens' URL.
    let secret = secret_file();
    let config = Config::try_parse_from([
        "ctxguard-gateway",
        "--database-url",
        &env("CTXGUARD_TEST_DATABASE_URL"),
        "--demo",
        "true",
        "--demo-jwt-secret-file",
        secret.path(),
    ])
    .unwrap();
    let err = ctxguard_gateway::http::AppState::from_config(config)
        .err()
        .expect("demo mode without CTXGUARD_DEMO_DATABASE_URL must not start");
    assert!(err.contains("CTXGUARD_DEMO_DATABASE_URL"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_demo_mode_there_is_no_app_and_no_token_minting() {
    let gw = gateway(&[]).await;
    for path in ["/", "/invoices", "/demo/app.js", "/demo/users"] {
        assert_eq!(get(gw, path).await.status(), 404, "{path}");
    }
    let (status, body) = demo_token(gw, "alice").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.get("token").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_mode_serves_the_app_with_a_strict_policy_and_mints_verified_tokens() {
    let gw = demo_gateway().await;
    for (path, kind) in [
        ("/", "text/html"),
        ("/invoices/acme_inv3", "text/html"),
        ("/documents/acme_guide", "text/html"),
        ("/demo/app.js", "text/javascript"),
        ("/demo/app.css", "text/css"),
    ] {
        let r = get(gw, path).await;
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
            "{csp}"
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
    }
    assert_eq!(get(gw, "/invoices/a/b").await.status(), 404);

    let users: Value = get(gw, "/demo/users").await.json().await.unwrap();
    let tenants: Vec<&str> = users["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["tenant"].as_str().unwrap())
        .collect();
    assert!(tenants.contains(&"acme") && tenants.contains(&"globex"));

    // DNS rebinding: a page whose own name resolves to 127.0.0.1 gets nothing.
    let r = http()
        .post(format!("http://{gw}/demo/token"))
        .header("host", "evil.example")
        .json(&json!({"user": "alice"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "HOST_NOT_ALLOWED");
    let r = http()
        .get(format!("http://{gw}/"))
        .header("host", "evil.example:8088")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    let (status, body) = demo_token(gw, "mallory").await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "NOT_FOUND");
    assert!(!body.to_string().contains("mallory"), "no echo: {body}");
    let (status, body) = post_json(
        gw,
        "/demo/token",
        None,
        "demo",
        &json!({"user": "alice", "tenant": "globex"}),
    )
    .await;
    assert_eq!(status, 400, "a tenant cannot be asked for: {body}");

    // The minted token is verified by the database like any other: Alice of Acme.
    let (status, body) = demo_token(gw, "alice").await;
    assert_eq!(status, 200, "{body}");
    let alice = body["token"].as_str().unwrap().to_string();
    let (status, tools) = post_json(
        gw,
        "/v1/tools",
        Some(&alice),
        "demo",
        &json!({"pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(status, 200, "{tools}");
    assert_eq!(tools["context"]["userId"], "alice");
    assert_eq!(tools["context"]["tenantId"], "acme");

    // Screens are read under the page context: Carol sees Globex's vendors, and Acme's invoice is
    // refused with the same message as a missing one.
    let (_, body) = demo_token(gw, "carol").await;
    let carol = body["token"].as_str().unwrap().to_string();
    let (status, page) = post_json(
        gw,
        "/demo/page",
        Some(&carol),
        "demo",
        &json!({"pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let ids: Vec<&str> = page["data"]["vendors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    assert!(
        !ids.is_empty() && ids.iter().all(|i| i.starts_with("glx_")),
        "{ids:?}"
    );
    let (status, foreign) = post_json(
        gw,
        "/demo/page",
        Some(&carol),
        "demo",
        &json!({"pageContext": invoice_page("acme_inv3")}),
    )
    .await;
    let (_, missing) = post_json(
        gw,
        "/demo/page",
        Some(&carol),
        "demo",
        &json!({"pageContext": invoice_page("no_such_invoice")}),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(foreign, missing, "another tenant's row looks like no row");
    let (status, _) = post_json(
        gw,
        "/demo/page",
        None,
        "demo",
        &json!({"pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screens_read_through_their_own_role_never_the_gateway_role() {
    let alice = token("alice", "acme", &["ap_clerk"]);
    let viewer = json!({"pageContext": {"pageType": "document_viewer",
                                        "entity": {"type": "document", "id": "acme_guide"},
                                        "pageState": {"filters": {"page": "42"}}}});
    // As the demo runs it: the human viewer shows the page, unmasked.
    let gw = demo_gateway().await;
    let (status, page) = post_json(gw, "/demo/page", Some(&alice), "screens-app", &viewer).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page["data"]["page"]["text"]
            .as_str()
            .unwrap()
            .contains("ivan.petrov@orion-support.example"),
        "{page}"
    );
    let (status, page) = post_json(
        gw,
        "/demo/page",
        Some(&alice),
        "screens-app",
        &json!({"pageContext": invoice_page("acme_inv3")}),
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["data"]["invoice"]["number"], "ACME-2026-0003");

    // Pointed at the gateway role, the screens get nothing: it cannot execute demo.page_data.
    let misconfigured = demo_gateway_reading_as(&env("CTXGUARD_TEST_DATABASE_URL")).await;
    let (status, body) = post_json(
        misconfigured,
        "/demo/page",
        Some(&alice),
        "screens-gw",
        &viewer,
    )
    .await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["error"]["code"], "INTERNAL");
    assert!(!body.to_string().contains("ivan"), "{body}");

    // And directly: the gateway role cannot run any screen function, with or without a context.
    let mut gw_db = connect_as(&env("CTXGUARD_TEST_DATABASE_URL")).await;
    for sql in [
        "SELECT demo.page_data()",
        "SELECT demo.viewer_page(42)",
        "SELECT demo.document_list(NULL, NULL)",
        "SELECT demo.manual_page(77, 500)",
    ] {
        let tx = gw_db.transaction().await.unwrap();
        tx.execute(
            "SELECT ctxguard.set_context($1, $2)",
            &[&alice, &viewer["pageContext"]],
        )
        .await
        .unwrap();
        let err = tx.query_one(sql, &[]).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {err:?}"
        );
        tx.rollback().await.unwrap();
    }
}

fn reasons(body: &Value) -> std::collections::BTreeMap<String, (bool, String)> {
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                (
                    t["visible"].as_bool().unwrap(),
                    t["reason"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_tools_explains_gate_a_per_page_and_user() {
    let gw = gateway(&[]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let bob = token("bob", "acme", &["viewer"]);

    let (status, body) = post_json(
        gw,
        "/v1/tools",
        Some(&alice),
        "t1",
        &json!({"pageContext": {"pageType": "invoice_table"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["page"]["type"], "invoice_table");
    let r = reasons(&body);
    assert_eq!(r["invoice.list"], (true, "visible".into()));
    assert_eq!(r["invoice.get"], (false, "wrong_page".into()));
    let visible: Vec<bool> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["visible"].as_bool().unwrap())
        .collect();
    assert!(
        visible.windows(2).all(|w| w[0] >= w[1]),
        "visible tools come first"
    );

    let (_, body) = post_json(
        gw,
        "/v1/tools",
        Some(&alice),
        "t2",
        &json!({"pageContext": invoice_page("acme_inv3")}),
    )
    .await;
    let r = reasons(&body);
    assert_eq!(r["invoice.mark_paid"], (true, "visible".into()));
    let mark_paid = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "invoice.mark_paid")
        .unwrap();
    assert_eq!(mark_paid["requiresApproval"], true);
    assert_eq!(
        mark_paid["conditions"], "requires_approval",
        "what Gate B still checks is named"
    );
    assert_eq!(mark_paid["readOnly"], false);
    let (_, body) = post_json(
        gw,
        "/v1/tools",
        Some(&bob),
        "t3",
        &json!({"pageContext": invoice_page("acme_inv3")}),
    )
    .await;
    assert_eq!(
        reasons(&body)["invoice.mark_paid"],
        (false, "missing_role".into())
    );

    // Fail closed: no token, a bad page, another tenant's entity, no page at all.
    let (status, _) = post_json(
        gw,
        "/v1/tools",
        None,
        "t4",
        &json!({"pageContext": {"pageType": "invoice_table"}}),
    )
    .await;
    assert_eq!(status, 401);
    let (status, body) = post_json(
        gw,
        "/v1/tools",
        Some(&alice),
        "t5",
        &json!({"pageContext": {"pageType": "admin_console"}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("INVALID_PAGE_CONTEXT"))
    );
    assert!(
        !body.to_string().contains("admin_console"),
        "no echo: {body}"
    );
    let (status, _) = post_json(
        gw,
        "/v1/tools",
        Some(&alice),
        "t6",
        &json!({"pageContext": invoice_page("glx_inv3")}),
    )
    .await;
    assert_eq!(status, 422);
    let (status, _) = post_json(gw, "/v1/tools", Some(&alice), "t7", &json!({})).await;
    assert!(status == 400 || status == 422, "{status}");
}

/// `POST /v1/tools` lists every visible tool and at most `CTXGUARD_EXPLAIN_MAX_HIDDEN` hidden ones
/// (issue 34: the request explained every catalogued tool, 1.7 s of a core at 100,000 tools, for
/// any user); `hiddenMore` says whether the catalog holds others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_tools_lists_at_most_max_hidden_hidden_tools() {
    let alice = token("alice", "acme", &["ap_clerk"]);
    let page = json!({"pageContext": {"pageType": "invoice_table"}});
    let names = |body: &Value, visible: bool| -> Vec<String> {
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["visible"] == visible)
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    let wide = gateway(&[]).await;
    let (status, all) = post_json(wide, "/v1/tools", Some(&alice), "h1", &page).await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(
        all["hiddenMore"], false,
        "the test catalog is under 200 hidden tools"
    );
    let hidden_all = names(&all, false);
    assert!(
        hidden_all.len() > 3,
        "fixture: several hidden tools on the invoice table"
    );

    let narrow = gateway(&["--explain-max-hidden", "2"]).await;
    let (status, two) = post_json(narrow, "/v1/tools", Some(&alice), "h2", &page).await;
    assert_eq!(status, 200, "{two}");
    assert_eq!(two["hiddenMore"], true);
    assert_eq!(
        names(&two, true),
        names(&all, true),
        "every visible tool is still listed"
    );
    assert_eq!(
        names(&two, false),
        hidden_all[..2].to_vec(),
        "and the first two hidden ones, by name"
    );

    let none = gateway(&["--explain-max-hidden", "0"]).await;
    let (_, zero) = post_json(none, "/v1/tools", Some(&alice), "h3", &page).await;
    assert!(names(&zero, false).is_empty());
    assert_eq!(zero["hiddenMore"], true);
}

/// `POST /v1/tools/explain`: Gate B's dry run through the gateway (issue 30): the decision, code
/// and rule for the caller's page, by catalog or wire name, running nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_tools_explain_is_a_dry_run_of_gate_b() {
    let gw = gateway(&[]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let bob = token("bob", "acme", &["viewer"]);
    let explain = |who: Option<String>, tool: &'static str, trace: &'static str| async move {
        post_json(
            gw,
            "/v1/tools/explain",
            who.as_deref(),
            trace,
            &json!({"pageContext": invoice_page("acme_inv3"), "tool": tool, "arguments": {}}),
        )
        .await
    };
    let (status, body) = explain(Some(alice.clone()), "invoice.mark_paid", "x1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["dry_run"], true);
    assert_eq!(body["decision"], "approval_required", "{body}");
    assert_eq!(body["rule"], "requires_approval");
    // Nothing was recorded: the dry run's call id approves nothing.
    let (status, approved) = post_json(
        gw,
        &format!("/v1/approvals/{}", body["call_id"].as_str().unwrap()),
        Some(&alice),
        "x2",
        &json!({"pageContext": invoice_page("acme_inv3")}),
    )
    .await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["error"]["code"], "APPROVAL_INVALID", "{approved}");

    let (_, body) = explain(Some(alice.clone()), "invoice__get", "x3").await;
    assert_eq!(
        (body["decision"].as_str(), body["code"].as_str()),
        (Some("allow"), None),
        "the wire name is explained as the tool: {body}"
    );
    let (_, body) = explain(Some(bob), "invoice.mark_paid", "x4").await;
    assert_eq!(
        (
            body["decision"].as_str(),
            body["code"].as_str(),
            body["rule"].as_str()
        ),
        (Some("deny"), Some("TOOL_NOT_VISIBLE"), Some("policy")),
        "{body}"
    );
    let (status, _) = explain(None, "invoice.get", "x5").await;
    assert_eq!(status, 401);
    let (status, _) = post_json(
        gw,
        "/v1/tools/explain",
        Some(&alice),
        "x6",
        &json!({"pageContext": invoice_page("acme_inv3"), "tool": "invoice.get", "run": true}),
    )
    .await;
    assert_eq!(status, 400, "unknown fields are refused");
}

/// Four eyes through the gateway (issue 30): the requester's call waits; an approver of the tenant
/// lists it (`POST /v1/approvals`), grants it (`POST /v1/approvals/{id}`) or rejects it
/// (`POST /v1/approvals/{id}/reject`); the requester runs a granted call once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_eyes_approvals_through_the_gateway() {
    let gw = gateway(&[]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let root = token("root", "acme", &["admin"]);
    let bob = token("bob", "acme", &["viewer"]);
    let lab = json!({"pageType": "refund_lab", "entity": {"type": "invoice", "id": "acme_inv6"}});
    let table = json!({"pageType": "invoice_table"});
    let request = |trace: &'static str| {
        let (alice, lab) = (alice.clone(), lab.clone());
        async move {
            let (status, body) = post_json(
                gw,
                "/internal/mcp/execute",
                Some(&alice),
                trace,
                &json!({"tool_name": "refund.four_eyes", "arguments": {"amount": 7}, "pageContext": lab}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["error"]["code"], "APPROVAL_REQUIRED", "{body}");
            body["call_id"].as_str().unwrap().to_string()
        }
    };
    let listed = |who: String, trace: &'static str| {
        let table = table.clone();
        async move {
            let (status, body) = post_json(
                gw,
                "/v1/approvals",
                Some(&who),
                trace,
                &json!({"pageContext": table}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            body["approvals"].as_array().unwrap().clone()
        }
    };

    let id = request("fe-1").await;
    let for_root = listed(root.clone(), "fe-2").await;
    let mine = for_root
        .iter()
        .find(|a| a["call_id"] == id.as_str())
        .expect("the approver sees the call");
    assert_eq!(
        (mine["requested_by"].as_str(), mine["tool"].as_str()),
        (Some("alice"), Some("refund.four_eyes"))
    );
    assert!(
        listed(bob.clone(), "fe-3")
            .await
            .iter()
            .all(|a| a["call_id"] != id.as_str()),
        "a viewer sees nothing"
    );
    assert!(
        listed(alice.clone(), "fe-4")
            .await
            .iter()
            .all(|a| a["call_id"] != id.as_str()),
        "nor the requester"
    );

    let approve = |who: String, page: Value, id: String, trace: &'static str| async move {
        post_json(
            gw,
            &format!("/v1/approvals/{id}"),
            Some(&who),
            trace,
            &json!({"pageContext": page}),
        )
        .await
        .1
    };
    let body = approve(alice.clone(), lab.clone(), id.clone(), "fe-5").await;
    assert_eq!(
        body["error"]["code"], "APPROVAL_INVALID",
        "the requester cannot approve: {body}"
    );
    let body = approve(root.clone(), table.clone(), id.clone(), "fe-6").await;
    assert_eq!(body["status"], "granted", "{body}");
    let body = approve(alice.clone(), lab.clone(), id.clone(), "fe-7").await;
    assert_eq!(
        body["result"]["refunded"], 7,
        "the requester runs it: {body}"
    );
    let body = approve(alice.clone(), lab.clone(), id.clone(), "fe-8").await;
    assert_eq!(body["error"]["code"], "APPROVAL_INVALID", "once: {body}");

    let id = request("fe-9").await;
    let (status, body) = post_json(
        gw,
        &format!("/v1/approvals/{id}/reject"),
        Some(&root),
        "fe-10",
        &json!({"pageContext": table, "reason": "not this month"}),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("rejected")),
        "{body}"
    );
    let body = approve(alice.clone(), lab.clone(), id.clone(), "fe-11").await;
    assert_eq!(
        body["error"]["code"], "APPROVAL_INVALID",
        "a rejected call does not run: {body}"
    );
}
