//! A call whose record the ledger writer could not write fails (`AUDIT_UNAVAILABLE`), however many
//! other records failed with it (issue 34: what callers share). The writer used to publish the
//! records it could not write in a list of the last 64: a batch with more failed records than
//! that pushed the first ones out before their callers looked, and those callers, finding their
//! record made durable and not in the list, returned their results with no audit row.
//!
//!
//! A caller that looks for its record's outcome late (its backend descheduled, here stopped with
//! `SIGSTOP`) gets it all the same, however many records were made durable meanwhile: the queue
//! remembers the outcomes of the last 4,096 records, and a caller that looked after that failed
//! its call though its record was written.
//!
//! Needs `CTXGUARD_TEST_ADMIN_URL`, `CTXGUARD_TEST_DATABASE_URL` and `CTXGUARD_TEST_JWT_SECRET`
//! (`scripts/test.sh` provides them). Makes a database `ctxguard_outcomes_*` of its own and drops
//! it.

mod support;

use std::time::Duration;

use serde_json::json;
use serde_json::Value;
use support::{
    admin_on, builtin_call, call_in_transaction, drop_db, envelope_code as code, gateway_on_db,
    scratch_db, token,
};

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

/// Records made durable while the late caller is stopped: more than the queue remembers (4,096).
const LATER_RECORDS: usize = 4_400;

/// Send `signal` (`STOP`, `CONT`) to process `pid` (the test runs as root or as the cluster's
/// user, as `scripts/test.sh` runs it).
fn signal(pid: i32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

#[test]
fn a_caller_that_looks_late_gets_its_outcome() {
    let db = format!("ctxguard_late_{}", std::process::id());
    // Longer than the run takes: the late caller must still be waiting when it looks.
    scratch_db(
        &db,
        "late_page",
        &format!("ALTER DATABASE {db} SET ctxguard.audit_wait_timeout = 120;"),
    );
    assert_eq!(code(&builtin_call(&db, "warm", "late_page")), "ok");
    // Hold the writer off the audit table while the late caller queues its record and sleeps.
    let mut lock = admin_on(&db);
    let mut held = lock.transaction().unwrap();
    held.batch_execute("LOCK TABLE ctxguard.audit_log IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let late = {
        let db = db.clone();
        std::thread::spawn(move || builtin_call(&db, "late", "late_page"))
    };
    // Its backend, waiting for its record (wait event of the extension, in call_tool).
    let mut pid = None;
    for _ in 0..200 {
        pid = admin_on(&db)
            .query_opt(
                "SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Extension'
                    AND query LIKE '%call_tool%'",
                &[],
            )
            .unwrap()
            .map(|r| r.get::<_, i32>(0));
        if pid.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let pid = pid.expect("the late caller waits for its record");
    signal(pid, "STOP");
    // Its record is written (and its waiter slot told so) while it is stopped.
    held.rollback().unwrap();
    // Then many more records are made durable by other callers.
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let db = db.clone();
            std::thread::spawn(move || {
                let mut c = gateway_on_db(&db);
                let tok = token(&format!("busy{w}"), "acme", &["viewer"]);
                let page = json!({ "pageType": "late_page" });
                (0..LATER_RECORDS / 4)
                    .filter(|_| {
                        code(&call_in_transaction(
                            &mut c,
                            &tok,
                            &page,
                            "list_available_tools",
                            true,
                        )) == "ok"
                    })
                    .count()
            })
        })
        .collect();
    let busy_ok: usize = workers.into_iter().map(|t| t.join().unwrap()).sum();
    signal(pid, "CONT");
    let result = late.join().unwrap();
    let audited: i64 = admin_on(&db)
        .query_one(
            "SELECT count(*) FROM ctxguard.audit_log WHERE user_id = 'late'",
            &[],
        )
        .unwrap()
        .get(0);
    drop_db(&db);
    assert_eq!(busy_ok, LATER_RECORDS, "the other calls succeed");
    assert_eq!(audited, 1, "the late caller's record was written");
    assert_eq!(
        code(&result),
        "ok",
        "the late caller gets its record's outcome: {result}"
    );
}

/// The waiter slots (`ledger_stats().waiter_slots`) of database `db` held now.
fn waiter_slots(db: &str) -> i64 {
    let stats: Value = admin_on(db)
        .query_one("SELECT ctxguard.ledger_stats()", &[])
        .unwrap()
        .get(0);
    stats["waiter_slots"].as_i64().unwrap_or(-1)
}

/// Callers that give up their wait give their waiter slot back at once: one cancelled while it
/// waits, at its wait's end; one whose backend was terminated, at the writer's next batch. A
/// slot kept would leave later callers polling the queue under its lock (64 slots per database),
/// and a caller who cancels or ends its own sessions mid-wait would keep them all.
#[test]
fn callers_that_give_up_give_their_waiter_slots_back() {
    const WAITING: usize = 20;
    let db = format!("ctxguard_giveup_{}", std::process::id());
    scratch_db(&db, "giveup_page", "");
    assert_eq!(code(&builtin_call(&db, "warm", "giveup_page")), "ok");
    let mut lock = admin_on(&db);
    let mut held = lock.transaction().unwrap();
    held.batch_execute("LOCK TABLE ctxguard.audit_log IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let callers: Vec<_> = (0..WAITING)
        .map(|_| {
            let db = db.clone();
            // The call errors out (cancelled or terminated): the thread's panic is expected.
            std::thread::spawn(move || builtin_call(&db, "quitter", "giveup_page"))
        })
        .collect();
    let mut slots = 0;
    for _ in 0..200 {
        slots = waiter_slots(&db);
        if slots >= WAITING as i64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert_eq!(slots, WAITING as i64, "every caller waits in a slot");
    // Half are cancelled, half terminated.
    let given_up: i64 = admin_on(&db)
        .query_one(
            "SELECT count(*) FILTER (WHERE CASE WHEN n % 2 = 0 THEN pg_cancel_backend(pid)
                                                ELSE pg_terminate_backend(pid) END)
               FROM (SELECT pid, row_number() OVER (ORDER BY pid) AS n FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event_type = 'Extension'
                        AND query LIKE '%call_tool%') w",
            &[],
        )
        .unwrap()
        .get(0);
    for t in callers {
        let _ = t.join();
    }
    // The cancelled ones gave theirs back as their wait ended, before any record was written.
    let while_held = waiter_slots(&db);
    held.rollback().unwrap();
    // The writer's next batch frees the terminated ones'.
    assert_eq!(code(&builtin_call(&db, "after", "giveup_page")), "ok");
    let after = waiter_slots(&db);
    drop_db(&db);
    assert_eq!(
        given_up, WAITING as i64,
        "every waiting caller was signalled"
    );
    assert!(
        while_held <= (WAITING / 2) as i64,
        "the cancelled callers gave their slots back at once ({while_held} of {WAITING} held)"
    );
    assert_eq!(after, 0, "no slot is held once the writer went on");
}
