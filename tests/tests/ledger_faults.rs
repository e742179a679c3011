//! The ledger through crashes (issue 13; SECURITY_MATRIX I.55): `kill -9` of the audit writer and
//! `pg_ctl stop -m immediate`, both under load. Calls fail closed meanwhile (errors, never a
//! result), recover after the restart, and afterwards every result a client received has its
//! audit row and no persisted counter is below what clients received.
//!
//! A separate test binary, because it crashes the shared test cluster (cargo runs test binaries
//! one after another). Needs `CTXGUARD_TEST_PGDATA` and `CTXGUARD_TEST_PG_BIN` besides the usual
//! variables.

mod support;

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}

/// Run a command as the postgres OS user when we are root.
fn as_pg(program: &str, args: &[&str]) -> bool {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", program]);
        c
    } else {
        Command::new(program)
    };
    cmd.args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn pg_ctl(args: &[&str]) {
    let pg_ctl = format!("{}/pg_ctl", env("CTXGUARD_TEST_PG_BIN"));
    let data = env("CTXGUARD_TEST_PGDATA");
    let log = format!("{data}/../postgres.log");
    let mut all = vec!["-D", &data, "-l", &log, "-w"];
    all.extend_from_slice(args);
    assert!(as_pg(&pg_ctl, &all), "pg_ctl {args:?} failed");
}

fn connect_retrying(url: &str, within: Duration) -> Client {
    let until = Instant::now() + within;
    loop {
        match Client::connect(url, NoTls) {
            Ok(c) => return c,
            Err(e) if Instant::now() < until => {
                let _ = e;
                thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("no connection: {e}"),
        }
    }
}

fn viewer() -> Value {
    json!({"pageType": "document_viewer", "entity": {"type": "document", "id": "acme_guide"}})
}

/// What one client received: (call_id, generation) of every ok result, and how many calls
/// ended in an error or a broken connection.
#[derive(Default)]
struct Received {
    ok: Vec<(String, String)>,
    failed: usize,
    ok_after_fault: usize,
}

/// One client calling read_doc_pages (one page) in its own transactions until `until` and until
/// the clients together have 10 results after the fault (a slow recovery on a busy machine is
/// waited for, up to `hard`), a new generation every 10 calls, reconnecting whenever the server
/// goes away. A result counts as after the fault once this client has seen the fault (a failure
/// after `fault_at`).
fn client(
    user: String,
    until: Instant,
    hard: Instant,
    fault_at: Instant,
    after_fault: Arc<AtomicUsize>,
) -> Received {
    let tok = token(&user, "acme", &["viewer"]);
    let url = env("CTXGUARD_TEST_DATABASE_URL");
    let mut got = Received::default();
    let mut c: Option<Client> = None;
    let mut g: Option<(String, u32)> = None;
    let mut felt = false;
    while Instant::now() < until || (after_fault.load(Relaxed) < 10 && Instant::now() < hard) {
        let conn = match c.as_mut() {
            Some(c) => c,
            None => match Client::connect(&url, NoTls) {
                Ok(n) => c.insert(n),
                Err(_) => {
                    got.failed += 1;
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            },
        };
        let step = (|| -> Result<Option<Value>, postgres::Error> {
            if g.as_ref().is_none_or(|(_, n)| *n >= 10) {
                let mut tx = conn.transaction()?;
                tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &viewer()])?;
                let id: String = tx
                    .query_one("SELECT ctxguard.begin_generation('faults')::text", &[])?
                    .get(0);
                tx.commit()?;
                g = Some((id, 0));
            }
            let (id, n) = g.as_mut().expect("set above");
            *n += 1;
            let mut tx = conn.transaction()?;
            tx.execute(
                "SELECT ctxguard.set_context($1, $2, $3::text::uuid)",
                &[&tok, &viewer(), &id.as_str()],
            )?;
            let r: Value = tx
                .query_one(
                    "SELECT ctxguard.call_tool('read_doc_pages', '{\"page_start\": 1, \"page_end\": 1}')",
                    &[],
                )?
                .get(0);
            tx.commit()?;
            Ok(Some(r))
        })();
        match step {
            Ok(Some(r)) if r["status"] == "ok" => {
                let (id, _) = g.as_ref().expect("a generation");
                got.ok
                    .push((r["call_id"].as_str().unwrap().to_string(), id.clone()));
                if felt {
                    got.ok_after_fault += 1;
                    after_fault.fetch_add(1, Relaxed);
                }
            }
            Ok(_) => {
                got.failed += 1;
                felt |= Instant::now() > fault_at;
            }
            Err(_) => {
                got.failed += 1;
                felt |= Instant::now() > fault_at;
                c = None;
                // A generation minted in a transaction that died may not exist: start over.
                g = None;
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    got
}

/// Load from 4 clients (9 s, and until 10 results came after the fault) with `fault` applied after
/// 1.5 s; then check that everything clients received is audited and counted.
fn under_load(name: &str, fault: impl FnOnce()) {
    let start = Instant::now();
    let fault_at = start + Duration::from_millis(1500);
    let until = start + Duration::from_secs(9);
    let hard = start + Duration::from_secs(120);
    let after_fault = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|k| {
            let user = format!("{name}_{k}");
            let after = after_fault.clone();
            thread::spawn(move || client(user, until, hard, fault_at, after))
        })
        .collect();
    thread::sleep(fault_at.saturating_duration_since(Instant::now()));
    fault();
    let received: Vec<Received> = clients.into_iter().map(|h| h.join().unwrap()).collect();
    let ok: Vec<(String, String)> = received.iter().flat_map(|r| r.ok.clone()).collect();
    assert!(ok.len() > 20, "too little load: {}", ok.len());
    assert!(
        received.iter().map(|r| r.failed).sum::<usize>() > 0,
        "the fault was not felt by any client"
    );
    assert!(
        received.iter().map(|r| r.ok_after_fault).sum::<usize>() > 0,
        "no call succeeded after the restart"
    );
    let mut admin = connect_retrying(&env("CTXGUARD_TEST_ADMIN_URL"), Duration::from_secs(30));
    let ids: Vec<String> = ok.iter().map(|(c, _)| c.clone()).collect();
    let audited: HashMap<String, (String, i32)> = admin
        .query(
            "SELECT call_id::text, generation::text, result_bytes FROM ctxguard.audit_log
              WHERE call_id::text = ANY($1) AND decision = 'allow'",
            &[&ids],
        )
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.get::<_, String>(0),
                (r.get::<_, String>(1), r.get::<_, i32>(2)),
            )
        })
        .collect();
    let missing: Vec<&String> = ids.iter().filter(|c| !audited.contains_key(*c)).collect();
    assert!(
        missing.is_empty(),
        "results without an audit row: {missing:?}"
    );
    // Per user: the bytes of its days persisted >= what its client received (the writer persists
    // a day's bytes ahead of the calls, by a margin: a crash leaves more, never less).
    for (k, r) in received.iter().enumerate() {
        let user = format!("{name}_{k}");
        let got: i64 = r.ok.iter().map(|(c, _)| i64::from(audited[c].1)).sum();
        let kept: i64 = admin
            .query_one(
                "SELECT coalesce(sum(bytes), 0)::int8 FROM ctxguard.user_day_usage
                  WHERE tenant_id = 'acme' AND user_id = $1",
                &[&user],
            )
            .unwrap()
            .get(0);
        assert!(
            kept >= got,
            "user {user}: {kept} bytes persisted < {got} received"
        );
    }
    // Per user: the page its results returned is in its daily coverage (a crash forgets no page of
    // a result that left).
    for (k, r) in received.iter().enumerate() {
        if r.ok.is_empty() {
            continue;
        }
        let user = format!("{name}_{k}");
        let rows: i64 = admin
            .query_one(
                "SELECT count(*) FROM ctxguard.document_coverage
                  WHERE tenant_id = 'acme' AND user_id = $1 AND doc_id = 'acme_guide' AND page_no = 1",
                &[&user],
            )
            .unwrap()
            .get(0);
        assert!(
            rows >= 1,
            "user {user}: page 1 returned {} times, not in document_coverage",
            r.ok.len()
        );
    }
    // Per generation: bytes and per-document calls persisted >= what clients received.
    let mut per_gen: HashMap<String, (i64, i32)> = HashMap::new();
    for (call, g) in &ok {
        let e = per_gen.entry(g.clone()).or_default();
        e.0 += i64::from(audited[call].1);
        e.1 += 1;
    }
    for (g, (bytes, calls)) in per_gen {
        let r = admin
            .query_one(
                "SELECT g.bytes_used, coalesce((SELECT calls FROM ctxguard.document_calls d
                                                 WHERE d.generation = g.id AND d.doc_id = 'acme_guide'), 0)
                   FROM ctxguard.generations g WHERE g.id = $1::text::uuid",
                &[&g],
            )
            .unwrap();
        let (used, counted): (i64, i32) = (r.get(0), r.get(1));
        assert!(
            used >= bytes,
            "generation {g}: {used} bytes persisted < {bytes} received"
        );
        assert!(
            counted >= calls,
            "generation {g}: {counted} calls persisted < {calls} received"
        );
    }
    // The chain is intact after the crash.
    let v: Value = admin
        .query_one("SELECT ctxguard.verify_audit('acme')", &[])
        .unwrap()
        .get(0);
    assert_eq!(v["intact"], json!(true), "{v}");
}

#[test]
fn crashes_forget_no_charge_and_no_audit_row_of_a_returned_result() {
    // One test: each step restarts the shared cluster, so none may run beside another.
    generation_minted_with_its_calls();
    large_quota_through_restarts();
    // kill -9 of the writer: the postmaster restarts every backend (shared memory may be
    // inconsistent), and restarts the writer; calls fail meanwhile.
    under_load("killwriter", || {
        let mut admin = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
        let pid: Option<i32> = admin
            .query_one("SELECT (ctxguard.ledger_stats()->>'writer_pid')::int4", &[])
            .unwrap()
            .get(0);
        let pid = pid.expect("a writer runs under load").to_string();
        assert!(as_pg("kill", &["-9", &pid]), "kill -9 {pid}");
    });
    // An immediate shutdown (no checkpoint, no clean exit of anyone), then a start.
    under_load("immediate", || {
        pg_ctl(&["-m", "immediate", "stop"]);
        thread::sleep(Duration::from_millis(500));
        pg_ctl(&["start"]);
    });
}

/// A large quota's window is persisted ahead of its calls by a margin (at most 64 calls): after a
/// crash (`pg_ctl stop -m immediate`, which empties shared memory) the window counts no fewer
/// calls than were made, and at most the margin more (it refuses early, never late); after a clean
/// restart (the writer writes the exact counts when it stops) it counts exactly.
fn large_quota_through_restarts() {
    let mut admin = connect_retrying(&env("CTXGUARD_TEST_ADMIN_URL"), Duration::from_secs(30));
    admin
        .execute(
            "SELECT ctxguard.register_tool('quota.crash', 'Ping, with a large quota.', '{\"type\": \"object\"}',
                    't.quota_ping(jsonb)',
                    '{\"page_types\": [\"quota_lab\"], \"run_as\": \"ctxguard_tools\", \"rate_limit\": {\"per\": \"user\", \"calls\": 6400, \"window\": \"1h\"}}')",
            &[],
        )
        .unwrap();
    drop(admin);
    let tok = token(
        &format!("quota-crash-{}", std::process::id()),
        "acme",
        &["viewer"],
    );
    // A call (`explain`: a dry run, which reads the window's count without counting).
    let call = |explain: bool| -> Value {
        let mut c = connect_retrying(&env("CTXGUARD_TEST_DATABASE_URL"), Duration::from_secs(30));
        let mut tx = c.transaction().unwrap();
        tx.execute(
            "SELECT ctxguard.set_context($1, $2)",
            &[&tok, &json!({"pageType": "quota_lab"})],
        )
        .unwrap();
        let sql = if explain {
            "SELECT ctxguard.explain_call('quota.crash', '{}')"
        } else {
            "SELECT ctxguard.call_tool('quota.crash')"
        };
        let r: Value = tx.query_one(sql, &[]).unwrap().get(0);
        tx.commit().unwrap();
        assert_eq!(r["status"], "ok", "{r}");
        r
    };
    let counted = || -> i64 {
        let r = call(true);
        r["quotas"][0]["used"]
            .as_i64()
            .unwrap_or_else(|| panic!("the window's count: {r}"))
    };
    for _ in 0..5 {
        call(false);
    }
    assert_eq!(counted(), 5, "while the server runs, the count is exact");
    pg_ctl(&["-m", "immediate", "stop"]);
    thread::sleep(Duration::from_millis(300));
    pg_ctl(&["start"]);
    let after_crash = counted();
    assert!(
        (5..=5 + 64).contains(&after_crash),
        "after a crash the window counts {after_crash} for 5 calls: never fewer, at most the margin more"
    );
    call(false);
    pg_ctl(&["-m", "fast", "restart"]);
    assert_eq!(
        counted(),
        after_crash + 1,
        "after a clean restart the window's count is exact"
    );
}

/// A generation minted in the transaction of its own calls: when their records reach the writer,
/// the generation's row is not committed yet, so the writer cannot save its counters then. They
/// are saved once the row commits, and a restart (which empties shared memory) loads them.
fn generation_minted_with_its_calls() {
    let tok = token("sametx", "acme", &["viewer"]);
    let mut c = connect_retrying(&env("CTXGUARD_TEST_DATABASE_URL"), Duration::from_secs(30));
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &viewer()])
        .unwrap();
    let g: String = tx
        .query_one("SELECT ctxguard.begin_generation('same-tx')::text", &[])
        .unwrap()
        .get(0);
    for p in 1..=2 {
        let args = json!({"page_start": p, "page_end": p}).to_string();
        let r: Value = tx
            .query_one(
                "SELECT ctxguard.call_tool('read_doc_pages', $1::text::jsonb)",
                &[&args],
            )
            .unwrap()
            .get(0);
        assert_eq!(r["status"], "ok", "{r}");
    }
    tx.commit().unwrap();
    drop(c);
    pg_ctl(&["-m", "fast", "restart"]);
    let mut admin = connect_retrying(&env("CTXGUARD_TEST_ADMIN_URL"), Duration::from_secs(30));
    let received: i64 = admin
        .query_one(
            "SELECT coalesce(sum(result_bytes), 0)::int8 FROM ctxguard.audit_log
              WHERE generation = $1::text::uuid AND decision = 'allow'",
            &[&g],
        )
        .unwrap()
        .get(0);
    assert!(received > 0, "the two calls were audited with their bytes");
    let r = admin
        .query_one(
            "SELECT g.bytes_used, coalesce(d.calls, 0) FROM ctxguard.generations g
               LEFT JOIN ctxguard.document_calls d ON d.generation = g.id AND d.doc_id = 'acme_guide'
              WHERE g.id = $1::text::uuid",
            &[&g],
        )
        .unwrap();
    let (used, counted): (i64, i32) = (r.get(0), r.get(1));
    assert_eq!(
        used, received,
        "generation bytes persisted across the restart"
    );
    assert_eq!(
        counted, 2,
        "per-document calls persisted across the restart"
    );
}
