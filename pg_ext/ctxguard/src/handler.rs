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
                f.cx = crate::pgutil::memory_context(
                    pg_sys::TopMemoryContext,
                    c"ctxguard tool handlers",
                    crate::pgutil::ContextSizes::Default,
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

/// `pg_language.oid` of `sql` (a fixed, bootstrapped oid: `SQLlanguageId`).
const SQL_LANGUAGE: pg_sys::Oid = pg_sys::Oid::from_u32(14);

// How PostgreSQL itself parses a SQL function's body (executor/functions.h, not in pgrx's bindings;
// the same signatures on 15 to 18): `inline_function` and `fmgr_sql` use them.
// `prepare_sql_fn_parse_info` may raise an ERROR: called through `pg_guard_ffi_boundary`.
// `sql_fn_parser_setup` only sets the parse state's hooks; PostgreSQL calls it (a parser hook).
unsafe extern "C-unwind" {
    fn prepare_sql_fn_parse_info(
        procedure_tuple: pg_sys::HeapTuple,
        call_expr: *mut pg_sys::Node,
        input_collation: pg_sys::Oid,
    ) -> *mut std::ffi::c_void;
    fn sql_fn_parser_setup(pstate: *mut pg_sys::ParseState, pinfo: *mut std::ffi::c_void);
}

/// A SQL-language handler's body, parsed and planned once per backend (per version of its
/// `pg_proc` row), as PL/pgSQL keeps its statements' plans. Through `fmgr`, PostgreSQL 15 to 17
/// parse and plan a SQL function's body again in every transaction, which was most of a read-only
/// tool call's cost.
struct BodyPlan {
    /// `(xmin, ctid)` of the `pg_proc` row it was made from: `CREATE OR REPLACE` and `ALTER
    /// FUNCTION` write a new row version, and the plan is made again.
    version: (u32, u32, u16),
    /// The body and volatility it was made from, compared too: a row rewritten in place of another
    /// (`VACUUM FULL`) keeps its xmin and may take an old version's ctid.
    source: (String, std::ffi::c_char),
    /// `None`: the function is not one of these (it is called through `fmgr`).
    plan: Option<pg_sys::SPIPlanPtr>,
    /// STABLE or IMMUTABLE: run on the caller's snapshot, as `fmgr_sql` does.
    read_only: bool,
    /// Holds the parse info the plan's parser hook uses when the plan is made again.
    cx: pg_sys::MemoryContext,
    /// `BODY_TICK` at its last use.
    used: u64,
}

thread_local! {
    /// By handler and the role it runs as: parse analysis checks schema USAGE and inlines SQL
    /// functions (EXECUTE checked) as the role it runs as, and the plan cache redoes it for
    /// another role only when row security applies. At most [`MAX_BODY_PLANS`].
    static BODIES: RefCell<HashMap<(pg_sys::Oid, pg_sys::Oid), BodyPlan>> = RefCell::new(HashMap::new());
    /// Counts the lookups of `BODIES`: an entry's `used` is the count at its last use.
    static BODY_TICK: Cell<u64> = const { Cell::new(0) };
}

/// Most handler and condition plans a backend keeps (about 10 kB each): beyond, the least recently
/// used is dropped (and made again if it is called again). Without a bound a pooled backend kept
/// one for every handler it ever ran, whatever the catalog's size, dropped functions' too.
const MAX_BODY_PLANS: usize = 256;

/// Handler and condition plans this backend keeps (`catalog_stats()`).
pub fn body_plans_kept() -> usize {
    BODIES.with(|b| b.borrow().len())
}

/// Drop `entry`'s plan and memory. Not in use: plans are made and run only at depth 1 (a handler
/// or condition cannot run another), and never while another one runs.
unsafe fn free_body(entry: BodyPlan) {
    unsafe {
        if let Some(p) = entry.plan {
            pg_sys::SPI_freeplan(p);
        }
        pg_sys::MemoryContextDelete(entry.cx);
    }
}

/// The saved plan of `function`'s body, when it is a plain SQL function of one `jsonb` returning
/// `returns` (`jsonb` for a handler, `boolean` for a policy condition) whose body is one SELECT
/// returning one column of that type (not SECURITY DEFINER, no `SET` clauses, no SQL-standard
/// body). Call with SPI connected.
///
/// What runs is what `fmgr_sql` would run: the body parsed with PostgreSQL's own SQL-function
/// parser hooks (the argument by name or as `$1`), under the same pinned settings and role, on the
/// caller's snapshot unless the function is VOLATILE; the first column of its first row, or NULL.
/// One plan per (handler, `role`); the plan cache re-plans it when its tables or functions change.
unsafe fn body_plan(
    function: pg_sys::Oid,
    role: pg_sys::Oid,
    returns: pg_sys::Oid,
) -> Option<(pg_sys::SPIPlanPtr, bool)> {
    unsafe {
        let tup = pg_sys::SearchSysCache1(
            pg_sys::SysCacheIdentifier::PROCOID as _,
            pg_sys::Datum::from(function),
        );
        if tup.is_null() {
            return None;
        }
        let t_self = (*tup).t_self;
        let version = (
            (*(*tup).t_data).t_choice.t_heap.t_xmin.into_inner(),
            (u32::from(t_self.ip_blkid.bi_hi) << 16) | u32::from(t_self.ip_blkid.bi_lo),
            t_self.ip_posid,
        );
        let form = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_proc>(tup);
        let attr = |attr: u32| {
            let mut null = false;
            let d = pg_sys::SysCacheGetAttr(
                pg_sys::SysCacheIdentifier::PROCOID as _,
                tup,
                attr as _,
                &mut null,
            );
            (!null).then_some(d)
        };
        // In the call's memory context (freed with it); compared without a copy when known.
        let src = attr(pg_sys::Anum_pg_proc_prosrc)
            .map(|d| std::ffi::CStr::from_ptr(pg_sys::text_to_cstring(d.cast_mut_ptr())));
        let src_bytes = src.map_or(&[][..], std::ffi::CStr::to_bytes);
        let key = (function, role);
        let tick = BODY_TICK.with(|t| {
            t.set(t.get() + 1);
            t.get()
        });
        let known = BODIES.with(|b| {
            b.borrow_mut()
                .get_mut(&key)
                .filter(|e| {
                    e.version == version
                        && e.source.1 == form.provolatile
                        && e.source.0.as_bytes() == src_bytes
                })
                .map(|e| {
                    e.used = tick;
                    e.plan.map(|p| (p, e.read_only))
                })
        });
        if let Some(known) = known {
            pg_sys::ReleaseSysCache(tup);
            return known;
        }
        let source = (
            String::from_utf8_lossy(src_bytes).into_owned(),
            form.provolatile,
        );
        let eligible = form.prolang == SQL_LANGUAGE
            && !form.prosecdef
            && !form.proretset
            && form.prokind == b'f' as std::ffi::c_char
            && form.pronargs == 1
            && form.proargtypes.values.as_slice(1)[0] == pg_sys::JSONBOID
            && form.prorettype == returns
            && attr(pg_sys::Anum_pg_proc_proconfig).is_none()
            && attr(pg_sys::Anum_pg_proc_prosqlbody).is_none();
        let read_only = form.provolatile != pg_sys::PROVOLATILE_VOLATILE as std::ffi::c_char;
        // Under the call's context until the plan is kept: an ERROR while preparing (a body its
        // role may not parse, a cancel) frees it with the aborted subtransaction.
        let cx = crate::pgutil::memory_context(
            pg_sys::CurrentMemoryContext,
            c"ctxguard handler body",
            crate::pgutil::ContextSizes::Small,
        );
        let mut plan = None;
        if let (true, Some(src)) = (eligible, src) {
            let old = pg_sys::MemoryContextSwitchTo(cx);
            let pinfo = pg_sys::ffi::pg_guard_ffi_boundary(|| {
                prepare_sql_fn_parse_info(tup, std::ptr::null_mut(), pg_sys::InvalidOid)
            });
            pg_sys::MemoryContextSwitchTo(old);
            let p = pg_sys::SPI_prepare_params(src.as_ptr(), Some(sql_fn_parser_setup), pinfo, 0);
            if !p.is_null() {
                if one_select_of(p, returns) && pg_sys::SPI_keepplan(p) == 0 {
                    plan = Some(p);
                } else {
                    pg_sys::SPI_freeplan(p);
                }
            }
        }
        pg_sys::ReleaseSysCache(tup);
        // Kept for the plan's lifetime (its parser hook reads the parse info when it re-plans).
        pg_sys::MemoryContextSetParent(cx, pg_sys::TopMemoryContext);
        let entry = BodyPlan {
            version,
            source,
            plan,
            read_only,
            cx,
            used: tick,
        };
        // Full: the least recently used other entry goes first (a scan of at most
        // MAX_BODY_PLANS, only when a plan is made).
        let evicted = BODIES.with(|b| {
            let mut b = b.borrow_mut();
            if b.len() < MAX_BODY_PLANS || b.contains_key(&key) {
                return None;
            }
            let oldest = b.iter().min_by_key(|(_, e)| e.used).map(|(k, _)| *k)?;
            b.remove(&oldest)
        });
        if let Some(old) = evicted {
            free_body(old);
        }
        if let Some(old) = BODIES.with(|b| b.borrow_mut().insert(key, entry)) {
            free_body(old);
        }
        plan.map(|p| (p, read_only))
    }
}

/// Is `plan` one SELECT returning one column of type `returns`?
unsafe fn one_select_of(plan: pg_sys::SPIPlanPtr, returns: pg_sys::Oid) -> bool {
    unsafe {
        let sources = pg_sys::SPI_plan_get_plan_sources(plan);
        if sources.is_null() || (*sources).length != 1 {
            return false;
        }
        let ps = (*(*sources).elements).ptr_value as *const pg_sys::CachedPlanSource;
        if ps.is_null() || (*ps).commandTag != pg_sys::CommandTag::CMDTAG_SELECT {
            return false;
        }
        let desc = (*ps).resultDesc;
        !desc.is_null() && (*desc).natts == 1 && pg_sys::SPI_gettypeid(desc, 1) == returns
    }
}

/// Run a saved body plan with `args` as its argument: its first row's column, or None (no row, or
/// NULL). Errors are PostgreSQL errors, caught by the caller's subtransaction.
fn call_body<T: FromDatum>(
    plan: pg_sys::SPIPlanPtr,
    read_only: bool,
    args: pg_sys::Datum,
) -> Option<T> {
    let arg = args;
    unsafe {
        let params = pg_sys::makeParamList(1);
        let p = &mut (*params).params.as_mut_slice(1)[0];
        p.value = arg;
        p.isnull = false;
        p.pflags = pg_sys::PARAM_FLAG_CONST as u16;
        p.ptype = pg_sys::JSONBOID;
        // The first row only, as `fmgr_sql` fetches for a function that returns one value.
        let rc = pg_sys::SPI_execute_plan_with_paramlist(plan, params, read_only, 1);
        if rc != pg_sys::SPI_OK_SELECT as i32 {
            raise(
                PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                "ctxguard: a function body did not run as a SELECT",
            );
        }
        let table = pg_sys::SPI_tuptable;
        if pg_sys::SPI_processed == 0 || table.is_null() {
            return None;
        }
        let mut null = false;
        let d = pg_sys::SPI_getbinval(*(*table).vals, (*table).tupdesc, 1, &mut null);
        T::from_datum(d, null)
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

/// Run `body` as a tool's `run_as` role (it must exist and be unprivileged), at a tracked depth,
/// in a subtransaction (read-only if `read_only`), after checking that the role may execute
/// `function` (`what` names it in the refusal). `None` from `body`: NULL. Shared by handlers and
/// policy conditions.
fn as_run_as<R>(
    function: pg_sys::Oid,
    run_as: Option<pg_sys::Oid>,
    read_only: bool,
    what: &str,
    body: impl FnOnce(pg_sys::Oid) -> Option<R>,
) -> Result<R, Failure> {
    let Some(role) = run_as.filter(|r| role_exists(*r) && !owner::role_is_privileged(*r)) else {
        return Err(Failure::NoRunAs);
    };
    let _depth = Depth::enter();
    let result = in_subtransaction(read_only, || {
        owner::as_role(role, || {
            if !compat::may_execute_function(role, function) {
                raise(
                    PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                    format!("permission denied for {what}"),
                );
            }
            body(role)
        })
    });
    match result {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(Failure::ReturnedNull),
        Err(caught) => Err(Failure::Raised(caught.sqlstate)),
    }
}

/// Run `handler(args)` as `run_as`, in a subtransaction (read-only if `read_only`).
pub fn run(
    handler: pg_sys::Oid,
    run_as: Option<pg_sys::Oid>,
    read_only: bool,
    args: Value,
) -> Result<Value, Failure> {
    as_run_as(handler, run_as, read_only, "tool handler", |role| {
        let planned = (depth() == 1)
            .then(|| Spi::connect(|_| unsafe { body_plan(handler, role, pg_sys::JSONBOID) }))
            .flatten();
        // Built as jsonb directly (pgrx's JsonB would print the arguments and parse them again).
        let datum = crate::pgutil::JsonbDatum::from_value(&args)
            .into_datum()
            .expect("jsonb datum");
        let out = match planned {
            Some((plan, stable)) => Spi::connect(|_| call_body::<JsonB>(plan, stable, datum)),
            None => unsafe {
                let out = pg_sys::FunctionCall1Coll(finfo(handler), pg_sys::InvalidOid, datum);
                JsonB::from_datum(out, false)
            },
        };
        out.map(|JsonB(v)| v)
    })
}

/// Evaluate a policy predicate (`when`, `approval_when`): `predicate(args)` as `run_as`, in a
/// read-only subtransaction with the pinned settings, at a tracked depth (it cannot change the
/// context, call tools or approve), on the bound arguments. NULL or an error is `Err` (the caller
/// fails closed).
pub fn predicate(
    predicate: pg_sys::Oid,
    run_as: Option<pg_sys::Oid>,
    args: &Value,
) -> Result<bool, Failure> {
    as_run_as(predicate, run_as, true, "a policy condition", |role| {
        let datum = crate::pgutil::JsonbDatum::from_value(args)
            .into_datum()
            .expect("jsonb datum");
        // A one-SELECT SQL condition from a plan kept across transactions, as handlers' bodies
        // (always read-only: it runs in a read-only subtransaction whatever its volatility).
        let planned = (depth() == 1)
            .then(|| Spi::connect(|_| unsafe { body_plan(predicate, role, pg_sys::BOOLOID) }))
            .flatten();
        match planned {
            // No row or NULL: None, so closed.
            Some((plan, _)) => Spi::connect(|_| call_body::<bool>(plan, true, datum)),
            // FunctionCall1Coll raises if the function returns NULL: an error, so closed.
            None => unsafe {
                let out = pg_sys::FunctionCall1Coll(finfo(predicate), pg_sys::InvalidOid, datum);
                bool::from_datum(out, false)
            },
        }
    })
}
