//! Upstream MCP servers: tool discovery (`sync_mcp_tools`), per-server default policies
//! (`set_server_policy`) and the caller's usable servers (`usable_mcp_servers`).
//!
//! Discovered tools enter the catalog as `external` tools named `server.tool` with no policy, so
//! they stay invisible and uncallable until the DBA gives them one (per tool with `set_tool_policy`,
//! or per server with `set_server_policy`). Calls go through `call_tool` (status `authorized`) and
//! `complete_call` in `gates.rs`.

use std::collections::{BTreeMap, HashMap};

use ctxguard_core::args;
use ctxguard_core::docs;
use ctxguard_core::mcp::{catalog_name, definition_hash, is_valid_server_name};
use ctxguard_core::policy;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::{json, Value};

use crate::cache;
use crate::catalog::MAX_DESCRIPTION;
use crate::context::Ctx;
use crate::owner::as_owner;
use crate::pgutil::{jsonb_arg, raise, required, JsonbText};
use ctxguard_core::json::{self, JsonError};

const INVALID: PgSqlErrorCode = PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE;

fn server_exists(server: &str) -> bool {
    server_max_tools(server).is_some()
}

/// The server's `max_tools`, or None if there is no such server.
fn server_max_tools(server: &str) -> Option<usize> {
    as_owner(|| {
        Spi::get_one_with_args::<i32>(
            "SELECT max_tools FROM ctxguard.mcp_servers WHERE name = $1",
            &[server.into()],
        )
    })
    .ok()
    .flatten()
    .map(|n| usize::try_from(n).unwrap_or(0))
}

/// One discovered tool as it will be stored.
#[derive(PartialEq)]
struct Discovered {
    upstream_name: String,
    description: String,
    input_schema: Value,
}

/// Cut `s` to at most `max` bytes (on a character boundary).
fn truncate(s: &str, max: usize) -> &str {
    docs::trim_to_bytes(s, max).0
}

/// Record the tools an upstream server offers (as returned by its `tools/list`): new tools are
/// added without a policy (their definition accepted as first seen), changed ones updated and
/// disabled until the DBA accepts the new definition (`accept_mcp_tool`), vanished ones marked
/// absent (their DBA policies are kept for their return). More tools than the server's
/// `max_tools` is an error (54000) and changes nothing. A tool whose definition is nested deeper
/// than `ctxguard_core::json::MAX_DEPTH` is skipped with its reason, like a tool with an invalid
/// schema: one such tool does not keep the server's others out of the catalog. NULL arguments are
/// 22004. Nothing is written when nothing changed, so the catalog caches stay warm. DBA /
/// discovery role only (EXECUTE is not granted to PUBLIC).
#[pg_extern(volatile, parallel_unsafe)]
fn sync_mcp_tools(server: Option<&str>, tools: Option<JsonbText>) -> JsonB {
    crate::handler::refuse_inside("sync_mcp_tools");
    let _pin = crate::owner::pin();
    let server = required(server, "server");
    if !is_valid_server_name(server) {
        raise(INVALID, "ctxguard: invalid MCP server name");
    }
    let JsonbText(tools) = required(tools, "tools");
    // `jsonb_out` writes an array as `[...]`, nothing before it.
    if !tools.starts_with('[') {
        raise(INVALID, "ctxguard: tools must be a JSON array");
    }
    as_owner(|| {
        let Some(max_tools) = server_max_tools(server) else {
            raise(INVALID, "ctxguard: no such MCP server");
        };
        let list = tool_items(&tools);
        if list.len() > max_tools {
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                "ctxguard: the server lists more tools than its max_tools",
            );
        }
        let mut wanted: BTreeMap<String, Discovered> = BTreeMap::new();
        let mut skipped: Vec<Value> = Vec::new();
        for (listed_name, item) in &list {
            pg_sys::check_for_interrupts!();
            let t = match item {
                Ok(t) => t,
                Err(e) => {
                    let reason = match e {
                        JsonError::TooDeep => "tool definition nested too deeply",
                        JsonError::Syntax | JsonError::Duplicate => "invalid tool definition",
                    };
                    let upstream = listed_name.as_deref().unwrap_or_default();
                    skipped.push(json!({"tool": truncate(upstream, 128), "reason": reason}));
                    continue;
                }
            };
            let upstream = t.get("name").and_then(Value::as_str).unwrap_or_default();
            let Some(name) = catalog_name(server, upstream) else {
                skipped.push(
                    json!({"tool": truncate(upstream, 128), "reason": "name cannot be catalogued"}),
                );
                continue;
            };
            if wanted.contains_key(&name) {
                skipped.push(json!({"tool": truncate(upstream, 128), "reason": "name collides with another tool"}));
                continue;
            }
            let schema = t
                .get("inputSchema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            if args::compile(&schema).is_err() || !schema.is_object() {
                skipped.push(
                    json!({"tool": truncate(upstream, 128), "reason": "invalid input schema"}),
                );
                continue;
            }
            let description = t
                .get("description")
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .unwrap_or("(no description)");
            wanted.insert(
                name,
                Discovered {
                    upstream_name: upstream.to_string(),
                    description: truncate(description, MAX_DESCRIPTION).to_string(),
                    input_schema: schema,
                },
            );
        }
        let result = Spi::connect_mut(|c| {
            let mut existing: HashMap<String, (Option<String>, Discovered, bool)> = HashMap::new();
            for r in c.select(
                "SELECT name, server, upstream_name, description, input_schema, present FROM ctxguard.tools
                  WHERE server = $1 OR name = ANY($2)",
                None,
                &[
                    server.into(),
                    wanted.keys().cloned().collect::<Vec<_>>().into(),
                ],
            )? {
                existing.insert(
                    r.get::<String>(1)?.unwrap_or_default(),
                    (
                        r.get::<String>(2)?,
                        Discovered {
                            upstream_name: r.get::<String>(3)?.unwrap_or_default(),
                            description: r.get::<String>(4)?.unwrap_or_default(),
                            input_schema: r.get::<JsonB>(5)?.map(|j| j.0).unwrap_or(Value::Null),
                        },
                        r.get::<bool>(6)?.unwrap_or(false),
                    ),
                );
            }
            // Clients see '.' as '__': the new names that look like another tool's, looked up at
            // once through the index on that form (a statement per name kept each one's result
            // until the call ended: 130 MB for 10,000 tools).
            let new: Vec<String> = wanted
                .keys()
                .filter(|n| !existing.contains_key(*n))
                .cloned()
                .collect();
            let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
            for r in c.select(
                "SELECT n FROM pg_catalog.unnest($1::pg_catalog.text[]) AS n
                  WHERE EXISTS (SELECT 1 FROM ctxguard.tools t
                                 WHERE pg_catalog.replace(t.name, '.', '__') OPERATOR(pg_catalog.=) pg_catalog.replace(n, '.', '__'))",
                None,
                &[new.into()],
            )? {
                taken.insert(r.get::<String>(1)?.unwrap_or_default());
            }
            let (mut added, mut updated) = (0, 0);
            for (name, d) in &wanted {
                pg_sys::check_for_interrupts!();
                match existing.get(name) {
                    Some((Some(s), old, true)) if s == server && old == d => continue,
                    Some((s, _, _)) if s.as_deref() != Some(server) => {
                        skipped.push(json!({"tool": d.upstream_name, "reason": "name taken by another tool"}));
                        continue;
                    }
                    Some(_) => updated += 1,
                    None => {
                        // Clients see '.' as '__': a new name must not look like another tool's.
                        if taken.contains(name) {
                            skipped.push(json!({"tool": d.upstream_name, "reason": "name taken by another tool as clients see it"}));
                            continue;
                        }
                        added += 1
                    }
                }
                // A new tool's definition is accepted as first seen; a changed one keeps the
                // accepted hash, so it is disabled until the DBA accepts it again.
                let hash = definition_hash(name, &d.description, &d.input_schema);
                c.update(
                    "INSERT INTO ctxguard.tools (name, description, input_schema, kind, server, upstream_name,
                                                 present, definition_hash, accepted_hash)
                     VALUES ($1, $2, $3, 'external', $4, $5, true, $6, $6)
                     ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description,
                         input_schema = EXCLUDED.input_schema, upstream_name = EXCLUDED.upstream_name,
                         present = true, definition_hash = EXCLUDED.definition_hash,
                         version = ctxguard.tools.version + 1, updated_at = pg_catalog.now()",
                    None,
                    &[
                        name.as_str().into(),
                        d.description.as_str().into(),
                        JsonB(d.input_schema.clone()).into(),
                        server.into(),
                        d.upstream_name.as_str().into(),
                        hash.as_str().into(),
                    ],
                )?;
            }
            let gone: Vec<String> = existing
                .iter()
                .filter(|(n, (s, _, present))| {
                    *present && s.as_deref() == Some(server) && !wanted.contains_key(*n)
                })
                .map(|(n, _)| n.clone())
                .collect();
            if !gone.is_empty() {
                // Kept, not deleted: the DBA's per-tool policy must survive a disappearance.
                c.update(
                    "UPDATE ctxguard.tools SET present = false, version = version + 1, updated_at = pg_catalog.now()
                      WHERE server = $1 AND name = ANY($2)",
                    None,
                    &[server.into(), gone.clone().into()],
                )?;
            }
            Ok::<_, pgrx::spi::Error>(json!({
                "added": added, "updated": updated, "removed": gone.len(), "skipped": skipped,
            }))
        });
        JsonB(
            result.unwrap_or_else(|e| {
                raise(INVALID, format!("ctxguard: could not sync MCP tools: {e}"))
            }),
        )
    })
}

/// The tools of a `tools/list` answer (the `jsonb_out` text of an array), one by one: each one's
/// `name` as PostgreSQL reads it (whatever its depth) and its definition parsed on its own, so
/// that one tool nested too deeply is that tool's refusal, not the whole list's.
fn tool_items(tools: &str) -> Vec<(Option<String>, Result<Value, JsonError>)> {
    Spi::connect(|c| {
        c.select(
            "SELECT e.value OPERATOR(pg_catalog.->>) 'name', e.value::pg_catalog.text
               FROM pg_catalog.jsonb_array_elements($1::pg_catalog.jsonb) AS e",
            None,
            &[tools.into()],
        )?
        .map(|r| {
            let name = r.get::<String>(1)?;
            let text = r.get::<String>(2)?.unwrap_or_default();
            Ok((name, json::parse(text.as_bytes())))
        })
        .collect::<Result<Vec<_>, pgrx::spi::Error>>()
    })
    .unwrap_or_else(|e| raise(INVALID, format!("ctxguard: could not read the tools: {e}")))
}

/// Attach (or with NULL, clear) a server-wide default policy: every tool of `server` without a
/// policy of its own gets it, including tools discovered later. Validated like `set_tool_policy`.
/// A NULL server is 22004; a policy nested deeper than `ctxguard_core::json::MAX_DEPTH`, 54000.
#[pg_extern(volatile, parallel_unsafe)]
fn set_server_policy(server: Option<&str>, policy: Option<JsonbText>) {
    crate::handler::refuse_inside("set_server_policy");
    let _pin = crate::owner::pin();
    let server = required(server, "server");
    if !(is_valid_server_name(server) && server_exists(server)) {
        raise(INVALID, "ctxguard: no such MCP server");
    }
    let policy = jsonb_arg(policy, "policy").map(JsonB);
    if let Some(JsonB(p)) = &policy {
        // Entity binding needs the parameter in the schema; the real check is per tool at load.
        let param = p.get("entity_param").and_then(Value::as_str);
        let schema = match param {
            Some(param) => json!({"type": "object", "properties": {param: {"type": "string"}}}),
            None => json!({"type": "object"}),
        };
        let catalog = cache::catalog();
        match policy::parse_policy(p, &schema, |n| catalog.page_type(n)) {
            Err(e) => raise(INVALID, format!("ctxguard: {e}")),
            // Predicates run as a tool's run_as role, which upstream tools do not have.
            Ok(parsed) if parsed.when.is_some() || parsed.approval_when.is_some() => raise(
                INVALID,
                "ctxguard: invalid tool policy: when and approval_when apply to SQL tools only",
            ),
            Ok(_) => {}
        }
    }
    Spi::run_with_args(
        "UPDATE ctxguard.mcp_servers SET default_policy = $2, updated_at = pg_catalog.now() WHERE name = $1",
        &[server.into(), policy.into()],
    )
    .unwrap_or_else(|e| {
        raise(
            INVALID,
            format!("ctxguard: could not set server policy: {e}"),
        )
    });
}

/// The enabled upstream MCP servers the current context's caller may use (none without a context).
#[pg_extern(stable, parallel_unsafe)]
fn usable_mcp_servers() -> SetOfIterator<'static, String> {
    let _pin = crate::owner::pin();
    let names = Ctx::current()
        .map(|ctx| cache::catalog().allowed_servers(&ctx))
        .unwrap_or_default();
    SetOfIterator::new(names)
}

/// The definition hash of an upstream tool (what `accept_mcp_tool` accepts); used by the 0.2.0
/// upgrade to accept the definitions catalogued before definition pinning existed.
#[pg_extern(immutable, parallel_safe)]
fn _definition_hash(name: &str, description: &str, input_schema: &str) -> Option<String> {
    let schema = serde_json::from_str::<Value>(input_schema).ok()?;
    Some(definition_hash(name, description, &schema))
}
