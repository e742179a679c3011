//! The ledger under real concurrency and every way a caller can undo its transaction
//! (issue 13; SECURITY_MATRIX I.53, I.54): racing backends never overspend a generation, a
//! document's coverage or a user's day, whatever their isolation level; a prepared transaction
//! rolled back refunds nothing and loses no audit row.
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL`, `CTXGUARD_TEST_ADMIN_URL` and `CTXGUARD_TEST_JWT_SECRET`
//! (`scripts/test.sh` provides them), the demo documents and the fixtures.

mod support;

use std::sync::{Arc, Barrier};
use std::thread;

use postgres::{Client, IsolationLevel, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn connect() -> Client {
    Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap()
}

fn admin() -> Client {
    Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap()
}

fn viewer() -> Value {
    json!({"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}})
}

fn library() -> Value {
    json!({"pageType": "document_library"})
}

fn generation(c: &mut Client, tok: &str, page: &Value) -> String {
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, page])
        .unwrap();
    let g: String = tx
        .query_one("SELECT ctxguard.begin_generation('ledger-test')::text", &[])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    g
}

fn code(r: &Value) -> String {
    r["error"]["code"].as_str().unwrap_or("ok").to_string()
}

fn message(r: &Value) -> String {
    r["error"]["message"].as_str().unwrap_or("").to_string()
}

/// `racers` backends each open a transaction at `level` with the context set (and so a snapshot
/// taken, for REPEATABLE READ and SERIALIZABLE) before any of them calls; then all call at once.
fn race(
    racers: usize,
    level: IsolationLevel,
    setup: impl Fn(usize) -> (String, Value, Option<String>) + Send + Sync + 'static,
    tool: &'static str,
    args: impl Fn(usize) -> Value + Send + Sync + 'static,
) -> Vec<Value> {
    let barrier = Arc::new(Barrier::new(racers));
    let setup = Arc::new(setup);
    let args = Arc::new(args);
    (0..racers)
        .map(|k| {
            let (barrier, setup, args) = (barrier.clone(), setup.clone(), args.clone());
            thread::spawn(move || {
                let (tok, page, g) = setup(k);
                let mut c = connect();
                let mut tx = c
                    .build_transaction()
                    .isolation_level(level)
                    .start()
                    .unwrap();
                tx.execute(
                    "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
                    &[&tok, &page, &g],
                )
                .unwrap();
                barrier.wait();
                let r: Value = tx
                    .query_one("SELECT ctxguard.call_tool($1, $2)", &[&tool, &args(k)])
                    .unwrap()
                    .get(0);
                // Whatever the caller does with its transaction: here it rolls back.
                tx.rollback().unwrap();
                r
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect()
}

/// Coverage of mask_secrets (40 pages, 30%: 12 pages a day): 8 backends, each in its own
/// generation, read 8 different 5-page windows at once; exactly two fit.
fn coverage_race(user: &str, level: IsolationLevel) {
    let tok = token(user, "acme", &["ap_clerk"]);
    let gens: Vec<String> = {
        let mut c = connect();
        (0..8)
            .map(|_| generation(&mut c, &tok, &library()))
            .collect()
    };
    let t = tok.clone();
    let results = race(
        8,
        level,
        move |k| (t.clone(), library(), Some(gens[k].clone())),
        "read_doc_pages",
        |k| json!({"doc_id": "mask_secrets", "page_start": 5 * k + 1, "page_end": 5 * k + 5}),
    );
    let ok = results.iter().filter(|r| code(r) == "ok").count();
    let refused: Vec<String> = results
        .iter()
        .filter(|r| code(r) != "ok")
        .map(|r| message(r).split(':').next().unwrap_or("").to_string())
        .collect();
    assert_eq!(ok, 2, "{results:?}");
    assert!(
        refused.iter().all(|m| m == "document_coverage"),
        "{refused:?}"
    );
}

#[test]
fn repeatable_read_transactions_opened_before_any_commit_share_one_daily_coverage() {
    coverage_race("rr_racer", IsolationLevel::RepeatableRead);
}

#[test]
fn serializable_transactions_opened_before_any_commit_share_one_daily_coverage() {
    coverage_race("ser_racer", IsolationLevel::Serializable);
}

#[test]
fn racers_for_the_last_bytes_of_a_generation_never_overspend_it() {
    let tok = token("byte_racer", "acme", &["viewer"]);
    let g = {
        let mut c = connect();
        generation(&mut c, &tok, &viewer())
    };
    let t = tok.clone();
    let g2 = g.clone();
    // 8 backends read 5 pages each (about 7 KB): the generation's 20 KB fit fewer than 8.
    let results = race(
        8,
        IsolationLevel::ReadCommitted,
        move |_| (t.clone(), viewer(), Some(g2.clone())),
        "read_doc_pages",
        |k| json!({"page_start": 5 * k + 301, "page_end": 5 * k + 305}),
    );
    assert!(results.iter().any(|r| code(r) == "ok"), "{results:?}");
    let mut a = admin();
    let row = a
        .query_one(
            "SELECT coalesce(sum(result_bytes) FILTER (WHERE decision = 'allow'), 0)::int8,
                    max((budget->>'bytes_limit')::int8), count(*)
               FROM ctxguard.audit_log WHERE generation = $1::text::uuid",
            &[&g],
        )
        .unwrap();
    let (returned, limit, rows): (i64, Option<i64>, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        rows, 8,
        "every call is audited although every caller rolled back"
    );
    assert!(
        returned <= limit.unwrap_or(i64::MAX),
        "{returned} > {limit:?}"
    );
    let persisted: i64 = a
        .query_one(
            "SELECT bytes_used FROM ctxguard.generations WHERE id = $1::text::uuid",
            &[&g],
        )
        .unwrap()
        .get(0);
    assert_eq!(persisted, returned, "the writer persisted what was charged");
}

#[test]
fn racers_for_the_last_bytes_of_a_users_day_never_overspend_it() {
    let tenant = "ledger_day_co";
    let tok = token("day_racer", tenant, &[]);
    let mut a = admin();
    a.execute(
        "DELETE FROM ctxguard.tenant_limits WHERE tenant_id = $1",
        &[&tenant],
    )
    .unwrap();
    // One call to learn the size of list_available_tools' result.
    let first = {
        let mut c = connect();
        let mut tx = c.transaction().unwrap();
        tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &library()])
            .unwrap();
        let r: Value = tx
            .query_one(
                "SELECT ctxguard.call_tool('list_available_tools', '{}')",
                &[],
            )
            .unwrap()
            .get(0);
        tx.rollback().unwrap();
        r
    };
    assert_eq!(code(&first), "ok", "{first}");
    let size: i32 = a
        .query_one(
            "SELECT result_bytes FROM ctxguard.audit_log WHERE call_id = $1::text::uuid",
            &[&first["call_id"].as_str().unwrap()],
        )
        .unwrap()
        .get(0);
    // Room for 3 more of the same size (and a half).
    let limit = size * 4 + size / 2;
    a.execute(
        "INSERT INTO ctxguard.tenant_limits (tenant_id, max_bytes_per_user_day) VALUES ($1, $2)",
        &[&tenant, &limit],
    )
    .unwrap();
    let t = tok.clone();
    let results = race(
        8,
        IsolationLevel::ReadCommitted,
        move |_| (t.clone(), library(), None),
        "list_available_tools",
        |_| json!({}),
    );
    a.execute(
        "DELETE FROM ctxguard.tenant_limits WHERE tenant_id = $1",
        &[&tenant],
    )
    .unwrap();
    let ok = results.iter().filter(|r| code(r) == "ok").count();
    assert_eq!(ok, 3, "{results:?}");
    assert!(results
        .iter()
        .filter(|r| code(r) != "ok")
        .all(|r| message(r).starts_with("bytes_per_user_day:")));
}

#[test]
fn a_prepared_transaction_rolled_back_refunds_no_call_and_keeps_its_audit_rows() {
    let tok = token("prepared", "acme", &["viewer"]);
    let mut c = connect();
    let g = generation(&mut c, &tok, &viewer());
    let name = format!("ctxguard_ledger_{}", uuid::Uuid::new_v4().simple());
    c.batch_execute("BEGIN").unwrap();
    c.execute(
        "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
        &[&tok, &viewer(), &g],
    )
    .unwrap();
    for _ in 0..10 {
        let r: Value = c
            .query_one(
                "SELECT ctxguard.call_tool('read_doc_pages', '{\"page_start\": 1, \"page_end\": 1}')",
                &[],
            )
            .unwrap()
            .get(0);
        assert_eq!(code(&r), "ok", "{r}");
    }
    c.batch_execute(&format!("PREPARE TRANSACTION '{name}'"))
        .unwrap();
    admin()
        .batch_execute(&format!("ROLLBACK PREPARED '{name}'"))
        .unwrap();
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
        &[&tok, &viewer(), &g],
    )
    .unwrap();
    let r: Value = tx
        .query_one(
            "SELECT ctxguard.call_tool('read_doc_pages', '{\"page_start\": 1, \"page_end\": 1}')",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(message(&r).starts_with("calls_per_document:"), "{r}");
    let rows: i64 = tx
        .query_one(
            "SELECT count(*) FROM ctxguard.audit_log WHERE generation = $1::text::uuid",
            &[&g],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 11);
    tx.commit().unwrap();
}

/// `ctxguard.audit_wait = off` (a superuser's setting): the call returns before its audit record is
/// written, and callers that do not wait do not wake the writer one by one (ledger/mod.rs). A lone
/// call, with nothing after it, still gets its audit row within the writer's round, and a burst of
/// them all get theirs. A call that waits, after them, finds its own row committed on return.
#[test]
fn calls_that_do_not_wait_for_their_audit_record_still_get_it() {
    let tok = token("nowait_caller", "acme", &["ap_clerk"]);
    let mut su = admin();
    let call = |c: &mut Client, wait: &str| -> String {
        let mut tx = c.transaction().unwrap();
        tx.execute(
            "SELECT set_config('ctxguard.audit_wait', $1, true)",
            &[&wait],
        )
        .unwrap();
        tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &library()])
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
        r["call_id"].as_str().unwrap().to_string()
    };
    let audited = |su: &mut Client, ids: &[String]| -> i64 {
        su.query_one(
            "SELECT count(*) FROM ctxguard.audit_log WHERE call_id::text = ANY($1)",
            &[&ids],
        )
        .unwrap()
        .get(0)
    };
    // Polls on the audit table (committed rows); the bound is generous, the writer's round is 50 ms.
    let within = |su: &mut Client, ids: &[String]| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while audited(su, ids) < ids.len() as i64 {
            assert!(
                std::time::Instant::now() < deadline,
                "audit rows missing: {ids:?}"
            );
            thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let lone = vec![call(&mut su, "off")];
    within(&mut su, &lone);
    let burst: Vec<String> = (0..100).map(|_| call(&mut su, "off")).collect();
    within(&mut su, &burst);
    let waited = vec![call(&mut su, "on")];
    assert_eq!(
        audited(&mut su, &waited),
        1,
        "a call that waits finds its row committed"
    );
}

/// The writer reports what it writes to PostgreSQL's statistics, as a backend does: without that,
/// autovacuum would never see the rows of `audit_log` (written by no one else) and would neither
/// analyze nor vacuum it.
#[test]
fn the_writers_rows_reach_the_statistics_autovacuum_reads() {
    let tok = token("stats_caller", "acme", &["ap_clerk"]);
    let mut su = admin();
    let inserted = |su: &mut Client| -> i64 {
        // Its own transaction each time: a fresh statistics snapshot.
        su.query_one(
            "SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'ctxguard.audit_log'::regclass",
            &[],
        )
        .unwrap()
        .get(0)
    };
    let before = inserted(&mut su);
    let mut c = connect();
    for _ in 0..20 {
        let mut tx = c.transaction().unwrap();
        tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &library()])
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
    // PostgreSQL flushes a process's counts at most once a second; the bound is a hang guard.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while inserted(&mut su) < before + 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "audit_log inserts counted: {} before, {} now, 20 calls audited",
            before,
            inserted(&mut su)
        );
        thread::sleep(std::time::Duration::from_millis(100));
    }
}
