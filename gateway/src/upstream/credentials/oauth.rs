//! The OAuth requests of the credential modes, against the upstream's authorization server:
//! metadata discovery (RFC 9728 protected-resource metadata, then RFC 8414 / OpenID discovery),
//! PKCE (RFC 7636, S256), the authorization-code and refresh grants (OAuth 2.1), token exchange
//! (RFC 8693) and revocation (RFC 7009). Form posts with `reqwest`: no redirect is followed, every
//! answer is size-capped before it is parsed, and no error carries a token or the server's text.

use std::time::Duration;

use base64::Engine as _;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::OsRng;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Most bytes of an authorization server's answer.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Most bytes of a token the gateway accepts from an authorization server.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// A server's `credential_config` (`ctxguard.mcp_servers`): no secrets, only where and who.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeConfig {
    pub issuer: Option<String>,
    pub authorization_endpoint: Option<String>,
    pub token_endpoint: Option<String>,
    pub revocation_endpoint: Option<String>,
    pub client_id: Option<String>,
    /// The gateway variable (or `<name>_FILE`) holding the client secret, if the client has one.
    pub client_secret_env: Option<String>,
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Token exchange: the `audience` asked for (RFC 8693).
    pub audience: Option<String>,
    /// The `resource` asked for (RFC 8707); default: the server's URL.
    pub resource: Option<String>,
}

/// Where the authorization server takes requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoints {
    pub authorization: Option<String>,
    pub token: Option<String>,
    pub revocation: Option<String>,
}

/// Why an OAuth request failed. Fixed messages.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OAuthError {
    #[error("the upstream's authorization server is not configured")]
    NotConfigured,
    #[error("the upstream's authorization server could not be reached")]
    Unreachable,
    #[error("the upstream's authorization server refused the request")]
    Refused,
    #[error("the upstream's authorization server answered something unusable")]
    Malformed,
}

/// Tokens an authorization server granted.
#[derive(Clone)]
pub struct Granted {
    pub access_token: String,
    pub refresh_token: Option<String>,
    pub expires_in: Option<u64>,
}

impl std::fmt::Debug for Granted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Granted")
            .field("refresh", &self.refresh_token.is_some())
            .field("expires_in", &self.expires_in)
            .finish()
    }
}

/// A random URL-safe string of `bytes` random bytes (PKCE verifiers, states).
pub fn random_token(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    OsRng.fill_bytes(&mut buf);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

/// The S256 challenge of a PKCE verifier.
pub fn pkce_challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

pub fn http_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}

fn is_http_url(s: &str) -> bool {
    url::Url::parse(s).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
}

async fn get_json(client: &reqwest::Client, url: &str) -> Result<Value, OAuthError> {
    let resp = client
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|_| OAuthError::Unreachable)?;
    if !resp.status().is_success() {
        return Err(OAuthError::Refused);
    }
    read_json(resp).await
}

async fn read_json(resp: reqwest::Response) -> Result<Value, OAuthError> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return Err(OAuthError::Malformed);
    }
    let bytes = crate::bounded::body(resp, MAX_ANSWER_BYTES)
        .await
        .map_err(|e| match e {
            crate::bounded::BodyError::TooLarge => OAuthError::Malformed,
            _ => OAuthError::Unreachable,
        })?;
    serde_json::from_slice(&bytes).map_err(|_| OAuthError::Malformed)
}

/// The authorization server's endpoints: those configured, else discovered. The issuer is the
/// configured one, else the first `authorization_servers` entry of the server's RFC 9728
/// metadata (`/.well-known/oauth-protected-resource` plus the server URL's path); its metadata
/// is RFC 8414's (`/.well-known/oauth-authorization-server`), else OpenID discovery's.
pub async fn endpoints(
    client: &reqwest::Client,
    cfg: &ModeConfig,
    server_url: &str,
) -> Result<Endpoints, OAuthError> {
    let mut found = Endpoints {
        authorization: cfg.authorization_endpoint.clone(),
        token: cfg.token_endpoint.clone(),
        revocation: cfg.revocation_endpoint.clone(),
    };
    if found.token.is_none() || found.authorization.is_none() {
        let issuer = match &cfg.issuer {
            Some(i) => Some(i.clone()),
            None => protected_resource_issuer(client, server_url).await,
        };
        if let Some(issuer) = issuer.filter(|i| is_http_url(i)) {
            let base = issuer.trim_end_matches('/');
            let mut meta = None;
            for well_known in [
                "/.well-known/oauth-authorization-server",
                "/.well-known/openid-configuration",
            ] {
                if let Ok(m) = get_json(client, &format!("{base}{well_known}")).await {
                    meta = Some(m);
                    break;
                }
            }
            if let Some(m) = meta {
                let s = |k: &str| m[k].as_str().filter(|u| is_http_url(u)).map(str::to_string);
                found.authorization = found.authorization.or_else(|| s("authorization_endpoint"));
                found.token = found.token.or_else(|| s("token_endpoint"));
                found.revocation = found.revocation.or_else(|| s("revocation_endpoint"));
            }
        }
    }
    if found.token.is_none() {
        return Err(OAuthError::NotConfigured);
    }
    Ok(found)
}

/// RFC 9728: the first authorization server the protected resource names.
async fn protected_resource_issuer(client: &reqwest::Client, server_url: &str) -> Option<String> {
    let u = url::Url::parse(server_url).ok()?;
    let path = u.path().trim_end_matches('/');
    let origin = u.origin().ascii_serialization();
    for candidate in [
        format!("{origin}/.well-known/oauth-protected-resource{path}"),
        format!("{origin}/.well-known/oauth-protected-resource"),
    ] {
        if let Ok(m) = get_json(client, &candidate).await {
            if let Some(i) = m["authorization_servers"][0].as_str() {
                return Some(i.to_string());
            }
        }
    }
    None
}

/// The client's credentials: its id, and its secret from the gateway's environment (or file).
fn client_auth(cfg: &ModeConfig) -> Result<(String, Option<String>), OAuthError> {
    let id = cfg.client_id.clone().ok_or(OAuthError::NotConfigured)?;
    let secret = match &cfg.client_secret_env {
        Some(var) => Some(crate::secrets::token(var).map_err(|_| OAuthError::NotConfigured)?),
        None => None,
    };
    Ok((id, secret))
}

/// An `application/x-www-form-urlencoded` body.
fn form_body(form: &[(&str, String)]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in form {
        out.append_pair(k, v);
    }
    out.finish()
}

/// POST a form to the token endpoint (client authentication: `client_secret_basic` with a
/// secret, else `client_id` in the form) and read the granted tokens.
async fn token_request(
    client: &reqwest::Client,
    token_endpoint: &str,
    cfg: &ModeConfig,
    mut form: Vec<(&str, String)>,
) -> Result<Granted, OAuthError> {
    let (id, secret) = client_auth(cfg)?;
    let mut req = client
        .post(token_endpoint)
        .header("accept", "application/json");
    match secret {
        Some(secret) => req = req.basic_auth(id, Some(secret)),
        None => form.push(("client_id", id)),
    }
    let resp = req
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&form))
        .send()
        .await
        .map_err(|_| OAuthError::Unreachable)?;
    if !resp.status().is_success() {
        return Err(OAuthError::Refused);
    }
    let v = read_json(resp).await?;
    let token = |k: &str| {
        v[k].as_str()
            .filter(|t| {
                !t.is_empty()
                    && t.len() <= MAX_TOKEN_BYTES
                    && t.bytes().all(|b| b.is_ascii_graphic())
            })
            .map(str::to_string)
    };
    let access_token = token("access_token").ok_or(OAuthError::Malformed)?;
    if !v["token_type"]
        .as_str()
        .is_none_or(|t| t.eq_ignore_ascii_case("bearer") || t.eq_ignore_ascii_case("n_a"))
    {
        return Err(OAuthError::Malformed);
    }
    Ok(Granted {
        access_token,
        refresh_token: token("refresh_token"),
        expires_in: v["expires_in"].as_u64(),
    })
}

/// The authorization URL a user opens to connect (authorization code with PKCE).
pub fn authorize_url(
    authorization_endpoint: &str,
    cfg: &ModeConfig,
    redirect_uri: &str,
    state: &str,
    challenge: &str,
    resource: &str,
) -> Result<String, OAuthError> {
    let mut u = url::Url::parse(authorization_endpoint).map_err(|_| OAuthError::NotConfigured)?;
    let client_id = cfg.client_id.clone().ok_or(OAuthError::NotConfigured)?;
    {
        let mut q = u.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", &client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("state", state)
            .append_pair("code_challenge", challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("resource", resource);
        if !cfg.scopes.is_empty() {
            q.append_pair("scope", &cfg.scopes.join(" "));
        }
    }
    Ok(u.into())
}

pub async fn redeem_code(
    client: &reqwest::Client,
    token_endpoint: &str,
    cfg: &ModeConfig,
    code: &str,
    verifier: &str,
    redirect_uri: &str,
    resource: &str,
) -> Result<Granted, OAuthError> {
    token_request(
        client,
        token_endpoint,
        cfg,
        vec![
            ("grant_type", "authorization_code".into()),
            ("code", code.into()),
            ("code_verifier", verifier.into()),
            ("redirect_uri", redirect_uri.into()),
            ("resource", resource.into()),
        ],
    )
    .await
}

pub async fn refresh(
    client: &reqwest::Client,
    token_endpoint: &str,
    cfg: &ModeConfig,
    refresh_token: &str,
    resource: &str,
) -> Result<Granted, OAuthError> {
    token_request(
        client,
        token_endpoint,
        cfg,
        vec![
            ("grant_type", "refresh_token".into()),
            ("refresh_token", refresh_token.into()),
            ("resource", resource.into()),
        ],
    )
    .await
}

/// RFC 8693: the user's verified token for one the upstream accepts (`audience`, `resource`).
pub async fn exchange(
    client: &reqwest::Client,
    token_endpoint: &str,
    cfg: &ModeConfig,
    subject_token: &str,
    resource: &str,
) -> Result<Granted, OAuthError> {
    let mut form = vec![
        (
            "grant_type",
            "urn:ietf:params:oauth:grant-type:token-exchange".to_string(),
        ),
        ("subject_token", subject_token.to_string()),
        (
            "subject_token_type",
            "urn:ietf:params:oauth:token-type:access_token".to_string(),
        ),
        (
            "requested_token_type",
            "urn:ietf:params:oauth:token-type:access_token".to_string(),
        ),
        ("resource", resource.to_string()),
    ];
    if let Some(a) = &cfg.audience {
        form.push(("audience", a.clone()));
    }
    if !cfg.scopes.is_empty() {
        form.push(("scope", cfg.scopes.join(" ")));
    }
    token_request(client, token_endpoint, cfg, form).await
}

/// RFC 7009: revoke a token (best effort; the stored credential is deleted either way).
pub async fn revoke(
    client: &reqwest::Client,
    revocation_endpoint: &str,
    cfg: &ModeConfig,
    token: &str,
    hint: &str,
) -> Result<(), OAuthError> {
    let (id, secret) = client_auth(cfg)?;
    let mut form = vec![
        ("token", token.to_string()),
        ("token_type_hint", hint.to_string()),
    ];
    let mut req = client.post(revocation_endpoint);
    match secret {
        Some(secret) => req = req.basic_auth(id, Some(secret)),
        None => form.push(("client_id", id)),
    }
    let resp = req
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&form))
        .send()
        .await
        .map_err(|_| OAuthError::Unreachable)?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(OAuthError::Refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_s256_is_base64url_of_sha256_without_padding() {
        // Computed independently: Python's hashlib.sha256 and base64.urlsafe_b64encode, '=' stripped.
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r2wW1gFWFOEjXk"),
            "dZrJz5b___3oA5uVny1DZqEO9NM98brdg_f4AEY03Bc"
        );
        let a = random_token(32);
        assert_eq!(a.len(), 43);
        assert_ne!(a, random_token(32));
    }

    #[test]
    fn the_authorize_url_carries_pkce_state_and_resource() {
        let cfg = ModeConfig {
            client_id: Some("ctxguard".into()),
            scopes: vec!["openid".into(), "files".into()],
            ..ModeConfig::default()
        };
        let u = authorize_url(
            "https://as.example/auth?x=1",
            &cfg,
            "https://gw.example/v1/connections/callback",
            "st",
            "ch",
            "https://drive.example/mcp",
        )
        .unwrap();
        let parsed = url::Url::parse(&u).unwrap();
        let q: std::collections::HashMap<_, _> = parsed.query_pairs().into_owned().collect();
        assert_eq!(q["x"], "1");
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["state"], "st");
        assert_eq!(q["scope"], "openid files");
        assert_eq!(q["resource"], "https://drive.example/mcp");
        assert!(authorize_url("https://as", &ModeConfig::default(), "r", "s", "c", "x").is_err());
    }

    #[test]
    fn a_config_with_an_unknown_key_is_refused() {
        assert!(
            serde_json::from_value::<ModeConfig>(serde_json::json!({"client_secret": "x"}))
                .is_err()
        );
        let c: ModeConfig =
            serde_json::from_value(serde_json::json!({"client_id": "a", "scopes": ["s"]})).unwrap();
        assert_eq!(c.scopes, ["s"]);
    }
}
