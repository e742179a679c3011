//! DBA-facing catalog functions: page types and tools with their policies.
//! EXECUTE on these is revoked from PUBLIC (see `sql/finalize.sql`).

use ctxguard_core::args;
use ctxguard_core::names::is_valid_name;
use ctxguard_core::policy::{self, Policy};
use pgrx::prelude::*;
use pgrx::JsonB;

use crate::cache;
use crate::pgutil::{jsonb_arg, raise, JsonbText};

const INVALID: PgSqlErrorCode = PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE;
pub const MAX_DESCRIPTION: usize = 4000;

fn check_description(d: Option<&str>) -> &str {
    match d {
        Some(d) if !d.trim().is_empty() && d.len() <= MAX_DESCRIPTION => d,
        _ => raise(
            INVALID,
            "ctxguard: description must be non-empty and at most 4000 bytes",
        ),
    }
}

/// `ctxguard.register_page_type(name, entity_type, description)`; NULL entity type = list page.
#[pg_extern(volatile, parallel_unsafe)]
fn register_page_type(name: Option<&str>, entity_type: Option<&str>, description: Option<&str>) {
    crate::handler::refuse_inside("register_page_type");
    let _pin = crate::owner::pin();
    let name = name
        .filter(|n| is_valid_name(n))
        .unwrap_or_else(|| raise(INVALID, "ctxguard: invalid page type name"));
    if entity_type.is_some_and(|e| !is_valid_name(e)) {
        raise(INVALID, "ctxguard: invalid entity type name");
    }
    let description = check_description(description);
    Spi::run_with_args(
        "INSERT INTO ctxguard.page_types (name, entity_type, description) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET entity_type = EXCLUDED.entity_type,
             description = EXCLUDED.description, updated_at = pg_catalog.now()",
        &[name.into(), entity_type.into(), description.into()],
    )
    .unwrap_or_else(|e| {
        raise(
            INVALID,
            format!("ctxguard: could not register page type: {e}"),
        )
    });
}

fn handler_signature_ok(handler: pg_sys::Oid) -> bool {
    Spi::get_one_with_args::<bool>(
        "SELECT prorettype = 'jsonb'::pg_catalog.regtype AND pronargs = 1 AND proargtypes[0] = 'jsonb'::pg_catalog.regtype
                AND prokind = 'f' AND NOT proretset
         FROM pg_catalog.pg_proc WHERE oid = $1",
        &[handler.into()],
    ) == Ok(Some(true))
}

/// Longest tool title, in characters.
pub const MAX_TITLE_CHARS: usize = 128;

/// A title is 1-128 characters, not blank, without control characters; `None` is no title (clients
/// show a readable form of the name).
fn check_title(title: Option<&str>) -> Option<&str> {
    let title = title?;
    if title.trim().is_empty()
        || title.chars().count() > MAX_TITLE_CHARS
        || title.chars().any(char::is_control)
    {
        raise(
            INVALID,
            "ctxguard: title must be 1-128 characters without control characters",
        );
    }
    Some(title)
}

/// Refuse a tool name that MCP and model clients would see as another tool's: they see `.` as
/// `__` (`invoice.get` is `invoice__get`), so `a.b__c` and `a.b.c` cannot both exist. SQLSTATE
/// 42710 (duplicate_object); the unique index `tools_wire_name_key` is the backstop.
fn refuse_wire_collision(name: &str) {
    let clash = Spi::get_one_with_args::<bool>(
        "SELECT EXISTS (SELECT 1 FROM ctxguard.tools t
                         WHERE pg_catalog.replace(t.name, '.', '__') = pg_catalog.replace($1, '.', '__')
                           AND t.name <> $1)",
        &[name.into()],
    );
    if clash != Ok(Some(false)) {
        raise(
            PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
            "ctxguard: tool name collides with another tool's as clients see it ('.' is sent as '__'): rename one",
        );
    }
}

/// Register (or update in place) a tool and its policy, atomically. Called by the SQL wrapper
/// `ctxguard.register_tool(name, description, input_schema, handler regprocedure, policy, title)`.
#[pg_extern(volatile, parallel_unsafe)]
fn _register_tool(
    name: Option<&str>,
    description: Option<&str>,
    input_schema: Option<JsonbText>,
    handler: Option<pg_sys::Oid>,
    policy: Option<JsonbText>,
    title: Option<&str>,
) {
    crate::handler::refuse_inside("register_tool");
    let _pin = crate::owner::pin();
    let name = name
        .filter(|n| is_valid_name(n))
        .unwrap_or_else(|| raise(INVALID, "ctxguard: invalid tool name"));
    let description = check_description(description);
    let title = check_title(title);
    refuse_wire_collision(name);
    let schema = jsonb_arg(input_schema, "input_schema")
        .unwrap_or_else(|| raise(INVALID, "ctxguard: input_schema is required"));
    if let Err(e) = args::compile(&schema) {
        raise(INVALID, format!("ctxguard: {e}"));
    }
    let handler = handler.unwrap_or_else(|| raise(INVALID, "ctxguard: handler is required"));
    if !handler_signature_ok(handler) {
        raise(
            INVALID,
            "ctxguard: handler must be a function (jsonb) RETURNS jsonb",
        );
    }
    let raw_policy = jsonb_arg(policy, "policy").unwrap_or(serde_json::Value::Null);
    let (p, run_as) = parse_with_run_as(&raw_policy, &schema, true);
    Spi::connect_mut(|c| {
        c.update(
            "INSERT INTO ctxguard.tools (name, description, input_schema, handler, kind, title)
             VALUES ($1, $2, $3, $4::pg_catalog.oid::pg_catalog.regprocedure, 'sql', $5)
             ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description,
                 input_schema = EXCLUDED.input_schema, handler = EXCLUDED.handler, kind = EXCLUDED.kind,
                 title = EXCLUDED.title, version = ctxguard.tools.version + 1, updated_at = pg_catalog.now()",
            None,
            &[
                name.into(),
                description.into(),
                JsonB(schema.clone()).into(),
                handler.into(),
                title.into(),
            ],
        )?;
        upsert_policy(c, name, &p, raw_policy, run_as)?;
        Ok::<_, pgrx::spi::Error>(())
    })
    .unwrap_or_else(|e| raise(INVALID, format!("ctxguard: could not register tool: {e}")));
}

/// Parse a policy document and, for a SQL tool (`needs_run_as`), resolve the role its handler
/// runs as: the policy's `run_as`, else `ctxguard.default_run_as`. Raises 22023 on any problem.
fn parse_with_run_as(
    raw: &serde_json::Value,
    schema: &serde_json::Value,
    needs_run_as: bool,
) -> (Policy, Option<pg_sys::Oid>) {
    let (rest, named) =
        policy::split_run_as(raw).unwrap_or_else(|e| raise(INVALID, format!("ctxguard: {e}")));
    let catalog = cache::catalog();
    let p = policy::parse_policy(&rest, schema, |n| catalog.page_type(n))
        .unwrap_or_else(|e| raise(INVALID, format!("ctxguard: {e}")));
    if !needs_run_as {
        if named.is_some() {
            raise(INVALID, "ctxguard: run_as applies to SQL tools only");
        }
        return (p, None);
    }
    let role = named
        .or_else(|| crate::gucs::get(&crate::gucs::DEFAULT_RUN_AS))
        .unwrap_or_else(|| {
            raise(
                INVALID,
                "ctxguard: a SQL tool needs a run_as role (policy \"run_as\" or ctxguard.default_run_as)",
            )
        });
    (p, Some(check_run_as(&role)))
}

/// The OID of `role` if it may run tool handlers: it exists and `ctxguard._run_as_unfit` (the one
/// definition, shared with `lint()`) says it is fit. Otherwise 22023.
fn check_run_as(role: &str) -> pg_sys::Oid {
    let found = crate::owner::as_owner(|| {
        Spi::connect(|c| {
            let mut rows = c.select(
                "SELECT r.oid, ctxguard._run_as_unfit(r.oid)
                   FROM pg_catalog.pg_roles r WHERE r.rolname = $1",
                Some(1),
                &[role.into()],
            )?;
            Ok::<_, pgrx::spi::Error>(match rows.next() {
                Some(r) => Some((r.get::<pg_sys::Oid>(1)?, r.get::<bool>(2)?.unwrap_or(true))),
                None => None,
            })
        })
    })
    .unwrap_or_else(|e| raise(INVALID, format!("ctxguard: {e}")));
    match found {
        Some((Some(oid), false)) => oid,
        Some(_) => raise(
            INVALID,
            "ctxguard: run_as role must be NOSUPERUSER NOBYPASSRLS, not the extension owner, and own no protected table",
        ),
        None => raise(INVALID, "ctxguard: run_as role does not exist"),
    }
}

fn upsert_policy(
    c: &mut pgrx::spi::SpiClient<'_>,
    name: &str,
    p: &Policy,
    raw: serde_json::Value,
    run_as: Option<pg_sys::Oid>,
) -> Result<(), pgrx::spi::Error> {
    c.update(
            "INSERT INTO ctxguard.tool_policies (tool, page_types, requires_entity, entity_type, entity_param,
                 roles, required_states, read_only, danger, requires_approval, enabled, policy, run_as)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::pg_catalog.oid::pg_catalog.regrole)
             ON CONFLICT (tool) DO UPDATE SET page_types = EXCLUDED.page_types,
                 requires_entity = EXCLUDED.requires_entity, entity_type = EXCLUDED.entity_type,
                 entity_param = EXCLUDED.entity_param, roles = EXCLUDED.roles,
                 required_states = EXCLUDED.required_states, read_only = EXCLUDED.read_only,
                 danger = EXCLUDED.danger, requires_approval = EXCLUDED.requires_approval,
                 enabled = EXCLUDED.enabled, policy = EXCLUDED.policy, run_as = EXCLUDED.run_as,
                 updated_at = pg_catalog.now()",
            None,
            &[
                name.into(),
                p.page_types.clone().into(),
                p.requires_entity.into(),
                p.entity_type.clone().into(),
                p.entity_param.clone().into(),
                p.roles.clone().into(),
                p.required_states.clone().into(),
                p.read_only.into(),
                p.danger.as_str().into(),
                p.requires_approval.into(),
                p.enabled.into(),
                JsonB(raw).into(),
                run_as.into(),
            ],
        )?;
    Ok(())
}

/// Replace the policy of an existing tool (e.g. a built-in document tool), validated like
/// `register_tool`'s.
#[pg_extern(volatile, parallel_unsafe)]
fn set_tool_policy(name: Option<&str>, policy: Option<JsonbText>) {
    crate::handler::refuse_inside("set_tool_policy");
    let _pin = crate::owner::pin();
    let name = name
        .filter(|n| is_valid_name(n))
        .unwrap_or_else(|| raise(INVALID, "ctxguard: invalid tool name"));
    let (schema, kind) = Spi::connect(|c| {
        let row = c
            .select(
                "SELECT input_schema, kind FROM ctxguard.tools WHERE name = $1",
                Some(1),
                &[name.into()],
            )?
            .first();
        row.get_two::<JsonB, String>()
    })
    .ok()
    .and_then(|(s, k)| Some((s?, k?)))
    .unwrap_or_else(|| raise(INVALID, "ctxguard: no such tool"));
    let raw_policy = jsonb_arg(policy, "policy").unwrap_or(serde_json::Value::Null);
    let (p, run_as) = parse_with_run_as(&raw_policy, &schema.0, kind == "sql");
    Spi::connect_mut(|c| upsert_policy(c, name, &p, raw_policy, run_as))
        .unwrap_or_else(|e| raise(INVALID, format!("ctxguard: could not set policy: {e}")));
}
