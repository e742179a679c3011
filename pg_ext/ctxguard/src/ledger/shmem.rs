//! The ledger's shared memory: one segment, zero-filled by the postmaster, with two LWLocks.
//!
//! - [`Ledger`] (lock 0): generation byte budgets, per-(generation, document) call counts,
//!   per-(user, document, UTC day) coverage bitmaps, per-(user, UTC day) byte totals and call
//!   quota counters per (tenant, user or none, tool, window): five hash tables sized at server
//!   start by `ctxguard.ledger_generations`, `…_document_calls`, `…_coverage`, `…_user_days` and
//!   `…_quotas` (whole buckets of `ctxguard_core::ledger::BUCKET` slots).
//! - [`Queue`]s (lock 1): one per database with a writer: fixed-size records (audit rows with the
//!   ledger changes they carry), the last sequence number assigned and the last one made durable.
//!
//! Like pg_stat_statements, the segment is sized in `shmem_request_hook` and attached in
//! `shmem_startup_hook`; unlike `pg_shmem_init!`, the initial value is never built on the
//! postmaster's stack: all-zero is the empty state (`ctxguard_core::ledger` types are designed
//! for it), and only the condition variables are initialised.

use std::sync::atomic::{AtomicPtr, Ordering};

use ctxguard_core::ledger::{table_slots, Coverage, Held, Slot, Table, TABLES};
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::gucs;

/// Databases with a writer at once.
pub const DATABASES: usize = 8;
/// Records queued per database before calls fail closed.
pub const QUEUE_LEN: usize = 128;
/// Records whose outcome (written, or not) a database's queue remembers for the callers waiting on
/// them: the last this many made durable. A caller that looks later than that fails closed.
pub const OUTCOMES: usize = 4096;
/// Bytes of one record (a JSON object).
pub const RECORD_BYTES: usize = 4096 - 16;
/// Callers per database whose wait the writer ends by setting their latch (more wait by polling).
pub const WAITERS: usize = 64;

/// A caller waiting for record `seq` to be durable (`latch`; 0: slot free). Once it is, the writer
/// writes its outcome here (`outcome`: [`WRITTEN`] or [`NOT_WRITTEN`], at `done_at`) and sets the
/// latch; the caller reads it and frees the slot, however late it looks. Only that caller is
/// woken, not every caller of the database. A slot whose caller has not read it
/// `ctxguard.audit_wait_timeout` and a second after its outcome (past its own deadline), or whose
/// backend is gone (`pid` no longer owns the latch), is freed by the writer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Waiter {
    pub latch: usize,
    pub seq: u64,
    pub pid: i32,
    pub outcome: u32,
    pub done_at: i64,
}

/// [`Waiter::outcome`]: the record was written.
pub const WRITTEN: u32 = 1;
/// [`Waiter::outcome`]: the writer could not write the record (its call fails).
pub const NOT_WRITTEN: u32 = 2;

impl Waiter {
    pub const FREE: Waiter = Waiter {
        latch: 0,
        seq: 0,
        pid: 0,
        outcome: 0,
        done_at: 0,
    };

    /// Held by a caller still waiting for its record's outcome.
    pub fn asleep(&self) -> bool {
        self.latch != 0 && self.outcome == 0
    }
}

/// Slots of each ledger table, fixed at server start (`ctxguard.ledger_*`, rounded up to whole
/// buckets).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub generations: usize,
    pub doc_calls: usize,
    pub coverage: usize,
    pub user_days: usize,
    /// Call quota counters (issue 30).
    pub quotas: usize,
    /// The share table: one entry per tenant and per user holding entries in the five above.
    pub owners: usize,
}

impl Sizes {
    fn from_settings() -> Sizes {
        let n = |g: &pgrx::GucSetting<i32>| table_slots(g.get().max(1) as usize);
        Sizes {
            generations: n(&gucs::LEDGER_GENERATIONS),
            doc_calls: n(&gucs::LEDGER_DOCUMENT_CALLS),
            coverage: n(&gucs::LEDGER_COVERAGE),
            user_days: n(&gucs::LEDGER_USER_DAYS),
            quotas: n(&gucs::LEDGER_QUOTAS),
            owners: n(&gucs::LEDGER_OWNERS),
        }
    }

    /// Slots of table `which` (0..5: generations, document calls, coverage, user days, quotas).
    pub fn of(&self, which: usize) -> usize {
        [
            self.generations,
            self.doc_calls,
            self.coverage,
            self.user_days,
            self.quotas,
        ][which]
    }

    /// Byte offsets of the six tables after the header, and the segment's size.
    fn layout(&self) -> ([usize; OWNERS + 1], usize) {
        let align = |n: usize| n.div_ceil(64) * 64;
        let mut at = align(std::mem::size_of::<Header>());
        let mut offsets = [0; OWNERS + 1];
        for (k, bytes) in [
            self.generations * std::mem::size_of::<Slot<i64>>(),
            self.doc_calls * std::mem::size_of::<Slot<i32>>(),
            self.coverage * std::mem::size_of::<Slot<Coverage>>(),
            self.user_days * std::mem::size_of::<Slot<i64>>(),
            self.quotas * std::mem::size_of::<Slot<i32>>(),
            self.owners * std::mem::size_of::<Slot<Held>>(),
        ]
        .into_iter()
        .enumerate()
        {
            offsets[k] = at;
            at = align(at + bytes);
        }
        (offsets, at)
    }
}

/// The share table's place after the shared-out tables.
const OWNERS: usize = TABLES;

/// One of the five shared tables, with the type of its values.
pub struct Tab<V> {
    pub index: usize,
    pub setting: &'static str,
    pub what: &'static str,
    _v: std::marker::PhantomData<V>,
}

const fn tab<V>(index: usize, setting: &'static str, what: &'static str) -> Tab<V> {
    Tab {
        index,
        setting,
        what,
        _v: std::marker::PhantomData,
    }
}

pub const GENERATIONS: Tab<i64> = tab(0, "ledger_generations", "generations");
pub const DOC_CALLS: Tab<i32> = tab(1, "ledger_document_calls", "document call counts");
pub const COVERAGE: Tab<Coverage> = tab(2, "ledger_coverage", "document coverage");
pub const USER_DAYS: Tab<i64> = tab(3, "ledger_user_days", "daily byte totals");
pub const QUOTAS: Tab<i32> = tab(4, "ledger_quotas", "call quota counters");

/// The ledger's six tables (process-local pointers into the segment), used under lock 0.
pub struct Ledger {
    base: *mut u8,
    sizes: Sizes,
    offsets: [usize; OWNERS + 1],
}

impl Ledger {
    fn table<V: Copy>(&mut self, k: usize, n: usize) -> Table<'_, V> {
        unsafe {
            let p = self.base.add(self.offsets[k]).cast::<Slot<V>>();
            Table::new(std::slice::from_raw_parts_mut(p, n))
        }
    }

    /// Table `t` together with the share table (two disjoint regions) and when `t` was last swept.
    pub fn shared<V: Copy>(&mut self, t: &Tab<V>) -> (Table<'_, V>, Table<'_, Held>, &mut i64) {
        let which = t.index;
        assert!(which < TABLES);
        unsafe {
            let p = self.base.add(self.offsets[which]).cast::<Slot<V>>();
            let o = self.base.add(self.offsets[OWNERS]).cast::<Slot<Held>>();
            let h = self.base.cast::<Header>();
            (
                Table::new(std::slice::from_raw_parts_mut(p, self.sizes.of(which))),
                Table::new(std::slice::from_raw_parts_mut(o, self.sizes.owners)),
                &mut (*h).swept[which],
            )
        }
    }

    pub fn owners(&mut self) -> Table<'_, Held> {
        self.table(OWNERS, self.sizes.owners)
    }
    pub fn generations(&mut self) -> Table<'_, i64> {
        self.table(0, self.sizes.generations)
    }
    pub fn doc_calls(&mut self) -> Table<'_, i32> {
        self.table(1, self.sizes.doc_calls)
    }
    pub fn coverage(&mut self) -> Table<'_, Coverage> {
        self.table(2, self.sizes.coverage)
    }
    pub fn user_days(&mut self) -> Table<'_, i64> {
        self.table(3, self.sizes.user_days)
    }
    pub fn quotas(&mut self) -> Table<'_, i32> {
        self.table(4, self.sizes.quotas)
    }
}

#[repr(C)]
pub struct Record {
    pub seq: u64,
    pub len: u32,
    pub data: [u8; RECORD_BYTES],
}

#[repr(C)]
pub struct Queue {
    /// The database (0: slot free).
    pub db: u32,
    /// Times the slot was taken by a database: a caller's record belongs to the taking it was
    /// queued in (a slot that went to another database and back numbers its records from 1 again).
    pub taken: u64,
    /// The writer's pid (0: none).
    pub writer_pid: i32,
    /// When a backend last asked the postmaster for a writer (Unix seconds; 0: not asked).
    pub start_requested: i64,
    /// Last sequence number assigned.
    pub next_seq: u64,
    /// Last sequence number written and committed (asynchronously: see `durable_lsn`).
    pub durable: u64,
    /// End of the WAL of the commit of the batch that made `durable`: a record is durable once
    /// the WAL is flushed to here (its waiter flushes it; concurrent waiters share the flush).
    pub durable_lsn: u64,
    /// `durable` again, stored (release) after it under the lock, for callers that poll it
    /// without the lock ([`durable_hint`]).
    pub durable_hint: std::sync::atomic::AtomicU64,
    /// Statistics: batches committed, records written, the last batch's size, the largest batch.
    pub batches: u64,
    pub records: u64,
    pub last_batch: u32,
    pub max_batch: u32,
    /// Audit rows written without a statement (`direct.rs`).
    pub audit_direct: u64,
    /// Counter rows (a user's day, a quota window) written without a statement (`direct.rs`).
    pub counters_direct: u64,
    /// Each record's outcome once durable, by sequence number modulo [`OUTCOMES`]: the number
    /// shifted left by one, its lowest bit set when the writer could not write it (its call
    /// fails). An entry holding another number is no longer known.
    pub outcomes: [u64; OUTCOMES],
    /// The backend that queued the last record, and when (µs, PostgreSQL's clock): whether the
    /// next caller is alone ([`crate::ledger::submit`]).
    pub last_pid: i32,
    pub last_at: i64,
    /// Callers waiting for their record (each woken alone, by its latch).
    pub waiters: [Waiter; WAITERS],
    /// The writer sleeps on `work`; callers waiting for room in the queue or for a writer sleep
    /// on `durable_cv`.
    pub work: pg_sys::ConditionVariable,
    pub durable_cv: pg_sys::ConditionVariable,
    pub ring: [Record; QUEUE_LEN],
}

/// The start of the segment; the ledger's tables follow it ([`Sizes::layout`]).
#[repr(C)]
pub struct Header {
    pub sizes: Sizes,
    /// When each table was last swept of expired entries (Unix seconds; at most once a second).
    pub swept: [i64; TABLES],
    pub queues: [Queue; DATABASES],
}

static SHARED: AtomicPtr<Header> = AtomicPtr::new(std::ptr::null_mut());
static LOCKS: AtomicPtr<pg_sys::LWLockPadded> = AtomicPtr::new(std::ptr::null_mut());
const NAME: &std::ffi::CStr = c"ctxguard ledger";

static mut PREV_REQUEST: pg_sys::shmem_request_hook_type = None;
static mut PREV_STARTUP: pg_sys::shmem_startup_hook_type = None;

/// Install the hooks (from `_PG_init`, only while `shared_preload_libraries` is processed).
pub fn init() {
    unsafe {
        PREV_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request);
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(startup);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn request() {
    unsafe {
        if let Some(prev) = PREV_REQUEST {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(Sizes::from_settings().layout().1);
        pg_sys::RequestNamedLWLockTranche(NAME.as_ptr(), 2);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn startup() {
    unsafe {
        if let Some(prev) = PREV_STARTUP {
            prev();
        }
        // AddinShmemInitLock, as in pg_stat_statements.
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let sizes = Sizes::from_settings();
        let bytes = sizes.layout().1;
        let p = pg_sys::ShmemInitStruct(NAME.as_ptr(), bytes, &mut found).cast::<Header>();
        if !found {
            std::ptr::write_bytes(p.cast::<u8>(), 0, bytes);
            (*p).sizes = sizes;
            for q in (*p).queues.iter_mut() {
                pg_sys::ConditionVariableInit(&mut q.work);
                pg_sys::ConditionVariableInit(&mut q.durable_cv);
            }
        }
        SHARED.store(p, Ordering::Release);
        LOCKS.store(
            pg_sys::GetNamedLWLockTranche(NAME.as_ptr()),
            Ordering::Release,
        );
        pg_sys::LWLockRelease(init_lock);
    }
}

/// Is the segment there (ctxguard preloaded)?
pub fn attached() -> bool {
    !SHARED.load(Ordering::Acquire).is_null()
}

/// Exclusive access to part of the segment, released on drop (on an ERROR, by the abort).
pub struct Guard<T: 'static> {
    data: &'static mut T,
    lock: *mut pg_sys::LWLock,
}

impl<T> std::ops::Deref for Guard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.data
    }
}

impl<T> std::ops::DerefMut for Guard<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.data
    }
}

impl<T> Drop for Guard<T> {
    fn drop(&mut self) {
        // As pgrx's PgLwLock: elog(ERROR) resets InterruptHoldoffCount, and the abort releases
        // every LWLock anyway.
        unsafe {
            if pg_sys::InterruptHoldoffCount > 0 {
                pg_sys::LWLockRelease(self.lock);
            }
        }
    }
}

fn lock(n: usize) -> *mut pg_sys::LWLock {
    let locks = LOCKS.load(Ordering::Acquire);
    assert!(!locks.is_null(), "ctxguard ledger is not attached");
    unsafe { &raw mut (*locks.add(n)).lock }
}

fn shared() -> *mut Header {
    let p = SHARED.load(Ordering::Acquire);
    assert!(!p.is_null(), "ctxguard ledger is not attached");
    p
}

/// The ledger, exclusively locked.
pub fn ledger() -> LedgerGuard {
    let l = lock(0);
    unsafe {
        let h = shared();
        let sizes = (*h).sizes;
        pg_sys::LWLockAcquire(l, pg_sys::LWLockMode::LW_EXCLUSIVE);
        LedgerGuard {
            ledger: Ledger {
                base: h.cast::<u8>(),
                sizes,
                offsets: sizes.layout().0,
            },
            lock: l,
        }
    }
}

/// The slots of each table (what the server started with).
pub fn sizes() -> Option<Sizes> {
    attached().then(|| unsafe { (*shared()).sizes })
}

/// [`Ledger`] under lock 0, released on drop (on an ERROR, by the abort).
pub struct LedgerGuard {
    ledger: Ledger,
    lock: *mut pg_sys::LWLock,
}

impl std::ops::Deref for LedgerGuard {
    type Target = Ledger;
    fn deref(&self) -> &Ledger {
        &self.ledger
    }
}

impl std::ops::DerefMut for LedgerGuard {
    fn deref_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }
}

impl Drop for LedgerGuard {
    fn drop(&mut self) {
        unsafe {
            if pg_sys::InterruptHoldoffCount > 0 {
                pg_sys::LWLockRelease(self.lock);
            }
        }
    }
}

/// Whether this process holds the queues' lock (an error raised while a [`queues`] guard was alive
/// leaves it held until the transaction's abort releases it).
pub fn queues_locked() -> bool {
    unsafe { pg_sys::LWLockHeldByMe(lock(1)) }
}

/// Every database's queue, exclusively locked.
pub fn queues() -> Guard<[Queue; DATABASES]> {
    let l = lock(1);
    unsafe {
        pg_sys::LWLockAcquire(l, pg_sys::LWLockMode::LW_EXCLUSIVE);
        Guard {
            data: &mut (*shared()).queues,
            lock: l,
        }
    }
}

/// The condition variables of queue `slot` (they need no lock).
pub fn work_cv(slot: usize) -> *mut pg_sys::ConditionVariable {
    unsafe { &raw mut (*shared()).queues[slot].work }
}

/// Queue `slot`'s `durable` as last published, read without the lock (acquire).
pub fn durable_hint(slot: usize) -> u64 {
    unsafe {
        (*shared()).queues[slot]
            .durable_hint
            .load(Ordering::Acquire)
    }
}

/// What queue `q` knows of record `seq`, made durable: written (`Some(true)`), not written
/// (`Some(false)`), or no longer known (`None`: [`OUTCOMES`] records were made durable since).
pub fn outcome(outcomes: &[u64; OUTCOMES], seq: u64) -> Option<bool> {
    let o = outcomes[(seq % OUTCOMES as u64) as usize];
    (o >> 1 == seq).then_some(o & 1 == 0)
}

/// Remember record `seq`'s outcome (written or not) in `outcomes`, for [`outcome`].
pub fn set_outcome(outcomes: &mut [u64; OUTCOMES], seq: u64, written: bool) {
    outcomes[(seq % OUTCOMES as u64) as usize] = seq << 1 | u64::from(!written);
}

pub fn durable_cv(slot: usize) -> *mut pg_sys::ConditionVariable {
    unsafe { &raw mut (*shared()).queues[slot].durable_cv }
}
