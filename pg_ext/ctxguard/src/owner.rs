//! The one way ctxguard runs SQL: with its settings pinned, and where it must, as the extension owner.
//!
//! Modelled on PostgreSQL's `fmgr_security_definer`: a new GUC nest level, the pinned settings
//! applied with `GUC_ACTION_SAVE`, the user switched with `SetUserIdAndSecContext`, and both restored
//! on exit. On an error the enclosing (sub)transaction's abort restores them, as it does for a
//! SECURITY DEFINER function.
//!
//! Why: SQL that ctxguard runs resolves names through the session's `search_path`, where `pg_temp`
//! comes first for types and relations, and it parses and prints values through the session's
//! `TimeZone`, `DateStyle`, text search configuration and friends. A caller who controls those
//! could otherwise make the owner run a domain's CHECK function, or move `current_date`. With
//! `search_path = pg_catalog, pg_temp` nothing the caller creates is found before the catalog's
//! own objects (pg_temp is never searched for functions or operators, and is searched last for
//! types and relations), and every name ctxguard uses outside `pg_catalog` is schema-qualified.
//!
//! Every SPI statement in the extension runs inside [`as_owner`] or [`pinned`]; `grep -n "Spi::"`
//! outside a closure passed to one of them is a bug.

use std::cell::Cell;
use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::pgutil::raise;

/// Settings every statement ctxguard runs sees, whatever the caller set (in the order of
/// [`holding`]'s checks).
const PINNED: [(&CStr, &CStr); 15] = [
    (c"search_path", c"pg_catalog, pg_temp"),
    (c"TimeZone", c"UTC"),
    (c"DateStyle", c"ISO, YMD"),
    (c"IntervalStyle", c"postgres"),
    (c"default_text_search_config", c"pg_catalog.english"),
    (c"standard_conforming_strings", c"on"),
    (c"transform_null_equals", c"off"),
    (c"array_nulls", c"on"),
    (c"extra_float_digits", c"1"),
    (c"bytea_output", c"hex"),
    (c"row_security", c"on"),
    (c"check_function_bodies", c"on"),
    // A cap on the rows a GIN index scan returns, dropped at random (0: none): it would change
    // which tools a page lists (`tool_policies.page_types`) and which pages a search finds.
    (c"gin_fuzzy_search_limit", c"0"),
    // Whether a saved statement gets its kept generic plan or a plan of its own every time: a
    // session's `force_custom_plan`, left on a pooled connection, would plan every statement of
    // every later call (the plans themselves are made with [`planner_settings`]).
    (c"plan_cache_mode", c"auto"),
    // Whether `regclass` / `regnamespace` / `regtype` output and `quote_ident` quote every name:
    // text that ctxguard's SQL turns into SQL again (an entity's table and types) must read the
    // same for every caller.
    (c"quote_all_identifiers", c"off"),
];

/// A pinned scope: restores the GUC nest level (if it opened one) and the user on drop.
struct Scope {
    nest: Option<i32>,
    user: Option<(pg_sys::Oid, i32)>,
    /// Counted in [`SCOPES`] (a scope [`open`] made).
    counted: bool,
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.counted {
            SCOPES.with(|n| n.set(n.get().saturating_sub(1)));
        }
        unsafe {
            if let Some((uid, sec)) = self.user {
                pg_sys::SetUserIdAndSecContext(uid, sec);
            }
            // On an error, the (sub)transaction abort pops the nest level (like fmgr_security_definer).
            if let Some(nest) = self.nest.filter(|_| !std::thread::panicking()) {
                pg_sys::AtEOXact_GUC(true, nest);
            }
        }
    }
}

/// Which settings of [`PINNED`] hold their value, in its order: read from the variables the
/// settings assign (what `GetConfigOption` shows for each, without looking its name up), the
/// check every scope makes. `bytea_output`'s variable is not in pgrx's bindings; it is read by
/// name. `sql/tests/09_handlers.sql` moves each setting in turn away from its value, all the
/// others at theirs, and checks that a handler still sees it pinned.
fn holding() -> [bool; PINNED.len()] {
    // SAFETY: the settings' variables, read by value in the backend's one thread; the strings are
    // the settings' own (never NULL once the settings are initialized, checked all the same).
    unsafe {
        let is =
            |v: *const std::ffi::c_char, want: &CStr| !v.is_null() && CStr::from_ptr(v) == want;
        [
            is(pg_sys::namespace_search_path, c"pg_catalog, pg_temp"),
            !pg_sys::session_timezone.is_null()
                && is(
                    pg_sys::pg_get_timezone_name(pg_sys::session_timezone),
                    c"UTC",
                ),
            pg_sys::DateStyle == pg_sys::USE_ISO_DATES as i32
                && pg_sys::DateOrder == pg_sys::DATEORDER_YMD as i32,
            pg_sys::IntervalStyle == pg_sys::INTSTYLE_POSTGRES as i32,
            is(pg_sys::TSCurrentConfig, c"pg_catalog.english"),
            pg_sys::standard_conforming_strings,
            !pg_sys::Transform_null_equals,
            pg_sys::Array_nulls,
            pg_sys::extra_float_digits == 1,
            is(
                pg_sys::GetConfigOption(c"bytea_output".as_ptr(), true, false),
                c"hex",
            ),
            pg_sys::row_security,
            pg_sys::check_function_bodies,
            pg_sys::GinFuzzySearchLimit == 0,
            pg_sys::plan_cache_mode == pg_sys::PlanCacheMode::PLAN_CACHE_MODE_AUTO as i32,
            !pg_sys::quote_all_identifiers,
        ]
    }
}

/// Set `name` to `value` at the current nest level, restored when it is popped.
fn set(name: &CStr, value: &CStr) {
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            pgrx::PgLogLevel::ERROR as i32,
            false,
        );
    }
}

/// Open a scope with the pinned settings, optionally switching to `user` with
/// `SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION` added to the security context.
fn open(user: Option<pg_sys::Oid>) -> Scope {
    // Settings cannot change during a parallel operation, and nothing may run unpinned: refuse.
    // (Every function that runs SQL is PARALLEL UNSAFE, so this is only reached if that is undone.)
    if unsafe { pg_sys::IsInParallelMode() } {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_TRANSACTION_STATE,
            "ctxguard: this function cannot run during a parallel operation",
        );
    }
    // Inside another scope, or in a session that pins them itself (the gateway does), every
    // setting already holds: no nest level to open, and none to pop (in PostgreSQL 15 popping one
    // walks every setting there is). A scope that sets nothing restores nothing either way: what
    // SQL inside it sets stays set after it, with or without a nest level of its own.
    let holds = holding();
    let nest = holds.contains(&false).then(|| {
        let nest = unsafe { pg_sys::NewGUCNestLevel() };
        for ((name, value), _) in PINNED.iter().zip(holds).filter(|(_, h)| !h) {
            set(name, value);
        }
        nest
    });
    SCOPES.with(|n| n.set(n.get() + 1));
    let mut scope = Scope {
        nest,
        user: None,
        counted: true,
    };
    if let Some(target) = user {
        let (mut uid, mut sec) = (pg_sys::InvalidOid, 0i32);
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut uid, &mut sec);
            scope.user = Some((uid, sec));
            pg_sys::SetUserIdAndSecContext(
                target,
                sec | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
            );
        }
    }
    scope
}

/// Make the pinned settings the session's own, for a process that runs only ctxguard's code (the
/// ledger writer): each of its scopes then finds them in place.
pub fn pin_session() {
    for (name, value) in PINNED.iter() {
        crate::pgutil::set_session(name, value);
    }
}

/// The planner's own settings: every plan made while ctxguard's code runs (its own statements,
/// the handler bodies it keeps, a handler's or condition's own SQL) is made with these, through
/// [`planner`]. PostgreSQL's defaults, with JIT and parallel plans off (the gateway pins both, so
/// its sessions hold every one of them). GEQO is on as PostgreSQL has it, with its threshold and
/// its parameters at their defaults: no ctxguard statement joins the 12 relations it takes, and a
/// handler's that does is planned the same way for every caller. Plans are kept for
/// the backend's life and so serve every later client of a pooled server connection; whatever
/// planner costs and switches the session that happens to make the plan has set (any role may set
/// them, and a pooled connection keeps a session's `SET` for the next client), or a DBA's tuning
/// (these statements are written for the defaults), it is the plan these give. Only settings
/// every supported major (15 and later) has; the switches added since
/// (`enable_presorted_aggregate`, `enable_group_by_reordering`, ...) change none of ctxguard's
/// statements' plans. `plan_cache_mode`, read before planning, is in [`PINNED`].
///
/// Each with whether it holds its value now (read from the variable the setting assigns, as
/// [`holding`] does): a plan made while they all hold opens no nest level.
fn planner_settings() -> [(&'static CStr, &'static CStr, bool); 41] {
    use pg_sys as p;
    // GEQO's parameters are not in pgrx's bindings: read as shown (cheap next to a plan; only
    // while ctxguard's code plans).
    let shown = |name: &CStr, want: &CStr| {
        // SAFETY: a NUL-terminated name; NULL for a setting this server does not know.
        let v = unsafe { pg_sys::GetConfigOption(name.as_ptr(), true, false) };
        !v.is_null() && unsafe { CStr::from_ptr(v) } == want
    };
    // SAFETY: the settings' variables, read by value in the backend's one thread.
    unsafe {
        [
            (c"enable_async_append", c"on", p::enable_async_append),
            (c"enable_bitmapscan", c"on", p::enable_bitmapscan),
            (c"enable_gathermerge", c"on", p::enable_gathermerge),
            (c"enable_hashagg", c"on", p::enable_hashagg),
            (c"enable_hashjoin", c"on", p::enable_hashjoin),
            (
                c"enable_incremental_sort",
                c"on",
                p::enable_incremental_sort,
            ),
            (c"enable_indexonlyscan", c"on", p::enable_indexonlyscan),
            (c"enable_indexscan", c"on", p::enable_indexscan),
            (c"enable_material", c"on", p::enable_material),
            (c"enable_memoize", c"on", p::enable_memoize),
            (c"enable_mergejoin", c"on", p::enable_mergejoin),
            (c"enable_nestloop", c"on", p::enable_nestloop),
            (c"enable_parallel_append", c"on", p::enable_parallel_append),
            (c"enable_parallel_hash", c"on", p::enable_parallel_hash),
            (
                c"enable_partition_pruning",
                c"on",
                p::enable_partition_pruning,
            ),
            (
                c"enable_partitionwise_aggregate",
                c"off",
                !p::enable_partitionwise_aggregate,
            ),
            (
                c"enable_partitionwise_join",
                c"off",
                !p::enable_partitionwise_join,
            ),
            (c"enable_seqscan", c"on", p::enable_seqscan),
            (c"enable_sort", c"on", p::enable_sort),
            (c"enable_tidscan", c"on", p::enable_tidscan),
            (c"seq_page_cost", c"1", p::seq_page_cost == 1.0),
            (c"random_page_cost", c"4", p::random_page_cost == 4.0),
            (c"cpu_tuple_cost", c"0.01", p::cpu_tuple_cost == 0.01),
            (
                c"cpu_index_tuple_cost",
                c"0.005",
                p::cpu_index_tuple_cost == 0.005,
            ),
            (
                c"cpu_operator_cost",
                c"0.0025",
                p::cpu_operator_cost == 0.0025,
            ),
            (
                c"effective_cache_size",
                c"4GB",
                p::effective_cache_size as i64 * p::BLCKSZ as i64 == 4 << 30,
            ),
            (
                c"cursor_tuple_fraction",
                c"0.1",
                p::cursor_tuple_fraction == 0.1,
            ),
            (c"from_collapse_limit", c"8", p::from_collapse_limit == 8),
            (c"join_collapse_limit", c"8", p::join_collapse_limit == 8),
            (c"geqo", c"on", p::enable_geqo),
            (c"geqo_threshold", c"12", p::geqo_threshold == 12),
            (c"geqo_effort", c"5", shown(c"geqo_effort", c"5")),
            (c"geqo_pool_size", c"0", shown(c"geqo_pool_size", c"0")),
            (c"geqo_generations", c"0", shown(c"geqo_generations", c"0")),
            (
                c"geqo_selection_bias",
                c"2",
                shown(c"geqo_selection_bias", c"2"),
            ),
            (c"geqo_seed", c"0", shown(c"geqo_seed", c"0")),
            (
                c"constraint_exclusion",
                c"partition",
                p::constraint_exclusion
                    == p::ConstraintExclusionType::CONSTRAINT_EXCLUSION_PARTITION as i32,
            ),
            (c"work_mem", c"4MB", p::work_mem == 4096),
            (c"hash_mem_multiplier", c"2", p::hash_mem_multiplier == 2.0),
            (c"jit", c"off", !p::jit_enabled),
            (
                c"max_parallel_workers_per_gather",
                c"0",
                p::max_parallel_workers_per_gather == 0,
            ),
        ]
    }
}

thread_local! {
    /// Pinned scopes open ([`open`]): while there is one, ctxguard's code is running.
    static SCOPES: Cell<u32> = const { Cell::new(0) };
    /// Planner settings a statement asks for on top of [`planner_settings`] ([`with_planner`]).
    static OVERRIDES: Cell<&'static [(&'static CStr, &'static CStr)]> = const { Cell::new(&[]) };
    /// Planner settings a process asks for on top of [`planner_settings`], under the statement's
    /// ([`planner_base`]: the ledger writer's).
    static BASE: Cell<&'static [(&'static CStr, &'static CStr)]> = const { Cell::new(&[]) };
}

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;

/// Install [`planner`] (in every backend that loads the library, preloaded or not: it is loaded
/// before ctxguard's code first runs, and so before anything it plans).
pub fn init_planner() {
    // SAFETY: the backend's one thread, while the library loads.
    unsafe {
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner);
    }
}

/// The planner, as PostgreSQL's (or the hook before this one): while ctxguard's code runs, with
/// [`planner_settings`] and the statement's [`with_planner`] overrides set at a nest level of
/// their own, popped after planning (an error's abort pops it too). Outside, untouched.
#[pg_guard]
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const std::ffi::c_char,
    cursor_options: std::ffi::c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: PostgreSQL's planner (or the previous hook) with the arguments it was given; an
    // ERROR inside becomes a Rust panic at the boundary and is raised again by `pg_guard`.
    let plan = || unsafe {
        match PREV_PLANNER {
            Some(prev) => pg_sys::ffi::pg_guard_ffi_boundary(|| {
                prev(parse, query_string, cursor_options, bound_params)
            }),
            None => pg_sys::standard_planner(parse, query_string, cursor_options, bound_params),
        }
    };
    if SCOPES.with(Cell::get) == 0 {
        return plan();
    }
    let (base, overrides) = (BASE.with(Cell::get), OVERRIDES.with(Cell::get));
    let settings = planner_settings();
    if base.is_empty() && overrides.is_empty() && settings.iter().all(|s| s.2) {
        return plan();
    }
    let _scope = Scope {
        nest: Some(unsafe { pg_sys::NewGUCNestLevel() }),
        user: None,
        counted: false,
    };
    for (name, value, _) in settings.iter().filter(|s| !s.2) {
        set(name, value);
    }
    for (name, value) in base.iter().chain(overrides) {
        set(name, value);
    }
    plan()
}

/// Add `pairs` to the planner's own settings for every plan this process makes inside ctxguard's
/// code from now on (under a statement's own [`with_planner`] settings): for a process that runs
/// only ctxguard's code (the ledger writer).
pub fn planner_base(pairs: &'static [(&'static CStr, &'static CStr)]) {
    BASE.with(|b| b.set(pairs));
}

/// Run `f` with `pairs` added to the planner's own settings ([`planner_settings`]) for whatever is
/// planned inside it: for a statement whose plan must not depend on the statistics of the moment
/// (a plan is made with the settings in force when it is made, and a saved one is kept).
pub fn with_planner<R>(
    pairs: &'static [(&'static CStr, &'static CStr)],
    f: impl FnOnce() -> R,
) -> R {
    struct Restore(&'static [(&'static CStr, &'static CStr)]);
    impl Drop for Restore {
        fn drop(&mut self) {
            OVERRIDES.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(OVERRIDES.with(|o| o.replace(pairs)));
    f()
}

/// Run `f` (SPI statements) as the caller with ctxguard's pinned settings.
pub fn pinned<R>(f: impl FnOnce() -> R) -> R {
    let _scope = open(None);
    f()
}

/// The pinned settings until the returned guard drops: the first line of every SQL-callable
/// entry point that runs SQL, so that nothing it does (as the caller or as the owner) sees the
/// caller's settings. Transaction-local context writes (`set_local`) inside it survive it.
#[must_use = "the settings are restored when the guard drops"]
pub struct Pin(#[allow(dead_code, reason = "held for its Drop")] Scope);

pub fn pin() -> Pin {
    Pin(open(None))
}

/// Run `f` as the extension owner with the pinned settings: for the bookkeeping tables (audit,
/// generations, approvals, budgets) that callers must not be able to forge, and for catalog reads.
pub fn as_owner<R>(f: impl FnOnce() -> R) -> R {
    let owner = extension_owner();
    let _scope = open(Some(owner));
    f()
}

/// Run `f` as `role` (a tool's `run_as`), like a SECURITY DEFINER function of that role with
/// `SET search_path = pg_catalog, pg_temp`, in a security-restricted operation.
pub fn as_role<R>(role: pg_sys::Oid, f: impl FnOnce() -> R) -> R {
    let _scope = open(Some(role));
    f()
}

thread_local! {
    static OWNER: Cell<Option<pg_sys::Oid>> = const { Cell::new(None) };
}

/// The extension owner, looked up once per backend (with the pinned settings).
pub fn extension_owner() -> pg_sys::Oid {
    if let Some(o) = OWNER.with(Cell::get) {
        return o;
    }
    // A read-only client: pgrx's writing one (`Spi::get_one`) would give the caller's
    // transaction an xid.
    let oid = pinned(|| {
        Spi::connect(|c| {
            c.select(
                "SELECT e.extowner FROM pg_catalog.pg_extension e
                  WHERE e.extname OPERATOR(pg_catalog.=) 'ctxguard'::pg_catalog.name",
                Some(1),
                &[],
            )?
            .first()
            .get_one::<pg_sys::Oid>()
        })
    })
    .ok()
    .flatten()
    .unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "ctxguard is not installed",
        )
    });
    OWNER.with(|c| c.set(Some(oid)));
    oid
}

/// Is `role` unfit to run tool handlers (superuser, BYPASSRLS, or the extension owner)?
/// Ownership of protected tables is checked by SQL at registration and by `lint()`.
pub fn role_is_privileged(role: pg_sys::Oid) -> bool {
    let privileged =
        unsafe { pg_sys::superuser_arg(role) || pg_sys::has_bypassrls_privilege(role) };
    privileged || role == extension_owner()
}

/// Most elements of [`pin_settings`]'s array: 128 settings, each a name and a value.
const PIN_ELEMENTS: usize = 256;

/// The gateway's transaction frame (`gateway/src/db/sql.rs`, `begin`): each setting of `pins`
/// (name, value, name, value, …) that this server knows and that does not read `value` already is
/// set for the transaction, and the number set is returned. The same as the statement
/// `SELECT pg_catalog.set_config(v.n, v.v, true) FROM (VALUES …) v(n, v) WHERE
/// pg_catalog.current_setting(v.n, true) <> v.v` (the same two functions, called directly, with
/// the caller's privileges), without parsing and planning that statement in every transaction.
/// Grants nothing: the caller could set each of these itself.
#[pg_extern(volatile, parallel_unsafe)]
fn pin_settings(pins: Option<pgrx::Array<&str>>) -> i32 {
    const INVALID: PgSqlErrorCode = PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE;
    let Some(pins) = pins else {
        raise(INVALID, "ctxguard: pin_settings: the pins are NULL");
    };
    if pins.len() > PIN_ELEMENTS || pins.len() % 2 != 0 {
        raise(
            INVALID,
            format!("ctxguard: pin_settings: pins are pairs of a name and a value, at most {PIN_ELEMENTS} elements"),
        );
    }
    let items: Vec<Option<&str>> = pins.iter().collect();
    let mut set = 0;
    for pair in items.chunks(2) {
        pgrx::check_for_interrupts!();
        let (Some(name), Some(value)) = (pair[0], pair[1]) else {
            raise(INVALID, "ctxguard: pin_settings: a name or value is NULL");
        };
        // SAFETY: PostgreSQL's `current_setting(text, bool)` and `set_config(text, text, bool)`,
        // called with text and bool datums made here.
        unsafe {
            let current = pgrx::direct_function_call::<String>(
                pg_sys::show_config_by_name_missing_ok,
                &[name.into_datum(), true.into_datum()],
            );
            // Not a setting of this server (NULL), or it holds already: left as it is.
            if current.as_deref().is_none_or(|c| c == value) {
                continue;
            }
            pgrx::direct_function_call::<String>(
                pg_sys::set_config_by_name,
                &[name.into_datum(), value.into_datum(), true.into_datum()],
            );
        }
        set += 1;
    }
    set
}
