//! Running a SQL tool handler: as its `run_as` role, in a subtransaction, at a tracked depth.
//!
//! - **run_as**: the handler runs as the role named in the tool's policy (or
//!   `ctxguard.default_run_as` when it was registered), switched in like a SECURITY DEFINER
//!   function of that role with `search_path = pg_catalog, pg_temp`, inside a security-restricted
//!   operation. The caller (the gateway's role) needs no privilege on the handler or its tables.
//! - **depth**: while a handler runs, every ctxguard function that changes the context, the
//!   generation, approvals, turns, documents or the catalog refuses ([`refuse_inside`]). A counter,
//!   not a flag: nothing a nested call does can clear it for the outer one.
//! - **nothing is freed under a running handler**: the looked-up `FmgrInfo`s live until the depth
//!   is back to zero; a catalog change while a handler runs only marks them stale.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use crate::compat;
use crate::owner;
use crate::pgutil::{in_subtransaction, raise};

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Looked-up handler functions, in a backend-lifetime memory context so that each function's
    /// own cache (`fn_extra`: a SQL function's plans, PL/pgSQL's compiled body) survives calls.
    static FINFOS: RefCell<Finfos> = RefCell::new(Finfos {
        cx: std::ptr::null_mut(),
        by_oid: HashMap::new(),
        stale: false,
    });
}

struct Finfos {
    cx: pg_sys::MemoryContext,
    by_oid: HashMap<pg_sys::Oid, *mut pg_sys::FmgrInfo>,
    /// The catalog changed while a handler ran: free everything once the depth is back to zero.
    stale: bool,
}

/// How many tool handlers are running in this backend (0 outside any).
pub fn depth() -> u32 {
    DEPTH.with(Cell::get)
}

/// Refuse `what` (a ctxguard function name) when called from inside a tool handler.
pub fn refuse_inside(what: &str) {
    if depth() > 0 {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("ctxguard: {what} cannot be called from a tool handler"),
        );
    }
}

/// SQL-callable form of [`refuse_inside`], for ctxguard's own SQL functions (`save_turn`, `protect_table`).
#[pg_extern(volatile, parallel_safe)]
fn _refuse_inside_handler(what: &str) {
    match what {
        "save_turn" | "protect_table" | "accept_mcp_tool" => refuse_inside(what),
        _ => refuse_inside("this function"),
    }
}

struct Depth;
impl Depth {
    fn enter() -> Depth {
        DEPTH.with(|d| d.set(d.get() + 1));
        Depth
    }
}
impl Drop for Depth {
    fn drop(&mut self) {
        let now = DEPTH.with(|d| {
            let n = d.get().saturating_sub(1);
            d.set(n);
            n
        });
        if now == 0 && FINFOS.with(|f| f.borrow().stale) {
            forget();
        }
    }
}

fn finfo(fn_oid: pg_sys::Oid) -> *mut pg_sys::FmgrInfo {
    FINFOS.with(|f| {
        let mut f = f.borrow_mut();
        if let Some(p) = f.by_oid.get(&fn_oid) {
            return *p;
        }
        unsafe {
            if f.cx.is_null() {
                f.cx = pg_sys::AllocSetContextCreateInternal(
                    pg_sys::TopMemoryContext,
                    c"ctxguard tool handlers".as_ptr(),
                    pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                    pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                    pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
                );
            }
            let p = pg_sys::MemoryContextAllocZero(f.cx, std::mem::size_of::<pg_sys::FmgrInfo>())
                as *mut pg_sys::FmgrInfo;
            pg_sys::fmgr_info_cxt(fn_oid, p, f.cx);
            f.by_oid.insert(fn_oid, p);
            p
        }
    })
}

fn forget() {
    FINFOS.with(|f| {
        let mut f = f.borrow_mut();
        f.by_oid.clear();
        f.stale = false;
        if !f.cx.is_null() {
            unsafe { pg_sys::MemoryContextDelete(f.cx) };
            f.cx = std::ptr::null_mut();
        }
    });
}

/// The catalog changed (a handler may have been replaced): forget the looked-up handlers, or, while
/// one runs, mark them to be forgotten when it returns.
pub fn catalog_changed() {
    if depth() > 0 {
        FINFOS.with(|f| f.borrow_mut().stale = true);
    } else {
        forget();
    }
}

fn role_exists(role: pg_sys::Oid) -> bool {
    unsafe { !pg_sys::GetUserNameFromId(role, true).is_null() }
}

/// Why a handler did not produce a result (logged with the SQLSTATE; the caller sees TOOL_ERROR).
pub enum Failure {
    /// The tool has no usable run_as role (none, dropped, or now privileged).
    NoRunAs,
    ReturnedNull,
    Raised(String),
}

/// Run `handler(args)` as `run_as`, in a subtransaction (read-only if `read_only`).
pub fn run(
    handler: pg_sys::Oid,
    run_as: Option<pg_sys::Oid>,
    read_only: bool,
    args: Value,
) -> Result<Value, Failure> {
    let Some(role) = run_as.filter(|r| role_exists(*r) && !owner::role_is_privileged(*r)) else {
        return Err(Failure::NoRunAs);
    };
    let _depth = Depth::enter();
    let result = in_subtransaction(read_only, || {
        owner::as_role(role, || {
            if !compat::may_execute_function(role, handler) {
                raise(
                    PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                    "permission denied for tool handler",
                );
            }
            let datum = JsonB(args).into_datum().expect("jsonb datum");
            unsafe {
                let out = pg_sys::FunctionCall1Coll(finfo(handler), pg_sys::InvalidOid, datum);
                JsonB::from_datum(out, false)
            }
        })
    });
    match result {
        Ok(Some(JsonB(v))) => Ok(v),
        Ok(None) => Err(Failure::ReturnedNull),
        Err(caught) => Err(Failure::Raised(caught.sqlstate)),
    }
}
