//! Approvals: a call that needs one is recorded pending (`requires_approval`, or `approval_when`
//! true), with its bound arguments and page entity, and runs exactly once through Gate B again.
//!
//! - **Self-approval** (a policy without `approver_roles`): the requester runs it with
//!   `approve_call`, from a context on the same entity.
//! - **Four eyes** (`approver_roles`, copied into the pending row when the call is requested): a
//!   user of the same tenant holding one of those roles, never the requester, grants it
//!   (`approve_call`) or rejects it (`reject_call`), from any page; `pending_approvals()` lists what
//!   the context's user may decide, arguments masked as results are. A granted call is then run by
//!   its requester with `approve_call` from a context on its entity, so it runs under the
//!   requester's own identity, roles and budgets, exactly once. The requester may withdraw (reject)
//!   their own pending call.
//!
//! Every decision is audited under the decider (`granted`, `rejected`), with the call's id: the
//! pending row (requester), the decision (approver) and the run (requester) share it.
//! Unknown, foreign, expired, used and undecidable ids all answer `APPROVAL_INVALID` alike.

use ctxguard_core::Code;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use crate::context::Ctx;
use crate::gates::{self, Call, Outcome, Run};
use crate::handler;
use crate::masking;
use crate::owner::as_owner;
use crate::pgutil::raise;

/// Most bytes of a rejection's reason.
const MAX_REASON_BYTES: usize = 500;
/// Longest life of a pending approval, in seconds (the settings' and `tenant_limits`' bound):
/// `pending_approvals()` reads the pending calls created within it.
const MAX_APPROVAL_TTL: i32 = 86_400;
/// Most rows `pending_approvals()` returns (oldest first).
const MAX_PENDING_LISTED: i64 = 200;
/// Most calls of one user that wait for an approval at once: a user cannot push the rest of the
/// tenant's requests out of the approvers' list (its 200 oldest) on their own.
pub const MAX_PENDING_PER_USER: i64 = 50;

/// Record a call that needs an approval: its bound arguments, page entity and who may decide.
/// `false`: nothing recorded, the user has [`MAX_PENDING_PER_USER`] calls waiting already.
#[must_use]
pub fn record_pending(
    ctx: &Ctx,
    tool: &str,
    args: &Value,
    hash: &str,
    approver_roles: &[String],
    call_id: uuid::Uuid,
) -> bool {
    let approvers = (!approver_roles.is_empty()).then(|| approver_roles.to_vec());
    as_owner(|| {
        // The insert only while the user has room: one statement, so that the count and the row
        // agree within it (concurrent calls of one user may pass together, a handful at most).
        Spi::get_one_with_args::<bool>(
            "WITH room AS (
                 SELECT pg_catalog.count(*) OPERATOR(pg_catalog.<) $12 AS ok FROM ctxguard.approvals
                  WHERE tenant_id OPERATOR(pg_catalog.=) $2 AND status OPERATOR(pg_catalog.=) 'pending'
                    -- The pending index's range of the last MAX_APPROVAL_TTL ($13), as the
                    -- approvers' list reads it: not every call that expired undecided.
                    AND created_at OPERATOR(pg_catalog.>=) (pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $13))
                    AND user_id OPERATOR(pg_catalog.=) $3 AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now()),
             ins AS (
             INSERT INTO ctxguard.approvals (call_id, tenant_id, user_id, tool, args, args_hash, expires_at,
                                             page_type, entity_type, entity_id, approver_roles)
             SELECT $1::pg_catalog.uuid, $2, $3, $4, $5, $6, pg_catalog.now() + pg_catalog.make_interval(secs => $7),
                     $8, $9, $10, $11
               FROM room WHERE room.ok
             RETURNING 1)
             SELECT EXISTS (SELECT FROM ins)",
            &[
                call_id.to_string().as_str().into(),
                ctx.tenant_id.as_str().into(),
                ctx.user_id.as_str().into(),
                tool.into(),
                JsonB(args.clone()).into(),
                hash.into(),
                // At most a day, whatever a table says: pending_approvals() looks a day back.
                f64::from(crate::ttls::for_tenant(&ctx.tenant_id).approval.min(MAX_APPROVAL_TTL)).into(),
                ctx.page_type.as_str().into(),
                ctx.entity.as_ref().map(|e| e.kind.as_str()).into(),
                ctx.entity.as_ref().map(|e| e.id.as_str()).into(),
                approvers.into(),
                MAX_PENDING_PER_USER.into(),
                f64::from(MAX_APPROVAL_TTL).into(),
            ],
        )
    })
    .unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "ctxguard: could not record approval",
        )
    })
    .unwrap_or(false)
}

fn uuid_of(call_id: Option<pgrx::Uuid>) -> uuid::Uuid {
    call_id
        .map(|u| uuid::Uuid::from_bytes(*u.as_bytes()))
        .unwrap_or_default()
}

/// A refusal audited under `ctx` (which may be none).
fn refused(ctx: Option<&Ctx>, id: uuid::Uuid, code: Code, message: &str) -> Call {
    let mut call = Call::new(id);
    call.outcome = Outcome::Denied(code, message.into(), None);
    gates::audit(ctx, &mut call);
    call
}

const INVALID_MESSAGE: &str = "no approval with this id that this user may run or decide here";

/// Run a call that needs an approval exactly once (its requester: self-approved, or granted by an
/// approver), or, for an approver of a four-eyes call, grant it.
#[pg_extern(volatile, parallel_unsafe)]
fn approve_call(call_id: Option<pgrx::Uuid>) -> JsonB {
    let _pin = crate::owner::pin();
    handler::refuse_inside("approve_call");
    let ctx = Ctx::current();
    let id = uuid_of(call_id);
    if let Some(refused) = gates::audit_ready(id) {
        return refused;
    }
    let (call, ()) = gates::audited(|| (approve(ctx.as_ref(), id), ()));
    gates::envelope(call)
}

/// `approve_call` after its checks.
fn approve(ctx: Option<&Ctx>, id: uuid::Uuid) -> Call {
    let Some(c) = ctx else {
        return refused(
            None,
            id,
            Code::ContextMissing,
            "no context is set for this transaction",
        );
    };
    // Run: atomically consume the approval (a second approve, concurrent or later, finds nothing).
    // Only its requester, from a context on the entity it was requested for (or none, if it had
    // none): a call without approvers that is pending, or one an approver granted. A call
    // requested without approvers is not the requester's to approve once the tool's policy names
    // approvers (four eyes added since): Gate B does not ask for an approval again.
    let claimed = as_owner(|| {
        Spi::connect_mut(|client| {
            let mut rows = client.update(
                "UPDATE ctxguard.approvals SET status = 'approved', used_at = pg_catalog.now()
                 WHERE call_id OPERATOR(pg_catalog.=) $1::pg_catalog.uuid
                   AND tenant_id OPERATOR(pg_catalog.=) $2 AND user_id OPERATOR(pg_catalog.=) $3
                   AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                   AND entity_type IS NOT DISTINCT FROM $4 AND entity_id IS NOT DISTINCT FROM $5
                   AND ((status OPERATOR(pg_catalog.=) 'pending' AND approver_roles IS NULL
                         AND NOT EXISTS (SELECT FROM ctxguard.tool_policies p
                                          WHERE p.tool OPERATOR(pg_catalog.=) ctxguard.approvals.tool
                                            AND p.approver_roles OPERATOR(pg_catalog.<>) '{}'::pg_catalog.text[]))
                        OR status OPERATOR(pg_catalog.=) 'granted')
                 RETURNING tool, args::pg_catalog.text",
                Some(1),
                &[
                    id.to_string().as_str().into(),
                    c.tenant_id.as_str().into(),
                    c.user_id.as_str().into(),
                    c.entity.as_ref().map(|e| e.kind.as_str()).into(),
                    c.entity.as_ref().map(|e| e.id.as_str()).into(),
                ],
            )?;
            Ok::<_, pgrx::spi::Error>(match rows.next() {
                Some(r) => Some((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<String>(2)?.unwrap_or_default(),
                )),
                None => None,
            })
        })
    })
    .unwrap_or_else(|e| internal(e));
    if let Some((tool, args)) = claimed {
        let mut call = gates::gate_b(ctx, &tool, Some(&args), Run::Approved, id);
        gates::audit(ctx, &mut call);
        return call;
    }
    // Grant: an approver of the same tenant, not the requester, holding one of its roles.
    match decide(c, id, "granted", None) {
        Some(call) => call,
        None => refused(ctx, id, Code::ApprovalInvalid, INVALID_MESSAGE),
    }
}

/// Record an approver's decision (`granted`, `rejected`) on a pending call: only a user of the same
/// tenant, not the requester, holding one of the call's approver roles; for `rejected` also the
/// requester (withdrawing it). `None`: no such pending call this user may decide.
fn decide(c: &Ctx, id: uuid::Uuid, status: &'static str, reason: Option<&str>) -> Option<Call> {
    let withdraw = status == "rejected";
    let decided = as_owner(|| {
        Spi::connect_mut(|client| {
            let mut rows = client.update(
                "UPDATE ctxguard.approvals
                    SET status = $4, decided_by = $3, decided_at = pg_catalog.now(), reason = $6
                  WHERE call_id OPERATOR(pg_catalog.=) $1::pg_catalog.uuid
                    AND tenant_id OPERATOR(pg_catalog.=) $2
                    AND status OPERATOR(pg_catalog.=) 'pending'
                    AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                    AND ((user_id OPERATOR(pg_catalog.<>) $3
                          AND approver_roles OPERATOR(pg_catalog.&&) $5::pg_catalog.text[])
                         OR ($7 AND user_id OPERATOR(pg_catalog.=) $3))
                 RETURNING tool, user_id, args_hash",
                Some(1),
                &[
                    id.to_string().as_str().into(),
                    c.tenant_id.as_str().into(),
                    c.user_id.as_str().into(),
                    status.into(),
                    c.roles.clone().into(),
                    reason.into(),
                    withdraw.into(),
                ],
            )?;
            Ok::<_, pgrx::spi::Error>(match rows.next() {
                Some(r) => Some((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<String>(2)?.unwrap_or_default(),
                    r.get::<String>(3)?,
                )),
                None => None,
            })
        })
    })
    .unwrap_or_else(|e| internal(e));
    let (tool, requested_by, args_hash) = decided?;
    let mut call = Call::new(id);
    call.tool = Some(tool);
    call.args_hash = args_hash;
    call.outcome = Outcome::Decided {
        status,
        requested_by,
    };
    gates::audit(Some(c), &mut call);
    Some(call)
}

/// Reject a pending call (an approver of a four-eyes call), or withdraw one's own. `reason` (at
/// most 500 bytes) is kept with the approval, masked; it is not audited (audit rows hold no text).
#[pg_extern(volatile, parallel_unsafe)]
fn reject_call(call_id: Option<pgrx::Uuid>, reason: default!(Option<&str>, "NULL")) -> JsonB {
    let _pin = crate::owner::pin();
    handler::refuse_inside("reject_call");
    let ctx = Ctx::current();
    let id = uuid_of(call_id);
    if let Some(refused) = gates::audit_ready(id) {
        return refused;
    }
    let (call, ()) = gates::audited(|| (reject(ctx.as_ref(), id, reason), ()));
    gates::envelope(call)
}

/// `reject_call` after its checks: the reason bounded (before and after masking), then the
/// decision.
fn reject(ctx: Option<&Ctx>, id: uuid::Uuid, reason: Option<&str>) -> Call {
    let Some(c) = ctx else {
        return refused(
            None,
            id,
            Code::ContextMissing,
            "no context is set for this transaction",
        );
    };
    let too_long = |message| refused(Some(c), id, Code::InvalidArgument, message);
    if reason.is_some_and(|r| r.len() > MAX_REASON_BYTES) {
        return too_long("reason is longer than 500 bytes");
    }
    let masked = match reason.map(|r| {
        masking::Job::new(crate::cache::catalog().mask_key())
            .text(r)
            .map(|t| t.into_owned())
    }) {
        Some(Err(_)) => return too_long("reason could not be masked"),
        // Masking may lengthen it (placeholders): the limit holds for what is kept.
        Some(Ok(t)) if t.len() > MAX_REASON_BYTES => {
            return too_long("reason is longer than 500 bytes once masked")
        }
        masked => masked.and_then(Result::ok),
    };
    decide(c, id, "rejected", masked.as_deref())
        .unwrap_or_else(|| refused(Some(c), id, Code::ApprovalInvalid, INVALID_MESSAGE))
}

/// The pending calls the context's user may decide (four eyes): same tenant, another requester,
/// one of the call's approver roles; oldest first, at most 200. The bound arguments are masked as
/// results are. No context: no rows.
#[pg_extern(stable, parallel_unsafe)]
#[expect(
    clippy::type_complexity,
    reason = "pgrx reads the column names from the name! entries of this signature"
)]
fn pending_approvals() -> TableIterator<
    'static,
    (
        name!(call_id, pgrx::Uuid),
        name!(tool, String),
        name!(requested_by, String),
        name!(page_type, Option<String>),
        name!(entity_type, Option<String>),
        name!(entity_id, Option<String>),
        name!(args, JsonB),
        name!(requested_at, pgrx::datum::TimestampWithTimeZone),
        name!(expires_at, pgrx::datum::TimestampWithTimeZone),
    ),
> {
    let _pin = crate::owner::pin();
    let Some(c) = Ctx::current() else {
        return TableIterator::new(Vec::new());
    };
    let rows = as_owner(|| {
        Spi::connect(|client| {
            client
                .select(
                    "SELECT a.call_id, a.tool, a.user_id, a.page_type, a.entity_type, a.entity_id, a.args,
                            a.created_at, a.expires_at
                       FROM ctxguard.approvals a
                      WHERE a.tenant_id OPERATOR(pg_catalog.=) $1
                        AND a.status OPERATOR(pg_catalog.=) 'pending'
                        -- An approval lives at most MAX_APPROVAL_TTL ($5) from its creation: the
                        -- pending index's range starts that far back, past the calls that expired
                        -- undecided (they stay 'pending'; each list read all of them).
                        AND a.created_at OPERATOR(pg_catalog.>=) (pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $5))
                        AND a.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                        AND a.user_id OPERATOR(pg_catalog.<>) $2
                        AND a.approver_roles OPERATOR(pg_catalog.&&) $3::pg_catalog.text[]
                      ORDER BY a.created_at, a.call_id LIMIT $4",
                    None,
                    &[
                        c.tenant_id.as_str().into(),
                        c.user_id.as_str().into(),
                        c.roles.clone().into(),
                        MAX_PENDING_LISTED.into(),
                        f64::from(MAX_APPROVAL_TTL).into(),
                    ],
                )?
                .map(|r| {
                    pgrx::check_for_interrupts!();
                    Ok((
                        r.get::<pgrx::Uuid>(1)?,
                        r.get::<String>(2)?.unwrap_or_default(),
                        r.get::<String>(3)?.unwrap_or_default(),
                        r.get::<String>(4)?,
                        r.get::<String>(5)?,
                        r.get::<String>(6)?,
                        r.get::<JsonB>(7)?.map(|j| j.0).unwrap_or(Value::Null),
                        r.get::<pgrx::datum::TimestampWithTimeZone>(8)?,
                        r.get::<pgrx::datum::TimestampWithTimeZone>(9)?,
                    ))
                })
                .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
    })
    .unwrap_or_else(|e| internal(e));
    let mut job = masking::Job::new(crate::cache::catalog().mask_key());
    let out: Vec<_> = rows
        .into_iter()
        .filter_map(|(id, tool, by, page, etype, eid, mut args, at, exp)| {
            // Arguments too large to mask are not shown: the row is left out, never unmasked.
            job.json(&mut args).ok()?;
            Some((id?, tool, by, page, etype, eid, JsonB(args), at?, exp?))
        })
        .collect();
    TableIterator::new(out)
}

fn internal(e: pgrx::spi::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("ctxguard: {e}"),
    )
}
