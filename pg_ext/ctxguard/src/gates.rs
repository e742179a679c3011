//! Gate A (`visible_tools`, `explain_tools`) and Gate B (`call_tool`, `approve_call`), with audit.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use ctxguard_core::args::{self, ArgError, Limits};
use ctxguard_core::binding;
use ctxguard_core::mask::MaskCounts;
use ctxguard_core::names::{is_valid_id, is_valid_name};
use ctxguard_core::namespaces::namespace_of;
use ctxguard_core::policy::{Policy, Reason};
use ctxguard_core::ranking::{self, Candidate, Placement, Tier};
use ctxguard_core::Code;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::{json, Value};

use crate::approvals;
use crate::budget::{self, Budget};
use crate::cache::{self, ToolEntry};
use crate::context::Ctx;
use crate::credentials;
use crate::documents;
use crate::gucs;
use crate::handler;
use crate::ledger;
use crate::masking;
use crate::owner::as_owner;
use crate::pgutil::{self, raise};
use crate::quota;

/// A tool as Gate A shows it.
pub struct Visible {
    pub name: String,
    pub description: String,
    /// The input schema (bound entity parameter stripped) as a `jsonb` datum's bytes: kept with
    /// Gate A's answer (see [`visible`]), so that it is not converted again on every call.
    pub input_schema: crate::pgutil::JsonbBytes,
    pub read_only: bool,
    pub danger: &'static str,
    pub requires_approval: bool,
    /// The upstream MCP server of an external tool.
    pub server: Option<String>,
    /// Its namespace (`ctxguard_core::namespaces::namespace_of`).
    pub namespace: String,
    /// Its relevance to the query it was ranked for (0 without one, or when it does not match).
    pub score: f32,
}

/// Relevance to `words` (an OR text-search query, `ranking::or_query`) of each of `tools` that
/// matches it (`ts_rank` over the catalog's search vector: the tool's name and description as
/// catalogued, which for an upstream tool is the definition the DBA accepted, since a changed one
/// is not visible). A tool that does not match has no entry (score 0).
///
/// The vectors are the cached entries' copies (`ToolEntry::search`), matched and ranked by the
/// functions behind `@@` and `ts_rank` called directly: the same scores as the statement over
/// `ctxguard.tools` they replace, without a lookup of every visible tool by name.
fn scores(words: Option<&str>, tools: &[Rc<ToolEntry>]) -> HashMap<String, f32> {
    let Some(words) = words else {
        return HashMap::new();
    };
    let query = pgutil::english_tsquery(words);
    let mut scores = HashMap::new();
    for t in tools {
        pg_sys::check_for_interrupts!();
        if let Some(score) = t.search.as_ref().and_then(|v| v.matches_rank(query)) {
            scores.insert(t.name.clone(), score);
        }
    }
    scores
}

/// The tier a visible tool fills in the model's list: the page's own tools (DBA tools bound to
/// the entity on the page), the DBA's other tools, then upstream tools (`ctxguard_core::ranking`).
fn tier(t: &ToolEntry, ctx: &Ctx) -> Tier {
    if t.kind == "external" {
        return Tier::Upstream;
    }
    let bound = t.policy.as_ref().and_then(|p| p.entity_type.as_deref());
    match (&ctx.entity, bound) {
        (Some(e), Some(kind)) if e.kind == kind => Tier::Entity,
        _ => Tier::Local,
    }
}

/// Gate A's filter, the one definition every list, ranking and search starts from: the tools of
/// `ctx`'s page type that the context allows (policy, shadow mode on the tool's own pages,
/// definition pinning, upstream server access; `cache::Catalog::reason`).
fn allowed(catalog: &cache::Catalog, ctx: &Ctx) -> Vec<Rc<ToolEntry>> {
    let mut tools = catalog
        .page_tools(&ctx.page_type)
        .iter()
        .filter(|t| catalog.reason(t, Some(ctx)) == Reason::Visible)
        .cloned()
        .collect();
    // A `requires_connection` server's tools, for a user without a connection (issue 33).
    credentials::hide_unconnected(catalog, ctx, &mut tools);
    tools
}

/// `tools` as ranking sees them, scored by `scores`.
fn candidates<'t>(
    tools: &'t [Rc<ToolEntry>],
    ctx: &Ctx,
    scores: &HashMap<String, f32>,
) -> Vec<Candidate<'t>> {
    tools
        .iter()
        .map(|t| Candidate {
            name: &t.name,
            tier: tier(t, ctx),
            server: t.server.as_deref(),
            score: scores.get(&t.name).copied().unwrap_or(0.0),
        })
        .collect()
}

fn per_server() -> usize {
    gucs::MAX_OFFERED_TOOLS_PER_SERVER.get().max(1) as usize
}

/// Every visible tool of `ctx` with its place in the model's list and its score: ranked by
/// `query` within its tier, cut at `top_k` with upstream servers sharing what the page's own tools
/// leave (see `ctxguard_core::ranking`). Offered tools first, in list order.
pub fn ranked(
    ctx: &Ctx,
    query: Option<&str>,
    top_k: Option<i32>,
) -> Vec<(Rc<ToolEntry>, Placement, f32)> {
    ranked_in(&cache::catalog(), ctx, query, top_k)
}

fn ranked_in(
    catalog: &cache::Catalog,
    ctx: &Ctx,
    query: Option<&str>,
    top_k: Option<i32>,
) -> Vec<(Rc<ToolEntry>, Placement, f32)> {
    // The one place a ranking query is read: its size first.
    if query.is_some_and(|q| q.len() > ranking::MAX_RANK_QUERY_BYTES) {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "ctxguard: the ranking query is longer than {} bytes",
                ranking::MAX_RANK_QUERY_BYTES
            ),
        );
    }
    let tools = allowed(catalog, ctx);
    let scores = scores(query.and_then(ranking::or_query).as_deref(), &tools);
    let candidates = candidates(&tools, ctx, &scores);
    let placements = ranking::rank(&candidates, top_k.map(|k| k.max(0) as usize), per_server());
    let mut out: Vec<(Rc<ToolEntry>, Placement, f32)> = tools
        .into_iter()
        .zip(placements)
        .map(|(t, p)| {
            let score = scores.get(&t.name).copied().unwrap_or(0.0);
            (t, p, score)
        })
        .collect();
    out.sort_by_key(|(t, p, _)| match p {
        Placement::Offered(n) => (0, *n, String::new()),
        Placement::LeftOut(_) => (1, 0, t.name.clone()),
    });
    out
}

/// A search of Gate A's tools (`ctxguard.find_tools`): those of `ctx` that match `words` (an OR
/// text-search query, `ranking::or_query`), best first, at most `top_k`, in the order of
/// `ctxguard_core::ranking::search` (the DBA's matching tools by relevance, then upstream tools
/// in the room left, servers taking turns and capped). Nothing outside [`allowed`] is looked at.
pub fn find(ctx: &Ctx, words: Option<&str>, top_k: usize) -> Vec<Visible> {
    let Some(words) = words else {
        return Vec::new();
    };
    let catalog = cache::catalog();
    let tools = allowed(&catalog, ctx);
    let scores = scores(Some(words), &tools);
    let candidates = candidates(&tools, ctx, &scores);
    ranking::search(&candidates, top_k, per_server())
        .into_iter()
        .map(|i| {
            pg_sys::check_for_interrupts!();
            let t = &tools[i];
            shown(t, ctx, scores.get(&t.name).copied().unwrap_or(0.0))
        })
        .collect()
}

/// A visible tool as Gate A shows it: its policy's flags, and its schema with the parameter bound
/// to the page's entity stripped.
fn shown(t: &ToolEntry, ctx: &Ctx, score: f32) -> Visible {
    let p = t.policy.as_ref().expect("visible tools have a policy");
    // The entity parameter is bound to the page's entity: stripped (the entity_param of a policy
    // is the tool's own, so each entry keeps its one stripped form).
    let strip = p
        .entity_param
        .as_deref()
        .filter(|_| ctx.entity.as_ref().map(|e| e.kind.as_str()) == p.entity_type.as_deref());
    Visible {
        name: t.name.clone(),
        description: t.description.clone(),
        input_schema: t.shown_schema(strip),
        read_only: p.read_only,
        danger: p.danger.as_str(),
        requires_approval: p.requires_approval,
        server: t.server.clone(),
        namespace: namespace_of(&t.name, t.server.as_deref()).to_string(),
        score,
    }
}

/// Gate A proper: visible tools for `ctx`, optionally ranked by `query` and cut at `top_k`.
pub fn visible(ctx: &Ctx, query: Option<&str>, top_k: Option<i32>) -> Rc<Vec<Visible>> {
    let catalog = cache::catalog();
    if query.is_some() {
        return Rc::new(visible_in(&catalog, ctx, query, top_k));
    }
    // Without a query the answer is a function of the catalog (its version), the parts of the
    // context that policies and server grants read, and two settings: kept per backend.
    let key = ShownKey {
        tenant_id: ctx.tenant_id.clone(),
        user_id: ctx.user_id.clone(),
        roles: ctx.roles.clone(),
        page_type: ctx.page_type.clone(),
        entity_type: ctx.entity.as_ref().map(|e| e.kind.clone()),
        states: ctx.states.clone(),
        admin_role: gucs::get(&gucs::MCP_ADMIN_ROLE),
        per_server: gucs::MAX_OFFERED_TOOLS_PER_SERVER.get(),
        top_k,
        // The user's connections, where a server hides its tools without one (issue 33).
        connected: catalog
            .any_requires_connection()
            .then(|| credentials::connected_servers(&catalog, ctx)),
    };
    let kept = SHOWN.with(|s| {
        let s = s.borrow();
        (s.catalog.as_ref() == Some(catalog.key()))
            .then(|| s.entries.get(&key).cloned())
            .flatten()
    });
    if let Some(shown) = kept {
        return shown;
    }
    let shown = Rc::new(visible_in(&catalog, ctx, None, top_k));
    let bytes: usize = shown
        .iter()
        .map(|v| v.input_schema.len() + v.name.len() + v.description.len() + 64)
        .sum();
    SHOWN.with(|s| {
        let mut s = s.borrow_mut();
        // Bounded by entries and by bytes (a pooled connection serves many users and contexts;
        // top_k alone makes many keys); a changed catalog empties it.
        if s.catalog.as_ref() != Some(catalog.key())
            || s.entries.len() >= SHOWN_MAX
            || s.bytes + bytes > SHOWN_MAX_BYTES
        {
            *s = Shown {
                catalog: Some(catalog.key().clone()),
                ..Shown::default()
            };
        }
        if bytes <= SHOWN_MAX_BYTES {
            s.bytes += bytes;
            s.entries.insert(key, shown.clone());
        }
    });
    shown
}

/// What [`visible`] answered without a query, by everything the answer depends on besides the
/// catalog (whose version the whole memo is for).
#[derive(PartialEq, Eq, Hash)]
struct ShownKey {
    tenant_id: String,
    user_id: String,
    roles: Vec<String>,
    page_type: String,
    entity_type: Option<String>,
    states: Vec<String>,
    admin_role: Option<String>,
    per_server: i32,
    top_k: Option<i32>,
    connected: Option<Vec<String>>,
}

const SHOWN_MAX: usize = 256;
/// About 4 MB of kept answers per backend at most.
const SHOWN_MAX_BYTES: usize = 4 << 20;

#[derive(Default)]
struct Shown {
    /// The catalog version the entries were made from.
    catalog: Option<(i64, String)>,
    entries: HashMap<ShownKey, Rc<Vec<Visible>>>,
    bytes: usize,
}

thread_local! {
    static SHOWN: std::cell::RefCell<Shown> = std::cell::RefCell::new(Shown::default());
}

fn visible_in(
    catalog: &cache::Catalog,
    ctx: &Ctx,
    query: Option<&str>,
    top_k: Option<i32>,
) -> Vec<Visible> {
    ranked_in(catalog, ctx, query, top_k)
        .into_iter()
        .filter(|(_, p, _)| matches!(p, Placement::Offered(_)))
        .map(|(t, _, score)| shown(&t, ctx, score))
        .collect()
}

/// `ctxguard.visible_tools(query text DEFAULT NULL, top_k int DEFAULT NULL)`, Gate A: the tools
/// the current context allows, bound entity params stripped, optionally ranked. Its SQL is written
/// by hand (`sql/finalize.sql`, the same definition 0.2.0's upgrade script makes) as a C function
/// bound to this symbol, which fills the result in one call (`SFRM_Materialize`) from Gate A's
/// kept answer. pgrx's set-returning form called it once per row, through its guard, with each
/// row's strings cloned first: the one call is 12 µs faster on the 34-tool list the bench's full
/// call asks for (issue 34).
#[no_mangle]
#[doc(hidden)]
pub extern "C" fn pg_finfo_visible_tools_wrapper() -> &'static pg_sys::Pg_finfo_record {
    const V1_API: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
    &V1_API
}

/// See [`pg_finfo_visible_tools_wrapper`].
///
/// # Safety
/// Called by PostgreSQL's function manager, with the arguments its SQL declares.
#[no_mangle]
#[doc(hidden)]
#[pg_guard]
pub unsafe extern "C-unwind" fn visible_tools_wrapper(
    fcinfo: pg_sys::FunctionCallInfo,
) -> pg_sys::Datum {
    // SAFETY: the arguments as declared (text, int4), either NULL.
    let (query, top_k) = unsafe {
        (
            pgrx::fcinfo::pg_getarg::<&str>(fcinfo, 0),
            pgrx::fcinfo::pg_getarg::<i32>(fcinfo, 1),
        )
    };
    let _pin = crate::owner::pin();
    // The tuple store first, so that a call without a context returns an empty set. Its
    // descriptor is the one the caller expects (the function's declared result, from a FROM
    // clause or a select list alike); a caller that takes no set is refused, as by every
    // set-returning function of PostgreSQL's own.
    // SAFETY: fcinfo is this call's.
    unsafe { crate::compat::init_materialized_srf(fcinfo) };
    // SAFETY: the tuple store and its descriptor were just set.
    let (store, desc) = unsafe {
        let rsinfo = (*fcinfo).resultinfo as *mut pg_sys::ReturnSetInfo;
        ((*rsinfo).setResult, (*rsinfo).setDesc)
    };
    // A definition of another shape (only a superuser can bind a C symbol) is refused before a
    // row is formed from the 8 values below.
    if unsafe { (*desc).natts } != 8 {
        raise(
            PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
            "ctxguard.visible_tools: the function's definition does not match this library",
        );
    }
    let Some(ctx) = Ctx::current() else {
        return pg_sys::Datum::from(0);
    };
    let rows = visible(&ctx, query, top_k);
    // SAFETY: 8 columns, as checked; the values are of the declared types.
    unsafe {
        let text = |s: &str| {
            pg_sys::Datum::from(pg_sys::cstring_to_text_with_len(
                s.as_ptr().cast(),
                s.len() as i32,
            ))
        };
        for t in rows.iter() {
            pgrx::check_for_interrupts!();
            let mut values = [
                text(&t.name),
                text(&t.description),
                t.input_schema.clone().into_datum().expect("a jsonb datum"),
                pg_sys::Datum::from(t.read_only),
                text(t.danger),
                pg_sys::Datum::from(t.requires_approval),
                t.server.as_deref().map_or(pg_sys::Datum::from(0), text),
                text(&t.namespace),
            ];
            let mut nulls = [false; 8];
            nulls[6] = t.server.is_none();
            // Copied into the store (in the query's memory); the values themselves are freed with
            // this call's memory.
            pg_sys::tuplestore_putvalues(store, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        }
    }
    pg_sys::Datum::from(0)
}

/// Diagnostics: every catalogued tool with whether it is visible here and why (stable codes),
/// and, for a visible one, whether it is in the model's list for `query` and `top_k` (as
/// `visible_tools(query, top_k)` ranks it) and why not (`top_k`, `page_tools_first`,
/// `server_cap`); what Gate B will still check on a call (`conditions`, see [`conditions`]); and
/// its namespace.
///
/// With `max_hidden`, every visible tool and at most that many hidden ones (the first by name, in
/// the database's collation): the visible ones come from the page's list and the walk over the
/// catalog stops there, so the call costs what the page and `max_hidden` need, not the catalog
/// (the gateway's `POST /v1/tools`, for any user: 1.7 s of one core per request at 100,000 tools
/// without it).
#[pg_extern(stable, parallel_unsafe)]
#[expect(
    clippy::type_complexity,
    reason = "pgrx reads the column names from the name! entries of this signature"
)]
fn explain_tools(
    query: default!(Option<&str>, "NULL"),
    top_k: default!(Option<i32>, "NULL"),
    max_hidden: default!(Option<i32>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(visible, bool),
        name!(reason, String),
        name!(offered, Option<bool>),
        name!(left_out, Option<String>),
        name!(conditions, Option<String>),
        name!(namespace, String),
    ),
> {
    let _pin = crate::owner::pin();
    let ctx = Ctx::current();
    let catalog = cache::catalog();
    let placed: HashMap<String, Placement> = match &ctx {
        Some(ctx) => ranked(ctx, query, top_k)
            .into_iter()
            .map(|(t, p, _)| (t.name.clone(), p))
            .collect(),
        None => HashMap::new(),
    };
    let row = |t: &ToolEntry, reason: Reason| {
        let placement = placed.get(&t.name);
        (
            t.name.clone(),
            reason == Reason::Visible,
            reason.as_str().to_string(),
            placement.map(|p| matches!(p, Placement::Offered(_))),
            placement.and_then(|p| match p {
                Placement::LeftOut(why) => Some(why.as_str().to_string()),
                Placement::Offered(_) => None,
            }),
            conditions(t, catalog.reason_shadowed(t, ctx.as_ref()).1),
            namespace_of(&t.name, t.server.as_deref()).to_string(),
        )
    };
    let mut rows = Vec::new();
    // Bounded: every visible tool from the page's list (Gate A's), which the walk then skips.
    let mut shown: HashSet<String> = HashSet::new();
    if let Some(max_hidden) = max_hidden {
        if max_hidden < 0 {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                "ctxguard: max_hidden must not be negative",
            );
        }
        if let Some(ctx) = &ctx {
            for t in catalog.page_tools(&ctx.page_type).iter() {
                pg_sys::check_for_interrupts!();
                if catalog.reason(t, Some(ctx)) == Reason::Visible && shown.insert(t.name.clone()) {
                    rows.push(row(t, Reason::Visible));
                }
            }
        }
    }
    let mut hidden = 0;
    if max_hidden != Some(0) {
        catalog.each_tool(|t| {
            if shown.contains(&t.name) {
                return true;
            }
            let reason = catalog.reason(t, ctx.as_ref());
            if reason != Reason::Visible {
                hidden += 1;
            }
            rows.push(row(t, reason));
            max_hidden.is_none_or(|m| hidden < m)
        });
    }
    TableIterator::new(rows)
}

/// What Gate B checks on a call to a tool beyond what Gate A shows, named (never evaluated
/// here): `when fn`, `rate_limit 20 per 1h per user` (each quota), `approval_when fn`,
/// `requires_approval`, `approver_roles r1,r2`, and
/// `log_only` with what it lets through on this page (`log_only would_deny:missing_role`).
/// `None` when there is nothing.
fn conditions(t: &ToolEntry, shadowed: Option<Reason>) -> Option<String> {
    let p = t.policy.as_ref()?;
    let mut out = Vec::new();
    if let Some(w) = &p.when {
        out.push(format!("when {w}"));
    }
    for q in &p.rate_limits {
        out.push(format!(
            "rate_limit {} per {} per {}",
            q.calls,
            q.window.as_str(),
            q.per.as_str()
        ));
    }
    if let Some(w) = &p.approval_when {
        out.push(format!("approval_when {w}"));
    }
    if p.requires_approval {
        out.push("requires_approval".to_string());
    }
    if !p.approver_roles.is_empty() {
        out.push(format!("approver_roles {}", p.approver_roles.join(",")));
    }
    if p.log_only {
        out.push(match shadowed {
            Some(r) => format!("log_only would_deny:{}", r.as_str()),
            None => "log_only".to_string(),
        });
    }
    (!out.is_empty()).then(|| out.join("; "))
}

/// The result of one pass through Gate B.
pub(crate) enum Outcome {
    Ok(Value),
    /// Refused: code, message, optional details (e.g. the documents available on this page).
    Denied(Code, String, Option<Value>),
    Pending,
    Failed(String),
    /// An upstream MCP call Gate B allows: the gateway forwards it, then calls `complete_call`.
    Authorized {
        server: String,
        upstream_name: String,
        args: Value,
        /// The server's credential mode now (the gateway refuses to forward with another).
        credential_mode: String,
    },
    /// Four eyes: an approver granted (`granted`) or rejected (`rejected`) another user's call.
    Decided {
        status: &'static str,
        requested_by: String,
    },
    /// `explain_call`: what Gate B would decide (nothing run, nothing charged).
    Explained {
        decision: &'static str,
        code: Option<Code>,
        message: Option<String>,
    },
}

/// How Gate B is asked.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Run {
    /// `call_tool`.
    Call,
    /// `approve_call` replaying a pending approval.
    Approved,
    /// `explain_call`: decide, but run nothing, record no approval, charge nothing.
    Dry,
}

pub(crate) struct Call {
    pub(crate) call_id: uuid::Uuid,
    pub(crate) tool: Option<String>,
    pub(crate) args_hash: Option<String>,
    pub(crate) outcome: Outcome,
    pub(crate) result_bytes: Option<i32>,
    pub(crate) doc_id: Option<String>,
    pub(crate) tokens: Option<u32>,
    pub(crate) masked: Option<MaskCounts>,
    pub(crate) budget: Option<Value>,
    /// The audit record could not be queued or made durable: the call's effects are rolled back.
    pub(crate) unaudited: bool,
    /// The rule that decided a refusal (`explain_call` names it).
    pub(crate) rule: &'static str,
    /// Shadow mode: the call ran, but the policy (in `log_only` mode) would have refused it so.
    pub(crate) would_deny: Option<(Code, String)>,
    /// The state of the tool's quota windows (`rate_limit`), as the call found or left them.
    pub(crate) quotas: Option<Value>,
}

impl Call {
    pub(crate) fn new(call_id: uuid::Uuid) -> Call {
        Call {
            call_id,
            tool: None,
            args_hash: None,
            outcome: Outcome::Pending,
            result_bytes: None,
            doc_id: None,
            tokens: None,
            masked: None,
            budget: None,
            unaudited: false,
            rule: "none",
            would_deny: None,
            quotas: None,
        }
    }
}

/// Decide, run and audit a call in a subtransaction that is kept only if the call's audit record
/// was queued (and, with `ctxguard.audit_wait`, made durable): no effect of a handler, an
/// approval or a completion commits without its record. Ledger charges of a call that leaves no
/// record are given back (`ledger::settle`), also when `run` raises (a cancel, a timeout).
pub(crate) fn audited<R>(run: impl FnOnce() -> (Call, R)) -> (Call, R) {
    ledger::begin_call();
    let out = pgutil::keep_if(
        || {
            let (call, r) = run();
            let keep = !call.unaudited;
            ((call, r), keep)
        },
        ledger::settle,
    );
    // Queued with its record (nothing left), or given back.
    ledger::settle();
    out
}

/// A call's arguments (`{}` when absent) and their encoded size, refused past `max_bytes`
/// (`ctxguard.max_arg_bytes`) before they are parsed.
fn parse_args(args: Option<&str>, max_bytes: usize) -> Result<(Value, usize), ArgError> {
    let text = args.unwrap_or("{}");
    // Bounded before it is parsed: a larger text is refused without building its tree.
    if text.len() > max_bytes {
        return Err(ArgError(format!("arguments exceed {max_bytes} bytes")));
    }
    // Strict: a repeated member is refused (which value would count is ambiguous), and absurdly
    // deep documents are an error, never a crash.
    let v = ctxguard_core::json::parse(text.as_bytes()).map_err(|_| {
        ArgError("arguments are not valid JSON, repeat a member, or are nested too deeply".into())
    })?;
    Ok((v, text.len()))
}

/// The rule a refusal with `code` comes from (what `explain_call` reports).
fn rule_of(code: Code) -> &'static str {
    match code {
        Code::ContextMissing => "context",
        Code::ToolNotFound => "catalog",
        Code::ToolNotVisible => "policy",
        Code::InvalidArgument => "input_schema",
        Code::EntityMismatch => "entity_binding",
        Code::RateLimitExceeded | Code::CapacityExceeded => "budget",
        Code::ApprovalRequired => "requires_approval",
        _ => "gate_b",
    }
}

/// Evaluate a policy predicate for a call; failures are logged with their SQLSTATE, never
/// their message (it may quote data). `None`: it could not be evaluated (fail closed).
fn condition(
    f: Option<pg_sys::Oid>,
    tool: &cache::ToolEntry,
    args: &Value,
    key: &str,
    call_id: uuid::Uuid,
) -> Option<bool> {
    let Some(f) = f else {
        pgrx::log!(
            "ctxguard: policy condition {key} has no function tool={} call_id={call_id}",
            tool.name
        );
        return None;
    };
    match handler::predicate(f, tool.run_as, args) {
        Ok(b) => Some(b),
        Err(handler::Failure::Raised(sqlstate)) => {
            pgrx::log!(
                "ctxguard: policy condition {key} failed tool={} call_id={call_id} sqlstate={sqlstate}",
                tool.name
            );
            None
        }
        Err(handler::Failure::ReturnedNull) => {
            pgrx::log!(
                "ctxguard: policy condition {key} returned NULL tool={} call_id={call_id}",
                tool.name
            );
            None
        }
        Err(handler::Failure::NoRunAs) => {
            pgrx::log!(
                "ctxguard: policy condition {key}: the tool has no usable run_as role tool={} call_id={call_id}",
                tool.name
            );
            None
        }
    }
}

/// Gate B proper.
pub(crate) fn gate_b(
    ctx: Option<&Ctx>,
    name: &str,
    args_text: Option<&str>,
    run: Run,
    call_id: uuid::Uuid,
) -> Call {
    let mut call = Call::new(call_id);
    let deny = |mut call: Call, code: Code, msg: &str| {
        if call.rule == "none" {
            call.rule = rule_of(code);
        }
        call.outcome = Outcome::Denied(code, msg.to_string(), None);
        call
    };
    if is_valid_name(name) {
        call.tool = Some(name.to_string());
    }
    let Some(ctx) = ctx else {
        return deny(
            call,
            Code::ContextMissing,
            "no context is set for this transaction",
        );
    };
    // A refusal is reported below, as INVALID_ARGUMENT, once the tool is known to be visible.
    let max_arg_bytes = gucs::MAX_ARG_BYTES.get().max(0) as usize;
    let parsed = parse_args(args_text, max_arg_bytes);
    if let Ok((v, _)) = &parsed {
        call.args_hash = Some(args::args_hash(v));
    }
    // Unknown and policy-less tools are indistinguishable.
    let catalog = cache::catalog();
    let Some(tool) = call.tool.as_deref().and_then(|n| catalog.tool(n)) else {
        return deny(call, Code::ToolNotFound, "no such tool");
    };
    let Some(policy) = tool.policy.as_ref().filter(|_| !tool.absent) else {
        return deny(call, Code::ToolNotFound, "no such tool");
    };
    // SQL tools run their handler; built-ins are dispatched to documents.rs; external tools are
    // authorized for the gateway to forward; anything else fails closed.
    let handler = tool.handler.filter(|_| tool.kind == "sql");
    let upstream = match (&tool.server, &tool.upstream_name) {
        (Some(s), Some(u)) if tool.kind == "external" => Some((s.clone(), u.clone())),
        _ => None,
    };
    if handler.is_none() && tool.kind != "builtin" && upstream.is_none() {
        return deny(call, Code::ToolNotFound, "no such tool");
    }
    let (reason, shadowed) = catalog.reason_shadowed(&tool, Some(ctx));
    if reason != Reason::Visible {
        return deny(
            call,
            Code::ToolNotVisible,
            &format!("tool is not available here ({})", reason.as_str()),
        );
    }
    // Shadow mode: the first refusal a log_only policy would have made, audited as would_deny.
    let mut would_deny = shadowed.map(|r| {
        (
            Code::ToolNotVisible,
            format!("tool is not available here ({})", r.as_str()),
        )
    });
    let limits = Limits {
        max_bytes: max_arg_bytes,
        ..Limits::default()
    };
    let (args_value, encoded_len) = match parsed {
        Ok(p) => p,
        Err(e) => return deny(call, Code::InvalidArgument, &e.0),
    };
    let mut args_obj =
        match args::check_shape(&args_value, encoded_len, &tool.input_schema, &limits) {
            Ok(o) => o.clone(),
            Err(e) => return deny(call, Code::InvalidArgument, &e.0),
        };
    if let (Some(param), Some(entity)) = (&policy.entity_param, &ctx.entity) {
        if Some(entity.kind.as_str()) == policy.entity_type.as_deref()
            && binding::bind_entity(&mut args_obj, param, &entity.id).is_err()
        {
            return deny(
                call,
                Code::EntityMismatch,
                "the entity argument does not match the entity on this page",
            );
        }
    }
    let bound = Value::Object(args_obj);
    let schema = match tool.schema() {
        Ok(s) => s,
        Err(e) => return deny(call, Code::InvalidArgument, &e.0),
    };
    if let Err(e) = schema.validate(&bound) {
        return deny(call, Code::InvalidArgument, &e.0);
    }
    // Conditions on the call: run on the bound arguments (so they see the page's entity).
    if policy.when.is_some() {
        let refusal = match condition(tool.when_fn, &tool, &bound, "when", call_id) {
            Some(true) => None,
            Some(false) => Some("the policy's condition (when) does not hold for this call"),
            None => Some("the policy's condition (when) could not be evaluated"),
        };
        if let Some(message) = refusal {
            if policy.log_only {
                would_deny.get_or_insert((Code::PolicyDenied, message.to_string()));
            } else {
                call.rule = "when";
                return deny(call, Code::PolicyDenied, message);
            }
        }
    }
    call.would_deny = would_deny;
    // A `user_oauth` server needs the user's own connection (issue 33): nothing is authorized,
    // charged or made pending without one.
    if let Some((server, _)) = &upstream {
        if catalog.user_connection(server).is_some() && !credentials::connected(ctx, server) {
            call.rule = "connection";
            call.outcome = Outcome::Denied(
                Code::ConnectionRequired,
                "this tool's server needs the user's own connection: connect, then retry".into(),
                Some(json!({"server": server})),
            );
            return call;
        }
    }
    // Quotas: after the conditions, before the approval step. A call that may still become
    // pending is only checked here; it is counted when it runs (approve_call), or below.
    let may_pend = run == Run::Call && (policy.requires_approval || policy.approval_when.is_some());
    let how = if run == Run::Dry || may_pend {
        ledger::QuotaUse::Peek
    } else {
        ledger::QuotaUse::Take
    };
    if meet_quotas(&mut call, ctx, &tool.name, policy, how) {
        return call;
    }
    // Approvals are never shadowed; a condition that cannot be evaluated refuses.
    // Does the call need an approval? `None`: its approval_when could not be evaluated.
    let asks = if run == Run::Approved {
        Some(false)
    } else if policy.requires_approval {
        Some(true)
    } else if policy.approval_when.is_some() {
        let f = tool.approval_when_fn;
        condition(f, &tool, &bound, "approval_when", call_id)
    } else {
        Some(false)
    };
    let Some(needs_approval) = asks else {
        call.rule = "approval_when";
        return deny(
            call,
            Code::PolicyDenied,
            "the policy's condition (approval_when) could not be evaluated",
        );
    };
    if needs_approval && run == Run::Dry {
        call.rule = if policy.requires_approval {
            "requires_approval"
        } else {
            "approval_when"
        };
        call.outcome = Outcome::Pending;
        return call;
    }
    if needs_approval {
        // The approval is for exactly this bound call on this page's entity.
        let recorded = approvals::record_pending(
            ctx,
            &tool.name,
            &bound,
            call.args_hash.as_deref().unwrap_or_default(),
            &policy.approver_roles,
            call_id,
        );
        if !recorded {
            call.rule = "pending_approvals";
            return deny(
                call,
                Code::RateLimitExceeded,
                &format!(
                    "pending_approvals: {} calls of this user already wait for an approval",
                    approvals::MAX_PENDING_PER_USER
                ),
            );
        }
        call.outcome = Outcome::Pending;
        return call;
    }
    if may_pend && meet_quotas(&mut call, ctx, &tool.name, policy, ledger::QuotaUse::Take) {
        return call;
    }
    // Budgets: what the generation has used, from the shared-memory ledger (no row lock).
    let budget = match Budget::open(ctx) {
        Ok(b) => b,
        Err(e) => {
            let (code, message) = budget::no_room(e);
            return deny(call, code, &message);
        }
    };
    if budget.remaining() == 0 {
        call.budget = Some(budget.state(None));
        call.rule = "budget";
        call.outcome = Outcome::Denied(
            Code::RateLimitExceeded,
            "bytes_per_generation: the generation's byte budget is spent".into(),
            None,
        );
        return call;
    }
    if run == Run::Dry {
        // Everything Gate B checks before it runs or authorizes anything has passed.
        call.budget = Some(budget.state(None));
        call.outcome = Outcome::Explained {
            decision: "allow",
            code: None,
            message: None,
        };
        return call;
    }
    if let Some((server, upstream_name)) = upstream {
        record_external_call(ctx, &tool.name, call_id);
        call.budget = Some(budget.state(None));
        let credential_mode = catalog
            .credential_mode(&server)
            .unwrap_or_default()
            .to_string();
        call.outcome = Outcome::Authorized {
            server,
            upstream_name,
            args: bound,
            credential_mode,
        };
        return call;
    }
    let mut doc_calls = None;
    let mut coverage = None;
    // Document tools mask page text before they cut or mark it; the result is masked again whole.
    let mut job = masking::Job::new(catalog.mask_key());
    let produced = match tool.kind.as_str() {
        "builtin" => {
            let Value::Object(args) = &bound else {
                unreachable!("checked above")
            };
            match documents::run(&tool.name, ctx, args, &budget, &mut job) {
                Ok(out) => {
                    call.doc_id = out.doc_id;
                    call.tokens = Some(out.tokens);
                    doc_calls = out.doc_calls;
                    coverage = out.coverage;
                    Ok(out.value)
                }
                Err((code, message, details)) => {
                    call.doc_id = args
                        .get("doc_id")
                        .and_then(Value::as_str)
                        .filter(|d| is_valid_id(d))
                        .map(str::to_string);
                    call.budget = Some(budget.state(None));
                    call.outcome = Outcome::Denied(code, message, details);
                    return call;
                }
            }
        }
        _ => run_handler(
            handler.expect("sql tools have a handler"),
            tool.run_as,
            policy.read_only,
            bound,
            &tool.name,
            call_id,
        ),
    };
    let value = match produced {
        Ok(v) => v,
        Err(message) => {
            call.outcome = Outcome::Failed(message);
            return call;
        }
    };
    finish(&mut call, ctx, value, budget, doc_calls, coverage, job);
    call
}

/// The call's quotas (`rate_limit`): counted (`Take`; in shadow mode whether or not they have
/// room), or only read (`Peek`). True when the call is refused: `RATE_LIMIT_EXCEEDED` naming the
/// limit with `retry_after_ms` in the details, or the ledger had no room. In shadow mode an
/// exceeded quota is audited as `would_deny` and the call goes on.
fn meet_quotas(
    call: &mut Call,
    ctx: &Ctx,
    tool: &str,
    policy: &Policy,
    how: ledger::QuotaUse,
) -> bool {
    if policy.rate_limits.is_empty() {
        return false;
    }
    let how = match how {
        ledger::QuotaUse::Take if policy.log_only => ledger::QuotaUse::Force,
        other => other,
    };
    match quota::count(ctx, tool, &policy.rate_limits, how) {
        Err((code, message)) => {
            call.rule = rule_of(code);
            call.outcome = Outcome::Denied(code, message, None);
            true
        }
        Ok(counted) => {
            call.quotas = Some(counted.states);
            match counted.over {
                None => false,
                Some((message, _)) if policy.log_only => {
                    call.would_deny
                        .get_or_insert((Code::RateLimitExceeded, message));
                    false
                }
                Some((message, details)) => {
                    call.rule = "rate_limit";
                    call.outcome = Outcome::Denied(Code::RateLimitExceeded, message, Some(details));
                    true
                }
            }
        }
    }
}

/// Mask secrets and PII in a result (every string, key and matching number), then charge its
/// size to the byte budget. A result too large to mask is refused.
fn finish(
    call: &mut Call,
    ctx: &Ctx,
    mut value: Value,
    budget: Budget,
    doc_calls: Option<i32>,
    coverage: Option<documents::Pages>,
    mut job: masking::Job,
) {
    if let Err(e) = job.json(&mut value) {
        call.budget = Some(budget.state(doc_calls));
        call.outcome = Outcome::Denied(Code::ResultTooLarge, masking::too_large_message(e), None);
        return;
    }
    let text = value.to_string();
    let bytes = text.len() as i64;
    call.masked = Some(job.counts);
    // Charged atomically in the ledger (generation and the user's day), given back only if the
    // call leaves no audit record; then the pages shown, last (a coverage mark is never given back).
    let mut budget = budget;
    match budget.charge(bytes) {
        Ok(Ok(())) => {}
        Ok(Err(message)) => {
            call.budget = Some(budget.state(doc_calls));
            call.outcome = Outcome::Denied(Code::RateLimitExceeded, message, None);
            return;
        }
        Err(e) => {
            call.budget = Some(budget.state(doc_calls));
            let (code, message) = budget::no_room(e);
            call.outcome = Outcome::Denied(code, message, None);
            return;
        }
    }
    if let Some(pages) = coverage {
        if let Err((code, message, details)) = pages.charge(ctx, &budget) {
            call.budget = Some(budget.state(doc_calls));
            call.outcome = Outcome::Denied(code, message, details);
            return;
        }
    }
    call.budget = Some(budget.state(doc_calls));
    call.result_bytes = Some(i32::try_from(bytes).unwrap_or(i32::MAX));
    if call.tokens.is_none() {
        call.tokens = Some(ctxguard_core::docs::estimate_tokens(&text));
    }
    call.outcome = Outcome::Ok(value);
}

/// Run a SQL tool's handler as its run_as role (see `handler.rs`); failures are logged with their
/// SQLSTATE and reported to the caller without their message (it may quote data).
fn run_handler(
    handler: pg_sys::Oid,
    run_as: Option<pg_sys::Oid>,
    read_only: bool,
    args: Value,
    tool: &str,
    call_id: uuid::Uuid,
) -> Result<Value, String> {
    match handler::run(handler, run_as, read_only, args) {
        Ok(v) => Ok(v),
        Err(handler::Failure::ReturnedNull) => Err("tool handler returned NULL".into()),
        Err(handler::Failure::NoRunAs) => {
            pgrx::log!("ctxguard: tool has no usable run_as role tool={tool} call_id={call_id}");
            Err("tool is not runnable: it has no usable run_as role".into())
        }
        Err(handler::Failure::Raised(sqlstate)) => {
            pgrx::log!(
                "ctxguard: tool handler failed tool={} call_id={} sqlstate={}",
                tool,
                call_id,
                sqlstate
            );
            Err(format!("tool handler failed (SQLSTATE {sqlstate})"))
        }
    }
}

fn record_external_call(ctx: &Ctx, tool: &str, call_id: uuid::Uuid) {
    as_owner(|| {
        Spi::run_with_args(
            "INSERT INTO ctxguard.external_calls (call_id, tenant_id, user_id, tool, expires_at)
             VALUES ($1::pg_catalog.uuid, $2, $3, $4, pg_catalog.now() + pg_catalog.make_interval(secs => $5))",
            &[
                call_id.to_string().as_str().into(),
                ctx.tenant_id.as_str().into(),
                ctx.user_id.as_str().into(),
                tool.into(),
                f64::from(crate::ttls::for_tenant(&ctx.tenant_id).external_call).into(),
            ],
        )
    })
    .unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "ctxguard: could not record the authorized call",
        )
    });
}

/// Why a call cannot be audited, logged; the message for the envelope.
fn unavailable(e: ledger::Unavailable) -> String {
    pgrx::log!("ctxguard: call refused, AUDIT_UNAVAILABLE: {}", e.0);
    "the call cannot be audited now; nothing was run or returned, retry later".into()
}

/// Can calls be audited now (a writer, room in its queue)? Checked before any handler runs.
pub(crate) fn audit_ready(call_id: uuid::Uuid) -> Option<JsonB> {
    let e = ledger::ready().err()?;
    let mut call = Call::new(call_id);
    call.outcome = Outcome::Denied(Code::AuditUnavailable, unavailable(e), None);
    Some(envelope(call))
}

/// Queue the audit record (with the call's ledger changes) for the writer and, with
/// `ctxguard.audit_wait`, wait until it is durable. If that fails the call fails: no result
/// leaves without its audit record.
pub(crate) fn audit(ctx: Option<&Ctx>, call: &mut Call) {
    // A call that returns nothing consumed nothing: its charges are given back before its record
    // is written (charges the record carries are those of results that left). Its quota counts
    // ride on the record: a call that passed its quota step counts once it is audited.
    if call.result_bytes.is_none() {
        ledger::settle_unreturned();
    }
    let (decision, code) = match (&call.outcome, &call.would_deny) {
        // Shadow mode: it ran (or was authorized), and the code says what would have refused it.
        (Outcome::Ok(_) | Outcome::Authorized { .. }, Some((c, _))) => {
            ("would_deny", Some(c.as_str()))
        }
        (Outcome::Ok(_), None) => ("allow", None),
        (Outcome::Denied(c, _, _), _) => ("deny", Some(c.as_str())),
        (Outcome::Pending, _) => ("pending", Some(Code::ApprovalRequired.as_str())),
        (Outcome::Failed(_), _) => ("error", Some(Code::ToolError.as_str())),
        (Outcome::Authorized { .. }, None) => ("authorized", None),
        (Outcome::Explained { code, .. }, _) => ("dry_run", code.map(Code::as_str)),
        (Outcome::Decided { status, .. }, _) => (*status, None),
    };
    let entity = ctx.and_then(|c| c.entity.as_ref());
    let masked = call
        .masked
        .as_ref()
        .filter(|m| !m.is_empty())
        .and_then(|m| serde_json::to_value(m).ok());
    let record = json!({
        "call_id": call.call_id.to_string(),
        "tenant_id": ctx.map(|c| c.tenant_id.as_str()),
        "user_id": ctx.map(|c| c.user_id.as_str()),
        "page_type": ctx.map(|c| c.page_type.as_str()),
        "entity_type": entity.map(|e| e.kind.as_str()),
        "entity_id": entity.map(|e| e.id.as_str()),
        "tool": call.tool.as_deref(),
        "decision": decision,
        "code": code,
        "args_hash": call.args_hash.as_deref(),
        "result_bytes": call.result_bytes,
        "generation": ctx.and_then(|c| c.generation.as_deref()),
        "trace_id": ctx.and_then(|c| c.trace_id.as_deref()),
        "doc_id": call.doc_id.as_deref(),
        "tokens": call.tokens,
        "masked": masked,
        "budget": call.budget,
    });
    if let Err(e) = ledger::submit(record).and_then(ledger::wait) {
        call.outcome = Outcome::Denied(Code::AuditUnavailable, unavailable(e), None);
        call.unaudited = true;
    }
}

pub(crate) fn envelope(call: Call) -> JsonB {
    let id = call.call_id.to_string();
    JsonB(match call.outcome {
        Outcome::Ok(result) => json!({"status": "ok", "result": result, "call_id": id}),
        Outcome::Denied(code, message, details) => {
            let mut error = json!({"code": code.as_str(), "message": message});
            if let Some(d) = details {
                error["details"] = d;
            }
            json!({"status": "error", "error": error, "call_id": id})
        }
        Outcome::Pending => {
            json!({"status": "error", "error": {"code": Code::ApprovalRequired.as_str(),
            "message": "this tool needs a user's approval; approve the call_id to run it once"}, "call_id": id})
        }
        Outcome::Failed(message) => {
            json!({"status": "error", "error": {"code": Code::ToolError.as_str(), "message": message}, "call_id": id})
        }
        Outcome::Authorized {
            server,
            upstream_name,
            args,
            credential_mode,
        } => {
            json!({"status": "authorized", "call_id": id, "server": server, "tool": upstream_name, "args": args,
                   "credential_mode": credential_mode})
        }
        Outcome::Decided {
            status,
            requested_by,
        } => {
            json!({"status": status, "call_id": id, "tool": call.tool, "requested_by": requested_by})
        }
        Outcome::Explained {
            decision,
            code,
            message,
        } => {
            let mut out = json!({"status": "ok", "dry_run": true, "call_id": id, "decision": decision,
                "code": code.map(Code::as_str), "message": message, "rule": call.rule});
            if let Some((code, message)) = &call.would_deny {
                out["would_deny"] = json!({"code": code.as_str(), "message": message});
            }
            if let Some(budget) = call.budget {
                out["budget"] = budget;
            }
            if let Some(quotas) = call.quotas {
                out["quotas"] = quotas;
            }
            out
        }
    })
}

/// Gate B: `ctxguard.call_tool(name text, args jsonb DEFAULT '{}')`. Its SQL is written by hand
/// (`sql/finalize.sql`) as a C function bound to this symbol: a SQL wrapper is inlined by the
/// planner in every client statement that calls it (issue 34). The arguments arrive as the text
/// `jsonb_out` makes of them; Gate B checks their size before it parses them, with a depth bound.
#[pg_extern(volatile, parallel_unsafe, sql = false)]
fn call_tool_jsonb(
    name: Option<&str>,
    args: Option<crate::pgutil::JsonbText>,
) -> crate::pgutil::JsonbDatum {
    let args = args.map(|crate::pgutil::JsonbText(text)| text);
    call_tool(name, args.as_deref()).into()
}

/// Gate B with the arguments as JSON text (`ctxguard._call_tool`).
#[pg_extern(volatile, parallel_unsafe)]
fn _call_tool(name: Option<&str>, args: Option<&str>) -> crate::pgutil::JsonbDatum {
    call_tool(name, args).into()
}

fn call_tool(name: Option<&str>, args: Option<&str>) -> JsonB {
    let _pin = crate::owner::pin();
    // A handler may not call tools: its own call already went through Gate B, and a nested call
    // could change the catalog under it.
    handler::refuse_inside("call_tool");
    let ctx = Ctx::current();
    let call_id = uuid::Uuid::new_v4();
    if let Some(refused) = audit_ready(call_id) {
        return refused;
    }
    let (call, ()) = audited(|| {
        let mut call = gate_b(
            ctx.as_ref(),
            name.unwrap_or_default(),
            args,
            Run::Call,
            call_id,
        );
        audit(ctx.as_ref(), &mut call);
        (call, ())
    });
    envelope(call)
}

/// Dry run: what Gate B would decide for this call under the current context (binding applied,
/// predicates evaluated, budgets read), and the rule that decided; nothing is run, authorized,
/// recorded for approval or charged. Audited as `dry_run` with the code it would have returned.
/// Called by the SQL wrapper `ctxguard.explain_call(tool text, args jsonb)`.
#[pg_extern(volatile, parallel_unsafe)]
fn _explain_call(name: Option<&str>, args: Option<&str>) -> crate::pgutil::JsonbDatum {
    explain_call(name, args).into()
}

fn explain_call(name: Option<&str>, args: Option<&str>) -> JsonB {
    let _pin = crate::owner::pin();
    handler::refuse_inside("explain_call");
    let ctx = Ctx::current();
    let call_id = uuid::Uuid::new_v4();
    if let Some(refused) = audit_ready(call_id) {
        return refused;
    }
    let (call, ()) = audited(|| {
        let mut call = gate_b(
            ctx.as_ref(),
            name.unwrap_or_default(),
            args,
            Run::Dry,
            call_id,
        );
        call.outcome = match std::mem::replace(&mut call.outcome, Outcome::Pending) {
            Outcome::Denied(code, message, _) => Outcome::Explained {
                decision: "deny",
                code: Some(code),
                message: Some(message),
            },
            Outcome::Pending => Outcome::Explained {
                decision: "approval_required",
                code: Some(Code::ApprovalRequired),
                message: Some("the call would need a user's approval".into()),
            },
            explained @ Outcome::Explained { .. } => explained,
            // Gate B runs nothing in a dry run; anything else is a bug: refuse, closed.
            _ => Outcome::Denied(Code::ToolError, "dry run failed".into(), None),
        };
        // Nothing leaves but the decision: a dry run consumes nothing.
        ledger::settle();
        audit(ctx.as_ref(), &mut call);
        (call, ())
    });
    envelope(call)
}

/// Second half of an upstream MCP call authorized by `call_tool`: mask the upstream result, charge
/// it to the byte budget and audit it. Each authorized call completes exactly once, for the same
/// tenant and user, within `ctxguard.external_call_ttl`. [`complete_call`] with the result as JSON
/// text (`ctxguard._complete_call`).
#[pg_extern(volatile, parallel_unsafe, name = "_complete_call")]
fn complete_call_text(
    call_id: Option<pgrx::Uuid>,
    result: Option<&str>,
    is_error: default!(Option<bool>, false),
) -> crate::pgutil::JsonbDatum {
    complete_text(call_id, result, is_error).into()
}

fn complete_text(
    call_id: Option<pgrx::Uuid>,
    result: Option<&str>,
    is_error: Option<bool>,
) -> JsonB {
    let _pin = crate::owner::pin();
    handler::refuse_inside("complete_call");
    let Some(is_error) = is_error else {
        raise(
            PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
            "ctxguard: complete_call: is_error must not be NULL",
        )
    };
    let ctx = Ctx::current();
    let id = call_id
        .map(|u| uuid::Uuid::from_bytes(*u.as_bytes()))
        .unwrap_or_default();
    if let Some(refused) = audit_ready(id) {
        return refused;
    }
    let (call, shown) = audited(|| complete(ctx.as_ref(), id, result, is_error));
    let audited_failure = matches!(call.outcome, Outcome::Failed(_));
    let mut env = envelope(call);
    if let (Some(masked), true) = (shown, audited_failure) {
        env.0["result"] = masked;
    }
    env
}

/// `complete_call` after its checks: claim the authorized call, mask and charge the result, audit
/// it. The masked result of a call the upstream reported failed comes back beside the call.
fn complete(
    ctx: Option<&Ctx>,
    id: uuid::Uuid,
    result: Option<&str>,
    is_error: bool,
) -> (Call, Option<Value>) {
    let mut call = Call::new(id);
    let Some(c) = ctx else {
        call.outcome = Outcome::Denied(
            Code::ContextMissing,
            "no context is set for this transaction".into(),
            None,
        );
        audit(None, &mut call);
        return (call, None);
    };
    let claimed = as_owner(|| {
        Spi::connect_mut(|client| {
            let mut rows = client.update(
                "UPDATE ctxguard.external_calls SET completed_at = pg_catalog.now()
                 WHERE call_id = $1::pg_catalog.uuid AND tenant_id = $2 AND user_id = $3
                   AND completed_at IS NULL AND expires_at > pg_catalog.now()
                 RETURNING tool",
                Some(1),
                &[
                    id.to_string().as_str().into(),
                    c.tenant_id.as_str().into(),
                    c.user_id.as_str().into(),
                ],
            )?;
            rows.next()
                .map(|r| r.get::<String>(1))
                .transpose()
                .map(Option::flatten)
        })
    })
    .unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("ctxguard: {e}"),
        )
    });
    let Some(tool) = claimed else {
        // Unknown, foreign, expired and already-completed ids are indistinguishable.
        call.outcome = Outcome::Denied(
            Code::NotFound,
            "no authorized call with this id is awaiting completion".into(),
            None,
        );
        audit(ctx, &mut call);
        return (call, None);
    };
    call.tool = Some(tool);
    // The result is checked for size before it is parsed; an oversize or unparsable result is
    // refused (the authorized call is used up: the gateway cannot retry it with another result).
    let limit = usize::try_from(gucs::MAX_EXTERNAL_RESULT_BYTES.get()).unwrap_or(0);
    let value = match result {
        None => Value::Null,
        Some(text) if text.len() > limit => {
            call.outcome = Outcome::Denied(
                Code::InvalidArgument,
                "the upstream result is larger than ctxguard.max_external_result_bytes".into(),
                None,
            );
            audit(ctx, &mut call);
            return (call, None);
        }
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(v) => v,
            Err(_) => {
                call.outcome = Outcome::Denied(
                    Code::InvalidArgument,
                    "the upstream result is not valid JSON or nested too deeply".into(),
                    None,
                );
                audit(ctx, &mut call);
                return (call, None);
            }
        },
    };
    let catalog = cache::catalog();
    let job = masking::Job::new(catalog.mask_key());
    match Budget::open(c) {
        Ok(budget) => finish(&mut call, c, value, budget, None, None, job),
        Err(e) => {
            let (code, message) = budget::no_room(e);
            call.outcome = Outcome::Denied(code, message, None);
        }
    }
    if is_error {
        if let Outcome::Ok(v) = &call.outcome {
            let masked = v.clone();
            call.outcome = Outcome::Failed("the upstream tool reported an error".into());
            audit(ctx, &mut call);
            return (call, Some(masked));
        }
    }
    audit(ctx, &mut call);
    (call, None)
}

/// `ctxguard.complete_call(call_id uuid, result jsonb, is_error boolean DEFAULT false)`, bound to
/// this symbol by hand-written SQL (`sql/finalize.sql`), as 0.1.0's was: a C function, not a SQL
/// wrapper the planner inlines in every statement that calls it (issue 34). The result arrives as
/// the text `jsonb_out` makes of it ([`JsonbText`](crate::pgutil::JsonbText)), parsed with its
/// bounds by [`complete_text`].
#[pg_extern(volatile, parallel_unsafe, sql = false)]
fn complete_call(
    call_id: Option<pgrx::Uuid>,
    result: Option<crate::pgutil::JsonbText>,
    is_error: default!(Option<bool>, false),
) -> crate::pgutil::JsonbDatum {
    let text = result.map(|crate::pgutil::JsonbText(text)| text);
    complete_text(call_id, text.as_deref(), is_error).into()
}
