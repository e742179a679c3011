//! The lifetimes in force for a tenant: of a generation, a pending approval and an upstream call
//! authorized by Gate B. Each is a setting (`ctxguard.generation_ttl`, `.approval_ttl`,
//! `.external_call_ttl`), overridden per tenant by `ctxguard.tenant_limits`.
//!
//! `ctxguard.effective_ttls()` tells the gateway what the database will enforce, so that it renews
//! a page view's generation before it lapses instead of guessing.

use pgrx::prelude::*;

use crate::context::Ctx;
use crate::gucs;
use crate::owner::as_owner;
use crate::pgutil::{raise, saved_plan, TEXT};

/// Lifetimes in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttls {
    pub generation: i32,
    pub approval: i32,
    pub external_call: i32,
}

/// The lifetimes for `tenant_id` (the settings where the tenant has no override).
pub fn for_tenant(tenant_id: &str) -> Ttls {
    let overrides = as_owner(|| {
        Spi::connect(|c| {
            let plan = saved_plan(
                c,
                "SELECT generation_ttl, approval_ttl, external_call_ttl
                   FROM ctxguard.tenant_limits WHERE tenant_id OPERATOR(pg_catalog.=) $1",
                &[TEXT],
                false,
            )?;
            let mut rows = c.select(&*plan, Some(1), &[tenant_id.into()])?;
            let Some(r) = rows.next() else {
                return Ok::<_, pgrx::spi::Error>([None; 3]);
            };
            Ok([r.get::<i32>(1)?, r.get::<i32>(2)?, r.get::<i32>(3)?])
        })
    })
    .unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("ctxguard: ttls: {e}"),
        )
    });
    Ttls {
        generation: overrides[0].unwrap_or_else(|| gucs::GENERATION_TTL.get()),
        approval: overrides[1].unwrap_or_else(|| gucs::APPROVAL_TTL.get()),
        external_call: overrides[2].unwrap_or_else(|| gucs::EXTERNAL_CALL_TTL.get()),
    }
}

pgrx::extension_sql_file!(
    "../sql/ttls.sql",
    name = "ttls",
    requires = ["documents", "ledger"]
);

/// The settings alone (no tenant).
fn settings() -> Ttls {
    Ttls {
        generation: gucs::GENERATION_TTL.get(),
        approval: gucs::APPROVAL_TTL.get(),
        external_call: gucs::EXTERNAL_CALL_TTL.get(),
    }
}

/// The lifetimes, in seconds, in force for the current context's tenant: of a generation minted
/// now (`begin_generation`), a pending approval and an authorized upstream call. Without a context,
/// the settings.
#[pg_extern(stable, parallel_unsafe)]
fn effective_ttls() -> TableIterator<
    'static,
    (
        name!(generation_ttl, i32),
        name!(approval_ttl, i32),
        name!(external_call_ttl, i32),
    ),
> {
    let _pin = crate::owner::pin();
    let t = match Ctx::current() {
        Some(ctx) => for_tenant(&ctx.tenant_id),
        None => settings(),
    };
    TableIterator::once((t.generation, t.approval, t.external_call))
}
