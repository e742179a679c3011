//! A call whose record the ledger writer could not write fails (`AUDIT_UNAVAILABLE`), however many
//! other records failed with it (issue 34: what callers share). The writer used to publish the
//! records it could not write in a list of the last 64: a batch with more failed records than
//! that pushed the first ones out before their callers looked, and those callers, finding their
//! record made durable and not in the list, returned their results with no audit row.
//!
//! Needs `CTXGUARD_TEST_ADMIN_URL`, `CTXGUARD_TEST_DATABASE_URL` and `CTXGUARD_TEST_JWT_SECRET`
//! (`scripts/test.sh` provides them). Makes a database `ctxguard_outcomes_*` of its own and drops
//! it.

mod support;

use std::time::Duration;

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token, with_dbname};

/// More callers than the writer's old list of failed records held (64), all in one batch.
const CALLERS: usize = 90;

fn admin_on(db: &str) -> Client {
    Client::connect(&with_dbname(&env("CTXGUARD_TEST_ADMIN_URL"), db), NoTls).unwrap()
}

fn drop_db(db: &str) {
    admin_on("postgres")
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .unwrap();
}

/// One built-in call in `db` as the gateway role for `user`, committed: its envelope.
fn call(db: &str, user: &str) -> Value {
    let mut c =
        Client::connect(&with_dbname(&env("CTXGUARD_TEST_DATABASE_URL"), db), NoTls).unwrap();
    let tok = token(user, "acme", &["viewer"]);
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2)",
        &[&tok, &json!({"pageType": "outcome_page"})],
    )
    .unwrap();
    let v: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('list_available_tools', '{}')",
            &[],
        )
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    v
}

fn code(v: &Value) -> &str {
    v["error"]["code"]
        .as_str()
        .or_else(|| v["status"].as_str())
        .unwrap_or("?")
}

#[test]
fn every_caller_of_a_batch_of_failed_records_fails() {
    let db = format!("ctxguard_outcomes_{}", std::process::id());
    drop_db(&db);
    admin_on("postgres")
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .unwrap();
    // A DBA's constraint refuses one user's audit rows: the writer cannot write their records.
    admin_on(&db)
        .batch_execute(
            "SET client_min_messages = warning; CREATE EXTENSION ctxguard;
             SELECT ctxguard.register_page_type('outcome_page', NULL, 'A page.');
             ALTER TABLE ctxguard.audit_log ADD CONSTRAINT outcome_refuses
               CHECK (user_id <> 'refused') NOT VALID;",
        )
        .unwrap();
    // The writer runs (another user's call is written).
    assert_eq!(code(&call(&db, "warm")), "ok");
    // Hold the writer off the audit table while every refused call queues its record, so that
    // they reach it together.
    let mut lock = admin_on(&db);
    let mut held = lock.transaction().unwrap();
    held.batch_execute("LOCK TABLE ctxguard.audit_log IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let db = db.clone();
            std::thread::spawn(move || call(&db, "refused"))
        })
        .collect();
    // Every caller has queued its record (or is about to) and waits for it.
    let mut queued = 0;
    for _ in 0..100 {
        let stats: Value = admin_on(&db)
            .query_one("SELECT ctxguard.ledger_stats()", &[])
            .unwrap()
            .get(0);
        queued = stats["queued"].as_i64().unwrap_or(0);
        if queued >= CALLERS as i64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    held.rollback().unwrap();
    let results: Vec<Value> = callers.into_iter().map(|t| t.join().unwrap()).collect();
    let audited: i64 = admin_on(&db)
        .query_one(
            "SELECT count(*) FROM ctxguard.audit_log WHERE user_id = 'refused'",
            &[],
        )
        .unwrap()
        .get(0);
    drop_db(&db);
    assert!(
        queued >= CALLERS as i64,
        "every caller queued its record before the writer went on ({queued})"
    );
    assert_eq!(audited, 0, "no refused record was written");
    let ok: Vec<&Value> = results
        .iter()
        .filter(|v| code(v) != "AUDIT_UNAVAILABLE")
        .collect();
    assert!(
        ok.is_empty(),
        "every call whose record was not written fails: {} of {CALLERS} did not: {:?}",
        ok.len(),
        ok.first()
    );
}
