//! Real clients, real backends: concurrency and connection reuse, as the non-superuser gateway role.
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL` (a database loaded with `sql/demo/schema.sql`, connecting as
//! `ctxguard_gateway`) and `CTXGUARD_TEST_JWT_SECRET`; `scripts/test.sh` provides both.

mod support;

use std::sync::{Arc, Barrier};
use std::thread;

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn connect() -> Client {
    Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).expect("connect as ctxguard_gateway")
}

fn detail(invoice: &str) -> Value {
    json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": invoice}})
}

/// One short transaction with a context, like the gateway runs per step.
fn in_context<R>(
    c: &mut Client,
    tok: &str,
    page: &Value,
    f: impl FnOnce(&mut postgres::Transaction) -> R,
) -> R {
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, page])
        .unwrap();
    let r = f(&mut tx);
    tx.commit().unwrap();
    r
}

fn call(
    tx: &mut postgres::Transaction,
    sql: &str,
    arg: &(dyn postgres::types::ToSql + Sync),
) -> Value {
    tx.query_one(sql, &[arg]).unwrap().get(0)
}

#[test]
fn an_approval_runs_exactly_once_under_a_race() {
    let alice = token("alice", "acme", &["ap_clerk"]);
    let invoice = "acme_inv6";
    let mut c = connect();
    let (before, pending) = in_context(&mut c, &alice, &detail(invoice), |tx| {
        let before: String = tx
            .query_one(
                "SELECT status FROM demo.invoices WHERE id = $1",
                &[&invoice],
            )
            .unwrap()
            .get(0);
        (
            before,
            call(
                tx,
                "SELECT ctxguard.call_tool('invoice.mark_paid', $1)",
                &json!({}),
            ),
        )
    });
    assert_eq!(before, "open");
    assert_eq!(pending["error"]["code"], "APPROVAL_REQUIRED");
    let call_id = pending["call_id"].as_str().unwrap().to_string();

    let racers = 8;
    let barrier = Arc::new(Barrier::new(racers));
    let results: Vec<Value> = (0..racers)
        .map(|_| {
            let (barrier, alice, call_id) = (barrier.clone(), alice.clone(), call_id.clone());
            thread::spawn(move || {
                let mut c = connect();
                let mut tx = c.transaction().unwrap();
                tx.execute(
                    "SELECT ctxguard.set_context($1, $2)",
                    &[&alice, &detail(invoice)],
                )
                .unwrap();
                barrier.wait();
                let r: Value = tx
                    .query_one("SELECT ctxguard.approve_call($1::text::uuid)", &[&call_id])
                    .unwrap()
                    .get(0);
                tx.commit().unwrap();
                r
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let ok = results.iter().filter(|r| r["status"] == "ok").count();
    let invalid = results
        .iter()
        .filter(|r| r["error"]["code"] == "APPROVAL_INVALID")
        .count();
    assert_eq!((ok, invalid), (1, racers - 1), "{results:#?}");
    let winner = results.iter().find(|r| r["status"] == "ok").unwrap();
    assert_eq!(winner["result"]["updated"], 1);

    let (allows, status): (i64, String) = in_context(&mut c, &alice, &detail(invoice), |tx| {
        let row = tx
            .query_one(
                "SELECT (SELECT count(*) FROM ctxguard.audit_log WHERE call_id = $1::text::uuid AND decision = 'allow'),
                        (SELECT status FROM demo.invoices WHERE id = $2)",
                &[&call_id, &invoice],
            )
            .unwrap();
        (row.get(0), row.get(1))
    });
    assert_eq!((allows, status.as_str()), (1, "paid"));
}

#[test]
fn one_connection_alternating_tenants_never_mixes_rows() {
    let tenants = [
        ("alice", "acme", "acme_inv2"),
        ("carol", "globex", "glx_inv2"),
    ];
    let tokens: Vec<String> = tenants
        .iter()
        .map(|(u, t, _)| token(u, t, &["ap_clerk"]))
        .collect();
    let mut c = connect();
    let list = c
        .prepare("SELECT DISTINCT tenant_id FROM demo.invoices")
        .unwrap();
    for i in 0..200 {
        let k = i % 2;
        let (_, tenant, invoice) = tenants[k];
        let (seen, got): (Vec<String>, Value) =
            in_context(&mut c, &tokens[k], &detail(invoice), |tx| {
                let seen = tx
                    .query(&list, &[])
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                (
                    seen,
                    call(
                        tx,
                        "SELECT ctxguard.call_tool('invoice.get', $1)",
                        &json!({}),
                    ),
                )
            });
        assert_eq!(seen, vec![tenant.to_string()], "iteration {i}");
        assert_eq!(got["result"]["id"], invoice, "iteration {i}");
        // Between transactions the reused backend has no context and sees nothing.
        let n: i64 = c
            .query_one("SELECT count(*) FROM demo.invoices", &[])
            .unwrap()
            .get(0);
        assert_eq!(n, 0, "iteration {i}: rows visible without context");
    }
}

#[test]
fn concurrent_tenants_on_separate_backends_stay_apart() {
    let workers: Vec<_> = [
        ("alice", "acme"),
        ("carol", "globex"),
        ("bob", "acme"),
        ("dave", "globex"),
    ]
    .into_iter()
    .map(|(user, tenant)| {
        thread::spawn(move || {
            let tok = token(user, tenant, &["viewer"]);
            let mut c = connect();
            for _ in 0..100 {
                let tenants: Vec<String> =
                    in_context(&mut c, &tok, &json!({"pageType": "vendor_table"}), |tx| {
                        let r = call(
                            tx,
                            "SELECT ctxguard.call_tool('vendor.list', $1)",
                            &json!({}),
                        );
                        assert_eq!(r["result"]["count"], 5);
                        tx.query("SELECT DISTINCT tenant_id FROM demo.vendors", &[])
                            .unwrap()
                            .iter()
                            .map(|r| r.get(0))
                            .collect()
                    });
                assert_eq!(tenants, vec![tenant.to_string()]);
            }
        })
    })
    .collect();
    for w in workers {
        w.join().unwrap();
    }
}
