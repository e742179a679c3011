//! Budgets under real concurrency (SECURITY_MATRIX D.28, D.29) and audit failure (E.35).
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL`, `CTXGUARD_TEST_ADMIN_URL` and `CTXGUARD_TEST_JWT_SECRET`
//! (`scripts/test.sh` provides them) and the demo documents.

mod support;

use std::sync::{Arc, Barrier};
use std::thread;

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn connect() -> Client {
    Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap()
}

fn viewer() -> Value {
    json!({"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}})
}

/// Mint a generation (committed, as the gateway does at the start of a turn).
fn generation(c: &mut Client, tok: &str) -> String {
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &viewer()])
        .unwrap();
    let g: String = tx
        .query_one("SELECT ctxguard.begin_generation('budget-test')::text", &[])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    g
}

/// One tool call in its own transaction, bound to the generation.
fn call(c: &mut Client, tok: &str, g: &str, tool: &str, args: &Value) -> Value {
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
        &[&tok, &viewer(), &g],
    )
    .unwrap();
    let r: Value = tx
        .query_one("SELECT ctxguard.call_tool($1, $2)", &[&tool, args])
        .unwrap()
        .get(0);
    tx.commit().unwrap();
    r
}

fn code(r: &Value) -> String {
    r["error"]["code"].as_str().unwrap_or("ok").to_string()
}

/// The code and, for a refused call, the limit its message names (README: the message of
/// RATE_LIMIT_EXCEEDED starts with the limit's name), e.g. "RATE_LIMIT_EXCEEDED calls_per_document".
fn refusal(r: &Value) -> String {
    match r["error"]["message"].as_str() {
        Some(m) => format!("{} {}", code(r), m.split(':').next().unwrap_or_default()),
        None => code(r),
    }
}

#[test]
fn concurrent_calls_racing_for_the_last_units_never_exceed_the_limit() {
    let tok = token("racer", "acme", &["viewer"]);
    let mut c = connect();
    let g = generation(&mut c, &tok);
    // Use 7 of the 10 calls, then let 8 backends race for the last 3.
    for _ in 0..7 {
        assert_eq!(
            code(&call(
                &mut c,
                &tok,
                &g,
                "doc_local_search",
                &json!({"query": "zzqq"})
            )),
            "ok"
        );
    }
    let racers = 8;
    let barrier = Arc::new(Barrier::new(racers));
    let codes: Vec<String> = (0..racers)
        .map(|_| {
            let (barrier, tok, g) = (barrier.clone(), tok.clone(), g.clone());
            thread::spawn(move || {
                let mut c = connect();
                let mut tx = c.transaction().unwrap();
                tx.execute(
                    "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
                    &[&tok, &viewer(), &g],
                )
                .unwrap();
                barrier.wait();
                let r: Value = tx
                    .query_one(
                        "SELECT ctxguard.call_tool('doc_local_search', '{\"query\": \"zzqq\"}')",
                        &[],
                    )
                    .unwrap()
                    .get(0);
                tx.commit().unwrap();
                refusal(&r)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let ok = codes.iter().filter(|c| *c == "ok").count();
    // Refused by the limit raced for (ten calls per document per generation), not another one.
    let limited = codes
        .iter()
        .filter(|c| *c == "RATE_LIMIT_EXCEEDED calls_per_document")
        .count();
    assert_eq!((ok, limited), (3, racers - 3), "{codes:?}");
}

#[test]
fn one_generation_across_pooled_backends_shares_one_budget() {
    let tok = token("pooled", "acme", &["viewer"]);
    let mut conns: Vec<Client> = (0..3).map(|_| connect()).collect();
    let g = generation(&mut conns[0], &tok);
    let mut returned = 0i64;
    let mut refused_at = None;
    for i in 0..12 {
        let c = &mut conns[i % 3];
        let start = 200 + i * 5 + 1;
        let r = call(
            c,
            &tok,
            &g,
            "read_doc_pages",
            &json!({"page_start": start, "page_end": start + 4}),
        );
        match refusal(&r).as_str() {
            "ok" => returned += r["result"].to_string().len() as i64,
            // The byte budget, not the calls per document nor the daily coverage.
            "RATE_LIMIT_EXCEEDED bytes_per_generation" => {
                refused_at.get_or_insert(i);
            }
            other => panic!("unexpected {other}: {r}"),
        }
    }
    assert!(
        refused_at.is_some_and(|i| i >= 4),
        "the byte budget ends the walk, across backends: {refused_at:?}"
    );
    assert!(
        returned <= 20 * 1024,
        "{returned} bytes returned in one generation"
    );
}

#[test]
fn a_failing_audit_write_fails_the_call() {
    let tok = token("auditless", "acme", &["viewer"]);
    let mut admin = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    let mut c = connect();
    let g = generation(&mut c, &tok);
    admin
        .batch_execute(
            "ALTER TABLE ctxguard.audit_log ADD CONSTRAINT test_audit_down CHECK (user_id <> 'auditless') NOT VALID",
        )
        .unwrap();
    let mut tx = c.transaction().unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
        &[&tok, &viewer(), &g],
    )
    .unwrap();
    let r = tx.query_one(
        "SELECT ctxguard.call_tool('read_doc_pages', '{\"page_start\": 1, \"page_end\": 1}')",
        &[],
    );
    drop(tx);
    admin
        .batch_execute("ALTER TABLE ctxguard.audit_log DROP CONSTRAINT test_audit_down")
        .unwrap();
    // The audit writer cannot write this record: the call fails closed (AUDIT_UNAVAILABLE), never
    // the pages; the writer goes on with other calls' records.
    let r: Value = r.expect("an envelope").get(0);
    assert_eq!(code(&r), "AUDIT_UNAVAILABLE", "{r}");
    assert!(
        r.get("result").is_none(),
        "no result may leave without an audit row: {r}"
    );
}
