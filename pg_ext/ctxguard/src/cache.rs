//! Per-backend cache of the catalog (page types, entity mappings, tools with policies).
//!
//! Gate A and Gate B read the catalog on every call; re-planning and re-reading a thousand rows each
//! time dominated their cost. The cache is keyed by `(version, xmin)` of `ctxguard.catalog_version`,
//! which statement triggers bump on any catalog change. Including xmin means a change made and rolled
//! back by one transaction can never be confused with a later, different change of the same number.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use ctxguard_core::args::{self, ArgError, Schema};
use ctxguard_core::mcp::{Caller, Grant, Principal, ServerAccess};
use ctxguard_core::page::PageTypeInfo;
use ctxguard_core::policy::{evaluate, parse_policy, split_run_as, Danger, Policy, Reason};
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
    compiled: OnceCell<Result<Rc<Schema>, ArgError>>,
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

pub struct Catalog {
    key: (i64, String),
    /// Rows of `ctxguard.tenant_limits` read so far, by tenant (a trigger on that table moves the
    /// catalog's version too, so they are as current as the rest of the catalog).
    limits: RefCell<HashMap<String, TenantLimits>>,
    pub tools: Vec<Rc<ToolEntry>>,
    by_name: HashMap<String, usize>,
    page_types: HashMap<String, Option<String>>,
    entities: HashMap<String, Rc<EntityMapping>>,
    servers: HashMap<String, ServerAccess>,
}

/// A tenant's overrides in `ctxguard.tenant_limits` (NULL: the setting): `max_pages_per_call`,
/// `max_calls_per_document`, `max_bytes_per_generation`, `max_section_tokens`,
/// `max_search_results`, `max_bytes_per_user_day`; and `max_document_coverage`.
pub type TenantLimits = ([Option<i32>; 6], Option<f64>);

/// Most tenants whose limits a catalog keeps (beyond, it forgets them all and reads again).
const LIMITS_KEPT: usize = 10_000;

impl Catalog {
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
    /// mask-rule changes).
    pub fn key(&self) -> &(i64, String) {
        &self.key
    }

    pub fn tool(&self, name: &str) -> Option<&Rc<ToolEntry>> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    pub fn page_type(&self, name: &str) -> Option<PageTypeInfo> {
        self.page_types.get(name).map(|e| PageTypeInfo {
            entity_type: e.clone(),
        })
    }

    pub fn entity(&self, kind: &str) -> Option<Rc<EntityMapping>> {
        self.entities.get(kind).cloned()
    }

    /// May the caller of `ctx` use upstream MCP server `server`? (Unknown servers: no.)
    pub fn server_allows(&self, server: &str, ctx: &crate::context::Ctx) -> bool {
        let admin = crate::gucs::get(&crate::gucs::MCP_ADMIN_ROLE);
        self.servers.get(server).is_some_and(|s| {
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
    pub fn reason(&self, tool: &ToolEntry, ctx: Option<&crate::context::Ctx>) -> Reason {
        if tool.absent {
            return Reason::ToolAbsent;
        }
        let view = ctx.map(crate::context::Ctx::view);
        match evaluate(tool.policy.as_ref(), view.as_ref()) {
            Reason::Visible if tool.changed => Reason::DefinitionChanged,
            Reason::Visible if !ctx.is_some_and(|c| self.tool_server_allows(tool, c)) => {
                Reason::ServerNotAllowed
            }
            r => r,
        }
    }

    /// Names of the enabled upstream servers the caller of `ctx` may use.
    pub fn allowed_servers(&self, ctx: &crate::context::Ctx) -> Vec<String> {
        let mut names: Vec<String> = self
            .servers
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
    /// The transaction (local id, start time) and command whose snapshot last checked the
    /// catalog's version: later statements of that transaction, until it changes something
    /// itself, use the catalog it found.
    static CHECKED: Cell<Option<(u32, i64, pg_sys::CommandId)>> = const { Cell::new(None) };
}

fn internal(e: impl std::fmt::Display) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        format!("ctxguard: catalog: {e}"),
    )
}

/// The catalog as of the transaction's first look at it, or its own last change (in READ
/// COMMITTED too: a policy change committed meanwhile applies from the caller's next transaction,
/// as it would in REPEATABLE READ, which any caller may choose).
pub fn catalog() -> Rc<Catalog> {
    let now = unsafe {
        (
            crate::compat::local_xid(),
            pg_sys::GetCurrentTransactionStartTimestamp(),
            pg_sys::GetCurrentCommandId(false),
        )
    };
    if CHECKED.get() == Some(now) {
        if let Some(c) = CACHE.with(|c| c.borrow().clone()) {
            return c;
        }
    }
    let c = catalog_of(version_key());
    CHECKED.set(Some(now));
    c
}

/// The catalog of version `key`: the cached one, or loaded (as the owner).
fn catalog_of(key: (i64, String)) -> Rc<Catalog> {
    if let Some(c) = CACHE.with(|c| c.borrow().as_ref().filter(|c| c.key == key).cloned()) {
        return c;
    }
    let loaded = Rc::new(as_owner(|| load(key)).unwrap_or_else(|e| internal(e)));
    crate::handler::catalog_changed();
    CACHE.with(|c| *c.borrow_mut() = Some(loaded.clone()));
    loaded
}

/// `(version, xmin)` of the `ctxguard.catalog_version` row that the active snapshot sees: what
/// `SELECT version, xmin FROM ctxguard.catalog_version` returns on that snapshot, read straight from
/// the heap (a one-page scan), with no statement to plan and run once per transaction. The schema
/// and table are found by name in the system catalogs (never through `search_path`).
fn version_key() -> (i64, String) {
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
        let snapshot = pg_sys::GetActiveSnapshot();
        let scan = pg_sys::systable_beginscan(
            rel,
            pg_sys::InvalidOid,
            false,
            snapshot,
            0,
            std::ptr::null_mut(),
        );
        let tuple = pg_sys::systable_getnext(scan);
        let key = if tuple.is_null() || attnum <= 0 {
            None
        } else {
            let mut isnull = false;
            let d = pg_sys::heap_getattr(tuple, attnum as i32, (*rel).rd_att, &mut isnull);
            let version = if isnull { 0 } else { d.value() as i64 };
            // HeapTupleHeaderGetRawXmin (spelled out: pgrx 0.18 binds two of them for PostgreSQL 18).
            let xmin = (*(*tuple).t_data).t_choice.t_heap.t_xmin;
            Some((version, xmin.into_inner().to_string()))
        };
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, lock);
        if fresh {
            pg_sys::PopActiveSnapshot();
        }
        key.unwrap_or_else(|| internal("ctxguard.catalog_version has no row"))
    }
}

fn policy_from_row(row: &SpiHeapTupleData) -> Result<Option<Policy>, pgrx::spi::Error> {
    if !row.get::<bool>(16)?.unwrap_or(false) {
        return Ok(None);
    }
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
        enabled: row.get::<bool>(15)?.unwrap_or(false),
    }))
}

fn load(key: (i64, String)) -> Result<Catalog, pgrx::spi::Error> {
    Spi::connect(|c| {
        let mut page_types = HashMap::new();
        for row in c.select(
            "SELECT name, entity_type FROM ctxguard.page_types",
            None,
            &[],
        )? {
            page_types.insert(
                row.get::<String>(1)?.unwrap_or_default(),
                row.get::<String>(2)?,
            );
        }
        let mut tools = Vec::new();
        for row in c.select(
            "SELECT t.name, t.description, t.input_schema, t.handler::pg_catalog.oid, t.kind,
                    p.page_types, p.requires_entity, p.entity_type, p.entity_param, p.roles, p.required_states,
                    p.read_only, p.danger, p.requires_approval, p.enabled, p.tool IS NOT NULL,
                    t.server, t.upstream_name, s.default_policy, p.run_as::pg_catalog.oid, NOT t.present,
                    t.kind = 'external' AND t.accepted_hash IS DISTINCT FROM t.definition_hash
               FROM ctxguard.tools t LEFT JOIN ctxguard.tool_policies p ON p.tool = t.name
                    LEFT JOIN ctxguard.mcp_servers s ON s.name = t.server
              ORDER BY t.name COLLATE \"C\"",
            None,
            &[],
        )? {
            let input_schema = row.get::<JsonB>(3)?.map(|j| j.0).unwrap_or(Value::Null);
            let mut policy = policy_from_row(&row)?;
            if policy.is_none() {
                // A server's default policy covers its tools without one, if it fits the tool's
                // schema (an entity_param the tool lacks leaves it without a policy: invisible).
                if let Some(JsonB(default)) = row.get::<JsonB>(19)? {
                    let default = split_run_as(&default).map(|(p, _)| p).unwrap_or(Value::Null);
                    policy = parse_policy(&default, &input_schema, |n| {
                        page_types.get(n).map(|e: &Option<String>| PageTypeInfo {
                            entity_type: e.clone(),
                        })
                    })
                    .ok();
                }
            }
            tools.push(Rc::new(ToolEntry {
                name: row.get::<String>(1)?.unwrap_or_default(),
                description: row.get::<String>(2)?.unwrap_or_default(),
                input_schema,
                handler: row.get::<pg_sys::Oid>(4)?,
                kind: row.get::<String>(5)?.unwrap_or_default(),
                policy,
                server: row.get::<String>(17)?,
                upstream_name: row.get::<String>(18)?,
                run_as: row.get::<pg_sys::Oid>(20)?,
                absent: row.get::<bool>(21)?.unwrap_or(true),
                changed: row.get::<bool>(22)?.unwrap_or(true),
                compiled: OnceCell::new(),
            }));
        }
        let by_name = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let mut entities = HashMap::new();
        for row in c.select(
            "SELECT e.name,
                    pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname),
                    pg_catalog.quote_ident(e.id_column::pg_catalog.text),
                    pg_catalog.quote_ident(it.typnamespace::pg_catalog.regnamespace::pg_catalog.text) || '.'
                        || pg_catalog.quote_ident(it.typname::pg_catalog.text),
                    CASE WHEN it.typnamespace = 'pg_catalog'::pg_catalog.regnamespace THEN it.typname::pg_catalog.text END,
                    pg_catalog.quote_ident(e.tenant_column::pg_catalog.text),
                    pg_catalog.quote_ident(tt.typnamespace::pg_catalog.regnamespace::pg_catalog.text) || '.'
                        || pg_catalog.quote_ident(tt.typname::pg_catalog.text)
               FROM ctxguard.entity_types e
               JOIN pg_catalog.pg_class c ON c.oid = e.tbl::pg_catalog.oid
               JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
               JOIN pg_catalog.pg_type it ON it.oid = e.id_type::pg_catalog.oid
               JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = e.tenant_column AND NOT a.attisdropped
               JOIN pg_catalog.pg_type tt ON tt.oid = a.atttypid",
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
                        "SELECT EXISTS (SELECT 1 FROM {table} WHERE {id_column} = $1::{id_type} AND {tenant_column} = $2::{tenant_type})"
                    ),
                    id_type: id_type_name,
                }),
            );
        }
        let mut servers: HashMap<String, ServerAccess> = HashMap::new();
        for row in c.select(
            "SELECT name, enabled, default_access = 'allow' FROM ctxguard.mcp_servers",
            None,
            &[],
        )? {
            servers.insert(
                row.get::<String>(1)?.unwrap_or_default(),
                ServerAccess {
                    enabled: row.get::<bool>(2)?.unwrap_or(false),
                    default_allow: row.get::<bool>(3)?.unwrap_or(false),
                    grants: Vec::new(),
                },
            );
        }
        // Grants name users of every tenant, so only the owner reads them; all of them are loaded
        // whoever the caller is, as the cache is shared by every context of this backend.
        let grants = {
            c.select(
                "SELECT server, tenant_id, pg_catalog.split_part(principal, ':', 1), pg_catalog.substr(principal, pg_catalog.strpos(principal, ':') + 1),
                        access = 'allow'
                   FROM ctxguard.mcp_server_grants",
                None,
                &[],
            )
        }?;
        for row in grants {
            let principal = match (
                row.get::<String>(3)?.as_deref(),
                row.get::<String>(4)?.unwrap_or_default(),
            ) {
                (Some("user"), id) => Principal::User(id),
                (_, role) => Principal::Role(role),
            };
            if let Some(s) = servers.get_mut(&row.get::<String>(1)?.unwrap_or_default()) {
                s.grants.push(Grant {
                    tenant_id: row.get::<String>(2)?,
                    principal,
                    allow: row.get::<bool>(5)?.unwrap_or(false),
                });
            }
        }
        Ok(Catalog {
            key,
            limits: RefCell::default(),
            tools,
            by_name,
            page_types,
            entities,
            servers,
        })
    })
}
