//! Real clients, real backends: concurrency and connection reuse, as the non-superuser gateway role.
//! That role reads nothing directly (it can only call ctxguard): what a tenant sees is what its
//! tools return, and outcomes are checked as the admin.
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL` (a database loaded with `sql/demo/schema.sql`, connecting as
//! `ctxguard_gateway`), `CTXGUARD_TEST_ADMIN_URL` and `CTXGUARD_TEST_JWT_SECRET`; `scripts/test.sh`
//! provides them.

mod support;

use std::sync::{Arc, Barrier};
use std::thread;

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn connect() -> Client {
    Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).expect("connect as ctxguard_gateway")
}

/// An invoice's status, read as the admin.
fn status_of(invoice: &str) -> String {
    Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls)
        .unwrap()
        .query_one(
            "SELECT status FROM demo.invoices WHERE id = $1",
            &[&invoice],
        )
        .unwrap()
        .get(0)
}

/// The distinct id prefixes (`acme`, `glx`) of the vendors a `vendor.list` result holds.
fn vendor_prefixes(result: &Value) -> Vec<String> {
    let mut p: Vec<String> = result["result"]["vendors"]
        .as_array()
        .unwrap_or_else(|| panic!("no vendors: {result}"))
        .iter()
        .map(|v| {
            v["id"]
                .as_str()
                .unwrap()
                .split('_')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    p.dedup();
    p
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
    assert_eq!(status_of(invoice), "open");
    let pending = in_context(&mut c, &alice, &detail(invoice), |tx| {
        call(
            tx,
            "SELECT ctxguard.call_tool('invoice.mark_paid', $1)",
            &json!({}),
        )
    });
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

    let allows: i64 = in_context(&mut c, &alice, &detail(invoice), |tx| {
        tx.query_one(
            "SELECT count(*) FROM ctxguard.audit_log WHERE call_id = $1::text::uuid AND decision = 'allow'",
            &[&call_id],
        )
        .unwrap()
        .get(0)
    });
    assert_eq!((allows, status_of(invoice).as_str()), (1, "paid"));
}

#[test]
fn one_connection_alternating_tenants_never_mixes_rows() {
    let tenants = [
        ("alice", "acme", "acme", "acme_inv2"),
        ("carol", "globex", "glx", "glx_inv2"),
    ];
    let tokens: Vec<String> = tenants
        .iter()
        .map(|(u, t, _, _)| token(u, t, &["ap_clerk"]))
        .collect();
    let mut c = connect();
    for i in 0..200 {
        let k = i % 2;
        let (_, _, prefix, invoice) = tenants[k];
        // The handlers run on this same reused backend: their rows are the context's tenant's.
        let vendors = in_context(
            &mut c,
            &tokens[k],
            &json!({"pageType": "vendor_table"}),
            |tx| {
                call(
                    tx,
                    "SELECT ctxguard.call_tool('vendor.list', $1)",
                    &json!({}),
                )
            },
        );
        assert_eq!(vendors["result"]["count"], 5, "iteration {i}: {vendors}");
        assert_eq!(vendor_prefixes(&vendors), vec![prefix], "iteration {i}");
        let got = in_context(&mut c, &tokens[k], &detail(invoice), |tx| {
            call(
                tx,
                "SELECT ctxguard.call_tool('invoice.get', $1)",
                &json!({}),
            )
        });
        assert_eq!(got["result"]["id"], invoice, "iteration {i}");
        // Between transactions the reused backend has no context: nothing is callable.
        let row = c
            .query_one(
                "SELECT ctxguard.tenant_id(), ctxguard.call_tool('vendor.list', '{}')",
                &[],
            )
            .unwrap();
        let (tenant, none): (Option<String>, Value) = (row.get(0), row.get(1));
        assert_eq!(
            tenant, None,
            "iteration {i}: a context outlived its transaction"
        );
        assert_eq!(none["error"]["code"], "CONTEXT_MISSING", "iteration {i}");
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
            let prefix = if tenant == "acme" { "acme" } else { "glx" };
            let mut c = connect();
            for _ in 0..100 {
                let r = in_context(&mut c, &tok, &json!({"pageType": "vendor_table"}), |tx| {
                    call(
                        tx,
                        "SELECT ctxguard.call_tool('vendor.list', $1)",
                        &json!({}),
                    )
                });
                assert_eq!(r["result"]["count"], 5, "{r}");
                assert_eq!(vendor_prefixes(&r), vec![prefix]);
            }
        })
    })
    .collect();
    for w in workers {
        w.join().unwrap();
    }
}
