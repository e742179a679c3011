//! Budgets and limits (anti-exfiltration). Counters live in tables shared by every backend.
//!
//! A call with a generation locks that generation's row first (`FOR UPDATE`), so the calls of one
//! generation are serialised across pooled backends and no two can both take the last unit.

use pgrx::prelude::*;
use serde_json::{json, Value};

use crate::context::Ctx;
use crate::gucs;
use crate::owner::as_owner;
use crate::pgutil::{raise, saved_plan, update_saved, TEXT};

/// Limits in force for the caller's tenant (settings, overridden by `ctxguard.tenant_limits`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub pages_per_call: i64,
    pub calls_per_document: i32,
    pub bytes_per_generation: i64,
    pub section_tokens: i64,
    pub search_results: i64,
    pub coverage: f64,
}

/// The byte budget of the current call.
pub struct Budget {
    pub limits: Limits,
    generation: Option<String>,
    pub bytes_used: i64,
}

fn internal(e: impl std::fmt::Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("ctxguard: budget: {e}"),
    )
}

impl Budget {
    /// Read limits and, with a generation, lock its row and read what it has used.
    pub fn open(ctx: &Ctx) -> Budget {
        let (bytes_used, o) = as_owner(|| {
            Spi::connect_mut(|c| {
                let sql = match &ctx.generation {
                    Some(_) => "SELECT g.bytes_used, tl.max_pages_per_call, tl.max_calls_per_document,
                                       tl.max_bytes_per_generation, tl.max_section_tokens, tl.max_search_results,
                                       tl.max_document_coverage::pg_catalog.float8
                                  FROM ctxguard.generations g
                                  LEFT JOIN ctxguard.tenant_limits tl ON tl.tenant_id = g.tenant_id
                                 WHERE g.id = $1::pg_catalog.uuid AND g.tenant_id = $2 FOR UPDATE OF g",
                    None => "SELECT 0::pg_catalog.int8, tl.max_pages_per_call, tl.max_calls_per_document,
                                    tl.max_bytes_per_generation, tl.max_section_tokens, tl.max_search_results,
                                    tl.max_document_coverage::pg_catalog.float8
                               FROM (SELECT $2::pg_catalog.text AS tenant_id, $1::pg_catalog.text AS unused) t
                               LEFT JOIN ctxguard.tenant_limits tl ON tl.tenant_id = t.tenant_id",
                };
                let plan = saved_plan(c, sql, &[TEXT, TEXT], true)?;
                let mut rows = c.update(&*plan, Some(1), &[ctx.generation.as_deref().into(), ctx.tenant_id.as_str().into()])?;
                let Some(r) = rows.next() else { return Ok((None, [None; 5], None)) };
                Ok::<_, pgrx::spi::Error>((
                    r.get::<i64>(1)?,
                    [r.get::<i32>(2)?, r.get::<i32>(3)?, r.get::<i32>(4)?, r.get::<i32>(5)?, r.get::<i32>(6)?],
                    r.get::<f64>(7)?,
                ))
            })
        })
        .map(|(b, ints, cov)| (b, (ints, cov)))
        .unwrap_or_else(|e| internal(e));
        let (ints, cov) = o;
        let pick =
            |o: Option<i32>, g: &pgrx::GucSetting<i32>| i64::from(o.unwrap_or_else(|| g.get()));
        let limits = Limits {
            pages_per_call: pick(ints[0], &gucs::MAX_PAGES_PER_CALL),
            calls_per_document: ints[1].unwrap_or_else(|| gucs::MAX_CALLS_PER_DOCUMENT.get()),
            bytes_per_generation: pick(ints[2], &gucs::MAX_BYTES_PER_GENERATION),
            section_tokens: pick(ints[3], &gucs::MAX_SECTION_TOKENS),
            search_results: pick(ints[4], &gucs::MAX_SEARCH_RESULTS),
            coverage: cov.unwrap_or_else(|| gucs::MAX_DOCUMENT_COVERAGE.get()),
        };
        // A generation that vanished (or belongs to another tenant) leaves no budget at all.
        let bytes_used = match (&ctx.generation, bytes_used) {
            (Some(_), None) => limits.bytes_per_generation,
            (_, b) => b.unwrap_or(0),
        };
        Budget {
            limits,
            generation: ctx.generation.clone(),
            bytes_used,
        }
    }

    pub fn has_generation(&self) -> bool {
        self.generation.is_some()
    }

    /// Bytes still available to this call.
    pub fn remaining(&self) -> i64 {
        (self.limits.bytes_per_generation - self.bytes_used).max(0)
    }

    /// Record `bytes` returned by this call.
    pub fn consume(&mut self, bytes: i64) {
        self.bytes_used += bytes;
        if let Some(g) = &self.generation {
            as_owner(|| {
                Spi::connect_mut(|c| {
                    let plan = saved_plan(
                        c,
                        "UPDATE ctxguard.generations SET bytes_used = bytes_used + $2::pg_catalog.int8 WHERE id = $1::pg_catalog.uuid",
                        &[TEXT, TEXT],
                        true,
                    )?;
                    c.update(&*plan, None, &[g.as_str().into(), bytes.to_string().as_str().into()]).map(|_| ())
                })
            })
            .unwrap_or_else(|e| internal(e));
        }
    }

    /// Count one call on `doc_id` in this generation; `None` if the per-document limit is reached.
    pub fn take_document_call(&self, ctx: &Ctx, doc_id: &str) -> Option<i32> {
        let g = self.generation.as_deref()?;
        as_owner(|| {
            Spi::connect_mut(|c| {
                // No row comes back when the limit is reached (the conflict update's WHERE fails).
                let mut rows = update_saved(
                    c,
                    "INSERT INTO ctxguard.document_calls AS d (generation, tenant_id, doc_id, calls) VALUES ($1::pg_catalog.uuid, $2, $3, 1)
                     ON CONFLICT (generation, doc_id) DO UPDATE SET calls = d.calls + 1 WHERE d.calls < $4
                     RETURNING calls",
                    Some(1),
                    &[g.into(), ctx.tenant_id.as_str().into(), doc_id.into(), self.limits.calls_per_document.into()],
                )?;
                rows.next().map(|r| r.get::<i32>(1)).transpose().map(Option::flatten)
            })
        })
        .unwrap_or_else(|e| internal(e))
    }

    /// Record that the user reads `pages` of a document today; refuse if that would exceed the
    /// coverage share. Returns `(pages read today, pages allowed)` on success.
    pub fn take_coverage(
        &self,
        ctx: &Ctx,
        doc_id: &str,
        page_count: i64,
        pages: &[i32],
    ) -> Result<(i64, i64), (i64, i64)> {
        let allowed = ((page_count as f64 * self.limits.coverage).ceil() as i64)
            .max(self.limits.pages_per_call);
        let key = format!("{}\u{1f}{}\u{1f}{}", ctx.tenant_id, ctx.user_id, doc_id);
        let (already, fresh) = as_owner(|| {
            Spi::connect_mut(|c| {
                // Serialise this user's reads of this document (concurrent generations).
                update_saved(c, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended($1, 7))", None, &[key.as_str().into()])?;
                let mut rows = update_saved(
                    c,
                    "SELECT (SELECT pg_catalog.count(*) FROM ctxguard.document_coverage
                              WHERE tenant_id = $1 AND user_id = $2 AND doc_id = $3 AND day = current_date),
                            (SELECT pg_catalog.count(*) FROM pg_catalog.unnest($4::pg_catalog.int4[]) p(n)
                              WHERE NOT EXISTS (SELECT 1 FROM ctxguard.document_coverage c
                                                 WHERE c.tenant_id = $1 AND c.user_id = $2 AND c.doc_id = $3
                                                   AND c.day = current_date AND c.page_no = p.n))",
                    Some(1),
                    &[ctx.tenant_id.as_str().into(), ctx.user_id.as_str().into(), doc_id.into(), pages.to_vec().into()],
                )?;
                let r = rows.next().expect("one row");
                Ok::<_, pgrx::spi::Error>((r.get::<i64>(1)?.unwrap_or(0), r.get::<i64>(2)?.unwrap_or(0)))
            })
        })
        .unwrap_or_else(|e| internal(e));
        if already + fresh > allowed {
            return Err((already, allowed));
        }
        if fresh > 0 {
            as_owner(|| {
                Spi::connect_mut(|c| {
                    update_saved(
                        c,
                        "INSERT INTO ctxguard.document_coverage (tenant_id, user_id, doc_id, day, page_no)
                         SELECT $1, $2, $3, current_date, n FROM pg_catalog.unnest($4::pg_catalog.int4[]) n ON CONFLICT DO NOTHING",
                        None,
                        &[ctx.tenant_id.as_str().into(), ctx.user_id.as_str().into(), doc_id.into(), pages.to_vec().into()],
                    )
                    .map(|_| ())
                })
            })
            .unwrap_or_else(|e| internal(e));
        }
        Ok((already + fresh, allowed))
    }

    /// Budget state for the audit row (numbers only).
    pub fn state(&self, doc_calls: Option<i32>) -> Value {
        json!({
            "bytes_used": self.bytes_used,
            "bytes_limit": self.limits.bytes_per_generation,
            "generation": self.generation.is_some(),
            "doc_calls": doc_calls,
            "doc_calls_limit": doc_calls.map(|_| self.limits.calls_per_document),
        })
    }
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
