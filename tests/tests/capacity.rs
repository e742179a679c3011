//! Shared capacity is shared fairly (issue 29 item 4; SECURITY_MATRIX M.75), on a cluster of its
//! own whose ledger tables are tiny, set in its postgresql.conf (scripts/lib.sh
//! `start_capacity_cluster`): 64 slots per table (call quota counters too), a tenant's share 25 % (16 entries), a user's
//! 10 % (7). One tenant flooding a table gets CAPACITY_EXCEEDED in the envelope, audited, while
//! another tenant's calls all succeed. On main the sizes were ignored (the settings were dropped at
//! start), the flood filled the table for everyone, and a full table raised a raw 53000.
//!
//! Needs `CTXGUARD_TEST_CAPACITY_URL` (the gateway role) and `CTXGUARD_TEST_CAPACITY_ADMIN_URL`.

mod support;

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn connect() -> Client {
    Client::connect(&env("CTXGUARD_TEST_CAPACITY_URL"), NoTls).unwrap()
}

fn admin() -> Client {
    Client::connect(&env("CTXGUARD_TEST_CAPACITY_ADMIN_URL"), NoTls).unwrap()
}

/// A tenant of this test run's own (entries of earlier runs stay live for an hour).
fn tenant(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

fn page() -> Value {
    json!({"pageType": "invoice_table"})
}

/// One call of `list_available_tools` as (tenant, user), in a generation of its own when `fresh`
/// (a new generations entry) or in none (only the user's day): the envelope.
fn call(c: &mut Client, tenant: &str, user: &str, fresh: bool) -> Value {
    let tok = token(user, tenant, &["ap_clerk"]);
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &page()])
        .unwrap();
    if fresh {
        tx.execute(
            "SELECT ctxguard.set_context($1, $2, ctxguard.begin_generation('capacity'))",
            &[&tok, &page()],
        )
        .unwrap();
    }
    let r: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('list_available_tools', '{}')",
            &[],
        )
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    r
}

fn code(r: &Value) -> String {
    r["error"]["code"].as_str().unwrap_or("ok").to_string()
}

fn audited_code(call_id: &str) -> Option<String> {
    admin()
        .query_opt(
            "SELECT code FROM ctxguard.audit_log WHERE call_id = $1::text::uuid",
            &[&call_id],
        )
        .unwrap()
        .and_then(|r| r.get(0))
}

#[test]
fn the_ledger_sizes_in_postgresql_conf_take_effect() {
    let mut a = admin();
    let stats: Value = a
        .query_one("SELECT ctxguard.ledger_stats()", &[])
        .unwrap()
        .get(0);
    for table in [
        "ledger_generations",
        "ledger_document_calls",
        "ledger_coverage",
        "ledger_user_days",
        "ledger_quotas",
    ] {
        assert_eq!(
            stats["tables"][table]["slots"],
            json!(64),
            "{table}: {stats}"
        );
        assert_eq!(stats["tables"][table]["tenant_cap"], json!(16), "{table}");
        assert_eq!(stats["tables"][table]["user_cap"], json!(7), "{table}");
    }
    assert_eq!(stats["tables"]["ledger_owners"]["slots"], json!(64));
    let set: String = a
        .query_one("SELECT current_setting('ctxguard.ledger_coverage')", &[])
        .unwrap()
        .get(0);
    assert_eq!(set, "64");
}

#[test]
fn a_tenant_flooding_generations_gets_its_own_refusal_and_others_keep_working() {
    let mut c = connect();
    let (flood, other) = (tenant("flood-gen"), tenant("other-gen"));
    // One user: their share (7 generations), then CAPACITY_EXCEEDED for them alone.
    let first: Vec<String> = (0..9)
        .map(|_| code(&call(&mut c, &flood, "u1", true)))
        .collect();
    assert_eq!(first[..7], vec!["ok"; 7], "{first:?}");
    assert_eq!(first[7..], vec!["CAPACITY_EXCEEDED"; 2], "{first:?}");
    // The tenant's other users, up to the tenant's share (16 in all), then the tenant is refused.
    let mut seen = Vec::new();
    for u in 2..=4 {
        for _ in 0..5 {
            seen.push(code(&call(&mut c, &flood, &format!("u{u}"), true)));
        }
    }
    assert_eq!(seen.iter().filter(|s| *s == "ok").count(), 9, "{seen:?}");
    let refused = call(&mut c, &flood, "u5", true);
    assert_eq!(code(&refused), "CAPACITY_EXCEEDED", "{refused}");
    let msg = refused["error"]["message"].as_str().unwrap();
    assert!(msg.contains("ctxguard.ledger_tenant_share"), "{msg}");
    assert!(
        !msg.contains(&other) && !msg.contains("u5"),
        "names nobody: {msg}"
    );
    // In the envelope and audited.
    let id = refused["call_id"].as_str().unwrap();
    assert_eq!(audited_code(id).as_deref(), Some("CAPACITY_EXCEEDED"));
    // Another tenant: every call succeeds.
    for u in 1..=2 {
        for _ in 0..7 {
            let r = call(&mut c, &other, &format!("u{u}"), true);
            assert_eq!(code(&r), "ok", "{r}");
        }
    }
    // ledger_stats names the flooder at its cap.
    let stats: Value = admin()
        .query_one("SELECT ctxguard.ledger_stats()", &[])
        .unwrap()
        .get(0);
    let nearest = stats["nearest_cap"].as_array().unwrap();
    assert!(
        nearest.iter().any(
            |n| n["tenant"].as_str().is_some_and(|t| flood.starts_with(t))
                && n["table"] == "ledger_generations"
                && n["entries"] == json!(16)
        ),
        "{nearest:?}"
    );
}

#[test]
fn a_tenant_flooding_user_days_gets_its_own_refusal_and_others_keep_working() {
    let mut c = connect();
    let (flood, other) = (tenant("flood-day"), tenant("other-day"));
    // One entry per user per day: 16 users of one tenant fill its share.
    let codes: Vec<String> = (0..20)
        .map(|u| code(&call(&mut c, &flood, &format!("d{u}"), false)))
        .collect();
    assert_eq!(codes[..16], vec!["ok"; 16], "{codes:?}");
    assert_eq!(codes[16..], vec!["CAPACITY_EXCEEDED"; 4], "{codes:?}");
    for u in 0..10 {
        let r = call(&mut c, &other, &format!("d{u}"), false);
        assert_eq!(code(&r), "ok", "{r}");
    }
}

/// `n` one-page documents of `tenant`, ready (ingested as the superuser with an ingest token).
fn documents(tenant: &str, n: usize) {
    let tok = token("ingest-bot", tenant, &["doc_ingest"]);
    let mut a = admin();
    let mut tx = a.transaction().unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2)",
        &[&tok, &json!({"pageType": "invoice_table"})],
    )
    .unwrap();
    for d in 0..n {
        let id = format!("doc{d}");
        tx.execute("SELECT ctxguard.put_document($1, 'A document')", &[&id])
            .unwrap();
        tx.execute("SELECT ctxguard.put_page($1, 1, 'Page one.')", &[&id])
            .unwrap();
        tx.execute(
            "SELECT ctxguard.put_document($1, 'A document', 'ready')",
            &[&id],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

/// `user` of `tenant` reads page 1 of documents `docs` in one generation of their own: the codes.
fn read_documents(
    c: &mut Client,
    tenant: &str,
    user: &str,
    docs: std::ops::Range<usize>,
) -> Vec<String> {
    let tok = token(user, tenant, &["ap_clerk"]);
    let library = json!({"pageType": "document_library"});
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &library])
        .unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2, ctxguard.begin_generation('capacity'))",
        &[&tok, &library],
    )
    .unwrap();
    let codes = docs
        .map(|d| {
            let args =
                json!({"doc_id": format!("doc{d}"), "page_start": 1, "page_end": 1}).to_string();
            let r: Value = tx
                .query_one(
                    "SELECT ctxguard.call_tool('read_doc_pages', $1::text::jsonb)",
                    &[&args],
                )
                .unwrap()
                .get(0);
            code(&r)
        })
        .collect();
    tx.commit().unwrap();
    codes
}

#[test]
fn a_tenant_flooding_document_counters_and_coverage_gets_its_own_refusal() {
    let mut c = connect();
    let (flood, other) = (tenant("flood-doc"), tenant("other-doc"));
    documents(&flood, 20);
    documents(&other, 8);
    // Each read takes a (generation, document) counter and a (user, document, day) coverage entry:
    // a user's share is 7 of each, the tenant's 16.
    let u1 = read_documents(&mut c, &flood, "r1", 0..9);
    assert_eq!(u1[..7], vec!["ok"; 7], "{u1:?}");
    assert_eq!(u1[7..], vec!["CAPACITY_EXCEEDED"; 2], "{u1:?}");
    let u2 = read_documents(&mut c, &flood, "r2", 0..7);
    assert_eq!(u2, vec!["ok"; 7], "{u2:?}");
    let u3 = read_documents(&mut c, &flood, "r3", 0..4);
    assert_eq!(
        u3,
        vec!["ok", "ok", "CAPACITY_EXCEEDED", "CAPACITY_EXCEEDED"],
        "{u3:?}"
    );
    // The other tenant reads all of its documents.
    let o = read_documents(&mut c, &other, "r1", 0..7);
    assert_eq!(o, vec!["ok"; 7], "{o:?}");
}

/// Tools with a per-user quota (issue 30), registered here: each (user, tool) is a quota counter.
fn quota_tools(n: usize) {
    let mut a = admin();
    a.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS capq;
         CREATE OR REPLACE FUNCTION capq.ping(args jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
         GRANT USAGE ON SCHEMA capq TO ctxguard_tools;
         GRANT EXECUTE ON FUNCTION capq.ping(jsonb) TO ctxguard_tools;",
    )
    .unwrap();
    for i in 0..n {
        a.execute(
            "SELECT ctxguard.register_tool($1, 'A tool with a quota.', '{\"type\": \"object\"}', 'capq.ping(jsonb)',
                 '{\"page_types\": [\"invoice_table\"], \"run_as\": \"ctxguard_tools\",
                   \"rate_limit\": {\"per\": \"user\", \"calls\": 100, \"window\": \"1d\"}}')",
            &[&format!("capq.t{i}")],
        )
        .unwrap();
    }
}

fn call_quota_tool(c: &mut Client, tenant: &str, user: &str, tool: usize) -> Value {
    let tok = token(user, tenant, &["ap_clerk"]);
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &page()])
        .unwrap();
    let r: Value = tx
        .query_one("SELECT ctxguard.call_tool($1)", &[&format!("capq.t{tool}")])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    r
}

#[test]
fn a_tenant_flooding_quota_counters_gets_its_own_refusal() {
    quota_tools(9);
    let mut c = connect();
    let (flood, other) = (tenant("flood-quota"), tenant("other-quota"));
    // One user: their share (7 counters), then CAPACITY_EXCEEDED naming the user's share.
    let first: Vec<String> = (0..9)
        .map(|t| code(&call_quota_tool(&mut c, &flood, "q1", t)))
        .collect();
    assert_eq!(first[..7], vec!["ok"; 7], "{first:?}");
    assert_eq!(first[7..], vec!["CAPACITY_EXCEEDED"; 2], "{first:?}");
    // Two more users (6 and 3 counters) fill the tenant's share of 16; then the tenant is refused.
    for (u, tools) in [("q2", 6), ("q3", 3)] {
        for t in 0..tools {
            let r = call_quota_tool(&mut c, &flood, u, t);
            assert_eq!(code(&r), "ok", "{u} {t}: {r}");
        }
    }
    let refused = call_quota_tool(&mut c, &flood, "q4", 0);
    assert_eq!(code(&refused), "CAPACITY_EXCEEDED", "{refused}");
    let msg = refused["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("ctxguard.ledger_tenant_share") && msg.contains("call quota counters"),
        "{msg}"
    );
    // A counter the tenant holds already still counts.
    assert_eq!(code(&call_quota_tool(&mut c, &flood, "q1", 0)), "ok");
    // Another tenant keeps its share.
    for t in 0..7 {
        let r = call_quota_tool(&mut c, &other, "q1", t);
        assert_eq!(code(&r), "ok", "{r}");
    }
    let stats: Value = admin()
        .query_one("SELECT ctxguard.ledger_stats()", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        stats["tables"]["ledger_quotas"]["slots"],
        json!(64),
        "{stats}"
    );
}
