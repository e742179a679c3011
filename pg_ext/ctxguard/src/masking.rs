//! The masker used on every tool result: compiled once per backend from `ctxguard.mask_rules`,
//! recompiled when `ctxguard.catalog_version` moves (a trigger bumps it on any rule change).
//!
//! Every masking runs as a [`Job`]: at most `ctxguard.max_mask_bytes` of text (a larger result is
//! refused, never returned unmasked), with PostgreSQL's interrupt check as the work goes, so that
//! `statement_timeout`, `pg_cancel_backend` and `pg_terminate_backend` stop it.

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

use ctxguard_core::mask::{default_rules, MaskCounts, Masker, RuleSpec, Scan, TooLarge};
use pgrx::prelude::*;
use serde_json::Value;

use crate::gucs;
use crate::owner::as_owner;
use crate::pgutil::{raise, JsonbDatum};

/// The catalog cache key a masker was compiled for, and the masker.
type Compiled = ((i64, String), Rc<Masker>);

thread_local! {
    static MASKER: RefCell<Option<Compiled>> = const { RefCell::new(None) };
}

/// The masker for the catalog with cache key `key` (`(version, xmin)`, as the catalog cache:
/// a rolled-back rule change cannot be confused with a later one of the same number).
pub fn masker(key: &(i64, String)) -> Rc<Masker> {
    if let Some(m) = MASKER.with(|c| {
        c.borrow()
            .as_ref()
            .filter(|(k, _)| k == key)
            .map(|(_, m)| m.clone())
    }) {
        return m;
    }
    let specs: Vec<RuleSpec> = as_owner(|| Spi::connect(|c| {
        c.select(
            "SELECT name, pattern, validator FROM ctxguard.mask_rules WHERE enabled ORDER BY position, name",
            None,
            &[],
        )?
        .map(|r| {
            Ok(RuleSpec {
                name: r.get::<String>(1)?.unwrap_or_default(),
                pattern: r.get::<String>(2)?.unwrap_or_default(),
                validator: r.get::<String>(3)?,
            })
        })
        .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    }))
    .unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("ctxguard: mask rules: {e}")));
    // Rules are validated on insert (CHECK constraint), so this only fails if that was bypassed:
    // fail closed rather than return unmasked text.
    let m = Rc::new(Masker::new(&specs).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("ctxguard: {e}"),
        )
    }));
    MASKER.with(|c| *c.borrow_mut() = Some((key.clone(), m.clone())));
    m
}

fn check_for_interrupts() {
    pgrx::check_for_interrupts!();
}

/// The masking of one result (or one `mask_text` call): the rules of one catalog version, the
/// size cap, the interrupt checks, and the counts per rule (for the audit row).
pub struct Job {
    masker: Rc<Masker>,
    scan: Scan<fn()>,
    pub counts: MaskCounts,
}

impl Job {
    /// A job with the rules of the catalog with cache key `key`.
    pub fn new(key: &(i64, String)) -> Job {
        Job {
            masker: masker(key),
            scan: Scan::new(
                usize::try_from(gucs::MAX_MASK_BYTES.get()).unwrap_or(0),
                check_for_interrupts,
            ),
            counts: MaskCounts::new(),
        }
    }

    /// Whether a text of `bytes` more could be masked by this job (see [`Scan::fits`]).
    pub fn fits(&self, bytes: usize) -> Result<(), TooLarge> {
        self.scan.fits(bytes)
    }

    /// `text` masked.
    pub fn text<'a>(&mut self, text: &'a str) -> Result<Cow<'a, str>, TooLarge> {
        Ok(
            match self
                .masker
                .mask_str(text, &mut self.counts, &mut self.scan)?
            {
                Some(masked) => Cow::Owned(masked),
                None => Cow::Borrowed(text),
            },
        )
    }

    /// Every string, key and matching number of `value` masked, in place. On an error the value
    /// is partly masked and must not be returned.
    pub fn json(&mut self, value: &mut Value) -> Result<(), TooLarge> {
        self.masker
            .mask_json(value, &mut self.counts, &mut self.scan)
    }
}

/// The refusal message for a result masking may not process (names the limit only).
pub fn too_large_message(e: TooLarge) -> String {
    format!(
        "max_mask_bytes: the result holds more than the {} bytes of text masking may process (ctxguard.max_mask_bytes)",
        e.limit
    )
}

/// CHECK constraint of `ctxguard.mask_rules`: does the rule compile? A NULL name or pattern is
/// 22004 (the columns are NOT NULL; a direct call with NULL is not a panic).
#[pg_extern(immutable, parallel_safe)]
fn _mask_rule_valid(name: Option<&str>, pattern: Option<&str>, validator: Option<&str>) -> bool {
    let name = crate::pgutil::required(name, "name");
    let pattern = crate::pgutil::required(pattern, "pattern");
    Masker::new(&[RuleSpec {
        name: name.into(),
        pattern: pattern.into(),
        validator: validator.map(Into::into),
    }])
    .is_ok()
}

/// The built-in rules, used to seed `ctxguard.mask_rules` at install time.
#[pg_extern(immutable, parallel_safe)]
fn _default_mask_rules() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(pattern, String),
        name!(validator, Option<String>),
        name!(position, i32),
    ),
> {
    TableIterator::new(
        default_rules()
            .into_iter()
            .enumerate()
            .map(|(i, r)| (r.name, r.pattern, r.validator, (i as i32 + 1) * 10)),
    )
}

/// Mask arbitrary text with the current rules (for DBAs testing a rule; EXECUTE revoked from
/// PUBLIC). Text larger than `ctxguard.max_mask_bytes` is refused with SQLSTATE 54000.
#[pg_extern(volatile, parallel_unsafe)]
fn mask_text(text: &str) -> JsonbDatum {
    let _pin = crate::owner::pin();
    let catalog = crate::cache::catalog();
    let mut job = Job::new(catalog.mask_key());
    let masks = job
        .masker
        .find_masks(text, &mut job.counts, &mut job.scan)
        .unwrap_or_else(|_| {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                "ctxguard: the text is larger than ctxguard.max_mask_bytes",
            )
        });
    let counts = job.counts.iter().map(|(name, n)| (name.as_str(), *n));
    // Built in jsonb's binary form directly, the masked text written into the datum once: the
    // text round trip (serde_json, then jsonb_in) of a long text cost more than masking it, and
    // so did copying it through a masked String.
    match &masks {
        Some(m) => JsonbDatum::text_and_counts(m.masked_len(text), m.pieces(text), counts),
        None => JsonbDatum::text_and_counts(text.len(), std::iter::once(text), counts),
    }
}
