//! Upstream credentials (issue 33): the encrypted credentials the gateway uses to call upstream MCP
//! servers as the user (`user_oauth`) or as the user's tenant (`tenant_secret`).
//!
//! The database never sees a credential in clear: the gateway encrypts it (AEAD, associated data
//! binding tenant, user, server and mode) with a key only it holds, and stores ciphertext, nonce and
//! key id here. Every function works on the verified context's own rows only; nothing the caller
//! passes names a tenant or a user:
//!
//! - `put_upstream_credential(server, ...)`: store (replace) the context user's own connection to a
//!   `user_oauth` server the user may use. Audited (`credential_set`).
//! - `delete_upstream_credential(server)`: delete it, answering the deleted ciphertext once (so that
//!   the gateway can revoke it at the authorization server). Audited (`credential_deleted`).
//! - `put_tenant_secret(server, ...)` / `delete_tenant_secret(server)`: the context tenant's secret
//!   for a `tenant_secret` server; only a user whose verified roles hold
//!   `ctxguard.tenant_admin_role` (default `tenant_admin`). Write-only: no function answers a
//!   tenant secret except `upstream_credential`, below. Audited.
//! - `upstream_credential(call_id)`: the credential of the server of one upstream call Gate B
//!   authorized for the context user and not yet completed: the user's connection, or the
//!   tenant's secret. This is the gateway's call path, and the only way a stored ciphertext is read.
//! - `upstream_connections()`: which of the servers the user may use take a credential, and
//!   whether one is stored (no ciphertext).
//!
//! Gate B refuses a call to a `user_oauth` server with `CONNECTION_REQUIRED` when the context user
//! has no connection ([`connected`]); Gate A hides such a server's tools from that user when the
//! DBA set `requires_connection` ([`connected_servers`]).
//!
//! SQLSTATEs: 28000 without a context; 22004 a NULL argument; 54000 an argument over its size
//! limit; 22023 anything else malformed, and a server that is not there for this caller (unknown,
//! another mode, not allowed: one message); 42501 a tenant secret without the admin role. No error
//! repeats a value it was given.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

use crate::cache;
use crate::context::Ctx;
use crate::gates::{self, Call, Outcome};
use crate::gucs;
use crate::owner::as_owner;
use crate::pgutil::{raise, required};
use ctxguard_core::mcp::is_valid_server_name;

pgrx::extension_sql_file!(
    "../sql/credentials.sql",
    name = "credentials",
    requires = ["mcp"]
);

/// Most bytes of a ciphertext (a credential of up to 16 KiB and its 16-byte tag).
pub const MAX_CIPHERTEXT_BYTES: usize = 16_400;
/// XChaCha20-Poly1305's nonce.
pub const NONCE_BYTES: usize = 24;
/// Most bytes of a key id.
const MAX_KEY_ID_BYTES: usize = 64;

const INVALID: PgSqlErrorCode = PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE;
const NOT_HERE: &str = "ctxguard: no such upstream server takes this credential for this user";

fn context() -> Ctx {
    Ctx::current().unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
            "ctxguard: no context is set",
        )
    })
}

fn check_server(server: Option<&str>) -> &str {
    let server = required(server, "server");
    if server.len() > 32 || !is_valid_server_name(server) {
        raise(INVALID, NOT_HERE);
    }
    server
}

fn check_key_id(key_id: Option<&str>) -> &str {
    let key_id = required(key_id, "key_id");
    if key_id.len() > MAX_KEY_ID_BYTES {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("ctxguard: key_id is limited to {MAX_KEY_ID_BYTES} bytes"),
        );
    }
    if key_id.is_empty()
        || !key_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        raise(INVALID, "ctxguard: key_id must be letters, digits, _ or -");
    }
    key_id
}

/// A ciphertext and its nonce, sizes checked (never echoed).
fn check_sealed<'a>(
    ciphertext: Option<&'a [u8]>,
    nonce: Option<&'a [u8]>,
    what: &str,
) -> (&'a [u8], &'a [u8]) {
    let ciphertext = required(ciphertext, what);
    let nonce = required(nonce, "nonce");
    if ciphertext.len() > MAX_CIPHERTEXT_BYTES {
        raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("ctxguard: {what} is limited to {MAX_CIPHERTEXT_BYTES} bytes"),
        );
    }
    if ciphertext.len() < 17 || nonce.len() != NONCE_BYTES {
        raise(
            INVALID,
            format!("ctxguard: {what} is not an AEAD ciphertext with a {NONCE_BYTES}-byte nonce"),
        );
    }
    (ciphertext, nonce)
}

/// Is `server` one whose calls use a credential of `mode`, and may the caller of `ctx` use it?
fn server_takes(ctx: &Ctx, server: &str, mode: &str) -> bool {
    if !cache::catalog().server_allows(server, ctx) {
        return false;
    }
    as_owner(|| {
        Spi::get_one_with_args::<bool>(
            "SELECT true FROM ctxguard.mcp_servers s
              WHERE s.name OPERATOR(pg_catalog.=) $1 AND s.enabled
                AND s.credential_mode OPERATOR(pg_catalog.=) $2",
            &[server.into(), mode.into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or(false)
}

fn is_tenant_admin(ctx: &Ctx) -> bool {
    gucs::get(&gucs::TENANT_ADMIN_ROLE).is_some_and(|r| ctx.roles.contains(&r))
}

/// Run `change` (which answers whether it changed anything) and audit it as `status` on `server`;
/// the change is kept only with its audit record (`gates::audited`). A change that cannot be
/// audited is undone and refused (55000). The envelope names the audit record's call id.
fn audited_change(
    ctx: &Ctx,
    server: &str,
    status: &'static str,
    change: impl FnOnce() -> bool,
) -> JsonB {
    let id = uuid::Uuid::new_v4();
    let unaudited = || -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "ctxguard: the change cannot be audited now; nothing was changed",
        )
    };
    if gates::audit_ready(id).is_some() {
        unaudited();
    }
    let (call, changed) = gates::audited(|| {
        let changed = change();
        let mut call = Call::new(id);
        call.tool = Some(server.to_string());
        if changed {
            call.outcome = Outcome::Decided {
                status,
                requested_by: ctx.user_id.clone(),
            };
            gates::audit(Some(ctx), &mut call);
        }
        (call, changed)
    });
    if call.unaudited {
        unaudited();
    }
    JsonB(json!({"status": "ok", "server": server, "changed": changed, "call_id": id.to_string()}))
}

/// An SPI failure: logged without detail (a row's values could be in it), raised as XX000.
fn internal(_e: pgrx::spi::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        "ctxguard: could not read or change the credential",
    )
}

/// Store (replace) the context user's own connection to `user_oauth` server `server`: ciphertext
/// and nonce of the access token, optionally its expiry and the refresh token's ciphertext and
/// nonce, all sealed by the gateway under `key_id`. Audited as `credential_set`.
#[pg_extern(volatile, parallel_unsafe)]
fn put_upstream_credential(
    server: Option<&str>,
    key_id: Option<&str>,
    ciphertext: Option<&[u8]>,
    nonce: Option<&[u8]>,
    expires_at: default!(Option<TimestampWithTimeZone>, "NULL"),
    refresh_ciphertext: default!(Option<&[u8]>, "NULL"),
    refresh_nonce: default!(Option<&[u8]>, "NULL"),
) -> JsonB {
    let _pin = crate::owner::pin();
    crate::handler::refuse_inside("put_upstream_credential");
    let ctx = context();
    let server = check_server(server);
    let key_id = check_key_id(key_id);
    let (ciphertext, nonce) = check_sealed(ciphertext, nonce, "ciphertext");
    let refresh = match (refresh_ciphertext, refresh_nonce) {
        (None, None) => None,
        (c, n) => Some(check_sealed(c, n, "refresh_ciphertext")),
    };
    if !server_takes(&ctx, server, "user_oauth") {
        raise(INVALID, NOT_HERE);
    }
    audited_change(&ctx, server, "credential_set", || {
        as_owner(|| {
            Spi::run_with_args(
                "INSERT INTO ctxguard.upstream_credentials AS c
                        (tenant_id, user_id, server, mode, key_id, ciphertext, nonce, expires_at,
                         refresh_ciphertext, refresh_nonce)
                 VALUES ($1, $2, $3, 'user_oauth', $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (tenant_id, server, user_id) DO UPDATE
                    SET mode = EXCLUDED.mode, key_id = EXCLUDED.key_id, ciphertext = EXCLUDED.ciphertext,
                        nonce = EXCLUDED.nonce, expires_at = EXCLUDED.expires_at,
                        refresh_ciphertext = EXCLUDED.refresh_ciphertext,
                        refresh_nonce = EXCLUDED.refresh_nonce, updated_at = pg_catalog.now()",
                &[
                    ctx.tenant_id.as_str().into(),
                    ctx.user_id.as_str().into(),
                    server.into(),
                    key_id.into(),
                    ciphertext.into(),
                    nonce.into(),
                    expires_at.into(),
                    refresh.map(|r| r.0).into(),
                    refresh.map(|r| r.1).into(),
                ],
            )
        })
        .unwrap_or_else(|e| internal(e));
        true
    })
}

/// Delete the context user's own connection to `server` (any server: a user can always
/// disconnect), answering what was deleted, once, so that the gateway can revoke it. Audited as
/// `credential_deleted` when there was one.
#[pg_extern(volatile, parallel_unsafe)]
#[expect(
    clippy::type_complexity,
    reason = "pgrx reads the column names from the name! entries of this signature"
)]
fn delete_upstream_credential(
    server: Option<&str>,
) -> TableIterator<
    'static,
    (
        name!(key_id, String),
        name!(ciphertext, Vec<u8>),
        name!(nonce, Vec<u8>),
        name!(refresh_ciphertext, Option<Vec<u8>>),
        name!(refresh_nonce, Option<Vec<u8>>),
    ),
> {
    let _pin = crate::owner::pin();
    crate::handler::refuse_inside("delete_upstream_credential");
    let ctx = context();
    let server = check_server(server);
    let mut deleted = None;
    audited_change(&ctx, server, "credential_deleted", || {
        deleted = as_owner(|| {
            Spi::connect_mut(|c| {
                let mut rows = c.update(
                    "DELETE FROM ctxguard.upstream_credentials
                      WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND user_id OPERATOR(pg_catalog.=) $2
                        AND server OPERATOR(pg_catalog.=) $3 AND mode OPERATOR(pg_catalog.=) 'user_oauth'
                  RETURNING key_id, ciphertext, nonce, refresh_ciphertext, refresh_nonce",
                    Some(1),
                    &[
                        ctx.tenant_id.as_str().into(),
                        ctx.user_id.as_str().into(),
                        server.into(),
                    ],
                )?;
                Ok::<_, pgrx::spi::Error>(match rows.next() {
                    Some(r) => Some((
                        r.get::<String>(1)?.unwrap_or_default(),
                        r.get::<Vec<u8>>(2)?.unwrap_or_default(),
                        r.get::<Vec<u8>>(3)?.unwrap_or_default(),
                        r.get::<Vec<u8>>(4)?,
                        r.get::<Vec<u8>>(5)?,
                    )),
                    None => None,
                })
            })
        })
        .unwrap_or_else(|e| internal(e));
        deleted.is_some()
    });
    TableIterator::new(deleted)
}

/// Set (replace) the context tenant's secret for `tenant_secret` server `server`: only a user
/// holding `ctxguard.tenant_admin_role`. Write-only: no function reads it back but the gateway's
/// call path (`upstream_credential`). Audited as `credential_set`.
#[pg_extern(volatile, parallel_unsafe)]
fn put_tenant_secret(
    server: Option<&str>,
    key_id: Option<&str>,
    ciphertext: Option<&[u8]>,
    nonce: Option<&[u8]>,
) -> JsonB {
    let _pin = crate::owner::pin();
    crate::handler::refuse_inside("put_tenant_secret");
    let ctx = context();
    let server = check_server(server);
    let key_id = check_key_id(key_id);
    let (ciphertext, nonce) = check_sealed(ciphertext, nonce, "ciphertext");
    if !is_tenant_admin(&ctx) {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "ctxguard: only the tenant's admin may set its upstream secrets",
        );
    }
    if !server_takes(&ctx, server, "tenant_secret") {
        raise(INVALID, NOT_HERE);
    }
    audited_change(&ctx, server, "credential_set", || {
        as_owner(|| {
            Spi::run_with_args(
                "INSERT INTO ctxguard.upstream_credentials AS c
                        (tenant_id, user_id, server, mode, key_id, ciphertext, nonce)
                 VALUES ($1, '', $2, 'tenant_secret', $3, $4, $5)
                 ON CONFLICT (tenant_id, server, user_id) DO UPDATE
                    SET mode = EXCLUDED.mode, key_id = EXCLUDED.key_id, ciphertext = EXCLUDED.ciphertext,
                        nonce = EXCLUDED.nonce, expires_at = NULL, refresh_ciphertext = NULL,
                        refresh_nonce = NULL, updated_at = pg_catalog.now()",
                &[
                    ctx.tenant_id.as_str().into(),
                    server.into(),
                    key_id.into(),
                    ciphertext.into(),
                    nonce.into(),
                ],
            )
        })
        .unwrap_or_else(|e| internal(e));
        true
    })
}

/// Delete the context tenant's secret for `server` (its tenant admin only). Audited.
#[pg_extern(volatile, parallel_unsafe)]
fn delete_tenant_secret(server: Option<&str>) -> JsonB {
    let _pin = crate::owner::pin();
    crate::handler::refuse_inside("delete_tenant_secret");
    let ctx = context();
    let server = check_server(server);
    if !is_tenant_admin(&ctx) {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "ctxguard: only the tenant's admin may delete its upstream secrets",
        );
    }
    audited_change(&ctx, server, "credential_deleted", || {
        as_owner(|| {
            Spi::connect_mut(|c| {
                let deleted = c.update(
                    "DELETE FROM ctxguard.upstream_credentials
                      WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND user_id OPERATOR(pg_catalog.=) ''
                        AND server OPERATOR(pg_catalog.=) $2",
                    None,
                    &[ctx.tenant_id.as_str().into(), server.into()],
                )?;
                Ok::<_, pgrx::spi::Error>(!deleted.is_empty())
            })
        })
        .unwrap_or_else(|e| internal(e))
    })
}

/// The credential for upstream call `call_id`: one Gate B authorized for the context's tenant and
/// user, not completed and not expired. The row of its server's current mode: the user's
/// connection (`user_oauth`) or the tenant's secret (`tenant_secret`); none otherwise. The
/// gateway decrypts it with associated data naming the context's tenant, user, server and mode.
#[pg_extern(volatile, parallel_unsafe)]
#[expect(
    clippy::type_complexity,
    reason = "pgrx reads the column names from the name! entries of this signature"
)]
fn upstream_credential(
    call_id: Option<pgrx::Uuid>,
) -> TableIterator<
    'static,
    (
        name!(server, String),
        name!(mode, String),
        name!(key_id, String),
        name!(ciphertext, Vec<u8>),
        name!(nonce, Vec<u8>),
        name!(expires_at, Option<TimestampWithTimeZone>),
        name!(refresh_ciphertext, Option<Vec<u8>>),
        name!(refresh_nonce, Option<Vec<u8>>),
    ),
> {
    let _pin = crate::owner::pin();
    crate::handler::refuse_inside("upstream_credential");
    let ctx = context();
    let id = required(call_id, "call_id");
    let id = uuid::Uuid::from_bytes(*id.as_bytes());
    let row = as_owner(|| {
        Spi::connect(|c| {
            let mut rows = c.select(
                "SELECT s.name, cr.mode, cr.key_id, cr.ciphertext, cr.nonce, cr.expires_at,
                        cr.refresh_ciphertext, cr.refresh_nonce
                   FROM ctxguard.external_calls x
                   JOIN ctxguard.tools t ON t.name OPERATOR(pg_catalog.=) x.tool
                   JOIN ctxguard.mcp_servers s ON s.name OPERATOR(pg_catalog.=) t.server
                   JOIN ctxguard.upstream_credentials cr
                     ON cr.server OPERATOR(pg_catalog.=) s.name
                    AND cr.tenant_id OPERATOR(pg_catalog.=) x.tenant_id
                    AND cr.mode OPERATOR(pg_catalog.=) s.credential_mode
                    AND cr.user_id OPERATOR(pg_catalog.=)
                        CASE s.credential_mode WHEN 'user_oauth' THEN x.user_id ELSE '' END
                  WHERE x.call_id OPERATOR(pg_catalog.=) $1::pg_catalog.uuid
                    AND x.tenant_id OPERATOR(pg_catalog.=) $2 AND x.user_id OPERATOR(pg_catalog.=) $3
                    AND x.completed_at IS NULL AND x.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()",
                Some(1),
                &[
                    id.to_string().as_str().into(),
                    ctx.tenant_id.as_str().into(),
                    ctx.user_id.as_str().into(),
                ],
            )?;
            Ok::<_, pgrx::spi::Error>(match rows.next() {
                Some(r) => Some((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<String>(2)?.unwrap_or_default(),
                    r.get::<String>(3)?.unwrap_or_default(),
                    r.get::<Vec<u8>>(4)?.unwrap_or_default(),
                    r.get::<Vec<u8>>(5)?.unwrap_or_default(),
                    r.get::<TimestampWithTimeZone>(6)?,
                    r.get::<Vec<u8>>(7)?,
                    r.get::<Vec<u8>>(8)?,
                )),
                None => None,
            })
        })
    })
    .unwrap_or_else(|e| internal(e));
    TableIterator::new(row)
}

/// The servers the context user may use whose calls take a credential: each one's mode, whether
/// a credential is stored for this user (`user_oauth`) or tenant (`tenant_secret`; always true for
/// `token_exchange`, which stores none), and its expiry. No ciphertext. No context: no rows.
#[pg_extern(stable, parallel_unsafe)]
fn upstream_connections() -> TableIterator<
    'static,
    (
        name!(server, String),
        name!(mode, String),
        name!(connected, bool),
        name!(expires_at, Option<TimestampWithTimeZone>),
    ),
> {
    let _pin = crate::owner::pin();
    let Some(ctx) = Ctx::current() else {
        return TableIterator::new(Vec::new());
    };
    let allowed = cache::catalog().allowed_servers(&ctx);
    let rows = as_owner(|| {
        Spi::connect(|c| {
            c.select(
                "SELECT s.name, s.credential_mode,
                        s.credential_mode OPERATOR(pg_catalog.=) 'token_exchange' OR cr.server IS NOT NULL,
                        cr.expires_at
                   FROM ctxguard.mcp_servers s
                   LEFT JOIN ctxguard.upstream_credentials cr
                     ON cr.server OPERATOR(pg_catalog.=) s.name
                    AND cr.tenant_id OPERATOR(pg_catalog.=) $1
                    AND cr.mode OPERATOR(pg_catalog.=) s.credential_mode
                    AND cr.user_id OPERATOR(pg_catalog.=)
                        CASE s.credential_mode WHEN 'user_oauth' THEN $2 ELSE '' END
                  WHERE s.name OPERATOR(pg_catalog.=) ANY ($3::pg_catalog.text[])
                    AND s.credential_mode OPERATOR(pg_catalog.<>) 'static'
                  ORDER BY s.name",
                None,
                &[
                    ctx.tenant_id.as_str().into(),
                    ctx.user_id.as_str().into(),
                    allowed.into(),
                ],
            )?
            .map(|r| {
                Ok((
                    r.get::<String>(1)?.unwrap_or_default(),
                    r.get::<String>(2)?.unwrap_or_default(),
                    r.get::<bool>(3)?.unwrap_or(false),
                    r.get::<TimestampWithTimeZone>(4)?,
                ))
            })
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
    })
    .unwrap_or_else(|e| internal(e));
    TableIterator::new(rows)
}

/// Gate B: has the context user a connection to `user_oauth` server `server`?
pub fn connected(ctx: &Ctx, server: &str) -> bool {
    !connections(ctx, vec![server.to_string()]).is_empty()
}

/// The `user_oauth` servers of the catalog the context user has a connection to (one statement).
pub fn connected_servers(catalog: &cache::Catalog, ctx: &Ctx) -> Vec<String> {
    let servers = catalog.user_connection_servers();
    if servers.is_empty() {
        return Vec::new();
    }
    connections(ctx, servers)
}

/// Which of `servers` the context user has a `user_oauth` connection to, in name order: one lookup
/// of the primary key (tenant_id, server, user_id) per server. By (tenant, user) alone the statement
/// read the tenant's whole range of the key: every other user's connection, on every listing.
fn connections(ctx: &Ctx, servers: Vec<String>) -> Vec<String> {
    as_owner(|| {
        Spi::connect(|c| {
            c.select(
                "SELECT cr.server FROM ctxguard.upstream_credentials cr
                  WHERE cr.tenant_id OPERATOR(pg_catalog.=) $1
                    AND cr.server OPERATOR(pg_catalog.=) ANY ($3::pg_catalog.text[])
                    AND cr.user_id OPERATOR(pg_catalog.=) $2
                    AND cr.mode OPERATOR(pg_catalog.=) 'user_oauth'
                  ORDER BY cr.server",
                None,
                &[
                    ctx.tenant_id.as_str().into(),
                    ctx.user_id.as_str().into(),
                    servers.into(),
                ],
            )?
            .map(|r| r.get::<String>(1).map(Option::unwrap_or_default))
            .collect::<Result<Vec<_>, pgrx::spi::Error>>()
        })
    })
    .unwrap_or_else(|e| internal(e))
}

/// Gate A: drop the tools of `requires_connection` servers the context user has no connection to
/// (one statement, only when such a tool is there).
pub fn hide_unconnected(
    catalog: &cache::Catalog,
    ctx: &Ctx,
    tools: &mut Vec<std::rc::Rc<cache::ToolEntry>>,
) {
    let hides = |t: &cache::ToolEntry| {
        t.server.as_deref().and_then(|s| catalog.user_connection(s)) == Some(true)
    };
    if !tools.iter().any(|t| hides(t)) {
        return;
    }
    let connected = connected_servers(catalog, ctx);
    tools.retain(|t| !hides(t) || t.server.as_ref().is_some_and(|s| connected.contains(s)));
}
