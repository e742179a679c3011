//! Drills for gateways behind pgbouncer (issue 20, SECURITY_MATRIX G.47's failures): one of two
//! gateways killed mid-stream (its clients get a clean connection error, the other's clients are
//! unaffected), pgbouncer restarted, PostgreSQL restarted: clean 503 DATABASE_UNAVAILABLE while
//! down, recovery without restarting a gateway (the page listener reconnects too), and nothing
//! half-written (every answered call has exactly one audit row, the audit chain holds). A separate
//! binary: it restarts the shared pgbouncer and cluster.
//!
//! Needs `CTXGUARD_TEST_GATEWAY_BIN` (the gateway binary), `CTXGUARD_TEST_DRILL_PORT` (a free
//! port for it), `CTXGUARD_TEST_PGBOUNCER_INI`, `CTXGUARD_TEST_PGDATA`, `CTXGUARD_TEST_PG_BIN`
//! besides the usual variables.

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}

/// Run as postgres when we are root (pg_ctl and pgbouncer refuse root).
fn as_postgres(program: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", program]);
        c
    } else {
        Command::new(program)
    }
}

fn pgbouncer(start: bool) {
    let ini = env("CTXGUARD_TEST_PGBOUNCER_INI");
    let pidfile = std::path::Path::new(&ini).with_file_name("pgbouncer.pid");
    if start {
        let bin = if std::path::Path::new("/usr/sbin/pgbouncer").exists() {
            "/usr/sbin/pgbouncer"
        } else {
            "pgbouncer"
        };
        assert!(as_postgres(bin)
            .args(["-d", &ini])
            .status()
            .unwrap()
            .success());
    } else {
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        let pid = pid.trim().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn pg_ctl(args: &[&str]) {
    let pg_ctl = format!("{}/pg_ctl", env("CTXGUARD_TEST_PG_BIN"));
    let data = env("CTXGUARD_TEST_PGDATA");
    let log = format!("{data}/../postgres.log");
    assert!(as_postgres(&pg_ctl)
        .args(["-D", &data, "-l", &log, "-w"])
        .args(args)
        .status()
        .unwrap()
        .success());
}

/// One execute call: (status, body).
async fn call(
    gw: SocketAddr,
    tok: &str,
    trace: &str,
    page: &Value,
) -> Result<(u16, Value), String> {
    let resp = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
        .post(format!("http://{gw}/internal/mcp/execute"))
        .bearer_auth(tok)
        .header("x-request-id", trace)
        .json(&json!({"tool_name": "vendor.list", "arguments": {}, "pageContext": page}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    Ok((status, resp.json().await.unwrap_or(Value::Null)))
}

/// A call's trace id and its (status, body), or the client's error.
type Outcome = (String, Result<(u16, Value), String>);

/// Calls through `gw` until `stop`: every (trace, outcome).
fn load(
    gw: SocketAddr,
    tok: String,
    run: String,
    who: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Outcome>> {
    tokio::spawn(async move {
        let page = json!({"pageType": "vendor_table"});
        let mut out = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let trace = format!("drill-{run}-{who}-{i}");
            let r = call(gw, &tok, &trace, &page).await;
            if r.is_err() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            out.push((trace, r));
            i += 1;
        }
        out
    })
}

/// Wait (up to 60 s, on the outcome) until `gw` answers 200 again.
async fn recovered(gw: SocketAddr, tok: &str, run: &str, what: &str) {
    let page = json!({"pageType": "vendor_table"});
    for i in 0..600 {
        if let Ok((200, _)) = call(gw, tok, &format!("drill-{run}-probe-{what}-{i}"), &page).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no recovery after {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_a_gateway_restart_pgbouncer_and_postgres_under_load() {
    let pooled = env("CTXGUARD_TEST_POOLER_URL");
    let direct = env("CTXGUARD_TEST_DATABASE_URL");
    let run = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let tok = token(&format!("drill-{run}"), "acme", &[]);

    // Gateway A: the real binary, to be killed with SIGKILL. Gateway B: in this process.
    let port: u16 = env("CTXGUARD_TEST_DRILL_PORT").parse().unwrap();
    let a: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = Command::new(env("CTXGUARD_TEST_GATEWAY_BIN"))
        .env("CTXGUARD_DATABASE_URL", &pooled)
        .env("CTXGUARD_NOTIFY_DATABASE_URL", &direct)
        .env("CTXGUARD_LISTEN", a.to_string())
        .env("CTXGUARD_MCP_DISCOVER", "false")
        .env("CTXGUARD_DB_TIMEOUT_MS", "1000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (b, state_b) = gateway_at(
        &pooled,
        &["--notify-database-url", &direct, "--db-timeout-ms", "1000"],
    )
    .await;
    recovered(a, &tok, &run, "start").await;
    // B follows page changes (as it does from its first MCP session on).
    state_b.pages.want();

    // 1. Gateway A killed mid-stream: its client gets connection errors, B's clients none.
    let stop = Arc::new(AtomicBool::new(false));
    let on_a = load(a, tok.clone(), run.clone(), "a", stop.clone());
    let on_b = load(b, tok.clone(), run.clone(), "b1", stop.clone());
    let on_b2 = load(b, tok.clone(), run.clone(), "b2", stop.clone());
    tokio::time::sleep(Duration::from_millis(700)).await;
    child.kill().unwrap();
    child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    let a_out = on_a.await.unwrap();
    let mut b_out = on_b.await.unwrap();
    b_out.extend(on_b2.await.unwrap());
    assert!(
        a_out.iter().any(|o| matches!(o.1, Ok((200, _)))),
        "A answered before"
    );
    assert!(
        a_out.iter().any(|o| o.1.is_err()),
        "A's client saw the kill"
    );
    assert!(
        a_out.last().unwrap().1.is_err(),
        "A stays gone: {:?}",
        a_out.last()
    );
    assert!(
        b_out.iter().all(|o| matches!(o.1, Ok((200, _)))),
        "B unaffected: {:?}",
        b_out.iter().find(|o| !matches!(o.1, Ok((200, _))))
    );
    let mut all = a_out;
    all.extend(b_out);

    // 2. pgbouncer restarted, then 3. PostgreSQL restarted, each under load on B.
    let started_at = || async {
        admin()
            .await
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .await
            .unwrap()
            .get::<_, String>(0)
    };
    let postgres_started = started_at().await;
    for drill in ["pgbouncer", "postgres"] {
        let stop = Arc::new(AtomicBool::new(false));
        let on_b = load(b, tok.clone(), run.clone(), drill, stop.clone());
        tokio::time::sleep(Duration::from_millis(500)).await;
        match drill {
            "pgbouncer" => {
                tokio::task::spawn_blocking(|| pgbouncer(false))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(800)).await;
                tokio::task::spawn_blocking(|| pgbouncer(true))
                    .await
                    .unwrap();
            }
            _ => {
                tokio::task::spawn_blocking(|| pg_ctl(&["-m", "fast", "stop"]))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(800)).await;
                tokio::task::spawn_blocking(|| pg_ctl(&["start"]))
                    .await
                    .unwrap();
            }
        }
        recovered(b, &tok, &run, drill).await;
        stop.store(true, Ordering::Relaxed);
        let out = on_b.await.unwrap();
        let failed: Vec<_> = out
            .iter()
            .filter(|o| !matches!(o.1, Ok((200, _))))
            .collect();
        // pgbouncer's clients all lose their connections; PostgreSQL's restart behind pgbouncer may
        // cost only the transactions in flight (pgbouncer holds new ones until the server is back).
        if drill == "pgbouncer" {
            assert!(!failed.is_empty(), "{drill}: some calls hit the downtime");
        }
        for (trace, o) in &failed {
            match o {
                Ok((503, body)) => assert_eq!(
                    body["error"]["code"], "DATABASE_UNAVAILABLE",
                    "{drill} {trace}: {body}"
                ),
                other => panic!("{drill} {trace}: not a clean 503: {other:?}"),
            }
        }
        assert!(
            matches!(out.last().unwrap().1, Ok((200, _))),
            "{drill}: recovered"
        );
        all.extend(out);
    }
    assert_ne!(
        started_at().await,
        postgres_started,
        "PostgreSQL did restart"
    );
    // The page listener of B reconnected after PostgreSQL's restart.
    for _ in 0..200 {
        if state_b.pages.following() == "listening" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state_b.pages.following(), "listening");

    // Nothing half-written: every answered call has exactly one allow row, none has two, and
    // acme's audit chain verifies.
    let db = admin().await;
    let rows = db
        .query(
            "SELECT trace_id, count(*) FILTER (WHERE decision = 'allow') FROM ctxguard.audit_log
              WHERE trace_id LIKE $1 GROUP BY trace_id",
            &[&format!("drill-{run}-%")],
        )
        .await
        .unwrap();
    let allows: std::collections::HashMap<String, i64> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    for (trace, o) in &all {
        let n = allows.get(trace).copied().unwrap_or(0);
        match o {
            Ok((200, _)) => assert_eq!(n, 1, "{trace}"),
            _ => assert!(n <= 1, "{trace}: {n} allow rows"),
        }
    }
    let intact: Option<String> = db
        .query_one("SELECT ctxguard.verify_audit('acme')->>'intact'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(intact.as_deref(), Some("true"), "acme's audit chain");
}
