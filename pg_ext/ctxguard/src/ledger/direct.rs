//! The writer's audit rows without a statement: formed from the queued records and inserted through
//! the executor's single-row path (`ExecSimpleRelationInsert`, as logical replication's apply
//! worker inserts), which checks the table's constraints, evaluates its column defaults (the
//! identity `id`) and maintains its indexes.
//!
//! Why: at 4 clients the audit `INSERT` was the largest cost a call adds (its plan's start-up, the
//! batch as `jsonb`, parsed again by `jsonb_to_recordset`, and sorted): a sixth of the CPU time of
//! a whole read-only ctxguard transaction.
//!
//! Only for the table as ctxguard creates it: a plain table (not partitioned) with no triggers and
//! no rules, whose columns have the types ctxguard gives them. Anything else a DBA made of it
//! (a trigger forwarding rows, a partitioned table, a changed column type) takes the statement,
//! which honours all of it. Either way the rows are the same, in the batch's order. Row security
//! policies are not evaluated here: the writer is the table's owner, and the policy ctxguard
//! creates for it (`audit_owner_insert`) passes every row.

use std::ffi::CStr;

use pgrx::pg_sys;
use pgrx::prelude::*;
use serde_json::Value;

/// How a column's value is formed from a queued record's field.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Uuid,
    Text,
    Int4,
    Jsonb,
    /// Microseconds since 2000-01-01 (PostgreSQL's own `timestamptz`).
    Timestamptz,
}

/// The columns ctxguard writes: (column, the record's field, kind).
const COLUMNS: [(&CStr, &str, Kind); 20] = [
    (c"at", "at_us", Kind::Timestamptz),
    (c"call_id", "call_id", Kind::Uuid),
    (c"tenant_id", "tenant_id", Kind::Text),
    (c"user_id", "user_id", Kind::Text),
    (c"page_type", "page_type", Kind::Text),
    (c"entity_type", "entity_type", Kind::Text),
    (c"entity_id", "entity_id", Kind::Text),
    (c"tool", "tool", Kind::Text),
    (c"decision", "decision", Kind::Text),
    (c"code", "code", Kind::Text),
    (c"args_hash", "args_hash", Kind::Text),
    (c"result_bytes", "result_bytes", Kind::Int4),
    (c"generation", "generation", Kind::Uuid),
    (c"trace_id", "trace_id", Kind::Text),
    (c"doc_id", "doc_id", Kind::Text),
    (c"tokens", "tokens", Kind::Int4),
    (c"masked", "masked", Kind::Jsonb),
    (c"budget", "budget", Kind::Jsonb),
    (c"prev_hash", "prev_hash", Kind::Text),
    (c"row_hash", "row_hash", Kind::Text),
];

impl Kind {
    fn type_oid(self) -> pg_sys::Oid {
        match self {
            Kind::Uuid => pg_sys::UUIDOID,
            Kind::Text => pg_sys::TEXTOID,
            Kind::Int4 => pg_sys::INT4OID,
            Kind::Jsonb => pg_sys::JSONBOID,
            Kind::Timestamptz => pg_sys::TIMESTAMPTZOID,
        }
    }

    /// The datum for `v` (`None` for SQL NULL), as `jsonb_to_recordset` would make it; `Err` for a
    /// value it would refuse (the statement then raises the error it always did).
    fn datum(self, v: &Value) -> Result<Option<pg_sys::Datum>, ()> {
        if v.is_null() {
            return Ok(None);
        }
        Ok(match self {
            Kind::Text => match v {
                Value::String(s) => s.as_str().into_datum(),
                v => {
                    let mut t = String::new();
                    ctxguard_core::ledger::jsonb_text(v, &mut t);
                    t.into_datum()
                }
            },
            Kind::Uuid => {
                let u = v
                    .as_str()
                    .and_then(|s| uuid::Uuid::parse_str(s).ok())
                    .ok_or(())?;
                pgrx::datum::Uuid::from_bytes(*u.as_bytes()).into_datum()
            }
            Kind::Int4 => Some(pg_sys::Datum::from(
                i32::try_from(v.as_i64().ok_or(())?).map_err(|_| ())?,
            )),
            Kind::Timestamptz => Some(pg_sys::Datum::from(v.as_i64().ok_or(())?)),
            Kind::Jsonb => crate::pgutil::JsonbDatum::from_value(v).into_datum(),
        })
    }
}

/// Insert the audit rows `rows` (queued records' `a` objects with their hashes, in the batch's
/// order) into `ctxguard.audit_log`. `false`: nothing was inserted, because the table is not as
/// ctxguard creates it or a value is one the statement must judge; the caller inserts the rows
/// with the statement instead. Errors (a constraint, a full disk) are raised as the statement's
/// would be.
pub fn insert_audits(rows: &[Value]) -> bool {
    // SAFETY: the table open for the call.
    with_table(c"audit_log", |rel| {
        unsafe { insert_into(rel, rows) }.then_some(())
    })
    .is_some()
}

/// Each column's index in `attrs` (the table's attributes), in [`COLUMNS`]' order; `None` if the
/// table is not as ctxguard creates it.
unsafe fn layout(
    rel: pg_sys::Relation,
    attrs: &[&pg_sys::FormData_pg_attribute],
) -> Option<[usize; COLUMNS.len()]> {
    let plain = (*(*rel).rd_rel).relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char;
    if !plain || !(*rel).trigdesc.is_null() || !(*rel).rd_rules.is_null() {
        return None;
    }
    let mut at = [0usize; COLUMNS.len()];
    for (i, (name, _, kind)) in COLUMNS.iter().enumerate() {
        let n = attrs
            .iter()
            .position(|a| !a.attisdropped && CStr::from_ptr(a.attname.data.as_ptr()) == *name)?;
        if attrs[n].atttypid != kind.type_oid() || attrs[n].attgenerated != 0 {
            return None;
        }
        at[i] = n;
    }
    Some(at)
}

/// An executor state for single-row changes of `rel` (open, `RowExclusiveLock` held) outside a
/// plan, as logical replication's apply worker makes one: its range table, its result relation
/// with the indexes open, the current command id for what it writes.
unsafe fn single_row_estate(
    rel: pg_sys::Relation,
) -> (*mut pg_sys::EState, *mut pg_sys::ResultRelInfo) {
    let estate = pg_sys::CreateExecutorState();
    let rte = pgrx::PgBox::<pg_sys::RangeTblEntry>::alloc_node(pg_sys::NodeTag::T_RangeTblEntry)
        .into_pg();
    (*rte).rtekind = pg_sys::RTEKind::RTE_RELATION;
    (*rte).relid = (*rel).rd_id;
    (*rte).relkind = (*(*rel).rd_rel).relkind;
    (*rte).rellockmode = pg_sys::RowExclusiveLock as i32;
    crate::compat::init_range_table(estate, rte);
    let rri = pgrx::PgBox::<pg_sys::ResultRelInfo>::alloc_node(pg_sys::NodeTag::T_ResultRelInfo)
        .into_pg();
    pg_sys::InitResultRelInfo(rri, rel, 1, std::ptr::null_mut(), 0);
    install_checks(rel, rri, estate);
    (*estate).es_opened_result_relations =
        pg_sys::lappend((*estate).es_opened_result_relations, rri.cast());
    (*estate).es_output_cid = pg_sys::GetCurrentCommandId(true);
    pg_sys::ExecOpenIndices(rri, false);
    (estate, rri)
}

/// CHECK constraints parsed and planned once per process, by their stored node text (`ccbin`):
/// every batch has an executor state of its own, and the executor would parse and plan the
/// table's CHECK constraints again for each (`ExecRelCheck`: `stringToNode`, then
/// `expression_planner`), about a twelfth of the writer's time per call. Only the planned tree is
/// kept; each batch compiles it into its own executor state (`ExecInitExpr`), so nothing the
/// executor allocates per query outlives its query, and a domain's constraints are read anew.
struct Checks {
    cx: pg_sys::MemoryContext,
    /// The planned tree's address (in `cx`), or 0 for a constraint not to keep ([`keepable`]).
    by_text: std::collections::HashMap<Vec<u8>, usize>,
}

thread_local! {
    static CHECKS: std::cell::RefCell<Checks> = std::cell::RefCell::new(Checks {
        cx: std::ptr::null_mut(),
        by_text: std::collections::HashMap::new(),
    });
}

/// Planned constraints kept at most (a DBA's changes add texts; past this all are dropped).
const MAX_CHECKS: usize = 32;

/// Whether a constraint's planned tree may be kept across transactions: it calls only built-in
/// functions (every `funcid` of its node text below `FirstNormalObjectId`), all immutable. A
/// DBA's function could be replaced under the same name (and planning may inline it); a built-in
/// one cannot.
///
/// # Safety
/// `node` is the constraint's node tree, `text` its node text.
unsafe fn keepable(text: &[u8], node: *mut pg_sys::Node) -> bool {
    let text = String::from_utf8_lossy(text);
    let builtin = text.split("funcid ").skip(1).all(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse::<u32>()
            .is_ok_and(|oid| oid < pg_sys::FirstNormalObjectId)
    });
    builtin && !pg_sys::contain_mutable_functions(node)
}

/// Give `rri` its CHECK constraints compiled for `estate` from planned trees kept from an earlier
/// batch, or parsed and planned now and kept (as the executor does: `stringToNode`, then
/// `expression_planner`; parsed and planned in the batch's memory and copied into the kept
/// context only once that succeeded), so that `ExecConstraints` evaluates them without parsing and
/// planning them. Left to the executor (which does all of it per executor state): a table with a
/// generated column (PostgreSQL 18 expands virtual ones into the constraints), and a constraint
/// calling a function that is not built in and immutable ([`keepable`]).
///
/// # Safety
/// `rel` is open and `rri` was just initialised for it in `estate`.
unsafe fn install_checks(
    rel: pg_sys::Relation,
    rri: *mut pg_sys::ResultRelInfo,
    estate: *mut pg_sys::EState,
) {
    let desc = (*rel).rd_att;
    let constr = (*desc).constr;
    if constr.is_null() || (*constr).num_check == 0 {
        return;
    }
    let tupdesc = pgrx::PgTupleDesc::from_pg_unchecked(desc);
    if tupdesc
        .iter()
        .any(|a| !a.attisdropped && a.attgenerated != 0)
    {
        return;
    }
    let n = (*constr).num_check as usize;
    let checks = std::slice::from_raw_parts((*constr).check, n);
    let query_cx = (*estate).es_query_cxt;
    let trees: Option<Vec<*mut pg_sys::Expr>> = CHECKS.with(|c| {
        let mut c = c.borrow_mut();
        if c.cx.is_null() {
            c.cx = crate::pgutil::memory_context(
                pg_sys::TopMemoryContext,
                c"ctxguard writer checks",
                crate::pgutil::ContextSizes::Small,
            );
        }
        if c.by_text.len() + n > MAX_CHECKS {
            pg_sys::MemoryContextReset(c.cx);
            c.by_text.clear();
        }
        let mut trees = Vec::with_capacity(n);
        for check in checks {
            if !crate::compat::check_enforced(check) {
                trees.push(std::ptr::null_mut());
                continue;
            }
            let text = CStr::from_ptr(check.ccbin).to_bytes();
            let tree = match c.by_text.get(text) {
                Some(&t) => t as *mut pg_sys::Expr,
                None => {
                    // Parsed and planned in the batch's memory (an error frees it with the
                    // batch), then copied into the kept context.
                    let kept = pgrx::PgMemoryContexts::For(query_cx).switch_to(|_| {
                        let node = pg_sys::stringToNode(check.ccbin) as *mut pg_sys::Expr;
                        if !keepable(text, node.cast()) {
                            return std::ptr::null_mut();
                        }
                        let planned = pg_sys::expression_planner(node);
                        pgrx::PgMemoryContexts::For(c.cx)
                            .switch_to(|_| pg_sys::copyObjectImpl(planned.cast()))
                            as *mut pg_sys::Expr
                    });
                    c.by_text.insert(text.to_vec(), kept as usize);
                    kept
                }
            };
            if tree.is_null() {
                return None;
            }
            trees.push(tree);
        }
        Some(trees)
    });
    let Some(trees) = trees else {
        return;
    };
    let exprs = pgrx::PgMemoryContexts::For(query_cx).switch_to(|_| {
        let exprs = pg_sys::palloc0(n * std::mem::size_of::<*mut pg_sys::ExprState>())
            as *mut *mut pg_sys::ExprState;
        for (i, tree) in trees.into_iter().enumerate() {
            if !tree.is_null() {
                *exprs.add(i) = pg_sys::ExecInitExpr(tree, std::ptr::null_mut());
            }
        }
        exprs
    });
    crate::compat::set_check_exprs(rri, exprs);
}

/// Close the indexes, release the slots and free what [`single_row_estate`] made.
unsafe fn end_single_row_estate(estate: *mut pg_sys::EState, rri: *mut pg_sys::ResultRelInfo) {
    pg_sys::ExecCloseIndices(rri);
    pg_sys::ExecResetTupleTable((*estate).es_tupleTable, false);
    pg_sys::FreeExecutorState(estate);
}

thread_local! {
    /// The identity column's sequence, by (relation, column number), kept across batches:
    /// `build_column_default` looks it up in `pg_depend` for every executor state
    /// (`getIdentitySequence`), a tenth of the writer's time per record at one record a batch.
    /// Dropped when the relation's cache entry is invalidated (any `ALTER TABLE` of it, which an
    /// identity's change is, or a reset of every cache): [`forget_identity`], registered by
    /// [`watch_identity`].
    static IDENTITY: std::cell::Cell<Option<(pg_sys::Oid, i32, pg_sys::Oid)>> =
        const { std::cell::Cell::new(None) };
    static IDENTITY_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Keep identity sequences from now on ([`IDENTITY`]), forgotten on the relation's invalidation:
/// registered once, when the writer starts (should other libraries have taken every relcache
/// callback slot, the writer then stops at once, not at its first row).
pub fn watch_identity() {
    if !IDENTITY_CALLBACK.with(std::cell::Cell::get) {
        // SAFETY: a callback for the life of the process, as PostgreSQL's own caches register.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(forget_identity), pg_sys::Datum::from(0))
        };
        IDENTITY_CALLBACK.with(|c| c.set(true));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn forget_identity(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    IDENTITY.with(|c| {
        if c.get()
            .is_some_and(|(r, _, _)| relid == pg_sys::InvalidOid || relid == r)
        {
            c.set(None);
        }
    });
}

/// Column `attnum`'s default as `build_column_default` makes it, an identity's from its kept
/// sequence ([`IDENTITY`]): the same `NextValueExpr` (`seqid`, the column's type).
///
/// # Safety
/// `rel` is open; `a` is its attribute `attnum`.
unsafe fn column_default(
    rel: pg_sys::Relation,
    a: &pg_sys::FormData_pg_attribute,
    attnum: i32,
) -> *mut pg_sys::Node {
    let relid = (*rel).rd_id;
    if a.attidentity != 0 {
        if let Some((_, _, seqid)) = IDENTITY
            .with(std::cell::Cell::get)
            .filter(|&(r, n, _)| r == relid && n == attnum)
        {
            let mut nve =
                pgrx::PgBox::<pg_sys::NextValueExpr>::alloc_node(pg_sys::NodeTag::T_NextValueExpr);
            nve.seqid = seqid;
            nve.typeId = a.atttypid;
            return nve.into_pg().cast();
        }
    }
    let expr = pg_sys::build_column_default(rel, attnum);
    // Kept only where the invalidation callback is registered (the writer).
    if a.attidentity != 0
        && !expr.is_null()
        && (*expr).type_ == pg_sys::NodeTag::T_NextValueExpr
        && IDENTITY_CALLBACK.with(std::cell::Cell::get)
    {
        let seqid = (*expr.cast::<pg_sys::NextValueExpr>()).seqid;
        IDENTITY.with(|c| c.set(Some((relid, attnum, seqid))));
    }
    expr
}

unsafe fn insert_into(rel: pg_sys::Relation, rows: &[Value]) -> bool {
    let desc = (*rel).rd_att;
    let tupdesc = pgrx::PgTupleDesc::from_pg_unchecked(desc);
    let attrs: Vec<&pg_sys::FormData_pg_attribute> = tupdesc.iter().collect();
    let Some(layout) = layout(rel, &attrs) else {
        return false;
    };
    // Every value first: a value the statement must judge sends the whole batch there.
    let mut values: Vec<[Option<pg_sys::Datum>; COLUMNS.len()]> = Vec::with_capacity(rows.len());
    for row in rows {
        let mut v = [None; COLUMNS.len()];
        for (i, (_, field, kind)) in COLUMNS.iter().enumerate() {
            match kind.datum(&row[*field]) {
                Ok(d) => v[i] = d,
                Err(()) => return false,
            }
        }
        values.push(v);
    }

    let natts = attrs.len();
    let (estate, rri) = single_row_estate(rel);

    // The defaults of the columns ctxguard does not write (the identity `id`, and any column a
    // DBA added with a default), as an INSERT naming only ctxguard's columns would fill them.
    let mut defaults = Vec::new();
    for (n, a) in attrs.iter().enumerate() {
        if layout.contains(&n) || a.attisdropped || a.attgenerated != 0 {
            continue;
        }
        let expr = column_default(rel, a, n as i32 + 1);
        if !expr.is_null() {
            defaults.push((n, pg_sys::ExecPrepareExpr(expr.cast(), estate)));
        }
    }

    let slot = pg_sys::ExecInitExtraTupleSlot(estate, desc, &pg_sys::TTSOpsVirtual);
    let econtext = pg_sys::MakePerTupleExprContext(estate);
    for v in &values {
        pgrx::check_for_interrupts!();
        pg_sys::ExecClearTuple(slot);
        let datums = std::slice::from_raw_parts_mut((*slot).tts_values, natts);
        let nulls = std::slice::from_raw_parts_mut((*slot).tts_isnull, natts);
        nulls.fill(true);
        for (i, &n) in layout.iter().enumerate() {
            if let Some(d) = v[i] {
                datums[n] = d;
                nulls[n] = false;
            }
        }
        for &(n, state) in &defaults {
            let mut isnull = false;
            datums[n] = pg_sys::ExecEvalExprSwitchContext(state, econtext, &mut isnull);
            nulls[n] = isnull;
        }
        pg_sys::ExecStoreVirtualTuple(slot);
        pg_sys::ExecSimpleRelationInsert(rri, estate, slot);
        pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
    }

    end_single_row_estate(estate, rri);
    true
}

/// A column of a counter table: its name and type.
pub type CounterColumn = (&'static CStr, pg_sys::Oid);

/// Rows of a counter table (`user_day_usage`, `quota_usage`, `document_calls`) as the writer's
/// statement would upsert them (`INSERT … ON CONFLICT (key) DO UPDATE SET counter =
/// GREATEST(old, new)`), without a statement: each row's key looked up in the primary key
/// (`RelationFindReplTupleByIndex`, as logical replication's apply worker finds a row), then
/// updated when the new counter is larger (`ExecSimpleRelationUpdate`) or inserted when the key is
/// new. `columns` are the primary key's `nkeys` columns in its order, then the columns written only
/// when a row is inserted, then the counter (an `int4` or `int8`); each row's datums in that order.
///
/// `None`: nothing was written, because the table is not as ctxguard creates it (other columns, a
/// trigger or a rule, another primary key, not a plain table); the caller uses the statement,
/// which honours all of it. A foreign key's own triggers are as ctxguard creates the table: they
/// fire as the statement's would ([`plain_table`]). `Some(flags)`: every row written, each flag
/// true when its key was new. Errors (a constraint, a full disk) are raised as the statement's
/// would be. The writer is the only process writing these tables (no role is granted them), so
/// the lookup never races another writer; a DBA's concurrent change is waited for by the row lock,
/// as the statement would.
pub fn upsert_counters(
    table: &CStr,
    columns: &[CounterColumn],
    nkeys: usize,
    rows: &[Vec<pg_sys::Datum>],
) -> Option<Vec<bool>> {
    if nkeys == 0 || nkeys >= columns.len() {
        return None;
    }
    // SAFETY: the table open for the call.
    with_table(table, |rel| unsafe {
        upsert_into(rel, columns, nkeys, rows)
    })
}

/// Rows of a table whose columns are all its primary key (`document_coverage`) as the writer's
/// statement would insert them (`INSERT … ON CONFLICT DO NOTHING`), without a statement: each key
/// looked for in the primary key as that statement's pre-check looks ([`key_present`]: nothing is
/// locked or written for a row found), and inserted when absent. A table with another unique index
/// or an exclusion constraint takes the statement (`DO NOTHING` skips a conflict on any of them;
/// the single-row insert would raise it). `None` and `Some(flags)` as for [`upsert_counters`].
pub fn insert_absent(
    table: &CStr,
    columns: &[CounterColumn],
    rows: &[Vec<pg_sys::Datum>],
) -> Option<Vec<bool>> {
    if columns.is_empty() {
        return None;
    }
    // SAFETY: the table open for the call.
    with_table(table, |rel| unsafe {
        if !only_unique_index_is_key(rel) {
            return None;
        }
        upsert_into(rel, columns, columns.len(), rows)
    })
}

/// Whether `rel`'s primary key is its only unique index and it has no exclusion constraint.
unsafe fn only_unique_index_is_key(rel: pg_sys::Relation) -> bool {
    let pk = crate::compat::primary_key_index(rel);
    let list = pg_sys::RelationGetIndexList(rel);
    let oids: Vec<pg_sys::Oid> = if list.is_null() {
        Vec::new()
    } else {
        (0..(*list).length as usize)
            .map(|i| (*(*list).elements.add(i)).oid_value)
            .collect()
    };
    pg_sys::list_free(list);
    oids.into_iter().filter(|&o| o != pk).all(|o| {
        let idx = pg_sys::index_open(o, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let form = (*idx).rd_index;
        let other = form.is_null() || (*form).indisunique || (*form).indisexclusion;
        pg_sys::index_close(idx, pg_sys::NoLock as pg_sys::LOCKMODE);
        !other
    })
}

/// Equality scan keys for the first `n` columns of the index `idx` (their values set per lookup by
/// [`key_present`]): each column's equality operator from its operator family, compared under the
/// index column's collation (as `build_replindex_scan_key` makes them).
unsafe fn equality_keys(idx: pg_sys::Relation, n: usize) -> Vec<pg_sys::ScanKeyData> {
    (0..n)
        .map(|i| {
            let family = *(*idx).rd_opfamily.add(i);
            let input = *(*idx).rd_opcintype.add(i);
            let op = pg_sys::get_opfamily_member(
                family,
                input,
                input,
                pg_sys::BTEqualStrategyNumber as i16,
            );
            if op == pg_sys::InvalidOid {
                pgrx::error!("ctxguard: no equality operator for an index column");
            }
            let mut k: pg_sys::ScanKeyData = std::mem::zeroed();
            pg_sys::ScanKeyInit(
                &mut k,
                (i + 1) as pg_sys::AttrNumber,
                pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::get_opcode(op),
                pg_sys::Datum::from(0),
            );
            k.sk_collation = *(*idx).rd_indcollation.add(i);
            k
        })
        .collect()
}

/// Whether a row with the key `key` (the datums of the unique index `idx`'s key columns, in its
/// order; `keys` from [`equality_keys`]) is in `rel`, found as the pre-check of `INSERT … ON
/// CONFLICT` finds one: with a dirty snapshot, so any row not deleted counts, committed or not, this
/// transaction's own included; a row another transaction is inserting or deleting is waited for,
/// then looked for again. Nothing is locked. `slot` is a slot of `rel`'s.
unsafe fn key_present(
    rel: pg_sys::Relation,
    idx: pg_sys::Relation,
    keys: &mut [pg_sys::ScanKeyData],
    key: &[pg_sys::Datum],
    slot: *mut pg_sys::TupleTableSlot,
) -> bool {
    for (k, &value) in keys.iter_mut().zip(key) {
        k.sk_argument = value;
    }
    let mut snap: pg_sys::SnapshotData = std::mem::zeroed();
    snap.snapshot_type = pg_sys::SnapshotType::SNAPSHOT_DIRTY;
    let found = loop {
        let scan = crate::compat::index_beginscan(rel, idx, &mut snap, keys.len() as i32);
        pg_sys::index_rescan(
            scan,
            keys.as_mut_ptr(),
            keys.len() as i32,
            std::ptr::null_mut(),
            0,
        );
        let mut wait = pg_sys::TransactionId::INVALID;
        let hit =
            pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
        if hit {
            // The dirty snapshot names a transaction still inserting (xmin) or deleting (xmax) it.
            wait = if snap.xmin != pg_sys::TransactionId::INVALID {
                snap.xmin
            } else {
                snap.xmax
            };
        }
        pg_sys::index_endscan(scan);
        if wait == pg_sys::TransactionId::INVALID {
            break hit;
        }
        pg_sys::XactLockTableWait(
            wait,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            pg_sys::XLTW_Oper::XLTW_None,
        );
        pgrx::check_for_interrupts!();
    };
    pg_sys::ExecClearTuple(slot);
    found
}

/// `f` of ctxguard's table `table`, found by name in the catalogs (not through `search_path`) and
/// opened with `RowExclusiveLock`, which is kept to the end of the transaction as a statement's
/// would be; `None` when there is no such table.
fn with_table<R>(table: &CStr, f: impl FnOnce(pg_sys::Relation) -> Option<R>) -> Option<R> {
    // SAFETY: catalog lookups and a table opened and closed around `f`.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"ctxguard".as_ptr(), false);
        let relid = pg_sys::get_relname_relid(table.as_ptr(), schema);
        if relid == pg_sys::InvalidOid {
            return None;
        }
        let rel = pg_sys::table_open(relid, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        let done = f(rel);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        done
    }
}

/// Whether `rel` is a plain table without rules whose only triggers are its foreign keys' own
/// (PostgreSQL's internal RI triggers: a referencing row is checked when it is inserted, a
/// referenced row's references when its key changes, which no counter write does). Any other
/// trigger, and a rule, are a DBA's: the statement honours them.
unsafe fn plain_table(rel: pg_sys::Relation) -> bool {
    let plain = (*(*rel).rd_rel).relkind == pg_sys::RELKIND_RELATION as std::ffi::c_char;
    if !plain || !(*rel).rd_rules.is_null() {
        return false;
    }
    let td = (*rel).trigdesc;
    td.is_null()
        || std::slice::from_raw_parts((*td).triggers, (*td).numtriggers as usize)
            .iter()
            .all(|t| {
                t.tgisinternal
                    && pg_sys::RI_FKey_trigger_type(t.tgfoid) != pg_sys::RI_TRIGGER_NONE as i32
            })
}

/// Each column's attribute number (1-based) when `rel` is a [`plain_table`] of exactly `columns`
/// (no other live column when `exact`) with the first `nkeys` as its primary key, in order, and no
/// other index as its replica identity; and the key's index.
unsafe fn counter_layout(
    rel: pg_sys::Relation,
    columns: &[CounterColumn],
    nkeys: usize,
    exact: bool,
) -> Option<(Vec<usize>, pg_sys::Oid)> {
    if !plain_table(rel) || nkeys == 0 || nkeys > columns.len() {
        return None;
    }
    let tupdesc = pgrx::PgTupleDesc::from_pg_unchecked((*rel).rd_att);
    let attrs: Vec<&pg_sys::FormData_pg_attribute> = tupdesc.iter().collect();
    if exact && attrs.iter().filter(|a| !a.attisdropped).count() != columns.len() {
        return None;
    }
    let mut at = Vec::with_capacity(columns.len());
    for c in columns {
        let n = attrs
            .iter()
            .position(|a| !a.attisdropped && CStr::from_ptr(a.attname.data.as_ptr()) == c.0)?;
        if attrs[n].atttypid != c.1 || attrs[n].attgenerated != 0 {
            return None;
        }
        at.push(n + 1);
    }
    // A key compared under a nondeterministic collation (one where different strings are equal)
    // could name one row with two keys the writer tells apart: the statement's to judge.
    let deterministic = |coll: pg_sys::Oid| {
        coll == pg_sys::InvalidOid || pg_sys::get_collation_isdeterministic(coll)
    };
    if !at[..nkeys]
        .iter()
        .all(|&a| deterministic(attrs[a - 1].attcollation))
    {
        return None;
    }
    let pk = crate::compat::primary_key_index(rel);
    if pk == pg_sys::InvalidOid {
        return None;
    }
    let idx = pg_sys::index_open(pk, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let form = (*idx).rd_index;
    let same = !form.is_null()
        && (*idx).rd_indexprs.is_null()
        && (0..nkeys).all(|i| deterministic(*(*idx).rd_indcollation.add(i)))
        && (*form).indnatts as usize == nkeys
        && (*form).indnkeyatts as usize == nkeys
        && (*form)
            .indkey
            .values
            .as_slice(nkeys)
            .iter()
            .zip(&at[..nkeys])
            .all(|(k, a)| *k as usize == *a);
    pg_sys::index_close(idx, pg_sys::NoLock as pg_sys::LOCKMODE);
    // From PostgreSQL 16 `RelationFindReplTupleByIndex` trusts the key alone only in the replica
    // identity's index (or the primary key when there is none): with `REPLICA IDENTITY USING
    // INDEX` another index, it compares whole rows with the key-only search row, and finds none.
    let replica = pg_sys::RelationGetReplicaIndex(rel);
    let identity = replica == pg_sys::InvalidOid || replica == pk;
    (same && identity).then_some((at, pk))
}

/// An executor state for single-row changes of `rel` ([`single_row_estate`]) inside a query's
/// after-trigger scope when the table has (foreign-key) triggers: they are queued by the changes
/// and fire at [`end_changes`], as at the end of a statement.
unsafe fn begin_changes(
    rel: pg_sys::Relation,
) -> (*mut pg_sys::EState, *mut pg_sys::ResultRelInfo) {
    let (estate, rri) = single_row_estate(rel);
    if !(*rel).trigdesc.is_null() {
        pg_sys::AfterTriggerBeginQuery();
    }
    (estate, rri)
}

/// The slots of a change by key in `estate`: the key to look for, the row found, the row written.
unsafe fn change_slots(
    rel: pg_sys::Relation,
    estate: *mut pg_sys::EState,
) -> (
    *mut pg_sys::TupleTableSlot,
    *mut pg_sys::TupleTableSlot,
    *mut pg_sys::TupleTableSlot,
) {
    let desc = (*rel).rd_att;
    (
        pg_sys::ExecInitExtraTupleSlot(estate, desc, &pg_sys::TTSOpsVirtual),
        pg_sys::table_slot_create(rel, &mut (*estate).es_tupleTable),
        pg_sys::ExecInitExtraTupleSlot(estate, desc, &pg_sys::TTSOpsVirtual),
    )
}

/// Fire what [`begin_changes`]' changes queued, free the executor state, and make the changes
/// visible to the next command.
unsafe fn end_changes(
    rel: pg_sys::Relation,
    estate: *mut pg_sys::EState,
    rri: *mut pg_sys::ResultRelInfo,
) {
    if !(*rel).trigdesc.is_null() {
        pg_sys::AfterTriggerEndQuery(estate);
    }
    end_single_row_estate(estate, rri);
    pg_sys::CommandCounterIncrement();
}

unsafe fn upsert_into(
    rel: pg_sys::Relation,
    columns: &[CounterColumn],
    nkeys: usize,
    rows: &[Vec<pg_sys::Datum>],
) -> Option<Vec<bool>> {
    let (at, pk) = counter_layout(rel, columns, nkeys, true)?;
    // No counter: every column is the key (a row found is left as it is).
    let key_only = nkeys == columns.len();
    let counter = columns.len() - 1;
    let wide = match columns[counter].1 {
        _ if key_only => false,
        pg_sys::INT8OID => true,
        pg_sys::INT4OID => false,
        _ => return None,
    };
    let desc = (*rel).rd_att;
    let natts = (*desc).natts as usize;

    let (estate, rri) = begin_changes(rel);
    let (search, found_slot, new) = change_slots(rel, estate);
    let value = |d: pg_sys::Datum| {
        if wide {
            d.value() as i64
        } else {
            i64::from(d.value() as i32)
        }
    };
    // Key-only rows are looked for through the primary key directly (`key_present`).
    let mut probe = key_only.then(|| {
        let idx = pg_sys::index_open(pk, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        (idx, equality_keys(idx, nkeys))
    });
    let mut inserted = Vec::with_capacity(rows.len());
    for row in rows {
        pgrx::check_for_interrupts!();
        if let Some((idx, keys)) = probe.as_mut() {
            // A row found is left as it is (`ON CONFLICT DO NOTHING`), without a lock.
            let present = key_present(rel, *idx, keys, row, found_slot);
            if !present {
                store_row(new, natts, &at, row);
                pg_sys::ExecSimpleRelationInsert(rri, estate, new);
            }
            inserted.push(!present);
            continue;
        }
        // The key alone (the counter NULL: the lookup reads only the key's columns).
        store_row(search, natts, &at[..nkeys], row);
        let found = pg_sys::RelationFindReplTupleByIndex(
            rel,
            pk,
            pg_sys::LockTupleMode::LockTupleExclusive,
            search,
            found_slot,
        );
        if found {
            pg_sys::ExecClearTuple(new);
            let datums = std::slice::from_raw_parts_mut((*new).tts_values, natts);
            let nulls = std::slice::from_raw_parts_mut((*new).tts_isnull, natts);
            pg_sys::slot_getallattrs(found_slot);
            let old = std::slice::from_raw_parts((*found_slot).tts_values, natts);
            let old_nulls = std::slice::from_raw_parts((*found_slot).tts_isnull, natts);
            let c = at[counter] - 1;
            // GREATEST(old, new): a NULL old counter (NOT NULL forbids it) is replaced.
            if !old_nulls[c] && value(old[c]) >= value(row[counter]) {
                inserted.push(false);
                continue;
            }
            datums.copy_from_slice(old);
            nulls.copy_from_slice(old_nulls);
            datums[c] = row[counter];
            nulls[c] = false;
            pg_sys::ExecStoreVirtualTuple(new);
            pg_sys::ExecSimpleRelationUpdate(rri, estate, std::ptr::null_mut(), found_slot, new);
            inserted.push(false);
        } else {
            store_row(new, natts, &at, row);
            pg_sys::ExecSimpleRelationInsert(rri, estate, new);
            inserted.push(true);
        }
    }

    if let Some((idx, _)) = probe {
        pg_sys::index_close(idx, pg_sys::NoLock as pg_sys::LOCKMODE);
    }
    end_changes(rel, estate, rri);
    Some(inserted)
}

/// Store in the virtual slot `slot` (of `natts` columns) the row whose columns `at` (attribute
/// numbers) are `values`, the other columns NULL.
unsafe fn store_row(
    slot: *mut pg_sys::TupleTableSlot,
    natts: usize,
    at: &[usize],
    values: &[pg_sys::Datum],
) {
    pg_sys::ExecClearTuple(slot);
    let datums = std::slice::from_raw_parts_mut((*slot).tts_values, natts);
    let nulls = std::slice::from_raw_parts_mut((*slot).tts_isnull, natts);
    nulls.fill(true);
    for (&a, &v) in at.iter().zip(values) {
        datums[a - 1] = v;
        nulls[a - 1] = false;
    }
    pg_sys::ExecStoreVirtualTuple(slot);
}

/// What [`touch_rows`] does to a row found by its key.
#[derive(Clone, Copy)]
pub enum Touch {
    /// Lock it `FOR KEY SHARE`: rows referencing it are written next, and it cannot be deleted
    /// before the transaction ends (the foreign key's own check takes the same lock).
    KeyShare,
    /// Raise its counter to this value when that is larger, as `UPDATE … SET counter = v WHERE
    /// key = k AND counter < v` would (the row locked `FOR NO KEY UPDATE` either way).
    Raise(pg_sys::Datum),
}

/// Rows of `table` found by their primary key (`key`, one `uuid` column), each locked or its
/// `counter` (an `int8`) raised ([`Touch`]), without a statement; no row is inserted. The table's
/// other columns are left as they are. `Some(found)`: a flag per row, false when no row with its
/// key is visible (nothing done for it). `None`: nothing done, because the table is not as
/// ctxguard creates it (see [`upsert_counters`]).
///
/// Unlike the counter tables, other processes insert these rows (a generation is minted by its
/// caller's `set_context`), so a row is first looked for with an MVCC snapshot, as the
/// statement's would be: a row whose inserting transaction is still open is not visible, and is
/// not waited for (`RelationFindReplTupleByIndex` reads with a dirty snapshot and would wait for
/// that transaction, whose caller may be waiting for this batch). Only a visible row is then
/// locked, which waits, as the statement's lock would, for a transaction changing it.
pub fn touch_rows(
    table: &CStr,
    key: CounterColumn,
    counter: CounterColumn,
    rows: &[(pg_sys::Datum, Touch)],
) -> Option<Vec<bool>> {
    // SAFETY: the table open for the call.
    with_table(table, |rel| unsafe { touch_in(rel, key, counter, rows) })
}

unsafe fn touch_in(
    rel: pg_sys::Relation,
    key: CounterColumn,
    counter: CounterColumn,
    rows: &[(pg_sys::Datum, Touch)],
) -> Option<Vec<bool>> {
    let (at, pk) = counter_layout(rel, &[key, counter], 1, false)?;
    if key.1 != pg_sys::UUIDOID || counter.1 != pg_sys::INT8OID {
        return None;
    }
    let c = at[1] - 1;
    let desc = (*rel).rd_att;
    let natts = (*desc).natts as usize;

    let (estate, rri) = begin_changes(rel);
    let (search, found_slot, new) = change_slots(rel, estate);
    let mut found = Vec::with_capacity(rows.len());
    for &(value, touch) in rows {
        pgrx::check_for_interrupts!();
        if !visible(rel, pk, at[0], value) {
            found.push(false);
            continue;
        }
        store_row(search, natts, &at[..1], &[value]);
        let mode = match touch {
            Touch::KeyShare => pg_sys::LockTupleMode::LockTupleKeyShare,
            Touch::Raise(_) => pg_sys::LockTupleMode::LockTupleNoKeyExclusive,
        };
        if !pg_sys::RelationFindReplTupleByIndex(rel, pk, mode, search, found_slot) {
            found.push(false);
            continue;
        }
        found.push(true);
        let Touch::Raise(v) = touch else { continue };
        pg_sys::slot_getallattrs(found_slot);
        let old = std::slice::from_raw_parts((*found_slot).tts_values, natts);
        let old_nulls = std::slice::from_raw_parts((*found_slot).tts_isnull, natts);
        // `counter < v` is not true of a NULL counter (NOT NULL forbids it): left as it is.
        if old_nulls[c] || old[c].value() as i64 >= v.value() as i64 {
            continue;
        }
        pg_sys::ExecClearTuple(new);
        let datums = std::slice::from_raw_parts_mut((*new).tts_values, natts);
        let nulls = std::slice::from_raw_parts_mut((*new).tts_isnull, natts);
        datums.copy_from_slice(old);
        nulls.copy_from_slice(old_nulls);
        datums[c] = v;
        pg_sys::ExecStoreVirtualTuple(new);
        pg_sys::ExecSimpleRelationUpdate(rri, estate, std::ptr::null_mut(), found_slot, new);
    }

    end_changes(rel, estate, rri);
    Some(found)
}

/// Whether a row of `rel` whose `uuid` column `attno` (the key of index `index`) is `value` is
/// visible to a snapshot taken now.
unsafe fn visible(
    rel: pg_sys::Relation,
    index: pg_sys::Oid,
    attno: usize,
    value: pg_sys::Datum,
) -> bool {
    let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
    pg_sys::ScanKeyInit(
        &mut key,
        attno as pg_sys::AttrNumber,
        pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
        pg_sys::Oid::from(pg_sys::F_UUID_EQ),
        value,
    );
    // Active for the scan (a snapshot a scan reads must be registered or active).
    pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot());
    let scan =
        pg_sys::systable_beginscan(rel, index, true, pg_sys::GetActiveSnapshot(), 1, &mut key);
    let found = !pg_sys::systable_getnext(scan).is_null();
    pg_sys::systable_endscan(scan);
    pg_sys::PopActiveSnapshot();
    found
}
