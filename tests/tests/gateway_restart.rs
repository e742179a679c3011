//! PostgreSQL restarted under load (SECURITY_MATRIX G.42): clear 503s while it is down, recovery
//! without restarting the gateway, and no half-written rows. A separate test binary, because it
//! restarts the shared test cluster (cargo runs test binaries one after another).
//!
//! Needs `CTXGUARD_TEST_PGDATA` and `CTXGUARD_TEST_PG_BIN` besides the usual variables.

mod support;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn pg_ctl(args: &[&str]) {
    let pg_ctl = format!("{}/pg_ctl", env("CTXGUARD_TEST_PG_BIN"));
    let data = env("CTXGUARD_TEST_PGDATA");
    // initdb and the server refuse to run as root: run pg_ctl as postgres when we are root.
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &pg_ctl]);
        c
    } else {
        Command::new(&pg_ctl)
    };
    let log = format!("{data}/../postgres.log");
    let status = cmd
        .args(["-D", &data, "-l", &log, "-w"])
        .args(args)
        .status()
        .expect("run pg_ctl");
    assert!(status.success(), "pg_ctl {args:?} failed");
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}

/// Where the restart stood when a request was sent.
const UP: u8 = 0;
const DOWN: u8 = 1; // `pg_ctl stop -w` returned: the server is gone
const STARTING: u8 = 2; // `pg_ctl start` running
const RESTARTED: u8 = 3; // `pg_ctl start -w` returned: the server accepts connections

/// A hang guard (never a timing assertion): how long any one phase may take on a slow machine.
const GUARD: Duration = Duration::from_secs(120);

/// Wait for the next outcome the load reports that satisfies `pred`; the load keeps going.
async fn wait_for(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(u8, u16)>,
    what: &str,
    pred: impl Fn(u8, u16) -> bool,
) {
    let found = tokio::time::timeout(GUARD, async {
        while let Some((phase, status)) = rx.recv().await {
            if pred(phase, status) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "never saw {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_load_gives_503_then_recovers_without_half_written_rows() {
    let gw = gateway(&["--db-timeout-ms", "500", "--pool-size", "4"]).await;
    let alice = token("alice", "acme", &[]);
    let run = uuid::Uuid::new_v4().simple().to_string();
    // The load sends one request after another, tagging each with the phase it was sent in, and
    // reports every outcome; each step below waits for an outcome (an event), never for a clock.
    let phase = Arc::new(AtomicU8::new(UP));
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let load = {
        let (alice, run, phase, stop) = (alice.clone(), run.clone(), phase.clone(), stop.clone());
        tokio::spawn(async move {
            let mut outcomes: Vec<(u8, u16, Value, String)> = Vec::new();
            for i in 0.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                assert!(i < 5_000, "the load never ended: {outcomes:?}");
                let conv = format!("restart-{run}-{i}");
                let sent_in = phase.load(Ordering::SeqCst);
                let (status, body) = post_json(gw, "/v1/chat", Some(&alice), &conv,
                    &json!({"message": "what vendors do I have?", "pageContext": {"pageType": "vendor_table"}, "conversationId": conv})).await;
                outcomes.push((sent_in, status, body, conv));
                let _ = tx.send((sent_in, status));
                // Pacing only (fewer rows to check), not synchronisation.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            outcomes
        })
    };
    wait_for(&mut rx, "three answered turns before the restart", {
        let seen = std::sync::atomic::AtomicUsize::new(0);
        move |p, s| p == UP && s == 200 && seen.fetch_add(1, Ordering::SeqCst) == 2
    })
    .await;
    tokio::task::spawn_blocking(|| pg_ctl(&["-m", "fast", "stop"]))
        .await
        .unwrap();
    phase.store(DOWN, Ordering::SeqCst);
    wait_for(&mut rx, "a 503 while the server was down", |p, s| {
        p == DOWN && s == 503
    })
    .await;
    phase.store(STARTING, Ordering::SeqCst);
    tokio::task::spawn_blocking(|| pg_ctl(&["start"]))
        .await
        .unwrap();
    phase.store(RESTARTED, Ordering::SeqCst);
    wait_for(&mut rx, "an answered turn after the restart", |p, s| {
        p == RESTARTED && s == 200
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    let tagged = load.await.unwrap();
    let down: Vec<u16> = tagged.iter().filter(|o| o.0 == DOWN).map(|o| o.1).collect();
    assert!(
        down.iter().all(|s| *s == 503),
        "every request sent while the server was down is a 503: {down:?}"
    );
    let outcomes: Vec<(u16, Value, String)> =
        tagged.into_iter().map(|(_, s, b, c)| (s, b, c)).collect();

    let statuses: Vec<u16> = outcomes.iter().map(|o| o.0).collect();
    let unavailable = outcomes.iter().filter(|o| o.0 == 503).collect::<Vec<_>>();
    assert!(
        !unavailable.is_empty(),
        "some requests hit the downtime: {statuses:?}"
    );
    assert!(
        unavailable
            .iter()
            .all(|o| o.1["error"]["code"] == "DATABASE_UNAVAILABLE"),
        "clear code while down"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    // Recovered without restarting the gateway: wait_for above saw a turn answered that was sent
    // after the server came back.

    // No half-written rows: every answered turn is saved once with its audited call; a refused
    // request left no turn behind.
    let db = admin().await;
    for (status, _, conv) in &outcomes {
        let turns: i64 = db
            .query_one(
                "SELECT count(*) FROM ctxguard.conversation_turns WHERE conversation_id = $1",
                &[conv],
            )
            .await
            .unwrap()
            .get(0);
        let allows: i64 = db.query_one("SELECT count(*) FROM ctxguard.audit_log WHERE trace_id = $1 AND decision = 'allow'", &[conv]).await.unwrap().get(0);
        match status {
            200 => assert_eq!((turns, allows), (1, 1), "{conv}"),
            _ => assert!(
                turns == 0 && allows <= 1,
                "{conv}: {turns} turns, {allows} audited calls"
            ),
        }
    }
}
