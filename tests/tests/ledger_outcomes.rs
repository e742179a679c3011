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

use serde_json::Value;
use support::{admin_on, builtin_call, drop_db, envelope_code as code, scratch_db};

/// More callers than the writer's old list of failed records held (64), all in one batch.
const CALLERS: usize = 90;

#[test]
fn every_caller_of_a_batch_of_failed_records_fails() {
    let db = format!("ctxguard_outcomes_{}", std::process::id());
    // A DBA's constraint refuses one user's audit rows: the writer cannot write their records.
    scratch_db(
        &db,
        "outcome_page",
        "ALTER TABLE ctxguard.audit_log ADD CONSTRAINT outcome_refuses
           CHECK (user_id <> 'refused') NOT VALID;",
    );
    // The writer runs (another user's call is written).
    assert_eq!(code(&builtin_call(&db, "warm", "outcome_page")), "ok");
    // Hold the writer off the audit table while every refused call queues its record, so that
    // they reach it together.
    let mut lock = admin_on(&db);
    let mut held = lock.transaction().unwrap();
    held.batch_execute("LOCK TABLE ctxguard.audit_log IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let db = db.clone();
            std::thread::spawn(move || builtin_call(&db, "refused", "outcome_page"))
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
