//! Budgets and limits (anti-exfiltration), charged in the shared-memory ledger (`ledger/`).
//!
//! Limits come from the settings and `ctxguard.tenant_limits`; what was used comes from the
//! ledger, which loads a missing entry from the tables and never gives a charge back: the
//! caller's ROLLBACK, savepoints, isolation level or settings cannot undo one. Nothing here
//! writes in the caller's transaction: the ledger's changes reach the tables through the audit
//! writer, with the call's audit record.

use pgrx::prelude::*;
use serde_json::{json, Value};

use crate::context::Ctx;
use crate::gucs;
use crate::ledger::{self, GenLimit, NoRoom, Over, Who};
use crate::owner::as_owner;
use crate::pgutil::{raise, select_fresh};
use ctxguard_core::Code;

/// Limits in force for the caller's tenant (settings, overridden by `ctxguard.tenant_limits`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub pages_per_call: i64,
    pub calls_per_document: i32,
    pub bytes_per_generation: i64,
    pub section_tokens: i64,
    pub search_results: i64,
    pub coverage: f64,
    pub bytes_per_user_day: i64,
}

/// The byte budget of the current call.
pub struct Budget {
    pub limits: Limits,
    /// The generation's id and expiry (Unix seconds).
    generation: Option<(String, i64)>,
    tenant: String,
    user: String,
    pub bytes_used: i64,
    day_used: Option<i64>,
}

fn internal(e: impl std::fmt::Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("ctxguard: budget: {e}"),
    )
}

/// The envelope code and message of a charge the ledger could not take: `CAPACITY_EXCEEDED` for a
/// full share or table (the message names the setting), else `AUDIT_UNAVAILABLE` (logged).
pub fn no_room(e: NoRoom) -> (Code, String) {
    match e {
        NoRoom::Capacity(message) => (Code::CapacityExceeded, message),
        NoRoom::Unavailable(u) => {
            pgrx::log!("ctxguard: call refused, AUDIT_UNAVAILABLE: {}", u.0);
            (
                Code::AuditUnavailable,
                "the call cannot be audited now; nothing was run or returned, retry later".into(),
            )
        }
    }
}

/// A coverage charge: `Ok((pages read today, pages allowed))`, or `Err` of the same when it would
/// exceed the share (nothing marked).
pub type Coverage = Result<(i64, i64), (i64, i64)>;

impl Budget {
    /// Read limits and, with a generation, what it has used (from the ledger).
    pub fn open(ctx: &Ctx) -> Result<Budget, NoRoom> {
        // The tenant's limits come with the catalog (read once per catalog version); a
        // generation's use, from its row.
        let (ints, cov) = crate::cache::catalog().tenant_limits(&ctx.tenant_id);
        let (loaded, expires) = match &ctx.generation {
            None => (None, None),
            Some(g) => as_owner(|| {
                select_fresh(
                    "SELECT g.bytes_used, EXTRACT(epoch FROM g.expires_at)::pg_catalog.int8
                       FROM ctxguard.generations g
                      WHERE g.id = $1::pg_catalog.uuid AND g.tenant_id = $2",
                    Some(1),
                    &[g.as_str().into(), ctx.tenant_id.as_str().into()],
                    |mut rows| {
                        let Some(r) = rows.next() else {
                            return Ok((None, None));
                        };
                        Ok((r.get::<i64>(1)?, r.get::<i64>(2)?))
                    },
                )
            })
            .unwrap_or_else(|e| internal(e)),
        };
        let pick =
            |o: Option<i32>, g: &pgrx::GucSetting<i32>| i64::from(o.unwrap_or_else(|| g.get()));
        let limits = Limits {
            pages_per_call: pick(ints[0], &gucs::MAX_PAGES_PER_CALL),
            calls_per_document: ints[1].unwrap_or_else(|| gucs::MAX_CALLS_PER_DOCUMENT.get()),
            bytes_per_generation: pick(ints[2], &gucs::MAX_BYTES_PER_GENERATION),
            section_tokens: pick(ints[3], &gucs::MAX_SECTION_TOKENS),
            search_results: pick(ints[4], &gucs::MAX_SEARCH_RESULTS),
            bytes_per_user_day: pick(ints[5], &gucs::MAX_BYTES_PER_USER_DAY),
            coverage: cov.unwrap_or_else(|| gucs::MAX_DOCUMENT_COVERAGE.get()),
        };
        let (generation, bytes_used) = match (&ctx.generation, loaded) {
            // A generation that vanished (or belongs to another tenant) leaves no budget at all.
            (Some(_), None) => (None, limits.bytes_per_generation),
            (Some(g), Some(b)) => {
                let expires = expires.unwrap_or(0);
                let who = Who::new(&ctx.tenant_id, &ctx.user_id);
                let used = ledger::generation_used(g, &who, expires, b)?;
                (Some((g.clone(), expires)), used)
            }
            (None, _) => (None, 0),
        };
        Ok(Budget {
            limits,
            generation,
            tenant: ctx.tenant_id.clone(),
            user: ctx.user_id.clone(),
            bytes_used,
            day_used: None,
        })
    }

    pub fn has_generation(&self) -> bool {
        self.generation.is_some()
    }

    /// Bytes still available to this call (at the time the budget was opened).
    pub fn remaining(&self) -> i64 {
        (self.limits.bytes_per_generation - self.bytes_used).max(0)
    }

    fn gen_limit(&self) -> Option<GenLimit<'_>> {
        self.generation.as_ref().map(|(id, expires)| GenLimit {
            id,
            expires: *expires,
            limit: self.limits.bytes_per_generation,
        })
    }

    /// Charge `bytes` returned by this call to the generation and the user's day, atomically
    /// against concurrent calls: `Err(message)` naming the limit if either would be exceeded.
    pub fn charge(&mut self, bytes: i64) -> Result<Result<(), String>, NoRoom> {
        if self.generation.is_none() && bytes > self.remaining() {
            return Ok(Err(format!(
                "bytes_per_generation: a {bytes}-byte result exceeds the {} bytes left",
                self.remaining()
            )));
        }
        let (tenant, user) = (self.tenant.clone(), self.user.clone());
        let charged = ledger::charge_bytes(
            self.gen_limit().as_ref(),
            &tenant,
            &user,
            self.limits.bytes_per_user_day,
            bytes,
            |day| {
                load_i64(
                "SELECT bytes FROM ctxguard.user_day_usage WHERE tenant_id = $1 AND user_id = $2
                    AND day = '2000-01-01'::pg_catalog.date OPERATOR(pg_catalog.+) $3::pg_catalog.int4",
                &[tenant.as_str().into(), user.as_str().into(), day.into()],
            )
            },
        )?;
        Ok(match charged {
            Ok(c) => {
                self.bytes_used = c.generation.unwrap_or(self.bytes_used + bytes);
                self.day_used = Some(c.user_day);
                Ok(())
            }
            Err(Over::Generation(left)) => {
                self.bytes_used = self.limits.bytes_per_generation - left;
                Err(format!(
                    "bytes_per_generation: a {bytes}-byte result exceeds the {left} bytes left"
                ))
            }
            Err(Over::UserDay(left)) => Err(format!(
                "bytes_per_user_day: a {bytes}-byte result exceeds the {left} bytes left to this user today"
            )),
        })
    }

    /// Count one call on `doc_id` in this generation; `None` if the per-document limit is reached.
    pub fn take_document_call(&self, ctx: &Ctx, doc_id: &str) -> Result<Option<i32>, NoRoom> {
        let Some(g) = self.gen_limit() else {
            return Ok(None);
        };
        ledger::doc_call(
            &g,
            &Who::new(&ctx.tenant_id, &ctx.user_id),
            doc_id,
            self.limits.calls_per_document,
            || {
                load_i64(
                    "SELECT calls::pg_catalog.int8 FROM ctxguard.document_calls
                  WHERE generation = $1::pg_catalog.uuid AND doc_id = $2",
                    &[g.id.into(), doc_id.into()],
                ) as i32
            },
        )
    }

    /// Record that the user reads `pages` of a document today (UTC); refuse if that would exceed
    /// the coverage share. Returns `(pages read today, pages allowed)` on success.
    pub fn take_coverage(
        &self,
        ctx: &Ctx,
        doc_id: &str,
        page_count: i64,
        pages: &[i32],
    ) -> Result<Coverage, NoRoom> {
        let allowed = ((page_count as f64 * self.limits.coverage).ceil() as i64)
            .max(self.limits.pages_per_call);
        let (t, u) = (ctx.tenant_id.as_str(), ctx.user_id.as_str());
        let taken = ledger::coverage(t, u, doc_id, pages, allowed, |day| {
            as_owner(|| {
                select_fresh(
                    "SELECT page_no FROM ctxguard.document_coverage
                      WHERE tenant_id = $1 AND user_id = $2 AND doc_id = $3
                        AND day = '2000-01-01'::pg_catalog.date OPERATOR(pg_catalog.+) $4::pg_catalog.int4",
                    None,
                    &[t.into(), u.into(), doc_id.into(), day.into()],
                    |rows| {
                        rows.map(|r| r.get::<i32>(1).map(Option::unwrap_or_default))
                            .collect::<Result<Vec<_>, _>>()
                    },
                )
            })
            .unwrap_or_else(|e| internal(e))
        })?;
        Ok(taken.map(|n| (n, allowed)).map_err(|n| (n, allowed)))
    }

    /// Budget state for the audit row (numbers only).
    pub fn state(&self, doc_calls: Option<i32>) -> Value {
        json!({
            "bytes_used": self.bytes_used,
            "bytes_limit": self.limits.bytes_per_generation,
            "generation": self.generation.is_some(),
            "doc_calls": doc_calls,
            "doc_calls_limit": doc_calls.map(|_| self.limits.calls_per_document),
            "user_day_bytes": self.day_used,
        })
    }
}

/// One int8 (0 if no row) read as the owner: a ledger entry's persisted value.
pub(crate) fn load_i64(sql: &str, args: &[pgrx::datum::DatumWithOid]) -> i64 {
    as_owner(|| {
        select_fresh(sql, Some(1), args, |mut rows| {
            rows.next()
                .map(|r| r.get::<i64>(1))
                .transpose()
                .map(|v| v.flatten().unwrap_or(0))
        })
    })
    .unwrap_or_else(|e| internal(e))
}

/// Most bytes of a turn's user message that `save_turn` stores.
pub const MAX_TURN_MESSAGE_BYTES: i64 = 32 * 1024;
/// Most bytes of a turn's answer that `save_turn` stores.
pub const MAX_TURN_ANSWER_BYTES: i64 = 256 * 1024;

/// `save_turn`'s size limits, called with the byte lengths of the message, the answer and the
/// tool calls as JSON text. Raises SQLSTATE 54000 naming the limit (never the sizes).
#[pg_extern(stable, parallel_safe)]
fn _check_turn_size(message_bytes: i64, answer_bytes: i64, tool_calls_bytes: i64) {
    let limit = PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED;
    if message_bytes > MAX_TURN_MESSAGE_BYTES {
        raise(
            limit,
            format!("ctxguard: a turn's message is limited to {MAX_TURN_MESSAGE_BYTES} bytes"),
        );
    }
    if answer_bytes > MAX_TURN_ANSWER_BYTES {
        raise(
            limit,
            format!("ctxguard: a turn's answer is limited to {MAX_TURN_ANSWER_BYTES} bytes"),
        );
    }
    let total = message_bytes
        .saturating_add(answer_bytes)
        .saturating_add(tool_calls_bytes);
    if total > i64::from(gucs::MAX_TURN_BYTES.get()) {
        raise(
            limit,
            "ctxguard: a turn (message, answer and tool_calls) is larger than ctxguard.max_turn_bytes",
        );
    }
}
