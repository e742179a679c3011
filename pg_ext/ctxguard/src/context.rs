//! `ctxguard.set_context` and the context readers.
//!
//! The verified context lives in transaction-local `ctxguard.*` settings (see `gucs.rs`). Readers
//! return NULL, never '', when no context is set, and also when the library was not preloaded
//! (then nothing guarantees that the settings were written by `set_context`).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::cache;
use crate::handler::refuse_inside;
use crate::keys::verify;
use crate::owner::as_owner;
use ctxguard_core::names::is_valid_id;
use ctxguard_core::page::{self, Entity};
use ctxguard_core::token;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::{json, Value};

use crate::gucs;
use crate::pgutil::{in_transaction_block, raise, saved_plan, set_local, JsonbText, TEXT};
use ctxguard_core::json::{self, JsonError};

pub static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Largest page context accepted, in bytes of its JSON text (checked before it is parsed).
pub const MAX_PAGE_BYTES: usize = 64 * 1024;

/// The verified context of the current transaction.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub tenant_id: String,
    pub user_id: String,
    pub roles: Vec<String>,
    pub page_type: String,
    pub entity: Option<Entity>,
    pub states: Vec<String>,
    pub generation: Option<String>,
    pub trace_id: Option<String>,
}

fn present() -> bool {
    PRELOADED.load(Ordering::Relaxed) && gucs::get(&gucs::TENANT_ID).is_some()
}

fn reader(setting: &pgrx::GucSetting<Option<std::ffi::CString>>) -> Option<String> {
    if present() {
        gucs::get(setting)
    } else {
        None
    }
}

fn string_array(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// What a context's JSON setting (`ctxguard.context`) holds that the readers use, parsed from
/// its text.
struct Parsed {
    text: String,
    roles: Vec<String>,
    states: Vec<String>,
    entity: Option<Entity>,
}

impl Parsed {
    fn of(text: String) -> Option<Parsed> {
        let v: Value = serde_json::from_str(&text).ok()?;
        let entity = match v.get("entity") {
            Some(Value::Object(e)) => Some(Entity {
                kind: e.get("type")?.as_str()?.to_string(),
                id: e.get("id")?.as_str()?.to_string(),
            }),
            _ => None,
        };
        Some(Parsed {
            roles: string_array(v.get("roles")),
            states: string_array(v.get("states")),
            entity,
            text,
        })
    }
}

thread_local! {
    /// The last context text parsed, with what it holds. Every function of a call reads the same
    /// setting (`set_context`'s own checks, Gate A's list, Gate B's call: parsing it each time was
    /// about 1.5 % of a call's backend CPU, issue 34). Kept by its whole text (at most
    /// `MAX_PAGE_BYTES` and the token's claims): whatever changes the setting (the next
    /// `set_context`, a savepoint rolled back) is read and parsed anew. Forgotten when the
    /// transaction ends ([`forget_parsed`]).
    static PARSED: std::cell::RefCell<Option<std::rc::Rc<Parsed>>> =
        const { std::cell::RefCell::new(None) };
}

/// Forget the parsed context (at the end of every transaction: nothing of a client's context stays
/// in the backend for the next client of a pooled connection, even where SQL cannot read it).
pub fn forget_parsed() {
    PARSED.with(|p| p.borrow_mut().take());
}

impl Ctx {
    /// The current context, or `None` (fail closed) if there is none or it cannot be read.
    pub fn current() -> Option<Ctx> {
        let raw = reader(&gucs::CONTEXT)?;
        let parsed = PARSED.with(|p| {
            let mut p = p.borrow_mut();
            match p.as_ref() {
                Some(kept) if kept.text == raw => Some(kept.clone()),
                _ => {
                    let fresh = std::rc::Rc::new(Parsed::of(raw)?);
                    *p = Some(fresh.clone());
                    Some(fresh)
                }
            }
        })?;
        Some(Ctx {
            tenant_id: gucs::get(&gucs::TENANT_ID)?,
            user_id: gucs::get(&gucs::USER_ID)?,
            roles: parsed.roles.clone(),
            page_type: gucs::get(&gucs::PAGE_TYPE)?,
            entity: parsed.entity.clone(),
            states: parsed.states.clone(),
            generation: gucs::get(&gucs::GENERATION),
            trace_id: gucs::get(&gucs::TRACE_ID),
        })
    }

    pub fn view(&self) -> ctxguard_core::policy::ContextView<'_> {
        ctxguard_core::policy::ContextView {
            page_type: &self.page_type,
            entity_type: self.entity.as_ref().map(|e| e.kind.as_str()),
            roles: &self.roles,
            states: &self.states,
        }
    }
}

/// Log a refused `set_context` (the raising transaction cannot keep an audit row), then raise.
fn deny(
    code: PgSqlErrorCode,
    reason: &str,
    who: Option<&token::Identity>,
    page_type: Option<&str>,
) -> ! {
    pgrx::log!(
        "ctxguard: set_context denied reason=\"{}\" tenant={} user={} page_type={}",
        reason,
        who.map_or("-", |w| w.tenant_id.as_str()),
        who.map_or("-", |w| w.user_id.as_str()),
        page_type.unwrap_or("-"),
    );
    raise(code, format!("ctxguard: {reason}"))
}

/// Verify a context token without setting a context: its identity, or SQLSTATE 28000.
/// Lets the gateway authenticate a request (e.g. an MCP POST) before it knows the page.
#[pg_extern(stable, parallel_safe)]
fn verify_token(token: Option<&str>) -> JsonB {
    match verify(token) {
        Ok(who) => {
            JsonB(json!({"tenantId": who.tenant_id, "userId": who.user_id, "roles": who.roles}))
        }
        Err(e) => deny(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            &format!("invalid context token: {e}"),
            None,
            None,
        ),
    }
}

/// `ctxguard.set_context(token text, page jsonb, generation uuid, trace_id text)`: verify `token`,
/// validate `page`, and make them the context of the current transaction. Its SQL is written by
/// hand (`sql/finalize.sql`) as a C function bound to this symbol, as 0.1.0's was: a SQL wrapper
/// is inlined by the planner in every client statement that calls it (its body read from the
/// catalog, checked and folded each time: issue 34, about 4 % of a call's backend CPU). The page
/// arrives as the text `jsonb_out` makes of it ([`JsonbText`]): its size is checked before it is
/// parsed, and a page too deep to parse is a clean 22023.
#[pg_extern(volatile, parallel_unsafe, sql = false)]
fn set_context(
    token: Option<&str>,
    page: Option<JsonbText>,
    generation: default!(Option<pgrx::Uuid>, "NULL"),
    trace_id: default!(Option<&str>, "NULL"),
) -> crate::pgutil::JsonbDatum {
    let page = page.map(|JsonbText(text)| text);
    set(token, page.as_deref(), generation, trace_id).into()
}

/// [`set_context`] with the page as JSON text (`ctxguard._set_context`), parsed strictly: a text
/// repeating a member is refused.
#[pg_extern(volatile, parallel_unsafe, name = "_set_context")]
fn set_context_text(
    token: Option<&str>,
    page: Option<&str>,
    generation: default!(Option<pgrx::Uuid>, "NULL"),
    trace_id: default!(Option<&str>, "NULL"),
) -> crate::pgutil::JsonbDatum {
    set(token, page, generation, trace_id).into()
}

fn set(
    token: Option<&str>,
    page: Option<&str>,
    generation: Option<pgrx::Uuid>,
    trace_id: Option<&str>,
) -> JsonB {
    crate::log_guard::saw_token();
    let _pin = crate::owner::pin();
    let auth = PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION;
    let invalid = PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE;
    if !PRELOADED.load(Ordering::Relaxed) {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "ctxguard must be listed in shared_preload_libraries",
        );
    }
    refuse_inside("set_context");
    if !in_transaction_block() {
        deny(
            PgSqlErrorCode::ERRCODE_NO_ACTIVE_SQL_TRANSACTION,
            "set_context must be called inside a transaction block (BEGIN ... COMMIT)",
            None,
            None,
        );
    }
    let who = match verify(token) {
        Ok(who) => who,
        Err(e) => deny(auth, &format!("invalid context token: {e}"), None, None),
    };
    let Some(page_text) = page else {
        deny(
            invalid,
            "invalid page context: page is required",
            Some(&who),
            None,
        )
    };
    if page_text.len() > MAX_PAGE_BYTES {
        deny(
            invalid,
            "invalid page context: larger than 64 KiB",
            Some(&who),
            None,
        );
    }
    // Strict: a deep page is an error, never a crash, and a page repeating a member is refused
    // (a `jsonb` page has none; `_set_context` called with text may).
    let page_json = match json::parse(page_text.as_bytes()) {
        Ok(v) => v,
        Err(JsonError::Duplicate) => deny(
            invalid,
            "invalid page context: an object repeats a member",
            Some(&who),
            None,
        ),
        Err(JsonError::Syntax | JsonError::TooDeep) => deny(
            invalid,
            "invalid page context: not valid JSON or nested too deeply",
            Some(&who),
            None,
        ),
    };
    // One catalog read serves the page-type lookup and the entity check.
    let catalog = cache::catalog();
    let page = match page::parse_page(&page_json, |n| catalog.page_type(n)) {
        Ok(p) => p,
        Err(e) => deny(invalid, &e.to_string(), Some(&who), None),
    };
    let trace_id = match trace_id {
        None => None,
        Some(t) if is_valid_id(t) => Some(t.to_string()),
        Some(_) => deny(
            invalid,
            "trace_id must be 1-128 printable ASCII characters",
            Some(&who),
            Some(&page.page_type),
        ),
    };
    let generation = generation.map(|g| uuid::Uuid::from_bytes(*g.as_bytes()).to_string());
    if let Some(g) = &generation {
        if !generation_valid(g, &who) {
            deny(
                auth,
                "unknown, foreign or expired generation",
                Some(&who),
                Some(&page.page_type),
            );
        }
    }

    let context = json!({
        "tenantId": who.tenant_id,
        "userId": who.user_id,
        "roles": who.roles,
        "pageType": page.page_type,
        "entity": page.entity_json(),
        "pageState": page.page_state,
        "states": page.states,
        "generation": generation,
        "traceId": trace_id,
    });
    let values: [String; 10] = [
        who.tenant_id.clone(),
        who.user_id.clone(),
        serde_json::to_string(&who.roles).unwrap_or_default(),
        page.page_type.clone(),
        page.entity
            .as_ref()
            .map(|e| e.kind.clone())
            .unwrap_or_default(),
        page.entity
            .as_ref()
            .map(|e| e.id.clone())
            .unwrap_or_default(),
        generation.clone().unwrap_or_default(),
        trace_id.clone().unwrap_or_default(),
        context.to_string(),
        page_json.to_string(),
    ];
    for ((_, name), value) in gucs::CONTEXT_GUCS.iter().zip(values.iter()) {
        set_local(name, value);
    }
    if let Some(e) = &page.entity {
        // Same message whether the row (or what it lies within) is in another tenant, belongs
        // elsewhere, or does not exist at all.
        let found = entity_exists(&catalog, e, &who.tenant_id)
            && page
                .within
                .as_ref()
                .is_none_or(|w| within_holds(&catalog, e, w, &who.tenant_id));
        if !found {
            deny(
                invalid,
                "invalid page context: entity not found",
                Some(&who),
                Some(&page.page_type),
            );
        }
    }
    JsonB(context)
}

fn generation_valid(generation: &str, who: &token::Identity) -> bool {
    as_owner(|| {
        Spi::connect(|c| {
            let plan = saved_plan(
                c,
                "SELECT EXISTS (SELECT 1 FROM ctxguard.generations
                  WHERE id = $1::pg_catalog.uuid AND tenant_id = $2 AND user_id = $3 AND expires_at > pg_catalog.now())",
                &[TEXT, TEXT, TEXT],
                false,
            )?;
            c.select(
                &*plan,
                Some(1),
                &[
                    generation.into(),
                    who.tenant_id.as_str().into(),
                    who.user_id.as_str().into(),
                ],
            )?
            .first()
            .get_one::<bool>()
        })
    }) == Ok(Some(true))
}

/// If the entity type is mapped to a protected table, does the row exist in the caller's tenant?
/// Run as the owner (the caller may hold no privilege on the table) with an explicit tenant
/// predicate over quoted, schema-qualified names.
fn entity_exists(catalog: &cache::Catalog, e: &Entity, tenant_id: &str) -> bool {
    let Some(mapping) = catalog.entity(&e.kind) else {
        return true;
    };
    if !mapping.accepts(&e.id) {
        return false;
    }
    as_owner(|| {
        Spi::connect(|c| {
            let plan = saved_plan(c, &mapping.exists_sql, &[TEXT, TEXT], false)?;
            c.select(&*plan, Some(1), &[e.id.as_str().into(), tenant_id.into()])?
                .first()
                .get_one::<bool>()
        })
    }) == Ok(Some(true))
}

/// Does `entity` lie within `within` in the caller's tenant? ctxguard knows one such relation: a
/// document and the entity it is attached to (`put_document`'s `entity_type`, `entity_id`), which
/// must exist in the tenant too. Any other pair is refused.
fn within_holds(
    catalog: &cache::Catalog,
    entity: &Entity,
    within: &Entity,
    tenant_id: &str,
) -> bool {
    if entity.kind != "document" || !entity_exists(catalog, within, tenant_id) {
        return false;
    }
    as_owner(|| {
        Spi::connect(|c| {
            let plan = saved_plan(
                c,
                "SELECT EXISTS (SELECT 1 FROM ctxguard.documents d
                  WHERE d.tenant_id OPERATOR(pg_catalog.=) $1 AND d.id OPERATOR(pg_catalog.=) $2
                    AND d.entity_type OPERATOR(pg_catalog.=) $3 AND d.entity_id OPERATOR(pg_catalog.=) $4)",
                &[TEXT, TEXT, TEXT, TEXT],
                false,
            )?;
            c.select(
                &*plan,
                Some(1),
                &[
                    tenant_id.into(),
                    entity.id.as_str().into(),
                    within.kind.as_str().into(),
                    within.id.as_str().into(),
                ],
            )?
            .first()
            .get_one::<bool>()
        })
    }) == Ok(Some(true))
}

/// The whole context as JSON, or NULL.
#[pg_extern(stable, parallel_safe)]
fn context() -> Option<JsonB> {
    reader(&gucs::CONTEXT)
        .and_then(|s| serde_json::from_str(&s).ok())
        .map(JsonB)
}

#[pg_extern(stable, parallel_safe)]
fn tenant_id() -> Option<String> {
    reader(&gucs::TENANT_ID)
}

#[pg_extern(stable, parallel_safe)]
fn user_id() -> Option<String> {
    reader(&gucs::USER_ID)
}

#[pg_extern(stable, parallel_safe)]
fn roles() -> Option<Vec<String>> {
    reader(&gucs::ROLES).and_then(|s| serde_json::from_str(&s).ok())
}

#[pg_extern(stable, parallel_safe)]
fn has_role(role: Option<&str>) -> Option<bool> {
    let roles: Vec<String> = serde_json::from_str(&reader(&gucs::ROLES)?).ok()?;
    Some(role.is_some_and(|r| roles.iter().any(|x| x == r)))
}

#[pg_extern(stable, parallel_safe)]
fn page_type() -> Option<String> {
    reader(&gucs::PAGE_TYPE)
}

#[pg_extern(stable, parallel_safe)]
fn entity_type() -> Option<String> {
    reader(&gucs::ENTITY_TYPE)
}

#[pg_extern(stable, parallel_safe)]
fn entity_id() -> Option<String> {
    reader(&gucs::ENTITY_ID)
}

#[pg_extern(stable, parallel_safe)]
fn generation() -> Option<pgrx::Uuid> {
    let g = uuid::Uuid::parse_str(&reader(&gucs::GENERATION)?).ok()?;
    Some(pgrx::Uuid::from_bytes(*g.as_bytes()))
}

/// Mint a generation id bound to the current tenant and user (expires after the tenant's
/// generation lifetime: `ctxguard.effective_ttls()`).
/// It also becomes the current context's generation for the rest of the transaction.
#[pg_extern(volatile, parallel_unsafe)]
fn begin_generation(conversation_id: Option<&str>) -> pgrx::Uuid {
    let _pin = crate::owner::pin();
    refuse_inside("begin_generation");
    let Some(ctx) = Ctx::current() else {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            "ctxguard: no context is set",
        )
    };
    let conv = match conversation_id {
        Some(c) if is_valid_id(c) => c,
        _ => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "ctxguard: conversation_id must be 1-128 printable ASCII characters",
        ),
    };
    let id = uuid::Uuid::new_v4();
    as_owner(|| {
        Spi::connect_mut(|c| {
            crate::pgutil::update_saved(
                c,
                "INSERT INTO ctxguard.generations (id, tenant_id, user_id, conversation_id, expires_at)
                 VALUES ($1::pg_catalog.uuid, $2, $3, $4, pg_catalog.now() + pg_catalog.make_interval(secs => $5))",
                None,
                &[
                    id.to_string().as_str().into(),
                    ctx.tenant_id.as_str().into(),
                    ctx.user_id.as_str().into(),
                    conv.into(),
                    f64::from(crate::ttls::for_tenant(&ctx.tenant_id).generation).into(),
                ],
            )
            .map(|_| ())
        })
    })
    .unwrap_or_else(|_| {
        raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            "ctxguard: could not record generation",
        )
    });
    // The new generation becomes the current context's for the rest of this transaction (as if
    // set_context had been called again with it), saving a second token and page check.
    let id_text = id.to_string();
    set_local(c"ctxguard.generation", &id_text);
    if let Some(mut context) =
        reader(&gucs::CONTEXT).and_then(|s| serde_json::from_str::<Value>(&s).ok())
    {
        context["generation"] = Value::String(id_text);
        set_local(c"ctxguard.context", &context.to_string());
    }
    pgrx::Uuid::from_bytes(*id.as_bytes())
}
