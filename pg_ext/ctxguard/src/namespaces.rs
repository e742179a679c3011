//! Namespaces and tool search (issue 31): `register_namespace` (the DBA's), `visible_namespaces`
//! and `find_tools` (the gateway's, for progressive disclosure).
//!
//! A tool's namespace is the first segment of its name, or its upstream server
//! (`ctxguard_core::namespaces::namespace_of`). What a namespace is called and described as is
//! catalog data (`ctxguard.namespaces`, cached with the rest of the catalog in `cache.rs`). What
//! exists in a namespace is never read here: both readers start from Gate A's tools for the
//! current context (`gates::visible`, `gates::find`), so a namespace whose tools are all hidden
//! on a page is not listed there, and a hidden tool is neither counted nor found.

use std::collections::BTreeMap;

use ctxguard_core::names::{check_description, check_title};
use ctxguard_core::namespaces::{check_find, is_valid_namespace, FindError};
use pgrx::prelude::*;

use crate::cache;
use crate::context::Ctx;
use crate::gates;
use crate::pgutil::{raise, JsonbBytes};

pgrx::extension_sql_file!(
    "../sql/namespaces.sql",
    name = "namespaces",
    requires = ["bootstrap"]
);

const INVALID: PgSqlErrorCode = PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE;

/// `ctxguard.register_namespace(name, description, title DEFAULT NULL)`: describe a namespace
/// (upsert). The name is one segment of tool names (`invoice`); the description (1-4000 bytes) and
/// title (1-128 characters, no control characters) are checked as a tool's are, their sizes
/// first. 22023 on any problem. EXECUTE is revoked from PUBLIC (`sql/finalize.sql`), and it runs
/// as its caller: as `register_page_type`, only a role that may write the catalog can use it.
#[pg_extern(volatile, parallel_unsafe)]
fn register_namespace(
    name: Option<&str>,
    description: Option<&str>,
    title: default!(Option<&str>, "NULL"),
) {
    crate::handler::refuse_inside("register_namespace");
    let _pin = crate::owner::pin();
    let name = name.filter(|n| is_valid_namespace(n)).unwrap_or_else(|| {
        raise(
            INVALID,
            "ctxguard: invalid namespace name (one segment of a tool name, such as 'invoice')",
        )
    });
    let description = description
        .ok_or("description must be non-empty and at most 4000 bytes")
        .and_then(|d| check_description(d).map(|()| d))
        .unwrap_or_else(|m| raise(INVALID, format!("ctxguard: {m}")));
    if let Some(t) = title {
        check_title(t).unwrap_or_else(|m| raise(INVALID, format!("ctxguard: {m}")));
    }
    Spi::run_with_args(
        "INSERT INTO ctxguard.namespaces (name, title, description) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET title = EXCLUDED.title,
             description = EXCLUDED.description, updated_at = pg_catalog.now()",
        &[name.into(), title.into(), description.into()],
    )
    .unwrap_or_else(|e| {
        raise(
            INVALID,
            format!("ctxguard: could not register namespace: {e}"),
        )
    });
}

/// `ctxguard.visible_namespaces()`: the namespaces of the tools Gate A shows under the current
/// context, in name order, each with its title and description (registered, or an upstream
/// server's description), the number of its visible tools, and its upstream server when it has
/// visible upstream tools. A namespace with no visible tool here is not listed. No context: no rows.
#[pg_extern(stable, parallel_unsafe)]
#[expect(
    clippy::type_complexity,
    reason = "pgrx reads the column names from the name! entries of this signature"
)]
fn visible_namespaces() -> TableIterator<
    'static,
    (
        name!(namespace, String),
        name!(title, Option<String>),
        name!(description, Option<String>),
        name!(tools, i32),
        name!(server, Option<String>),
    ),
> {
    let _pin = crate::owner::pin();
    let Some(ctx) = Ctx::current() else {
        return TableIterator::new(Vec::new());
    };
    // Gate A's answer as visible_tools() gives it without a query (kept per backend).
    let visible = gates::visible(&ctx, None, None);
    let mut counted: BTreeMap<&str, (i32, Option<&str>)> = BTreeMap::new();
    for t in visible.iter() {
        pg_sys::check_for_interrupts!();
        let entry = counted.entry(t.namespace.as_str()).or_insert((0, None));
        entry.0 += 1;
        if let Some(server) = t.server.as_deref() {
            entry.1 = Some(server);
        }
    }
    let names: Vec<&str> = counted.keys().copied().collect();
    let described = cache::catalog().described(&names);
    let rows: Vec<_> = counted
        .into_iter()
        .zip(described)
        .map(|((name, (tools, server)), d)| {
            (
                name.to_string(),
                d.title,
                d.description,
                tools,
                server.map(str::to_string),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// `ctxguard.find_tools(query, top_k DEFAULT 5)`: Gate A's tools for the current context that
/// match `query`, best first, at most `top_k` (1-100; 22023 otherwise), with the columns of
/// `visible_tools` and the lexical score. The DBA's matching tools come first, by relevance;
/// upstream tools follow in the room left, servers taking turns and capped at
/// `ctxguard.max_offered_tools_per_server` (`ctxguard_core::ranking::search`). A tool that does
/// not match is not returned. The query is at most 4096 bytes (54000 beyond, checked before it is
/// read). No context, or no word to search for: no rows.
#[pg_extern(stable, parallel_unsafe)]
#[expect(
    clippy::type_complexity,
    reason = "pgrx reads the column names from the name! entries of this signature"
)]
fn find_tools(
    query: Option<&str>,
    top_k: default!(Option<i32>, 5),
) -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(description, String),
        name!(input_schema, JsonbBytes),
        name!(read_only, bool),
        name!(danger, String),
        name!(requires_approval, bool),
        name!(server, Option<String>),
        name!(namespace, String),
        name!(score, f32),
    ),
> {
    let _pin = crate::owner::pin();
    let top_k = top_k.unwrap_or(5);
    let words = check_find(query, top_k).unwrap_or_else(|e| match e {
        FindError::QueryTooLong => raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("ctxguard: find_tools: {e}"),
        ),
        FindError::TopK => raise(INVALID, format!("ctxguard: find_tools: {e}")),
    });
    let Some(ctx) = Ctx::current() else {
        return TableIterator::new(Vec::new());
    };
    let rows: Vec<_> = gates::find(&ctx, words.as_deref(), top_k as usize)
        .into_iter()
        .map(|t| {
            (
                t.name,
                t.description,
                t.input_schema,
                t.read_only,
                t.danger.to_string(),
                t.requires_approval,
                t.server,
                t.namespace,
                t.score,
            )
        })
        .collect();
    TableIterator::new(rows)
}
