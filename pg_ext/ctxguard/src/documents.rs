//! The document store: ingestion (`put_document`, `put_page`, `put_section`) and the seed-003
//! built-in tools (`read_doc_metadata`, `read_doc_section`, `read_doc_pages`, `doc_local_search`,
//! `list_available_tools`), which Gate B dispatches here after policy, binding and validation.
//!
//! Which documents a call may touch:
//! - on a page whose entity is a document, Gate B has bound `doc_id` to it;
//! - on a page whose entity is something else (an invoice, a matter), only documents linked to it;
//! - elsewhere, any ready document of the tenant.
//!
//! Another tenant's document and a nonexistent one give the same `NOT_FOUND`.
//!
//! Page text is masked before anything is added to it or cut from it: pages before they are
//! trimmed to the budget, sections before they are trimmed, and search pages before
//! the snippet marks and cuts them (`docs::headline`); each snippet is then checked again without
//! its markers.
//! Gate B masks the whole result once more.

use std::borrow::Cow;

use ctxguard_core::docs::{self, RangeError};
use ctxguard_core::mask::TooLarge;
use ctxguard_core::names::{is_valid_id, is_valid_label, is_valid_name};
use ctxguard_core::tsrank;
use ctxguard_core::Code;
use pgrx::prelude::*;
use serde_json::{json, Map, Value};

use crate::budget::Budget;
use crate::context::Ctx;
use crate::masking::{self, Job};
use crate::owner::as_owner;
use crate::pgutil::{open_generic, raise, select_saved};

const MAX_PAGE_BYTES: usize = 1024 * 1024;
const MAX_PAGES: i32 = 100_000;
/// Bytes reserved for the JSON around returned text.
const ENVELOPE_BYTES: i64 = 512;
/// Below this many bytes left, a document call could return nothing useful: refuse it instead.
const MIN_USEFUL_BYTES: i64 = ENVELOPE_BYTES + 256;
/// Search candidates kept per word of a document (`ctxguard.document_terms`): the pages where it
/// occurs most often. The upgrade script fills the table with the same number.
const TERM_PAGES: i64 = 100;
/// Rows of a search's candidates read at a time (see [`search_pages`]).
const BATCH: i64 = 256;

/// A refusal: code, message, optional details (e.g. the documents available on this page).
pub type Refusal = (Code, String, Option<Value>);

/// What a built-in tool returns to Gate B.
pub struct Out {
    pub value: Value,
    pub doc_id: Option<String>,
    pub tokens: u32,
    pub doc_calls: Option<i32>,
    /// The pages this result shows, charged to the user's daily coverage by Gate B last of all
    /// (after the byte charge): a coverage mark is never given back.
    pub coverage: Option<Pages>,
}

/// Pages of a document a result shows (for the coverage charge).
pub struct Pages {
    pub doc_id: String,
    pub page_count: i64,
    pub pages: Vec<i32>,
    /// Pages shown as search snippets (the refusal says that search results count).
    pub search: bool,
}

impl Pages {
    /// Charge the pages to the user's coverage of the day: `Err` refusal if that exceeds the share.
    pub fn charge(&self, ctx: &Ctx, budget: &Budget) -> Result<(), Refusal> {
        match budget.take_coverage(ctx, &self.doc_id, self.page_count, &self.pages) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((read, allowed))) => Err((
                Code::RateLimitExceeded,
                format!(
                    "document_coverage: at most {allowed} of {} pages per user per day ({read} read today){}",
                    self.page_count,
                    if self.search { "; search results count" } else { "" }
                ),
                None,
            )),
            Err(e) => {
                let (code, message) = crate::budget::no_room(e);
                Err((code, message, None))
            }
        }
    }
}

impl Out {
    /// A result not (yet) tied to a document call.
    fn new(value: Value, tokens: u32) -> Out {
        Out {
            value,
            doc_id: None,
            tokens,
            doc_calls: None,
            coverage: None,
        }
    }
}

/// What is left of the generation's byte budget while a result is filled: each item costs its
/// kept text plus `overhead` bytes of JSON around it.
struct Room {
    left: usize,
    overhead: usize,
    trimmed: bool,
    tokens: u32,
}

impl Room {
    fn new(left: usize, overhead: usize) -> Room {
        Room {
            left,
            overhead,
            trimmed: false,
            tokens: 0,
        }
    }

    /// Is there room for any text at all?
    fn has_space(&self) -> bool {
        self.left > self.overhead
    }

    /// As much of `text` as still fits, charged to the room.
    fn take<'a>(&mut self, text: &'a str) -> &'a str {
        let (kept, cut) = docs::trim_to_bytes(text, self.left.saturating_sub(self.overhead));
        self.left = self.left.saturating_sub(kept.len() + self.overhead);
        self.trimmed |= cut;
        self.tokens += docs::estimate_tokens(kept);
        kept
    }

    /// The result: `value` with the token count, marked if the budget cut anything.
    fn finish(self, mut value: Value) -> Out {
        value["tokens"] = json!(self.tokens);
        if self.trimmed {
            value["trimmed"] = json!("bytes_per_generation");
        }
        Out::new(value, self.tokens)
    }
}

fn refuse<T>(code: Code, msg: &str) -> Result<T, Refusal> {
    Err((code, msg.to_string(), None))
}

fn too_large(e: TooLarge) -> Refusal {
    (Code::ResultTooLarge, masking::too_large_message(e), None)
}

fn internal(e: impl std::fmt::Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("ctxguard: documents: {e}"),
    )
}

struct Doc {
    id: String,
    title: String,
    status: String,
    tags: Vec<String>,
    product_version: Option<String>,
    language: String,
    page_count: i64,
    entity: Option<(String, String)>,
}

/// Documents linked to the page's (non-document) entity: titles and ids only.
fn linked_documents(ctx: &Ctx, kind: &str, id: &str) -> Value {
    Spi::connect(|c| {
        select_saved(
            c,
            "SELECT id, title, status FROM ctxguard.documents
              WHERE tenant_id = $1 AND entity_type = $2 AND entity_id = $3 ORDER BY title, id LIMIT 50",
            None,
            &[ctx.tenant_id.as_str().into(), kind.into(), id.into()],
        )?
        .map(|r| {
            Ok(json!({"doc_id": r.get::<String>(1)?, "title": r.get::<String>(2)?, "status": r.get::<String>(3)?}))
        })
        .collect::<Result<Vec<Value>, pgrx::spi::Error>>()
    })
    .map(Value::Array)
    .unwrap_or_else(|e| internal(e))
}

/// Find the document and check it may be used from this page. Runs as the caller (forced RLS).
fn resolve(ctx: &Ctx, doc_id: &str) -> Result<Doc, Refusal> {
    let doc = Spi::connect(|c| {
        let mut rows = select_saved(
            c,
            "SELECT id, title, status, tags, product_version, language::pg_catalog.text, page_count, entity_type, entity_id
               FROM ctxguard.documents WHERE tenant_id = $1 AND id = $2",
            Some(1),
            &[ctx.tenant_id.as_str().into(), doc_id.into()],
        )?;
        rows.next()
            .map(|r| {
                let entity = match (r.get::<String>(8)?, r.get::<String>(9)?) {
                    (Some(t), Some(i)) => Some((t, i)),
                    _ => None,
                };
                Ok::<_, pgrx::spi::Error>(Doc {
                    id: r.get::<String>(1)?.unwrap_or_default(),
                    title: r.get::<String>(2)?.unwrap_or_default(),
                    status: r.get::<String>(3)?.unwrap_or_default(),
                    tags: r.get::<Vec<String>>(4)?.unwrap_or_default(),
                    product_version: r.get::<String>(5)?,
                    language: r.get::<String>(6)?.unwrap_or_else(|| "simple".into()),
                    page_count: i64::from(r.get::<i32>(7)?.unwrap_or(0)),
                    entity,
                })
            })
            .transpose()
    })
    .unwrap_or_else(|e| internal(e));
    // On a document's own page only that document is in scope, even if a DBA's policy edit removed
    // the doc_id binding (defence in depth: Gate B normally refuses the spoof first).
    if ctx
        .entity
        .as_ref()
        .is_some_and(|e| e.kind == "document" && e.id != doc_id)
    {
        return refuse(
            Code::EntityMismatch,
            "the entity argument does not match the entity on this page",
        );
    }
    // On a page about a non-document entity, only that entity's documents are in scope.
    if let Some(e) = ctx.entity.as_ref().filter(|e| e.kind != "document") {
        let linked = doc
            .as_ref()
            .is_some_and(|d| d.entity.as_ref() == Some(&(e.kind.clone(), e.id.clone())));
        if !linked {
            let available = linked_documents(ctx, &e.kind, &e.id);
            return Err((
                Code::NotFound,
                format!("document not found among the documents of this {}", e.kind),
                Some(json!({"available_documents": available})),
            ));
        }
    }
    let Some(doc) = doc else {
        return refuse(Code::NotFound, "document not found");
    };
    match doc.status.as_str() {
        "ready" => Ok(doc),
        "failed" => refuse(Code::DocumentNotReady, "document processing failed"),
        _ => refuse(Code::DocumentNotReady, "document is still processing"),
    }
}

fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn int_arg(args: &Map<String, Value>, key: &str) -> Option<i64> {
    args.get(key).and_then(Value::as_i64)
}

/// Run a built-in tool. Arguments are already bound and schema-validated by Gate B. Page text is
/// masked with `job` (its counts go to the audit row).
pub fn run(
    name: &str,
    ctx: &Ctx,
    args: &Map<String, Value>,
    budget: &Budget,
    job: &mut Job,
) -> Result<Out, Refusal> {
    if name == "list_available_tools" {
        let tools: Vec<String> = crate::gates::visible(ctx, None, None)
            .iter()
            .map(|t| t.name.clone())
            .collect();
        return Ok(Out::new(json!({"tools": tools}), 0));
    }
    if !budget.has_generation() {
        return refuse(
            Code::ContextMissing,
            "document tools need a generation (ctxguard.begin_generation)",
        );
    }
    let doc = resolve(ctx, str_arg(args, "doc_id"))?;
    let limits = budget.limits;
    // Cheap argument-level limits first, then the shared counters, then (only then) text.
    let pages: Option<(i64, i64)> = match name {
        "read_doc_pages" => {
            let (start, end) = (
                int_arg(args, "page_start").unwrap_or(0),
                int_arg(args, "page_end").unwrap_or(0),
            );
            match docs::check_page_range(start, end, doc.page_count, limits.pages_per_call) {
                Ok(()) => Some((start, end)),
                Err(RangeError::Invalid) => {
                    return refuse(
                        Code::InvalidArgument,
                        &format!("page range must lie within 1..{}", doc.page_count),
                    )
                }
                Err(RangeError::TooManyPages) => {
                    return refuse(
                        Code::RateLimitExceeded,
                        &format!(
                            "pages_per_call: at most {} pages per call",
                            limits.pages_per_call
                        ),
                    )
                }
            }
        }
        "read_doc_section" => {
            let section = Spi::connect(|c| {
                let mut rows = select_saved(
                    c,
                    "SELECT page_start, page_end FROM ctxguard.document_sections
                      WHERE tenant_id = $1 AND doc_id = $2 AND section_id = $3",
                    Some(1),
                    &[
                        ctx.tenant_id.as_str().into(),
                        doc.id.as_str().into(),
                        str_arg(args, "section_id").into(),
                    ],
                )?;
                rows.next()
                    .map(|r| {
                        Ok::<_, pgrx::spi::Error>((
                            i64::from(r.get::<i32>(1)?.unwrap_or(1)),
                            i64::from(r.get::<i32>(2)?.unwrap_or(1)),
                        ))
                    })
                    .transpose()
            })
            .unwrap_or_else(|e| internal(e));
            match section {
                // Within the document: a section's range is the ingester's, and the pages it
                // lists beyond the last exist nowhere (nor are they read or counted as read).
                Some((start, end)) => Some((start, end.min(doc.page_count))),
                None => return refuse(Code::NotFound, "section not found in this document"),
            }
        }
        _ => None,
    };
    // Leave room for the JSON envelope around the text; with too little left, refuse before
    // charging any call or coverage.
    if budget.remaining() < MIN_USEFUL_BYTES {
        return refuse(
            Code::RateLimitExceeded,
            "bytes_per_generation: the generation's byte budget is spent",
        );
    }
    // The document call is counted first (given back if the call leaves no record); the text is
    // read before any page is marked: a call cut short while reading marks nothing.
    let doc_calls = match budget.take_document_call(ctx, &doc.id) {
        Ok(Some(n)) => n,
        Ok(None) => {
            return refuse(
                Code::RateLimitExceeded,
                &format!(
                    "calls_per_document: at most {} calls per document per generation",
                    limits.calls_per_document
                ),
            )
        }
        Err(e) => {
            let (code, message) = crate::budget::no_room(e);
            return Err((code, message, None));
        }
    };
    let room = (budget.remaining() - ENVELOPE_BYTES).max(0) as usize;
    let (out, shown, search) = match name {
        "read_doc_metadata" => (metadata(ctx, &doc), Vec::new(), false),
        "read_doc_section" => {
            let (start, end) = pages.expect("section range");
            let cap = (limits.section_tokens * 4) as usize;
            let out = section(ctx, &doc, start, end, room.min(cap), room < cap, job)
                .map_err(too_large)?;
            (out, (start..=end).map(|p| p as i32).collect(), false)
        }
        "read_doc_pages" => {
            let (start, end) = pages.expect("page range");
            let out = read_pages(ctx, &doc, start, end, room, job).map_err(too_large)?;
            (out, (start..=end).map(|p| p as i32).collect(), false)
        }
        "doc_local_search" => {
            let asked = int_arg(args, "max_results").unwrap_or(limits.search_results);
            let out = search(
                ctx,
                &doc,
                str_arg(args, "query"),
                asked.min(limits.search_results),
                asked > limits.search_results,
                room,
                job,
            )
            .map_err(too_large)?;
            // The pages whose snippets are returned count toward the daily coverage.
            let shown: Vec<i32> = out.value["results"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["page"].as_i64().and_then(|p| i32::try_from(p).ok()))
                .collect();
            (out, shown, true)
        }
        _ => return refuse(Code::ToolNotFound, "no such tool"),
    };
    let coverage = (!shown.is_empty()).then(|| Pages {
        doc_id: doc.id.clone(),
        page_count: doc.page_count,
        pages: shown,
        search,
    });
    Ok(Out {
        doc_calls: Some(doc_calls),
        doc_id: Some(doc.id),
        coverage,
        ..out
    })
}

fn metadata(ctx: &Ctx, doc: &Doc) -> Out {
    let sections = Spi::connect(|c| {
        select_saved(
            c,
            "SELECT section_id, title, page_start, page_end FROM ctxguard.document_sections
              WHERE tenant_id = $1 AND doc_id = $2 ORDER BY page_start, section_id LIMIT 200",
            None,
            &[ctx.tenant_id.as_str().into(), doc.id.as_str().into()],
        )?
        .map(|r| {
            Ok(
                json!({"section_id": r.get::<String>(1)?, "title": r.get::<String>(2)?,
                      "page_start": r.get::<i32>(3)?, "page_end": r.get::<i32>(4)?}),
            )
        })
        .collect::<Result<Vec<Value>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| internal(e));
    let value = json!({
        "doc_id": doc.id, "title": doc.title, "status": doc.status, "tags": doc.tags,
        "product_version": doc.product_version, "page_count": doc.page_count, "sections": sections,
        "linked_entity": doc.entity.as_ref().map(|(t, i)| json!({"type": t, "id": i})),
    });
    let tokens = docs::estimate_tokens(&value.to_string());
    Out::new(value, tokens)
}

/// Clean (header/footer-stripped) text of pages `start..=end`, read as the extension owner with an
/// explicit tenant predicate: page text has no grant, so only these tools can read it.
fn page_texts(ctx: &Ctx, doc: &Doc, start: i64, end: i64) -> Vec<(i32, String)> {
    as_owner(|| {
        Spi::connect(|c| {
            // Always the generic plan (the primary key's range): the estimates cannot see how
            // few pages the range holds, and the custom plan was made again on every call.
            open_generic(
                c,
                "SELECT page_no, coalesce(clean, body) FROM ctxguard.document_pages
                  WHERE tenant_id = $1 AND doc_id = $2 AND page_no BETWEEN $3 AND $4 ORDER BY page_no",
                &[ctx.tenant_id.as_str().into(), doc.id.as_str().into(), (start as i32).into(), (end as i32).into()],
            )?
            .fetch(std::ffi::c_long::MAX)?
            .map(|r| Ok((r.get::<i32>(1)?.unwrap_or(0), r.get::<String>(2)?.unwrap_or_default())))
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
    })
    .unwrap_or_else(|e| internal(e))
}

/// Pages of a section read at a time by [`section_text`].
const SECTION_BATCH: i64 = 64;

/// The text of pages `start..=end`, joined by blank lines, read [`SECTION_BATCH`] pages at a time
/// (each a statement of its own, from the last page read: as many statements as batches of pages
/// that exist, whatever the range): as soon as it is longer than `job` could mask
/// (`RESULT_TOO_LARGE` for the whole call, as masking it would say), `Err` without reading the
/// rest. A section's range is the ingester's (up to 100,000 pages of up to 1 MiB each), and it
/// was read whole, three copies of it in memory, before the mask's limit refused it.
fn section_text(ctx: &Ctx, doc: &Doc, start: i64, end: i64, job: &Job) -> Result<String, TooLarge> {
    let (mut text, mut first) = (String::new(), true);
    let mut after = start.saturating_sub(1);
    loop {
        pgrx::check_for_interrupts!();
        let pages: Vec<(i32, String)> = as_owner(|| {
            Spi::connect(|c| {
                // Always the generic plan, as page_texts'.
                open_generic(
                    c,
                    "SELECT page_no, coalesce(clean, body) FROM ctxguard.document_pages
                      WHERE tenant_id = $1 AND doc_id = $2 AND page_no > $3 AND page_no <= $4
                      ORDER BY page_no LIMIT $5",
                    &[
                        ctx.tenant_id.as_str().into(),
                        doc.id.as_str().into(),
                        (after as i32).into(),
                        (end as i32).into(),
                        SECTION_BATCH.into(),
                    ],
                )?
                .fetch(std::ffi::c_long::MAX)?
                .map(|r| {
                    Ok((
                        r.get::<i32>(1)?.unwrap_or(0),
                        r.get::<String>(2)?.unwrap_or_default(),
                    ))
                })
                .collect::<Result<Vec<_>, pgrx::spi::Error>>()
            })
        })
        .unwrap_or_else(|e| internal(e));
        let Some(&(last, _)) = pages.last() else {
            return Ok(text);
        };
        for (_, page) in &pages {
            if !std::mem::take(&mut first) {
                text.push_str("\n\n");
            }
            text.push_str(page);
            job.fits(text.len())?;
        }
        after = i64::from(last);
    }
}

fn section(
    ctx: &Ctx,
    doc: &Doc,
    start: i64,
    end: i64,
    cap: usize,
    by_budget: bool,
    job: &mut Job,
) -> Result<Out, TooLarge> {
    let text = section_text(ctx, doc, start, end, job)?;
    let text = job.text(&text)?;
    let (kept, trimmed) = docs::trim_to_bytes(&text, cap);
    let tokens = docs::estimate_tokens(kept);
    let mut value = json!({"text": kept, "page_start": start, "page_end": end, "tokens": tokens});
    if trimmed {
        value["trimmed"] = json!(if by_budget {
            "bytes_per_generation"
        } else {
            "section_tokens"
        });
    }
    Ok(Out::new(value, tokens))
}

fn read_pages(
    ctx: &Ctx,
    doc: &Doc,
    start: i64,
    end: i64,
    room: usize,
    job: &mut Job,
) -> Result<Out, TooLarge> {
    let mut room = Room::new(room, 32);
    let mut pages = Vec::new();
    for (n, text) in page_texts(ctx, doc, start, end) {
        // Pages past the budget come back empty (and marked trimmed): no need to mask them.
        if room.has_space() {
            let masked = job.text(&text)?;
            pages.push(json!({"page": n, "text": room.take(&masked)}));
        } else {
            room.trimmed |= !text.is_empty();
            pages.push(json!({"page": n, "text": ""}));
        }
    }
    Ok(
        room.finish(
            json!({"doc_id": doc.id, "page_start": start, "page_end": end, "pages": pages}),
        ),
    )
}

/// The query as a tsquery named `q`, from the parameters `cfg` (regconfig) and `query` (text):
/// all query words must match (websearch syntax), or, with `any`, any word may (quoted lexemes).
fn tsquery(any: bool, cfg: &str, query: &str) -> String {
    if any {
        format!(
            "(SELECT pg_catalog.to_tsquery({cfg}::pg_catalog.regconfig, coalesce(nullif(pg_catalog.array_to_string(ARRAY(
        SELECT '''' || pg_catalog.replace(l, '''', '''''') || '''' FROM pg_catalog.unnest(pg_catalog.tsvector_to_array(pg_catalog.to_tsvector({cfg}::pg_catalog.regconfig, {query}))) l),
        ' | '), ''), '''''')) AS q) qs"
        )
    } else {
        format!("pg_catalog.websearch_to_tsquery({cfg}::pg_catalog.regconfig, {query}) q")
    }
}

/// What [`search_pages`] found: the best pages (page number, score, clean text), and the query's
/// stems with its text search configuration, for the snippets.
#[derive(Default)]
struct Found {
    hits: Vec<(i32, f32, String)>,
    stems: Vec<String>,
    cfg: pg_sys::Oid,
}

/// The best `limit` pages for the query: page number, score and clean text. Read as the owner
/// with an explicit tenant predicate, like [`page_texts`].
///
/// Ranked (`ts_rank_cd`) are the matching pages among the candidates: for each word of the query,
/// the [`TERM_PAGES`] pages where it occurs most often (`ctxguard.document_terms`), so the cost
/// does not grow with the document. Where every word of the query occurs on at most that many
/// pages this is every matching page (the same results as ranking them all); beyond, the best
/// among the pages richest in the query's words. A query with no word that must occur (only
/// negations), and a document without candidates (its pages written other than by
/// `put_document(..., 'ready')`), rank every page, as before.
///
/// The rank is `ts_rank_cd`'s own value: computed here ([`ctxguard_core::tsrank`], from the
/// datums) for a query of words, `&`, `|` and `!`, and by PostgreSQL for a query with a phrase
/// (`<->`, as a hyphenated word makes). PostgreSQL's function zeroes 32 KiB per query item for
/// every page it ranks, most of a search's cost. The rows are read through a cursor, [`BATCH`] at
/// a time, and only the best `limit` are kept (with their text): memory does not grow with the
/// candidates (every page, for a query of negations only). With `ctxguard.search_rank_check`
/// (superuser; the tests') PostgreSQL also ranks every row, and the search fails unless the
/// extension ranked each one it should have, to the same bits.
///
/// Also returned ([`Found`]): the query's stems and its configuration (for the snippets).
fn search_pages(ctx: &Ctx, doc: &Doc, query: &str, limit: i64, any: bool) -> Found {
    let sql = format!(
        "WITH c AS MATERIALIZED (
             SELECT t.page_no
               FROM pg_catalog.unnest(pg_catalog.tsvector_to_array(
                        pg_catalog.to_tsvector($5::pg_catalog.regconfig, $3))) AS w(lexeme)
               CROSS JOIN LATERAL (
                    -- One index range per word (OFFSET 0: not a join the planner may turn into
                    -- one scan of the document's whole list filtered by the words, which it did
                    -- with `lexeme = ANY (…)` before the table had statistics).
                    SELECT t.page_no FROM ctxguard.document_terms t
                     WHERE t.tenant_id = $1 AND t.doc_id = $2 AND t.lexeme = w.lexeme OFFSET 0) t
             UNION
             -- Every page when no word must occur or the document has no lists: a condition of
             -- the query alone (subqueries without the page: decided once, before any page is
             -- read; as a condition joining the page to the query, a plan without statistics read
             -- the document's every page key for each search).
             SELECT p.page_no FROM ctxguard.document_pages p
              WHERE p.tenant_id = $1 AND p.doc_id = $2
                AND ((SELECT pg_catalog.querytree(q) = 'T' FROM {q})
                     OR (SELECT t.lexeme FROM ctxguard.document_terms t WHERE t.tenant_id = $1 AND t.doc_id = $2
                          ORDER BY t.lexeme LIMIT 1) IS NULL)),
              -- The query, once; ranked in SQL when it has a phrase, when the extension could not
              -- rank it ($4), or to check the extension's rank ($6, ctxguard.search_rank_check:
              -- then the extension ranks every page whose query it can read, phrase or not).
              f AS MATERIALIZED (
             SELECT q, pg_catalog.strpos(q::pg_catalog.text, '<') > 0 AS phrase FROM {q})
         SELECT p.page_no, p.clean, f.q,
                CASE WHEN f.phrase OR $4 OR $6 THEN pg_catalog.ts_rank_cd(p.tsv, f.q) END AS score,
                CASE WHEN NOT (f.phrase OR $4) OR $6 THEN p.tsv END AS tsv,
                (SELECT pg_catalog.tsvector_to_array(pg_catalog.to_tsvector($5::pg_catalog.regconfig, $3))) AS stems,
                -- Once per search (a subquery of parameters only), not once per row: the cast
                -- parses the configuration's name.
                (SELECT $5::pg_catalog.regconfig::pg_catalog.oid) AS cfg
           FROM c CROSS JOIN LATERAL (
                    -- One lookup per candidate (OFFSET 0: not flattened into a join that would
                    -- read every matching page first), through the hash of the page's key: one
                    -- bucket page at any size. The key itself is compared in a form no index
                    -- takes, so that no plan reads the document's range of the primary key per
                    -- candidate (the plan without statistics when the page number was hidden).
                    SELECT p.page_no, p.tsv, p.clean FROM ctxguard.document_pages p
                     WHERE pg_catalog.hashtextextended(p.tenant_id OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) p.doc_id,
                                                       p.page_no::pg_catalog.int8)
                           OPERATOR(pg_catalog.=) pg_catalog.hashtextextended($1 OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) $2,
                                                                              c.page_no::pg_catalog.int8)
                       AND (p.tenant_id, p.doc_id, p.page_no) IS NOT DISTINCT FROM ($1, $2, c.page_no) OFFSET 0) p, f
          WHERE p.tsv @@ f.q",
        q = tsquery(any, "$5", "$3")
    );
    let check = crate::gucs::SEARCH_RANK_CHECK.get();
    let limit = usize::try_from(limit).unwrap_or(0);
    let run = |in_sql: bool| {
        as_owner(|| {
            Spi::connect(|c| {
                let args: [pgrx::datum::DatumWithOid<'_>; 6] = [
                    ctx.tenant_id.as_str().into(),
                    doc.id.as_str().into(),
                    query.into(),
                    in_sql.into(),
                    doc.language.as_str().into(),
                    check.into(),
                ];
                // Always the generic plan: its one shape is right for every document and query
                // (sql/tests/superuser/34_doc_search_candidates.sql plans it so), and the plan
                // cache, whose estimates cannot see how few candidates the lists give, made a
                // custom plan again for every search.
                let mut cursor = crate::pgutil::open_generic(c, &sql, &args)?;
                let mut table = cursor.fetch(BATCH)?;
                // SAFETY: the table just fetched (freed once `rank_rows` has read it).
                let mut batch = unsafe { pg_sys::SPI_tuptable };
                if table.is_empty() {
                    return Ok(Some(Found::default()));
                }
                // The query and its stems, the same in every row: from the first.
                let first = table.first();
                let stems = first.get::<Vec<String>>(6)?.unwrap_or_default();
                let cfg = first.get::<pg_sys::Oid>(7)?.unwrap_or(pg_sys::InvalidOid);
                let query_bytes = match first.get_datum_by_ordinal(3)? {
                    // SAFETY: a `tsquery` datum of the first row.
                    Some(q) => unsafe { crate::pgutil::with_varlena_bytes(q, <[u8]>::to_vec) },
                    None => Vec::new(),
                };
                table = first.rewind();
                let ranker = Ranker {
                    query: tsrank::Query::parse(&query_bytes),
                    in_sql,
                    check,
                };
                let mut best = docs::Best::new(limit);
                loop {
                    if !ranker.rank_rows(table, &mut best)? {
                        return Ok(None);
                    }
                    // SAFETY: read; nothing of it is kept (texts and the query are copies).
                    unsafe { pg_sys::SPI_freetuptable(batch) };
                    table = cursor.fetch(BATCH)?;
                    // SAFETY: as above.
                    batch = unsafe { pg_sys::SPI_tuptable };
                    if table.is_empty() {
                        break;
                    }
                }
                let hits = best.into_hits().into_iter();
                let hits = hits
                    .map(|(score, page, text)| (page, score, text))
                    .collect();
                Ok::<_, pgrx::spi::Error>(Some(Found { hits, stems, cfg }))
            })
        })
        .unwrap_or_else(|e| internal(e))
    };
    // A query or page this crate cannot read (not expected): ranked by PostgreSQL instead.
    run(false)
        .or_else(|| run(true))
        .unwrap_or_else(|| internal("search rows without a rank"))
}

/// How [`search_pages`] ranks a batch of its rows (page, text, query, PostgreSQL's score or NULL,
/// vector or NULL).
struct Ranker<'q> {
    query: Result<tsrank::Query<'q>, tsrank::Unsupported>,
    /// PostgreSQL ranks every row (the retry after a row the extension could not rank).
    in_sql: bool,
    /// `ctxguard.search_rank_check`: both rank every row they can, and must agree to the bit.
    check: bool,
}

impl Ranker<'_> {
    /// Each row's rank into `best` (the text read only for a row kept); `false` when a row has no
    /// rank (the extension could not read it, and PostgreSQL was not asked to rank it).
    fn rank_rows(
        &self,
        mut table: pgrx::spi::SpiTupleTable<'_>,
        best: &mut docs::Best<String>,
    ) -> Result<bool, pgrx::spi::Error> {
        while let Some(row) = table.next() {
            pgrx::check_for_interrupts!();
            let theirs = row.get::<f32>(4)?;
            let ours = match (&self.query, table.get_datum_by_ordinal(5)?) {
                // SAFETY: a `tsvector` datum of the current row.
                (Ok(q), Some(tsv)) => unsafe {
                    crate::pgutil::with_varlena_bytes(tsv, |v| {
                        tsrank::rank_cd(v, q, &mut || {
                            pgrx::check_for_interrupts!();
                        })
                    })
                },
                _ => None,
            };
            let score = match (ours, theirs) {
                (Some(ours), Some(theirs)) if ours.to_bits() != theirs.to_bits() => {
                    internal("the extension's rank differs from ts_rank_cd")
                }
                (Some(score), _) => score,
                // Not a query or page read here: a phrase (ranked in SQL), or, not expected, one
                // the extension could not read.
                (None, theirs) => {
                    if self.check
                        && !self.in_sql
                        && !matches!(self.query, Err(tsrank::Unsupported::Phrase))
                        && cfg!(target_endian = "little")
                    {
                        internal("the extension could not rank a search's page");
                    }
                    match theirs {
                        Some(score) => score,
                        None => return Ok(false),
                    }
                }
            };
            let page = row.get::<i32>(1)?.unwrap_or(0);
            if let Some(at) = best.place(score, page) {
                best.insert(at, score, page, row.get::<String>(2)?.unwrap_or_default());
            }
        }
        Ok(true)
    }
}

/// At most this many different words of a search's pages are stemmed for its snippets (a word
/// past them is not marked).
const STEMMED_WORDS: usize = 512;
/// Words of this many bytes or more are not stemmed (PostgreSQL does not index a token of 2,047
/// bytes or more: a notice, and no lexeme).
const STEMMED_WORD_BYTES: usize = 2047;

/// Is a word of a search's page one of its query's words? Its lexemes in the search's text search
/// configuration (`to_tsvector(cfg, word)`, PostgreSQL's own parser and dictionaries, as the page's
/// vector was made) include one of the query's. Each word is stemmed once per search.
struct Stemmer<'f> {
    found: &'f Found,
    seen: std::collections::HashMap<String, bool>,
    cx: pg_sys::MemoryContext,
}

impl<'f> Stemmer<'f> {
    fn new(found: &'f Found) -> Self {
        // SAFETY: a child of the current context, deleted on drop.
        let cx = unsafe {
            crate::pgutil::memory_context(
                pg_sys::CurrentMemoryContext,
                c"ctxguard snippet words",
                crate::pgutil::ContextSizes::Small,
            )
        };
        Stemmer {
            found,
            seen: std::collections::HashMap::new(),
            cx,
        }
    }

    fn is_query_word(&mut self, word: &str) -> bool {
        if let Some(&known) = self.seen.get(word) {
            return known;
        }
        // PostgreSQL does not index a word that long (a notice, and no lexeme): never the query's.
        if self.seen.len() >= STEMMED_WORDS || word.len() >= STEMMED_WORD_BYTES {
            return false;
        }
        let cfg = self.found.cfg;
        if cfg == pg_sys::InvalidOid {
            internal("search rows without their configuration");
        }
        // SAFETY: PostgreSQL's functions called on a configuration that exists (the search's
        // statement cast it) and a text made here, in a context reset right after.
        let lexemes = unsafe {
            let lexemes = pgrx::PgMemoryContexts::For(self.cx).switch_to(|_| {
                let text = word.into_datum().expect("text");
                let vector = pgrx::direct_function_call_as_datum(
                    pg_sys::to_tsvector_byid,
                    &[Some(pg_sys::Datum::from(cfg)), Some(text)],
                );
                pgrx::direct_function_call::<Vec<String>>(pg_sys::tsvector_to_array, &[vector])
                    .unwrap_or_default()
            });
            pg_sys::MemoryContextReset(self.cx);
            lexemes
        };
        let known = lexemes.iter().any(|l| self.found.stems.contains(l));
        self.seen.insert(word.to_string(), known);
        known
    }
}

impl Drop for Stemmer<'_> {
    fn drop(&mut self) {
        // After an error the context may still be the current one (a switch is not undone by
        // unwinding): it is then left to its parent, freed with the statement's memory.
        if std::thread::panicking() {
            return;
        }
        // SAFETY: made in `new`, used by nothing else, not the current context.
        unsafe { pg_sys::MemoryContextDelete(self.cx) };
    }
}

/// A snippet made from masked text, checked again without its markers: if dropping them (or
/// what the snippet left out) joins a secret, the snippet is that marker-free text, masked.
fn checked_snippet(snippet: String, job: &mut Job) -> Result<String, TooLarge> {
    let plain = docs::without_marks(&snippet);
    Ok(match job.text(&plain)? {
        Cow::Owned(masked) => masked,
        Cow::Borrowed(_) => docs::unmark_placeholders(&snippet),
    })
}

fn search(
    ctx: &Ctx,
    doc: &Doc,
    query: &str,
    limit: i64,
    capped: bool,
    room: usize,
    job: &mut Job,
) -> Result<Out, TooLarge> {
    let mut matched = "all_words";
    let mut found = search_pages(ctx, doc, query, limit, false);
    if found.hits.is_empty() {
        matched = "any_word";
        found = search_pages(ctx, doc, query, limit, true);
    }
    let hits = std::mem::take(&mut found.hits);
    // The pages are masked first: the markers and the fragment cuts come after.
    let mut texts = Vec::with_capacity(hits.len());
    for (_, _, text) in &hits {
        texts.push(job.text(text)?.into_owned());
    }
    // The snippets: each page's best fragments, the query's words marked.
    let mut stemmer = Stemmer::new(&found);
    let snippets: Vec<String> = texts
        .iter()
        .map(|t| {
            docs::headline(
                t,
                &found.stems,
                |w| stemmer.is_query_word(w),
                || {
                    pgrx::check_for_interrupts!();
                },
            )
        })
        .collect();
    drop(stemmer);
    let mut room = Room::new(room, 64);
    let mut results = Vec::new();
    for ((page, score, _), snippet) in hits.into_iter().zip(snippets) {
        let snippet = checked_snippet(snippet, job)?;
        let kept = room.take(&snippet);
        if kept.is_empty() {
            // No room left for even a snippet: stop listing hits.
            room.trimmed = true;
            break;
        }
        results.push(
            json!({"page": page, "snippet": kept, "score": (score * 1000.0).round() / 1000.0}),
        );
    }
    let mut value = json!({"doc_id": doc.id, "query_results": results.len(), "matched": matched, "results": results});
    if capped {
        value["max_results_capped_to"] = json!(limit);
    }
    Ok(room.finish(value))
}

// ---------------------------------------------------------------------------------------------
// Ingestion (EXECUTE revoked from PUBLIC; the tenant comes from the caller's context).

const INVALID: PgSqlErrorCode = PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE;

fn ingest_ctx() -> Ctx {
    Ctx::current().unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            "ctxguard: ingestion needs a context (set_context)",
        )
    })
}

fn check_id(id: Option<&str>, what: &str) -> String {
    id.filter(|i| is_valid_id(i))
        .map(str::to_string)
        .unwrap_or_else(|| {
            raise(
                INVALID,
                format!("ctxguard: {what} must be 1-128 printable ASCII characters"),
            )
        })
}

/// Create or update a document's metadata. Setting status `ready` validates the pages and sections,
/// detects repeated headers/footers and indexes the cleaned text, atomically.
#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, parallel_unsafe)]
fn put_document(
    doc_id: Option<&str>,
    title: Option<&str>,
    status: default!(Option<&str>, "'processing'"),
    tags: default!(Option<Vec<String>>, "'{}'"),
    product_version: default!(Option<&str>, "NULL"),
    entity_type: default!(Option<&str>, "NULL"),
    entity_id: default!(Option<&str>, "NULL"),
    language: default!(Option<&str>, "'simple'"),
) -> pgrx::JsonB {
    crate::handler::refuse_inside("put_document");
    let _pin = crate::owner::pin();
    let ctx = ingest_ctx();
    let doc_id = check_id(doc_id, "doc_id");
    let title = title
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= 500)
        .unwrap_or_else(|| raise(INVALID, "ctxguard: title must be 1-500 bytes"));
    let status = status.unwrap_or("processing");
    if !matches!(status, "processing" | "ready" | "failed") {
        raise(
            INVALID,
            "ctxguard: status must be processing, ready or failed",
        );
    }
    let tags = tags.unwrap_or_default();
    if tags.len() > 32 || tags.iter().any(|t| !is_valid_label(t)) {
        raise(INVALID, "ctxguard: tags must be at most 32 short names");
    }
    if product_version.is_some_and(|v| !is_valid_label(v)) {
        raise(INVALID, "ctxguard: product_version must be a short label");
    }
    let entity = match (entity_type, entity_id) {
        (None, None) => None,
        (Some(t), Some(i)) if is_valid_name(t) && is_valid_id(i) => Some((t, i)),
        _ => raise(
            INVALID,
            "ctxguard: entity_type and entity_id go together and must be valid",
        ),
    };
    let language = language.unwrap_or("simple");
    let lang_ok = Spi::connect(|c| {
        c.select(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_ts_config WHERE cfgname = $1)",
            Some(1),
            &[language.into()],
        )?
        .first()
        .get_one::<bool>()
    });
    if lang_ok != Ok(Some(true)) {
        raise(INVALID, "ctxguard: language must be a text search configuration (e.g. simple, english, russian)");
    }
    as_owner(|| {
        Spi::run_with_args(
            "INSERT INTO ctxguard.documents (tenant_id, id, title, status, tags, product_version, entity_type, entity_id, language)
             VALUES ($1, $2, $3, 'processing', $4, $5, $6, $7, $8::pg_catalog.regconfig)
             ON CONFLICT (tenant_id, id) DO UPDATE SET title = EXCLUDED.title, tags = EXCLUDED.tags,
                 product_version = EXCLUDED.product_version, entity_type = EXCLUDED.entity_type,
                 entity_id = EXCLUDED.entity_id, language = EXCLUDED.language, updated_at = pg_catalog.now()",
            &[
                ctx.tenant_id.as_str().into(),
                doc_id.as_str().into(),
                title.into(),
                tags.clone().into(),
                product_version.into(),
                entity.map(|e| e.0).into(),
                entity.map(|e| e.1).into(),
                language.into(),
            ],
        )
    })
    .unwrap_or_else(|e| internal(e));
    let summary = if status == "ready" {
        finalize(&ctx, &doc_id)
    } else {
        json!({})
    };
    as_owner(|| {
        Spi::run_with_args(
            "UPDATE ctxguard.documents SET status = $3 WHERE tenant_id = $1 AND id = $2",
            &[
                ctx.tenant_id.as_str().into(),
                doc_id.as_str().into(),
                status.into(),
            ],
        )
    })
    .unwrap_or_else(|e| internal(e));
    let mut out = json!({"doc_id": doc_id, "status": status});
    if let (Value::Object(o), Value::Object(s)) = (&mut out, summary) {
        o.extend(s);
    }
    pgrx::JsonB(out)
}

/// Pages made ready at a time by [`finalize`].
const FINALIZE_BATCH: i32 = 32;

/// `f` with the bodies of pages `1..=n` of `doc_id`, [`FINALIZE_BATCH`] pages at a time, in order.
fn each_page_batch(ctx: &Ctx, doc_id: &str, n: i32, mut f: impl FnMut(&[(i32, String)])) {
    let mut from = 1;
    while from <= n {
        pgrx::check_for_interrupts!();
        let to = n.min(from.saturating_add(FINALIZE_BATCH - 1));
        let pages: Vec<(i32, String)> = as_owner(|| {
            Spi::connect(|c| {
                select_saved(
                    c,
                    "SELECT page_no, body FROM ctxguard.document_pages
                      WHERE tenant_id = $1 AND doc_id = $2 AND page_no BETWEEN $3 AND $4 ORDER BY page_no",
                    None,
                    &[ctx.tenant_id.as_str().into(), doc_id.into(), from.into(), to.into()],
                )?
                .map(|r| Ok((r.get::<i32>(1)?.unwrap_or(0), r.get::<String>(2)?.unwrap_or_default())))
                .collect::<Result<Vec<_>, pgrx::spi::Error>>()
            })
        })
        .unwrap_or_else(|e| internal(e));
        f(&pages);
        from = to + 1;
    }
}

/// Validate pages 1..n and sections, detect headers/footers, store clean text and its index.
fn finalize(ctx: &Ctx, doc_id: &str) -> Value {
    // Pages 1..n without gaps: their count is their largest number, and none is below 1.
    let (n, low, high) = as_owner(|| {
        Spi::connect(|c| {
            let mut rows = select_saved(
                c,
                "SELECT pg_catalog.count(*)::pg_catalog.int4, pg_catalog.min(page_no), pg_catalog.max(page_no)
                   FROM ctxguard.document_pages WHERE tenant_id = $1 AND doc_id = $2",
                Some(1),
                &[ctx.tenant_id.as_str().into(), doc_id.into()],
            )?;
            let r = rows.next();
            let get = |i| r.as_ref().map_or(Ok(None), |r| r.get::<i32>(i));
            Ok::<_, pgrx::spi::Error>((get(1)?.unwrap_or(0), get(2)?, get(3)?))
        })
    })
    .unwrap_or_else(|e| internal(e));
    if n == 0 || low != Some(1) || high != Some(n) {
        raise(
            INVALID,
            "ctxguard: a ready document needs pages numbered 1..n without gaps",
        );
    }
    let bad_sections = Spi::get_one_with_args::<i64>(
        "SELECT pg_catalog.count(*) FROM ctxguard.document_sections WHERE tenant_id = $1 AND doc_id = $2 AND page_end > $3",
        &[ctx.tenant_id.as_str().into(), doc_id.into(), n.into()],
    );
    if bad_sections != Ok(Some(0)) {
        raise(INVALID, "ctxguard: a section lies beyond the last page");
    }
    // Two passes over the pages, FINALIZE_BATCH at a time (the document is never in memory
    // whole: up to 100,000 pages of 1 MiB): the running headers and footers, then each page
    // cleaned of them and indexed.
    let mut count = docs::BoilerplateCount::default();
    each_page_batch(ctx, doc_id, n, |pages| {
        for (_, body) in pages {
            count.add(body);
        }
    });
    let boilerplate = count.found();
    each_page_batch(ctx, doc_id, n, |pages| {
        let numbers: Vec<i32> = pages.iter().map(|(n, _)| *n).collect();
        let cleaned: Vec<String> = pages
            .iter()
            .map(|(_, b)| docs::strip_boilerplate(b, &boilerplate))
            .collect();
        let (first, last) = (
            numbers.first().copied().unwrap_or(0),
            numbers.last().copied().unwrap_or(0),
        );
        as_owner(|| {
            Spi::connect_mut(|c| {
                // The batch's range of the primary key ($5..$6) bounds the scan of the pages: the
                // pages were written in this transaction, without statistics, and the join alone
                // was planned as a merge join reading the document from its first page for every
                // batch (quadratic in the pages).
                c.update(
                    "UPDATE ctxguard.document_pages p SET clean = u.clean, tsv = pg_catalog.to_tsvector(d.language, u.clean)
                       FROM ROWS FROM (pg_catalog.unnest($3::pg_catalog.int4[]), pg_catalog.unnest($4::pg_catalog.text[])) u(n, clean), ctxguard.documents d
                      WHERE p.tenant_id = $1 AND p.doc_id = $2 AND p.page_no BETWEEN $5 AND $6 AND p.page_no = u.n
                        AND d.tenant_id = $1 AND d.id = $2",
                    None,
                    &[
                        ctx.tenant_id.as_str().into(),
                        doc_id.into(),
                        numbers.into(),
                        cleaned.into(),
                        first.into(),
                        last.into(),
                    ],
                )
                .map(|_| ())
            })
        })
        .unwrap_or_else(|e| internal(e));
    });
    as_owner(|| {
        Spi::connect_mut(|c| {
            // Search candidates (see search_pages): per word, the pages where it occurs most.
            c.update(
                "DELETE FROM ctxguard.document_terms WHERE tenant_id = $1 AND doc_id = $2",
                None,
                &[ctx.tenant_id.as_str().into(), doc_id.into()],
            )?;
            c.update(
                "INSERT INTO ctxguard.document_terms (tenant_id, doc_id, lexeme, hits, page_no)
                 SELECT $1, $2, lexeme, hits, page_no
                   FROM (SELECT u.lexeme, coalesce(pg_catalog.cardinality(u.positions), 1) AS hits, p.page_no,
                                pg_catalog.row_number() OVER (PARTITION BY u.lexeme
                                    ORDER BY coalesce(pg_catalog.cardinality(u.positions), 1) DESC, p.page_no) AS r
                           FROM ctxguard.document_pages p CROSS JOIN LATERAL pg_catalog.unnest(p.tsv) AS u
                          WHERE p.tenant_id = $1 AND p.doc_id = $2) t
                  WHERE r <= $3",
                None,
                &[ctx.tenant_id.as_str().into(), doc_id.into(), TERM_PAGES.into()],
            )?;
            c.update(
                "UPDATE ctxguard.documents SET page_count = $3, boilerplate = $4, updated_at = pg_catalog.now()
                  WHERE tenant_id = $1 AND id = $2",
                None,
                &[ctx.tenant_id.as_str().into(), doc_id.into(), n.into(), boilerplate.clone().into()],
            )?;
            Ok::<_, pgrx::spi::Error>(())
        })
    })
    .unwrap_or_else(|e| internal(e));
    json!({"page_count": n, "boilerplate_lines": boilerplate.len()})
}

fn ensure_document(ctx: &Ctx, doc_id: &str) {
    let exists = as_owner(|| {
        Spi::get_one_with_args::<bool>(
            "SELECT EXISTS (SELECT 1 FROM ctxguard.documents WHERE tenant_id = $1 AND id = $2)",
            &[ctx.tenant_id.as_str().into(), doc_id.into()],
        )
    });
    if exists != Ok(Some(true)) {
        raise(INVALID, "ctxguard: document not found (put_document first)");
    }
}

/// Store one page's text (idempotent). A ready document goes back to `processing`.
#[pg_extern(volatile, parallel_unsafe)]
fn put_page(doc_id: Option<&str>, page_no: Option<i32>, body: Option<&str>) {
    crate::handler::refuse_inside("put_page");
    let _pin = crate::owner::pin();
    let ctx = ingest_ctx();
    let doc_id = check_id(doc_id, "doc_id");
    let page_no = page_no
        .filter(|p| (1..=MAX_PAGES).contains(p))
        .unwrap_or_else(|| raise(INVALID, "ctxguard: page_no must be 1..100000"));
    let body = body
        .filter(|b| b.len() <= MAX_PAGE_BYTES)
        .unwrap_or_else(|| raise(INVALID, "ctxguard: body must be at most 1 MiB"));
    ensure_document(&ctx, &doc_id);
    as_owner(|| {
        Spi::connect_mut(|c| {
            c.update(
                "INSERT INTO ctxguard.document_pages (tenant_id, doc_id, page_no, body) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (tenant_id, doc_id, page_no) DO UPDATE SET body = EXCLUDED.body, clean = NULL, tsv = NULL
                 WHERE ctxguard.document_pages.body IS DISTINCT FROM EXCLUDED.body",
                None,
                &[ctx.tenant_id.as_str().into(), doc_id.as_str().into(), page_no.into(), body.into()],
            )?;
            c.update(
                "UPDATE ctxguard.documents SET status = 'processing' WHERE tenant_id = $1 AND id = $2 AND status = 'ready'
                    AND EXISTS (SELECT 1 FROM ctxguard.document_pages WHERE tenant_id = $1 AND doc_id = $2 AND page_no = $3 AND clean IS NULL)",
                None,
                &[ctx.tenant_id.as_str().into(), doc_id.as_str().into(), page_no.into()],
            )?;
            Ok::<_, pgrx::spi::Error>(())
        })
    })
    .unwrap_or_else(|e| internal(e));
}

/// Store one section (idempotent).
#[pg_extern(volatile, parallel_unsafe)]
fn put_section(
    doc_id: Option<&str>,
    section_id: Option<&str>,
    title: Option<&str>,
    page_start: Option<i32>,
    page_end: Option<i32>,
) {
    crate::handler::refuse_inside("put_section");
    let _pin = crate::owner::pin();
    let ctx = ingest_ctx();
    let doc_id = check_id(doc_id, "doc_id");
    let section_id = check_id(section_id, "section_id");
    let title = title
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= 500)
        .unwrap_or_else(|| raise(INVALID, "ctxguard: title must be 1-500 bytes"));
    let (start, end) = match (page_start, page_end) {
        (Some(s), Some(e)) if s >= 1 && e >= s && e <= MAX_PAGES => (s, e),
        _ => raise(
            INVALID,
            "ctxguard: section pages must satisfy 1 <= page_start <= page_end",
        ),
    };
    ensure_document(&ctx, &doc_id);
    as_owner(|| {
        Spi::run_with_args(
            "INSERT INTO ctxguard.document_sections (tenant_id, doc_id, section_id, title, page_start, page_end)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (tenant_id, doc_id, section_id) DO UPDATE SET title = EXCLUDED.title,
                 page_start = EXCLUDED.page_start, page_end = EXCLUDED.page_end",
            &[ctx.tenant_id.as_str().into(), doc_id.as_str().into(), section_id.as_str().into(), title.into(), start.into(), end.into()],
        )
    })
    .unwrap_or_else(|e| internal(e));
}
