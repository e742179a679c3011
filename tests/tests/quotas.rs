//! Call quotas in time windows (policy `rate_limit`, issue 30) with real sessions: exact under
//! racing sessions, a cancelled call neither refunded twice nor charged twice, and windows that roll
//! over. The tools are in `sql/tests/fixtures.sql` (page `quota_lab`); each test uses a tenant or
//! users of its own, so it can run again on the same database.
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL` (as `ctxguard_gateway`), `CTXGUARD_TEST_ADMIN_URL` and
//! `CTXGUARD_TEST_JWT_SECRET`; `scripts/test.sh` provides them.

mod support;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn connect() -> Client {
    Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).expect("connect as ctxguard_gateway")
}

fn admin() -> Client {
    Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).expect("connect as the admin")
}

fn lab() -> Value {
    json!({"pageType": "quota_lab"})
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// One call of `tool` in a transaction of its own with `tok`'s context; committed, or rolled back.
fn call(c: &mut Client, tok: &str, tool: &str, commit: bool) -> Value {
    support::call_in_transaction(c, tok, &lab(), tool, commit)
}

fn code(v: &Value) -> &str {
    v["error"]["code"]
        .as_str()
        .or_else(|| v["status"].as_str())
        .unwrap_or("?")
}

/// N+k sessions of one tenant race for a quota of N a tenant: exactly N run, whether their
/// callers commit or roll back, and the N are what the ledger's writer persisted.
#[test]
fn racing_sessions_get_exactly_the_quota() {
    const QUOTA: usize = 5;
    const SESSIONS: usize = 16;
    let tenant = unique("quota-race");
    let barrier = Arc::new(Barrier::new(SESSIONS));
    let handles: Vec<_> = (0..SESSIONS)
        .map(|i| {
            let barrier = barrier.clone();
            let tok = token(&format!("user{i}"), &tenant, &[]);
            thread::spawn(move || {
                let mut c = connect();
                let mut tx = c.transaction().unwrap();
                tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &lab()])
                    .unwrap();
                barrier.wait();
                let v: Value = tx
                    .query_one("SELECT ctxguard.call_tool('quota.race')", &[])
                    .unwrap()
                    .get(0);
                // Half the callers roll back: it gives nothing back.
                if i % 2 == 0 {
                    tx.rollback().unwrap();
                } else {
                    tx.commit().unwrap();
                }
                v
            })
        })
        .collect();
    let results: Vec<Value> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = results.iter().filter(|v| code(v) == "ok").count();
    let refused: Vec<&Value> = results
        .iter()
        .filter(|v| code(v) == "RATE_LIMIT_EXCEEDED")
        .collect();
    assert_eq!(ok, QUOTA, "exactly the quota ran: {results:?}");
    assert_eq!(
        refused.len(),
        SESSIONS - QUOTA,
        "the rest were refused: {results:?}"
    );
    for r in &refused {
        let retry = r["error"]["details"]["retry_after_ms"].as_i64().unwrap();
        assert!((1..=3_600_000).contains(&retry), "retry_after_ms {retry}");
    }
    // After every rollback, still no room: the counts stood.
    let mut c = connect();
    let again = call(&mut c, &token("late", &tenant, &[]), "quota.race", true);
    assert_eq!(code(&again), "RATE_LIMIT_EXCEEDED", "{again}");
    let mut a = admin();
    let allowed: i64 = a
        .query_one(
            "SELECT count(*) FROM ctxguard.audit_log WHERE tenant_id = $1 AND tool = 'quota.race' AND decision = 'allow'",
            &[&tenant],
        )
        .unwrap()
        .get(0);
    assert_eq!(allowed, QUOTA as i64, "one allow row per call that ran");
    let persisted: i32 = a
        .query_one(
            "SELECT calls FROM ctxguard.quota_usage WHERE tenant_id = $1 AND user_id = '' AND tool = 'quota.race'",
            &[&tenant],
        )
        .unwrap()
        .get(0);
    assert_eq!(persisted, QUOTA as i32, "the writer persisted the count");
    let stats: Value = a
        .query_one("SELECT ctxguard.ledger_stats()", &[])
        .unwrap()
        .get(0);
    let quotas = &stats["tables"]["ledger_quotas"];
    assert!(
        quotas["live"].as_i64().unwrap() >= 1,
        "ledger_stats: {stats}"
    );
    assert!(
        quotas["tenant_cap"].as_i64().unwrap() >= 1,
        "ledger_stats: {stats}"
    );
}

/// The advisory lock `t.quota_slow` (sql/tests/fixtures.sql) waits for.
const QUOTA_SLOW_LOCK: i64 = 15_150_030;
/// The advisory lock `quota.large_slow` waits for when asked to be slow.
const QUOTA_LARGE_SLOW_LOCK: i64 = 15_150_031;

/// Start `call` on a connection of its own and hold it in its handler: take advisory lock `key`
/// (as the superuser), start the call, and return once its backend waits for the lock (up to 30 s).
/// Returns the lock's holder (`pg_advisory_unlock(key)` releases the call), the call's backend pid
/// and its thread.
fn call_held_at_lock(
    key: i64,
    call: impl FnOnce(&mut Client) -> Value + Send + 'static,
) -> (Client, i32, thread::JoinHandle<Value>) {
    let mut lock = admin();
    lock.execute("SELECT pg_advisory_lock($1)", &[&key])
        .unwrap();
    let mut victim = connect();
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    let t = thread::spawn(move || call(&mut victim));
    wait_for_advisory_lock(&mut lock, pid);
    (lock, pid, t)
}

/// Wait (up to 30 s) until backend `pid` waits for an advisory lock: a slow call in its handler.
fn wait_for_advisory_lock(lock: &mut Client, pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = lock
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1",
                &[&pid],
            )
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the slow call never reached its lock"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A call cancelled in its handler (`pg_cancel_backend`) fails as `TOOL_ERROR` (SQLSTATE 57014)
/// and is audited: it counts, once. With a quota of 3: one call, one cancelled, one more runs and
/// the next is refused (a double charge would refuse the third call, a refund let a fourth through).
#[test]
fn a_cancelled_call_counts_once() {
    let user = unique("quota-cancel");
    let tok = token(&user, "acme", &[]);
    let mut c = connect();
    assert_eq!(
        code(&call(&mut c, &tok, "quota.slow", true)),
        "ok",
        "call 1 of 3"
    );
    let (mut lock, pid, t) = call_held_at_lock(QUOTA_SLOW_LOCK, {
        let tok = tok.clone();
        move |c| call(c, &tok, "quota.slow", true)
    });
    lock.execute("SELECT pg_cancel_backend($1)", &[&pid])
        .unwrap();
    let cancelled = t.join().unwrap();
    assert_eq!(code(&cancelled), "TOOL_ERROR", "{cancelled}");
    assert!(
        cancelled["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("57014")),
        "{cancelled}"
    );
    lock.execute("SELECT pg_advisory_unlock($1)", &[&QUOTA_SLOW_LOCK])
        .unwrap();
    assert_eq!(
        code(&call(&mut c, &tok, "quota.slow", false)),
        "ok",
        "call 3 of 3 (rolled back)"
    );
    let fourth = call(&mut c, &tok, "quota.slow", true);
    assert_eq!(code(&fourth), "RATE_LIMIT_EXCEEDED", "call 4: {fourth}");
    let rows: Vec<String> = lock
        .query(
            "SELECT decision FROM ctxguard.audit_log WHERE user_id = $1 AND tool = 'quota.slow' ORDER BY id",
            &[&user],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        rows,
        ["allow", "error", "allow", "deny"],
        "one record per call"
    );
}

/// A "1m" window: used up, refused with retry_after_ms, and open again once it rolls over.
#[test]
fn the_window_rolls_over() {
    let tok = token(&unique("quota-minute"), "acme", &[]);
    let mut c = connect();
    // Two calls a minute: the third is refused (a fourth if the minute turned in between).
    let mut ran = 0;
    let refused = loop {
        let v = call(&mut c, &tok, "quota.minute", true);
        match code(&v) {
            "ok" => ran += 1,
            "RATE_LIMIT_EXCEEDED" => break v,
            other => panic!("unexpected {other}: {v}"),
        }
        assert!(ran <= 4, "never refused");
    };
    assert!(ran >= 2, "refused after {ran}");
    let retry = refused["error"]["details"]["retry_after_ms"]
        .as_u64()
        .unwrap();
    assert!((1..=60_000).contains(&retry), "retry_after_ms {retry}");
    assert_eq!(
        refused["error"]["message"],
        "rate_limit: 2 calls per 1m per user: the quota is used up; retry after retry_after_ms"
    );
    thread::sleep(Duration::from_millis(retry + 250));
    let after = call(&mut c, &tok, "quota.minute", true);
    assert_eq!(code(&after), "ok", "the next window has room: {after}");
}

/// `ctxguard.ledger_stats()`'s count of counter rows the writer wrote without a statement.
fn counter_rows_direct(a: &mut Client) -> i64 {
    let stats: Value = a
        .query_one("SELECT ctxguard.ledger_stats()", &[])
        .unwrap()
        .get(0);
    stats["counter_rows_direct"].as_i64().unwrap_or(-1)
}

/// A persisted quota row: user, tool, window, calls.
type QuotaRow = (String, String, String, i32);

/// What the writer persisted for `tenant`: its quota rows and its users' bytes of today, against
/// the bytes its audit rows record.
fn persisted(a: &mut Client, tenant: &str) -> (Vec<QuotaRow>, i64, i64) {
    let quotas = a
        .query(
            "SELECT user_id, tool, win, calls FROM ctxguard.quota_usage WHERE tenant_id = $1 ORDER BY 1, 2, 3",
            &[&tenant],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let day: i64 = a
        .query_one(
            "SELECT coalesce(sum(bytes), 0)::int8 FROM ctxguard.user_day_usage WHERE tenant_id = $1",
            &[&tenant],
        )
        .unwrap()
        .get(0);
    let audited: i64 = a
        .query_one(
            "SELECT coalesce(sum(result_bytes), 0)::int8 FROM ctxguard.audit_log WHERE tenant_id = $1",
            &[&tenant],
        )
        .unwrap()
        .get(0);
    (quotas, day, audited)
}

/// The writer keeps a user's day and a quota window's count without a statement (issue 30: the
/// quota's upsert was most of what a quota added to a call): each call's batch updates the rows
/// in place, a new window is inserted and its quota's older windows deleted, and what it
/// persists is exactly what the calls used. When the tables are not as ctxguard creates them (a
/// DBA's extra column) the statement writes the same values.
#[test]
fn the_writer_persists_quota_and_day_counters_exactly() {
    let mut a = admin();
    let mut c = connect();
    for altered in [false, true] {
        if altered {
            a.batch_execute(
                "ALTER TABLE ctxguard.quota_usage ADD COLUMN dba_note text;
                 ALTER TABLE ctxguard.user_day_usage ADD COLUMN dba_note text",
            )
            .unwrap();
        }
        let tenant = unique("counters");
        let user = unique("counter-user");
        let tok = token(&user, &tenant, &[]);
        let before = counter_rows_direct(&mut a);
        // An older window of the same quota: deleted when the new window's row is written.
        a.execute(
            "INSERT INTO ctxguard.quota_usage (tenant_id, user_id, tool, win, window_start, calls)
             VALUES ($1, $2, 'quota.per_user', '1h', pg_catalog.date_trunc('hour', pg_catalog.now()) - interval '3 hours', 2)",
            &[&tenant, &user],
        )
        .unwrap();
        let first = call(&mut c, &tok, "quota.per_user", true);
        assert_eq!(code(&first), "ok", "{first}");
        let (quotas, _, audited) = persisted(&mut a, &tenant);
        assert_eq!(quotas.len(), 1, "the older window is gone: {quotas:?}");
        assert_eq!(quotas[0].3, 1, "{quotas:?}");
        assert!(audited > 0, "the call's bytes are audited");
        exact_day(&mut a, &tenant);
        let second = call(&mut c, &tok, "quota.per_user", true);
        assert_eq!(code(&second), "ok", "{second}");
        let third = call(&mut c, &tok, "quota.per_user", true);
        assert_eq!(code(&third), "RATE_LIMIT_EXCEEDED", "{third}");
        let (quotas, _, _) = persisted(&mut a, &tenant);
        assert_eq!(
            quotas
                .iter()
                .map(|q| (q.1.as_str(), q.2.as_str(), q.3))
                .collect::<Vec<_>>(),
            [("quota.per_user", "1h", 2)],
            "one row, the window's two calls"
        );
        exact_day(&mut a, &tenant);
        let direct = counter_rows_direct(&mut a) - before;
        if altered {
            a.batch_execute(
                "ALTER TABLE ctxguard.quota_usage DROP COLUMN dba_note;
                 ALTER TABLE ctxguard.user_day_usage DROP COLUMN dba_note",
            )
            .unwrap();
        } else {
            // This tenant's own: its user's new day row, then the day and the window updated.
            assert!(
                direct >= 3,
                "counter rows written without a statement: {direct}"
            );
        }
    }
}

/// `day.ping` (page `quota_lab`): a ping without a quota, whose calls count only the user's day.
fn register_day_ping(a: &mut Client) {
    a.execute(
        "SELECT ctxguard.register_tool('day.ping', 'Ping, without a quota.', '{\"type\": \"object\"}',
                't.quota_ping(jsonb)', '{\"page_types\": [\"quota_lab\"], \"run_as\": \"ctxguard_tools\"}')",
        &[],
    )
    .unwrap();
}

/// `n` calls of `day.ping`, each read `pause` after it: every read finds the persisted bytes at
/// least the audited bytes and at most [`DAY_MARGIN`] more. How many found them ahead.
fn day_pings(
    c: &mut Client,
    a: &mut Client,
    tok: &str,
    tenant: &str,
    n: usize,
    pause: Duration,
) -> i32 {
    let mut ahead = 0;
    for _ in 0..n {
        let v = call(c, tok, "day.ping", true);
        assert_eq!(code(&v), "ok", "{v}");
        thread::sleep(pause);
        let (_, day, audited) = persisted(a, tenant);
        assert!(
            (audited..=audited + DAY_MARGIN).contains(&day),
            "day {day} against audited {audited}"
        );
        ahead += i32::from(day > audited);
    }
    ahead
}

/// The largest margin by which a user's bytes of a day are persisted ahead of the calls
/// (`ctxguard_core::ledger::byte_margin`: a sixty-fourth of the daily limit, at most 1 MiB).
const DAY_MARGIN: i64 = 1 << 20;

/// Wait (up to 10 s) until `tenant`'s persisted bytes of the day are exactly what its audit rows
/// record; every read on the way is at least that and at most [`DAY_MARGIN`] above it. Returns
/// whether a read found them ahead.
fn exact_day(a: &mut Client, tenant: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ahead = false;
    loop {
        let (_, day, audited) = persisted(a, tenant);
        assert!(
            (audited..=audited + DAY_MARGIN).contains(&day),
            "day {day} against audited {audited}: never less, at most the margin more"
        );
        if day == audited {
            return ahead;
        }
        ahead = true;
        assert!(
            Instant::now() < deadline,
            "still {day} bytes persisted for {audited} audited"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

/// A user's bytes of a day are persisted ahead of the calls by a bounded margin
/// ([`DAY_MARGIN`]) instead of with every call's audit row (issue 34: that update was the largest
/// part of what the writer spent per record after the audit row itself), and the exact bytes
/// follow once the user has made no call for about a second. Whenever they are read, the
/// persisted bytes are never below what the audited results used (a crash then refuses early,
/// never late).
#[test]
fn a_users_day_is_persisted_ahead_by_a_bounded_margin_then_exactly() {
    let mut a = admin();
    register_day_ping(&mut a);
    let mut c = connect();
    let tenant = unique("day-margin");
    let user = unique("day-user");
    let tok = token(&user, &tenant, &[]);
    let ahead = day_pings(&mut c, &mut a, &tok, &tenant, 5, Duration::ZERO);
    assert!(
        ahead > 0,
        "every read found the exact bytes: no margin was used"
    );
    exact_day(&mut a, &tenant);
    // And the day goes on counting from there.
    let v = call(&mut c, &tok, "day.ping", true);
    assert_eq!(code(&v), "ok", "{v}");
    exact_day(&mut a, &tenant);
}

/// A user who calls every few hundred milliseconds (a document reader, a model's tool loop) keeps
/// the day's bytes persisted ahead between the calls: one row write every so many calls. Issue
/// 34: the exact bytes used to follow 100 ms after a counter went ahead, so such a user paid an
/// ahead write and an exact write with every call, one more than with no margin at all. The exact
/// bytes follow once the user is quiet (about a second).
#[test]
fn a_user_calling_every_300_ms_keeps_the_day_ahead_until_quiet() {
    let mut a = admin();
    register_day_ping(&mut a);
    let mut c = connect();
    let tenant = unique("day-busy");
    let tok = token(&unique("busy-user"), &tenant, &[]);
    // (The first call is written as it is: a user new to the writer may call only once.)
    let ahead = day_pings(&mut c, &mut a, &tok, &tenant, 7, Duration::from_millis(300));
    // (A call slower than 700 ms on a loaded machine lets the day go quiet in between.)
    assert!(
        ahead >= 4,
        "300 ms after a call the day was exact {} times out of 7: written twice per call",
        7 - ahead
    );
    // Quiet now: the exact bytes follow.
    exact_day(&mut a, &tenant);
}

/// A large quota's window is persisted ahead of its calls by a bounded margin (a sixty-fourth of
/// the limit, at most 64: `ctxguard_core::ledger::margin`) instead of with every call's audit
/// row, and its exact count follows once the window has had no call for about a second. Whenever
/// it is read, what
/// is persisted is never below the calls made (a crash then refuses early, never late), and never
/// more than the margin above them.
#[test]
fn large_quotas_are_persisted_ahead_by_a_bounded_margin_then_exactly() {
    let mut a = admin();
    a.execute(
        "SELECT ctxguard.register_tool('quota.large', 'Ping, with a large quota.', '{\"type\": \"object\"}',
                't.quota_ping(jsonb)',
                '{\"page_types\": [\"quota_lab\"], \"run_as\": \"ctxguard_tools\", \"rate_limit\": {\"per\": \"user\", \"calls\": 6400, \"window\": \"1h\"}}')",
        &[],
    )
    .unwrap();
    let mut c = connect();
    let tenant = unique("margins");
    let user = unique("margin-user");
    let tok = token(&user, &tenant, &[]);
    let persisted = |a: &mut Client| -> i32 {
        a.query_opt(
            "SELECT calls FROM ctxguard.quota_usage WHERE tenant_id = $1 AND tool = 'quota.large'",
            &[&tenant],
        )
        .unwrap()
        .map_or(0, |r| r.get(0))
    };
    let mut ahead = 0;
    for made in 1..=5 {
        let v = call(&mut c, &tok, "quota.large", true);
        assert_eq!(code(&v), "ok", "{v}");
        let p = persisted(&mut a);
        assert!(
            p >= made && p <= made + 64,
            "after {made} calls, {p} persisted (bounds {made}..={})",
            made + 64
        );
        ahead += i32::from(p > made);
    }
    // Read right after each call, before its exact count is due: written ahead, not per call.
    assert!(
        ahead > 0,
        "every read found the exact count: no margin was used"
    );
    // The exact count follows.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let p = persisted(&mut a);
        if p == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "still {p} persisted for 5 calls");
        thread::sleep(Duration::from_millis(50));
    }
    // And the window goes on counting from there.
    let v = call(&mut c, &tok, "quota.large", true);
    assert_eq!(code(&v), "ok", "{v}");
    let p = persisted(&mut a);
    assert!((6..=70).contains(&p), "after 6 calls, {p} persisted");
}

/// Records reach the writer out of order: a call is counted before its handler runs and its
/// record is queued after. A slow first call's record (count 1) arriving after later calls' were
/// written, and their window's exact count with them, must not lower the persisted count below
/// the window's audited calls (the exact count comes from the ledger's live count, which covers
/// every counted call).
#[test]
fn a_late_record_never_lowers_a_large_quotas_persisted_count() {
    let mut a = admin();
    a.batch_execute(&format!(
        "CREATE OR REPLACE FUNCTION t.quota_maybe_slow(args jsonb) RETURNS jsonb LANGUAGE sql AS $$
             SELECT jsonb_build_object('waited', CASE WHEN (args->>'slow')::boolean
                                                      THEN pg_advisory_xact_lock_shared({QUOTA_LARGE_SLOW_LOCK}) IS NULL END)
         $$;
         GRANT EXECUTE ON FUNCTION t.quota_maybe_slow(jsonb) TO ctxguard_tools;"
    ))
    .unwrap();
    a.batch_execute(
        "SELECT ctxguard.register_tool('quota.large_slow', 'Ping, maybe slowly, with a large quota.',
             '{\"type\": \"object\", \"properties\": {\"slow\": {\"type\": \"boolean\"}}}', 't.quota_maybe_slow(jsonb)',
             '{\"page_types\": [\"quota_lab\"], \"run_as\": \"ctxguard_tools\", \"rate_limit\": {\"per\": \"user\", \"calls\": 6400, \"window\": \"1h\"}}');",
    )
    .unwrap();
    let tenant = unique("late");
    let user = unique("late-user");
    let tok = token(&user, &tenant, &[]);
    let slow_call = move |c: &mut Client, slow: bool| -> Value {
        let mut tx = c.transaction().unwrap();
        tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, &lab()])
            .unwrap();
        let args = json!({"slow": slow}).to_string();
        let v: Value = tx
            .query_one(
                "SELECT ctxguard.call_tool('quota.large_slow', $1::text::jsonb)",
                &[&args],
            )
            .unwrap()
            .get(0);
        tx.commit().unwrap();
        v
    };
    let (mut lock, _, t) = call_held_at_lock(QUOTA_LARGE_SLOW_LOCK, {
        let slow_call = slow_call.clone();
        move |c| slow_call(c, true)
    });
    // Counted first, the slow call's record is still to come: three more calls, written, and their
    // window's exact count after them.
    let mut c = connect();
    for _ in 0..3 {
        let v = slow_call(&mut c, false);
        assert_eq!(code(&v), "ok", "{v}");
    }
    // (The window's exact count is written once it has had no call for about a second.)
    thread::sleep(Duration::from_millis(1600));
    lock.execute("SELECT pg_advisory_unlock($1)", &[&QUOTA_LARGE_SLOW_LOCK])
        .unwrap();
    let late = t.join().unwrap();
    assert_eq!(code(&late), "ok", "{late}");
    // The late record's batch, then its exact count.
    thread::sleep(Duration::from_millis(1600));
    let (persisted, audited): (i32, i64) = {
        let p: i32 = a
            .query_one(
                "SELECT calls FROM ctxguard.quota_usage WHERE tenant_id = $1 AND tool = 'quota.large_slow'",
                &[&tenant],
            )
            .unwrap()
            .get(0);
        let n: i64 = a
            .query_one(
                "SELECT count(*) FROM ctxguard.audit_log WHERE tenant_id = $1 AND tool = 'quota.large_slow'",
                &[&tenant],
            )
            .unwrap()
            .get(0);
        (p, n)
    };
    assert_eq!(audited, 4, "four calls audited");
    assert_eq!(
        i64::from(persisted),
        audited,
        "the window's persisted count after the late record"
    );
}
