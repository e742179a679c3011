//! Gate A (`visible_tools`, `explain_tools`) and Gate B (`call_tool`, `approve_call`), with audit.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use ctxguard_core::args::{self, ArgError, Limits, Schema};
use ctxguard_core::binding;
use ctxguard_core::names::is_valid_name;
use ctxguard_core::policy::{evaluate, Danger, Policy, Reason};
use ctxguard_core::Code;
use pgrx::prelude::*;
use pgrx::spi::SpiHeapTupleData;
use pgrx::JsonB;
use serde_json::{json, Value};

use crate::context::{Ctx, IN_HANDLER};
use crate::gucs;
use crate::pgutil::{as_owner, call_jsonb_function, in_subtransaction, raise};

const TOOL_COLUMNS: &str = "t.name, t.description, t.input_schema, t.handler::oid, t.xmin::text,
    p.page_types, p.requires_entity, p.entity_type, p.entity_param, p.roles, p.required_states,
    p.read_only, p.danger, p.requires_approval, p.enabled, p.tool IS NOT NULL";

/// One catalog row: a tool and, if it has one, its policy.
struct ToolRow {
    name: String,
    description: String,
    input_schema: Value,
    handler: Option<pg_sys::Oid>,
    version: String,
    policy: Option<Policy>,
}

fn read_row(row: &SpiHeapTupleData) -> Result<ToolRow, pgrx::spi::Error> {
    let has_policy = row.get::<bool>(16)?.unwrap_or(false);
    let policy = if has_policy {
        Some(Policy {
            page_types: row.get::<Vec<String>>(6)?.unwrap_or_default(),
            requires_entity: row.get::<bool>(7)?.unwrap_or(true),
            entity_type: row.get::<String>(8)?,
            entity_param: row.get::<String>(9)?,
            roles: row.get::<Vec<String>>(10)?.unwrap_or_default(),
            required_states: row.get::<Vec<String>>(11)?.unwrap_or_default(),
            read_only: row.get::<bool>(12)?.unwrap_or(true),
            danger: row
                .get::<String>(13)?
                .and_then(|d| Danger::parse(&d))
                .unwrap_or(Danger::Destructive),
            requires_approval: row.get::<bool>(14)?.unwrap_or(true),
            enabled: row.get::<bool>(15)?.unwrap_or(false),
        })
    } else {
        None
    };
    Ok(ToolRow {
        name: row.get::<String>(1)?.unwrap_or_default(),
        description: row.get::<String>(2)?.unwrap_or_default(),
        input_schema: row.get::<JsonB>(3)?.map(|j| j.0).unwrap_or(Value::Null),
        handler: row.get::<pg_sys::Oid>(4)?,
        version: row.get::<String>(5)?.unwrap_or_default(),
        policy,
    })
}

/// Words of a free-text query as an OR tsquery (`w1 | w2`); only `[a-z0-9]` so no tsquery syntax.
fn or_query(text: &str) -> Option<String> {
    let mut words: Vec<String> = Vec::new();
    for w in text.split(|c: char| !c.is_ascii_alphanumeric()) {
        let w = w.to_ascii_lowercase();
        if w.len() >= 2 && w.len() <= 32 && !words.contains(&w) && words.len() < 16 {
            words.push(w);
        }
    }
    (!words.is_empty()).then(|| words.join(" | "))
}

/// Gate A: the tools the current context allows, bound entity params stripped, optionally ranked.
#[pg_extern(stable, parallel_safe)]
fn visible_tools(
    query: default!(Option<&str>, "NULL"),
    top_k: default!(Option<i32>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(description, String),
        name!(input_schema, JsonB),
        name!(read_only, bool),
        name!(danger, String),
        name!(requires_approval, bool),
    ),
> {
    let Some(ctx) = Ctx::current() else {
        return TableIterator::new(Vec::new());
    };
    let tsq = query.and_then(or_query);
    let sql = format!(
        "SELECT {TOOL_COLUMNS}, CASE WHEN $2::text IS NULL THEN 0::real
                ELSE ts_rank(t.search, to_tsquery('english', $2)) END
         FROM ctxguard.tools t JOIN ctxguard.tool_policies p ON p.tool = t.name
         WHERE p.enabled AND p.page_types && ARRAY['*', $1]::text[]"
    );
    let mut ranked: Vec<(f32, ToolRow)> = Spi::connect(|c| {
        let rows = c.select(
            &sql,
            None,
            &[ctx.page_type.as_str().into(), tsq.as_deref().into()],
        )?;
        let mut out = Vec::new();
        for row in rows {
            let tool = read_row(&row)?;
            if evaluate(tool.policy.as_ref(), Some(&ctx.view())) == Reason::Visible {
                out.push((row.get::<f32>(17)?.unwrap_or(0.0), tool));
            }
        }
        Ok::<_, pgrx::spi::Error>(out)
    })
    .unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("ctxguard: {e}"),
        )
    });
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
    if let Some(k) = top_k {
        ranked.truncate(k.max(0) as usize);
    }
    let rows: Vec<_> = ranked
        .into_iter()
        .map(|(_, t)| {
            let p = t.policy.expect("visible tools have a policy");
            let schema = match &p.entity_param {
                Some(param)
                    if ctx.entity.as_ref().map(|e| e.kind.as_str()) == p.entity_type.as_deref() =>
                {
                    binding::strip_param(&t.input_schema, param)
                }
                _ => t.input_schema,
            };
            (
                t.name,
                t.description,
                JsonB(schema),
                p.read_only,
                p.danger.as_str().to_string(),
                p.requires_approval,
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Diagnostics: every catalogued tool with whether it is visible here and why (stable codes).
#[pg_extern(stable, parallel_safe)]
fn explain_tools() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(visible, bool),
        name!(reason, String),
    ),
> {
    let ctx = Ctx::current();
    let sql = format!(
        "SELECT {TOOL_COLUMNS} FROM ctxguard.tools t LEFT JOIN ctxguard.tool_policies p ON p.tool = t.name
         ORDER BY t.name"
    );
    let rows = Spi::connect(|c| {
        let mut out = Vec::new();
        for row in c.select(&sql, None, &[])? {
            let tool = read_row(&row)?;
            let reason = evaluate(tool.policy.as_ref(), ctx.as_ref().map(Ctx::view).as_ref());
            out.push((
                tool.name,
                reason == Reason::Visible,
                reason.as_str().to_string(),
            ));
        }
        Ok::<_, pgrx::spi::Error>(out)
    })
    .unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("ctxguard: {e}"),
        )
    });
    TableIterator::new(rows)
}

thread_local! {
    /// Compiled input schemas, keyed by tool name and invalidated by the row version (xmin).
    static SCHEMAS: RefCell<HashMap<String, (String, Rc<Schema>)>> = RefCell::new(HashMap::new());
}

fn compiled_schema(tool: &ToolRow) -> Result<Rc<Schema>, ArgError> {
    if let Some(s) = SCHEMAS.with(|m| {
        m.borrow()
            .get(&tool.name)
            .filter(|(v, _)| *v == tool.version)
            .map(|(_, s)| s.clone())
    }) {
        return Ok(s);
    }
    let compiled = Rc::new(args::compile(&tool.input_schema)?);
    SCHEMAS.with(|m| {
        m.borrow_mut()
            .insert(tool.name.clone(), (tool.version.clone(), compiled.clone()))
    });
    Ok(compiled)
}

/// The result of one pass through Gate B.
enum Outcome {
    Ok(Value),
    Denied(Code, String),
    Pending,
    Failed(String),
}

struct Call {
    call_id: uuid::Uuid,
    tool: Option<String>,
    args_hash: Option<String>,
    outcome: Outcome,
    result_bytes: Option<i32>,
}

fn load_tool(name: &str) -> Option<ToolRow> {
    let sql = format!(
        "SELECT {TOOL_COLUMNS} FROM ctxguard.tools t LEFT JOIN ctxguard.tool_policies p ON p.tool = t.name
         WHERE t.name = $1"
    );
    Spi::connect(|c| {
        let mut rows = c.select(&sql, Some(1), &[name.into()])?;
        rows.next().map(|r| read_row(&r)).transpose()
    })
    .unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("ctxguard: {e}"),
        )
    })
}

fn parse_args(args: Option<&str>) -> Result<(Value, usize), ArgError> {
    let text = args.unwrap_or("{}");
    // serde_json's recursion limit turns absurdly deep documents into an error, never a crash.
    let v = serde_json::from_str::<Value>(text)
        .map_err(|_| ArgError("arguments are not valid JSON or too deep".into()))?;
    Ok((v, text.len()))
}

/// Gate B proper. `approved` is true only when replaying a pending approval.
fn gate_b(
    ctx: Option<&Ctx>,
    name: &str,
    args_text: Option<&str>,
    approved: bool,
    call_id: uuid::Uuid,
) -> Call {
    let mut call = Call {
        call_id,
        tool: None,
        args_hash: None,
        outcome: Outcome::Pending,
        result_bytes: None,
    };
    let deny = |mut call: Call, code: Code, msg: &str| {
        call.outcome = Outcome::Denied(code, msg.to_string());
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
    let parsed = parse_args(args_text);
    if let Ok((v, _)) = &parsed {
        call.args_hash = Some(args::args_hash(v));
    }
    // Unknown and policy-less tools are indistinguishable.
    let Some(tool) = call.tool.as_deref().and_then(load_tool) else {
        return deny(call, Code::ToolNotFound, "no such tool");
    };
    let Some(policy) = tool.policy.as_ref() else {
        return deny(call, Code::ToolNotFound, "no such tool");
    };
    let Some(handler) = tool.handler else {
        return deny(call, Code::ToolNotFound, "no such tool");
    };
    let reason = evaluate(Some(policy), Some(&ctx.view()));
    if reason != Reason::Visible {
        return deny(
            call,
            Code::ToolNotVisible,
            &format!("tool is not available here ({})", reason.as_str()),
        );
    }
    let limits = Limits {
        max_bytes: gucs::MAX_ARG_BYTES.get().max(0) as usize,
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
    let schema = match compiled_schema(&tool) {
        Ok(s) => s,
        Err(e) => return deny(call, Code::InvalidArgument, &e.0),
    };
    if let Err(e) = schema.validate(&bound) {
        return deny(call, Code::InvalidArgument, &e.0);
    }
    if policy.requires_approval && !approved {
        record_pending_approval(
            ctx,
            &tool.name,
            &args_value,
            call.args_hash.as_deref().unwrap_or_default(),
            call_id,
        );
        call.outcome = Outcome::Pending;
        return call;
    }
    struct HandlerFlag;
    impl Drop for HandlerFlag {
        fn drop(&mut self) {
            IN_HANDLER.store(false, Ordering::Relaxed);
        }
    }
    IN_HANDLER.store(true, Ordering::Relaxed);
    let flag = HandlerFlag;
    let result = in_subtransaction(policy.read_only, || {
        call_jsonb_function(handler, JsonB(bound))
    });
    drop(flag);
    match result {
        Ok(Some(JsonB(v))) => {
            call.result_bytes = Some(i32::try_from(v.to_string().len()).unwrap_or(i32::MAX));
            call.outcome = Outcome::Ok(v);
        }
        Ok(None) => call.outcome = Outcome::Failed("tool handler returned NULL".into()),
        Err(caught) => {
            pgrx::log!(
                "ctxguard: tool handler failed tool={} call_id={} sqlstate={}",
                tool.name,
                call_id,
                caught.sqlstate
            );
            call.outcome = Outcome::Failed(format!(
                "tool handler failed (SQLSTATE {})",
                caught.sqlstate
            ));
        }
    }
    call
}

fn record_pending_approval(ctx: &Ctx, tool: &str, args: &Value, hash: &str, call_id: uuid::Uuid) {
    as_owner(|| {
        Spi::run_with_args(
            "INSERT INTO ctxguard.approvals (call_id, tenant_id, user_id, tool, args, args_hash, expires_at)
             VALUES ($1::uuid, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))",
            &[
                call_id.to_string().as_str().into(),
                ctx.tenant_id.as_str().into(),
                ctx.user_id.as_str().into(),
                tool.into(),
                JsonB(args.clone()).into(),
                hash.into(),
                f64::from(gucs::APPROVAL_TTL.get()).into(),
            ],
        )
    })
    .unwrap_or_else(|_| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "ctxguard: could not record approval"));
}

/// Write the audit row. If this fails the whole call fails: no unaudited reads.
fn audit(ctx: Option<&Ctx>, call: &Call) {
    let (decision, code) = match &call.outcome {
        Outcome::Ok(_) => ("allow", None),
        Outcome::Denied(c, _) => ("deny", Some(c.as_str())),
        Outcome::Pending => ("pending", Some(Code::ApprovalRequired.as_str())),
        Outcome::Failed(_) => ("error", Some(Code::ToolError.as_str())),
    };
    let entity = ctx.and_then(|c| c.entity.as_ref());
    as_owner(|| {
        Spi::run_with_args(
            "INSERT INTO ctxguard.audit_log (call_id, tenant_id, user_id, page_type, entity_type, entity_id,
                 tool, decision, code, args_hash, result_bytes, generation, trace_id)
             VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::uuid, $13)",
            &[
                call.call_id.to_string().as_str().into(),
                ctx.map(|c| c.tenant_id.as_str()).into(),
                ctx.map(|c| c.user_id.as_str()).into(),
                ctx.map(|c| c.page_type.as_str()).into(),
                entity.map(|e| e.kind.as_str()).into(),
                entity.map(|e| e.id.as_str()).into(),
                call.tool.as_deref().into(),
                decision.into(),
                code.into(),
                call.args_hash.as_deref().into(),
                call.result_bytes.into(),
                ctx.and_then(|c| c.generation.as_deref()).into(),
                ctx.and_then(|c| c.trace_id.as_deref()).into(),
            ],
        )
    })
    .unwrap_or_else(|_| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "ctxguard: audit write failed; call refused"));
}

fn envelope(call: Call) -> JsonB {
    let id = call.call_id.to_string();
    JsonB(match call.outcome {
        Outcome::Ok(result) => json!({"status": "ok", "result": result, "call_id": id}),
        Outcome::Denied(code, message) => {
            json!({"status": "error", "error": {"code": code.as_str(), "message": message}, "call_id": id})
        }
        Outcome::Pending => {
            json!({"status": "error", "error": {"code": Code::ApprovalRequired.as_str(),
            "message": "this tool needs a user's approval; approve the call_id to run it once"}, "call_id": id})
        }
        Outcome::Failed(message) => {
            json!({"status": "error", "error": {"code": Code::ToolError.as_str(), "message": message}, "call_id": id})
        }
    })
}

/// Gate B: called by the SQL wrapper `ctxguard.call_tool(name text, args jsonb)`.
#[pg_extern(volatile, parallel_unsafe)]
fn _call_tool(name: Option<&str>, args: Option<&str>) -> JsonB {
    let ctx = Ctx::current();
    let call = gate_b(
        ctx.as_ref(),
        name.unwrap_or_default(),
        args,
        false,
        uuid::Uuid::new_v4(),
    );
    audit(ctx.as_ref(), &call);
    envelope(call)
}

/// Run a pending `requires_approval` call exactly once, for the user who was asked.
#[pg_extern(volatile, parallel_unsafe)]
fn approve_call(call_id: Option<pgrx::Uuid>) -> JsonB {
    let ctx = Ctx::current();
    let id = call_id
        .map(|u| uuid::Uuid::from_bytes(*u.as_bytes()))
        .unwrap_or_default();
    let invalid = |ctx: Option<&Ctx>, code: Code, msg: &str| {
        let call = Call {
            call_id: id,
            tool: None,
            args_hash: None,
            outcome: Outcome::Denied(code, msg.into()),
            result_bytes: None,
        };
        audit(ctx, &call);
        envelope(call)
    };
    let Some(c) = ctx.as_ref() else {
        return invalid(
            None,
            Code::ContextMissing,
            "no context is set for this transaction",
        );
    };
    // Atomically consume the approval: a second approve (concurrent or later) finds nothing.
    let claimed = as_owner(|| {
        Spi::connect_mut(|client| {
            let mut rows = client.update(
                "UPDATE ctxguard.approvals SET status = 'approved', used_at = now()
                 WHERE call_id = $1::uuid AND tenant_id = $2 AND user_id = $3
                   AND status = 'pending' AND expires_at > now()
                 RETURNING tool, args::text",
                Some(1),
                &[
                    id.to_string().as_str().into(),
                    c.tenant_id.as_str().into(),
                    c.user_id.as_str().into(),
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
    .unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("ctxguard: {e}"),
        )
    });
    let Some((tool, args)) = claimed else {
        return invalid(
            ctx.as_ref(),
            Code::ApprovalInvalid,
            "no pending approval with this id for this user",
        );
    };
    let call = gate_b(ctx.as_ref(), &tool, Some(&args), true, id);
    audit(ctx.as_ref(), &call);
    envelope(call)
}
