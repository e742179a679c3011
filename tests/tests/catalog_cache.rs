//! The per-backend catalog cache must never serve a stale policy: a DBA change is seen by an
//! already-warm gateway backend in its very next transaction.
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL`, `CTXGUARD_TEST_ADMIN_URL` (a superuser on the same database)
//! and `CTXGUARD_TEST_JWT_SECRET`; `scripts/test.sh` provides them.

mod support;

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn visible_and_call(c: &mut Client, tok: &str) -> (Vec<String>, Value) {
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2)",
        &[&tok, &json!({"pageType": "vendor_table"})],
    )
    .unwrap();
    let names = tx
        .query("SELECT name FROM ctxguard.visible_tools()", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let call: Value = tx
        .query_one("SELECT ctxguard.call_tool('vendor.list', '{}')", &[])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    (names, call)
}

fn set_vendor_list_enabled(admin: &mut Client, enabled: bool) {
    admin
        .execute(
            "SELECT ctxguard.register_tool('vendor.list', 'List the vendors of the current company (name, country).',
                 '{\"type\": \"object\", \"properties\": {\"limit\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 100}}, \"additionalProperties\": false}',
                 'demo.vendor_list(jsonb)', jsonb_build_object('page_types', ARRAY['vendor_table'], 'enabled', $1::bool,
                                               'run_as', 'ctxguard_tools'))",
            &[&enabled],
        )
        .unwrap();
}

#[test]
fn a_warm_backend_sees_policy_changes_at_once() {
    let tok = token("alice", "acme", &["ap_clerk"]);
    let mut gw = Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap();
    let mut admin = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();

    let (names, call) = visible_and_call(&mut gw, &tok);
    assert!(names.contains(&"vendor.list".to_string()));
    assert_eq!(call["status"], "ok");

    set_vendor_list_enabled(&mut admin, false);
    let (names, call) = visible_and_call(&mut gw, &tok);
    assert!(
        !names.contains(&"vendor.list".to_string()),
        "stale Gate A: {names:?}"
    );
    assert_eq!(call["error"]["code"], "TOOL_NOT_VISIBLE", "stale Gate B");

    // A change rolled back must not leave the warm backend on a phantom version.
    let mut tx = admin.transaction().unwrap();
    tx.execute(
        "UPDATE ctxguard.tool_policies SET enabled = true WHERE tool = 'vendor.list'",
        &[],
    )
    .unwrap();
    tx.rollback().unwrap();
    let (names, _) = visible_and_call(&mut gw, &tok);
    assert!(!names.contains(&"vendor.list".to_string()));

    set_vendor_list_enabled(&mut admin, true);
    let (names, call) = visible_and_call(&mut gw, &tok);
    assert!(names.contains(&"vendor.list".to_string()));
    assert_eq!(call["status"], "ok");
}

#[test]
fn a_viewer_page_confines_document_tools_even_without_the_binding() {
    let tok = token("alice", "acme", &["ap_clerk"]);
    let mut gw = Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap();
    let mut admin = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    let set_policy = |admin: &mut Client, policy: Value| {
        admin
            .execute(
                "SELECT ctxguard.set_tool_policy('read_doc_metadata', $1)",
                &[&policy],
            )
            .unwrap();
    };
    // A DBA loosens the policy: no entity binding at all.
    set_policy(&mut admin, json!({"page_types": "*"}));
    let viewer =
        json!({"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}});
    let mut tx = gw.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &viewer])
        .unwrap();
    tx.execute("SELECT ctxguard.begin_generation('loose')", &[])
        .unwrap();
    let other: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('read_doc_metadata', '{\"doc_id\": \"acme_inv3_pdf\"}')",
            &[],
        )
        .unwrap()
        .get(0);
    let own: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('read_doc_metadata', '{\"doc_id\": \"acme_guide\"}')",
            &[],
        )
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    set_policy(
        &mut admin,
        json!({"page_types": ["invoice_detail", "document_viewer", "matter_overview", "document_library"],
               "entity_type": "document", "entity_param": "doc_id", "requires_entity": false}),
    );
    assert_eq!(other["error"]["code"], "ENTITY_MISMATCH", "{other}");
    assert_eq!(own["status"], "ok", "{own}");
}
