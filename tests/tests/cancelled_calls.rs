//! Cancelled calls leave nothing behind that blocks the next caller of the same backend (issue 29
//! item 3; SECURITY_MATRIX M.74). A document call counts the document call, then reads text; here
//! the read waits on a lock the DBA holds and the caller's `statement_timeout` cancels it, inside
//! a savepoint, a hundred times in one transaction, which then commits. On main each cancelled
//! call left its charge in the backend's unbounded pending list: after about 70 the list no longer
//! fit in one queue record and every later call on that backend, by any user of any tenant,
//! answered AUDIT_UNAVAILABLE; and the cancelled calls used up calls_per_document. Now a call's
//! charges are its own and are given back when it leaves no record.
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL`, `CTXGUARD_TEST_ADMIN_URL` and `CTXGUARD_TEST_JWT_SECRET`.

mod support;

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn code(r: &Value) -> String {
    r["error"]["code"].as_str().unwrap_or("ok").to_string()
}

#[test]
fn a_hundred_cancelled_document_calls_leave_the_backend_working_for_everyone() {
    let mut c = Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap();
    let alice = token("cancelled", "acme", &["viewer"]);
    let page =
        json!({"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}});
    let read =
        "SELECT ctxguard.call_tool('read_doc_pages', '{\"page_start\": 1, \"page_end\": 1}')";
    // The DBA holds the page text: every read waits on it.
    let mut admin = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    let mut lock = admin.transaction().unwrap();
    lock.batch_execute("LOCK TABLE ctxguard.document_pages IN ACCESS EXCLUSIVE MODE")
        .unwrap();

    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&alice, &page])
        .unwrap();
    let g: String = tx
        .query_one("SELECT ctxguard.begin_generation('cancelled')::text", &[])
        .unwrap()
        .get(0);
    tx.execute(
        "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
        &[&alice, &page, &g],
    )
    .unwrap();
    let mut cancelled = 0;
    for _ in 0..100 {
        tx.batch_execute("SAVEPOINT s; SET LOCAL statement_timeout = '50ms'")
            .unwrap();
        match tx.query_one(read, &[]) {
            Err(e) if e.code().is_some_and(|c| c.code() == "57014") => cancelled += 1,
            other => panic!("the read should wait and be cancelled: {other:?}"),
        }
        tx.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    }
    tx.commit().unwrap();
    assert_eq!(cancelled, 100);
    lock.rollback().unwrap();

    // The same backend: the same generation's document calls were not used up (10 per document),
    // and another tenant's call is audited and answered.
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
        &[&alice, &page, &g],
    )
    .unwrap();
    for n in 1..=10 {
        let r: Value = tx.query_one(read, &[]).unwrap().get(0);
        assert_eq!(code(&r), "ok", "call {n} after the cancelled ones: {r}");
    }
    tx.commit().unwrap();
    let carol = token("carol", "globex", &["ap_clerk"]);
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2)",
        &[&carol, &json!({"pageType": "invoice_table"})],
    )
    .unwrap();
    let r: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('list_available_tools', '{}')",
            &[],
        )
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    assert_eq!(code(&r), "ok", "{r}");
}
