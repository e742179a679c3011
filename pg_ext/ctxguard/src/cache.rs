//! Per-backend cache of the catalog (page types, entity mappings, tools with policies, upstream
//! servers' access, namespaces, tenants' limits), read lazily and bounded.
//!
//! Gate A and Gate B read the catalog on every call; re-planning and re-reading rows each time
//! dominated their cost, so each backend keeps what it read. It keeps only what calls needed, by
//! name: a page type, the tools a page type can show (read through the GIN index on
//! `tool_policies.page_types`), a tool (Gate B), an upstream server's grants for one tenant, a
//! tenant's limits. A catalog of 100,000 tools is never copied into a backend, and a catalog
//! change costs the next call what that call needs (its page's tools), not the whole catalog.
//! What is kept is bounded by `ctxguard.catalog_cache_size` (dropped whole when full, as the
//! version moving drops it) and reported by `ctxguard.catalog_stats()`.
//!
//! The cache is keyed by `(version, xmin)` of `ctxguard.catalog_version`, which statement
//! triggers move on any catalog change, once per transaction. Including xmin means a change made
//! and rolled back by one transaction can never be confused with a later, different change of the
//! same number; in the transaction that moved it, the key also holds the command id.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use ctxguard_core::args::{self, ArgError, Schema};
use ctxguard_core::mcp::{Caller, Grant, Principal, ServerAccess};
use ctxguard_core::page::PageTypeInfo;
use ctxguard_core::policy::{
    evaluate_shadowed, parse_policy, parse_rate_limits, split_run_as, Danger, Policy, Reason,
    CREDENTIAL_MODES,
};
use pgrx::prelude::*;
use pgrx::spi::SpiHeapTupleData;
use pgrx::JsonB;
use serde_json::Value;

use crate::owner::as_owner;
use crate::pgutil::raise;

/// One catalogued tool and, if it has one, its policy.
pub struct ToolEntry {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub handler: Option<pg_sys::Oid>,
    pub kind: String,
    /// The tool's own policy, or for an upstream tool without one, its server's default policy.
    pub policy: Option<Policy>,
    /// Upstream MCP server and the tool's name there (external tools only).
    pub server: Option<String>,
    pub upstream_name: Option<String>,
    /// The role a SQL tool's handler runs as (`tool_policies.run_as`).
    pub run_as: Option<pg_sys::Oid>,
    /// An upstream tool its server no longer lists.
    pub absent: bool,
    /// An upstream tool whose definition changed since the DBA accepted it.
    pub changed: bool,
    /// The policy's `when` and `approval_when` predicates (`tool_policies.when_fn`, ...).
    pub when_fn: Option<pg_sys::Oid>,
    pub approval_when_fn: Option<pg_sys::Oid>,
    /// The catalog's search vector (`tools.search`: name and description), which ranking and
    /// `find_tools` match queries against without reading the row again.
    pub search: Option<crate::pgutil::TsVector>,
    compiled: OnceCell<Result<Rc<Schema>, ArgError>>,
    /// The schema Gate A shows, as a `jsonb` datum's bytes: as catalogued, and with the bound
    /// entity parameter stripped (made on first use, then kept with the entry).
    shown: [OnceCell<crate::pgutil::JsonbBytes>; 2],
}

impl ToolEntry {
    /// The compiled input schema (compiled on first use, then reused while the catalog is unchanged).
    pub fn schema(&self) -> Result<Rc<Schema>, ArgError> {
        self.compiled
            .get_or_init(|| args::compile(&self.input_schema).map(Rc::new))
            .clone()
    }
}

/// Where an entity type lives (from `ctxguard.protect_table`).
pub struct EntityMapping {
    /// Statement text, run as the owner, checking that an id exists in a tenant:
    /// `SELECT EXISTS (SELECT 1 FROM schema.table WHERE id_col = $1::type AND tenant_col = $2::type)`,
    /// every name quoted and schema-qualified.
    pub exists_sql: String,
    /// The id column's type name in `pg_catalog` (`text`, `uuid`, `int8`, ...).
    pub id_type: String,
}

impl EntityMapping {
    /// Can `id` be cast to the id column's type? (Otherwise it cannot exist.)
    pub fn accepts(&self, id: &str) -> bool {
        match self.id_type.as_str() {
            "text" | "varchar" | "bpchar" | "name" => true,
            "uuid" => uuid::Uuid::parse_str(id).is_ok(),
            "int8" | "int4" | "int2" => id.parse::<i64>().is_ok(),
            // Other id types could fail the cast (and the error would quote the id): not found.
            _ => false,
        }
    }
}

/// The upstream servers' access for one caller ([`Catalog::access`]).
#[derive(Clone)]
struct CallerAccess {
    tenant: String,
    user: String,
    roles: Vec<String>,
    /// `role:<r>` for each of its roles, sorted, then `user:<id>`: the grants that can apply.
    principals: Vec<String>,
    /// By server.
    servers: HashMap<String, Rc<ServerAccess>>,
}

pub struct Catalog {
    key: (i64, String),
    /// The key of the version this catalog's other parts (all but tools) were first read for:
    /// a version that changed only tools keeps them, and the masker compiled for them.
    base: (i64, String),
    /// Rows of `ctxguard.tenant_limits` read so far, by tenant (a trigger on that table moves the
    /// catalog's version too, so they are as current as the rest of the catalog).
    limits: RefCell<HashMap<String, TenantLimits>>,
    /// Page types looked up so far (`None`: no such page type).
    page_types: RefCell<HashMap<String, Option<Option<String>>>>,
    /// Every entity mapping (one per protected table: few), read on first use.
    entities: OnceCell<Rc<HashMap<String, Rc<EntityMapping>>>>,
    /// Every upstream server (few), read on first use, without its grants.
    servers: OnceCell<Rc<HashMap<String, Server>>>,
    /// The grants of each server that can apply to one caller: the last one asked about (a
    /// backend serves one caller at a time), so that they neither grow with the users a pooled
    /// backend serves nor take the catalog cache's room from its tools.
    access: RefCell<Option<CallerAccess>>,
    /// Rows of `ctxguard.namespaces` looked up so far (`None`: not registered).
    namespaces: RefCell<HashMap<String, Option<Rc<Described>>>>,
    /// Tools read so far, by name (Gate B reads one; Gate A a page type's).
    tools: RefCell<HashMap<String, Rc<ToolEntry>>>,
    /// The tools that can be visible on a page type (their policy, or their server's default
    /// policy, names it or `*`), by name.
    pages: RefCell<HashMap<String, Rc<[Rc<ToolEntry>]>>>,
    /// Estimated bytes held by `tools`, `pages`, `page_types`, `access` and `namespaces`.
    held: Cell<usize>,
}

/// A namespace's title and description as the DBA gave them: registered
/// (`ctxguard.register_namespace`), or for an upstream server's namespace, the server's description
/// (`ctxguard.mcp_servers.description`).
#[derive(Clone, Default)]
pub struct Described {
    pub title: Option<String>,
    pub description: Option<String>,
}

/// An upstream MCP server as the catalog needs it.
struct Server {
    enabled: bool,
    /// The description the DBA gave it (empty: none).
    description: String,
    default_allow: bool,
    /// The default policy (without `run_as`) for its tools without one, and the page types it names.
    default_policy: Option<Value>,
    default_pages: HashMap<String, Option<String>>,
    /// `requires_connection`: Gate A hides its tools from a user without a connection.
    requires_connection: bool,
    /// `credential_mode` as registered (`static`, `tenant_secret`, `user_oauth`, `token_exchange`).
    credential_mode: String,
}

impl Server {
    /// `credential_mode = 'user_oauth'`: a call needs the user's own connection.
    fn user_connection(&self) -> bool {
        self.credential_mode == "user_oauth"
    }

    /// Does the default policy name page type `page` (or `*`)?
    fn covers(&self, page: &str) -> bool {
        self.default_policy
            .as_ref()
            .and_then(|p| p.get("page_types"))
            .is_some_and(|pt| match pt {
                Value::String(s) => s == "*",
                Value::Array(a) => a
                    .iter()
                    .any(|v| v.as_str().is_some_and(|s| s == "*" || s == page)),
                _ => false,
            })
    }
}

/// A tenant's overrides in `ctxguard.tenant_limits` (NULL: the setting): `max_pages_per_call`,
/// `max_calls_per_document`, `max_bytes_per_generation`, `max_section_tokens`,
/// `max_search_results`, `max_bytes_per_user_day`; and `max_document_coverage`.
pub type TenantLimits = ([Option<i32>; 6], Option<f64>);

/// Most tenants whose limits a catalog keeps (beyond, it forgets them all and reads again).
const LIMITS_KEPT: usize = 10_000;

/// What this backend's catalog cache did (for `ctxguard.catalog_stats()`).
#[derive(Clone, Copy, Default)]
struct Counters {
    /// Versions of the catalog this backend started (each one empty, filled as calls need it).
    versions: u64,
    /// Tools read from the tables (by name or with a page type's list).
    tools_read: u64,
    /// Page types' tool lists read.
    pages_read: u64,
    /// Times the kept tools and lists were dropped to stay within `ctxguard.catalog_cache_size`.
    evictions: u64,
    /// Page lists too large to keep at all (used for their call, then dropped).
    not_kept: u64,
    /// Versions that changed only tools, taken over from the previous one by reading just those.
    refreshed: u64,
}

/// The columns every tool is read with (see [`tool_from_row`]), as the owner.
const TOOL_COLUMNS: &str = "t.name, t.description, t.input_schema, t.handler::pg_catalog.oid, t.kind,
    p.page_types, p.requires_entity, p.entity_type, p.entity_param, p.roles, p.required_states,
    p.read_only, p.danger, p.requires_approval, p.enabled, p.tool IS NOT NULL,
    t.server, t.upstream_name, NULL::pg_catalog.jsonb, p.run_as::pg_catalog.oid, NOT t.present,
    (t.kind OPERATOR(pg_catalog.=) 'external' AND t.accepted_hash IS DISTINCT FROM t.definition_hash),
    p.when_fn::pg_catalog.oid, p.approval_when_fn::pg_catalog.oid,
    p.when_fn::pg_catalog.text, p.approval_when_fn::pg_catalog.text, p.mode, p.approver_roles, p.rate_limits,
    p.credential_modes, t.search";
/// The planner settings of [`Catalog::each_tool`]'s statement: only the name index's order.
const WALK_PLANNER: &[(&std::ffi::CStr, &std::ffi::CStr)] = &[
    (c"enable_seqscan", c"off"),
    (c"enable_bitmapscan", c"off"),
    (c"enable_sort", c"off"),
    (c"enable_indexscan", c"on"),
];
/// The planner settings of [`Catalog::page_tools`]' statements: their indexes (`page_types`' GIN
/// index, `tools.server`'s, the tools' and policies' keys), whatever the statistics say. A generic
/// plan costed the GIN index above a sequential scan of every policy while its pending list held a
/// large load's entries (`sql/tests/superuser/34_page_tools_policies.sql` read 5,083 rows on
/// PostgreSQL 17).
const PAGE_PLANNER: &[(&std::ffi::CStr, &std::ffi::CStr)] = &[(c"enable_seqscan", c"off")];
/// Tools read at a time by [`Catalog::each_tool`].
const NAME_WALK_BATCH: usize = 100;
const TOOL_FROM: &str = "ctxguard.tools t
    LEFT JOIN ctxguard.tool_policies p ON p.tool OPERATOR(pg_catalog.=) t.name";

fn estimate(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + 32,
        Value::Array(a) => 32 + a.iter().map(estimate).sum::<usize>(),
        Value::Object(o) => {
            64 + o
                .iter()
                .map(|(k, v)| k.len() + 48 + estimate(v))
                .sum::<usize>()
        }
        _ => 16,
    }
}

impl ToolEntry {
    /// The schema Gate A shows: without `strip` (the entity parameter bound to the page's entity)
    /// if given, as a `jsonb` datum's bytes, kept with the entry.
    pub fn shown_schema(&self, strip: Option<&str>) -> crate::pgutil::JsonbBytes {
        self.shown[usize::from(strip.is_some())]
            .get_or_init(|| match strip {
                Some(param) => crate::pgutil::JsonbBytes::new(
                    &ctxguard_core::binding::strip_param(&self.input_schema, param),
                ),
                None => crate::pgutil::JsonbBytes::new(&self.input_schema),
            })
            .clone()
    }

    /// Is this tool in page type `page`'s list (its policy, its own or its server's default,
    /// names the page or `*`)? The same tools `Catalog::page_tools` reads.
    fn listed_on(&self, page: &str) -> bool {
        self.policy
            .as_ref()
            .is_some_and(|p| p.page_types.iter().any(|pt| pt == "*" || pt == page))
    }

    /// Bytes this entry holds, roughly (its schema counted twice: parsed and compiled).
    fn bytes(&self) -> usize {
        256 + self.name.len()
            + self.description.len()
            + self.search.as_ref().map_or(0, |v| v.len())
            + 2 * estimate(&self.input_schema)
            + self.policy.as_ref().map_or(0, |p| {
                p.page_types
                    .iter()
                    .chain(&p.roles)
                    .chain(&p.required_states)
                    .map(|s| s.len() + 24)
                    .sum::<usize>()
                    + 128
            })
    }
}

impl Catalog {
    fn new(key: (i64, String)) -> Catalog {
        STATS.with(|s| {
            s.set(Counters {
                versions: s.get().versions + 1,
                ..s.get()
            })
        });
        Catalog {
            base: key.clone(),
            key,
            limits: RefCell::default(),
            page_types: RefCell::default(),
            entities: OnceCell::new(),
            servers: OnceCell::new(),
            access: RefCell::default(),
            namespaces: RefCell::default(),
            tools: RefCell::default(),
            pages: RefCell::default(),
            held: Cell::new(0),
        }
    }

    /// Make room for `bytes` more within `ctxguard.catalog_cache_size`; false if they alone exceed it.
    fn room_for(&self, bytes: usize) -> bool {
        let cap = cache_bytes();
        if bytes > cap {
            return false;
        }
        if self.held.get() + bytes > cap {
            self.tools.borrow_mut().clear();
            self.pages.borrow_mut().clear();
            self.page_types.borrow_mut().clear();
            self.namespaces.borrow_mut().clear();
            self.held.set(0);
            count(|c| c.evictions += 1);
        }
        self.held.set(self.held.get() + bytes);
        true
    }

    /// `tenant`'s row of `ctxguard.tenant_limits`, read (as the owner) once per catalog version.
    pub fn tenant_limits(&self, tenant: &str) -> TenantLimits {
        if let Some(l) = self.limits.borrow().get(tenant) {
            return *l;
        }
        let l = as_owner(|| {
            crate::pgutil::select_fresh(
                "SELECT max_pages_per_call, max_calls_per_document, max_bytes_per_generation,
                        max_section_tokens, max_search_results, max_bytes_per_user_day,
                        max_document_coverage::pg_catalog.float8
                   FROM ctxguard.tenant_limits WHERE tenant_id OPERATOR(pg_catalog.=) $1",
                Some(1),
                &[tenant.into()],
                |mut rows| {
                    let Some(r) = rows.next() else {
                        return Ok(([None; 6], None));
                    };
                    Ok((
                        [
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                        ],
                        r.get(7)?,
                    ))
                },
            )
        })
        .unwrap_or_else(|e| internal(e));
        let mut kept = self.limits.borrow_mut();
        if kept.len() >= LIMITS_KEPT {
            kept.clear();
        }
        kept.insert(tenant.to_string(), l);
        l
    }

    /// The catalog's cache key: `(version, xmin)` of `ctxguard.catalog_version` (also moved by
    /// mask-rule and tenant-limit changes), with the command id while this transaction is the
    /// one that last moved it.
    pub fn key(&self) -> &(i64, String) {
        &self.key
    }

    /// The key of the version whose parts other than tools this catalog holds (mask rules among
    /// them): what the masker is compiled for.
    pub fn mask_key(&self) -> &(i64, String) {
        &self.base
    }

    /// The catalog of version `key`, taken over from `old` when every version between changed
    /// only the tools `changed`: what `old` kept of other tools, page types, entities, servers,
    /// grants and limits stays; the changed tools are read again and put in the page lists they
    /// now belong to. The first call after a change costs that change, not its page's tools.
    fn refreshed(old: &Catalog, key: (i64, String), changed: &HashSet<String>) -> Catalog {
        let new = Catalog::new(key);
        count(|c| c.refreshed += 1);
        let mut names: Vec<String> = changed.iter().cloned().collect();
        names.sort();
        if let Some(e) = old.entities.get() {
            let _ = new.entities.set(e.clone());
        }
        if let Some(sv) = old.servers.get() {
            let _ = new.servers.set(sv.clone());
        }
        let fresh: Vec<Rc<ToolEntry>> = if names.is_empty() {
            Vec::new()
        } else {
            let sql = format!(
                "SELECT {TOOL_COLUMNS} FROM {TOOL_FROM}
                  WHERE t.name OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])"
            );
            new.read_tools(&sql, &[names.into()])
        };
        *new.limits.borrow_mut() = old.limits.borrow().clone();
        *new.page_types.borrow_mut() = old.page_types.borrow().clone();
        new.access.replace(old.access.borrow().clone());
        *new.namespaces.borrow_mut() = old.namespaces.borrow().clone();
        let mut tools: HashMap<String, Rc<ToolEntry>> = old
            .tools
            .borrow()
            .iter()
            .filter(|(n, _)| !changed.contains(*n))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        let mut added = 0usize;
        for t in &fresh {
            added += t.bytes();
            tools.insert(t.name.clone(), t.clone());
        }
        let pages: HashMap<String, Rc<[Rc<ToolEntry>]>> = old
            .pages
            .borrow()
            .iter()
            .map(|(page, list)| {
                let mut l: Vec<Rc<ToolEntry>> = list
                    .iter()
                    .filter(|t| !changed.contains(&t.name))
                    .cloned()
                    .collect();
                l.extend(fresh.iter().filter(|t| t.listed_on(page)).cloned());
                l.sort_by(|a, b| a.name.cmp(&b.name));
                (page.clone(), l.into())
            })
            .collect();
        *new.tools.borrow_mut() = tools;
        *new.pages.borrow_mut() = pages;
        new.held.set(old.held.get() + added);
        if new.held.get() > cache_bytes() {
            new.held.set(cache_bytes());
            new.room_for(1);
        }
        Catalog {
            base: old.base.clone(),
            ..new
        }
    }

    /// The tool called `name` (read by its primary key on first use).
    pub fn tool(&self, name: &str) -> Option<Rc<ToolEntry>> {
        if !ctxguard_core::names::is_valid_name(name) {
            return None;
        }
        if let Some(t) = self.tools.borrow().get(name) {
            return Some(t.clone());
        }
        let sql = format!(
            "SELECT {TOOL_COLUMNS} FROM {TOOL_FROM} WHERE t.name OPERATOR(pg_catalog.=) $1"
        );
        let mut found = self.read_tools(&sql, &[name.into()]);
        let tool = found.pop()?;
        if self.room_for(tool.bytes()) {
            self.tools
                .borrow_mut()
                .insert(tool.name.clone(), tool.clone());
        }
        Some(tool)
    }

    /// The tools that may be visible on page type `page`: those whose policy names it or `*`, and
    /// those without a policy whose server's default policy does. Read through the index on
    /// `tool_policies.page_types` on first use, in name order.
    pub fn page_tools(&self, page: &str) -> Rc<[Rc<ToolEntry>]> {
        if let Some(l) = self.pages.borrow().get(page) {
            return l.clone();
        }
        let servers: Vec<String> = self
            .servers()
            .iter()
            .filter(|(_, s)| s.covers(page))
            .map(|(n, _)| n.clone())
            .collect();
        // Names first, through the index on page_types (and on tools.server), then the rows by
        // primary key: a saved plan joining the two tables chose a hash join over the whole
        // catalog (20 ms at 20,000 tools; this is O(the page's tools)).
        let sql = format!(
            "SELECT {TOOL_COLUMNS} FROM {TOOL_FROM}
              WHERE t.name OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])"
        );
        // Through their indexes and keys whatever the statistics say (`PAGE_PLANNER`): a custom
        // plan for a list of hundreds of names joined every policy of the catalog by hash.
        let mut tools = crate::owner::with_planner(PAGE_PLANNER, || {
            let names = as_owner(|| {
                Spi::connect(|c| {
                    let mut names = crate::pgutil::select_saved(
                        c,
                        "SELECT q.tool FROM ctxguard.tool_policies q
                      WHERE q.page_types OPERATOR(pg_catalog.&&) ARRAY[$1, '*']::pg_catalog.text[]",
                        None,
                        &[page.into()],
                    )?
                    .map(|r| r.get::<String>(1).map(Option::unwrap_or_default))
                    .collect::<Result<Vec<String>, _>>()?;
                    if !servers.is_empty() {
                        for r in crate::pgutil::select_saved(
                            c,
                            // OFFSET 0: each tool's policy looked up by its key, not an anti-join
                            // the generic plan made over every policy of the catalog.
                            "SELECT t.name FROM ctxguard.tools t
                          WHERE t.server OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])
                            AND NOT EXISTS (SELECT 1 FROM ctxguard.tool_policies q
                                             WHERE q.tool OPERATOR(pg_catalog.=) t.name OFFSET 0)",
                            None,
                            &[servers.into()],
                        )? {
                            names.push(r.get::<String>(1)?.unwrap_or_default());
                        }
                    }
                    Ok::<_, pgrx::spi::Error>(names)
                })
            })
            .unwrap_or_else(|e| internal(e));
            self.read_tools(&sql, &[names.into()])
        });
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        count(|c| c.pages_read += 1);
        // Share entries already read by name; keep the list if it fits.
        let list: Rc<[Rc<ToolEntry>]> = {
            let known = self.tools.borrow();
            tools
                .into_iter()
                .map(|t| known.get(&t.name).cloned().unwrap_or(t))
                .collect()
        };
        let new: usize = {
            let known = self.tools.borrow();
            list.iter()
                .filter(|t| !known.contains_key(&t.name))
                .map(|t| t.bytes())
                .sum()
        };
        if self.room_for(new + 64 + page.len() + 16 * list.len()) {
            let mut known = self.tools.borrow_mut();
            for t in list.iter() {
                known.entry(t.name.clone()).or_insert_with(|| t.clone());
            }
            self.pages
                .borrow_mut()
                .insert(page.to_string(), list.clone());
        } else {
            count(|c| c.not_kept += 1);
        }
        list
    }

    /// Call `f` with the tools of the catalog in name order (the database's collation) until it
    /// returns `false` (for `explain_tools`), [`NAME_WALK_BATCH`] at a time, each batch a statement
    /// from the last name read through the names' index and not kept: one batch in memory at a
    /// time, and a walk that stops early reads only what it passed.
    pub fn each_tool(&self, mut f: impl FnMut(&ToolEntry) -> bool) {
        let sql = format!(
            "SELECT {TOOL_COLUMNS} FROM {TOOL_FROM} WHERE t.name OPERATOR(pg_catalog.>) $1
              ORDER BY t.name LIMIT {NAME_WALK_BATCH}"
        );
        let mut after = String::new();
        loop {
            // In the name index's order, whatever the caller's cost settings or the statistics
            // say: a sort over a sequential scan reads the whole catalog for every batch.
            let tools = crate::owner::with_planner(WALK_PLANNER, || {
                self.read_tools(&sql, &[after.as_str().into()])
            });
            let Some(last) = tools.last() else { return };
            after = last.name.clone();
            for t in &tools {
                pg_sys::check_for_interrupts!();
                if !f(t) {
                    return;
                }
            }
            if tools.len() < NAME_WALK_BATCH {
                return;
            }
        }
    }

    fn read_tools(&self, sql: &str, args: &[pgrx::datum::DatumWithOid<'_>]) -> Vec<Rc<ToolEntry>> {
        let servers = self.servers();
        let tools = as_owner(|| {
            Spi::connect(|c| {
                let rows = crate::pgutil::select_saved(c, sql, None, args)?;
                crate::pgutil::freeing_row_copies(|| {
                    rows.map(|row| {
                        pg_sys::check_for_interrupts!();
                        tool_from_row(&row, servers).map(Rc::new)
                    })
                    .collect::<Result<Vec<_>, pgrx::spi::Error>>()
                })
            })
        })
        .unwrap_or_else(|e| internal(e));
        count(|c| c.tools_read += tools.len() as u64);
        tools
    }

    pub fn page_type(&self, name: &str) -> Option<PageTypeInfo> {
        if let Some(e) = self.page_types.borrow().get(name) {
            return e.clone().map(|entity_type| PageTypeInfo { entity_type });
        }
        if !ctxguard_core::names::is_valid_name(name) {
            return None;
        }
        let found = as_owner(|| {
            Spi::connect(|c| {
                let mut rows = crate::pgutil::select_saved(
                    c,
                    "SELECT entity_type FROM ctxguard.page_types WHERE name OPERATOR(pg_catalog.=) $1",
                    Some(1),
                    &[name.into()],
                )?;
                match rows.next() {
                    Some(r) => Ok::<_, pgrx::spi::Error>(Some(r.get::<String>(1)?)),
                    None => Ok(None),
                }
            })
        })
        .unwrap_or_else(|e| internal(e));
        if self.room_for(name.len() + 64) {
            self.page_types
                .borrow_mut()
                .insert(name.to_string(), found.clone());
        }
        found.map(|entity_type| PageTypeInfo { entity_type })
    }

    /// What the DBA said about each of the namespaces `names`: its registered title and
    /// description, else for an upstream server's namespace the server's description, else
    /// nothing. Rows of `ctxguard.namespaces` not kept yet are read (by primary key, in one
    /// statement) and kept within `ctxguard.catalog_cache_size`.
    pub fn described(&self, names: &[&str]) -> Vec<Described> {
        // Each name's row, kept from before or read now (`Some(None)`: not registered). Taken
        // before reading: making room may drop what was kept.
        let mut rows: Vec<Option<Option<Rc<Described>>>> = {
            let kept = self.namespaces.borrow();
            names.iter().map(|n| kept.get(*n).cloned()).collect()
        };
        let missing: Vec<String> = names
            .iter()
            .zip(&rows)
            .filter(|(_, r)| r.is_none())
            .map(|(n, _)| n.to_string())
            .collect();
        if !missing.is_empty() {
            let mut found: HashMap<String, Rc<Described>> = as_owner(|| {
                Spi::connect(|c| {
                    crate::pgutil::select_saved(
                        c,
                        "SELECT n.name, n.title, n.description FROM ctxguard.namespaces n
                          WHERE n.name OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])",
                        None,
                        &[missing.clone().into()],
                    )?
                    .map(|r| {
                        Ok((
                            r.get::<String>(1)?.unwrap_or_default(),
                            Rc::new(Described {
                                title: r.get::<String>(2)?,
                                description: r.get::<String>(3)?,
                            }),
                        ))
                    })
                    .collect::<Result<_, pgrx::spi::Error>>()
                })
            })
            .unwrap_or_else(|e| internal(e));
            let mut read: HashMap<String, Option<Rc<Described>>> = HashMap::new();
            for name in missing {
                pg_sys::check_for_interrupts!();
                let row = found.remove(&name);
                let bytes = 64
                    + name.len()
                    + row.as_ref().map_or(0, |d| {
                        d.title.as_ref().map_or(0, String::len)
                            + d.description.as_ref().map_or(0, String::len)
                    });
                if self.room_for(bytes) {
                    self.namespaces
                        .borrow_mut()
                        .insert(name.clone(), row.clone());
                }
                read.insert(name, row);
            }
            for (n, r) in names.iter().zip(rows.iter_mut()) {
                if r.is_none() {
                    *r = read.get(*n).cloned();
                }
            }
        }
        names
            .iter()
            .zip(rows)
            .map(|(n, r)| match r.flatten() {
                Some(d) => (*d).clone(),
                None => self.server_described(n),
            })
            .collect()
    }

    /// An unregistered namespace: the description of the upstream server of that name, if any.
    fn server_described(&self, name: &str) -> Described {
        Described {
            title: None,
            description: self
                .servers()
                .get(name)
                .map(|s| s.description.clone())
                .filter(|d| !d.trim().is_empty()),
        }
    }

    pub fn entity(&self, kind: &str) -> Option<Rc<EntityMapping>> {
        self.entities
            .get_or_init(|| Rc::new(as_owner(load_entities).unwrap_or_else(|e| internal(e))))
            .get(kind)
            .cloned()
    }

    fn servers(&self) -> &HashMap<String, Server> {
        self.servers
            .get_or_init(|| Rc::new(as_owner(load_servers).unwrap_or_else(|e| internal(e))))
    }

    /// `server`'s access settings with the grants that can apply to the caller of `ctx`: those
    /// of its user and of its roles, in its tenant or in every tenant (not every user grant of the
    /// tenant). Kept for the last caller only (see `access`).
    fn access(&self, server: &str, ctx: &crate::context::Ctx) -> Option<Rc<ServerAccess>> {
        let s = self.servers().get(server)?;
        let principals = {
            let mut slot = self.access.borrow_mut();
            let same = slot.as_ref().is_some_and(|c| {
                c.tenant == ctx.tenant_id && c.user == ctx.user_id && c.roles == ctx.roles
            });
            if !same {
                let mut principals: Vec<String> =
                    ctx.roles.iter().map(|r| format!("role:{r}")).collect();
                principals.sort();
                principals.dedup();
                principals.push(format!("user:{}", ctx.user_id));
                *slot = Some(CallerAccess {
                    tenant: ctx.tenant_id.clone(),
                    user: ctx.user_id.clone(),
                    roles: ctx.roles.clone(),
                    principals,
                    servers: HashMap::new(),
                });
            }
            let caller = slot.as_ref().expect("just set");
            if let Some(a) = caller.servers.get(server) {
                return Some(a.clone());
            }
            caller.principals.clone()
        };
        let grants = as_owner(|| load_grants(server, &ctx.tenant_id, &principals))
            .unwrap_or_else(|e| internal(e));
        let a = Rc::new(ServerAccess {
            enabled: s.enabled,
            default_allow: s.default_allow,
            grants,
        });
        if let Some(caller) = self.access.borrow_mut().as_mut() {
            if caller.principals == principals && caller.tenant == ctx.tenant_id {
                caller.servers.insert(server.to_string(), a.clone());
            }
        }
        Some(a)
    }

    /// May the caller of `ctx` use upstream MCP server `server`? (Unknown servers: no.)
    pub fn server_allows(&self, server: &str, ctx: &crate::context::Ctx) -> bool {
        let admin = crate::gucs::get(&crate::gucs::MCP_ADMIN_ROLE);
        self.access(server, ctx).is_some_and(|s| {
            s.allows(&Caller {
                tenant_id: &ctx.tenant_id,
                user_id: &ctx.user_id,
                roles: &ctx.roles,
                admin_role: admin.as_deref(),
            })
        })
    }

    /// Is `tool` usable by the caller of `ctx` as far as its upstream server is concerned?
    pub fn tool_server_allows(&self, tool: &ToolEntry, ctx: &crate::context::Ctx) -> bool {
        tool.server
            .as_deref()
            .is_none_or(|s| self.server_allows(s, ctx))
    }

    /// Why `tool` is or is not usable in `ctx` (Gate A and Gate B share this).
    /// Gate A's answer (and `explain_tools'`): a tool in shadow mode is listed despite its role
    /// and state conditions, but only on its own pages (a page's list is its tools); Gate B, asked
    /// by name, lets it through on another page with its entity too ([`Catalog::reason_shadowed`]).
    pub fn reason(&self, tool: &ToolEntry, ctx: Option<&crate::context::Ctx>) -> Reason {
        match self.reason_shadowed(tool, ctx) {
            (Reason::Visible, Some(Reason::WrongPage)) => Reason::WrongPage,
            (r, _) => r,
        }
    }

    /// [`Catalog::reason`], and for a tool in shadow mode (`"mode": "log_only"`) let through
    /// despite its page, role or state conditions, the reason it would have been refused.
    pub fn reason_shadowed(
        &self,
        tool: &ToolEntry,
        ctx: Option<&crate::context::Ctx>,
    ) -> (Reason, Option<Reason>) {
        if tool.absent {
            return (Reason::ToolAbsent, None);
        }
        let view = ctx.map(crate::context::Ctx::view);
        match evaluate_shadowed(tool.policy.as_ref(), view.as_ref()) {
            (Reason::Visible, _) if tool.changed => (Reason::DefinitionChanged, None),
            (Reason::Visible, _) if !ctx.is_some_and(|c| self.tool_server_allows(tool, c)) => {
                (Reason::ServerNotAllowed, None)
            }
            (Reason::Visible, _) if !self.mode_allowed(tool) => {
                (Reason::CredentialModeMismatch, None)
            }
            r => r,
        }
    }

    /// Is `tool`'s server registered with a credential mode its policy allows (`credential_mode`,
    /// issue 33)? A policy without one allows any; a local tool has no mode to allow.
    fn mode_allowed(&self, tool: &ToolEntry) -> bool {
        let Some(modes) = tool
            .policy
            .as_ref()
            .map(|p| &p.credential_modes)
            .filter(|m| !m.is_empty())
        else {
            return true;
        };
        tool.server
            .as_deref()
            .and_then(|s| self.servers().get(s))
            .is_some_and(|s| modes.contains(&s.credential_mode))
    }

    /// The credential mode upstream server `server` is registered with (`None`: no such server).
    pub fn credential_mode(&self, server: &str) -> Option<&str> {
        self.servers()
            .get(server)
            .map(|s| s.credential_mode.as_str())
    }

    /// Does a call to upstream server `server` need the user's own connection (`user_oauth`), and
    /// does Gate A hide its tools from users without one (`requires_connection`)? `None`: no.
    pub fn user_connection(&self, server: &str) -> Option<bool> {
        self.servers()
            .get(server)
            .filter(|s| s.user_connection())
            .map(|s| s.requires_connection)
    }

    /// The upstream servers whose calls use the user's own connection (`user_oauth`), by name.
    pub fn user_connection_servers(&self) -> Vec<String> {
        self.servers()
            .iter()
            .filter(|(_, s)| s.user_connection())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Does any upstream server hide its tools from users without a connection?
    pub fn any_requires_connection(&self) -> bool {
        self.servers()
            .values()
            .any(|s| s.user_connection() && s.requires_connection)
    }

    /// Names of the enabled upstream servers the caller of `ctx` may use.
    pub fn allowed_servers(&self, ctx: &crate::context::Ctx) -> Vec<String> {
        let mut names: Vec<String> = self
            .servers()
            .keys()
            .filter(|s| self.server_allows(s, ctx))
            .cloned()
            .collect();
        names.sort();
        names
    }
}

thread_local! {
    static CACHE: RefCell<Option<Rc<Catalog>>> = const { RefCell::new(None) };
    /// The transaction (local id, start time), command and statement (its start time) whose
    /// snapshot last checked the catalog's version, and when: until one of them changes, or
    /// [`RECHECK_AFTER`] has passed, the catalog it found is used.
    static CHECKED: Cell<Option<(Checked, std::time::Instant)>> = const { Cell::new(None) };
    static STATS: Cell<Counters> = Cell::new(Counters::default());
}

fn count(f: impl FnOnce(&mut Counters)) {
    STATS.with(|s| {
        let mut c = s.get();
        f(&mut c);
        s.set(c);
    });
}

/// `ctxguard.catalog_cache_size` in bytes.
fn cache_bytes() -> usize {
    (crate::gucs::CATALOG_CACHE_SIZE.get().max(1) as usize) * 1024
}

fn internal(e: impl std::fmt::Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("ctxguard: catalog: {e}"),
    )
}

/// (transaction's local id, its start, command id, the statement's start).
type Checked = (u32, i64, pg_sys::CommandId, i64);

/// How long one statement uses the catalog it found before it looks at the version again.
const RECHECK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The catalog as of the running statement's snapshot, or the transaction's own last change. Every
/// statement looks at the catalog's version again (a change committed meanwhile applies from the
/// next statement, in any transaction), a long statement every [`RECHECK_AFTER`], and a statement
/// whose snapshot does not see the latest committed version is refused (see [`version_key`]): no
/// transaction kept open, no `REPEATABLE READ` snapshot and no imported one keeps a catalog a DBA
/// has since changed. Its parts are read when a call first needs them, on that statement's
/// snapshot.
pub fn catalog() -> Rc<Catalog> {
    let now: Checked = unsafe {
        (
            crate::compat::local_xid(),
            pg_sys::GetCurrentTransactionStartTimestamp(),
            pg_sys::GetCurrentCommandId(false),
            pg_sys::GetCurrentStatementStartTimestamp(),
        )
    };
    let at = std::time::Instant::now();
    // This statement looked at the catalog before (a long statement looking again).
    let mut again = false;
    if let Some((checked, when)) = CHECKED.get() {
        if checked == now {
            if at.duration_since(when) >= RECHECK_AFTER {
                again = true;
            } else if let Some(c) = CACHE.with(|c| c.borrow().clone()) {
                return c;
            }
        }
    }
    let c = catalog_of(version_key(again));
    CHECKED.set(Some((now, at)));
    c
}

/// At a subtransaction's abort, forget which statement last checked the catalog's version: the
/// subtransaction's catalog changes (and the version they moved) are undone, while the
/// transaction, its command id and its statement go on (`ROLLBACK TO SAVEPOINT`, a PL/pgSQL
/// exception block).
unsafe extern "C-unwind" fn at_subtransaction_abort(
    event: pg_sys::SubXactEvent::Type,
    _mine: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB {
        CHECKED.set(None);
    }
}

/// Called once from `_PG_init` (preloaded or not).
pub fn init() {
    // SAFETY: registered once per process, while the library loads.
    unsafe { pg_sys::RegisterSubXactCallback(Some(at_subtransaction_abort), std::ptr::null_mut()) };
}

/// The catalog of version `key`: the cached one; or taken over from it when the versions between
/// changed only tools (see `ctxguard.catalog_changes`); or a new, empty one.
fn catalog_of(key: (i64, String)) -> Rc<Catalog> {
    let old = CACHE.with(|c| c.borrow().clone());
    if let Some(c) = old.as_ref().filter(|c| c.key == key) {
        return c.clone();
    }
    // Drop the old catalog before the new one fills.
    CACHE.with(|c| *c.borrow_mut() = None);
    let fresh = match old
        .as_ref()
        .and_then(|o| tools_changed(&o.key, &key).map(|n| (o, n)))
    {
        Some((o, changed)) => Rc::new(Catalog::refreshed(o, key, &changed)),
        None => Rc::new(Catalog::new(key)),
    };
    drop(old);
    crate::handler::catalog_changed();
    CACHE.with(|c| *c.borrow_mut() = Some(fresh.clone()));
    fresh
}

/// Most changed tool names a backend takes over a version with (beyond, it reads afresh).
const REFRESH_MAX: i64 = 5_000;

/// The tools that changed from version `old` to `new`, if that is all that changed and
/// `ctxguard.catalog_changes` holds every version between (committed ones only: a key of this
/// transaction's own, uncommitted change is never taken over, nor taken over from).
fn tools_changed(old: &(i64, String), new: &(i64, String)) -> Option<HashSet<String>> {
    if old.1.contains('/') || new.1.contains('/') || new.0 <= old.0 || new.0 - old.0 > 100 {
        return None;
    }
    // A database still on 0.1.0's SQL (until ALTER EXTENSION ctxguard UPDATE) has no such table.
    let logged = unsafe {
        let schema = pg_sys::get_namespace_oid(c"ctxguard".as_ptr(), false);
        pg_sys::get_relname_relid(c"catalog_changes".as_ptr(), schema) != pg_sys::InvalidOid
    };
    if !logged {
        return None;
    }
    let rows = as_owner(|| {
        Spi::connect(|c| {
            crate::pgutil::select_saved(
                c,
                "SELECT version, tool FROM ctxguard.catalog_changes
                  WHERE version OPERATOR(pg_catalog.>) $1 AND version OPERATOR(pg_catalog.<=) $2
                  LIMIT $3",
                None,
                &[old.0.into(), new.0.into(), (REFRESH_MAX + 1).into()],
            )?
            .map(|r| Ok((r.get::<i64>(1)?.unwrap_or(0), r.get::<String>(2)?)))
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
    })
    .ok()?;
    if rows.len() as i64 > REFRESH_MAX {
        return None;
    }
    let mut versions = HashSet::new();
    let mut names = HashSet::new();
    for (v, tool) in rows {
        versions.insert(v);
        names.insert(tool?);
    }
    (versions.len() as i64 == new.0 - old.0).then_some(names)
}

/// The visible `ctxguard.catalog_version` row's `(version, xmin)`, and whether this transaction
/// wrote it. With `latest`, also whether the latest committed row is that one (`Some(false)`: the
/// snapshot predates a catalog change); `None` when not asked or when the row is this
/// transaction's own.
fn version_row(latest: bool) -> (i64, pg_sys::TransactionId, bool, Option<bool>) {
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"ctxguard".as_ptr(), false);
        let relid = pg_sys::get_relname_relid(c"catalog_version".as_ptr(), schema);
        if relid == pg_sys::InvalidOid {
            internal("ctxguard.catalog_version is missing");
        }
        let attnum = pg_sys::get_attnum(relid, c"version".as_ptr());
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(relid, lock);
        // The snapshot SPI would use: the statement's, or in a transaction that has written, a
        // new one (as pgrx's writing client would; on an error the abort pops it).
        let fresh = pg_sys::GetCurrentTransactionIdIfAny() != pg_sys::InvalidTransactionId
            || !pg_sys::ActiveSnapshotSet();
        if fresh {
            pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
        }
        // The row's first (only) version `snapshot` sees, through `f` (NULL: none).
        let first_row = |snapshot: pg_sys::Snapshot, f: &mut dyn FnMut(pg_sys::HeapTuple)| {
            let scan = pg_sys::systable_beginscan(
                rel,
                pg_sys::InvalidOid,
                false,
                snapshot,
                0,
                std::ptr::null_mut(),
            );
            f(pg_sys::systable_getnext(scan));
            pg_sys::systable_endscan(scan);
        };
        // HeapTupleHeaderGetRawXmin (spelled out: pgrx 0.18 binds two of them for PostgreSQL 18).
        let xmin_of = |tuple: pg_sys::HeapTuple| (*(*tuple).t_data).t_choice.t_heap.t_xmin;
        let mut row = None;
        first_row(pg_sys::GetActiveSnapshot(), &mut |tuple| {
            if !tuple.is_null() && attnum > 0 {
                let mut isnull = false;
                let d = pg_sys::heap_getattr(tuple, attnum as i32, (*rel).rd_att, &mut isnull);
                let version = if isnull { 0 } else { d.value() as i64 };
                let xmin = xmin_of(tuple);
                row = Some((
                    version,
                    xmin,
                    pg_sys::TransactionIdIsCurrentTransactionId(xmin),
                ));
            }
        });
        // The same row on a snapshot taken now: is the one this statement sees the latest
        // committed? (Not asked for this transaction's own row: nothing committed can follow it.)
        let current = match row {
            Some((_, xmin, false)) if latest => {
                let mut same = false;
                first_row(pg_sys::GetLatestSnapshot(), &mut |tuple| {
                    same = !tuple.is_null() && xmin_of(tuple) == xmin;
                });
                Some(same)
            }
            _ => None,
        };
        pg_sys::table_close(rel, lock);
        if fresh {
            pg_sys::PopActiveSnapshot();
        }
        let (version, xmin, mine) =
            row.unwrap_or_else(|| internal("ctxguard.catalog_version has no row"));
        (version, xmin, mine, current)
    }
}

/// The cache key of the catalog the active snapshot sees: `(version, xmin)` of the
/// `ctxguard.catalog_version` row, read straight from the heap (a one-page scan), with no statement
/// to plan and run once per transaction; the schema and table are found by name in the system
/// catalogs (never through `search_path`). The row moves once per transaction that changes the
/// catalog (see [`_catalog_written_here`]): while this transaction is that one, its later changes
/// do not move it, so the key also holds the command id, and every command reads afresh.
///
/// A statement whose snapshot does not see the latest committed version is refused with 40001
/// (its transaction can be retried, and sees the change then) when that snapshot is its
/// transaction's (`REPEATABLE READ`, `SERIALIZABLE`, an imported snapshot: the transaction began
/// before the change), when it runs in a cursor (declared before the change, fetched from after
/// it), or when the statement is looking `again` (it has run on the catalog it found for
/// [`RECHECK_AFTER`]). A `READ COMMITTED` statement that began before the change and looks for the
/// first time (it waited for the audit queue, say) is answered on its snapshot; the next statement
/// sees the change.
fn version_key(again: bool) -> (i64, String) {
    // The latest row is read only where a stale snapshot is refused (not for a READ COMMITTED
    // statement's first look, the gateway's every statement).
    let refusable = again || transaction_snapshot() || in_cursor();
    let (version, xmin, mine, current) = version_row(refusable);
    if current == Some(false) {
        raise(
            PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
            "ctxguard: the tool catalog changed after this statement's snapshot was taken; retry in a new transaction",
        );
    }
    let xmin = xmin.into_inner();
    if mine {
        // Its own change: keyed by command and by subtransaction too (a change rolled back to a
        // savepoint leaves the command id where it was; the subtransaction after it is another).
        let (cid, sub) = unsafe {
            (
                pg_sys::GetCurrentCommandId(false),
                pg_sys::GetCurrentSubTransactionId(),
            )
        };
        (version, format!("{xmin}/{cid}/{sub}"))
    } else {
        (version, xmin.to_string())
    }
}

/// Does this transaction read on one snapshot from its first statement on (`IsolationUsesXactSnapshot`)?
fn transaction_snapshot() -> bool {
    // SAFETY: a backend global, read in its one thread.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Does the running query run in a cursor (a named portal: `DECLARE`d, or opened by a function
/// through SPI), whose snapshot may be older than the statement that fetches from it? A client's
/// own statements run in the unnamed portal.
fn in_cursor() -> bool {
    // SAFETY: the active portal, if any, is valid while it runs (this call is part of it); its
    // name is a C string.
    unsafe {
        let p = pg_sys::ActivePortal;
        !p.is_null() && !(*p).name.is_null() && *(*p).name != 0
    }
}

/// Did this transaction (or one of its live subtransactions) write the visible
/// `ctxguard.catalog_version` row? Then `ctxguard._bump_catalog_version()` need not move it again:
/// every backend but this one already sees a new key once the transaction commits, and this one
/// keys its cache by command until then. (Moving it per statement made a transaction that
/// registers 20,000 tools leave 20,000 versions of the row, each scanned by every next statement.)
/// Declared in `bootstrap.sql`, before the first catalog change of the install.
#[pg_extern(volatile, parallel_unsafe, sql = false)]
fn _catalog_written_here() -> bool {
    version_row(false).2
}

fn policy_from_row(row: &SpiHeapTupleData) -> Result<Option<Policy>, pgrx::spi::Error> {
    if !row.get::<bool>(16)?.unwrap_or(false) {
        return Ok(None);
    }
    // Quotas that no longer parse (edited by hand) disable the tool: closed.
    let rate_limits = parse_rate_limits(row.get::<JsonB>(29)?.map(|j| j.0).as_ref());
    // So do credential modes that are not modes.
    let credential_modes = row.get::<Vec<String>>(30)?.unwrap_or_default();
    let modes_ok = credential_modes
        .iter()
        .all(|m| CREDENTIAL_MODES.contains(&m.as_str()));
    // Missing values fall back to the most restrictive choice.
    Ok(Some(Policy {
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
        enabled: row.get::<bool>(15)?.unwrap_or(false) && rate_limits.is_ok() && modes_ok,
        rate_limits: rate_limits.unwrap_or_default(),
        credential_modes,
        when: row.get::<String>(25)?,
        approval_when: row.get::<String>(26)?,
        // Only an explicit log_only shadows anything.
        log_only: row.get::<String>(27)?.as_deref() == Some("log_only"),
        approver_roles: row.get::<Vec<String>>(28)?.unwrap_or_default(),
    }))
}

/// A tool from a row of [`TOOL_COLUMNS`]; a tool without a policy of its own takes its server's
/// default policy if that fits the tool's schema (an entity_param the tool lacks leaves it without
/// a policy: invisible).
fn tool_from_row(
    row: &SpiHeapTupleData,
    servers: &HashMap<String, Server>,
) -> Result<ToolEntry, pgrx::spi::Error> {
    let input_schema = row.get::<JsonB>(3)?.map(|j| j.0).unwrap_or(Value::Null);
    let server = row.get::<String>(17)?;
    let mut policy = policy_from_row(row)?;
    if policy.is_none() {
        if let Some(s) = server.as_deref().and_then(|s| servers.get(s)) {
            if let Some(default) = &s.default_policy {
                policy = parse_policy(default, &input_schema, |n| {
                    s.default_pages.get(n).map(|e| PageTypeInfo {
                        entity_type: e.clone(),
                    })
                })
                .ok();
            }
        }
    }
    Ok(ToolEntry {
        name: row.get::<String>(1)?.unwrap_or_default(),
        description: row.get::<String>(2)?.unwrap_or_default(),
        input_schema,
        handler: row.get::<pg_sys::Oid>(4)?,
        kind: row.get::<String>(5)?.unwrap_or_default(),
        policy,
        server,
        upstream_name: row.get::<String>(18)?,
        run_as: row.get::<pg_sys::Oid>(20)?,
        absent: row.get::<bool>(21)?.unwrap_or(true),
        changed: row.get::<bool>(22)?.unwrap_or(true),
        when_fn: row.get::<pg_sys::Oid>(23)?,
        approval_when_fn: row.get::<pg_sys::Oid>(24)?,
        search: row.get::<crate::pgutil::TsVector>(31)?,
        compiled: OnceCell::new(),
        shown: [OnceCell::new(), OnceCell::new()],
    })
}

fn load_entities() -> Result<HashMap<String, Rc<EntityMapping>>, pgrx::spi::Error> {
    Spi::connect(|c| {
        let mut entities = HashMap::new();
        for row in c.select(
            "SELECT e.name,
                    pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
                    pg_catalog.quote_ident(e.id_column::pg_catalog.text),
                    pg_catalog.quote_ident(itn.nspname::pg_catalog.text) || '.'
                        || pg_catalog.quote_ident(it.typname::pg_catalog.text),
                    CASE WHEN it.typnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace THEN it.typname::pg_catalog.text END,
                    pg_catalog.quote_ident(e.tenant_column::pg_catalog.text),
                    pg_catalog.quote_ident(ttn.nspname::pg_catalog.text) || '.'
                        || pg_catalog.quote_ident(tt.typname::pg_catalog.text)
               FROM ctxguard.entity_types e
               JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) e.tbl::pg_catalog.oid
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
               JOIN pg_catalog.pg_type it ON it.oid OPERATOR(pg_catalog.=) e.id_type::pg_catalog.oid
               JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid
                    AND a.attname OPERATOR(pg_catalog.=) e.tenant_column AND NOT a.attisdropped
               JOIN pg_catalog.pg_type tt ON tt.oid OPERATOR(pg_catalog.=) a.atttypid
               JOIN pg_catalog.pg_namespace itn ON itn.oid OPERATOR(pg_catalog.=) it.typnamespace
               JOIN pg_catalog.pg_namespace ttn ON ttn.oid OPERATOR(pg_catalog.=) tt.typnamespace",
            None,
            &[],
        )? {
            let text = |i: usize| row.get::<String>(i).map(Option::unwrap_or_default);
            let (name, table, id_column, id_type, id_type_name, tenant_column, tenant_type) =
                (text(1)?, text(2)?, text(3)?, text(4)?, text(5)?, text(6)?, text(7)?);
            // Run as the owner (who bypasses RLS), so the tenant is an explicit predicate. Every
            // name is quoted and qualified: nothing on the caller's path can stand in for it.
            entities.insert(
                name,
                Rc::new(EntityMapping {
                    exists_sql: format!(
                        "SELECT EXISTS (SELECT 1 FROM {table} WHERE {id_column} OPERATOR(pg_catalog.=) $1::{id_type} AND {tenant_column} OPERATOR(pg_catalog.=) $2::{tenant_type})"
                    ),
                    id_type: id_type_name,
                }),
            );
        }
        Ok(entities)
    })
}

/// Every upstream server, with its default policy and the page types that policy names.
fn load_servers() -> Result<HashMap<String, Server>, pgrx::spi::Error> {
    Spi::connect(|c| {
        let mut servers: HashMap<String, Server> = HashMap::new();
        for row in c.select(
            "SELECT name, enabled, default_access OPERATOR(pg_catalog.=) 'allow', default_policy, description,
                    requires_connection, credential_mode
               FROM ctxguard.mcp_servers",
            None,
            &[],
        )? {
            let default_policy = row
                .get::<JsonB>(4)?
                .and_then(|JsonB(d)| split_run_as(&d).ok().map(|(p, _)| p));
            servers.insert(
                row.get::<String>(1)?.unwrap_or_default(),
                Server {
                    enabled: row.get::<bool>(2)?.unwrap_or(false),
                    description: row.get::<String>(5)?.unwrap_or_default(),
                    default_allow: row.get::<bool>(3)?.unwrap_or(false),
                    default_policy,
                    default_pages: HashMap::new(),
                    requires_connection: row.get::<bool>(6)?.unwrap_or(false),
                    credential_mode: row.get::<String>(7)?.unwrap_or_default(),
                },
            );
        }
        let named: Vec<String> = servers
            .values()
            .filter_map(|s| s.default_policy.as_ref()?.get("page_types")?.as_array())
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        if !named.is_empty() {
            let mut pages = HashMap::new();
            for row in c.select(
                "SELECT name, entity_type FROM ctxguard.page_types
                  WHERE name OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])",
                None,
                &[named.into()],
            )? {
                pages.insert(
                    row.get::<String>(1)?.unwrap_or_default(),
                    row.get::<String>(2)?,
                );
            }
            for s in servers.values_mut() {
                s.default_pages = pages.clone();
            }
        }
        Ok(servers)
    })
}

/// The grants of `server` in `tenant` (or in every tenant) for `principals` (`user:<id>` and
/// `role:<name>` of one caller): only these can apply to it ([`ServerAccess::allows`]). A tenant
/// that grants a server user by user has as many grants as users, and every call read them all.
/// Equality on the `(server, tenant_id, principal)` key, whatever the collation. Grants name
/// users of every tenant, so only the owner reads them.
fn load_grants(
    server: &str,
    tenant: &str,
    principals: &[String],
) -> Result<Vec<Grant>, pgrx::spi::Error> {
    Spi::connect(|c| {
        crate::pgutil::select_saved(
            c,
            "SELECT tenant_id, pg_catalog.split_part(principal, ':', 1),
                    pg_catalog.substr(principal, pg_catalog.strpos(principal, ':') OPERATOR(pg_catalog.+) 1),
                    access OPERATOR(pg_catalog.=) 'allow'
               FROM ctxguard.mcp_server_grants
              WHERE server OPERATOR(pg_catalog.=) $1
                AND (tenant_id OPERATOR(pg_catalog.=) $2 OR tenant_id IS NULL)
                AND principal OPERATOR(pg_catalog.=) ANY ($3::pg_catalog.text[])",
            None,
            &[server.into(), tenant.into(), principals.to_vec().into()],
        )?
        .map(|row| {
            let principal = match (
                row.get::<String>(2)?.as_deref(),
                row.get::<String>(3)?.unwrap_or_default(),
            ) {
                (Some("user"), id) => Principal::User(id),
                (_, role) => Principal::Role(role),
            };
            Ok(Grant {
                tenant_id: row.get::<String>(1)?,
                principal,
                allow: row.get::<bool>(4)?.unwrap_or(false),
            })
        })
        .collect()
    })
}

/// This backend's memory in kB from `/proc/self/status`: resident (`VmRSS`), its peak (`VmHWM`),
/// and of the resident, the private part (`RssAnon`; the rest is mostly shared buffers it touched).
/// `None` where there is no such file.
fn backend_memory_kb() -> [Option<i64>; 3] {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return [None; 3];
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    [field("VmRSS:"), field("VmHWM:"), field("RssAnon:")]
}

/// This backend's catalog cache: what it holds of the current version, against
/// `ctxguard.catalog_cache_size`, and what it has read since the backend started (a DBA's view;
/// EXECUTE revoked from PUBLIC).
#[pg_extern(volatile, parallel_unsafe)]
fn catalog_stats() -> JsonB {
    let _pin = crate::owner::pin();
    let c = catalog();
    let n = STATS.with(Cell::get);
    let [rss, peak, private] = backend_memory_kb();
    JsonB(serde_json::json!({
        "version": c.key.0,
        "tools_kept": c.tools.borrow().len(),
        "page_lists_kept": c.pages.borrow().len(),
        "page_types_kept": c.page_types.borrow().len(),
        "server_access_kept": c.access.borrow().as_ref().map_or(0, |a| a.servers.len()),
        "namespaces_kept": c.namespaces.borrow().len(),
        "tenant_limits_kept": c.limits.borrow().len(),
        "bytes_kept": c.held.get(),
        "bytes_limit": cache_bytes(),
        "versions_started": n.versions,
        "tools_read": n.tools_read,
        "page_lists_read": n.pages_read,
        "evictions": n.evictions,
        "page_lists_not_kept": n.not_kept,
        "versions_refreshed": n.refreshed,
        "backend_rss_kb": rss,
        "backend_peak_kb": peak,
        "backend_private_kb": private,
        "handler_plans_kept": crate::handler::body_plans_kept(),
    }))
}
