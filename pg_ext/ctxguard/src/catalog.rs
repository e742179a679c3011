//! DBA-facing catalog functions: page types and tools with their policies.
//! EXECUTE on these is revoked from PUBLIC (see `sql/finalize.sql`).

use std::collections::{HashMap, HashSet};

use ctxguard_core::args;
use ctxguard_core::names::{self, is_valid_name};
use ctxguard_core::policy::{self, Policy};
use pgrx::prelude::*;
use pgrx::JsonB;

use crate::cache;
use crate::pgutil::{jsonb_arg, raise, JsonbArg, JsonbText};

const INVALID: PgSqlErrorCode = PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE;
pub const MAX_DESCRIPTION: usize = names::MAX_DESCRIPTION_BYTES;

/// A refusal of a catalog change: its SQLSTATE and message (never a caller's value).
type Refusal = (PgSqlErrorCode, String);

fn invalid<T>(message: impl Into<String>) -> Result<T, Refusal> {
    Err((INVALID, message.into()))
}

/// Raise a refusal, its message prefixed with `at` (e.g. `tools[3]: `).
fn refuse(at: &str, (code, message): Refusal) -> ! {
    raise(code, format!("ctxguard: {at}{message}"))
}

fn check_description(d: Option<&str>) -> &str {
    try_description(d).unwrap_or_else(|r| refuse("", r))
}

fn try_description(d: Option<&str>) -> Result<&str, Refusal> {
    match d.map(|d| names::check_description(d).map(|()| d)) {
        Some(Ok(d)) => Ok(d),
        Some(Err(m)) => invalid(m),
        None => invalid("description must be non-empty and at most 4000 bytes"),
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

/// A title is 1-128 characters, not blank, without control characters
/// (`ctxguard_core::names::check_title`); `None` is no title (clients show a readable form of the
/// name).
fn try_title(title: Option<&str>) -> Result<Option<&str>, Refusal> {
    match title.map(names::check_title) {
        Some(Err(m)) => invalid(m),
        _ => Ok(title),
    }
}

/// Refuse a tool name that MCP and model clients would see as another tool's: they see `.` as
/// `__` (`invoice.get` is `invoice__get`), so `a.b__c` and `a.b.c` cannot both exist. SQLSTATE
/// 42710 (duplicate_object); the unique index `tools_wire_name_key` is the backstop. Looked up
/// through that index, for every name of `names` at once.
fn wire_collisions(names: &[String]) -> Result<Option<String>, Refusal> {
    let clash = Spi::connect(|c| {
        let mut rows = c.select(
            "SELECT n FROM pg_catalog.unnest($1::pg_catalog.text[]) AS n
              WHERE EXISTS (SELECT 1 FROM ctxguard.tools t
                             WHERE pg_catalog.replace(t.name, '.', '__') OPERATOR(pg_catalog.=) pg_catalog.replace(n, '.', '__')
                               AND t.name OPERATOR(pg_catalog.<>) n)
              LIMIT 1",
            Some(1),
            &[names.to_vec().into()],
        )?;
        Ok::<_, pgrx::spi::Error>(match rows.next() {
            Some(r) => r.get::<String>(1)?,
            None => None,
        })
    })
    .map_err(|_| (INVALID, "could not check the tool names".to_string()))?;
    Ok(clash)
}

const WIRE_CLASH: &str =
    "tool name collides with another tool's as clients see it ('.' is sent as '__'): rename one";

/// A SQL tool's definition, checked as `register_tool` checks it.
struct Checked {
    name: String,
    description: String,
    title: Option<String>,
    schema: serde_json::Value,
    handler: pg_sys::Oid,
    policy: Policy,
    raw_policy: serde_json::Value,
    run_as: Option<pg_sys::Oid>,
    predicates: Predicates,
}

/// The functions a policy's `when` and `approval_when` name, resolved and checked.
#[derive(Default, Clone, Copy)]
struct Predicates {
    when: Option<pg_sys::Oid>,
    approval_when: Option<pg_sys::Oid>,
}

/// What checking a list of definitions looks up once: handlers' signatures and run_as roles.
#[derive(Default)]
struct Seen {
    handlers: HashMap<pg_sys::Oid, bool>,
    roles: HashMap<String, Result<pg_sys::Oid, Refusal>>,
    predicates: HashMap<String, Result<pg_sys::Oid, Refusal>>,
}

/// Check one SQL tool's definition (everything but name collisions, which are checked by list).
fn check_tool(
    name: Option<&str>,
    description: Option<&str>,
    schema: Option<serde_json::Value>,
    handler: Option<pg_sys::Oid>,
    raw_policy: serde_json::Value,
    title: Option<&str>,
    seen: &mut Seen,
) -> Result<Checked, Refusal> {
    let Some(name) = name.filter(|n| is_valid_name(n)) else {
        return invalid("invalid tool name");
    };
    let description = try_description(description)?;
    let title = try_title(title)?;
    let Some(schema) = schema else {
        return invalid("input_schema is required");
    };
    if let Err(e) = args::compile(&schema) {
        return invalid(e.to_string());
    }
    let Some(handler) = handler else {
        return invalid("handler is required");
    };
    let ok = *seen
        .handlers
        .entry(handler)
        .or_insert_with(|| handler_signature_ok(handler));
    if !ok {
        return invalid("handler must be a function (jsonb) RETURNS jsonb");
    }
    let (policy, run_as, predicates) = try_parse_with_run_as(&raw_policy, &schema, true, seen)?;
    Ok(Checked {
        predicates,
        name: name.to_string(),
        description: description.to_string(),
        title: title.map(str::to_string),
        schema,
        handler,
        policy,
        raw_policy,
        run_as,
    })
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
    let schema = jsonb_arg(input_schema, "input_schema");
    let raw_policy = jsonb_arg(policy, "policy").unwrap_or(serde_json::Value::Null);
    let t = check_tool(
        name,
        description,
        schema,
        handler,
        raw_policy,
        title,
        &mut Seen::default(),
    )
    .unwrap_or_else(|r| refuse("", r));
    if wire_collisions(std::slice::from_ref(&t.name))
        .unwrap_or_else(|r| refuse("", r))
        .is_some()
    {
        raise(
            PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
            format!("ctxguard: {WIRE_CLASH}"),
        );
    }
    write_tools(std::slice::from_ref(&t))
        .unwrap_or_else(|e| raise(INVALID, format!("ctxguard: could not register tool: {e}")));
}

/// Most bytes of a `register_tools` list (its `jsonb` size, before it is read).
pub const MAX_BULK_BYTES: usize = 64 * 1024 * 1024;
/// Most tools in one `register_tools` list.
pub const MAX_BULK_TOOLS: i64 = 100_000;
/// Tools written per statement by `register_tools`.
const BULK_BATCH: usize = 500;
/// Most bytes of one definition in a `register_tools` list.
const MAX_DEFINITION_BYTES: usize = 1024 * 1024;

/// `ctxguard.register_tools(tools jsonb) RETURNS integer`: register (or update in place) many SQL
/// tools and their policies in one call, all or none: a JSON array of objects with the keys of
/// `register_tool` (`name`, `description`, `input_schema`, `handler` as a schema-qualified
/// signature such as `"app.refund(jsonb)"`, `policy`, optional `title`). Each is checked as
/// `register_tool` checks it; the list is read in parts and written 500 tools per statement, in
/// memory that does not grow with the list. A refusal names the element (`tools[7]: ...`), never
/// its values. At most 64 MB and 100,000 tools (54000 beyond).
#[pg_extern(volatile, parallel_unsafe)]
fn register_tools(tools: Option<JsonbArg>) -> i32 {
    crate::handler::refuse_inside("register_tools");
    let _pin = crate::owner::pin();
    let tools = crate::pgutil::required(tools, "tools");
    let limit = PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED;
    if tools.raw_size() > MAX_BULK_BYTES {
        raise(
            limit,
            "ctxguard: tools is larger than 64 MB: register it in parts",
        );
    }
    let count = Spi::connect(|c| {
        c.select(
            "SELECT CASE WHEN pg_catalog.jsonb_typeof($1) OPERATOR(pg_catalog.=) 'array'
                         THEN pg_catalog.jsonb_array_length($1) END::pg_catalog.int8",
            Some(1),
            &[tools.arg()],
        )?
        .first()
        .get_one::<i64>()
    })
    .unwrap_or_else(|_| raise(INVALID, "ctxguard: could not read tools"));
    let Some(count) = count else {
        raise(
            INVALID,
            "ctxguard: tools must be a JSON array of tool definitions",
        );
    };
    if count > MAX_BULK_TOOLS {
        raise(
            limit,
            "ctxguard: tools holds more than 100000 definitions: register them in parts",
        );
    }
    let mut seen = Seen::default();
    let mut wire: HashSet<String> = HashSet::new();
    let mut batch: Vec<Checked> = Vec::with_capacity(BULK_BATCH);
    let mut index = 0usize;
    let mut done = 0i32;
    let flush = |batch: &mut Vec<Checked>, first: usize| {
        let names: Vec<String> = batch.iter().map(|t| t.name.clone()).collect();
        match wire_collisions(&names) {
            Ok(None) => {}
            Ok(Some(n)) => {
                let at = first + names.iter().position(|m| *m == n).unwrap_or(0);
                raise(
                    PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
                    format!("ctxguard: tools[{at}]: {WIRE_CLASH}"),
                );
            }
            Err(r) => refuse("", r),
        }
        write_tools(batch)
            .unwrap_or_else(|e| raise(INVALID, format!("ctxguard: could not register tools: {e}")));
        batch.clear();
    };
    let mut first = 0usize;
    // Read in parts through a cursor: never the whole list as one text or one parsed value.
    let elements: Result<(), pgrx::spi::Error> = Spi::connect(|c| {
        let mut cursor = c.open_cursor(
            "SELECT e::pg_catalog.text FROM pg_catalog.jsonb_array_elements($1) AS e",
            &[tools.arg()],
        );
        loop {
            let rows = cursor.fetch(BULK_BATCH as i64)?;
            // SAFETY: the part just fetched (freed below, once read; nothing of it is kept).
            let part = unsafe { pg_sys::SPI_tuptable };
            if rows.is_empty() {
                break;
            }
            for row in rows {
                pg_sys::check_for_interrupts!();
                let text = row.get::<String>(1)?.unwrap_or_default();
                let at = format!("tools[{index}]: ");
                let t = definition(&text, &mut seen).unwrap_or_else(|r| refuse(&at, r));
                if !wire.insert(t.name.replace('.', "__")) {
                    raise(
                        PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
                        format!("ctxguard: {at}the name (or its form as clients see it) appears earlier in the list"),
                    );
                }
                batch.push(t);
                index += 1;
            }
            // SAFETY: as above (pgrx frees a cursor's parts only when the connection ends).
            unsafe { pg_sys::SPI_freetuptable(part) };
            done += batch.len() as i32;
            flush(&mut batch, first);
            first = index;
        }
        Ok(())
    });
    elements.unwrap_or_else(|_| raise(INVALID, "ctxguard: could not read tools"));
    done
}

/// One element of a `register_tools` list, checked.
fn definition(text: &str, seen: &mut Seen) -> Result<Checked, Refusal> {
    use ctxguard_core::json::{self, JsonError};
    if text.len() > MAX_DEFINITION_BYTES {
        return Err((
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            "a definition is larger than 1 MB".into(),
        ));
    }
    let mut obj = match json::parse_object(text.as_bytes()) {
        Ok(o) => o,
        Err(JsonError::TooDeep) => {
            return Err((
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "a definition is nested more than {} levels deep",
                    json::MAX_DEPTH
                ),
            ))
        }
        Err(_) => return invalid("each element must be a JSON object (a tool definition)"),
    };
    const KEYS: [&str; 6] = [
        "name",
        "description",
        "input_schema",
        "handler",
        "policy",
        "title",
    ];
    if obj.keys().any(|k| !KEYS.contains(&k.as_str())) {
        return invalid("a definition holds a key other than name, description, input_schema, handler, policy, title");
    }
    let text_of = |v: Option<serde_json::Value>, what: &str| match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(_) => invalid(format!("{what} must be a string")),
    };
    let name = text_of(obj.remove("name"), "name")?;
    let description = text_of(obj.remove("description"), "description")?;
    let title = text_of(obj.remove("title"), "title")?;
    let handler = match text_of(obj.remove("handler"), "handler")? {
        Some(h) => Some(resolve_handler(&h)?),
        None => None,
    };
    let schema = obj.remove("input_schema").filter(|v| !v.is_null());
    let raw_policy = obj.remove("policy").unwrap_or(serde_json::Value::Null);
    check_tool(
        name.as_deref(),
        description.as_deref(),
        schema,
        handler,
        raw_policy,
        title.as_deref(),
        seen,
    )
}

/// A handler's signature (`schema.function(jsonb)`) resolved as the pinned settings read it:
/// nothing on the caller's `search_path` can stand in for it (so it names its schema).
fn resolve_handler(signature: &str) -> Result<pg_sys::Oid, Refusal> {
    if signature.len() > 512 {
        return invalid("handler does not name a function");
    }
    let oid = Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT pg_catalog.to_regprocedure($1)::pg_catalog.oid",
        &[signature.into()],
    );
    match oid {
        Ok(Some(oid)) => Ok(oid),
        _ => invalid("handler does not name a function (give its schema and argument types: \"app.refund(jsonb)\")"),
    }
}

/// Write checked tools and their policies: two statements for the whole list.
fn write_tools(tools: &[Checked]) -> Result<(), pgrx::spi::Error> {
    let rows: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name, "description": t.description, "input_schema": t.schema,
                "handler": t.handler.to_u32(), "title": t.title,
            })
        })
        .collect();
    let policies: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| policy_row(&t.name, &t.policy, &t.raw_policy, t.run_as, t.predicates))
        .collect();
    Spi::connect_mut(|c| {
        c.update(
            "INSERT INTO ctxguard.tools (name, description, input_schema, handler, kind, title)
             SELECT r.name, r.description, r.input_schema, r.handler::pg_catalog.regprocedure, 'sql', r.title
               FROM pg_catalog.jsonb_to_recordset($1::pg_catalog.jsonb) AS r(name pg_catalog.text,
                    description pg_catalog.text, input_schema pg_catalog.jsonb, handler pg_catalog.oid,
                    title pg_catalog.text)
             ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description,
                 input_schema = EXCLUDED.input_schema, handler = EXCLUDED.handler, kind = EXCLUDED.kind,
                 title = EXCLUDED.title, version = ctxguard.tools.version OPERATOR(pg_catalog.+) 1,
                 updated_at = pg_catalog.now()",
            None,
            &[JsonB(serde_json::Value::Array(rows)).into()],
        )?;
        write_policies(c, policies)
    })
}

/// Parse a policy document and, for a SQL tool (`needs_run_as`), resolve the role its handler
/// runs as: the policy's `run_as`, else `ctxguard.default_run_as`. Raises 22023 on any problem.
fn parse_with_run_as(
    raw: &serde_json::Value,
    schema: &serde_json::Value,
    needs_run_as: bool,
) -> (Policy, Option<pg_sys::Oid>, Predicates) {
    try_parse_with_run_as(raw, schema, needs_run_as, &mut Seen::default())
        .unwrap_or_else(|r| refuse("", r))
}

fn try_parse_with_run_as(
    raw: &serde_json::Value,
    schema: &serde_json::Value,
    needs_run_as: bool,
    seen: &mut Seen,
) -> Result<(Policy, Option<pg_sys::Oid>, Predicates), Refusal> {
    let (rest, named) = policy::split_run_as(raw).or_else(|e| invalid(e.to_string()))?;
    let catalog = cache::catalog();
    let p = policy::parse_policy(&rest, schema, |n| catalog.page_type(n))
        .or_else(|e| invalid(e.to_string()))?;
    if !needs_run_as {
        if named.is_some() {
            return invalid("run_as applies to SQL tools only");
        }
        if p.when.is_some() || p.approval_when.is_some() {
            return invalid("when and approval_when apply to SQL tools only");
        }
        return Ok((p, None, Predicates::default()));
    }
    let mut predicates = Predicates::default();
    for (key, name, slot) in [
        ("when", &p.when, &mut predicates.when),
        (
            "approval_when",
            &p.approval_when,
            &mut predicates.approval_when,
        ),
    ] {
        if let Some(name) = name {
            let checked = seen
                .predicates
                .entry(name.clone())
                .or_insert_with(|| check_predicate(name))
                .clone();
            *slot = Some(checked.or_else(|(_, m)| invalid(format!("{key}: {m}")))?);
        }
    }
    let Some(role) = named.or_else(|| crate::gucs::get(&crate::gucs::DEFAULT_RUN_AS)) else {
        return invalid(
            "a SQL tool needs a run_as role (policy \"run_as\" or ctxguard.default_run_as)",
        );
    };
    let oid = seen
        .roles
        .entry(role.clone())
        .or_insert_with(|| check_run_as(&role))
        .clone()?;
    Ok((p, Some(oid), predicates))
}

/// The OID of the predicate `signature` (`schema.name(jsonb)`, as `parse_policy` normalised it) if
/// it may be a policy condition: a function (jsonb) RETURNS boolean, STABLE or IMMUTABLE (it runs
/// read-only on the call's snapshot), owned by neither a superuser nor the extension owner.
fn check_predicate(signature: &str) -> Result<pg_sys::Oid, Refusal> {
    let found = crate::owner::as_owner(|| {
        Spi::connect(|c| {
            let mut rows = c.select(
                "SELECT p.oid,
                        p.prorettype OPERATOR(pg_catalog.=) 'pg_catalog.bool'::pg_catalog.regtype
                            AND NOT p.proretset AND p.prokind OPERATOR(pg_catalog.=) 'f',
                        p.provolatile OPERATOR(pg_catalog.<>) 'v',
                        NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                                     WHERE r.oid OPERATOR(pg_catalog.=) p.proowner AND r.rolsuper)
                            AND p.proowner OPERATOR(pg_catalog.<>) ALL (SELECT e.extowner FROM pg_catalog.pg_extension e
                                                                         WHERE e.extname OPERATOR(pg_catalog.=) 'ctxguard')
                   FROM pg_catalog.pg_proc p
                  WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure($1)",
                Some(1),
                &[signature.into()],
            )?;
            Ok::<_, pgrx::spi::Error>(match rows.next() {
                Some(r) => Some((
                    r.get::<pg_sys::Oid>(1)?,
                    r.get::<bool>(2)?.unwrap_or(false),
                    r.get::<bool>(3)?.unwrap_or(false),
                    r.get::<bool>(4)?.unwrap_or(false),
                )),
                None => None,
            })
        })
    })
    .or_else(|e| invalid(e.to_string()))?;
    match found {
        None => invalid(format!("no function {signature}")),
        Some((_, false, _, _)) => invalid("must be a function (args jsonb) RETURNS boolean"),
        Some((_, _, false, _)) => {
            invalid("must be STABLE or IMMUTABLE (it runs read-only, on the call's snapshot)")
        }
        Some((_, _, _, false)) => {
            invalid("must not be owned by a superuser or the extension owner")
        }
        Some((Some(oid), true, true, true)) => Ok(oid),
        Some((None, ..)) => invalid(format!("no function {signature}")),
    }
}

/// The OID of `role` if it may run tool handlers: it exists and `ctxguard._run_as_unfit` (the one
/// definition, shared with `lint()`) says it is fit. Otherwise 22023.
fn check_run_as(role: &str) -> Result<pg_sys::Oid, Refusal> {
    let found = crate::owner::as_owner(|| {
        Spi::connect(|c| {
            let mut rows = c.select(
                "SELECT r.oid, ctxguard._run_as_unfit(r.oid)
                   FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) $1",
                Some(1),
                &[role.into()],
            )?;
            Ok::<_, pgrx::spi::Error>(match rows.next() {
                Some(r) => Some((r.get::<pg_sys::Oid>(1)?, r.get::<bool>(2)?.unwrap_or(true))),
                None => None,
            })
        })
    })
    .or_else(|e| invalid(e.to_string()))?;
    match found {
        Some((Some(oid), false)) => Ok(oid),
        Some(_) => invalid(
            "run_as role must be NOSUPERUSER NOBYPASSRLS, not the extension owner, and own no protected table",
        ),
        None => invalid("run_as role does not exist"),
    }
}

/// A policy as a row of `ctxguard.tool_policies` for [`write_policies`].
fn policy_row(
    name: &str,
    p: &Policy,
    raw: &serde_json::Value,
    run_as: Option<pg_sys::Oid>,
    predicates: Predicates,
) -> serde_json::Value {
    serde_json::json!({
        "when_fn": predicates.when.map(|o| o.to_u32()),
        "approval_when_fn": predicates.approval_when.map(|o| o.to_u32()),
        "mode": if p.log_only { "log_only" } else { "enforce" },
        "approver_roles": p.approver_roles,
        "rate_limits": ctxguard_core::policy::rate_limits_json(&p.rate_limits),
        "credential_modes": p.credential_modes,
        "tool": name, "page_types": p.page_types, "requires_entity": p.requires_entity,
        "entity_type": p.entity_type, "entity_param": p.entity_param, "roles": p.roles,
        "required_states": p.required_states, "read_only": p.read_only,
        "danger": p.danger.as_str(), "requires_approval": p.requires_approval,
        "enabled": p.enabled, "policy": raw, "run_as": run_as.map(|o| o.to_u32()),
    })
}

/// Insert or replace policies ([`policy_row`]s): one statement for the whole list.
fn write_policies(
    c: &mut pgrx::spi::SpiClient<'_>,
    rows: Vec<serde_json::Value>,
) -> Result<(), pgrx::spi::Error> {
    c.update(
            "INSERT INTO ctxguard.tool_policies (tool, page_types, requires_entity, entity_type, entity_param,
                 roles, required_states, read_only, danger, requires_approval, enabled, policy, run_as,
                 when_fn, approval_when_fn, mode, approver_roles, rate_limits, credential_modes)
             SELECT r.tool, r.page_types, r.requires_entity, r.entity_type, r.entity_param, r.roles,
                    r.required_states, r.read_only, r.danger, r.requires_approval, r.enabled, r.policy,
                    r.run_as::pg_catalog.regrole, r.when_fn::pg_catalog.regprocedure,
                    r.approval_when_fn::pg_catalog.regprocedure, r.mode, r.approver_roles, r.rate_limits,
                    r.credential_modes
               FROM pg_catalog.jsonb_to_recordset($1::pg_catalog.jsonb) AS r(tool pg_catalog.text,
                    page_types pg_catalog.text[], requires_entity pg_catalog.bool, entity_type pg_catalog.text,
                    entity_param pg_catalog.text, roles pg_catalog.text[], required_states pg_catalog.text[],
                    read_only pg_catalog.bool, danger pg_catalog.text, requires_approval pg_catalog.bool,
                    enabled pg_catalog.bool, policy pg_catalog.jsonb, run_as pg_catalog.oid,
                    when_fn pg_catalog.oid, approval_when_fn pg_catalog.oid, mode pg_catalog.text,
                    approver_roles pg_catalog.text[], rate_limits pg_catalog.jsonb,
                    credential_modes pg_catalog.text[])
             ON CONFLICT (tool) DO UPDATE SET page_types = EXCLUDED.page_types,
                 requires_entity = EXCLUDED.requires_entity, entity_type = EXCLUDED.entity_type,
                 entity_param = EXCLUDED.entity_param, roles = EXCLUDED.roles,
                 required_states = EXCLUDED.required_states, read_only = EXCLUDED.read_only,
                 danger = EXCLUDED.danger, requires_approval = EXCLUDED.requires_approval,
                 enabled = EXCLUDED.enabled, policy = EXCLUDED.policy, run_as = EXCLUDED.run_as,
                 when_fn = EXCLUDED.when_fn, approval_when_fn = EXCLUDED.approval_when_fn, mode = EXCLUDED.mode,
                 approver_roles = EXCLUDED.approver_roles,
                 rate_limits = EXCLUDED.rate_limits, credential_modes = EXCLUDED.credential_modes,
                 updated_at = pg_catalog.now()",
            None,
        &[JsonB(serde_json::Value::Array(rows)).into()],
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
    let (p, run_as, predicates) = parse_with_run_as(&raw_policy, &schema.0, kind == "sql");
    Spi::connect_mut(|c| {
        write_policies(
            c,
            vec![policy_row(name, &p, &raw_policy, run_as, predicates)],
        )
    })
    .unwrap_or_else(|e| raise(INVALID, format!("ctxguard: could not set policy: {e}")));
}
