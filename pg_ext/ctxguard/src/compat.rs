//! What differs between the PostgreSQL majors ctxguard builds for, and the only place with
//! `#[cfg(feature = "pgNN")]`.
//!
//! One build per major: 15 (the default feature), 16, 17 or 18 (`--no-default-features --features
//! pgNN`, which `cargo pgrx install --pg-config` picks from the pg_config's major). Policy logic
//! never names a major: it calls these.

use pgrx::pg_sys;

#[cfg(not(any(feature = "pg15", feature = "pg16", feature = "pg17", feature = "pg18")))]
compile_error!("build ctxguard for one PostgreSQL major: feature pg15, pg16, pg17 or pg18");

/// May `role` EXECUTE the function `fn_oid`? PostgreSQL 16 replaced the per-kind ACL checks
/// (`pg_proc_aclcheck`) with `object_aclcheck` on the object's catalog.
pub fn may_execute_function(role: pg_sys::Oid, fn_oid: pg_sys::Oid) -> bool {
    let mode = pg_sys::ACL_EXECUTE as pg_sys::AclMode;
    #[cfg(feature = "pg15")]
    let acl = unsafe { pg_sys::pg_proc_aclcheck(fn_oid, role, mode) };
    #[cfg(not(feature = "pg15"))]
    let acl = unsafe { pg_sys::object_aclcheck(pg_sys::ProcedureRelationId, fn_oid, role, mode) };
    acl == pg_sys::AclResult::ACLCHECK_OK
}

/// Set up `fcinfo`'s call to return its rows in a tuple store (`SFRM_Materialize`), described by
/// the descriptor the caller expects. PostgreSQL 15.0 named the function `SetSingleFuncCall`;
/// 15.1 renamed it `InitMaterializedSRF` and kept the old name, which every 15.x exports.
///
/// # Safety
/// `fcinfo` is the running set-returning call's.
pub unsafe fn init_materialized_srf(fcinfo: pg_sys::FunctionCallInfo) {
    #[cfg(feature = "pg15")]
    {
        unsafe extern "C-unwind" {
            fn SetSingleFuncCall(fcinfo: pg_sys::FunctionCallInfo, flags: pg_sys::bits32);
        }
        SetSingleFuncCall(fcinfo, pg_sys::MAT_SRF_USE_EXPECTED_DESC);
    }
    #[cfg(not(feature = "pg15"))]
    pg_sys::InitMaterializedSRF(fcinfo, pg_sys::MAT_SRF_USE_EXPECTED_DESC);
}

/// This backend's local transaction id (distinct for each of its transactions until it wraps
/// around, after 2^32 of them). PostgreSQL 17 moved it into `PGPROC.vxid`.
pub fn local_xid() -> u32 {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    let lxid = unsafe { (*pg_sys::MyProc).lxid };
    #[cfg(not(any(feature = "pg15", feature = "pg16")))]
    let lxid = unsafe { (*pg_sys::MyProc).vxid.lxid };
    lxid
}

/// Give `estate` a range table of the one relation `rte` (for a single-relation insert outside
/// a plan). PostgreSQL 16 added permission infos, 18 the unpruned relations.
///
/// # Safety
/// In a transaction, with `estate` and `rte` freshly made.
pub unsafe fn init_range_table(estate: *mut pg_sys::EState, rte: *mut pg_sys::RangeTblEntry) {
    let list = pg_sys::lappend(std::ptr::null_mut(), rte.cast());
    #[cfg(feature = "pg15")]
    pg_sys::ExecInitRangeTable(estate, list);
    #[cfg(not(feature = "pg15"))]
    {
        let mut perminfos: *mut pg_sys::List = std::ptr::null_mut();
        pg_sys::addRTEPermissionInfo(&mut perminfos, rte);
        #[cfg(any(feature = "pg16", feature = "pg17"))]
        pg_sys::ExecInitRangeTable(estate, list, perminfos);
        #[cfg(not(any(feature = "pg16", feature = "pg17")))]
        pg_sys::ExecInitRangeTable(estate, list, perminfos, pg_sys::bms_make_singleton(1));
    }
}

/// The primary key index of `rel` (`InvalidOid` if none). PostgreSQL 18 added `deferrable_ok`
/// (false here: a deferrable key may hold duplicates until commit).
///
/// # Safety
/// `rel` is open.
pub unsafe fn primary_key_index(rel: pg_sys::Relation) -> pg_sys::Oid {
    #[cfg(not(feature = "pg18"))]
    let oid = pg_sys::RelationGetPrimaryKeyIndex(rel);
    #[cfg(feature = "pg18")]
    let oid = pg_sys::RelationGetPrimaryKeyIndex(rel, false);
    oid
}

/// Whether the executor enforces a CHECK constraint (PostgreSQL 18 added `NOT ENFORCED`).
pub fn check_enforced(check: &pg_sys::ConstrCheck) -> bool {
    #[cfg(feature = "pg18")]
    let enforced = check.ccenforced;
    #[cfg(not(feature = "pg18"))]
    let enforced = {
        let _ = check;
        true
    };
    enforced
}

/// Give a result relation its compiled CHECK constraints, one per `constr->check` entry (NULL for
/// one not enforced), as `ExecRelCheck` would make them (PostgreSQL 18 renamed the field).
///
/// # Safety
/// `exprs` has one entry per CHECK constraint of the relation, and lives as long as `rri` is used.
pub unsafe fn set_check_exprs(rri: *mut pg_sys::ResultRelInfo, exprs: *mut *mut pg_sys::ExprState) {
    #[cfg(feature = "pg18")]
    {
        (*rri).ri_CheckConstraintExprs = exprs;
    }
    #[cfg(not(feature = "pg18"))]
    {
        (*rri).ri_ConstraintExprs = exprs;
    }
}

/// `index_beginscan` (PostgreSQL 18 added the instrumentation argument).
///
/// # Safety
/// Both relations are open and `snapshot` outlives the scan.
pub unsafe fn index_beginscan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    nkeys: i32,
) -> pg_sys::IndexScanDesc {
    #[cfg(feature = "pg18")]
    let scan = pg_sys::index_beginscan(heap, index, snapshot, std::ptr::null_mut(), nkeys, 0);
    #[cfg(not(feature = "pg18"))]
    let scan = pg_sys::index_beginscan(heap, index, snapshot, nkeys, 0);
    scan
}
