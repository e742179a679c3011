//! The ledger's shared memory: one segment, zero-filled by the postmaster, with two LWLocks.
//!
//! - [`Ledger`] (lock 0): generation byte budgets, per-(generation, document) call counts,
//!   per-(user, document, UTC day) coverage bitmaps and per-(user, UTC day) byte totals.
//! - [`Queue`]s (lock 1): one per database with a writer: fixed-size records (audit rows with the
//!   ledger changes they carry), the last sequence number assigned and the last one made durable.
//!
//! Like pg_stat_statements, the segment is sized in `shmem_request_hook` and attached in
//! `shmem_startup_hook`; unlike `pg_shmem_init!`, the initial value is never built on the
//! postmaster's stack: all-zero is the empty state (`ctxguard_core::ledger` types are designed
//! for it), and only the condition variables are initialised.

use std::sync::atomic::{AtomicPtr, Ordering};

use ctxguard_core::ledger::{Coverage, Table};
use pgrx::pg_sys;
use pgrx::prelude::*;

/// Live generations tracked at once (their byte budgets).
pub const GENERATIONS: usize = 4096;
/// Live (generation, document) call counters.
pub const DOC_CALLS: usize = 4096;
/// Live (tenant, user, document, UTC day) coverage bitmaps.
pub const COVERAGE: usize = 1024;
/// Live (tenant, user, UTC day) byte totals.
pub const USER_DAYS: usize = 2048;
/// Databases with a writer at once.
pub const DATABASES: usize = 8;
/// Records queued per database before calls fail closed.
pub const QUEUE_LEN: usize = 128;
/// Failed records remembered per database (for the callers waiting on them).
pub const FAILED: usize = 64;
/// Bytes of one record (a JSON object).
pub const RECORD_BYTES: usize = 4096 - 16;

#[repr(C)]
pub struct Ledger {
    pub generations: Table<i64, GENERATIONS>,
    pub doc_calls: Table<i32, DOC_CALLS>,
    pub coverage: Table<Coverage, COVERAGE>,
    pub user_days: Table<i64, USER_DAYS>,
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
    /// Statistics: batches committed, records written, the last batch's size, the largest batch.
    pub batches: u64,
    pub records: u64,
    pub last_batch: u32,
    pub max_batch: u32,
    /// The last records the writer could not write (their calls fail), a ring.
    pub failed: [u64; FAILED],
    pub failed_next: u32,
    /// The writer sleeps on `work`; callers waiting for durability sleep on `durable_cv`.
    pub work: pg_sys::ConditionVariable,
    pub durable_cv: pg_sys::ConditionVariable,
    pub ring: [Record; QUEUE_LEN],
}

#[repr(C)]
pub struct Shared {
    pub ledger: Ledger,
    pub queues: [Queue; DATABASES],
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
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
        pg_sys::RequestAddinShmemSpace(std::mem::size_of::<Shared>());
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
        let p = pg_sys::ShmemInitStruct(NAME.as_ptr(), std::mem::size_of::<Shared>(), &mut found)
            .cast::<Shared>();
        if !found {
            std::ptr::write_bytes(p.cast::<u8>(), 0, std::mem::size_of::<Shared>());
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

fn shared() -> *mut Shared {
    let p = SHARED.load(Ordering::Acquire);
    assert!(!p.is_null(), "ctxguard ledger is not attached");
    p
}

/// The ledger, exclusively locked.
pub fn ledger() -> Guard<Ledger> {
    let l = lock(0);
    unsafe {
        pg_sys::LWLockAcquire(l, pg_sys::LWLockMode::LW_EXCLUSIVE);
        Guard {
            data: &mut (*shared()).ledger,
            lock: l,
        }
    }
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

pub fn durable_cv(slot: usize) -> *mut pg_sys::ConditionVariable {
    unsafe { &raw mut (*shared()).queues[slot].durable_cv }
}
