//! The ledger's queue slots are shared by the cluster's databases (issue 34: what callers share):
//! eight slots, each taken by a database when it first needs a writer, and taken over by another
//! database once its writer has stopped and all its records are durable (a database dropped, or
//! idle). A database that takes a slot over must start with nothing of the slot's last database:
//! the outcomes of its records (which the writer could not write), above all, or a call of the new
//! database whose record has the same number is refused as unwritten (`AUDIT_UNAVAILABLE`) though
//! its audit row is there.
//!
//! Needs `CTXGUARD_TEST_ADMIN_URL`, `CTXGUARD_TEST_DATABASE_URL` and `CTXGUARD_TEST_JWT_SECRET`
//! (`scripts/test.sh` provides them). Makes databases `ctxguard_slot_*` of its own and drops them.

mod support;

use serde_json::Value;
use support::{admin_on, builtin_call, drop_db, envelope_code as code};

/// A new database with the extension and one page type.
fn scratch(db: &str) {
    support::scratch_db(db, "slot_page", "");
}

/// One built-in call in `db` as the gateway role, committed.
fn call(db: &str) -> Value {
    builtin_call(db, "slot-user", "slot_page")
}

/// The slots the ledger has (`ledger/shmem.rs`: `DATABASES`).
const SLOTS: usize = 8;

#[test]
fn a_database_taking_a_slot_over_starts_with_a_clean_one() {
    let pid = std::process::id();
    let name = |k: usize| format!("ctxguard_slot_{pid}_{k}");
    // Every slot in use: the test database's and one scratch database's per slot (the ones that
    // find no slot free are refused; that is fine). The first one's writer could not write its
    // calls' records: a DBA's constraint refuses them.
    scratch(&name(0));
    admin_on(&name(0))
        .batch_execute(
            "ALTER TABLE ctxguard.audit_log ADD CONSTRAINT slot_refuses
               CHECK (tool <> 'list_available_tools') NOT VALID",
        )
        .unwrap();
    for _ in 0..4 {
        let v = call(&name(0));
        assert_eq!(
            code(&v),
            "AUDIT_UNAVAILABLE",
            "the refused record fails its call: {v}"
        );
    }
    for k in 1..SLOTS {
        scratch(&name(k));
        call(&name(k));
    }
    // The first database goes (its writer with it); its slot is free to take over at once. The
    // next database new to the ledger takes a slot that served another database.
    drop_db(&name(0));
    let fresh = name(SLOTS);
    scratch(&fresh);
    let results: Vec<Value> = (0..6).map(|_| call(&fresh)).collect();
    let stats: Value = admin_on(&fresh)
        .query_one("SELECT ctxguard.ledger_stats()", &[])
        .unwrap()
        .get(0);
    let audited: i64 = admin_on(&fresh)
        .query_one("SELECT count(*) FROM ctxguard.audit_log", &[])
        .unwrap()
        .get(0);
    for k in 1..=SLOTS {
        drop_db(&name(k));
    }
    assert!(
        results.iter().all(|v| code(v) == "ok"),
        "every call of the new database is ok: {results:?}"
    );
    assert_eq!(audited, 6, "and audited");
    assert_eq!(
        (stats["records"].as_i64(), stats["durable"].as_i64()),
        (Some(6), Some(6)),
        "its queue counts its own records only: {stats}"
    );
}
