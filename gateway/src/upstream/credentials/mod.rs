//! Upstream credentials (issue 33): which credential an upstream MCP call carries, chosen by the
//! verified context, never by the model or by arguments.
//!
//! | mode | what the upstream sees | stored |
//! |---|---|---|
//! | `static` | the server's one token from the gateway's environment (`bearer_token_env`) | nothing |
//! | `tenant_secret` | the caller's tenant's secret, set by its tenant admin | sealed, per tenant |
//! | `user_oauth` | the caller's own OAuth access token (code + PKCE), refreshed before expiry | sealed, per user |
//! | `token_exchange` | a token the upstream's AS exchanged for the caller's verified token (RFC 8693) | in memory, until shortly before it expires |
//!
//! A call's credential comes from `ctxguard.upstream_credential(call_id)`: the database answers only
//! for a call Gate B authorized for the context's own user, and only that user's (or tenant's) row;
//! the gateway opens it with the key only it holds ([`seal`]), bound to the context's tenant, user,
//! server and mode. Per-user calls use per-credential connections ([`crate::upstream`]). A missing,
//! revoked or unrefreshable connection answers `CONNECTION_REQUIRED`; the connect URL (an
//! authorization request whose `state` is bound to the user and server, single use, 10 minutes)
//! goes to the user's client (the chat stream's `connection_required` event, an MCP URL
//! elicitation), never into the model's messages. No credential is logged, audited, returned or
//! put in an error.

pub mod mcp;
pub mod oauth;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::config::public_url::PublicUrl;
use crate::db::Db;
use crate::db::Scope;
use crate::db::ServerConfig;
use crate::pages::View;
use crate::seal::{self, Binding, KeyRing, SealError};
use crate::upstream::Upstreams;
use oauth::{Endpoints, ModeConfig, OAuthError};

/// How long a connect request (`state`) stays valid.
const CONNECT_TTL: Duration = Duration::from_secs(600);
/// Most connect requests pending at once (oldest dropped).
const MAX_PENDING: usize = 4096;
/// Most exchanged tokens kept.
const MAX_EXCHANGED: usize = 4096;
/// A token is refreshed (or exchanged again) this long before it expires.
const EXPIRY_MARGIN: Duration = Duration::from_secs(60);

/// What an upstream call carries.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// The server's static configuration (`bearer_token_env`, headers).
    Static,
    /// This bearer token; `owner` names whose it is (tenant, user) for the connection pool.
    Bearer { token: String, owner: [u8; 32] },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Static => f.write_str("Static"),
            Auth::Bearer { .. } => f.write_str("Bearer(..)"),
        }
    }
}

/// Why a call has no credential. Fixed messages, safe for the model and the audit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredError {
    #[error("this tool's server needs the user's own connection: connect, then retry")]
    ConnectionRequired,
    #[error("the tenant's admin has not set a secret for this tool's server")]
    NoTenantSecret,
    #[error("the upstream's authorization server refused the token exchange")]
    ExchangeRefused,
    #[error("the upstream credential is unavailable")]
    Unavailable,
}

/// A connect request awaiting its callback.
struct Pending {
    server: String,
    tenant: String,
    user: String,
    /// The user's token and page, to store the connection under the verified context.
    token: String,
    page: Value,
    verifier: String,
    redirect_uri: String,
    resource: String,
    token_endpoint: String,
    created: Instant,
}

/// What the credential modes use of the gateway's services (`services.rs`, which
/// lends them for one call): this room may not reach above itself for them.
pub struct Deps<'a> {
    pub db: &'a Db,
    pub upstreams: &'a Upstreams,
    pub credentials: &'a Credentials,
    pub public: &'a PublicUrl,
}

pub struct Credentials {
    pub keys: KeyRing,
    client: reqwest::Client,
    pending: Mutex<HashMap<String, Pending>>,
    exchanged: Mutex<HashMap<[u8; 32], (String, Instant)>>,
}

impl Credentials {
    pub fn new(keys: KeyRing, timeout: Duration) -> Credentials {
        Credentials {
            keys,
            client: oauth::http_client(timeout),
            pending: Mutex::new(HashMap::new()),
            exchanged: Mutex::new(HashMap::new()),
        }
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

/// Whose a credential is, as a pool key: (tenant, user, server, mode) hashed.
fn owner_key(tenant: &str, user: &str, server: &str, mode: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [tenant, user, server, mode] {
        h.update((part.len() as u32).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn identity(context: &Value) -> Option<(String, String)> {
    Some((
        context["tenantId"].as_str()?.to_string(),
        context["userId"].as_str()?.to_string(),
    ))
}

pub fn mode_config(cfg: &ServerConfig) -> Result<ModeConfig, CredError> {
    serde_json::from_value(cfg.credential_config.clone()).map_err(|_| {
        tracing::warn!(server = %cfg.name, "the server's credential_config is not valid: its calls fail");
        CredError::Unavailable
    })
}

/// The resource (RFC 8707) a token is asked for: the configured one, else the server's URL.
fn resource(cfg: &ServerConfig, mode: &ModeConfig) -> String {
    mode.resource
        .clone()
        .or_else(|| cfg.url.clone())
        .unwrap_or_default()
}

/// The credential of authorized upstream call `call_id` to server `cfg`.
pub async fn for_call(
    state: &Deps<'_>,
    view: &mut View,
    cfg: &ServerConfig,
    call_id: Uuid,
) -> Result<Auth, CredError> {
    let mode = cfg.credential_mode.as_str();
    if mode == "static" {
        return Ok(Auth::Static);
    }
    let creds = &state.credentials;
    let db = &state.db;
    let (context, row) = view
        .run(db, |s| async move { db.upstream_credential(&s, call_id).await })
        .await
        .map_err(|e| {
            tracing::warn!(server = %cfg.name, code = e.code(), "could not read the upstream credential");
            CredError::Unavailable
        })?;
    let (tenant, user) = identity(&context).ok_or(CredError::Unavailable)?;
    let owner = owner_key(&tenant, &user, &cfg.name, mode);
    match mode {
        "tenant_secret" => {
            let row = row.filter(|r| r.mode == mode && r.server == cfg.name);
            let row = row.ok_or(CredError::NoTenantSecret)?;
            let binding = Binding {
                tenant: &tenant,
                user: "",
                server: &cfg.name,
                mode,
                field: "access",
            };
            let token = open(&creds.keys, &row.access, binding, &cfg.name)?;
            Ok(Auth::Bearer { token, owner })
        }
        "user_oauth" => {
            let row = row.filter(|r| r.mode == mode && r.server == cfg.name);
            let row = row.ok_or(CredError::ConnectionRequired)?;
            let access = Binding {
                tenant: &tenant,
                user: &user,
                server: &cfg.name,
                mode,
                field: "access",
            };
            let fresh = row
                .expires_at
                .is_none_or(|t| t - EXPIRY_MARGIN.as_secs_f64() > now_secs());
            if fresh {
                let token = open(&creds.keys, &row.access, access, &cfg.name)
                    .map_err(|_| CredError::ConnectionRequired)?;
                return Ok(Auth::Bearer { token, owner });
            }
            // Expired or about to: refresh, or the user connects again.
            let refreshed = refresh(state, view, cfg, &tenant, &user, row.refresh.as_ref()).await;
            match refreshed {
                Ok(token) => Ok(Auth::Bearer { token, owner }),
                Err(e) => {
                    tracing::info!(server = %cfg.name, error = %e, "upstream connection could not be refreshed: the user must connect again");
                    let db = &state.db;
                    let server = cfg.name.as_str();
                    let _ = view
                        .run(db, |s| async move {
                            db.delete_upstream_credential(&s, server).await
                        })
                        .await;
                    Err(CredError::ConnectionRequired)
                }
            }
        }
        "token_exchange" => {
            if let Some(token) = cached_exchange(creds, &owner) {
                return Ok(Auth::Bearer { token, owner });
            }
            let mode_cfg = mode_config(cfg)?;
            let ep = oauth::endpoints(
                &creds.client,
                &mode_cfg,
                cfg.url.as_deref().unwrap_or_default(),
            )
            .await
            .map_err(|e| {
                tracing::warn!(server = %cfg.name, error = %e, "token exchange: no token endpoint");
                CredError::Unavailable
            })?;
            let subject = view.scope.token.clone();
            let granted = oauth::exchange(
                &creds.client,
                ep.token.as_deref().unwrap_or_default(),
                &mode_cfg,
                &subject,
                &resource(cfg, &mode_cfg),
            )
            .await
            .map_err(|e| {
                tracing::info!(server = %cfg.name, error = %e, "token exchange failed: the call is refused");
                CredError::ExchangeRefused
            })?;
            let lifetime = Duration::from_secs(granted.expires_in.unwrap_or(300));
            if lifetime > EXPIRY_MARGIN {
                let mut cache = creds.exchanged.lock().unwrap_or_else(|p| p.into_inner());
                if cache.len() >= MAX_EXCHANGED {
                    let now = Instant::now();
                    cache.retain(|_, (_, until)| *until > now);
                    if cache.len() >= MAX_EXCHANGED {
                        cache.clear();
                    }
                }
                cache.insert(
                    owner,
                    (
                        granted.access_token.clone(),
                        Instant::now() + lifetime - EXPIRY_MARGIN,
                    ),
                );
            }
            Ok(Auth::Bearer {
                token: granted.access_token,
                owner,
            })
        }
        _ => Err(CredError::Unavailable),
    }
}

fn cached_exchange(creds: &Credentials, owner: &[u8; 32]) -> Option<String> {
    let cache = creds.exchanged.lock().unwrap_or_else(|p| p.into_inner());
    cache
        .get(owner)
        .filter(|(_, until)| *until > Instant::now())
        .map(|(t, _)| t.clone())
}

fn open(
    keys: &KeyRing,
    sealed: &seal::Sealed,
    binding: Binding<'_>,
    server: &str,
) -> Result<String, CredError> {
    keys.open(sealed, binding).map_err(|e| {
        tracing::warn!(server, error = %e, "a stored upstream credential does not open");
        match e {
            SealError::NoKey | SealError::UnknownKey => CredError::Unavailable,
            _ => CredError::ConnectionRequired,
        }
    })
}

/// Refresh a user's connection and store the new tokens; the new access token.
async fn refresh(
    state: &Deps<'_>,
    view: &mut View,
    cfg: &ServerConfig,
    tenant: &str,
    user: &str,
    sealed_refresh: Option<&seal::Sealed>,
) -> Result<String, OAuthError> {
    let creds = &state.credentials;
    let sealed_refresh = sealed_refresh.ok_or(OAuthError::Refused)?;
    let binding = |field| Binding {
        tenant,
        user,
        server: &cfg.name,
        mode: "user_oauth",
        field,
    };
    let refresh_token = creds
        .keys
        .open(sealed_refresh, binding("refresh"))
        .map_err(|_| OAuthError::Refused)?;
    let mode_cfg = mode_config(cfg).map_err(|_| OAuthError::NotConfigured)?;
    let ep = oauth::endpoints(
        &creds.client,
        &mode_cfg,
        cfg.url.as_deref().unwrap_or_default(),
    )
    .await?;
    let granted = oauth::refresh(
        &creds.client,
        ep.token.as_deref().unwrap_or_default(),
        &mode_cfg,
        &refresh_token,
        &resource(cfg, &mode_cfg),
    )
    .await?;
    let new_refresh = granted.refresh_token.as_deref().unwrap_or(&refresh_token);
    store(
        state,
        view,
        cfg,
        tenant,
        user,
        &granted.access_token,
        granted.expires_in,
        Some(new_refresh),
    )
    .await
    .map_err(|_| OAuthError::Malformed)?;
    Ok(granted.access_token)
}

/// Seal and store a user's connection under the view's verified context.
#[expect(clippy::too_many_arguments, reason = "the parts of one connection")]
async fn store(
    state: &Deps<'_>,
    view: &mut View,
    cfg: &ServerConfig,
    tenant: &str,
    user: &str,
    access_token: &str,
    expires_in: Option<u64>,
    refresh_token: Option<&str>,
) -> Result<(), CredError> {
    let keys = &state.credentials.keys;
    let binding = |field| Binding {
        tenant,
        user,
        server: &cfg.name,
        mode: "user_oauth",
        field,
    };
    let access = keys
        .seal(access_token, binding("access"))
        .map_err(|_| CredError::Unavailable)?;
    let refresh = refresh_token
        .map(|r| keys.seal(r, binding("refresh")))
        .transpose()
        .map_err(|_| CredError::Unavailable)?;
    let expires_at = expires_in.map(|s| now_secs() + s as f64);
    let db = &state.db;
    let server = cfg.name.as_str();
    let (access, refresh) = (&access, refresh.as_ref());
    view.run(db, |s| async move {
        db.put_upstream_credential(&s, server, access, expires_at, refresh)
            .await
    })
    .await
    .map_err(|e| {
        tracing::warn!(
            server,
            code = e.code(),
            "could not store the upstream connection"
        );
        CredError::Unavailable
    })?;
    Ok(())
}

/// The authorization URL for the scope's user to connect `server` (a `user_oauth` server): a
/// connect request bound to the user (as the database verified them) and the server, single use,
/// valid for 10 minutes.
pub async fn connect_url(
    state: &Deps<'_>,
    scope: &Scope,
    cfg: &ServerConfig,
) -> Result<String, CredError> {
    if cfg.credential_mode != "user_oauth" {
        return Err(CredError::Unavailable);
    }
    let creds = &state.credentials;
    if !creds.keys.is_configured() {
        return Err(CredError::Unavailable);
    }
    let identity = state
        .db
        .verify_token(&scope.token)
        .await
        .map_err(|_| CredError::Unavailable)?;
    let (tenant, user) = identity_of(&identity).ok_or(CredError::Unavailable)?;
    let mode_cfg = mode_config(cfg)?;
    let ep: Endpoints = oauth::endpoints(&creds.client, &mode_cfg, cfg.url.as_deref().unwrap_or_default())
        .await
        .map_err(|e| {
            tracing::warn!(server = %cfg.name, error = %e, "no authorization server for the connection");
            CredError::Unavailable
        })?;
    let authorization = ep.authorization.ok_or(CredError::Unavailable)?;
    let token_endpoint = ep.token.ok_or(CredError::Unavailable)?;
    let verifier = oauth::random_token(32);
    let state_id = oauth::random_token(32);
    let redirect_uri = state.public.url("/v1/connections/callback");
    let resource = resource(cfg, &mode_cfg);
    let url = oauth::authorize_url(
        &authorization,
        &mode_cfg,
        &redirect_uri,
        &state_id,
        &oauth::pkce_challenge(&verifier),
        &resource,
    )
    .map_err(|_| CredError::Unavailable)?;
    let mut pending = creds.pending.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    pending.retain(|_, p| now.duration_since(p.created) < CONNECT_TTL);
    if pending.len() >= MAX_PENDING {
        if let Some(oldest) = pending
            .iter()
            .min_by_key(|(_, p)| p.created)
            .map(|(k, _)| k.clone())
        {
            pending.remove(&oldest);
        }
    }
    pending.insert(
        state_id,
        Pending {
            server: cfg.name.clone(),
            tenant,
            user,
            token: scope.token.clone(),
            page: scope.page.clone(),
            verifier,
            redirect_uri,
            resource,
            token_endpoint,
            created: now,
        },
    );
    Ok(url)
}

fn identity_of(v: &Value) -> Option<(String, String)> {
    identity(v).or_else(|| {
        Some((
            v["tenant_id"].as_str()?.to_string(),
            v["user_id"].as_str()?.to_string(),
        ))
    })
}

/// The callback of a connect request: redeem the code (PKCE) and store the connection under the
/// verified context of the user who asked. The request is used up whatever happens.
pub async fn complete_connection(
    state: &Deps<'_>,
    state_id: &str,
    code: &str,
) -> Result<String, CredError> {
    let pending = {
        let mut pending = state
            .credentials
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        pending.remove(state_id)
    };
    let p = pending
        .filter(|p| p.created.elapsed() < CONNECT_TTL)
        .ok_or(CredError::Unavailable)?;
    let cfg = state
        .upstreams
        .config(state.db, &p.server)
        .await
        .filter(|c| c.credential_mode == "user_oauth")
        .ok_or(CredError::Unavailable)?;
    let mode_cfg = mode_config(&cfg)?;
    let creds = &state.credentials;
    let granted = oauth::redeem_code(
        &creds.client,
        &p.token_endpoint,
        &mode_cfg,
        code,
        &p.verifier,
        &p.redirect_uri,
        &p.resource,
    )
    .await
    .map_err(|e| {
        tracing::info!(server = %p.server, error = %e, "the authorization code was not redeemed");
        CredError::Unavailable
    })?;
    let scope = Scope {
        token: p.token.clone(),
        page: p.page.clone(),
        generation: None,
        trace_id: Uuid::new_v4().to_string(),
    };
    let mut view = View::without(scope);
    store(
        state,
        &mut view,
        &cfg,
        &p.tenant,
        &p.user,
        &granted.access_token,
        granted.expires_in,
        granted.refresh_token.as_deref(),
    )
    .await?;
    // Its tools, recorded through the discovery role as the first connection lists them.
    state
        .upstreams
        .prime(
            &cfg,
            &Auth::Bearer {
                token: granted.access_token,
                owner: owner_key(&p.tenant, &p.user, &cfg.name, "user_oauth"),
            },
        )
        .await;
    Ok(p.server)
}

/// Disconnect the scope's user from `server`: delete the stored connection and revoke its tokens
/// at the authorization server (best effort). Whether there was one.
pub async fn disconnect(
    state: &Deps<'_>,
    scope: &Scope,
    server: &str,
) -> Result<bool, crate::error::ApiError> {
    let (context, deleted) = state.db.delete_upstream_credential(scope, server).await?;
    let Some(deleted) = deleted else {
        return Ok(false);
    };
    state.upstreams.forget(server).await;
    let (Some((tenant, user)), Some(cfg)) = (
        identity(&context),
        state.upstreams.config(state.db, server).await,
    ) else {
        return Ok(true);
    };
    let Ok(mode_cfg) = mode_config(&cfg) else {
        return Ok(true);
    };
    let creds = &state.credentials;
    let Ok(ep) = oauth::endpoints(
        &creds.client,
        &mode_cfg,
        cfg.url.as_deref().unwrap_or_default(),
    )
    .await
    else {
        return Ok(true);
    };
    let Some(revocation) = ep.revocation else {
        return Ok(true);
    };
    let binding = |field| Binding {
        tenant: &tenant,
        user: &user,
        server,
        mode: "user_oauth",
        field,
    };
    let tokens = [
        (deleted.refresh.as_ref(), "refresh", "refresh_token"),
        (Some(&deleted.access), "access", "access_token"),
    ];
    for (sealed, field, hint) in tokens {
        let Some(token) = sealed.and_then(|s| creds.keys.open(s, binding(field)).ok()) else {
            continue;
        };
        // The refresh token first (RFC 7009: its grant's access tokens go with it); the access
        // token only when there is no refresh token or it could not be revoked.
        match oauth::revoke(&creds.client, &revocation, &mode_cfg, &token, hint).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(server, error = %e, hint, "could not revoke an upstream token (deleted here)")
            }
        }
    }
    Ok(true)
}

/// Set the scope's tenant's secret for `server` (its tenant admin; the database checks).
pub async fn set_tenant_secret(
    state: &Deps<'_>,
    scope: &Scope,
    server: &str,
    secret: &str,
) -> Result<Value, crate::error::ApiError> {
    use crate::error::ApiError;
    if !state.credentials.keys.is_configured() {
        return Err(ApiError::Unprocessable(
            "upstream secrets need CTXGUARD_CREDENTIAL_KEY_FILE".into(),
        ));
    }
    let identity = state.db.verify_token(&scope.token).await?;
    let (tenant, _) = identity_of(&identity)
        .ok_or_else(|| ApiError::Unauthorized("no verified identity".into()))?;
    let sealed = state
        .credentials
        .keys
        .seal(
            secret,
            Binding {
                tenant: &tenant,
                user: "",
                server,
                mode: "tenant_secret",
                field: "access",
            },
        )
        .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
    let out = state.db.put_tenant_secret(scope, server, &sealed).await?;
    state.upstreams.forget(server).await;
    Ok(out)
}

/// A Gate B or credential refusal of code `CONNECTION_REQUIRED`: the server it names.
pub fn connection_required(envelope: &Value) -> Option<&str> {
    (envelope["error"]["code"] == "CONNECTION_REQUIRED")
        .then(|| envelope["error"]["details"]["server"].as_str())
        .flatten()
}

/// The envelope of a call refused for want of a credential (the call was completed as failed).
pub fn refusal(e: &CredError, call_id: Uuid, server: &str) -> Value {
    let code = match e {
        CredError::ConnectionRequired => "CONNECTION_REQUIRED",
        _ => "TOOL_ERROR",
    };
    let mut error = json!({"code": code, "message": e.to_string()});
    if *e == CredError::ConnectionRequired {
        error["details"] = json!({"server": server});
    }
    json!({"status": "error", "error": error, "call_id": call_id.to_string()})
}

/// For the user's client (never the model): what to open to connect, if the envelope is a
/// `CONNECTION_REQUIRED` refusal of a server that can be connected.
pub async fn connect_hint(state: &Deps<'_>, scope: &Scope, envelope: &Value) -> Option<Value> {
    let server = connection_required(envelope)?;
    let cfg = state.upstreams.config(state.db, server).await?;
    let url = connect_url(state, scope, &cfg).await.ok();
    Some(json!({"server": server, "connectUrl": url}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_differ_by_every_part() {
        let a = owner_key("acme", "alice", "drive", "user_oauth");
        assert_ne!(a, owner_key("acme", "bob", "drive", "user_oauth"));
        assert_ne!(a, owner_key("globex", "alice", "drive", "user_oauth"));
        assert_ne!(a, owner_key("acme", "alice", "vault", "user_oauth"));
        assert_ne!(a, owner_key("acmealice", "", "drive", "user_oauth"));
        assert_ne!(a, owner_key("acme", "alice", "drive", "token_exchange"));
    }

    #[test]
    fn refusals_name_the_server_and_no_credential() {
        let id = Uuid::nil();
        let r = refusal(&CredError::ConnectionRequired, id, "drive");
        assert_eq!(connection_required(&r), Some("drive"));
        let r = refusal(&CredError::ExchangeRefused, id, "fed");
        assert_eq!(r["error"]["code"], "TOOL_ERROR");
        assert_eq!(connection_required(&r), None);
        assert_eq!(
            format!(
                "{:?}",
                Auth::Bearer {
                    token: "secret".into(),
                    owner: [0; 32]
                }
            ),
            "Bearer(..)"
        );
    }
}
