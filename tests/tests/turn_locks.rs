//! No lock key another role can compute blocks a user's chat turn (issue 29 item 5;
//! SECURITY_MATRIX M.76). On main `save_turn` took `pg_advisory_xact_lock` on
//! `hashtextextended(tenant || chr(31) || user || chr(31) || conversation, 11)`: a login role with
//! no grants at all held that key and the user's turn waited without end. Now the turn takes a row
//! lock on `ctxguard.conversation_heads`, which no other role can lock, and waits at most
//! `lock_timeout` (5 s, the function's own setting).
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL`, `CTXGUARD_TEST_ADMIN_URL` and `CTXGUARD_TEST_JWT_SECRET`.

mod support;

use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use serde_json::json;
use support::{env, token};

fn admin() -> Client {
    Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap()
}

/// The database URL with another user.
fn as_role(role: &str) -> Client {
    let url = env("CTXGUARD_TEST_ADMIN_URL").replace("user=postgres", &format!("user={role}"));
    Client::connect(&url, NoTls).unwrap()
}

#[test]
fn a_role_without_grants_cannot_stall_a_users_turn() {
    let mut a = admin();
    a.batch_execute(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'ctxguard_nobody') THEN
           CREATE ROLE ctxguard_nobody LOGIN NOSUPERUSER NOBYPASSRLS; END IF; END $$",
    )
    .unwrap();
    let conv = format!("stall-{}", uuid::Uuid::new_v4().simple());
    // The attacker: every lock it can take on this conversation, held in an open transaction.
    let mut evil = as_role("ctxguard_nobody");
    let mut held = evil.transaction().unwrap();
    held.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('acme' || chr(31) || 'alice' || chr(31) || $1, 11))",
        &[&conv],
    )
    .unwrap();
    let row_lock = held
        .batch_execute("SAVEPOINT s; SELECT 1 FROM ctxguard.conversation_heads FOR KEY SHARE")
        .map_err(|e| e.code().map(|c| c.code().to_string()));
    assert_eq!(
        row_lock,
        Err(Some("42501".into())),
        "no role can lock the turn counter"
    );
    held.batch_execute("ROLLBACK TO SAVEPOINT s").unwrap();
    // The user's turns: answered at once, numbered 1 and 2.
    let mut c = Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap();
    c.batch_execute("SET statement_timeout = '10s'").unwrap();
    let tok = token("alice", "acme", &["ap_clerk"]);
    for want in 1..=2 {
        let t0 = Instant::now();
        let mut tx = c.transaction().unwrap();
        tx.execute(
            "SELECT ctxguard.set_context($1, $2)",
            &[&tok, &json!({"pageType": "invoice_table"})],
        )
        .unwrap();
        let n: i32 = tx
            .query_one("SELECT ctxguard.save_turn($1, 'q', 'a')", &[&conv])
            .unwrap()
            .get(0);
        tx.commit().unwrap();
        assert_eq!(n, want);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the turn waited {:?}",
            t0.elapsed()
        );
    }
    held.rollback().unwrap();
}
