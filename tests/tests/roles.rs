//! The demo's roles (issue 11 §3, §5, §6): the role that runs model calls (ctxguard_gateway) can do
//! nothing but call ctxguard; tool handlers run as their run_as role (ctxguard_tools); upstream MCP
//! discovery records tools through its own role (ctxguard_discovery); the human screens read
//! through theirs (ctxguard_app, see demo_mode.rs).
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL`, `CTXGUARD_TEST_DISCOVERY_URL`, `CTXGUARD_TEST_APP_URL`,
//! `CTXGUARD_TEST_ADMIN_URL` and `CTXGUARD_TEST_JWT_SECRET`; `scripts/test.sh` provides them.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use support::*;
use tokio_postgres::error::SqlState;

const DENIED: Option<&SqlState> = Some(&SqlState::INSUFFICIENT_PRIVILEGE);

/// The demo's SQL tools, all registered with `"run_as": "ctxguard_tools"`.
const DEMO_TOOLS: [&str; 4] = [
    "vendor.list",
    "invoice.list",
    "invoice.get",
    "invoice.mark_paid",
];

/// Run `sql` as the gateway role in a transaction with alice's context on `invoice`'s page, and
/// return its error code (`None` if it succeeded). The transaction is rolled back.
async fn as_gateway_in_context(invoice: &str, sql: &str) -> Option<SqlState> {
    let mut c = connect_as(&env("CTXGUARD_TEST_DATABASE_URL")).await;
    let tx = c.transaction().await.unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2)",
        &[
            &token("alice", "acme", &["ap_clerk"]),
            &invoice_page(invoice),
        ],
    )
    .await
    .unwrap();
    let code = tx.batch_execute(sql).await.err().map(|e| {
        e.code()
            .cloned()
            .unwrap_or_else(|| panic!("{sql}: no SQLSTATE: {e:?}"))
    });
    tx.rollback().await.ok();
    code
}

async fn status_of(invoice: &str) -> String {
    admin()
        .await
        .query_one(
            "SELECT status FROM demo.invoices WHERE id = $1",
            &[&invoice],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn the_gateway_role_cannot_reach_around_the_tools_even_with_a_context() {
    // The two attacks: an UPDATE that skips role check, approval, binding and audit, and
    // an EXPLAIN ANALYZE that counts another tenant's rows. Plus reads and direct handler calls.
    let before = (status_of("acme_inv9").await, status_of("glx_inv3").await);
    for sql in [
        "UPDATE demo.invoices SET status = 'paid' WHERE id = 'acme_inv9'",
        "UPDATE demo.invoices SET status = 'paid' WHERE id = 'glx_inv3'",
        "EXPLAIN ANALYZE SELECT * FROM demo.invoices WHERE id = 'glx_inv3'",
        "EXPLAIN SELECT * FROM demo.invoices WHERE id = 'glx_inv3'",
        "SELECT count(*) FROM demo.invoices",
        "SELECT count(*) FROM demo.vendors",
        "SELECT count(*) FROM demo.matters",
        "DELETE FROM demo.invoices WHERE id = 'acme_inv9'",
        "SELECT demo.invoice_mark_paid('{\"invoice_id\": \"acme_inv9\"}')",
        "SELECT demo.invoice_get('{\"invoice_id\": \"glx_inv3\"}')",
        "SELECT demo.vendor_list('{}')",
        "SELECT demo.manual_page(77, 500)",
        "SELECT demo.page_data()",
        "SELECT demo.viewer_page(1)",
        "SELECT ctxguard.sync_mcp_tools('any', '[]')",
    ] {
        assert_eq!(
            as_gateway_in_context("acme_inv9", sql).await.as_ref(),
            DENIED,
            "{sql}"
        );
    }
    assert_eq!(
        (status_of("acme_inv9").await, status_of("glx_inv3").await),
        before,
        "nothing was written"
    );

    // The tools themselves work: their handlers run as ctxguard_tools, under RLS.
    let mut c = connect_as(&env("CTXGUARD_TEST_DATABASE_URL")).await;
    let tx = c.transaction().await.unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2)",
        &[
            &token("alice", "acme", &["ap_clerk"]),
            &invoice_page("acme_inv9"),
        ],
    )
    .await
    .unwrap();
    let got: Value = tx
        .query_one("SELECT ctxguard.call_tool('invoice.get', '{}')", &[])
        .await
        .unwrap()
        .get(0);
    let foreign: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('invoice.get', '{\"invoice_id\": \"glx_inv3\"}')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    assert_eq!(got["status"], "ok", "{got}");
    assert_eq!(got["result"]["id"], "acme_inv9", "{got}");
    assert_eq!(foreign["error"]["code"], "ENTITY_MISMATCH", "{foreign}");
}

#[tokio::test]
async fn each_demo_role_holds_exactly_what_its_job_needs() {
    let db = admin().await;
    // Attributes: nobody is a superuser or bypasses RLS; the run_as role cannot log in.
    let rows = db
        .query(
            "SELECT rolname::text, rolsuper, rolbypassrls, rolcanlogin, rolcreaterole, rolcreatedb
               FROM pg_catalog.pg_roles
              WHERE rolname IN ('ctxguard_gateway', 'ctxguard_tools', 'ctxguard_discovery', 'ctxguard_app')
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    let attrs: Vec<(String, bool, bool, bool, bool, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    let expect = |name: &str, login: bool| (name.to_string(), false, false, login, false, false);
    assert_eq!(
        attrs,
        vec![
            expect("ctxguard_app", true),
            expect("ctxguard_discovery", true),
            expect("ctxguard_gateway", true),
            expect("ctxguard_tools", false),
        ]
    );

    // What each role may do in the demo schema and with the catalog's discovery function.
    let grants = |role: &'static str| {
        let db = &db;
        async move {
            db.query(
                "SELECT what FROM (
                     SELECT 'USAGE demo' AS what WHERE pg_catalog.has_schema_privilege($1, 'demo', 'USAGE')
                     UNION ALL
                     SELECT priv || ' ' || c.relname
                       FROM pg_catalog.pg_class c
                       JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace,
                            unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) priv
                      WHERE n.nspname = 'demo' AND c.relkind IN ('r', 'v', 'm', 'p', 'S')
                        AND (pg_catalog.has_table_privilege($1, c.oid, priv)
                             OR (priv IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')
                                 AND pg_catalog.has_any_column_privilege($1, c.oid, priv)))
                     UNION ALL
                     SELECT 'EXECUTE ' || p.oid::pg_catalog.regprocedure::text
                       FROM pg_catalog.pg_proc p
                      WHERE (p.pronamespace = 'demo'::regnamespace
                             OR p.oid = 'ctxguard.sync_mcp_tools(text, jsonb)'::regprocedure)
                        AND pg_catalog.has_function_privilege($1, p.oid, 'EXECUTE')) g
                  ORDER BY 1",
                &[&role],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<String>>()
        }
    };
    // The model-call role: nothing at all here (EXECUTE on ctxguard's API comes from PUBLIC).
    assert_eq!(grants("ctxguard_gateway").await, Vec::<String>::new());
    assert_eq!(
        grants("ctxguard_discovery").await,
        vec!["EXECUTE ctxguard.sync_mcp_tools(text,jsonb)"]
    );
    let tools = grants("ctxguard_tools").await;
    for want in [
        "USAGE demo",
        "SELECT invoices",
        "SELECT vendors",
        "SELECT matters",
        "UPDATE invoices",
        "EXECUTE demo.invoice_mark_paid(jsonb)",
        "EXECUTE demo.invoice_get(jsonb)",
    ] {
        assert!(tools.contains(&want.to_string()), "{want}: {tools:?}");
    }
    for never in [
        "EXECUTE demo.page_data()",
        "EXECUTE demo.viewer_page(integer)",
        "EXECUTE demo.manual_page(integer,integer)",
        "EXECUTE ctxguard.sync_mcp_tools(text,jsonb)",
        "DELETE invoices",
        "INSERT invoices",
    ] {
        assert!(!tools.contains(&never.to_string()), "{never}: {tools:?}");
    }
    let app = grants("ctxguard_app").await;
    for want in [
        "EXECUTE demo.page_data()",
        "EXECUTE demo.viewer_page(integer)",
        "EXECUTE demo.document_list(text,text)",
    ] {
        assert!(app.contains(&want.to_string()), "{want}: {app:?}");
    }
    for never in [
        "EXECUTE demo.invoice_mark_paid(jsonb)",
        "EXECUTE demo.manual_page(integer,integer)",
        "EXECUTE ctxguard.sync_mcp_tools(text,jsonb)",
        "UPDATE invoices",
    ] {
        assert!(!app.contains(&never.to_string()), "{never}: {app:?}");
    }

    // No demo function is executable by PUBLIC (functions are, by default).
    let public: Vec<String> = db
        .query(
            "SELECT p.oid::pg_catalog.regprocedure::text FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'demo'::regnamespace
                AND EXISTS (SELECT FROM pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
                             WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(public, Vec::<String>::new(), "executable by PUBLIC");

    // The gateway role borrows no one's privileges but its group's (one login role per gateway
    // instance, members of ctxguard_gateways: docs/deploy.md), the group is a member of nothing
    // (its privileges are checked with the role's above, which inherits them), and the run_as
    // role owns nothing.
    let groups = |role: &'static str| {
        let db = &db;
        async move {
            db.query(
                "SELECT g.rolname::text FROM pg_catalog.pg_auth_members m
                   JOIN pg_catalog.pg_roles g ON g.oid = m.roleid
                  WHERE m.member = $1::text::regrole ORDER BY 1",
                &[&role],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
        }
    };
    assert_eq!(groups("ctxguard_gateway").await, vec!["ctxguard_gateways"]);
    assert_eq!(
        groups("ctxguard_gateway_b").await,
        vec!["ctxguard_gateways"]
    );
    assert_eq!(groups("ctxguard_gateways").await, Vec::<String>::new());
    let owned: i64 = db
        .query_one(
            "SELECT (SELECT count(*) FROM pg_catalog.pg_class WHERE relowner = 'ctxguard_tools'::regrole)
                  + (SELECT count(*) FROM pg_catalog.pg_proc WHERE proowner = 'ctxguard_tools'::regrole)
                  + (SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspowner = 'ctxguard_tools'::regrole)
                  + (SELECT count(*) FROM pg_catalog.pg_type WHERE typowner = 'ctxguard_tools'::regrole)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owned, 0, "ctxguard_tools owns objects");

    // Every demo tool runs its handler as ctxguard_tools.
    let run_as: Vec<(String, Option<String>)> = db
        .query(
            "SELECT t.name, p.run_as::text FROM ctxguard.tools t
               LEFT JOIN ctxguard.tool_policies p ON p.tool = t.name
              WHERE t.name = ANY($1) ORDER BY t.name",
            &[&DEMO_TOOLS.to_vec()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(run_as.len(), DEMO_TOOLS.len(), "{run_as:?}");
    for (tool, role) in &run_as {
        assert_eq!(role.as_deref(), Some("ctxguard_tools"), "{tool}");
    }
}

#[tokio::test]
async fn sync_mcp_tools_belongs_to_the_discovery_role_alone() {
    let server = "rt_direct";
    register_server(server, "http://127.0.0.1:9/mcp", None).await;
    let tools =
        json!([{"name": "ping", "description": "Ping.", "inputSchema": {"type": "object"}}]);

    let gw = connect_as(&env("CTXGUARD_TEST_DATABASE_URL")).await;
    let err = gw
        .query_one("SELECT ctxguard.sync_mcp_tools($1, $2)", &[&server, &tools])
        .await
        .unwrap_err();
    assert_eq!(err.code(), DENIED, "{err:?}");

    let discovery = connect_as(&discovery_url()).await;
    let out: Value = discovery
        .query_one("SELECT ctxguard.sync_mcp_tools($1, $2)", &[&server, &tools])
        .await
        .unwrap()
        .get(0);
    assert_eq!(out["added"], 1, "{out}");
    assert_eq!(server_tools(server).await, vec![format!("{server}.ping")]);
    // ... and it can do nothing else with the demo.
    for sql in [
        "SELECT count(*) FROM demo.invoices",
        "UPDATE demo.invoices SET status = 'paid'",
        "SELECT demo.page_data()",
        "SELECT ctxguard.set_server_policy('rt_direct', '{\"page_types\": \"*\"}')",
    ] {
        let err = discovery.batch_execute(sql).await.unwrap_err();
        assert_eq!(err.code(), DENIED, "{sql}: {err:?}");
    }
    drop_server(server).await;
}

/// A minimal upstream MCP server (Streamable HTTP, stateless JSON responses, protocol 2025-11-25)
/// with one tool that echoes the invoice id it was called with.
async fn mock_upstream() -> SocketAddr {
    mock_upstream_counting().await.0
}

/// [`mock_upstream`], and how many `tools/call` requests reached it.
async fn mock_upstream_counting() -> (SocketAddr, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handler = move |Json(msg): Json<Value>| {
        let calls = counted.clone();
        async move {
            if msg["method"] == "tools/call" {
                calls.fetch_add(1, Ordering::SeqCst);
            }
            rpc(Json(msg)).await
        }
    };
    async fn rpc(Json(msg): Json<Value>) -> Response {
        let Some(id) = msg.get("id").cloned() else {
            return StatusCode::ACCEPTED.into_response(); // a notification
        };
        let result = match msg["method"].as_str().unwrap_or_default() {
            "initialize" => json!({
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "mock-scans", "version": "1.0.0"}
            }),
            "tools/list" => json!({"tools": [scan_tool()]}),
            "tools/call" => json!({
                "content": [{"type": "text", "text": format!("scan of {}", msg["params"]["arguments"]["invoice_id"].as_str().unwrap_or("?"))}],
                "isError": false
            }),
            "ping" => json!({}),
            _ => {
                return Json(json!({"jsonrpc": "2.0", "id": id,
                                   "error": {"code": -32601, "message": "Method not found"}}))
                .into_response()
            }
        };
        Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
    }
    let app = Router::new().route(
        "/mcp",
        post(handler)
            .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
            .delete(|| async { StatusCode::METHOD_NOT_ALLOWED }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, calls)
}

fn scan_tool() -> Value {
    json!({"name": "read_scan", "description": "Read the scan of the invoice on this page.",
           "inputSchema": {"type": "object", "properties": {"invoice_id": {"type": "string"}},
                           "required": ["invoice_id"]}})
}

/// (Re)register an upstream server, open to every user, with a policy that binds the page's
/// invoice; anything left from an earlier run goes with the old row.
async fn register_server(name: &str, url: &str, policy: Option<Value>) {
    let db = admin().await;
    db.execute("DELETE FROM ctxguard.mcp_servers WHERE name = $1", &[&name])
        .await
        .unwrap();
    db.execute(
        "INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access)
         VALUES ($1, 'http', $2, 'Test upstream', 'allow')",
        &[&name, &url],
    )
    .await
    .unwrap();
    if let Some(policy) = policy {
        db.execute(
            "SELECT ctxguard.set_server_policy($1, $2)",
            &[&name, &policy],
        )
        .await
        .unwrap();
    }
}

/// Remove a test server and its tools (the next run starts clean either way).
async fn drop_server(name: &str) {
    admin()
        .await
        .execute("DELETE FROM ctxguard.mcp_servers WHERE name = $1", &[&name])
        .await
        .unwrap();
}

async fn server_tools(server: &str) -> Vec<String> {
    admin()
        .await
        .query(
            "SELECT name FROM ctxguard.tools WHERE server = $1 ORDER BY name",
            &[&server],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn binds_the_invoice() -> Value {
    json!({"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id", "read_only": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_records_tools_through_the_discovery_role_only() {
    let up = mock_upstream().await;
    let url = format!("http://{up}/mcp");

    // With the discovery role: the server's tools are recorded.
    register_server("rt_found", &url, None).await;
    let discovery = discovery_url();
    let (_, state) = gateway_with_state(&["--discovery-database-url", &discovery]).await;
    let up_now = state
        .core
        .upstreams
        .ensure(&state.core.db, &["rt_found".to_string()])
        .await;
    assert!(up_now.contains("rt_found"), "{up_now:?}");
    assert_eq!(server_tools("rt_found").await, vec!["rt_found.read_scan"]);

    // Without it: the server is used, but nothing is recorded (the gateway role may not).
    register_server("rt_unrecorded", &url, None).await;
    let (_, state) = gateway_with_state(&[]).await;
    let up_now = state
        .core
        .upstreams
        .ensure(&state.core.db, &["rt_unrecorded".to_string()])
        .await;
    assert!(up_now.contains("rt_unrecorded"), "{up_now:?}");
    assert_eq!(server_tools("rt_unrecorded").await, Vec::<String>::new());
    drop_server("rt_found").await;
    drop_server("rt_unrecorded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalogued_upstream_tools_work_without_the_discovery_role() {
    let up = mock_upstream().await;
    register_server(
        "rt_known",
        &format!("http://{up}/mcp"),
        Some(binds_the_invoice()),
    )
    .await;
    // Recorded earlier (here by the DBA), with the server's policy binding the page's invoice.
    admin()
        .await
        .query_one(
            "SELECT ctxguard.sync_mcp_tools('rt_known', $1)",
            &[&json!([scan_tool()])],
        )
        .await
        .unwrap();

    let gw = gateway(&[]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let trace = format!("rt-known-{}", uuid::Uuid::new_v4().simple());
    let (status, body) = post_json(
        gw,
        "/internal/mcp/execute",
        Some(&alice),
        &trace,
        &json!({"tool_name": "rt_known.read_scan", "arguments": {},
                "pageContext": invoice_page("acme_inv3")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ok", "{body}");
    assert!(
        body["result"].to_string().contains("scan of acme_inv3"),
        "{body}"
    );
    assert_eq!(
        audit(&trace)
            .await
            .iter()
            .map(|(d, _, t)| (d.as_str(), t.clone().unwrap_or_default()))
            .collect::<Vec<_>>(),
        vec![
            ("authorized", "rt_known.read_scan".to_string()),
            ("allow", "rt_known.read_scan".to_string())
        ],
        "Gate B, then the completed call"
    );
    // Still nothing new was recorded by this gateway.
    assert_eq!(server_tools("rt_known").await, vec!["rt_known.read_scan"]);
    drop_server("rt_known").await;
}

/// Issue 33: the DBA moves a server from `static` to `tenant_secret` while a gateway runs. Gate B's
/// authorization names the new mode; the gateway, whose copy of the registry still says static,
/// must read it again instead of forwarding the call over its shared, static connection (one
/// account for everyone). Without the tenant's secret the call fails closed, audited, and the
/// upstream never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_moved_to_another_credential_mode_is_never_called_with_the_old_one() {
    let (up, calls) = mock_upstream_counting().await;
    let server = "rt_moved";
    register_server(
        server,
        &format!("http://{up}/mcp"),
        Some(binds_the_invoice()),
    )
    .await;
    admin()
        .await
        .query_one(
            "SELECT ctxguard.sync_mcp_tools($1, $2)",
            &[&server, &json!([scan_tool()])],
        )
        .await
        .unwrap();
    let gw = gateway(&[]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let execute = |trace: String| {
        let alice = alice.clone();
        async move {
            post_json(
                gw,
                "/internal/mcp/execute",
                Some(&alice),
                &trace,
                &json!({"tool_name": "rt_moved.read_scan", "arguments": {},
                        "pageContext": invoice_page("acme_inv3")}),
            )
            .await
        }
    };
    let (status, body) = execute(format!("rt-moved-{}", uuid::Uuid::new_v4().simple())).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("ok")),
        "{body}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "static: the call went out");

    admin()
        .await
        .execute(
            "UPDATE ctxguard.mcp_servers SET credential_mode = 'tenant_secret' WHERE name = $1",
            &[&server],
        )
        .await
        .unwrap();
    let trace = format!("rt-moved-{}", uuid::Uuid::new_v4().simple());
    let (status, body) = execute(trace.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "error", "{body}");
    assert_eq!(body["error"]["code"], "TOOL_ERROR", "{body}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the upstream never saw the call made under the new mode: {body}"
    );
    assert_eq!(
        audit(&trace)
            .await
            .iter()
            .map(|(d, _, _)| d.as_str())
            .collect::<Vec<_>>(),
        vec!["authorized", "error"],
        "Gate B authorized it under tenant_secret, and it was completed as failed"
    );
    drop_server(server).await;
}
