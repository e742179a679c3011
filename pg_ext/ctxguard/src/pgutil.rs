//! Small, audited wrappers around Postgres internals (local GUC writes, subtransactions, saved
//! plans). Running SQL as the owner or a handler's role lives in `owner.rs` and `handler.rs`.

use std::ffi::CStr;
use std::panic::AssertUnwindSafe;

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::PgTryBuilder;

/// Block sizes of a new memory context: PostgreSQL's `ALLOCSET_SMALL_SIZES` (a few small
/// allocations) or `ALLOCSET_DEFAULT_SIZES`.
#[derive(Clone, Copy)]
pub enum ContextSizes {
    Small,
    Default,
}

/// A new memory context under `parent` (PostgreSQL's `AllocSetContextCreate`), named `name` in
/// memory-context reports.
///
/// # Safety
/// `parent` is a valid memory context.
pub unsafe fn memory_context(
    parent: pg_sys::MemoryContext,
    name: &'static CStr,
    sizes: ContextSizes,
) -> pg_sys::MemoryContext {
    let (min, init, max) = match sizes {
        ContextSizes::Small => (
            pg_sys::ALLOCSET_SMALL_MINSIZE,
            pg_sys::ALLOCSET_SMALL_INITSIZE,
            pg_sys::ALLOCSET_SMALL_MAXSIZE,
        ),
        ContextSizes::Default => (
            pg_sys::ALLOCSET_DEFAULT_MINSIZE,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE,
        ),
    };
    // SAFETY: the caller passes a valid parent; the name is static, as the context keeps it.
    unsafe {
        pg_sys::AllocSetContextCreateInternal(
            parent,
            name.as_ptr(),
            min as usize,
            init as usize,
            max as usize,
        )
    }
}

/// `$t` is `jsonb` in SQL, as an argument and as a result.
macro_rules! jsonb_in_sql {
    ($t:ty) => {
        // SAFETY: the datum is a `jsonb`, as the SQL type says (built by `jsonb_in`, or read as
        // `JsonB` reads one).
        unsafe impl pgrx::pgrx_sql_entity_graph::metadata::SqlTranslatable for $t {
            const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!($t);
            const TYPE_ORIGIN: pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin =
                pgrx::pgrx_sql_entity_graph::metadata::TypeOrigin::External;
            const ARGUMENT_SQL: Result<
                pgrx::pgrx_sql_entity_graph::metadata::SqlMappingRef,
                pgrx::pgrx_sql_entity_graph::metadata::ArgumentError,
            > = Ok(pgrx::pgrx_sql_entity_graph::metadata::SqlMappingRef::literal("jsonb"));
            const RETURN_SQL: Result<
                pgrx::pgrx_sql_entity_graph::metadata::ReturnsRef,
                pgrx::pgrx_sql_entity_graph::metadata::ReturnsError,
            > = Ok(pgrx::pgrx_sql_entity_graph::metadata::ReturnsRef::One(
                pgrx::pgrx_sql_entity_graph::metadata::SqlMappingRef::literal("jsonb"),
            ));
        }
    };
}

/// `ArgAbi` for an argument type read through its `FromDatum`, as pgrx's own `JsonB` is
/// (`argue_from_datum!`).
macro_rules! arg_from_datum {
    ($t:ty) => {
        // SAFETY: unboxed through `FromDatum`, as pgrx's own `JsonB` is.
        unsafe impl<'fcx> pgrx::callconv::ArgAbi<'fcx> for $t {
            unsafe fn unbox_arg_unchecked(arg: pgrx::callconv::Arg<'_, 'fcx>) -> Self {
                let index = arg.index();
                unsafe { arg.unbox_arg_using_from_datum() }
                    .unwrap_or_else(|| panic!("argument {index} must not be null"))
            }

            unsafe fn unbox_nullable_arg(
                arg: pgrx::callconv::Arg<'_, 'fcx>,
            ) -> pgrx::nullable::Nullable<Self> {
                unsafe { arg.unbox_arg_using_from_datum() }.into()
            }
        }
    };
}

/// Raise an ERROR with a specific SQLSTATE. Messages must never contain caller-supplied values.
pub fn raise(code: PgSqlErrorCode, message: impl Into<String>) -> ! {
    pgrx::ereport!(ERROR, code, message.into());
}

/// True inside an explicit transaction block (`BEGIN ... COMMIT`).
pub fn in_transaction_block() -> bool {
    unsafe { pg_sys::IsTransactionBlock() }
}

/// Set `name` to `value` for the rest of the session as a superuser's override (a background
/// worker's own settings, which nothing else in its process changes).
pub fn set_session(name: &CStr, value: &CStr) {
    // SAFETY: the name and value of a setting this server has, as C strings.
    unsafe {
        pg_sys::SetConfigOption(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
    }
}

/// Set a `ctxguard.*` context setting for the rest of the current (sub)transaction, as
/// `SET LOCAL` would, with superuser context so that only extension code can do it.
pub fn set_local(name: &CStr, value: &str) {
    let value = std::ffi::CString::new(value).unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "context values cannot contain NUL bytes",
        )
    });
    unsafe {
        pg_sys::set_config_option(
            name.as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_LOCAL,
            true,
            pgrx::PgLogLevel::ERROR as i32,
            false,
        );
    }
}

/// The SQLSTATE of the error a subtransaction caught. The message is dropped on purpose: it may
/// quote data (e.g. a duplicate key of another tenant's row).
pub struct Caught {
    pub sqlstate: String,
}

fn sqlstate_string(code: PgSqlErrorCode) -> String {
    let mut c = code as i32;
    let mut s = String::with_capacity(5);
    for _ in 0..5 {
        s.push(char::from(b'0' + (c & 0x3f) as u8));
        c >>= 6;
    }
    s
}

/// Run `f` in an internal subtransaction (like a PL/pgSQL `BEGIN ... EXCEPTION` block).
/// On error the subtransaction is rolled back, so the caller's transaction survives.
/// If `read_only`, `transaction_read_only` is forced on for the subtransaction: set like `SET LOCAL`
/// (`GUC_ACTION_LOCAL`), and PostgreSQL gives the enclosing transaction its own read-only state back
/// when the subtransaction commits or aborts (`prevXactReadOnly`). Not `GUC_ACTION_SAVE`: from
/// PostgreSQL 17 on the setting is `GUC_NO_RESET` and refuses it ("cannot be set locally in functions").
pub fn in_subtransaction<R>(read_only: bool, f: impl FnOnce() -> R) -> Result<R, Caught> {
    unsafe {
        let old_cx = pg_sys::CurrentMemoryContext;
        let old_owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(old_cx);
        let result = PgTryBuilder::new(AssertUnwindSafe(|| {
            let nest = pg_sys::NewGUCNestLevel();
            if read_only {
                pg_sys::set_config_option(
                    c"transaction_read_only".as_ptr(),
                    c"on".as_ptr(),
                    pg_sys::GucContext::PGC_USERSET,
                    pg_sys::GucSource::PGC_S_SESSION,
                    pg_sys::GucAction::GUC_ACTION_LOCAL,
                    true,
                    pgrx::PgLogLevel::ERROR as i32,
                    false,
                );
            }
            let r = f();
            pg_sys::AtEOXact_GUC(true, nest);
            Ok(r)
        }))
        .catch_others(|e| {
            let sqlstate = match &e {
                pg_sys::panic::CaughtError::PostgresError(r)
                | pg_sys::panic::CaughtError::ErrorReport(r)
                | pg_sys::panic::CaughtError::RustPanic { ereport: r, .. } => {
                    sqlstate_string(r.sql_error_code())
                }
            };
            Err(Caught { sqlstate })
        })
        .execute();
        match result {
            Ok(_) => pg_sys::ReleaseCurrentSubTransaction(),
            Err(_) => pg_sys::RollbackAndReleaseCurrentSubTransaction(),
        }
        pg_sys::MemoryContextSwitchTo(old_cx);
        pg_sys::CurrentResourceOwner = old_owner;
        result
    }
}

/// Run `f` in an internal subtransaction whose effects stay only if `f` says so: `f` returns its
/// result and whether to keep what it did. An error `f` raises rolls the subtransaction back, then
/// `on_error` runs (in the caller's transaction, its locks released), then the error goes on.
/// Used so that a tool's effects commit only with its audit record.
pub fn keep_if<R>(f: impl FnOnce() -> (R, bool), on_error: impl FnOnce()) -> R {
    unsafe {
        let old_cx = pg_sys::CurrentMemoryContext;
        let old_owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(old_cx);
        let result = PgTryBuilder::new(AssertUnwindSafe(|| Ok(f())))
            .catch_others(|e| Err(Box::new(e)))
            .execute();
        let keep = matches!(result, Ok((_, true)));
        if keep {
            pg_sys::ReleaseCurrentSubTransaction();
        } else {
            pg_sys::RollbackAndReleaseCurrentSubTransaction();
        }
        pg_sys::MemoryContextSwitchTo(old_cx);
        pg_sys::CurrentResourceOwner = old_owner;
        match result {
            Ok((r, _)) => r,
            Err(e) => {
                on_error();
                e.rethrow()
            }
        }
    }
}

/// Was the library loaded through `shared_preload_libraries`? Set once in `_PG_init`.
pub fn loaded_at_startup() -> bool {
    unsafe { pg_sys::process_shared_preload_libraries_in_progress }
}

/// Reserve the `ctxguard.` prefix: no placeholder settings can be created under it (every
/// supported major, 15 and later, has `MarkGUCPrefixReserved`).
pub fn reserve_prefix() {
    unsafe {
        pg_sys::MarkGUCPrefixReserved(c"ctxguard".as_ptr());
    }
}

thread_local! {
    /// Saved (SPI_keepplan) statements, by SQL text: parsed and planned once per backend.
    static PLANS: std::cell::RefCell<std::collections::HashMap<String, std::rc::Rc<pgrx::spi::OwnedPreparedStatement>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// A saved plan for `sql` with parameter types `types` (prepared on first use in this backend).
pub fn saved_plan(
    client: &pgrx::spi::SpiClient<'_>,
    sql: &str,
    types: &[pgrx::PgOid],
    mutating: bool,
) -> Result<std::rc::Rc<pgrx::spi::OwnedPreparedStatement>, pgrx::spi::Error> {
    if let Some(p) = PLANS.with(|m| m.borrow().get(sql).cloned()) {
        return Ok(p);
    }
    let stmt = if mutating {
        client.prepare_mut(sql, types)?
    } else {
        client.prepare(sql, types)?
    };
    let plan = std::rc::Rc::new(stmt.keep());
    PLANS.with(|m| m.borrow_mut().insert(sql.to_string(), plan.clone()));
    Ok(plan)
}

/// `text` parameter type for [`saved_plan`].
pub const TEXT: pgrx::PgOid = pgrx::PgOid::BuiltIn(pg_sys::BuiltinOid::TEXTOID);

/// Run `sql` through a saved plan whose parameter types are those of `args` (read-only).
pub fn select_saved<'conn>(
    client: &pgrx::spi::SpiClient<'conn>,
    sql: &str,
    limit: Option<i64>,
    args: &[pgrx::datum::DatumWithOid<'_>],
) -> Result<pgrx::spi::SpiTupleTable<'conn>, pgrx::spi::Error> {
    let types: Vec<pgrx::PgOid> = args.iter().map(|a| pgrx::PgOid::from(a.oid())).collect();
    let plan = saved_plan(client, sql, &types, false)?;
    client.select(&*plan, limit, args)
}

thread_local! {
    /// Saved statements planned generically (see [`open_generic`]), by SQL text: each kept for
    /// the backend's life (`SPI_keepplan`), like [`PLANS`].
    static GENERIC_PLANS: std::cell::RefCell<std::collections::HashMap<String, usize>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// A read-only cursor over `sql` (parameter types those of `args`) through a saved plan that is
/// always the generic one (`CURSOR_OPT_GENERIC_PLAN`, prepared on first use in this backend).
///
/// PostgreSQL's plan cache plans a saved statement again for every execution (a custom plan)
/// while the generic plan's estimated cost stays above the custom plans' average, whatever the
/// plans' shapes. A statement whose parameters narrow it to a few rows that the estimates cannot
/// see (a document's range of pages, its words' candidate lists) stays there for good: the search
/// planned itself on every call (0.4 ms of its 3 ms on the bench machine), `read_doc_pages` too.
/// For such a statement, written so that its one plan is right for every value (the tests plan
/// them generically from the first execution), the generic plan is made once and kept.
pub fn open_generic<'conn>(
    client: &pgrx::spi::SpiClient<'conn>,
    sql: &str,
    args: &[pgrx::datum::DatumWithOid<'_>],
) -> Result<pgrx::spi::SpiCursor<'conn>, pgrx::spi::Error> {
    let plan = match GENERIC_PLANS.with(|m| m.borrow().get(sql).copied()) {
        Some(p) => p as pg_sys::SPIPlanPtr,
        None => {
            let cmd = std::ffi::CString::new(sql).expect("ctxguard's SQL has no NUL");
            let mut types: Vec<pg_sys::Oid> = args.iter().map(|a| a.oid()).collect();
            // SAFETY: a NUL-terminated statement and its parameter types; an error is raised
            // (longjmp, caught by pgrx) or the plan is NULL with SPI_result set.
            let p = unsafe {
                pg_sys::SPI_prepare_cursor(
                    cmd.as_ptr(),
                    types.len() as i32,
                    types.as_mut_ptr(),
                    pg_sys::CURSOR_OPT_GENERIC_PLAN as i32,
                )
            };
            if p.is_null() {
                // SAFETY: set by SPI_prepare_cursor's failure.
                let status = unsafe { pg_sys::SPI_result };
                return Err(pgrx::spi::Spi::check_status(status).err().unwrap_or(
                    pgrx::spi::Error::SpiError(pgrx::spi::SpiErrorCodes::Argument),
                ));
            }
            // SAFETY: a plan just prepared, moved out of SPI's procedure context (kept).
            unsafe { pg_sys::SPI_keepplan(p) };
            GENERIC_PLANS.with(|m| m.borrow_mut().insert(sql.to_string(), p as usize));
            p
        }
    };
    // The values must be of the types the plan was prepared with (its first use's): a call site
    // with other types would hand the plan datums it cannot read.
    // SAFETY: a kept plan.
    let (count, types_match) = unsafe {
        let count = pg_sys::SPI_getargcount(plan).max(0) as usize;
        let types_match = args
            .iter()
            .enumerate()
            .all(|(i, a)| pg_sys::SPI_getargtypeid(plan, i as i32) == a.oid());
        (count, types_match)
    };
    if count != args.len() {
        return Err(pgrx::spi::Error::PreparedStatementArgumentMismatch {
            expected: count,
            got: args.len(),
        });
    }
    if !types_match {
        return Err(pgrx::spi::Error::SpiError(
            pgrx::spi::SpiErrorCodes::Argument,
        ));
    }
    let (mut values, nulls): (Vec<pg_sys::Datum>, Vec<std::ffi::c_char>) = args
        .iter()
        .map(|a| match a.datum() {
            Some(d) => (d.sans_lifetime(), b' ' as std::ffi::c_char),
            None => (pg_sys::Datum::from(0usize), b'n' as std::ffi::c_char),
        })
        .unzip();
    // As pgrx opens a read-only statement's cursor: on the transaction's snapshot while it has
    // written nothing.
    // SAFETY: no concurrent access.
    let read_only =
        unsafe { pg_sys::GetCurrentTransactionIdIfAny() } == pg_sys::InvalidTransactionId;
    // The plan is kept for the backend's life, and so serves every later client of a pooled
    // server connection: it is made with the planner's own settings, not the session's (which any
    // role may set: no index scans, page reads a million times dearer, JIT for every execution),
    // by ctxguard's planner hook (`owner::planner`), whenever it is made.
    // SAFETY: a kept plan with as many values and nulls as it has parameters, of its types;
    // SPI_cursor_open raises an error rather than returning NULL.
    let portal = unsafe {
        pg_sys::SPI_cursor_open(
            std::ptr::null(),
            plan,
            values.as_mut_ptr(),
            nulls.as_ptr(),
            read_only,
        )
    };
    // SAFETY: the portal just opened (its name is copied).
    let name = unsafe { CStr::from_ptr((*portal).name) }
        .to_string_lossy()
        .into_owned();
    client.find_cursor(&name)
}

/// Like [`select_saved`], on a snapshot taken now (as a statement that writes would see: in READ
/// COMMITTED, what committed since the calling statement began), without making the transaction
/// one that writes. pgrx's writing client would give the transaction an xid, and so a WAL record
/// and a commit that waits for its flush, to a call that writes nothing.
pub fn select_fresh<R>(
    sql: &str,
    limit: Option<i64>,
    args: &[pgrx::datum::DatumWithOid<'_>],
    read: impl FnOnce(pgrx::spi::SpiTupleTable<'_>) -> Result<R, pgrx::spi::Error>,
) -> Result<R, pgrx::spi::Error> {
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    // On an error the (sub)transaction's abort pops the snapshot.
    let r = Spi::connect(|c| read(select_saved(c, sql, limit, args)?));
    unsafe { pg_sys::PopActiveSnapshot() };
    r
}

/// Like [`select_saved`], for statements that write.
pub fn update_saved<'conn>(
    client: &mut pgrx::spi::SpiClient<'conn>,
    sql: &str,
    limit: Option<i64>,
    args: &[pgrx::datum::DatumWithOid<'_>],
) -> Result<pgrx::spi::SpiTupleTable<'conn>, pgrx::spi::Error> {
    let types: Vec<pgrx::PgOid> = args.iter().map(|a| pgrx::PgOid::from(a.oid())).collect();
    let plan = saved_plan(client, sql, &types, true)?;
    client.update(&*plan, limit, args)
}

/// A `jsonb` value in PostgreSQL's binary form: the bytes of the datum [`JsonbDatum`] made, kept so
/// that the same value can be returned again with a copy instead of a conversion (serialising
/// to text and parsing it again cost more than the rest of Gate A's answer).
#[derive(Clone)]
pub struct JsonbBytes(std::rc::Rc<[u8]>);

impl JsonbBytes {
    pub fn new(value: &serde_json::Value) -> JsonbBytes {
        let datum = JsonbDatum::from_value(value)
            .into_datum()
            .expect("a jsonb value");
        unsafe {
            let ptr = datum.cast_mut_ptr::<pg_sys::varlena>();
            let len = pgrx::varsize_any(ptr);
            let bytes = std::slice::from_raw_parts(ptr as *const u8, len).into();
            pg_sys::pfree(ptr.cast());
            JsonbBytes(bytes)
        }
    }

    /// Size of the datum in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl IntoDatum for JsonbBytes {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        unsafe {
            let ptr = pg_sys::palloc(self.0.len()) as *mut u8;
            std::ptr::copy_nonoverlapping(self.0.as_ptr(), ptr, self.0.len());
            Some(pg_sys::Datum::from(ptr))
        }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

jsonb_in_sql!(JsonbBytes);

// SAFETY: returns the datum made by `into_datum` (a palloc'd `jsonb`), as `JsonB` does.
unsafe impl pgrx::callconv::BoxRet for JsonbBytes {
    unsafe fn box_into<'fcx>(
        self,
        fcinfo: &mut pgrx::callconv::FcInfo<'fcx>,
    ) -> pgrx::datum::Datum<'fcx> {
        match self.into_datum() {
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}

/// `read` of the bytes of a varlena datum, `VARSIZE` of them from its 4-byte header: detoasted
/// (a copy in the current memory context when it was toasted, compressed or had a short header,
/// freed after `read`).
///
/// # Safety
/// `datum` is a non-null varlena datum valid for the call.
pub unsafe fn with_varlena_bytes<R>(datum: pg_sys::Datum, read: impl FnOnce(&[u8]) -> R) -> R {
    // SAFETY: per the caller; `pg_detoast_datum` returns a whole value with a 4-byte header, which
    // lives until it is freed here (when it is a copy) after `read`, which cannot keep it.
    unsafe {
        let given = datum.cast_mut_ptr::<pg_sys::varlena>();
        let whole = pg_sys::pg_detoast_datum(given);
        let r = read(std::slice::from_raw_parts(
            whole.cast::<u8>(),
            pgrx::varsize_any(whole),
        ));
        if whole != given {
            pg_sys::pfree(whole.cast());
        }
        r
    }
}

/// `read` of a `text` datum's string, in place: detoasted only when toasted or compressed (a copy
/// in the current memory context, freed after `read`); `None` when it is not UTF-8. Unlike
/// pgrx's SPI `get::<&str>`, which copies the value into the parent of the current memory context
/// (see [`freeing_row_copies`]).
///
/// # Safety
/// `datum` is a non-null `text` (or other varlena string) datum valid for the call.
pub unsafe fn with_text<R>(datum: pg_sys::Datum, read: impl FnOnce(Option<&str>) -> R) -> R {
    // SAFETY: per the caller; `pg_detoast_datum_packed` returns the value itself or a copy, which
    // lives until it is freed here (when it is a copy) after `read`, which cannot keep it.
    unsafe {
        let given = datum.cast_mut_ptr::<pg_sys::varlena>();
        let whole = pg_sys::pg_detoast_datum_packed(given);
        let r = read(pgrx::varlena::text_to_rust_str(whole).ok());
        if whole != given {
            pg_sys::pfree(whole.cast());
        }
        r
    }
}

/// Run `read`, which reads SPI rows with pgrx's `get`, so that what those reads leave in
/// PostgreSQL's memory is freed when it returns. pgrx's `SpiHeapTupleData::get` and
/// `SpiTupleTable::get` convert a value in the *parent* of the current memory context: arrays
/// (`Vec<String>`), `&str` and toasted values are copied there whole (`pg_detoast_datum_copy`) and
/// never freed. Inside `Spi::connect` that parent is the transaction's context, so a walk over many
/// rows kept every copy until commit (2.3 kB per tool for the catalog's rows). Here the current
/// context is the child of a fresh context, which takes the copies and is deleted after `read`
/// (also when `read` fails). What `read` returns must own its data (Rust values, not datums).
pub fn freeing_row_copies<R>(read: impl FnOnce() -> R) -> R {
    struct Restore {
        saved: pg_sys::MemoryContext,
        copies: pg_sys::MemoryContext,
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: `saved` was current when the guard was made and outlives it (the guard
            // lives within one call); `copies` is ours, and nothing of it is kept.
            unsafe {
                pg_sys::MemoryContextSwitchTo(self.saved);
                pg_sys::MemoryContextDelete(self.copies);
            }
        }
    }
    // SAFETY: both contexts are made under the current one and deleted by the guard (or with
    // their parent, if the transaction aborts first).
    let _restore = unsafe {
        let saved = pg_sys::CurrentMemoryContext;
        let copies = memory_context(saved, c"ctxguard row copies", ContextSizes::Default);
        let rows = memory_context(copies, c"ctxguard rows", ContextSizes::Small);
        pg_sys::MemoryContextSwitchTo(rows);
        Restore { saved, copies }
    };
    read()
}

/// A `tsvector` value copied out of a row into memory of our own (8-byte aligned, with the 4-byte
/// varlena header `pg_detoast_datum` gives it), so that a cached catalog entry can hand it to
/// PostgreSQL's text-search functions ([`TsVector::matches_rank`]) without reading the row again.
#[derive(Clone)]
pub struct TsVector(std::rc::Rc<[u64]>);

impl TsVector {
    /// Size of the value in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: the buffer holds a whole varlena (copied whole by `from_polymorphic_datum`).
        unsafe { pgrx::varsize_any(self.0.as_ptr().cast()) }
    }

    /// `ts_rank(self, query)` where `self @@ query`, else `None`: the functions behind the SQL
    /// operator and function (`ts_match_vq`, `ts_rank_tt`), called directly. `query` is a
    /// `tsquery` datum valid for the call.
    pub fn matches_rank(&self, query: pg_sys::Datum) -> Option<f32> {
        let vector = pg_sys::Datum::from(self.0.as_ptr());
        // SAFETY: both datums are whole values of the functions' argument types; neither
        // function writes to its arguments (a detoasted copy would be its own).
        unsafe {
            let hit = pgrx::direct_function_call::<bool>(
                pg_sys::ts_match_vq,
                &[Some(vector), Some(query)],
            );
            if hit != Some(true) {
                return None;
            }
            pgrx::direct_function_call::<f32>(pg_sys::ts_rank_tt, &[Some(vector), Some(query)])
        }
    }
}

impl FromDatum for TsVector {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<TsVector> {
        if is_null {
            return None;
        }
        // SAFETY: the datum is a `tsvector` (the column's type), copied whole.
        let words = unsafe {
            with_varlena_bytes(datum, |bytes| {
                let mut words = vec![0u64; bytes.len().div_ceil(8)];
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    words.as_mut_ptr().cast::<u8>(),
                    bytes.len(),
                );
                words
            })
        };
        Some(TsVector(words.into()))
    }
}

impl IntoDatum for TsVector {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        let len = self.len();
        // SAFETY: a palloc'd copy of the whole value.
        unsafe {
            let ptr = pg_sys::palloc(len) as *mut u8;
            std::ptr::copy_nonoverlapping(self.0.as_ptr().cast::<u8>(), ptr, len);
            Some(pg_sys::Datum::from(ptr))
        }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::TSVECTOROID
    }
}

/// `to_tsquery('pg_catalog.english', words)` as a datum of the current memory context: the
/// configuration named with its schema (nothing on the caller's path can stand in for it).
/// `words` must be valid `to_tsquery` input (`ctxguard_core::ranking::or_query` makes it).
pub fn english_tsquery(words: &str) -> pg_sys::Datum {
    // SAFETY: `regconfigin` takes a C string and returns the configuration's oid (an ERROR if
    // it is missing); `to_tsquery_byid` takes that oid and a `text` datum, and returns a palloc'd
    // `tsquery`.
    unsafe {
        let config = pgrx::direct_function_call::<pg_sys::Oid>(
            pg_sys::regconfigin,
            &[Some(pg_sys::Datum::from(c"pg_catalog.english".as_ptr()))],
        )
        .expect("regconfigin returns an oid");
        pgrx::direct_function_call_as_datum(
            pg_sys::to_tsquery_byid,
            &[config.into_datum(), words.into_datum()],
        )
        .expect("to_tsquery returns a value")
    }
}

/// The longest string a `jsonb` value can hold (`JENTRY_OFFLENMASK`, as `jsonb_in` checks).
const JSONB_MAX_STRING: usize = 0x0FFF_FFFF;

/// `s` as a `jsonb` string pointing at its bytes (valid while `s` is), refused as `jsonb_in`
/// refuses it: holding U+0000 (SQLSTATE 22P05, `jsonb_in`'s `\u0000`), or longer than a `jsonb`
/// string may be (54000).
fn jsonb_string(s: &str) -> pg_sys::JsonbValue {
    if s.len() > JSONB_MAX_STRING {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("ctxguard: a string is longer than a jsonb string may be ({JSONB_MAX_STRING} bytes)"),
        );
    }
    if s.as_bytes().contains(&0) {
        raise(
            PgSqlErrorCode::ERRCODE_UNTRANSLATABLE_CHARACTER,
            "ctxguard: \\u0000 cannot be converted to text",
        );
    }
    pg_sys::JsonbValue {
        type_: pg_sys::jbvType::jbvString,
        val: pg_sys::JsonbValue__bindgen_ty_1 {
            string: pg_sys::JsonbValue__bindgen_ty_1__bindgen_ty_1 {
                // At most JSONB_MAX_STRING (checked above).
                len: s.len() as std::ffi::c_int,
                val: s.as_ptr() as *mut std::ffi::c_char,
            },
        },
    }
}

/// A `jsonb` datum built in PostgreSQL's binary form directly (`pushJsonbValue`), without the
/// text round trip of `JsonB` (serialise with `serde_json`, parse again with `jsonb_in`), which
/// costs more than masking a long text.
pub struct JsonbDatum(pg_sys::Datum);

impl JsonbDatum {
    /// `{"masked": {name: count, ...}, "text": text}` (`mask_text`'s result), the text given as
    /// `len` bytes in `pieces` (a masked text: [`ctxguard_core::mask::Masks::pieces`]). A text
    /// longer than a `jsonb` string may be is SQLSTATE 54000 (the message names the limit only).
    ///
    /// The datum is laid out here as `convertToJsonb` lays it out (the same bytes: a test compares
    /// it with `jsonb_in`'s), in one allocation of its final size with the text written into it
    /// once: through `pushJsonbValue` the text of a long result was copied twice more (a masked
    /// `String`, then a buffer grown by doubling), and those copies took longer than the masking.
    /// Only the small `masked` object is built by PostgreSQL and copied in as the second value.
    pub fn text_and_counts<'a, 'p>(
        len: usize,
        pieces: impl Iterator<Item = &'p str>,
        counts: impl IntoIterator<Item = (&'a str, u32)>,
    ) -> JsonbDatum {
        use pg_sys::JsonbIteratorToken::{WJB_BEGIN_OBJECT, WJB_END_OBJECT, WJB_KEY, WJB_VALUE};
        let too_long = || -> ! {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("ctxguard: the masked text is longer than a jsonb string may be ({JSONB_MAX_STRING} bytes)"),
            )
        };
        if len > JSONB_MAX_STRING {
            too_long();
        }
        // The root object's layout (keys sorted as jsonb sorts them: shorter first): the varlena
        // header, the container header, four JEntries (the keys', then the values'), the keys
        // "text" and "masked", the text, padding to 4 bytes, the `masked` object's container.
        const KEYS: &[u8] = b"textmasked";
        const TEXT_AT: usize = 4 + 4 + 4 * 4 + KEYS.len();
        // SAFETY: the counts object is built and converted by PostgreSQL (every JsonbValue pushed
        // points at a name or a palloc'd numeric that outlives the conversion); the result is
        // palloc'd at its full size and every byte of it written below, at offsets checked
        // against that size; the text's pieces hold no U+0000 (checked) and are valid UTF-8
        // (`&str`).
        unsafe {
            let mut state: *mut pg_sys::JsonbParseState = std::ptr::null_mut();
            pg_sys::pushJsonbValue(&mut state, WJB_BEGIN_OBJECT, std::ptr::null_mut());
            for (name, n) in counts {
                let mut k = jsonb_string(name);
                pg_sys::pushJsonbValue(&mut state, WJB_KEY, &mut k);
                let mut v = pg_sys::JsonbValue {
                    type_: pg_sys::jbvType::jbvNumeric,
                    val: pg_sys::JsonbValue__bindgen_ty_1 {
                        numeric: pg_sys::int64_to_numeric(i64::from(n)),
                    },
                };
                pg_sys::pushJsonbValue(&mut state, WJB_VALUE, &mut v);
            }
            let root = pg_sys::pushJsonbValue(&mut state, WJB_END_OBJECT, std::ptr::null_mut());
            let inner = pg_sys::JsonbValueToJsonb(root);
            let inner_bytes = pgrx::varlena::varsize_any_exhdr(inner.cast());
            let inner_data = pgrx::varlena::vardata_any(inner.cast()).cast::<u8>();

            let pad = (4 - (TEXT_AT + len) % 4) % 4;
            // The object's data (everything after the varlena header) must fit a JEntry's field.
            let data = (TEXT_AT - 4)
                .checked_add(len + pad + inner_bytes)
                .filter(|&d| d <= pg_sys::JENTRY_OFFLENMASK as usize)
                .unwrap_or_else(|| too_long());
            let total = 4 + data;
            let out = pg_sys::palloc(total).cast::<u8>();
            let buf = std::slice::from_raw_parts_mut(out, total);
            let word = |buf: &mut [u8], at: usize, v: u32| {
                buf[at..at + 4].copy_from_slice(&v.to_ne_bytes());
            };
            word(buf, 4, 2 | pg_sys::JB_FOBJECT);
            // Keys: the first JEntry holds its end offset (every JB_OFFSET_STRIDE'th does).
            word(buf, 8, pg_sys::JENTRY_HAS_OFF | 4);
            word(buf, 12, 6);
            // Values: the text's length; the object's length with its padding.
            word(buf, 16, len as u32);
            word(
                buf,
                20,
                pg_sys::JENTRY_ISCONTAINER | (pad + inner_bytes) as u32,
            );
            buf[24..TEXT_AT].copy_from_slice(KEYS);
            let mut at = TEXT_AT;
            for piece in pieces {
                let p = piece.as_bytes();
                // (On an ERROR here and below, the memory context frees `out` and `inner`.)
                if p.contains(&0) {
                    raise(
                        PgSqlErrorCode::ERRCODE_UNTRANSLATABLE_CHARACTER,
                        "ctxguard: \\u0000 cannot be converted to text",
                    );
                }
                let end = at + p.len();
                if end > TEXT_AT + len {
                    raise(
                        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                        "ctxguard: the masked text is longer than measured",
                    );
                }
                buf[at..end].copy_from_slice(p);
                at = end;
            }
            if at != TEXT_AT + len {
                raise(
                    PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
                    "ctxguard: the masked text is shorter than measured",
                );
            }
            buf[at..at + pad].fill(0);
            at += pad;
            buf[at..].copy_from_slice(std::slice::from_raw_parts(inner_data, inner_bytes));
            pgrx::set_varsize_4b(out.cast(), total as i32);
            pg_sys::pfree(inner.cast());
            JsonbDatum(pg_sys::Datum::from(out))
        }
    }
}

impl JsonbDatum {
    /// `value` as `jsonb`, as `jsonb_in` would make it from `value`'s text (`serde_json`'s): the
    /// same value, keys, numbers (read by `numeric_in` from the number's own text, or converted
    /// from a 64-bit integer) and refusals: a string or key holding U+0000 is SQLSTATE 22P05 (as
    /// `jsonb_in` refuses `\u0000`), one longer than a `jsonb` string may be 54000.
    pub fn from_value(value: &serde_json::Value) -> JsonbDatum {
        use pg_sys::JsonbIteratorToken::{
            WJB_BEGIN_ARRAY, WJB_BEGIN_OBJECT, WJB_ELEM, WJB_END_ARRAY, WJB_END_OBJECT, WJB_KEY,
            WJB_VALUE,
        };
        use serde_json::Value;
        fn scalar(v: &Value) -> pg_sys::JsonbValue {
            let (type_, val) = match v {
                Value::Null => (
                    pg_sys::jbvType::jbvNull,
                    pg_sys::JsonbValue__bindgen_ty_1 { boolean: false },
                ),
                Value::Bool(b) => (
                    pg_sys::jbvType::jbvBool,
                    pg_sys::JsonbValue__bindgen_ty_1 { boolean: *b },
                ),
                Value::Number(n) => (
                    pg_sys::jbvType::jbvNumeric,
                    pg_sys::JsonbValue__bindgen_ty_1 { numeric: number(n) },
                ),
                Value::String(s) => return jsonb_string(s),
                Value::Array(_) | Value::Object(_) => unreachable!("containers are pushed"),
            };
            pg_sys::JsonbValue { type_, val }
        }
        fn number(n: &serde_json::Number) -> pg_sys::Numeric {
            if let Some(i) = n.as_i64() {
                // SAFETY: a palloc'd numeric of the integer.
                return unsafe { pg_sys::int64_to_numeric(i) };
            }
            // The number's own text (serde_json keeps it), read as `jsonb_in` reads a number.
            let text = std::ffi::CString::new(n.to_string()).expect("a JSON number has no NUL");
            // SAFETY: numeric_in of a valid JSON number's text returns a palloc'd numeric.
            unsafe {
                pgrx::fcinfo::direct_function_call_as_datum(
                    pg_sys::numeric_in,
                    &[
                        Some(pg_sys::Datum::from(text.as_ptr())),
                        Some(pg_sys::Datum::from(pg_sys::InvalidOid)),
                        Some(pg_sys::Datum::from(-1i32)),
                    ],
                )
                .expect("numeric_in returns a value")
                .cast_mut_ptr()
            }
        }
        /// Push `v` as the next value (`token`: an element or an object's value).
        ///
        /// # Safety
        /// `state` is a parse state begun by pushJsonbValue (or null at the top).
        unsafe fn push(
            state: &mut *mut pg_sys::JsonbParseState,
            token: pg_sys::JsonbIteratorToken::Type,
            v: &Value,
        ) -> *mut pg_sys::JsonbValue {
            unsafe {
                match v {
                    Value::Array(items) => {
                        pgrx::check_for_interrupts!();
                        pg_sys::pushJsonbValue(state, WJB_BEGIN_ARRAY, std::ptr::null_mut());
                        for item in items {
                            push(state, WJB_ELEM, item);
                        }
                        pg_sys::pushJsonbValue(state, WJB_END_ARRAY, std::ptr::null_mut())
                    }
                    Value::Object(members) => {
                        pgrx::check_for_interrupts!();
                        pg_sys::pushJsonbValue(state, WJB_BEGIN_OBJECT, std::ptr::null_mut());
                        for (k, item) in members {
                            let mut key = jsonb_string(k);
                            pg_sys::pushJsonbValue(state, WJB_KEY, &mut key);
                            push(state, WJB_VALUE, item);
                        }
                        pg_sys::pushJsonbValue(state, WJB_END_OBJECT, std::ptr::null_mut())
                    }
                    v => {
                        let mut jv = scalar(v);
                        pg_sys::pushJsonbValue(state, token, &mut jv)
                    }
                }
            }
        }
        // SAFETY: as in `text_and_counts`: every value pushed points at bytes of `value` or at
        // palloc'd numerics, alive until JsonbValueToJsonb has copied them; a scalar at the top is
        // pushed as `jsonb_in` pushes one, a raw-scalar array of one element.
        unsafe {
            let mut state: *mut pg_sys::JsonbParseState = std::ptr::null_mut();
            let root = match value {
                Value::Array(_) | Value::Object(_) => push(&mut state, WJB_ELEM, value),
                v => {
                    let mut scalar_array = pg_sys::JsonbValue {
                        type_: pg_sys::jbvType::jbvArray,
                        val: pg_sys::JsonbValue__bindgen_ty_1 {
                            array: pg_sys::JsonbValue__bindgen_ty_1__bindgen_ty_2 {
                                nElems: 1,
                                elems: std::ptr::null_mut(),
                                rawScalar: true,
                            },
                        },
                    };
                    pg_sys::pushJsonbValue(&mut state, WJB_BEGIN_ARRAY, &mut scalar_array);
                    push(&mut state, WJB_ELEM, v);
                    pg_sys::pushJsonbValue(&mut state, WJB_END_ARRAY, std::ptr::null_mut())
                }
            };
            JsonbDatum(pg_sys::Datum::from(pg_sys::JsonbValueToJsonb(root)))
        }
    }
}

impl From<pgrx::JsonB> for JsonbDatum {
    fn from(value: pgrx::JsonB) -> JsonbDatum {
        JsonbDatum::from_value(&value.0)
    }
}

impl IntoDatum for JsonbDatum {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(self.0)
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

jsonb_in_sql!(JsonbDatum);

// SAFETY: returns the palloc'd `jsonb` datum `JsonbValueToJsonb` made, as `JsonB` returns its own.
unsafe impl pgrx::callconv::BoxRet for JsonbDatum {
    unsafe fn box_into<'fcx>(
        self,
        fcinfo: &mut pgrx::callconv::FcInfo<'fcx>,
    ) -> pgrx::datum::Datum<'fcx> {
        unsafe { fcinfo.return_raw_datum(self.0) }
    }
}

/// A `jsonb` argument as the text `jsonb_out` makes of it, not parsed yet. pgrx's `JsonB` parses
/// that text with `serde_json` before the function runs and panics (SQLSTATE XX000) on a document
/// nested deeper than 128; this reads the same text and leaves the parse to [`jsonb_arg`], whose
/// refusals have SQLSTATEs. The SQL type is `jsonb`, as with `JsonB`.
pub struct JsonbText(pub String);

impl FromDatum for JsonbText {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<JsonbText> {
        if is_null {
            return None;
        }
        // SAFETY: the datum is a `jsonb` (the SQL type says so); `jsonb_out` detoasts it and
        // returns a palloc'd C string, copied and freed here.
        unsafe {
            let cstr = pgrx::direct_function_call::<&CStr>(pg_sys::jsonb_out, &[Some(datum)])?;
            let text = cstr.to_str().map(str::to_owned);
            pg_sys::pfree(cstr.as_ptr() as *mut std::ffi::c_void);
            Some(JsonbText(text.unwrap_or_else(|_| {
                raise(
                    PgSqlErrorCode::ERRCODE_CHARACTER_NOT_IN_REPERTOIRE,
                    "ctxguard: a jsonb argument is not valid UTF-8",
                )
            })))
        }
    }
}

arg_from_datum!(JsonbText);

jsonb_in_sql!(JsonbText);

/// A `jsonb` argument left as the caller's datum (valid for the call), for a function that reads
/// it with SQL in parts (a bulk list, element by element) rather than as one text or one parse.
pub struct JsonbArg(pub pg_sys::Datum);

impl JsonbArg {
    /// Its size in bytes before any parse or detoast (what `pg_column_size` would say uncompressed).
    pub fn raw_size(&self) -> usize {
        // SAFETY: a `jsonb` datum of the running call (the SQL type says so).
        unsafe { pg_sys::toast_raw_datum_size(self.0) }
    }

    /// As an SPI argument of type `jsonb`.
    pub fn arg(&self) -> pgrx::datum::DatumWithOid<'_> {
        // SAFETY: a `jsonb` datum, valid for as long as the call that received it.
        unsafe { pgrx::datum::DatumWithOid::new(self.0, pg_sys::JSONBOID) }
    }
}

impl FromDatum for JsonbArg {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<JsonbArg> {
        (!is_null).then_some(JsonbArg(datum))
    }
}

arg_from_datum!(JsonbArg);
jsonb_in_sql!(JsonbArg);

/// Parse a `jsonb` argument read as [`JsonbText`] (`None` stays `None`): nested deeper than
/// [`ctxguard_core::json::MAX_DEPTH`] is SQLSTATE 54000 naming `what` and the limit, never the
/// value. (`jsonb` text repeats no member and is valid JSON; anything else would be 22023.)
pub fn jsonb_arg(arg: Option<JsonbText>, what: &str) -> Option<serde_json::Value> {
    use ctxguard_core::json::{self, JsonError};
    let JsonbText(text) = arg?;
    match json::parse(text.as_bytes()) {
        Ok(v) => Some(v),
        Err(JsonError::TooDeep) => raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "ctxguard: {what} is nested more than {} levels deep",
                json::MAX_DEPTH
            ),
        ),
        Err(e) => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("ctxguard: {what}: {e}"),
        ),
    }
}

/// A required argument, or SQLSTATE 22004 naming it.
pub fn required<T>(arg: Option<T>, what: &str) -> T {
    arg.unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            format!("ctxguard: {what} must not be NULL"),
        )
    })
}
