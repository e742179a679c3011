//! The background writer: one per database, started on demand by the first call that needs it
//! (a dynamic background worker, restarted by the postmaster if it fails), exiting after
//! `ctxguard.audit_writer_idle` seconds without work so that it holds no worker slot forever.
//!
//! Each batch (every record queued since the last one, up to [`MAX_BATCH`]) is written in one
//! transaction — group commit: one WAL flush for many calls — and then published as durable.
//! The writer is the only process that inserts audit rows, so it alone extends each tenant's
//! hash chain: `row_hash = sha256(prev_hash, canonical row text)` (`ctxguard_core::ledger`).
//! `ctxguard.verify_audit(tenant)` recomputes the chain and reports the first broken link.
//!
//! Ledger changes travel as absolute values (`GREATEST` on write), so replays and reordering
//! never lower a persisted counter.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ctxguard_core::ledger::{
    byte_margin, jsonb_text, link, ChainCheck, DayKey, Key, Margins, QuotaKey, Retry, Seen,
};
use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::{json, Value};

use super::{shmem, Unavailable};
use crate::gucs;
use crate::owner::as_owner;
use crate::pgutil::{in_subtransaction, raise, update_saved, with_text};

/// Most records in one batch.
pub const MAX_BATCH: usize = 256;

/// Ask the postmaster for a writer for database `db`.
pub fn start(db: u32) -> Result<(), Unavailable> {
    BackgroundWorkerBuilder::new(&format!("ctxguard ledger writer {db}"))
        .set_type("ctxguard ledger writer")
        .set_library("ctxguard")
        .set_function("ctxguard_ledger_writer_main")
        .set_argument(Some(pg_sys::Datum::from(db as usize)))
        .enable_spi_access()
        .set_restart_time(Some(Duration::from_secs(1)))
        .load_dynamic()
        .map(|_| ())
        .map_err(|_| {
            Unavailable(
                "no background worker slot for the audit writer (raise max_worker_processes)"
                    .into(),
            )
        })
}

/// The canonical text of an audit row `r` that its hash covers (time as integer microseconds,
/// so that no session setting changes it).
const CANON: &str = "pg_catalog.jsonb_build_array(r.call_id, r.tenant_id, r.user_id, r.page_type,
    r.entity_type, r.entity_id, r.tool, r.decision, r.code, r.args_hash, r.result_bytes, r.generation,
    r.trace_id, r.doc_id, r.tokens, r.masked, r.budget,
    (EXTRACT(epoch FROM r.at) * 1000000)::pg_catalog.int8)::pg_catalog.text";

/// The canonical text of queued audit row `a`: what [`CANON`] computes from the row once stored
/// (`verify_audit` does), computed here so that the batch's one statement can insert the hashes.
fn canon(a: &Value) -> String {
    // As `jsonb_to_recordset` stores each column: text takes a scalar's text, uuid its canonical
    // form, and `at` is sent as microseconds since 2000-01-01 (canonical: since 1970). Written
    // item by item as `jsonb_text` writes the array of them.
    enum Col {
        Text,
        Uuid,
        Json,
    }
    use Col::{Json, Text, Uuid};
    const COLUMNS: [(&str, Col); 17] = [
        ("call_id", Uuid),
        ("tenant_id", Text),
        ("user_id", Text),
        ("page_type", Text),
        ("entity_type", Text),
        ("entity_id", Text),
        ("tool", Text),
        ("decision", Text),
        ("code", Text),
        ("args_hash", Text),
        ("result_bytes", Json),
        ("generation", Uuid),
        ("trace_id", Text),
        ("doc_id", Text),
        ("tokens", Json),
        ("masked", Json),
        ("budget", Json),
    ];
    let mut out = String::with_capacity(512);
    out.push('[');
    for (k, (key, col)) in COLUMNS.iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        match (col, &a[*key]) {
            (
                Text,
                v @ (Value::Array(_) | Value::Object(_) | Value::Bool(_) | Value::Number(_)),
            ) => {
                let mut t = String::new();
                jsonb_text(v, &mut t);
                jsonb_text(&Value::String(t), &mut out);
            }
            (Uuid, v @ Value::String(s)) => match uuid::Uuid::parse_str(s) {
                Ok(u) => jsonb_text(&Value::String(u.to_string()), &mut out),
                Err(_) => jsonb_text(v, &mut out),
            },
            (_, v) => jsonb_text(v, &mut out),
        }
    }
    let at = a["at_us"].as_i64().unwrap_or_default() + 946_684_800_000_000;
    out.push_str(", ");
    jsonb_text(&json!(at), &mut out);
    out.push(']');
    out
}

/// The columns of a queued audit row.
const AUDIT_COLUMNS: &str = "v(i pg_catalog.int4, call_id pg_catalog.uuid, tenant_id pg_catalog.text,
    user_id pg_catalog.text, page_type pg_catalog.text, entity_type pg_catalog.text, entity_id pg_catalog.text,
    tool pg_catalog.text, decision pg_catalog.text, code pg_catalog.text, args_hash pg_catalog.text,
    result_bytes pg_catalog.int4, generation pg_catalog.uuid, trace_id pg_catalog.text, doc_id pg_catalog.text,
    tokens pg_catalog.int4, masked pg_catalog.jsonb, budget pg_catalog.jsonb, at_us pg_catalog.int8,
    prev_hash pg_catalog.text, row_hash pg_catalog.text)";

const AT: &str = "'2000-01-01 00:00:00+00'::pg_catalog.timestamptz + v.at_us * '1 microsecond'::pg_catalog.interval";

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn ctxguard_ledger_writer_main(arg: pg_sys::Datum) {
    let db = arg.value() as u32;
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(pg_sys::Oid::from(db)), None);
    let installed = BackgroundWorker::transaction(|| {
        crate::owner::pinned(|| {
            Spi::get_one::<bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension
                                 WHERE extname OPERATOR(pg_catalog.=) 'ctxguard'::pg_catalog.name)",
            )
        })
        .ok()
        .flatten()
        .unwrap_or(false)
    });
    if !installed {
        return;
    }
    // Commits do not wait for their WAL flush: each caller waiting on a record flushes the WAL up
    // to its batch's commit (ctxguard.audit_wait), many callers in one flush.
    for (name, value) in [
        (c"synchronous_commit", c"off"),
        // Each statement's snapshot, and a foreign key's check, see the rows committed before it
        // (a generation found committed is one its document counter's check finds too).
        (c"default_transaction_isolation", c"read committed"),
    ] {
        crate::pgutil::set_session(name, value);
    }
    // Every statement of the writer touches a few rows by key (a batch is at most MAX_BATCH
    // records). The planner, told that jsonb_to_recordset returns 100 rows, would join them to
    // `generations` by scanning the whole table (tens of thousands of live generations) in every
    // batch, and a plan made while a table is still small is kept until the table is analyzed:
    // the writer joins through indexes, whatever the statistics say (on top of the planner's own
    // settings, with which ctxguard's planner hook makes every plan).
    crate::owner::planner_base(WRITER_PLANNER);
    crate::owner::pin_session();
    super::direct::watch_identity();
    let Some(i) = claim(db) else { return };
    unsafe { pg_sys::before_shmem_exit(Some(release), pg_sys::Datum::from(i)) };
    pgrx::log!("ctxguard: ledger writer started for database {db}");
    let mut chains: HashMap<Option<String>, String> = HashMap::new();
    let mut unsaved = Unsaved::default();
    let mut retry = Retry::new(Instant::now());
    let mut idle_since = Instant::now();
    let mut stats_due: Option<Instant> = None;
    let mut margins = Ahead::default();
    loop {
        if BackgroundWorker::sighup_received() {
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        let cv = shmem::work_cv(i);
        unsafe { pg_sys::ConditionVariablePrepareToSleep(cv) };
        let batch = take(i);
        if batch.is_empty() {
            if stats_due.is_some_and(|due| Instant::now() >= due) {
                report_stats(&mut stats_due, true);
            }
            let stopping = BackgroundWorker::sigterm_received();
            if margins.due(Instant::now(), stopping) {
                unsafe { pg_sys::ConditionVariableCancelSleep() };
                flush_margins(&mut margins, Instant::now(), stopping);
                if !stopping {
                    continue;
                }
            }
            if !unsaved.is_empty() && (stopping || retry.due(Instant::now())) {
                unsafe { pg_sys::ConditionVariableCancelSleep() };
                retry_in_transaction(&mut unsaved, &mut retry);
                if !stopping {
                    continue;
                }
            }
            let idle = Duration::from_secs(gucs::AUDIT_WRITER_IDLE.get().max(1) as u64);
            let waiting = !unsaved.is_empty() && !stopping;
            if !waiting && (stopping || idle_since.elapsed() >= idle) {
                unsafe { pg_sys::ConditionVariableCancelSleep() };
                // Leaving while idle: every counter ahead brought down first (as when stopping).
                flush_margins(&mut margins, Instant::now(), true);
                if retire(i) {
                    return;
                }
                continue;
            }
            // At most NOWAIT_DELAY_MS: records of callers that do not wait come without a wake-up.
            let ms = if waiting {
                let retry_in = retry.until_due(Instant::now()).as_millis();
                (retry_in.max(1) as i64).min(super::NOWAIT_DELAY_MS)
            } else {
                super::NOWAIT_DELAY_MS
            };
            unsafe {
                pg_sys::ConditionVariableTimedSleep(cv, ms, pg_sys::PG_WAIT_EXTENSION);
                pg_sys::ConditionVariableCancelSleep();
            }
            continue;
        }
        unsafe { pg_sys::ConditionVariableCancelSleep() };
        idle_since = Instant::now();
        let last = batch.last().map_or(0, |(s, _)| *s);
        let n = batch.len();
        let waiting = unsaved.len();
        let chains_ref = std::panic::AssertUnwindSafe((&mut chains, &mut unsaved, &margins));
        let (failed, direct, seen) =
            BackgroundWorker::transaction(std::panic::AssertUnwindSafe(move || {
                let refs = chains_ref;
                let (chains, unsaved, margins) = refs.0;
                write(&batch, chains, unsaved, margins)
            }));
        margins.committed(seen, Instant::now());
        if unsaved.len() > waiting {
            retry.waiting_again();
        }
        let lsn = unsafe { pg_sys::XactLastCommitEnd };
        publish(i, last, n, &failed, direct, lsn);
        report_stats(&mut stats_due, false);
        // After the batch's callers are woken: the exact counts of quota windows written ahead.
        flush_margins(&mut margins, Instant::now(), false);
        // Under constant load the queue is never empty: waiting counters are retried when due
        // all the same (after the batch's callers are woken).
        if !unsaved.is_empty() && retry.due(Instant::now()) {
            retry_in_transaction(&mut unsaved, &mut retry);
        }
    }
}

/// Write again, in a transaction of its own, the generation counters waiting for their
/// generation's row to commit; less often while nothing is saved (a generation that rolled back
/// waits until it expires).
fn retry_in_transaction(unsaved: &mut Unsaved, retry: &mut Retry) {
    let before = unsaved.len();
    let u = std::panic::AssertUnwindSafe(&mut *unsaved);
    BackgroundWorker::transaction(std::panic::AssertUnwindSafe(move || {
        let u = u;
        retry_unsaved(u.0)
    }));
    retry.tried(Instant::now(), unsaved.len() < before);
}

/// Report what the writer wrote to the statistics, as a backend does when it goes idle, so that
/// autovacuum analyzes and vacuums the ledger's tables (`audit_log` is written by no one else).
/// PostgreSQL flushes at most once a second; what it defers is forced at `due` (a backend's idle
/// statistics timeout).
fn report_stats(due: &mut Option<Instant>, force: bool) {
    let retry_ms = unsafe { pg_sys::pgstat_report_stat(force) };
    *due = (retry_ms > 0)
        .then(|| Instant::now() + Duration::from_millis(retry_ms.clamp(1, 1000) as u64));
}

/// Take queue slot `i` for this process, unless a live writer has it.
fn claim(db: u32) -> Option<usize> {
    let me = unsafe { pg_sys::MyProcPid };
    let i = {
        let mut qs = shmem::queues();
        let i = match qs.iter().position(|q| q.db == db) {
            Some(i) => i,
            None => {
                let i = qs.iter().position(|q| q.db == 0)?;
                qs[i].db = db;
                i
            }
        };
        let q = &mut qs[i];
        if q.writer_pid != 0 && q.writer_pid != me && unsafe { libc_kill(q.writer_pid) } {
            return None;
        }
        q.writer_pid = me;
        q.start_requested = 0;
        i
    };
    unsafe { pg_sys::ConditionVariableBroadcast(shmem::durable_cv(i)) };
    Some(i)
}

/// Is process `pid` alive?
unsafe fn libc_kill(pid: i32) -> bool {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    unsafe { kill(pid, 0) == 0 }
}

/// Give the slot up if nothing is queued; false if work arrived meanwhile.
fn retire(i: usize) -> bool {
    let mut qs = shmem::queues();
    let q = &mut qs[i];
    if q.next_seq != q.durable {
        return false;
    }
    q.writer_pid = 0;
    true
}

#[pg_guard]
unsafe extern "C-unwind" fn release(_code: i32, arg: pg_sys::Datum) {
    let i = arg.value();
    unsafe { pg_sys::LWLockReleaseAll() };
    {
        let mut qs = shmem::queues();
        if qs[i].writer_pid == unsafe { pg_sys::MyProcPid } {
            qs[i].writer_pid = 0;
        }
    }
    unsafe { pg_sys::ConditionVariableBroadcast(shmem::durable_cv(i)) };
}

/// Copy the records not yet durable (up to MAX_BATCH) out of queue `i`.
fn take(i: usize) -> Vec<(u64, String)> {
    let qs = shmem::queues();
    let q = &qs[i];
    let end = q.next_seq.min(q.durable + MAX_BATCH as u64);
    (q.durable + 1..=end)
        .map(|seq| {
            let r = &q.ring[(seq % shmem::QUEUE_LEN as u64) as usize];
            let text = String::from_utf8_lossy(&r.data[..r.len as usize]).into_owned();
            (seq, text)
        })
        .collect()
}

/// Write a batch in subtransactions: whole, or (if that fails) record by record, so that one
/// record the tables refuse fails its own call only. Record by record, audit rows go through the
/// statement (never `direct`), so a fault of the direct path costs a batch's speed, not its calls.
/// Returns the records not written, and how many rows were written without a statement.
fn write(
    batch: &[(u64, String)],
    chains: &mut HashMap<Option<String>, String>,
    unsaved: &mut Unsaved,
    margins: &Ahead,
) -> (Vec<u64>, Direct, AheadSeen) {
    if let Ok(a) = in_subtransaction(false, || apply(batch, chains, margins, true)) {
        chains.extend(a.heads);
        unsaved.merge(a.unsaved);
        return (Vec::new(), a.direct, a.seen);
    }
    let mut failed = Vec::new();
    let mut seen = AheadSeen::default();
    for rec in batch {
        match in_subtransaction(false, || {
            apply(std::slice::from_ref(rec), chains, margins, false)
        }) {
            Ok(a) => {
                chains.extend(a.heads);
                unsaved.merge(a.unsaved);
                seen.quotas.extend(a.seen.quotas);
                seen.days.extend(a.seen.days);
                seen.pages.extend(a.seen.pages);
            }
            Err(c) => {
                pgrx::warning!(
                    "ctxguard: ledger writer could not write record {} (SQLSTATE {}); its call fails",
                    rec.0,
                    c.sqlstate
                );
                failed.push(rec.0);
            }
        }
    }
    (failed, Direct::default(), seen)
}

/// The counters this writer persists ahead of their calls: quota windows ([`margin`]) and users'
/// days ([`byte_margin`]).
///
/// [`margin`]: ctxguard_core::ledger::margin
struct Ahead {
    quotas: Margins,
    days: Margins<DayKey>,
    /// The coverage rows this writer committed.
    pages: Covered,
}

impl Default for Ahead {
    fn default() -> Self {
        Ahead {
            quotas: Margins::default(),
            days: Margins::new(byte_margin),
            pages: Covered::default(),
        }
    }
}

/// A batch's counters as they stand once it commits, and the coverage rows it wrote.
#[derive(Default)]
struct AheadSeen {
    quotas: Seen,
    days: Seen<DayKey>,
    pages: Vec<Key>,
}

/// The coverage rows (`document_coverage`: a user's page of a document on a day) this writer
/// committed, by key, so that a page read again is not looked for again (issue 34: most of the
/// coverage rows of a document search, about a fifth of the writer's work per search, were pages
/// the reader had read before). Every record still carries all of its call's pages: a record made
/// durable makes its pages durable, whichever record wrote them first. A page skipped here was
/// committed by an earlier batch, whose commit is earlier in the WAL than this batch's, so once
/// this batch's records are durable that row is too. Forgotten all at once past [`COVERED_MAX`]
/// keys (and when the writer exits): a forgotten page is looked for again, as before.
#[derive(Default)]
struct Covered(HashSet<Key>);

/// Most coverage keys a writer remembers (16 bytes each).
const COVERED_MAX: usize = 1 << 16;

impl Covered {
    fn key(cov: &str, page: &Value) -> Key {
        Key::of(&[b"cov", cov.as_bytes(), page.to_string().as_bytes()])
    }

    fn has(&self, k: &Key) -> bool {
        self.0.contains(k)
    }

    fn committed(&mut self, keys: Vec<Key>) {
        if self.0.len() + keys.len() > COVERED_MAX {
            self.0.clear();
        }
        self.0.extend(keys);
    }
}

impl Ahead {
    fn due(&self, now: Instant, force: bool) -> bool {
        self.quotas.due(now, force) || self.days.due(now, force)
    }

    fn committed(&mut self, seen: AheadSeen, now: Instant) {
        self.quotas.committed(seen.quotas, now);
        self.days.committed(seen.days, now);
        self.pages.committed(seen.pages);
    }
}

/// Rows a batch wrote without a statement (`direct.rs`): audit rows, counter rows.
#[derive(Clone, Copy, Default)]
struct Direct {
    audits: usize,
    counters: usize,
}

fn publish(i: usize, last: u64, n: usize, failed: &[u64], direct: Direct, lsn: u64) {
    let mut woken = [0usize; shmem::WAITERS];
    let mut n_woken = 0;
    {
        let mut qs = shmem::queues();
        let q = &mut qs[i];
        q.durable_lsn = q.durable_lsn.max(lsn);
        // The batch's records are `last - n + 1 ..= last` (`take`).
        for seq in (last + 1).saturating_sub(n as u64).max(1)..=last {
            shmem::set_outcome(&mut q.outcomes, seq, !failed.contains(&seq));
        }
        q.durable = q.durable.max(last);
        q.durable_hint
            .store(q.durable, std::sync::atomic::Ordering::Release);
        q.batches += 1;
        q.records += n as u64;
        q.audit_direct += direct.audits as u64;
        q.counters_direct += direct.counters as u64;
        q.last_batch = n as u32;
        q.max_batch = q.max_batch.max(n as u32);
        // Only the callers whose record this made durable, each told its record's outcome in its
        // slot (kept until it reads it: it may look after the queue's outcomes have moved on).
        let durable = q.durable;
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        let stale_us = (i64::from(gucs::AUDIT_WAIT_TIMEOUT.get().max(1)) + 1) * 1_000_000;
        for w in q.waiters.iter_mut().filter(|w| w.latch != 0) {
            // SAFETY: a waiter's latch is its PGPROC's, in shared memory for the cluster's life;
            // its owner is written by other processes without this lock (read once, volatile).
            let owner = unsafe {
                std::ptr::read_volatile(&raw const (*(w.latch as *const pg_sys::Latch)).owner_pid)
            };
            let gone = owner != w.pid;
            if gone {
                // The caller's backend exited while it waited: nobody will read the slot.
                *w = shmem::Waiter::FREE;
            } else if w.outcome == 0 && w.seq <= durable {
                w.outcome = match shmem::outcome(&q.outcomes, w.seq) {
                    Some(true) => shmem::WRITTEN,
                    _ => shmem::NOT_WRITTEN,
                };
                w.done_at = now;
                woken[n_woken] = w.latch;
                n_woken += 1;
            } else if w.outcome != 0 && now - w.done_at > stale_us {
                *w = shmem::Waiter::FREE;
            }
        }
    }
    for &latch in &woken[..n_woken] {
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
    unsafe { pg_sys::ConditionVariableBroadcast(shmem::durable_cv(i)) };
}

/// A user's UTC day (days since 2000-01-01) and its bytes, by (tenant, user, day).
type Days = HashMap<(String, String, i64), i64>;
/// A quota's latest window (start in Unix seconds) and its calls, by quota.
type Quotas = HashMap<QuotaKey, (i64, i64)>;

/// Write the exact counts of the quota windows and users' days persisted ahead of their calls that
/// have had no call for [`MARGIN_QUIET`] (every one when the writer stops), in a transaction of
/// its own (not waited for on disk: the next batch's commit or the WAL writer makes it durable;
/// until then a crash leaves the larger count, which refuses early). Then forget the quiet
/// counters: the next call of each is written as counted again. A counter that keeps being
/// called stays ahead, by at most its margin, until it goes quiet. A failure is logged, and the
/// quiet counters are forgotten all the same (their rows stay ahead: [`settle`]). The writer also
/// brings every counter down before it leaves while idle.
///
/// [`MARGIN_QUIET`]: ctxguard_core::ledger::MARGIN_QUIET
///
/// The exact count is the counter's live count in the shared-memory ledger, not the largest count
/// this writer saw in a record: records arrive out of order (a call is counted before its handler
/// runs, its record queued after), and a writer that started after a counter's first calls has
/// not seen them. The ledger's count covers every counted call, so a row is only ever lowered to
/// a value no smaller than what the audited calls used. A counter without a live entry (expired)
/// is left as persisted.
fn flush_margins(margins: &mut Ahead, now: Instant, force: bool) {
    if !margins.due(now, force) {
        return;
    }
    let windows: Vec<Value> = margins
        .quotas
        .ahead(now, force)
        .iter()
        .filter_map(|((t, u, tool, w), m)| {
            let live = super::quota_live(t, u, tool, w, m.start)?;
            Some(json!({"t": t, "u": u, "tool": tool, "w": w, "s": m.start, "n": live}))
        })
        .collect();
    let days: Vec<Value> = margins
        .days
        .ahead(now, force)
        .iter()
        .filter_map(|((t, u, day), _)| {
            let live = super::day_live(t, u, *day)?;
            Some(json!({"t": t, "u": u, "day": day, "n": live}))
        })
        .collect();
    if windows.is_empty() && days.is_empty() {
        margins.quotas.flushed(now, force);
        margins.days.flushed(now, force);
        return;
    }
    // Each table in a subtransaction of its own: a table the writer cannot update (a DBA's trigger,
    // a lock) keeps its own rows ahead, not the other's.
    let (quotas, days) = BackgroundWorker::transaction(move || {
        crate::pgutil::set_local(c"synchronous_commit", "off");
        (
            exact_rows(
                "UPDATE ctxguard.quota_usage q SET calls = v.n
                   FROM pg_catalog.jsonb_to_recordset($1) AS v(t pg_catalog.text, u pg_catalog.text,
                        tool pg_catalog.text, w pg_catalog.text, s pg_catalog.int8, n pg_catalog.int4)
                  WHERE q.tenant_id OPERATOR(pg_catalog.=) v.t AND q.user_id OPERATOR(pg_catalog.=) v.u
                    AND q.tool OPERATOR(pg_catalog.=) v.tool AND q.win OPERATOR(pg_catalog.=) v.w
                    AND q.window_start OPERATOR(pg_catalog.=) pg_catalog.to_timestamp(v.s::pg_catalog.float8)
                    AND q.calls OPERATOR(pg_catalog.>) v.n",
                windows,
            ),
            exact_rows(
                "UPDATE ctxguard.user_day_usage u SET bytes = v.n
                   FROM pg_catalog.jsonb_to_recordset($1)
                        AS v(t pg_catalog.text, u pg_catalog.text, day pg_catalog.int4, n pg_catalog.int8)
                  WHERE u.tenant_id OPERATOR(pg_catalog.=) v.t AND u.user_id OPERATOR(pg_catalog.=) v.u
                    AND u.day OPERATOR(pg_catalog.=) ('2000-01-01'::pg_catalog.date OPERATOR(pg_catalog.+) v.day)
                    AND u.bytes OPERATOR(pg_catalog.>) v.n",
                days,
            ),
        )
    });
    settle(&mut margins.quotas, quotas, now, force, "quota counts");
    settle(&mut margins.days, days, now, force, "users' daily bytes");
}

/// Run `sql` (an UPDATE to exact counts) over `rows` in a subtransaction of its own; nothing to do
/// for no rows.
fn exact_rows(sql: &str, rows: Vec<Value>) -> Result<(), String> {
    if rows.is_empty() {
        return Ok(());
    }
    match in_subtransaction(false, || {
        as_owner(|| {
            Spi::connect_mut(|c| {
                update_saved(c, sql, None, &[JsonB(Value::Array(rows)).into()]).map(|_| ())
            })
        })
    }) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(c) => Err(format!("SQLSTATE {}", c.sqlstate)),
    }
}

/// After [`exact_rows`]: the quiet counters forgotten, written or not. One whose exact count could
/// not be written (logged: a DBA's trigger, a lock) keeps its row ahead, by at most its margin,
/// which refuses early, never late; it is not tried again, so that a table the writer cannot
/// lower neither fills the writer's memory with every counter ever seen nor the log with a
/// warning every sweep.
fn settle<K: std::hash::Hash + Eq + Clone>(
    margins: &mut Margins<K>,
    written: Result<(), String>,
    now: Instant,
    force: bool,
    what: &str,
) {
    if let Err(e) = written {
        pgrx::warning!("ctxguard: ledger writer could not write exact {what} ({e})");
    }
    margins.flushed(now, force);
}

/// Write `days` to `user_day_usage` without the statement; what is left for the statement (all
/// of it when the table is not as ctxguard creates it, or a value is out of its type's range).
fn direct_days(days: Days) -> Days {
    use super::direct::{upsert_counters, CounterColumn};
    let cols: [CounterColumn; 4] = [
        (c"tenant_id", pg_sys::TEXTOID),
        (c"user_id", pg_sys::TEXTOID),
        (c"day", pg_sys::DATEOID),
        (c"bytes", pg_sys::INT8OID),
    ];
    if days.is_empty() || days.keys().any(|(_, _, d)| !valid_day(*d)) {
        return days;
    }
    // `'2000-01-01'::date + day` is the date whose DateADT is `day`.
    let rows: Vec<Vec<pg_sys::Datum>> = days
        .iter()
        .map(|((t, u, d), b)| {
            vec![
                t.as_str().into_datum().expect("text"),
                u.as_str().into_datum().expect("text"),
                pg_sys::Datum::from(*d as i32),
                pg_sys::Datum::from(*b),
            ]
        })
        .collect();
    match upsert_counters(c"user_day_usage", &cols, 3, &rows) {
        Some(_) => Days::new(),
        None => days,
    }
}

/// Whether `day` (days since 2000-01-01) is a finite date PostgreSQL can store, as
/// `'2000-01-01'::date + day` in the statement accepts it (4713 BC to 5874897 AD).
fn valid_day(day: i64) -> bool {
    (-2_451_545..=2_145_031_948).contains(&day)
}

/// Write the pages read (`document_coverage`) without the statement, each key once; what is left
/// for the statement: every row when the table is not as ctxguard creates it or a value is not one
/// the direct path writes (the statement judges it). Also returned: the rows the direct path took
/// (inserted, or found already there).
fn direct_coverage(pages: Vec<Value>) -> (Vec<Value>, usize) {
    use super::direct::{insert_absent, CounterColumn};
    let cols: [CounterColumn; 5] = [
        (c"tenant_id", pg_sys::TEXTOID),
        (c"user_id", pg_sys::TEXTOID),
        (c"doc_id", pg_sys::TEXTOID),
        (c"day", pg_sys::DATEOID),
        (c"page_no", pg_sys::INT4OID),
    ];
    let key = |p: &Value| {
        let text = |k: &str| p[k].as_str().map(str::to_string);
        let int = |k: &str| p[k].as_i64().and_then(|v| i32::try_from(v).ok());
        let day = int("day").filter(|&d| valid_day(d.into()))?;
        Some((text("t")?, text("u")?, text("d")?, day, int("p")?))
    };
    let Some(keys) = pages
        .iter()
        .map(key)
        .collect::<Option<std::collections::BTreeSet<_>>>()
    else {
        return (pages, 0);
    };
    if keys.is_empty() {
        return (pages, 0);
    }
    // `'2000-01-01'::date + day` is the date whose DateADT is `day`.
    let rows: Vec<Vec<pg_sys::Datum>> = keys
        .iter()
        .map(|(t, u, d, day, p)| {
            vec![
                t.as_str().into_datum().expect("text"),
                u.as_str().into_datum().expect("text"),
                d.as_str().into_datum().expect("text"),
                pg_sys::Datum::from(*day),
                pg_sys::Datum::from(*p),
            ]
        })
        .collect();
    match insert_absent(c"document_coverage", &cols, &rows) {
        Some(_) => (Vec::new(), rows.len()),
        None => (pages, 0),
    }
}

/// Write `quotas` to `quota_usage` without the statement; what is left for the statement: the
/// windows new to the table (the statement deletes the quota's older ones), or all of them when
/// the table is not as ctxguard creates it or a value is out of its type's range.
fn direct_quotas(quotas: Quotas) -> Quotas {
    use super::direct::{upsert_counters, CounterColumn};
    /// Seconds from 1970-01-01 to 2000-01-01 (PostgreSQL's epoch for `timestamptz`).
    const PG_EPOCH_S: i64 = 946_684_800;
    let cols: [CounterColumn; 6] = [
        (c"tenant_id", pg_sys::TEXTOID),
        (c"user_id", pg_sys::TEXTOID),
        (c"tool", pg_sys::TEXTOID),
        (c"win", pg_sys::TEXTOID),
        (c"window_start", pg_sys::TIMESTAMPTZOID),
        (c"calls", pg_sys::INT4OID),
    ];
    // `to_timestamp(s)`: microseconds since 2000-01-01, exact for whole seconds in this range.
    let in_range =
        |(s, n): &(i64, i64)| (0..=4_102_444_800).contains(s) && i32::try_from(*n).is_ok();
    if quotas.is_empty() || !quotas.values().all(in_range) {
        return quotas;
    }
    let keys: Vec<_> = quotas.keys().cloned().collect();
    let rows: Vec<Vec<pg_sys::Datum>> = keys
        .iter()
        .map(|k| {
            let (start, n) = quotas[k];
            vec![
                k.0.as_str().into_datum().expect("text"),
                k.1.as_str().into_datum().expect("text"),
                k.2.as_str().into_datum().expect("text"),
                k.3.as_str().into_datum().expect("text"),
                pg_sys::Datum::from((start - PG_EPOCH_S) * 1_000_000),
                pg_sys::Datum::from(n as i32),
            ]
        })
        .collect();
    match upsert_counters(c"quota_usage", &cols, 5, &rows) {
        Some(new) => {
            let mut quotas = quotas;
            for (k, is_new) in keys.iter().zip(new) {
                if !is_new {
                    quotas.remove(k);
                }
            }
            quotas
        }
        None => quotas,
    }
}

fn s(v: &Value, i: usize) -> Value {
    v.get(i).cloned().unwrap_or(Value::Null)
}

/// Write one batch (inside the writer's transaction), its audit rows without a statement if
/// `direct` allows and the table is as ctxguard creates it; the new chain heads, the batch's
/// generation counters whose generation row is not visible yet, and how many audit rows were
/// written without a statement.
fn apply(
    batch: &[(u64, String)],
    chains: &HashMap<Option<String>, String>,
    margins: &Ahead,
    direct: bool,
) -> Applied {
    let mut audits = Vec::new();
    let mut gens: HashMap<String, (i64, i64, String)> = HashMap::new();
    let mut docs: HashMap<(String, String), (Value, i64, i64)> = HashMap::new();
    // A user's (tenant, user, day): the day, its latest bytes, the user's daily limit.
    let mut days: HashMap<DayKey, (i64, i64, i64)> = HashMap::new();
    // A quota's (tenant, user or "", tool, window): its latest window start, count there, limit.
    let mut quotas: HashMap<QuotaKey, (i64, i64, i64)> = HashMap::new();
    let mut pages = Vec::new();
    let mut page_keys = Vec::new();
    for (_, text) in batch {
        let Ok(mut rec) = serde_json::from_str::<Value>(text) else {
            pgrx::warning!("ctxguard: ledger writer skipped a malformed record");
            continue;
        };
        for ch in rec["l"].as_array().into_iter().flatten() {
            let exp = ch["exp"].as_i64().unwrap_or(0);
            if let Some(g) = ch["gen"].as_str() {
                let b = ch["bytes"].as_i64().unwrap_or(0);
                let t = ch["t"].as_str().unwrap_or_default().to_string();
                let e = gens.entry(g.to_string()).or_insert((b, exp, t));
                e.0 = e.0.max(b);
                e.1 = e.1.max(exp);
            } else if let Some(d) = ch["doc"].as_array() {
                let d = Value::Array(d.clone());
                let k = (
                    s(&d, 0).as_str().unwrap_or_default().to_string(),
                    s(&d, 2).as_str().unwrap_or_default().to_string(),
                );
                let n = ch["calls"].as_i64().unwrap_or(0);
                let e = docs.entry(k).or_insert((s(&d, 1), n, exp));
                e.1 = e.1.max(n);
                e.2 = e.2.max(exp);
            } else if let Some(d) = ch["day"].as_array() {
                let d = Value::Array(d.clone());
                let k = (
                    s(&d, 0).as_str().unwrap_or_default().to_string(),
                    s(&d, 1).as_str().unwrap_or_default().to_string(),
                    s(&d, 2).as_i64().unwrap_or(0),
                );
                let (b, limit) = (
                    ch["bytes"].as_i64().unwrap_or(0),
                    ch["lim"].as_i64().unwrap_or(0),
                );
                let day = k.2;
                let e = days.entry(k).or_insert((day, b, limit));
                e.1 = e.1.max(b);
                e.2 = e.2.max(limit);
            } else if let Some(q) = ch["quota"].as_array() {
                let q = Value::Array(q.clone());
                let text = |i| s(&q, i).as_str().unwrap_or_default().to_string();
                let k = (text(0), text(1), text(2), text(3));
                let (start, n, limit) = (
                    s(&q, 4).as_i64().unwrap_or(0),
                    ch["calls"].as_i64().unwrap_or(0),
                    ch["lim"].as_i64().unwrap_or(0),
                );
                let e = quotas.entry(k).or_insert((start, n, limit));
                if start > e.0 {
                    *e = (start, n, limit);
                } else if start == e.0 {
                    e.1 = e.1.max(n);
                }
            } else if let Some(c) = ch["cov"].as_array() {
                let cov = serde_json::to_string(c).unwrap_or_default();
                for p in ch["pages"].as_array().into_iter().flatten() {
                    // A row this writer committed already is not looked for again.
                    let k = Covered::key(&cov, p);
                    if margins.pages.has(&k) {
                        continue;
                    }
                    page_keys.push(k);
                    pages.push(json!({"t": c.first(), "u": c.get(1), "d": c.get(2), "day": c.get(3), "p": p}));
                }
            }
        }
        if let Some(a) = rec.get_mut("a").filter(|a| a.is_object()) {
            let mut a = a.take();
            a["i"] = json!(audits.len());
            audits.push(a);
        }
    }
    let mut unsaved = Unsaved {
        gens,
        docs,
        per_tenant: HashMap::new(),
    };
    let (quotas, seen_quotas) = margins.quotas.plan(quotas);
    let (days, seen_days) = margins.days.plan(days);
    let days: Days = days.into_iter().map(|(k, (_, b))| (k, b)).collect();
    let seen = AheadSeen {
        quotas: seen_quotas,
        days: seen_days,
        pages: page_keys,
    };
    let (n_days, n_quotas) = (days.len(), quotas.len());
    let result = as_owner(|| {
        Spi::connect_mut(|c| {
            // The counters every call moves (a user's day, a quota's window) without the
            // statement when `direct` allows and their tables are as ctxguard creates them; a
            // quota window seen for the first time still goes through the statement, which also
            // deletes the quota's older windows (once per window, so not on every call).
            let (days, quotas) = if direct {
                (direct_days(days), direct_quotas(quotas))
            } else {
                (days, quotas)
            };
            // The pages read, likewise.
            let (pages, n_pages) = if direct {
                direct_coverage(pages)
            } else {
                (pages, 0)
            };
            // The generation counters (a generation's bytes, its calls on a document) likewise.
            unsaved.drop_expired();
            let gens = if direct && !unsaved.is_empty() {
                direct_generations(&unsaved)
            } else {
                None
            };
            // Counter rows the direct path took (a quota window new to the table, written both
            // directly and by the statement, is not counted).
            let counters = n_days - days.len() + n_quotas - quotas.len()
                + gens.as_ref().map_or(0, |g| g.rows)
                + n_pages;
            let days = days
                .into_iter()
                .map(|((t, u, day), b)| json!({"t": t, "u": u, "day": day, "b": b}))
                .collect();
            let quotas = quotas
                .into_iter()
                .map(|((t, u, tool, w), (start, n))| json!({"t": t, "u": u, "tool": tool, "w": w, "s": start, "n": n}))
                .collect();
            // The statement takes what the direct path did not.
            let (gens_done, docs_done) = gens.as_ref().map_or((false, false), |g| (true, g.docs));
            let mut b = Batch {
                days,
                pages,
                quotas,
                gens: if gens_done {
                    Vec::new()
                } else {
                    unsaved.gens_rows()
                },
                docs: if docs_done {
                    Vec::new()
                } else {
                    unsaved.docs_rows()
                },
                ..Batch::default()
            };
            // Each row's hash, in the batch's order (which is also the order of the ids
            // `verify_audit` walks): from the chain heads this writer knows, or the tables.
            let mut heads: HashMap<Option<String>, String> = HashMap::new();
            for a in &mut audits {
                let tenant = a["tenant_id"].as_str().map(str::to_string);
                if !heads.contains_key(&tenant) {
                    let head = match chains.get(&tenant) {
                        Some(h) => h.clone(),
                        None => last_hash(c, tenant.as_deref())?,
                    };
                    heads.insert(tenant.clone(), head);
                }
                let (prev, hash) = link(&mut heads, &tenant, &canon(a)).expect("head loaded");
                a["prev_hash"] = json!(prev);
                a["row_hash"] = json!(hash);
            }
            let n_direct = if direct && !audits.is_empty() && super::direct::insert_audits(&audits)
            {
                audits.len()
            } else {
                b.audits = audits;
                0
            };
            let mut w = b.write(c)?;
            if let Some(g) = gens {
                w.missing_gens.extend(g.missing.missing_gens);
                if docs_done {
                    w.missing_docs.extend(g.missing.missing_docs);
                }
            }
            unsaved.keep_missing(&w);
            let d = Direct {
                audits: n_direct,
                counters,
            };
            Ok::<_, pgrx::spi::Error>((heads, unsaved, d))
        })
    });
    let (heads, unsaved, direct) = result.unwrap_or_else(|e| statement_failed(e));
    Applied {
        heads,
        unsaved,
        direct,
        seen,
    }
}

/// What [`apply`] wrote: the new chain heads, the generation counters not saved yet, the rows
/// written without a statement, and the quota windows' and users' days' state once the batch commits.
struct Applied {
    heads: HashMap<Option<String>, String>,
    unsaved: Unsaved,
    direct: Direct,
    seen: AheadSeen,
}

/// A statement of the writer failed: raise it (its subtransaction rolls back: see `write`).
fn statement_failed(e: pgrx::spi::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("ctxguard: ledger writer: {e}"),
    )
}

/// What one batch writes with a statement, each part as rows for `jsonb_to_recordset` (the audit
/// rows only when `direct` did not take them). All of it is one statement (data-modifying CTEs,
/// one snapshot), and parts with no rows are left out of it, so a batch costs one plan execution
/// whatever it carries (each combination of parts has its saved plan).
#[derive(Default)]
struct Batch {
    /// Audit rows with their hashes, each with its index `i` in the batch (the order of the
    /// chain and so of the ids).
    audits: Vec<Value>,
    /// A user's UTC day: bytes received (absolute; the larger value wins).
    days: Vec<Value>,
    /// Pages read, for the daily coverage.
    pages: Vec<Value>,
    /// Calls counted in a quota window (absolute; the larger value wins), one per quota: its
    /// latest window (older windows of the quota are deleted).
    quotas: Vec<Value>,
    /// A generation's bytes used (absolute).
    gens: Vec<Value>,
    /// A generation's calls on a document (absolute).
    docs: Vec<Value>,
}

/// What a batch's statement reports back.
#[derive(Default)]
struct Written {
    /// Generations whose row this transaction cannot see: their counters were not written.
    missing_gens: HashSet<String>,
    missing_docs: HashSet<String>,
}

impl Batch {
    fn write(self, c: &mut pgrx::spi::SpiClient<'_>) -> Result<Written, pgrx::spi::Error> {
        let mut args: Vec<pgrx::datum::DatumWithOid<'static>> = Vec::new();
        let mut param = |d: pgrx::datum::DatumWithOid<'static>| {
            args.push(d);
            format!("${}", args.len())
        };
        let rows = |v: Vec<Value>| JsonB(Value::Array(v)).into();
        let (mut ctes, mut out) = (Vec::new(), Vec::new());
        // The per-document counters first: their insert locks each generation's row (KEY SHARE,
        // against a concurrent DELETE), and a row the generation UPDATE below had already changed
        // in this statement would be skipped by that lock ("updated by the current command"). So
        // the UPDATE reads the insert's output, which makes the insert run to completion first.
        let docs_first = !self.docs.is_empty();
        if docs_first {
            let p = param(rows(self.docs));
            ctes.push(format!(
                "dv AS (SELECT * FROM pg_catalog.jsonb_to_recordset({p})
                          AS v(g pg_catalog.uuid, t pg_catalog.text, d pg_catalog.text, n pg_catalog.int4)),
                 di AS (INSERT INTO ctxguard.document_calls AS d (generation, tenant_id, doc_id, calls)
                        SELECT v.g, v.t, v.d, v.n FROM dv v
                         WHERE EXISTS (SELECT 1 FROM ctxguard.generations g WHERE g.id OPERATOR(pg_catalog.=) v.g FOR KEY SHARE)
                        ON CONFLICT (generation, doc_id) DO UPDATE SET calls = GREATEST(d.calls, EXCLUDED.calls)
                        RETURNING 1)"
            ));
            out.push(
                "SELECT DISTINCT 'd'::pg_catalog.text, v.g::pg_catalog.text FROM dv v
                  WHERE NOT EXISTS (SELECT 1 FROM ctxguard.generations g WHERE g.id OPERATOR(pg_catalog.=) v.g)",
            );
        }
        if !self.gens.is_empty() {
            let p = param(rows(self.gens));
            let after_docs = if docs_first {
                " AND (SELECT pg_catalog.count(*) FROM di) OPERATOR(pg_catalog.>=) 0"
            } else {
                ""
            };
            ctes.push(format!(
                "gv AS (SELECT * FROM pg_catalog.jsonb_to_recordset({p}) AS v(id pg_catalog.uuid, b pg_catalog.int8)),
                 gu AS (UPDATE ctxguard.generations g SET bytes_used = v.b FROM gv v
                         WHERE g.id OPERATOR(pg_catalog.=) v.id AND g.bytes_used OPERATOR(pg_catalog.<) v.b{after_docs})"
            ));
            out.push(
                "SELECT 'g'::pg_catalog.text, v.id::pg_catalog.text FROM gv v
                  WHERE NOT EXISTS (SELECT 1 FROM ctxguard.generations g WHERE g.id OPERATOR(pg_catalog.=) v.id)",
            );
        }
        if !self.days.is_empty() {
            let p = param(rows(self.days));
            ctes.push(format!(
                "ud AS (INSERT INTO ctxguard.user_day_usage AS u (tenant_id, user_id, day, bytes)
                        SELECT v.t, v.u, '2000-01-01'::pg_catalog.date OPERATOR(pg_catalog.+) v.day, v.b
                          FROM pg_catalog.jsonb_to_recordset({p}) AS v(t pg_catalog.text, u pg_catalog.text, day pg_catalog.int4, b pg_catalog.int8)
                        ON CONFLICT (tenant_id, user_id, day) DO UPDATE SET bytes = GREATEST(u.bytes, EXCLUDED.bytes))"
            ));
        }
        if !self.quotas.is_empty() {
            let p = param(rows(self.quotas));
            ctes.push(format!(
                "qv AS (SELECT v.t, v.u, v.tool, v.w, pg_catalog.to_timestamp(v.s::pg_catalog.float8) AS s, v.n
                          FROM pg_catalog.jsonb_to_recordset({p})
                            AS v(t pg_catalog.text, u pg_catalog.text, tool pg_catalog.text, w pg_catalog.text, s pg_catalog.int8, n pg_catalog.int4)),
                 qd AS (DELETE FROM ctxguard.quota_usage q USING qv v
                         WHERE q.tenant_id OPERATOR(pg_catalog.=) v.t AND q.user_id OPERATOR(pg_catalog.=) v.u
                           AND q.tool OPERATOR(pg_catalog.=) v.tool AND q.win OPERATOR(pg_catalog.=) v.w
                           AND q.window_start OPERATOR(pg_catalog.<) v.s),
                 qu AS (INSERT INTO ctxguard.quota_usage AS q (tenant_id, user_id, tool, win, window_start, calls)
                        SELECT v.t, v.u, v.tool, v.w, v.s, v.n FROM qv v
                        ON CONFLICT (tenant_id, user_id, tool, win, window_start) DO UPDATE SET calls = GREATEST(q.calls, EXCLUDED.calls))"
            ));
        }
        if !self.pages.is_empty() {
            let p = param(rows(self.pages));
            ctes.push(format!(
                "dc AS (INSERT INTO ctxguard.document_coverage (tenant_id, user_id, doc_id, day, page_no)
                        SELECT v.t, v.u, v.d, '2000-01-01'::pg_catalog.date OPERATOR(pg_catalog.+) v.day, v.p
                          FROM pg_catalog.jsonb_to_recordset({p}) AS v(t pg_catalog.text, u pg_catalog.text, d pg_catalog.text, day pg_catalog.int4, p pg_catalog.int4)
                        ON CONFLICT DO NOTHING)"
            ));
        }
        if !self.audits.is_empty() {
            let p = param(rows(self.audits));
            ctes.push(format!(
                "ai AS (INSERT INTO ctxguard.audit_log (at, call_id, tenant_id, user_id, page_type, entity_type,
                            entity_id, tool, decision, code, args_hash, result_bytes, generation, trace_id, doc_id,
                            tokens, masked, budget, prev_hash, row_hash)
                        SELECT {AT}, v.call_id, v.tenant_id, v.user_id, v.page_type, v.entity_type, v.entity_id,
                               v.tool, v.decision, v.code, v.args_hash, v.result_bytes, v.generation, v.trace_id,
                               v.doc_id, v.tokens, v.masked, v.budget, v.prev_hash, v.row_hash
                          FROM pg_catalog.jsonb_to_recordset({p}) AS {AUDIT_COLUMNS} ORDER BY v.i)"
            ));
        }
        let mut w = Written::default();
        if ctes.is_empty() {
            return Ok(w);
        }
        if out.is_empty() {
            out.push("SELECT NULL::pg_catalog.text, NULL::pg_catalog.text WHERE false");
        }
        let sql = format!(
            "WITH {}\n({})",
            ctes.join(",\n"),
            out.join(")\nUNION ALL\n(")
        );
        for r in update_saved(c, &sql, None, &args)? {
            let key = r.get::<String>(2)?;
            match r.get::<String>(1)?.as_deref() {
                Some("g") => w.missing_gens.extend(key),
                Some("d") => w.missing_docs.extend(key),
                _ => {}
            }
        }
        Ok(w)
    }
}

/// Generation counters whose generation row the writer cannot see yet: the generation was minted
/// in a transaction still open (its calls charged before it committed), or one that rolled back.
/// They are kept and written again (on the schedule of [`Retry`], whether or not batches keep
/// coming) until their row appears or their generation expires.
#[derive(Default, Clone)]
pub struct Unsaved {
    /// generation -> (bytes used, expiry in Unix seconds, tenant)
    gens: HashMap<String, (i64, i64, String)>,
    /// (generation, document) -> (tenant, calls, expiry)
    docs: HashMap<(String, String), (Value, i64, i64)>,
    /// How many of `gens` and `docs` are each tenant's (kept by [`Unsaved::merge`], counted again
    /// after the lists are cut): a batch's merge costs what it brings, not what waits.
    per_tenant: HashMap<String, usize>,
}

/// Most generation counters kept waiting (each was a charged call; beyond this, the newest wait
/// only in shared memory, which a restart forgets).
const UNSAVED_MAX: usize = 16_384;
/// Most of them one tenant's (a quarter, as its share of each shared-memory table): a tenant whose
/// generations never become visible (minted in transactions that roll back) fills its own share,
/// and every other tenant's counters are still kept.
const UNSAVED_TENANT_MAX: usize = UNSAVED_MAX / 4;

/// What [`direct_generations`] wrote without the statement.
struct DirectGenerations {
    /// The generations whose row is not visible: their counters were not written (they wait).
    missing: Written,
    /// The per-document counters were written too (else they are left to the statement).
    docs: bool,
    /// Counter rows written (a generation's bytes, raised or already as large; a document's calls).
    rows: usize,
}

/// Write the generation counters of `u` without the statement: each generation's row found by
/// its key and locked, its bytes raised when they grew (`Touch`), then the per-document calls of
/// the generations found upserted into `document_calls` (whose foreign key's check fires as the
/// statement's would). `None`: nothing written (a table not as ctxguard creates it, or a value the
/// statement must judge): the statement writes them all, as it always did.
fn direct_generations(u: &Unsaved) -> Option<DirectGenerations> {
    use super::direct::{touch_rows, upsert_counters, CounterColumn, Touch};
    // A generation's key as the ledger writes it (canonical text: one key per generation).
    let uuid = |g: &str| {
        uuid::Uuid::parse_str(g)
            .ok()
            .filter(|u| u.hyphenated().to_string() == g)
    };
    let mut touch: std::collections::BTreeMap<uuid::Uuid, (String, Option<i64>)> =
        std::collections::BTreeMap::new();
    for (g, (b, _, _)) in &u.gens {
        touch.insert(uuid(g)?, (g.clone(), Some(*b)));
    }
    for (g, _) in u.docs.keys() {
        touch.entry(uuid(g)?).or_insert((g.clone(), None));
    }
    let docs_ok = u
        .docs
        .values()
        .all(|(t, n, _)| t.is_string() && i32::try_from(*n).is_ok());
    if touch.is_empty() || !docs_ok {
        return None;
    }
    // In key order (as any other writer of these rows would wait for them: no deadlock between
    // two batches' locks).
    let rows: Vec<(pg_sys::Datum, Touch)> = touch
        .keys()
        .zip(touch.values())
        .map(|(k, (_, b))| {
            let key = pgrx::datum::Uuid::from_bytes(*k.as_bytes())
                .into_datum()
                .expect("uuid");
            (
                key,
                b.map_or(Touch::KeyShare, |b| Touch::Raise(pg_sys::Datum::from(b))),
            )
        })
        .collect();
    let found = touch_rows(
        c"generations",
        (c"id", pg_sys::UUIDOID),
        (c"bytes_used", pg_sys::INT8OID),
        &rows,
    )?;
    let mut missing = Written::default();
    for ((g, b), found) in touch.values().zip(found) {
        if !found {
            if b.is_some() {
                missing.missing_gens.insert(g.clone());
            }
            missing.missing_docs.insert(g.clone());
        }
    }
    let cols: [CounterColumn; 4] = [
        (c"generation", pg_sys::UUIDOID),
        (c"doc_id", pg_sys::TEXTOID),
        (c"tenant_id", pg_sys::TEXTOID),
        (c"calls", pg_sys::INT4OID),
    ];
    let docs: Vec<Vec<pg_sys::Datum>> = u
        .docs
        .iter()
        .filter(|((g, _), _)| !missing.missing_docs.contains(g))
        .map(|((g, d), (t, n, _))| {
            let g = uuid(g).expect("parsed above");
            vec![
                pgrx::datum::Uuid::from_bytes(*g.as_bytes())
                    .into_datum()
                    .expect("uuid"),
                d.as_str().into_datum().expect("text"),
                t.as_str().unwrap_or_default().into_datum().expect("text"),
                pg_sys::Datum::from(*n as i32),
            ]
        })
        .collect();
    let docs_done =
        docs.is_empty() || upsert_counters(c"document_calls", &cols, 2, &docs).is_some();
    let raised = touch
        .values()
        .filter(|(g, b)| b.is_some() && !missing.missing_gens.contains(g))
        .count();
    Some(DirectGenerations {
        rows: raised + if docs_done { docs.len() } else { 0 },
        missing,
        docs: docs_done,
    })
}

impl Unsaved {
    pub fn is_empty(&self) -> bool {
        self.gens.is_empty() && self.docs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.gens.len() + self.docs.len()
    }

    /// Take `other`'s counters too (the larger value wins, as on disk): a counter already kept is
    /// raised; a new one is kept while there is room, in all and in its tenant's share.
    pub fn merge(&mut self, other: Unsaved) {
        let per_tenant = &mut self.per_tenant;
        let mut total = self.gens.len() + self.docs.len();
        let mut dropped = 0usize;
        // Room for one more counter of `tenant`?
        let mut room = |tenant: &str| {
            let n = per_tenant.entry(tenant.to_string()).or_default();
            if total >= UNSAVED_MAX || *n >= UNSAVED_TENANT_MAX {
                dropped += 1;
                return false;
            }
            *n += 1;
            total += 1;
            true
        };
        for (g, (b, e, t)) in other.gens {
            if let Some(v) = self.gens.get_mut(&g) {
                v.0 = v.0.max(b);
                v.1 = v.1.max(e);
            } else if room(&t) {
                self.gens.insert(g, (b, e, t));
            }
        }
        for (k, (t, n, e)) in other.docs {
            if let Some(v) = self.docs.get_mut(&k) {
                v.1 = v.1.max(n);
                v.2 = v.2.max(e);
            } else if room(t.as_str().unwrap_or_default()) {
                self.docs.insert(k, (t, n, e));
            }
        }
        if dropped > 0 {
            pgrx::warning!(
                "ctxguard: ledger writer keeps {} generation counters waiting; {dropped} newer ones are not kept (no room in all, or in their tenant's share)",
                self.len()
            );
        }
    }

    /// Forget the counters of generations that have expired (with the ledger's grace).
    fn drop_expired(&mut self) {
        let t = super::now() - super::GRACE;
        self.gens.retain(|_, (_, e, _)| *e >= t);
        self.docs.retain(|_, (_, _, e)| *e >= t);
        self.recount();
    }

    /// Count each tenant's counters again (after the lists were cut).
    fn recount(&mut self) {
        self.per_tenant.clear();
        for (_, _, t) in self.gens.values() {
            *self.per_tenant.entry(t.clone()).or_default() += 1;
        }
        for (t, _, _) in self.docs.values() {
            *self
                .per_tenant
                .entry(t.as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }

    /// A [`Batch`] of the counters not yet expired (the others are forgotten).
    fn batch(&mut self) -> Batch {
        self.drop_expired();
        Batch {
            gens: self.gens_rows(),
            docs: self.docs_rows(),
            ..Batch::default()
        }
    }

    /// The generations' bytes as the statement's rows.
    fn gens_rows(&self) -> Vec<Value> {
        self.gens
            .iter()
            .map(|(g, (b, _, _))| json!({"id": g, "b": b}))
            .collect()
    }

    /// The per-document calls as the statement's rows.
    fn docs_rows(&self) -> Vec<Value> {
        self.docs
            .iter()
            .map(|((g, d), (t, n, _))| json!({"g": g, "t": t, "d": d, "n": n}))
            .collect()
    }

    /// Keep only the counters a batch could not write (their generation's row is not visible).
    fn keep_missing(&mut self, w: &Written) {
        self.gens.retain(|g, _| w.missing_gens.contains(g));
        self.docs.retain(|(g, _), _| w.missing_docs.contains(g));
        self.recount();
    }
}

/// Write again the counters still waiting for their generation row (in the writer's transaction).
fn retry_unsaved(unsaved: &mut Unsaved) {
    // Kept whole if the write fails (every tenant's counters would be lost with it).
    let mut u = unsaved.clone();
    let result = in_subtransaction(false, || {
        as_owner(|| Spi::connect_mut(|c| u.batch().write(c)))
            .map(|w| {
                u.keep_missing(&w);
                u
            })
            .unwrap_or_else(|e| statement_failed(e))
    });
    match result {
        Ok(u) => *unsaved = u,
        Err(c) => pgrx::warning!(
            "ctxguard: ledger writer could not write waiting generation counters (SQLSTATE {})",
            c.sqlstate
        ),
    }
}

/// The head of `tenant`'s audit chain: the `row_hash` of its last chained row ('' for none). Read
/// once per tenant in a writer's life, as the first record of a tenant new to it is written.
///
/// Only the end of the tenant's own range of `audit_log_tenant_id_idx` (tenant_id, id) is read,
/// whatever the statistics say. Ordered by `id` under `tenant_id = $1`, the query let the planner
/// walk the primary key backwards and filter on the tenant, which it did from a generic plan made
/// with statistics of a table holding few tenants: every row of the other tenants after the
/// tenant's last one was read (a new tenant: the whole table, about 15 ms at 50,000 rows), while
/// every tenant's calls waited for the one writer. So the tenant is bounded by a range that
/// selects the same rows (`>=` and `<=` agree with `=` under any collation), which, unlike `=`,
/// leaves `tenant_id` in the sort order: only that index delivers it (backwards) without a sort.
fn last_hash(
    c: &mut pgrx::spi::SpiClient<'_>,
    tenant: Option<&str>,
) -> Result<String, pgrx::spi::Error> {
    let sql = match tenant {
        Some(_) => "SELECT row_hash FROM ctxguard.audit_log
                     WHERE tenant_id OPERATOR(pg_catalog.>=) $1 AND tenant_id OPERATOR(pg_catalog.<=) $1
                       AND row_hash IS NOT NULL
                     ORDER BY tenant_id DESC, id DESC LIMIT 1",
        // Backwards, the index yields NULLs first: `DESC` is `DESC NULLS FIRST`.
        None => "SELECT row_hash FROM ctxguard.audit_log WHERE tenant_id IS NULL AND $1::pg_catalog.text IS NULL
                  AND row_hash IS NOT NULL ORDER BY tenant_id DESC, id DESC LIMIT 1",
    };
    // Its generic plan from the first lookup on (kept for the writer's life): the plan every
    // lookup runs, whatever the tenant, is the one tested (`34_audit_chain_head.sql`).
    let mut cursor = crate::pgutil::open_generic(c, sql, &[tenant.into()])?;
    let mut rows = cursor.fetch(1)?;
    Ok(match rows.next() {
        Some(r) => r.get::<String>(1)?.unwrap_or_default(),
        None => String::new(),
    })
}

/// The planner settings of the writer's statements, on top of the planner's own
/// (`owner::planner_base`): joins through indexes.
const WRITER_PLANNER: &[(&std::ffi::CStr, &std::ffi::CStr)] = &[
    (c"enable_seqscan", c"off"),
    (c"enable_hashjoin", c"off"),
    (c"enable_mergejoin", c"off"),
];

/// Rows of the chain read at a time by [`verify_audit`].
const VERIFY_BATCH: i64 = 1000;

/// Recompute a tenant's audit chain (rows the writer wrote, in id order): the first row whose
/// hash does not cover its content and its predecessor's hash. Superuser or the owner only.
///
/// The rows are read through a cursor, [`VERIFY_BATCH`] at a time, each piece freed once checked,
/// so memory does not grow with the tenant's rows (it read them all, then hashed them: a tenant of
/// millions of rows grew the backend by gigabytes). Only the tenant's rows are read, through the
/// `(tenant_id, id)` index: the tenant is bounded by a range, which leaves `tenant_id` in the
/// sort order (as in [`last_hash`]), so no plan walks the primary key over every tenant's rows.
#[pg_extern(volatile, parallel_unsafe)]
fn verify_audit(tenant: Option<&str>) -> JsonB {
    let _pin = crate::owner::pin();
    crate::handler::refuse_inside("verify_audit");
    let tenant_rows = match tenant {
        Some(_) => {
            "r.tenant_id OPERATOR(pg_catalog.>=) $1 AND r.tenant_id OPERATOR(pg_catalog.<=) $1"
        }
        None => "r.tenant_id IS NULL AND $1::pg_catalog.text IS NULL",
    };
    let sql = format!(
        "SELECT r.id, r.prev_hash, r.row_hash, {CANON} FROM ctxguard.audit_log r
          WHERE {tenant_rows} AND r.row_hash IS NOT NULL ORDER BY r.tenant_id, r.id"
    );
    let (check, broken_id) = as_owner(|| {
        Spi::connect(|c| {
            let mut check = ChainCheck::default();
            let mut broken_id = None;
            let mut cursor = c.try_open_cursor(sql.as_str(), &[tenant.into()])?;
            loop {
                let table = cursor.fetch(VERIFY_BATCH)?;
                // SAFETY: the table just fetched (freed below, once read; nothing of it is kept).
                let piece = unsafe { pg_sys::SPI_tuptable };
                if table.is_empty() {
                    break;
                }
                let mut table = table;
                while table.next().is_some() {
                    pgrx::check_for_interrupts!();
                    // Read in place (see `with_text`); text that is not UTF-8 (a database
                    // of another encoding) is refused, as reading it as a Rust string was.
                    let text = |i| -> Result<String, pgrx::spi::Error> {
                        Ok(match table.get_datum_by_ordinal(i)? {
                            // SAFETY: a `text` datum of the current row, read within the call.
                            Some(d) => unsafe { with_text(d, |t| t.map(str::to_owned)) }
                                .unwrap_or_else(|| {
                                    raise(
                                        PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
                                        "ctxguard: an audit row's text is not UTF-8",
                                    )
                                }),
                            None => String::new(),
                        })
                    };
                    let (prev, hash, canon) = (text(2)?, text(3)?, text(4)?);
                    if !check.push(&prev, &hash, &[Some(&canon)]) && broken_id.is_none() {
                        broken_id = table.get::<i64>(1)?;
                    }
                }
                // SAFETY: as above.
                unsafe { pg_sys::SPI_freetuptable(piece) };
            }
            Ok::<_, pgrx::spi::Error>((check, broken_id))
        })
    })
    .unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("ctxguard: {e}"),
        )
    });
    JsonB(json!({
        "tenant_id": tenant,
        "rows": check.rows(),
        "intact": check.first_broken().is_none(),
        "first_broken_id": broken_id,
    }))
}

/// This database's audit writer: pid (NULL if none), last durable record, batches, records,
/// last and largest batch size, audit rows written without a statement; and the slots and live
/// entries of each ledger table.
#[pg_extern(volatile, parallel_unsafe)]
fn ledger_stats() -> JsonB {
    let mut stats = match super::stats() {
        Some(w) => json!({
            "writer_pid": (w.pid != 0).then_some(w.pid),
            "durable": w.durable,
            "queued": w.queued,
            "waiter_slots": w.waiter_slots,
            "batches": w.batches,
            "records": w.records,
            "last_batch": w.last_batch,
            "max_batch": w.max_batch,
            "audit_rows_direct": w.audit_direct,
            "counter_rows_direct": w.counters_direct,
            "avg_batch": if w.batches > 0 { w.records as f64 / w.batches as f64 } else { 0.0 },
        }),
        None => json!({"writer_pid": null}),
    };
    if let Some(mut t) = super::tables() {
        if let Some(nearest) = t.as_object_mut().and_then(|o| o.remove("nearest_cap")) {
            stats["nearest_cap"] = nearest;
        }
        stats["tables"] = t;
    }
    // This backend's ledger changes awaiting a record: the running call's, and those of calls
    // that left none (bounded).
    let (call, leftover) = super::held();
    stats["this_backend"] = json!({"call_changes": call, "leftover_changes": leftover});
    JsonB(stats)
}

pgrx::extension_sql_file!(
    "../../sql/ledger.sql",
    name = "ledger",
    requires = ["documents", verify_audit, ledger_stats]
);
