//! The authorization server's state and rules, without HTTP: one public client (the gateway),
//! authorization codes bound to PKCE S256, the client and its redirect URI (single use, one
//! minute), opaque access tokens (short-lived) and refresh tokens (rotated at each use), both of
//! one grant, and revocation (RFC 7009: revoking a refresh token ends its grant's access tokens
//! too). Everything lives in memory, each table capped (the oldest entries make room). No token
//! or code is ever logged or put in an error.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::OsRng;
use sha2::{Digest, Sha256};

/// The accounts of Demo Notes: (id, display name). Whoever opens the sign-in page picks one.
pub const USERS: &[(&str, &str)] = &[
    ("alice", "Alice"),
    ("maria", "Maria"),
    ("bob", "Bob"),
    ("carol", "Carol"),
];

/// The one scope there is.
pub const SCOPE: &str = "notes.read";

/// Most authorization codes, access tokens and refresh tokens kept (each).
pub const MAX_CODES: usize = 1024;
pub const MAX_TOKENS: usize = 4096;

pub struct Config {
    /// The issuer (RFC 8414), also the base URL of every endpoint.
    pub issuer: String,
    /// The one client (public: no secret; PKCE instead).
    pub client_id: String,
    /// Its one registered redirect URI (the gateway's `/v1/connections/callback`).
    pub redirect_uri: String,
    /// The protected resource tokens are for (the MCP endpoint's URL).
    pub resource: String,
    pub access_ttl: Duration,
    pub refresh_ttl: Duration,
    pub code_ttl: Duration,
}

/// Why a request was refused: the OAuth error code (RFC 6749 §4.1.2.1, §5.2), nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OAuthError {
    InvalidRequest,
    InvalidClient,
    InvalidGrant,
    UnsupportedGrantType,
    UnsupportedResponseType,
    InvalidScope,
    InvalidTarget,
    AccessDenied,
}

impl OAuthError {
    pub fn code(self) -> &'static str {
        match self {
            OAuthError::InvalidRequest => "invalid_request",
            OAuthError::InvalidClient => "invalid_client",
            OAuthError::InvalidGrant => "invalid_grant",
            OAuthError::UnsupportedGrantType => "unsupported_grant_type",
            OAuthError::UnsupportedResponseType => "unsupported_response_type",
            OAuthError::InvalidScope => "invalid_scope",
            OAuthError::InvalidTarget => "invalid_target",
            OAuthError::AccessDenied => "access_denied",
        }
    }
}

/// An authorization request (the query of `/authorize`, or the hidden fields of its form).
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
pub struct AuthorizeParams {
    pub response_type: Option<String>,
    pub client_id: Option<String>,
    pub redirect_uri: Option<String>,
    pub state: Option<String>,
    pub code_challenge: Option<String>,
    pub code_challenge_method: Option<String>,
    pub scope: Option<String>,
    pub resource: Option<String>,
}

/// An authorization request whose client and redirect URI are the registered ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorize {
    pub redirect_uri: String,
    pub state: Option<String>,
    pub challenge: String,
    pub scope: String,
}

/// Why `/authorize` refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorizeError {
    /// Unknown client or redirect URI: shown to the user, never redirected (RFC 6749 §4.1.2.1).
    Untrusted,
    /// Anything else: sent back to the (registered) redirect URI with the state.
    Redirect {
        redirect_uri: String,
        state: Option<String>,
        error: OAuthError,
    },
}

/// A token request (`/token`'s form).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct TokenParams {
    pub grant_type: Option<String>,
    pub code: Option<String>,
    pub code_verifier: Option<String>,
    pub redirect_uri: Option<String>,
    pub refresh_token: Option<String>,
    pub client_id: Option<String>,
    pub resource: Option<String>,
    pub scope: Option<String>,
}

/// What `/token` grants.
#[derive(Clone, PartialEq, Eq)]
pub struct Tokens {
    pub access_token: String,
    pub refresh_token: String,
    pub expires_in: u64,
    pub scope: String,
    /// Whose they are (for the log; not part of the answer).
    pub user: String,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("user", &self.user)
            .field("expires_in", &self.expires_in)
            .finish_non_exhaustive()
    }
}

struct Code {
    user: String,
    redirect_uri: String,
    challenge: String,
    scope: String,
    expires: Instant,
}

#[derive(Clone)]
struct Grant {
    user: String,
    scope: String,
    /// All the tokens of one authorization (the first code's), rotated refresh tokens included.
    id: u64,
    expires: Instant,
}

#[derive(Default)]
struct Tables {
    codes: HashMap<String, Code>,
    access: HashMap<String, Grant>,
    refresh: HashMap<String, Grant>,
    next_grant: u64,
}

pub struct Server {
    pub cfg: Config,
    tables: Mutex<Tables>,
}

/// A random URL-safe string of 32 random bytes.
pub fn random_token() -> String {
    let mut buf = [0u8; 32];
    OsRng.fill_bytes(&mut buf);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

/// RFC 7636 S256: BASE64URL(SHA256(ASCII(verifier))), no padding.
pub fn s256(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// A PKCE verifier or challenge: 43-128 characters of `[A-Za-z0-9-._~]` (RFC 7636 §4.1).
fn pkce_shaped(s: &str) -> bool {
    (43..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// Make room in `table` for one more entry: drop the expired ones, then the one expiring first.
fn make_room<V>(table: &mut HashMap<String, V>, cap: usize, expires: impl Fn(&V) -> Instant) {
    if table.len() < cap {
        return;
    }
    let now = Instant::now();
    table.retain(|_, v| expires(v) > now);
    while table.len() >= cap {
        let Some(first) = table
            .iter()
            .min_by_key(|(_, v)| expires(v))
            .map(|(k, _)| k.clone())
        else {
            break;
        };
        table.remove(&first);
    }
}

pub fn is_user(user: &str) -> bool {
    USERS.iter().any(|(id, _)| *id == user)
}

impl Server {
    pub fn new(cfg: Config) -> Server {
        Server {
            cfg,
            tables: Mutex::new(Tables::default()),
        }
    }

    fn tables(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Check an authorization request: the registered client and redirect URI, `code`, PKCE
    /// S256, a known scope, this server's resource.
    pub fn check_authorize(&self, p: &AuthorizeParams) -> Result<Authorize, AuthorizeError> {
        if p.client_id.as_deref() != Some(self.cfg.client_id.as_str())
            || p.redirect_uri.as_deref() != Some(self.cfg.redirect_uri.as_str())
        {
            return Err(AuthorizeError::Untrusted);
        }
        let state = p.state.clone().filter(|s| !s.is_empty());
        let refuse = |error| AuthorizeError::Redirect {
            redirect_uri: self.cfg.redirect_uri.clone(),
            state: state.clone(),
            error,
        };
        if state.as_ref().is_some_and(|s| s.len() > 1024) {
            return Err(refuse(OAuthError::InvalidRequest));
        }
        if p.response_type.as_deref() != Some("code") {
            return Err(refuse(OAuthError::UnsupportedResponseType));
        }
        let challenge = p.code_challenge.clone().unwrap_or_default();
        if p.code_challenge_method.as_deref() != Some("S256") || !pkce_shaped(&challenge) {
            return Err(refuse(OAuthError::InvalidRequest));
        }
        let scope = match p.scope.as_deref().map(str::trim) {
            None | Some("") => SCOPE.to_string(),
            Some(s) if s.split(' ').all(|w| w == SCOPE) => SCOPE.to_string(),
            Some(_) => return Err(refuse(OAuthError::InvalidScope)),
        };
        if p.resource.as_ref().is_some_and(|r| *r != self.cfg.resource) {
            return Err(refuse(OAuthError::InvalidTarget));
        }
        Ok(Authorize {
            redirect_uri: self.cfg.redirect_uri.clone(),
            state,
            challenge,
            scope,
        })
    }

    /// The user allowed the request: a code for them (single use, `code_ttl`).
    pub fn issue_code(&self, req: &Authorize, user: &str) -> Result<String, OAuthError> {
        if !is_user(user) {
            return Err(OAuthError::AccessDenied);
        }
        let code = random_token();
        let mut t = self.tables();
        make_room(&mut t.codes, MAX_CODES, |c| c.expires);
        t.codes.insert(
            code.clone(),
            Code {
                user: user.to_string(),
                redirect_uri: req.redirect_uri.clone(),
                challenge: req.challenge.clone(),
                scope: req.scope.clone(),
                expires: Instant::now() + self.cfg.code_ttl,
            },
        );
        Ok(code)
    }

    /// `/token`: the authorization code grant (with its PKCE verifier) or the refresh token
    /// grant (the refresh token is rotated: the one used is spent). `client_id`: from the form
    /// or HTTP Basic authentication.
    pub fn token(&self, p: &TokenParams, client_id: Option<&str>) -> Result<Tokens, OAuthError> {
        if client_id != Some(self.cfg.client_id.as_str()) {
            return Err(OAuthError::InvalidClient);
        }
        if p.resource.as_ref().is_some_and(|r| *r != self.cfg.resource) {
            return Err(OAuthError::InvalidTarget);
        }
        let now = Instant::now();
        let mut t = self.tables();
        let (user, scope, grant) = match p.grant_type.as_deref() {
            Some("authorization_code") => {
                let (Some(code), Some(verifier)) = (&p.code, &p.code_verifier) else {
                    return Err(OAuthError::InvalidRequest);
                };
                // Spent whatever happens next: a code is tried once.
                let c = t.codes.remove(code).ok_or(OAuthError::InvalidGrant)?;
                if c.expires <= now
                    || p.redirect_uri.as_deref() != Some(c.redirect_uri.as_str())
                    || !pkce_shaped(verifier)
                    || s256(verifier) != c.challenge
                {
                    return Err(OAuthError::InvalidGrant);
                }
                t.next_grant += 1;
                (c.user, c.scope, t.next_grant)
            }
            Some("refresh_token") => {
                let Some(refresh) = &p.refresh_token else {
                    return Err(OAuthError::InvalidRequest);
                };
                let g = t.refresh.remove(refresh).ok_or(OAuthError::InvalidGrant)?;
                if g.expires <= now {
                    return Err(OAuthError::InvalidGrant);
                }
                if p.scope.as_ref().is_some_and(|s| s.trim() != g.scope) {
                    return Err(OAuthError::InvalidScope);
                }
                (g.user, g.scope, g.id)
            }
            Some(_) => return Err(OAuthError::UnsupportedGrantType),
            None => return Err(OAuthError::InvalidRequest),
        };
        let access_token = random_token();
        let refresh_token = random_token();
        make_room(&mut t.access, MAX_TOKENS, |g| g.expires);
        make_room(&mut t.refresh, MAX_TOKENS, |g| g.expires);
        let grant_of = |ttl| Grant {
            user: user.clone(),
            scope: scope.clone(),
            id: grant,
            expires: now + ttl,
        };
        t.access
            .insert(access_token.clone(), grant_of(self.cfg.access_ttl));
        t.refresh
            .insert(refresh_token.clone(), grant_of(self.cfg.refresh_ttl));
        Ok(Tokens {
            access_token,
            refresh_token,
            expires_in: self.cfg.access_ttl.as_secs(),
            scope,
            user,
        })
    }

    /// RFC 7009: revoke `token` (an access or refresh token of this client). A refresh token
    /// takes every token of its grant with it. An unknown token is no error. What was revoked:
    /// `Some("refresh_token")`, `Some("access_token")` or `None`.
    pub fn revoke(
        &self,
        token: &str,
        client_id: Option<&str>,
    ) -> Result<Option<&'static str>, OAuthError> {
        if client_id != Some(self.cfg.client_id.as_str()) {
            return Err(OAuthError::InvalidClient);
        }
        let mut t = self.tables();
        if let Some(g) = t.refresh.remove(token) {
            t.access.retain(|_, a| a.id != g.id);
            t.refresh.retain(|_, r| r.id != g.id);
            return Ok(Some("refresh_token"));
        }
        Ok(t.access.remove(token).map(|_| "access_token"))
    }

    /// The user an access token was issued to, if it is one of ours and still valid.
    pub fn user_of(&self, access_token: &str) -> Option<String> {
        let t = self.tables();
        t.access
            .get(access_token)
            .filter(|g| g.expires > Instant::now())
            .map(|g| g.user.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIRECT: &str = "http://127.0.0.1:8088/v1/connections/callback";
    const RESOURCE: &str = "http://127.0.0.1:8089/mcp";

    fn server() -> Server {
        Server::new(Config {
            issuer: "http://127.0.0.1:8089".into(),
            client_id: "ctxguard-demo".into(),
            redirect_uri: REDIRECT.into(),
            resource: RESOURCE.into(),
            access_ttl: Duration::from_secs(600),
            refresh_ttl: Duration::from_secs(3600),
            code_ttl: Duration::from_secs(60),
        })
    }

    fn params(challenge: &str) -> AuthorizeParams {
        AuthorizeParams {
            response_type: Some("code".into()),
            client_id: Some("ctxguard-demo".into()),
            redirect_uri: Some(REDIRECT.into()),
            state: Some("st-1".into()),
            code_challenge: Some(challenge.into()),
            code_challenge_method: Some("S256".into()),
            scope: Some(SCOPE.into()),
            resource: Some(RESOURCE.into()),
        }
    }

    fn redeem(code: &str, verifier: &str) -> TokenParams {
        TokenParams {
            grant_type: Some("authorization_code".into()),
            code: Some(code.into()),
            code_verifier: Some(verifier.into()),
            redirect_uri: Some(REDIRECT.into()),
            resource: Some(RESOURCE.into()),
            ..TokenParams::default()
        }
    }

    fn refresh(token: &str) -> TokenParams {
        TokenParams {
            grant_type: Some("refresh_token".into()),
            refresh_token: Some(token.into()),
            resource: Some(RESOURCE.into()),
            ..TokenParams::default()
        }
    }

    /// A code for `user` and the verifier it was bound to.
    fn code_for(s: &Server, user: &str) -> (String, String) {
        let verifier = random_token();
        let req = s.check_authorize(&params(&s256(&verifier))).unwrap();
        (s.issue_code(&req, user).unwrap(), verifier)
    }

    const CLIENT: Option<&str> = Some("ctxguard-demo");

    #[test]
    fn s256_is_base64url_of_sha256_without_padding() {
        // Computed independently: `openssl dgst -sha256 -binary | base64`, URL-safe, '=' stripped.
        assert_eq!(
            s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r2wW1gFWFOEjXk"),
            "dZrJz5b___3oA5uVny1DZqEO9NM98brdg_f4AEY03Bc"
        );
    }

    #[test]
    fn the_code_needs_its_pkce_verifier_and_is_single_use() {
        let s = server();
        let (code, verifier) = code_for(&s, "alice");
        // A wrong verifier spends the code: the right one no longer works either.
        assert_eq!(
            s.token(&redeem(&code, &random_token()), CLIENT),
            Err(OAuthError::InvalidGrant)
        );
        assert_eq!(
            s.token(&redeem(&code, &verifier), CLIENT),
            Err(OAuthError::InvalidGrant)
        );
        let (code, verifier) = code_for(&s, "alice");
        let mut no_verifier = redeem(&code, &verifier);
        no_verifier.code_verifier = None;
        assert_eq!(
            s.token(&no_verifier, CLIENT),
            Err(OAuthError::InvalidRequest)
        );
        let got = s.token(&redeem(&code, &verifier), CLIENT).unwrap();
        assert_eq!(got.user, "alice");
        assert_eq!(got.expires_in, 600);
        assert_eq!(s.user_of(&got.access_token).as_deref(), Some("alice"));
        assert_eq!(
            s.user_of(&got.refresh_token),
            None,
            "a refresh token is no access token"
        );
        // Used once: a replay is refused.
        assert_eq!(
            s.token(&redeem(&code, &verifier), CLIENT),
            Err(OAuthError::InvalidGrant)
        );
    }

    #[test]
    fn pkce_s256_is_required_and_a_plain_challenge_refused() {
        let s = server();
        let verifier = random_token();
        let mut p = params(&verifier);
        p.code_challenge_method = Some("plain".into());
        assert!(matches!(
            s.check_authorize(&p),
            Err(AuthorizeError::Redirect { error: OAuthError::InvalidRequest, ref state, .. }) if state.as_deref() == Some("st-1")
        ));
        p.code_challenge_method = None;
        assert!(s.check_authorize(&p).is_err());
        let mut p = params(&s256(&verifier));
        p.code_challenge = None;
        assert!(s.check_authorize(&p).is_err());
        // The plain value as the verifier of an S256 challenge does not redeem.
        let req = s.check_authorize(&params(&s256(&verifier))).unwrap();
        let code = s.issue_code(&req, "alice").unwrap();
        assert_eq!(
            s.token(&redeem(&code, &s256(&verifier)), CLIENT),
            Err(OAuthError::InvalidGrant)
        );
    }

    #[test]
    fn another_redirect_uri_or_client_is_refused_without_redirecting() {
        let s = server();
        let challenge = s256(&random_token());
        let mut p = params(&challenge);
        p.redirect_uri = Some("http://127.0.0.1:8088/v1/connections/callback/../evil".into());
        assert_eq!(s.check_authorize(&p), Err(AuthorizeError::Untrusted));
        p.redirect_uri = None;
        assert_eq!(s.check_authorize(&p), Err(AuthorizeError::Untrusted));
        let mut p = params(&challenge);
        p.client_id = Some("someone-else".into());
        assert_eq!(s.check_authorize(&p), Err(AuthorizeError::Untrusted));
        // At the token endpoint: the code's redirect URI, and this client.
        let (code, verifier) = code_for(&s, "carol");
        let mut other = redeem(&code, &verifier);
        other.redirect_uri = Some("http://127.0.0.1:9/cb".into());
        assert_eq!(s.token(&other, CLIENT), Err(OAuthError::InvalidGrant));
        let (code, verifier) = code_for(&s, "carol");
        assert_eq!(
            s.token(&redeem(&code, &verifier), Some("someone-else")),
            Err(OAuthError::InvalidClient)
        );
        assert_eq!(
            s.token(&redeem(&code, &verifier), None),
            Err(OAuthError::InvalidClient)
        );
        // (An unauthenticated attempt does not spend the code.)
        assert_eq!(
            s.token(&redeem(&code, &verifier), CLIENT).unwrap().user,
            "carol"
        );
    }

    #[test]
    fn other_resources_scopes_response_types_and_users_are_refused() {
        let s = server();
        let challenge = s256(&random_token());
        let mut p = params(&challenge);
        p.resource = Some("http://127.0.0.1:9/mcp".into());
        assert!(matches!(
            s.check_authorize(&p),
            Err(AuthorizeError::Redirect {
                error: OAuthError::InvalidTarget,
                ..
            })
        ));
        let mut p = params(&challenge);
        p.scope = Some("notes.read notes.write".into());
        assert!(matches!(
            s.check_authorize(&p),
            Err(AuthorizeError::Redirect {
                error: OAuthError::InvalidScope,
                ..
            })
        ));
        let mut p = params(&challenge);
        p.response_type = Some("token".into());
        assert!(matches!(
            s.check_authorize(&p),
            Err(AuthorizeError::Redirect {
                error: OAuthError::UnsupportedResponseType,
                ..
            })
        ));
        let req = s.check_authorize(&params(&challenge)).unwrap();
        assert_eq!(s.issue_code(&req, "mallory"), Err(OAuthError::AccessDenied));
    }

    #[test]
    fn refresh_rotates_and_the_old_refresh_token_is_spent() {
        let s = server();
        let (code, verifier) = code_for(&s, "alice");
        let first = s.token(&redeem(&code, &verifier), CLIENT).unwrap();
        let second = s.token(&refresh(&first.refresh_token), CLIENT).unwrap();
        assert_eq!(second.user, "alice");
        assert_ne!(second.refresh_token, first.refresh_token);
        assert_ne!(second.access_token, first.access_token);
        assert_eq!(s.user_of(&second.access_token).as_deref(), Some("alice"));
        assert_eq!(
            s.token(&refresh(&first.refresh_token), CLIENT),
            Err(OAuthError::InvalidGrant),
            "a rotated refresh token is spent"
        );
        assert_eq!(
            s.token(&refresh(&second.refresh_token), Some("someone-else")),
            Err(OAuthError::InvalidClient)
        );
        let third = s.token(&refresh(&second.refresh_token), CLIENT).unwrap();
        assert_eq!(third.user, "alice");
        let mut bad = refresh(&third.refresh_token);
        bad.grant_type = Some("password".into());
        assert_eq!(s.token(&bad, CLIENT), Err(OAuthError::UnsupportedGrantType));
    }

    #[test]
    fn revoking_a_refresh_token_ends_its_grant_and_only_it() {
        let s = server();
        let (code, verifier) = code_for(&s, "alice");
        let a1 = s.token(&redeem(&code, &verifier), CLIENT).unwrap();
        let a2 = s.token(&refresh(&a1.refresh_token), CLIENT).unwrap();
        let (code, verifier) = code_for(&s, "carol");
        let c = s.token(&redeem(&code, &verifier), CLIENT).unwrap();
        assert_eq!(
            s.revoke(&a2.refresh_token, Some("x")),
            Err(OAuthError::InvalidClient)
        );
        assert_eq!(
            s.revoke(&a2.refresh_token, CLIENT),
            Ok(Some("refresh_token"))
        );
        for t in [&a1.access_token, &a2.access_token] {
            assert_eq!(s.user_of(t), None, "the grant's access tokens went with it");
        }
        assert_eq!(
            s.token(&refresh(&a2.refresh_token), CLIENT),
            Err(OAuthError::InvalidGrant)
        );
        assert_eq!(s.user_of(&c.access_token).as_deref(), Some("carol"));
        // An access token alone; an unknown or already revoked token is no error.
        assert_eq!(s.revoke(&c.access_token, CLIENT), Ok(Some("access_token")));
        assert_eq!(s.user_of(&c.access_token), None);
        assert_eq!(s.revoke(&c.access_token, CLIENT), Ok(None));
        assert_eq!(
            s.token(&refresh(&c.refresh_token), CLIENT).unwrap().user,
            "carol"
        );
    }

    #[test]
    fn expired_codes_and_tokens_do_not_work() {
        let mut s = server();
        s.cfg.code_ttl = Duration::ZERO;
        s.cfg.access_ttl = Duration::ZERO;
        let (code, verifier) = code_for(&s, "alice");
        assert_eq!(
            s.token(&redeem(&code, &verifier), CLIENT),
            Err(OAuthError::InvalidGrant)
        );
        s.cfg.code_ttl = Duration::from_secs(60);
        let (code, verifier) = code_for(&s, "alice");
        let t = s.token(&redeem(&code, &verifier), CLIENT).unwrap();
        assert_eq!(s.user_of(&t.access_token), None);
    }

    #[test]
    fn the_tables_are_capped() {
        let s = server();
        let challenge = s256(&random_token());
        let req = s.check_authorize(&params(&challenge)).unwrap();
        for _ in 0..MAX_CODES + 10 {
            s.issue_code(&req, "bob").unwrap();
        }
        assert_eq!(s.tables().codes.len(), MAX_CODES);
        for _ in 0..MAX_TOKENS + 10 {
            let (code, verifier) = code_for(&s, "bob");
            s.token(&redeem(&code, &verifier), CLIENT).unwrap();
        }
        let t = s.tables();
        assert_eq!((t.access.len(), t.refresh.len()), (MAX_TOKENS, MAX_TOKENS));
    }
}
