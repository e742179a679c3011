//! Call quotas in time windows (policy `rate_limit`, issue 30): counted in the shared-memory
//! ledger (`ledger::quota`, under its lock: exact however many calls race), carried by each
//! call's audit record to `ctxguard.quota_usage` and given back only if the call leaves none.
//!
//! Windows are fixed and aligned to the Unix epoch in UTC (a minute, an hour, a day): a quota of
//! 20 an hour allows 20 calls in 10:00-10:59 and 20 more from 11:00, whatever the session's
//! `TimeZone`.

use std::time::{SystemTime, UNIX_EPOCH};

use ctxguard_core::policy::{QuotaPer, RateLimit};
use ctxguard_core::Code;
use serde_json::{json, Value};

use crate::budget;
use crate::context::Ctx;
use crate::ledger::{self, QuotaUse};

/// What a call's quotas say: each window's state (`per`, `window`, `calls`, `used`,
/// `retry_after_ms`), and when one had no room for the call, the message naming that limit and
/// the envelope's details (`retry_after_ms`: until the window that refused it rolls over).
pub struct Counted {
    pub states: Value,
    pub over: Option<(String, Value)>,
}

/// Meet `limits` for a call of `tool` in `ctx`: read them (`Peek`), count the call if every
/// window has room (`Take`), or count it anyway (`Force`, shadow mode). `Err`: the ledger could
/// not take it (`CAPACITY_EXCEEDED`, `AUDIT_UNAVAILABLE`).
pub fn count(
    ctx: &Ctx,
    tool: &str,
    limits: &[RateLimit],
    how: QuotaUse,
) -> Result<Counted, (Code, String)> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let now_s = now_ms.div_euclid(1000);
    let wins: Vec<ledger::QuotaWindow> = limits
        .iter()
        .map(|q| {
            let start = q.window.start(now_s);
            ledger::QuotaWindow {
                user: (q.per == QuotaPer::User).then_some(ctx.user_id.as_str()),
                window: q.window.as_str(),
                start,
                end: start + q.window.secs(),
                limit: i32::try_from(q.calls).unwrap_or(i32::MAX),
            }
        })
        .collect();
    let (used, over) = ledger::quota(&ctx.tenant_id, tool, &wins, how, |i| {
        load(&ctx.tenant_id, tool, &wins[i])
    })
    .map_err(budget::no_room)?;
    let states = limits
        .iter()
        .zip(&used)
        .map(|(q, n)| {
            let full = i64::from(*n) >= i64::from(q.calls);
            json!({"per": q.per.as_str(), "window": q.window.as_str(), "calls": q.calls, "used": n,
                   "retry_after_ms": full.then(|| q.window.retry_after_ms(now_ms))})
        })
        .collect();
    // Of the windows without room, the one that rolls over last refuses it.
    let refusing = limits
        .iter()
        .zip(&over)
        .filter(|(_, o)| **o)
        .map(|(q, _)| q)
        .max_by_key(|q| q.window.retry_after_ms(now_ms));
    Ok(Counted {
        states: Value::Array(states),
        over: refusing.map(|q| {
            (
                format!(
                    "{}: the quota is used up; retry after retry_after_ms",
                    q.describe()
                ),
                json!({"retry_after_ms": q.window.retry_after_ms(now_ms), "rate_limit": q.to_json()}),
            )
        }),
    })
}

/// A window's persisted count (its entry is missing from shared memory: first use in this
/// window, or after a restart).
fn load(tenant: &str, tool: &str, w: &ledger::QuotaWindow) -> i32 {
    let n = budget::load_i64(
        "SELECT q.calls::pg_catalog.int8 FROM ctxguard.quota_usage q
          WHERE q.tenant_id OPERATOR(pg_catalog.=) $1 AND q.user_id OPERATOR(pg_catalog.=) $2
            AND q.tool OPERATOR(pg_catalog.=) $3 AND q.win OPERATOR(pg_catalog.=) $4
            AND q.window_start OPERATOR(pg_catalog.=) pg_catalog.to_timestamp($5::pg_catalog.float8)",
        &[
            tenant.into(),
            w.user.unwrap_or("").into(),
            tool.into(),
            w.window.into(),
            (w.start as f64).into(),
        ],
    );
    i32::try_from(n).unwrap_or(i32::MAX)
}
