//! The ledger: limits and audit records that no rollback of the caller can undo.
//!
//! A charge (generation bytes, per-document calls, daily coverage, a user's daily bytes, a call
//! in a quota window) is taken
//! in shared memory under an LWLock before a result leaves, and is never refunded: the caller's
//! ROLLBACK, savepoints, isolation level and settings do not reach shared memory. Days are UTC
//! days from the wall clock. An entry missing from shared memory (first use, or after a restart)
//! is loaded from the tables, so a restart forgets nothing the writer made durable.
//!
//! The audit record of every decision, with the ledger changes the call made, goes to a queue in
//! shared memory that a background writer per database (`writer.rs`) drains into the tables in
//! batches (group commit), chaining audit rows per tenant. With `ctxguard.audit_wait = on`, a
//! call returns only once its record is durable. No writer, a full queue or a full ledger: the
//! call fails closed (`AUDIT_UNAVAILABLE`) before any handler runs.

mod direct;
pub mod shmem;
pub mod writer;

use std::cell::RefCell;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ctxguard_core::ledger::{
    day_end, insert_shared, pg_date, sweep_shared, tenants_held, utc_day, Coverage, Held, Key,
    Owner, Refused, Share, Table,
};
use pgrx::pg_sys;
use serde_json::{json, Value};

use crate::gucs;
use shmem::{Tab, QUEUE_LEN, RECORD_BYTES};

/// Why the ledger cannot take a call (logged; the caller sees `AUDIT_UNAVAILABLE`).
#[derive(Debug)]
pub struct Unavailable(pub String);

/// Entries outlive their generation or day by this much (a call in flight at expiry). Every slot
/// is held for a generation's lifetime plus this: an hour here halved what the tables carry at an
/// hour's `generation_ttl`. An entry forgotten after it is reloaded from its persisted row.
const GRACE: i64 = 300;
/// How long a call waits for a writer to start.
const WRITER_START: Duration = Duration::from_secs(5);

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Today, as PostgreSQL's `date` (days since 2000-01-01), in UTC.
pub fn today() -> i32 {
    pg_date(utc_day(now()))
}

fn db() -> u32 {
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

fn key(kind: &str, parts: &[&str]) -> Key {
    let d = db().to_le_bytes();
    let mut all: Vec<&[u8]> = vec![kind.as_bytes(), &d];
    all.extend(parts.iter().map(|p| p.as_bytes()));
    Key::of(&all)
}

/// How a charge of the running call is given back if the call leaves no audit record.
#[derive(Clone, Copy)]
enum Undo {
    /// Bytes charged to a user's day and (if any) a generation.
    Bytes {
        day: Key,
        gen: Option<Key>,
        bytes: i64,
    },
    /// One call counted on a (generation, document).
    DocCall { key: Key },
    /// One call counted in a quota window (issue 30).
    Quota { key: Key },
}

/// A ledger change of the running call: what its audit record tells the writer (one entry per
/// ledger row it touches), and how to give it back. Coverage has no undo: a page marked read may
/// already have let another call of the same user read it uncounted, so it stands (charged last,
/// see `documents.rs`).
struct Change {
    records: Vec<Value>,
    undo: Option<Undo>,
}

/// Most changes a backend keeps for the end of its transaction (coverage of calls that left no
/// record); beyond it the oldest are dropped from persistence (shared memory keeps them until a
/// restart). Never more than this waits, so no caller's record ever carries another's.
const LEFTOVER_MAX: usize = 64;

thread_local! {
    /// The running call's ledger changes: they travel with its audit record, or are given back.
    static CALL: RefCell<Vec<Change>> = const { RefCell::new(Vec::new()) };
    /// Changes of calls that left no record and cannot be given back (coverage), queued on their
    /// own at the end of the transaction; bounded by `LEFTOVER_MAX`.
    static LEFTOVER: RefCell<Vec<Value>> = const { RefCell::new(Vec::new()) };
}

fn note(records: Vec<Value>, undo: Option<Undo>) {
    CALL.with(|c| c.borrow_mut().push(Change { records, undo }));
}

/// A call begins: whatever an earlier call of this backend left unsettled is settled first, so
/// that this call's record carries only its own changes.
pub fn begin_call() {
    settle();
}

/// The running call ends without an audit record (refused, failed, or its record could not be
/// queued): its charges are given back; what cannot be (coverage) waits for the end of the
/// transaction, bounded.
pub fn settle() {
    settle_but(false);
}

/// A call that returns no result (refused after its quota step, failed, authorized or pending)
/// gives back its byte and document-call charges before its record is queued, but its quota
/// counts stay with it: they ride on its record and are given back only if it leaves none.
pub fn settle_unreturned() {
    settle_but(true);
}

fn settle_but(keep_quotas: bool) {
    let changes = CALL.with(|c| {
        let mut c = c.borrow_mut();
        let all = std::mem::take(&mut *c);
        if !keep_quotas {
            return all;
        }
        let (kept, rest): (Vec<Change>, Vec<Change>) = all
            .into_iter()
            .partition(|ch| matches!(ch.undo, Some(Undo::Quota { .. })));
        *c = kept;
        rest
    });
    if changes.is_empty() {
        return;
    }
    let undos: Vec<Undo> = changes.iter().filter_map(|c| c.undo).collect();
    if !undos.is_empty() && shmem::attached() {
        let t = now();
        let mut l = shmem::ledger();
        for u in undos {
            match u {
                Undo::Bytes { day, gen, bytes } => {
                    if let Some(v) = l.user_days().get(&day, t) {
                        *v = (*v - bytes).max(0);
                    }
                    if let Some(g) = gen {
                        if let Some(v) = l.generations().get(&g, t) {
                            *v = (*v - bytes).max(0);
                        }
                    }
                }
                Undo::DocCall { key } => {
                    if let Some(v) = l.doc_calls().get(&key, t) {
                        *v = (*v - 1).max(0);
                    }
                }
                Undo::Quota { key } => {
                    if let Some(v) = l.quotas().get(&key, t) {
                        *v = (*v - 1).max(0);
                    }
                }
            }
        }
    }
    LEFTOVER.with(|left| {
        let mut left = left.borrow_mut();
        left.extend(
            changes
                .into_iter()
                .filter(|c| c.undo.is_none())
                .flat_map(|c| c.records),
        );
        let over = left.len().saturating_sub(LEFTOVER_MAX);
        if over > 0 {
            left.drain(..over);
        }
    });
}

/// At the end of every transaction (preloaded backends): settle a call an error cut short, and
/// queue the leftover changes on their own, one record each, so that they neither wait for this
/// backend's next call nor ride on it. Never waits and never fails — it runs where an error is not
/// allowed; what finds no room now stays for the next transaction's end (bounded).
pub fn register_flush_at_transaction_end() {
    unsafe { pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut()) };
}

unsafe extern "C-unwind" fn at_transaction_end(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT || event == pg_sys::XactEvent::XACT_EVENT_ABORT
    {
        settle();
        flush_leftover();
    }
}

fn flush_leftover() {
    if !shmem::attached() {
        return;
    }
    let left = LEFTOVER.with(|l| std::mem::take(&mut *l.borrow_mut()));
    let mut rest = Vec::new();
    for change in left {
        let text = json!({"l": [change]}).to_string();
        if !rest.is_empty() || text.len() > RECORD_BYTES || enqueue_existing(&text).is_none() {
            rest.push(change);
        }
    }
    LEFTOVER.with(|l| {
        let mut l = l.borrow_mut();
        rest.append(&mut l);
        *l = rest;
    });
}

/// How many ledger changes this backend holds: the running call's, and leftovers (tests).
pub fn held() -> (usize, usize) {
    (
        CALL.with(|c| c.borrow().len()),
        LEFTOVER.with(|l| l.borrow().len()),
    )
}

/// Put `text` on this database's queue if it has one and room for it; the queue, or `None`.
fn enqueue_existing(text: &str) -> Option<usize> {
    let d = db();
    let i = {
        let mut qs = shmem::queues();
        let i = qs.iter().position(|q| q.db == d)?;
        let q = &mut qs[i];
        if q.next_seq - q.durable >= QUEUE_LEN as u64 {
            return None;
        }
        let seq = q.next_seq + 1;
        let r = &mut q.ring[(seq % QUEUE_LEN as u64) as usize];
        r.seq = seq;
        r.len = text.len() as u32;
        r.data[..text.len()].copy_from_slice(text.as_bytes());
        q.next_seq = seq;
        i
    };
    unsafe { pg_sys::ConditionVariableSignal(shmem::work_cv(i)) };
    Some(i)
}

/// Why a charge could not be taken.
pub enum NoRoom {
    /// The ledger cannot be used now (not preloaded): `AUDIT_UNAVAILABLE`.
    Unavailable(Unavailable),
    /// The tenant or user holds its share of a table, or the table is full: `CAPACITY_EXCEEDED`
    /// (the message names the setting; it says nothing of other tenants).
    Capacity(String),
}

impl From<Unavailable> for NoRoom {
    fn from(e: Unavailable) -> NoRoom {
        NoRoom::Unavailable(e)
    }
}

/// Whose entry a charge makes: the tenant (named in `ledger_stats`) and the user. Their owner
/// hashes are computed only when a new entry is made (a live entry's call never pays for them).
pub struct Who<'a> {
    pub tenant: &'a str,
    pub user: &'a str,
}

impl<'a> Who<'a> {
    pub fn new(tenant: &'a str, user: &'a str) -> Who<'a> {
        Who { tenant, user }
    }
}

fn capacity<V>(t: &Tab<V>, why: Refused) -> NoRoom {
    let (whose, setting) = match why {
        Refused::Tenant => ("this tenant holds its share of", "ledger_tenant_share"),
        Refused::User => ("this user holds their share of", "ledger_user_share"),
        Refused::Owners => ("this tenant holds its share of", "ledger_owners"),
        Refused::Full => ("no room is left in", t.setting),
    };
    pgrx::log!(
        "ctxguard: CAPACITY_EXCEEDED table={} limit=ctxguard.{setting}",
        t.setting
    );
    NoRoom::Capacity(format!(
        "{whose} the shared ledger's {} (ctxguard.{setting}); retry once entries expire",
        t.what
    ))
}

/// The caps of table `t` now (the shares are reloadable settings).
fn share<V>(t: &Tab<V>, slots: usize, owner_slots: usize) -> Share {
    let pct = |g: &pgrx::GucSetting<i32>| u32::try_from(g.get()).unwrap_or(1);
    Share::of(
        t.index,
        slots,
        owner_slots,
        pct(&gucs::LEDGER_TENANT_SHARE),
        pct(&gucs::LEDGER_USER_SHARE),
    )
}

/// Run `f` on the live entry of `key` in table `t`, loading it first (outside the lock) if it is
/// missing; a new entry counts against `who`'s shares.
fn with_entry<V: Copy, R>(
    t: &Tab<V>,
    who: &Who,
    key: &Key,
    expires: i64,
    load: impl FnOnce() -> V,
    f: impl FnOnce(&mut V) -> R,
) -> Result<R, NoRoom> {
    if !shmem::attached() {
        return Err(Unavailable("ctxguard is not in shared_preload_libraries".into()).into());
    }
    let now_s = now();
    {
        let mut l = shmem::ledger();
        let (mut tb, _, _) = l.shared(t);
        if let Some(v) = tb.get(key, now_s) {
            return Ok(f(v));
        }
    }
    let loaded = load();
    let owner = Owner::of(who.tenant, who.user);
    let mut l = shmem::ledger();
    let (mut tb, mut owners, swept) = l.shared(t);
    let s = share(t, tb.capacity(), owners.capacity());
    // Another backend may have loaded it meanwhile: a live entry is kept as it is.
    let insert = |tb: &mut Table<'_, V>, owners: &mut Table<'_, Held>| {
        insert_shared(
            tb, owners, s, owner, who.tenant, key, expires, loaded, now_s,
        )
        .map(|_| ())
    };
    let mut tried = insert(&mut tb, &mut owners);
    if tried.is_err() && *swept < now_s {
        // Expired entries still counted: give their shares back (at most once a second), retry.
        *swept = now_s;
        sweep_shared(&mut tb, &mut owners, t.index, now_s);
        tried = insert(&mut tb, &mut owners);
    }
    match tried {
        Ok(()) => Ok(f(tb.get(key, now_s).expect("inserted"))),
        Err(why) => {
            drop(l);
            Err(capacity(t, why))
        }
    }
}

/// Bytes used by generation `id` (expiring at `expires`), `loaded` from its row if missing.
pub fn generation_used(id: &str, who: &Who, expires: i64, loaded: i64) -> Result<i64, NoRoom> {
    let k = key("gen", &[id]);
    with_entry(
        &shmem::GENERATIONS,
        who,
        &k,
        expires + GRACE,
        || loaded,
        |v| {
            *v = (*v).max(loaded);
            *v
        },
    )
}

/// A byte charge refused: which limit, and the bytes it has left.
pub enum Over {
    Generation(i64),
    UserDay(i64),
}

/// What a generation or a user's day had used after a charge.
pub struct Charged {
    pub generation: Option<i64>,
    pub user_day: i64,
}

/// The generation a call charges: id, expiry (Unix seconds) and byte limit.
pub struct GenLimit<'a> {
    pub id: &'a str,
    pub expires: i64,
    pub limit: i64,
}

/// Charge `bytes` to the generation (if any) and to the user's UTC day, both or neither. Given
/// back if the call leaves no audit record ([`settle`]).
pub fn charge_bytes(
    generation: Option<&GenLimit>,
    tenant: &str,
    user: &str,
    day_limit: i64,
    bytes: i64,
    load_day: impl FnOnce(i32) -> i64,
) -> Result<Result<Charged, Over>, NoRoom> {
    let who = Who::new(tenant, user);
    let day = today();
    let dk = key("day", &[tenant, user, &day.to_string()]);
    let day_expires = day_end(day + 10_957) + GRACE;
    with_entry(
        &shmem::USER_DAYS,
        &who,
        &dk,
        day_expires,
        || load_day(day),
        |_| (),
    )?;
    let gk = generation.map(|g| key("gen", &[g.id]));
    if let (Some(g), Some(k)) = (generation, &gk) {
        with_entry(
            &shmem::GENERATIONS,
            &who,
            k,
            g.expires + GRACE,
            || 0,
            |_| (),
        )?;
    }
    let t = now();
    let lost = |tab: &str| {
        Unavailable(format!(
            "a ledger entry of {tab} was evicted during the call"
        ))
    };
    let mut l = shmem::ledger();
    let day_used = *l.user_days().get(&dk, t).ok_or_else(|| lost("user days"))?;
    let gen_used = match &gk {
        Some(k) => Some(
            *l.generations()
                .get(k, t)
                .ok_or_else(|| lost("generations"))?,
        ),
        None => None,
    };
    if let (Some(g), Some(used)) = (generation, gen_used) {
        if used + bytes > g.limit {
            return Ok(Err(Over::Generation((g.limit - used).max(0))));
        }
    }
    if day_used + bytes > day_limit {
        return Ok(Err(Over::UserDay((day_limit - day_used).max(0))));
    }
    let new_day = day_used + bytes;
    *l.user_days().get(&dk, t).expect("checked") = new_day;
    let new_gen = match &gk {
        Some(k) => {
            let mut g = l.generations();
            let v = g.get(k, t).expect("checked");
            *v += bytes;
            Some(*v)
        }
        None => None,
    };
    drop(l);
    let undo = Some(Undo::Bytes {
        day: dk,
        gen: gk,
        bytes,
    });
    // One change, one undo: the day's and the generation's bytes are given back together.
    // With the limit: the writer persists the day's bytes ahead of the calls by a margin of it.
    let mut records = vec![json!({"day": [tenant, user, day], "bytes": new_day, "lim": day_limit})];
    if let (Some(g), Some(b)) = (generation, new_gen) {
        // The tenant: the writer keeps a generation's counter waiting (its row not yet visible)
        // within the tenant's share.
        records.push(json!({"gen": g.id, "bytes": b, "exp": g.expires, "t": tenant}));
    }
    note(records, undo);
    Ok(Ok(Charged {
        generation: new_gen,
        user_day: new_day,
    }))
}

/// Count one call on `doc` in generation `gen`: the count, or `None` at the limit. Given back if
/// the call leaves no audit record ([`settle`]).
pub fn doc_call(
    gen: &GenLimit,
    who: &Who,
    doc: &str,
    limit: i32,
    load: impl FnOnce() -> i32,
) -> Result<Option<i32>, NoRoom> {
    let k = key("doc", &[gen.id, doc]);
    let taken = with_entry(&shmem::DOC_CALLS, who, &k, gen.expires + GRACE, load, |v| {
        if *v >= limit {
            None
        } else {
            *v += 1;
            Some(*v)
        }
    })?;
    if let Some(n) = taken {
        note(
            vec![json!({"doc": [gen.id, who.tenant, doc], "calls": n, "exp": gen.expires})],
            Some(Undo::DocCall { key: k }),
        );
    }
    Ok(taken)
}

/// Mark `pages` of `doc` read by the user today, unless that exceeds `allowed`:
/// `Ok(pages read today)` or `Err(pages read before)`. Never given back: charge it last.
///
/// Every page read travels with the call's record, read before or not: a result's record alone
/// makes its pages durable (the writer skips the rows it knows it committed: `writer.rs`).
pub fn coverage(
    tenant: &str,
    user: &str,
    doc: &str,
    pages: &[i32],
    allowed: i64,
    load: impl FnOnce(i32) -> Vec<i32>,
) -> Result<Result<i64, i64>, NoRoom> {
    let day = today();
    let k = key("cov", &[tenant, user, doc, &day.to_string()]);
    let taken = with_entry(
        &shmem::COVERAGE,
        &Who::new(tenant, user),
        &k,
        day_end(day + 10_957) + GRACE,
        || {
            let mut c = Coverage::default();
            c.add(&load(day));
            c
        },
        |c| c.take(pages, allowed),
    )?;
    if taken.is_ok() && !pages.is_empty() {
        note(
            vec![json!({"cov": [tenant, user, doc, day], "pages": pages})],
            None,
        );
    }
    Ok(taken)
}

/// One quota window a call counts against: the user it counts (`None`: the whole tenant), the
/// window's name and bounds (Unix seconds), and the calls it allows.
pub struct QuotaWindow<'a> {
    pub user: Option<&'a str>,
    pub window: &'a str,
    pub start: i64,
    pub end: i64,
    pub limit: i32,
}

/// How a call meets its quotas.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum QuotaUse {
    /// Read the counts, charge nothing (a dry run, or a call that may still become pending).
    Peek,
    /// Count the call in every window if each has room, else in none.
    Take,
    /// Count the call in every window, room or not (shadow mode).
    Force,
}

/// Quota windows' entries outlive their window by this much (a call that began in it).
const QUOTA_GRACE: i64 = 10;

/// A user's bytes of `day` (days since 2000-01-01) in the shared-memory ledger right now, if its
/// entry is live: every byte charged, so never less than the day's audited results use (bytes are
/// given back only by a call that leaves no audit record). `None`: no live entry.
pub fn day_live(tenant: &str, user: &str, day: i64) -> Option<i64> {
    if !shmem::attached() {
        return None;
    }
    let k = key("day", &[tenant, user, &day.to_string()]);
    let t = now();
    let mut l = shmem::ledger();
    let mut d = l.user_days();
    d.get(&k, t).map(|v| *v)
}

/// A quota window's count in the shared-memory ledger right now, if its entry is live: every call
/// counted there, so never fewer than the window's audited calls (a count is given back only by a
/// call that leaves no audit record). `None`: no live entry (the window expired or was never used
/// since the start).
pub fn quota_live(tenant: &str, user: &str, tool: &str, window: &str, start: i64) -> Option<i64> {
    if !shmem::attached() {
        return None;
    }
    let k = key("quota", &[tenant, user, tool, window, &start.to_string()]);
    let t = now();
    let mut l = shmem::ledger();
    let mut q = l.quotas();
    q.get(&k, t).map(|v| i64::from(*v))
}

/// The calls counted in each of `wins` (after this call, if it was counted), and which windows
/// had no room for it, for `tool` of `tenant`. Check and count happen under one lock: no more calls
/// than a window allows are counted however many race. A count is given back only if the call
/// leaves no audit record ([`settle`]). `load(i)`: window `i`'s persisted count (a missing entry).
pub fn quota(
    tenant: &str,
    tool: &str,
    wins: &[QuotaWindow],
    how: QuotaUse,
    load: impl Fn(usize) -> i32,
) -> Result<(Vec<i32>, Vec<bool>), NoRoom> {
    let keys: Vec<Key> = wins
        .iter()
        .map(|w| {
            key(
                "quota",
                &[
                    tenant,
                    w.user.unwrap_or(""),
                    tool,
                    w.window,
                    &w.start.to_string(),
                ],
            )
        })
        .collect();
    if how == QuotaUse::Peek {
        if !shmem::attached() {
            return Err(Unavailable("ctxguard is not in shared_preload_libraries".into()).into());
        }
        let t = now();
        let live: Vec<Option<i32>> = {
            let mut l = shmem::ledger();
            let mut q = l.quotas();
            keys.iter().map(|k| q.get(k, t).copied()).collect()
        };
        let used: Vec<i32> = live
            .into_iter()
            .enumerate()
            .map(|(i, v)| v.unwrap_or_else(|| load(i)))
            .collect();
        let over = wins.iter().zip(&used).map(|(w, n)| *n >= w.limit).collect();
        return Ok((used, over));
    }
    // A tenant-wide window's entry is the tenant's (its user share is that of no user).
    for (i, (w, k)) in wins.iter().zip(&keys).enumerate() {
        let who = Who::new(tenant, w.user.unwrap_or(""));
        with_entry(
            &shmem::QUOTAS,
            &who,
            k,
            w.end + QUOTA_GRACE,
            || load(i),
            |v| *v = (*v).max(0),
        )?;
    }
    let t = now();
    let (used, over) = {
        let mut l = shmem::ledger();
        let mut q = l.quotas();
        let mut used = Vec::with_capacity(keys.len());
        for k in &keys {
            used.push(*q.get(k, t).ok_or_else(|| {
                Unavailable("a ledger entry of call quotas was evicted during the call".into())
            })?);
        }
        let over: Vec<bool> = wins.iter().zip(&used).map(|(w, n)| *n >= w.limit).collect();
        if over.contains(&true) && how == QuotaUse::Take {
            return Ok((used, over));
        }
        for (k, n) in keys.iter().zip(used.iter_mut()) {
            let v = q.get(k, t).expect("checked");
            *v += 1;
            *n = *v;
        }
        (used, over)
    };
    for ((w, k), n) in wins.iter().zip(keys).zip(&used) {
        note(
            vec![
                json!({"quota": [tenant, w.user.unwrap_or(""), tool, w.window, w.start],
                        "calls": n, "lim": w.limit, "exp": w.end}),
            ],
            Some(Undo::Quota { key: k }),
        );
    }
    Ok((used, over))
}

/// Find (or take) this database's queue; `Err` if every slot serves another database.
fn slot(qs: &mut [shmem::Queue; shmem::DATABASES]) -> Option<usize> {
    let d = db();
    if let Some(i) = qs.iter().position(|q| q.db == d) {
        return Some(i);
    }
    let t = now();
    let i = qs.iter().position(|q| {
        q.db == 0 || (q.writer_pid == 0 && q.next_seq == q.durable && t - q.start_requested > 60)
    })?;
    // Nothing of the slot's last database stays: above all not its records the writer could not
    // write, whose numbers this database's records take again (its calls would be refused as
    // unwritten though their rows are there).
    let q = &mut qs[i];
    q.db = d;
    q.taken = q.taken.wrapping_add(1);
    q.writer_pid = 0;
    q.start_requested = 0;
    q.next_seq = 0;
    q.durable = 0;
    q.durable_hint
        .store(0, std::sync::atomic::Ordering::Release);
    q.durable_lsn = 0;
    q.batches = 0;
    q.records = 0;
    q.last_batch = 0;
    q.max_batch = 0;
    q.audit_direct = 0;
    q.counters_direct = 0;
    q.outcomes = [0; shmem::OUTCOMES];
    (q.last_pid, q.last_at) = (0, 0);
    q.waiters = [shmem::Waiter::FREE; shmem::WAITERS];
    Some(i)
}

/// How long a caller may wait for a writer to start, and for room in a full queue: taken once
/// per call, so that a caller who loses the race for the room it waited for (and waits again)
/// is still held back no longer than `ctxguard.audit_wait_timeout` in all (SECURITY_MATRIX M.76).
struct Deadlines {
    start: Instant,
    full: Instant,
}

impl Deadlines {
    fn from_now() -> Self {
        let now = Instant::now();
        Deadlines {
            start: now + WRITER_START,
            // A full queue holds callers back (up to ctxguard.audit_wait_timeout) rather than
            // refusing them.
            full: now + Duration::from_secs(gucs::AUDIT_WAIT_TIMEOUT.get().max(1) as u64),
        }
    }
}

/// Can a call be audited now? Starts this database's writer if it is not running, and waits a
/// little for it. Called before any handler runs.
pub fn ready() -> Result<usize, Unavailable> {
    ready_by(&Deadlines::from_now())
}

fn ready_by(deadlines: &Deadlines) -> Result<usize, Unavailable> {
    if !shmem::attached() {
        return Err(Unavailable(
            "ctxguard is not in shared_preload_libraries".into(),
        ));
    }
    let (deadline, full_deadline) = (deadlines.start, deadlines.full);
    loop {
        let (i, start) = {
            let mut qs = shmem::queues();
            let i = slot(&mut qs)
                .ok_or_else(|| Unavailable("every ledger queue serves another database".into()))?;
            let q = &mut qs[i];
            let full = q.next_seq - q.durable >= QUEUE_LEN as u64;
            if full && (q.writer_pid == 0 || Instant::now() >= full_deadline) {
                return Err(Unavailable("the audit queue is full".into()));
            }
            if full {
                drop(qs);
                sleep(shmem::durable_cv(i), 10);
                continue;
            }
            if q.writer_pid != 0 {
                return Ok(i);
            }
            let t = now();
            let start = t - q.start_requested >= WRITER_START.as_secs() as i64;
            if start {
                q.start_requested = t;
            }
            (i, start)
        };
        if start {
            writer::start(db()).inspect_err(|_| {
                let mut qs = shmem::queues();
                qs[i].start_requested = 0;
            })?;
        }
        if Instant::now() >= deadline {
            return Err(Unavailable("the audit writer did not start".into()));
        }
        sleep(shmem::durable_cv(i), 50);
    }
}

fn sleep(cv: *mut pg_sys::ConditionVariable, ms: i64) {
    unsafe {
        pg_sys::ConditionVariablePrepareToSleep(cv);
        pg_sys::ConditionVariableTimedSleep(cv, ms, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ConditionVariableCancelSleep();
    }
}

/// A record in a queue ([`submit`]), to [`wait`] for.
pub struct Queued {
    queue: usize,
    /// The queue's [`shmem::Queue::taken`] when the record was queued.
    taken: u64,
    seq: u64,
    /// The record queued before this one was this backend's own, or queued at least
    /// [`ALONE_AFTER_US`] before it.
    alone: bool,
}

/// A caller is alone when the record queued before its own was its own, or this long before.
const ALONE_AFTER_US: i64 = 2_000;

/// Queue the audit record `audit` (with this backend's pending ledger changes); its sequence
/// number and queue.
pub fn submit(mut audit: Value) -> Result<Queued, Unavailable> {
    let at = unsafe { pg_sys::GetCurrentTimestamp() };
    audit["at_us"] = json!(at);
    // Only the running call's own changes ride on its record: a handful, bounded by what one
    // call can charge. On failure they stay with the call, which settles them (gives them back).
    let changes: Vec<Value> = CALL.with(|c| {
        c.borrow()
            .iter()
            .flat_map(|c| c.records.iter().cloned())
            .collect()
    });
    let text = json!({"a": audit, "l": changes}).to_string();
    if text.len() > RECORD_BYTES {
        return Err(Unavailable(format!(
            "an audit record of {} bytes exceeds {RECORD_BYTES}",
            text.len()
        )));
    }
    // ready() waits while the queue is full; another caller may take the room it saw first. Its
    // writer may also have retired since (idle, with nothing queued): a record is queued only
    // while the queue has a writer, which then cannot retire before writing it (`retire` checks
    // under the same lock); otherwise ready() starts one.
    let deadlines = Deadlines::from_now();
    for _ in 0..1000 {
        let i = ready_by(&deadlines)?;
        let seq = {
            let mut qs = shmem::queues();
            let q = &mut qs[i];
            let open = q.db == db() && q.writer_pid != 0;
            (open && q.next_seq - q.durable < QUEUE_LEN as u64).then(|| {
                let seq = q.next_seq + 1;
                let r = &mut q.ring[(seq % QUEUE_LEN as u64) as usize];
                r.seq = seq;
                r.len = text.len() as u32;
                r.data[..text.len()].copy_from_slice(text.as_bytes());
                q.next_seq = seq;
                let (me, now) = unsafe { (pg_sys::MyProcPid, pg_sys::GetCurrentTimestamp()) };
                let alone = q.last_pid == me || now - q.last_at >= ALONE_AFTER_US;
                (q.last_pid, q.last_at) = (me, now);
                (seq, seq - q.durable, alone, q.taken)
            })
        };
        if let Some((seq, queued, alone, taken)) = seq {
            // A caller that waits wakes the writer at once. One that does not
            // (`ctxguard.audit_wait = off`) leaves its record to the writer's next round (at most
            // `NOWAIT_DELAY_MS` away) unless enough are queued: batches of many records instead
            // of a wake-up, a transaction and a commit per call.
            if gucs::AUDIT_WAIT.get() || queued >= NOWAIT_WAKE_RECORDS {
                unsafe { pg_sys::ConditionVariableSignal(shmem::work_cv(i)) };
            }
            // Queued: the changes are the record's now.
            CALL.with(|c| c.borrow_mut().clear());
            return Ok(Queued {
                queue: i,
                taken,
                seq,
                alone,
            });
        }
    }
    Err(Unavailable("the audit queue is full".into()))
}

/// Records queued by callers that do not wait (`ctxguard.audit_wait = off`) before one of them
/// wakes the writer.
pub const NOWAIT_WAKE_RECORDS: u64 = 32;
/// The writer's longest sleep while its queue is empty: how long a record queued by a caller that
/// does not wait may sit before the writer takes it.
pub const NOWAIT_DELAY_MS: i64 = 50;

/// How long a caller that is alone ([`Queued::alone`], its record the only one in flight, nobody
/// else asleep, a writer running) polls for its record before it sleeps.
///
/// A record alone in the queue is committed within the writer's transaction for it (0.1-0.2 ms
/// for one call's record). Sleeping adds two wake-ups: the writer's signal to the caller's latch,
/// then the scheduler's, an interrupt to another core (on a virtual machine, an exit to the host).
/// Polling first spares both; the writer does not signal a caller that is not registered asleep.
/// Measured on a 2-core VM, a document search at 1 client, alternated runs: 0.05-0.09 ms less at
/// the median, 0.07-0.15 ms at p95. Under load (the record before its own another backend's,
/// queued less than [`ALONE_AFTER_US`] before it; another record in flight; another caller
/// asleep) a caller sleeps at once: polling would take a core from the writer and the other
/// callers (at 4 clients it cost 5 % of the throughput without that rule).
const SPIN: Duration = Duration::from_micros(400);

/// What a waiter's look at its queue found.
enum Look {
    /// Its record is durable once the WAL is flushed to the position (written: `Some(true)`), or
    /// the writer could not write it (`Some(false)`), or its outcome is no longer known (`None`:
    /// [`shmem::OUTCOMES`] records were made durable since; the call fails).
    Durable(Option<bool>, u64),
    /// Poll for it first ([`SPIN`]).
    Poll,
    /// Sleep until woken (or the next look).
    Sleep,
}

/// Poll queue `i`'s published `durable` (without the lock) until it reaches `seq` or [`SPIN`] has
/// passed.
fn poll_durable(i: usize, seq: u64) {
    let until = Instant::now() + SPIN;
    while shmem::durable_hint(i) < seq && Instant::now() < until {
        for _ in 0..64 {
            std::hint::spin_loop();
        }
        pgrx::check_for_interrupts!();
    }
}

/// A call's waiter slot in queue `queue` (if it holds one), given back when the wait ends however
/// it ends: an error or a cancel unwinds through it. (A backend that exits mid-wait is seen gone
/// by the writer: the slot's latch has another owner.)
struct SlotHeld {
    queue: usize,
    latch: usize,
    seq: u64,
    slot: Option<usize>,
}

impl Drop for SlotHeld {
    fn drop(&mut self) {
        // Never while this process holds the lock already (an error inside a look would leave it
        // held as the wait unwinds): the slot is then freed by this backend's next wait, or by
        // the writer.
        if shmem::queues_locked() {
            return;
        }
        if let Some(k) = self.slot.take() {
            let mut qs = shmem::queues();
            let w = &mut qs[self.queue].waiters[k];
            if w.latch == self.latch && w.seq == self.seq {
                *w = shmem::Waiter::FREE;
            }
        }
    }
}

/// Wait until record `seq` of queue `i` is durable (`ctxguard.audit_wait`), interruptibly.
pub fn wait(queued: Queued) -> Result<(), Unavailable> {
    let Queued {
        queue: i,
        taken,
        seq,
        alone,
    } = queued;
    if !gucs::AUDIT_WAIT.get() {
        return Ok(());
    }
    let deadline =
        Instant::now() + Duration::from_secs(gucs::AUDIT_WAIT_TIMEOUT.get().max(1) as u64);
    let me = unsafe { pg_sys::MyLatch } as usize;
    // Only a latch in shared memory (this process's PGPROC's) is written in a waiter slot: the
    // writer sets it from its own address space. A process whose latch is still its local one
    // waits without a slot (it looks every millisecond).
    let shared_latch = unsafe {
        !pg_sys::MyProc.is_null() && pg_sys::MyLatch == &raw mut (*pg_sys::MyProc).procLatch
    };
    let mine = |w: &shmem::Waiter| w.latch == me && w.seq == seq;
    // The waiter slot this call holds, if it found one (else it polls).
    let mut held = SlotHeld {
        queue: i,
        latch: me,
        seq,
        slot: None,
    };
    // Whether this call may poll for its record before sleeping (once, at the first look).
    let mut spin = alone;
    let mut first_look = true;
    let done = loop {
        // Reset before looking: a wake-up after the look is not lost.
        unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
        let committed = {
            let mut qs = shmem::queues();
            let q = &mut qs[i];
            // The queue went to another database (only once all its records were durable and it
            // sat idle for a minute), maybe and back: whether this record was written cannot be
            // known (the numbers start again). Closed.
            if q.db != db() || q.taken != taken {
                break false;
            }
            // A slot of this backend's left by an earlier call (an error or cancel while it
            // waited) is freed first: a backend waits for one record at a time.
            if first_look {
                for w in q.waiters.iter_mut().filter(|w| w.latch == me) {
                    *w = shmem::Waiter::FREE;
                }
            }
            first_look = false;
            let told = held
                .slot
                .filter(|&k| mine(&q.waiters[k]) && q.waiters[k].outcome != 0)
                .map(|k| {
                    let written = q.waiters[k].outcome == shmem::WRITTEN;
                    q.waiters[k] = shmem::Waiter::FREE;
                    written
                });
            if let Some(written) = told {
                // The writer wrote this record's outcome in the call's slot.
                held.slot = None;
                Look::Durable(Some(written), q.durable_lsn)
            } else if q.durable >= seq {
                // Written, unless the writer could not write this record (without a slot, or
                // with one the writer freed: its outcome is the queue's).
                Look::Durable(shmem::outcome(&q.outcomes, seq), q.durable_lsn)
            } else if std::mem::take(&mut spin)
                && q.writer_pid != 0
                && q.next_seq - q.durable == 1
                && q.waiters.iter().all(|w| !w.asleep())
            {
                // The only record in flight, nobody else waiting, and a writer: its next batch is
                // this record alone. Poll for it a little, without the lock, before sleeping (see
                // `SPIN`).
                Look::Poll
            } else {
                if shared_latch && !held.slot.is_some_and(|k| mine(&q.waiters[k])) {
                    held.slot = q.waiters.iter().position(|w| w.latch == 0);
                    if let Some(k) = held.slot {
                        q.waiters[k] = shmem::Waiter {
                            latch: me,
                            seq,
                            pid: unsafe { pg_sys::MyProcPid },
                            ..shmem::Waiter::FREE
                        };
                    }
                }
                Look::Sleep
            }
        };
        if let Look::Poll = committed {
            poll_durable(i, seq);
            continue;
        }
        if let Look::Durable(written, lsn) = committed {
            let written = written.unwrap_or_else(|| {
                pgrx::log!("ctxguard: the outcome of audit record {seq} is no longer known; its call fails");
                false
            });
            // The writer commits without waiting for the WAL flush; the waiter flushes (group
            // flush with every other waiter), so the writer goes on with the next batch meanwhile.
            if written {
                unsafe { pg_sys::XLogFlush(lsn) };
            }
            break written;
        }
        if Instant::now() >= deadline {
            break false;
        }
        // Woken by the writer once the record is durable; at most 100 ms (or 1 ms without a
        // slot) between looks. Cancel and terminate interrupt the wait.
        let ms = if held.slot.is_some() { 100 } else { 1 };
        unsafe {
            pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
                ms,
                pg_sys::PG_WAIT_EXTENSION,
            )
        };
        pgrx::check_for_interrupts!();
    };
    // The slot is given back (`SlotHeld`), here or when an error or cancel unwinds the wait.
    drop(held);
    if done {
        Ok(())
    } else {
        Err(Unavailable(
            "the audit record could not be made durable (writer error, or ctxguard.audit_wait_timeout)"
                .into(),
        ))
    }
}

/// Slots, live entries and caps of each ledger table by setting name, and the tenants nearest
/// their cap (for `ctxguard.ledger_stats()`, a DBA's function).
pub fn tables() -> Option<Value> {
    let sizes = shmem::sizes()?;
    let t = now();
    let mut l = shmem::ledger();
    let live = [
        l.generations().live(t),
        l.doc_calls().live(t),
        l.coverage().live(t),
        l.user_days().live(t),
        l.quotas().live(t),
    ];
    let owners_live = l.owners().live(t);
    let held = tenants_held(&l.owners(), t);
    drop(l);
    let names = [
        shmem::GENERATIONS.setting,
        shmem::DOC_CALLS.setting,
        shmem::COVERAGE.setting,
        shmem::USER_DAYS.setting,
        shmem::QUOTAS.setting,
    ];
    let mut out = serde_json::Map::new();
    let mut fullest: Vec<(f64, Value)> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let s = Share::of(
            i,
            sizes.of(i),
            sizes.owners,
            u32::try_from(gucs::LEDGER_TENANT_SHARE.get()).unwrap_or(1),
            u32::try_from(gucs::LEDGER_USER_SHARE.get()).unwrap_or(1),
        );
        out.insert(
            (*name).to_string(),
            json!({"slots": sizes.of(i), "live": live[i], "tenant_cap": s.tenant, "user_cap": s.user}),
        );
        for (tenant, entries, _) in &held {
            let used = f64::from(entries[i]) / f64::from(s.tenant.max(1));
            fullest.push((
                used,
                json!({"tenant": tenant, "table": name, "entries": entries[i], "cap": s.tenant}),
            ));
        }
    }
    out.insert(
        "ledger_owners".into(),
        json!({"slots": sizes.owners, "live": owners_live}),
    );
    fullest.sort_by(|a, b| b.0.total_cmp(&a.0));
    out.insert(
        "nearest_cap".into(),
        Value::Array(fullest.into_iter().take(10).map(|(_, v)| v).collect()),
    );
    Some(Value::Object(out))
}

/// This database's writer, for `ctxguard.ledger_stats()`.
pub struct WriterStats {
    pub pid: i32,
    /// The last durable sequence number.
    pub durable: u64,
    /// Records queued and not durable yet.
    pub queued: u64,
    /// Waiter slots held (of [`shmem::WAITERS`]): callers asleep on their record, or told its
    /// outcome and not yet looking.
    pub waiter_slots: usize,
    pub batches: u64,
    pub records: u64,
    pub last_batch: u32,
    pub max_batch: u32,
    /// Audit rows and counter rows written without a statement.
    pub audit_direct: u64,
    pub counters_direct: u64,
}

pub fn stats() -> Option<WriterStats> {
    if !shmem::attached() {
        return None;
    }
    let qs = shmem::queues();
    qs.iter().find(|q| q.db == db()).map(|q| WriterStats {
        pid: q.writer_pid,
        durable: q.durable,
        queued: q.next_seq - q.durable,
        waiter_slots: q.waiters.iter().filter(|w| w.latch != 0).count(),
        batches: q.batches,
        records: q.records,
        last_batch: q.last_batch,
        max_batch: q.max_batch,
        audit_direct: q.audit_direct,
        counters_direct: q.counters_direct,
    })
}
