//! The per-backend catalog cache must never serve a stale policy: a DBA change is seen by an
//! already-warm gateway backend in its very next transaction.
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL`, `CTXGUARD_TEST_ADMIN_URL` (a superuser on the same database)
//! and `CTXGUARD_TEST_JWT_SECRET`; `scripts/test.sh` provides them.

mod support;

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

/// The tests of this file change the catalog; run them one at a time (each reads versions).
static CATALOG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    CATALOG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let _serial = one_at_a_time();
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

/// The catalog's version is looked at in every statement: a policy change committed while a
/// gateway's transaction is open applies from that transaction's next statement (once it applied
/// from the next transaction only, and a transaction kept open kept a disabled tool: found by a
/// review as an attacker), and a transaction's own change applies at once.
#[test]
fn a_policy_change_applies_from_the_callers_next_statement() {
    let _serial = one_at_a_time();
    let tok = token("alice", "acme", &["ap_clerk"]);
    let page = json!({"pageType": "vendor_table"});
    let visible = |tx: &mut postgres::Transaction<'_>| -> bool {
        tx.query("SELECT name FROM ctxguard.visible_tools()", &[])
            .unwrap()
            .iter()
            .any(|r| r.get::<_, String>(0) == "vendor.list")
    };
    let mut gw = Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap();
    let mut admin = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();

    let mut tx = gw.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &page])
        .unwrap();
    assert!(visible(&mut tx));
    set_vendor_list_enabled(&mut admin, false);
    let call: Value = tx
        .query_one("SELECT ctxguard.call_tool('vendor.list', '{}')", &[])
        .unwrap()
        .get(0);
    let listed = visible(&mut tx);
    tx.commit().unwrap();
    assert_eq!(
        call["error"]["code"], "TOOL_NOT_VISIBLE",
        "the open transaction's next statement sees the change: {call}"
    );
    assert!(!listed, "and no longer lists the tool");
    let (names, call) = visible_and_call(&mut gw, &tok);
    assert!(!names.contains(&"vendor.list".to_string()));
    assert_eq!(
        call["error"]["code"], "TOOL_NOT_VISIBLE",
        "the next one does not"
    );

    // A transaction that changes the catalog itself sees its change in its next statement.
    let mut tx = admin.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &page])
        .unwrap();
    assert!(!visible(&mut tx));
    tx.execute(
        "UPDATE ctxguard.tool_policies SET enabled = true WHERE tool = 'vendor.list'",
        &[],
    )
    .unwrap();
    assert!(visible(&mut tx), "its own change is seen at once");
    tx.rollback().unwrap();

    set_vendor_list_enabled(&mut admin, true);
    let (names, _) = visible_and_call(&mut gw, &tok);
    assert!(names.contains(&"vendor.list".to_string()));
}

#[test]
fn a_viewer_page_confines_document_tools_even_without_the_binding() {
    let _serial = one_at_a_time();
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

/// The masker is cached like the catalog, by `(version, xmin)`: a rule change that was seen and
/// then rolled back cannot be confused with a later change that reuses its version number.
#[test]
fn a_rolled_back_mask_rule_is_not_served_for_a_later_change_of_the_same_version() {
    let _serial = one_at_a_time();
    let mut admin = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    let masked = |c: &mut postgres::Transaction<'_>| -> String {
        let v: Value = c
            .query_one("SELECT ctxguard.mask_text('zebra-1 okapi-2')", &[])
            .unwrap()
            .get(0);
        v["text"].as_str().unwrap().to_string()
    };
    let add_rule = |c: &mut postgres::Transaction<'_>, name: &str, pattern: &str| {
        c.execute(
            "INSERT INTO ctxguard.mask_rules (name, pattern) VALUES ($1, $2)",
            &[&name, &pattern],
        )
        .unwrap();
    };
    let version = |c: &mut postgres::Transaction<'_>| -> i64 {
        c.query_one("SELECT version FROM ctxguard.catalog_version", &[])
            .unwrap()
            .get(0)
    };

    let mut tx = admin.transaction().unwrap();
    add_rule(&mut tx, "test_zebra", r"\bzebra-\d\b");
    let seen_version = version(&mut tx);
    let first = masked(&mut tx);
    tx.rollback().unwrap();
    assert!(
        !first.contains("zebra-1"),
        "the rule applies in its own transaction: {first}"
    );

    let mut tx = admin.transaction().unwrap();
    add_rule(&mut tx, "test_okapi", r"\bokapi-\d\b");
    assert_eq!(
        version(&mut tx),
        seen_version,
        "the later change reuses the version number"
    );
    let second = masked(&mut tx);
    tx.rollback().unwrap();
    assert!(
        second.contains("zebra-1"),
        "the rolled-back zebra rule was served again: {second}"
    );
    assert!(
        !second.contains("okapi-2"),
        "the new okapi rule is applied: {second}"
    );
}

/// Namespaces are catalog data (issue 31): a description registered, changed or removed by the DBA
/// is what a warm gateway backend's `visible_namespaces()` shows in its next transaction (on every
/// major, where the SQL suite's dblink sessions are not available).
#[test]
fn a_warm_backend_sees_namespace_changes_at_once() {
    let _serial = one_at_a_time();
    let tok = token("alice", "acme", &["ap_clerk"]);
    let mut gw = Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap();
    let mut admin = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    let described = |gw: &mut Client| -> Option<(Option<String>, Option<String>, i32)> {
        let mut tx = gw.transaction().unwrap();
        tx.execute(
            "SELECT ctxguard.set_context($1, $2)",
            &[&tok, &json!({"pageType": "vendor_table"})],
        )
        .unwrap();
        let row = tx
            .query_opt(
                "SELECT title, description, tools FROM ctxguard.visible_namespaces() WHERE namespace = 'vendor'",
                &[],
            )
            .unwrap()
            .map(|r| (r.get(0), r.get(1), r.get(2)));
        tx.commit().unwrap();
        row
    };
    let register = |admin: &mut Client, description: &str| {
        admin
            .execute(
                "SELECT ctxguard.register_namespace('vendor', $1, 'Vendors')",
                &[&description],
            )
            .unwrap();
    };
    admin
        .execute("DELETE FROM ctxguard.namespaces WHERE name = 'vendor'", &[])
        .unwrap();
    assert_eq!(described(&mut gw), Some((None, None, 1)), "undescribed");

    register(&mut admin, "The company's vendors.");
    assert_eq!(
        described(&mut gw),
        Some((
            Some("Vendors".into()),
            Some("The company's vendors.".into()),
            1
        )),
        "a namespace registered in another session is described at the next transaction"
    );
    register(&mut admin, "Vendors, changed.");
    assert_eq!(
        described(&mut gw).and_then(|d| d.1).as_deref(),
        Some("Vendors, changed."),
        "and changed"
    );
    admin
        .execute("DELETE FROM ctxguard.namespaces WHERE name = 'vendor'", &[])
        .unwrap();
    assert_eq!(described(&mut gw), Some((None, None, 1)), "and removed");

    // A tool that leaves the page takes its namespace with it (the namespace's row stays).
    register(&mut admin, "The company's vendors.");
    set_vendor_list_enabled(&mut admin, false);
    let hidden = described(&mut gw);
    set_vendor_list_enabled(&mut admin, true);
    admin
        .execute("DELETE FROM ctxguard.namespaces WHERE name = 'vendor'", &[])
        .unwrap();
    assert_eq!(
        hidden, None,
        "a namespace with no visible tool is not listed"
    );
}
