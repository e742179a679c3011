//! Catalog changes in bulk, in bounded memory (issue 34). On 0.2.0 before this issue, `SELECT
//! count(ctxguard.register_tool(...)) FROM generate_series(1, 9000)` grew one backend to 24 GB
//! until the OOM killer ended it and the postmaster restarted every backend: each registration
//! read the whole catalog again, and memory came back only when the statement ended (1,000
//! registrations: 300 MB here). Each test below works in a transaction it rolls back, so the
//! shared test database keeps its catalog.
//!
//! The bound: the backend's peak resident memory (`VmHWM`, through `ctxguard.catalog_stats()`)
//! stays under [`PEAK_BOUND_KB`]. Most of what a backend that writes 20,000 tools holds is shared
//! buffers it touched (the test cluster's `shared_buffers` is PostgreSQL's default, 128 MB); its
//! own working memory is a few MB (measured: a 57 MB peak for 20,000 registrations, 40 MB for
//! 1,000). The old code passed the bound before its 300th registration.
//!
//! Needs `CTXGUARD_TEST_ADMIN_URL` (a superuser) and `CTXGUARD_TEST_JWT_SECRET`.

mod support;

use postgres::{Client, NoTls, Transaction};
use serde_json::{json, Value};
use support::{env, token};

/// Peak resident memory a backend may reach in these tests, in kB (256 MB).
const PEAK_BOUND_KB: i64 = 256 * 1024;
const TOOLS: i32 = 20_000;
const PAGES: i32 = 100;

fn admin() -> Client {
    let mut c = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    c.batch_execute("SET statement_timeout = '300s'").unwrap();
    c
}

fn stats(tx: &mut Transaction<'_>) -> Value {
    tx.query_one("SELECT ctxguard.catalog_stats()", &[])
        .unwrap()
        .get(0)
}

/// The backend's peak resident memory so far, in kB.
fn peak_kb(tx: &mut Transaction<'_>) -> i64 {
    stats(tx)["backend_peak_kb"]
        .as_i64()
        .expect("catalog_stats reports backend_peak_kb on Linux")
}

/// `PAGES` page types `scale_pt0..`, in the transaction.
fn page_types(tx: &mut Transaction<'_>) {
    tx.execute(
        "SELECT count(ctxguard.register_page_type('scale_pt' || j, NULL, 'Scale test page ' || j))
           FROM generate_series(0, $1 - 1) j",
        &[&PAGES],
    )
    .unwrap();
}

/// The tools visible to alice on page type `page`, in the transaction.
fn visible_on(tx: &mut Transaction<'_>, page: &str) -> i64 {
    let tok = token("alice", "acme", &["ap_clerk"]);
    tx.execute(
        "SELECT ctxguard.set_context($1, $2)",
        &[&tok, &json!({ "pageType": page })],
    )
    .unwrap();
    tx.query_one(
        "SELECT count(*) FROM ctxguard.visible_tools() WHERE name LIKE 'scale.%'",
        &[],
    )
    .unwrap()
    .get(0)
}

#[test]
fn twenty_thousand_registrations_in_one_statement_stay_in_bounded_memory() {
    let mut c = admin();
    let mut tx = c.transaction().unwrap();
    page_types(&mut tx);
    let n: i64 = tx
        .query_one(
            "SELECT count(ctxguard.register_tool('scale.t' || i, 'Scale test tool ' || i || '.',
                 '{\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"string\"}}, \"additionalProperties\": false}',
                 'demo.vendor_list(jsonb)',
                 jsonb_build_object('page_types', jsonb_build_array('scale_pt' || (i % $2)), 'run_as', 'ctxguard_tools')))
               FROM generate_series(1, $1) i",
            &[&TOOLS, &PAGES],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, i64::from(TOOLS));
    let peak = peak_kb(&mut tx);
    eprintln!("20,000 registrations in one statement: backend peak {peak} kB");
    assert!(
        peak < PEAK_BOUND_KB,
        "the backend's peak memory {peak} kB passed the bound {PEAK_BOUND_KB} kB"
    );
    // Every tool is in the catalog Gate A reads: 200 per page type.
    assert_eq!(visible_on(&mut tx, "scale_pt7"), i64::from(TOOLS / PAGES));
    tx.rollback().unwrap();
}

#[test]
fn a_list_of_twenty_thousand_tools_registers_in_one_call_in_bounded_memory() {
    let mut c = admin();
    let mut tx = c.transaction().unwrap();
    page_types(&mut tx);
    let n: i32 = tx
        .query_one(
            "SELECT ctxguard.register_tools(jsonb_agg(jsonb_build_object(
                 'name', 'scale.b' || i, 'description', 'Bulk scale tool ' || i || '.',
                 'input_schema', '{\"type\": \"object\"}'::jsonb, 'handler', 'demo.vendor_list(jsonb)',
                 'policy', jsonb_build_object('page_types', jsonb_build_array('scale_pt' || (i % $2)), 'run_as', 'ctxguard_tools'))))
               FROM generate_series(1, $1) i",
            &[&TOOLS, &PAGES],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, TOOLS);
    let peak = peak_kb(&mut tx);
    eprintln!("register_tools with 20,000 tools: backend peak {peak} kB");
    assert!(
        peak < PEAK_BOUND_KB,
        "the backend's peak memory {peak} kB passed the bound {PEAK_BOUND_KB} kB"
    );
    assert_eq!(visible_on(&mut tx, "scale_pt42"), i64::from(TOOLS / PAGES));
    // The catalog a backend keeps stays within ctxguard.catalog_cache_size.
    let s = stats(&mut tx);
    assert!(s["bytes_kept"].as_i64().unwrap() <= s["bytes_limit"].as_i64().unwrap());
    tx.rollback().unwrap();
}

/// `sync_mcp_tools` of server `scalesrv` listing `n` tools, in the transaction.
fn sync(tx: &mut Transaction<'_>, n: i32) -> Value {
    tx.query_one(
        "SELECT ctxguard.sync_mcp_tools('scalesrv', (SELECT jsonb_agg(jsonb_build_object(
                 'name', 'tool_' || i, 'description', 'Upstream tool ' || i || '.',
                 'inputSchema', '{\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"string\"}}}'::jsonb))
               FROM generate_series(1, $1) i))",
        &[&n],
    )
    .unwrap()
    .get(0)
}

#[test]
fn a_sync_at_max_tools_stays_in_bounded_memory() {
    const MAX: i32 = 10_000;
    let mut c = admin();
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "INSERT INTO ctxguard.mcp_servers (name, transport, url, description, default_access, max_tools)
         VALUES ('scalesrv', 'http', 'http://127.0.0.1:9/mcp', 'Scale test server', 'allow', $1)",
        &[&MAX],
    )
    .unwrap();
    let listed = sync(&mut tx, MAX);
    assert_eq!(listed["added"], json!(MAX), "{listed}");
    let peak = peak_kb(&mut tx);
    eprintln!("sync_mcp_tools of {MAX} tools: backend peak {peak} kB");
    assert!(
        peak < PEAK_BOUND_KB,
        "the backend's peak memory {peak} kB passed the bound {PEAK_BOUND_KB} kB"
    );
    // A second sync of the same list changes nothing.
    let again = sync(&mut tx, MAX);
    assert_eq!(again["added"], json!(0), "{again}");
    assert_eq!(again["updated"], json!(0), "{again}");
    tx.rollback().unwrap();
}
