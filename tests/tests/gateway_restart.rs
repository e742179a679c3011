//! PostgreSQL restarted under load (SECURITY_MATRIX G.42): clear 503s while it is down, recovery
//! without restarting the gateway, and no half-written rows. A separate test binary, because it
//! restarts the shared test cluster (cargo runs test binaries one after another).
//!
//! Needs `CTXGUARD_TEST_PGDATA` and `CTXGUARD_TEST_PG_BIN` besides the usual variables.

mod support;

use std::process::Command;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_load_gives_503_then_recovers_without_half_written_rows() {
    let gw = gateway(&["--db-timeout-ms", "500", "--pool-size", "4"]).await;
    let alice = token("alice", "acme", &[]);
    let run = uuid::Uuid::new_v4().simple().to_string();
    let load = {
        let (alice, run) = (alice.clone(), run.clone());
        tokio::spawn(async move {
            let mut outcomes: Vec<(u16, Value, String)> = Vec::new();
            for i in 0..60 {
                let conv = format!("restart-{run}-{i}");
                let (status, body) = post_json(gw, "/v1/chat", Some(&alice), &conv,
                    &json!({"message": "what vendors do I have?", "pageContext": {"pageType": "vendor_table"}, "conversationId": conv})).await;
                outcomes.push((status, body, conv));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            outcomes
        })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    tokio::task::spawn_blocking(|| pg_ctl(&["-m", "fast", "stop"]))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    tokio::task::spawn_blocking(|| pg_ctl(&["start"]))
        .await
        .unwrap();
    let outcomes = load.await.unwrap();

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
    assert_eq!(
        statuses.last(),
        Some(&200),
        "recovered without restarting the gateway: {statuses:?}"
    );

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
