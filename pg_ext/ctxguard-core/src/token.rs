//! JWT verification for `ctxguard.set_context`.
//!
//! Accepted algorithms are chosen by the configured keys, never by the token: HS256 only with the
//! shared secret; RS256/384/512, PS256/384/512, ES256, ES384 and EdDSA only with a key of the
//! configured JWKS ([`crate::jwks`]) that fits the algorithm (chosen by `kid`), and EdDSA also with
//! the single configured Ed25519 key. `alg: none`, other algorithms, a key that does not fit the
//! algorithm (HS/RSA or HS/EdDSA confusion), keys named or carried by the token itself (`jku`,
//! `x5u`, `x5c`, `jwk`) and any `crit` are refused before any signature work, and so is a header
//! or a claims set that repeats a member at any depth ([`crate::json`]: libraries disagree on
//! which of two `tenant_id`s counts). Where the tenant and roles are in the claims is configured
//! ([`crate::claims`]).

use std::collections::HashSet;

use jsonwebtoken::{decode, decode_header, errors::ErrorKind, Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::claims::ClaimPath;
use crate::json::{self, JsonError};
use crate::jwks::KeySet;
use crate::names::{is_valid_id, is_valid_label};

/// Tokens longer than this are rejected unparsed.
pub const MAX_TOKEN_LEN: usize = 8192;
/// HS256 secrets shorter than this are treated as not configured.
pub const MIN_SECRET_LEN: usize = 32;
/// At most this many roles per token.
pub const MAX_ROLES: usize = 32;
/// Default claim paths.
pub const DEFAULT_CLAIM_TENANT: &str = "tenant_id";
pub const DEFAULT_CLAIM_ROLES: &str = "roles";

/// Header members that name or carry a key: keys are never fetched or taken from the token.
const KEY_HEADERS: [&str; 4] = ["jku", "x5u", "x5c", "jwk"];

/// The JWKS as configured: none, a document that failed to parse (tokens needing it are refused),
/// or its keys.
#[derive(Debug, Default, Clone, Copy)]
pub enum Jwks<'a> {
    #[default]
    Unset,
    Invalid,
    Set(&'a KeySet),
}

/// Verification keys and options, read from the superuser-only `ctxguard.jwt_*` settings.
#[derive(Debug, Default, Clone)]
pub struct KeyConfig<'a> {
    pub hs256_secret: Option<&'a str>,
    /// PEM (`-----BEGIN PUBLIC KEY-----`) or the base64url raw 32-byte key (JWK `x`).
    pub ed25519_public_key: Option<&'a str>,
    /// Keys from `ctxguard.jwks_file` / `ctxguard.jwks`.
    pub jwks: Jwks<'a>,
    /// When set, `iss` must be present and equal to it.
    pub issuer: Option<&'a str>,
    /// When set: a list (comma or white space separated); `aud` (a string or an array) must
    /// contain one of them.
    pub audience: Option<&'a str>,
    /// Claim paths of the tenant and the roles (None: the defaults).
    pub claim_tenant: Option<&'a str>,
    pub claim_roles: Option<&'a str>,
    pub leeway_secs: u64,
}

/// Who is calling, from a verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user_id: String,
    pub tenant_id: String,
    pub roles: Vec<String>,
}

/// Why a token was refused. Messages name the rule, never token contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is malformed")]
    Malformed,
    #[error("token algorithm is not accepted")]
    AlgorithmNotAccepted,
    #[error("no verification key is configured for this algorithm")]
    NoKey,
    #[error("configured verification key is invalid")]
    InvalidKey,
    #[error("token signature is invalid")]
    BadSignature,
    #[error("token has expired")]
    Expired,
    #[error("token is not yet valid")]
    NotYetValid,
    #[error("token audience is not accepted")]
    WrongAudience,
    #[error("token issuer is not accepted")]
    WrongIssuer,
    #[error("token claim {0} is missing or invalid")]
    BadClaim(&'static str),
    #[error("token header names critical extensions, none of which are understood")]
    CriticalHeader,
    #[error("token header names or carries a key (jku, x5u, x5c, jwk), which is never used")]
    KeyInHeader,
    #[error("token key id (kid) names no configured key")]
    UnknownKey,
    #[error("configured claim path (ctxguard.claim_tenant or ctxguard.claim_roles) is invalid")]
    BadClaimPath,
    #[error("token header or claims repeat a member")]
    DuplicateMember,
}

impl TokenError {
    /// Stable short code for logs.
    pub fn code(&self) -> &'static str {
        match self {
            TokenError::Malformed => "malformed",
            TokenError::AlgorithmNotAccepted => "algorithm",
            TokenError::NoKey => "no_key",
            TokenError::InvalidKey => "invalid_key",
            TokenError::BadSignature => "signature",
            TokenError::Expired => "expired",
            TokenError::NotYetValid => "not_yet_valid",
            TokenError::WrongAudience => "audience",
            TokenError::WrongIssuer => "issuer",
            TokenError::BadClaim(_) => "claim",
            TokenError::CriticalHeader => "crit",
            TokenError::KeyInHeader => "key_in_header",
            TokenError::UnknownKey => "unknown_kid",
            TokenError::BadClaimPath => "claim_path",
            TokenError::DuplicateMember => "duplicate_member",
        }
    }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

fn ed25519_key(configured: &str) -> Result<DecodingKey, TokenError> {
    let k = configured.trim();
    if k.starts_with("-----BEGIN") {
        DecodingKey::from_ed_pem(k.as_bytes()).map_err(|_| TokenError::InvalidKey)
    } else {
        DecodingKey::from_ed_components(k).map_err(|_| TokenError::InvalidKey)
    }
}

/// A list setting: values separated by commas and/or white space.
pub fn list_setting(s: &str) -> Vec<&str> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The keys to try for a token with this `alg` and `kid`, in order.
fn candidate_keys(
    alg: Algorithm,
    kid: Option<&str>,
    keys: &KeyConfig<'_>,
) -> Result<Vec<DecodingKey>, TokenError> {
    match alg {
        Algorithm::HS256 => {
            let secret = non_empty(keys.hs256_secret).ok_or(TokenError::NoKey)?;
            if secret.len() < MIN_SECRET_LEN {
                return Err(TokenError::InvalidKey);
            }
            return Ok(vec![DecodingKey::from_secret(secret.as_bytes())]);
        }
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512
        | Algorithm::ES256
        | Algorithm::ES384
        | Algorithm::EdDSA => {}
        _ => return Err(TokenError::AlgorithmNotAccepted),
    }
    let mut out = Vec::new();
    let mut named = false;
    if let Jwks::Set(set) = keys.jwks {
        for k in set.with_kid(kid) {
            named = true;
            if k.fits(alg) {
                out.push(k.decoding.clone());
            }
        }
    }
    // The single Ed25519 key has no kid: it is tried for every EdDSA token.
    let legacy = match (alg, non_empty(keys.ed25519_public_key)) {
        (Algorithm::EdDSA, Some(k)) => Some(ed25519_key(k)),
        _ => None,
    };
    if let Some(legacy) = legacy {
        match legacy {
            Ok(k) => out.push(k),
            Err(e) if out.is_empty() => return Err(e),
            Err(_) => {}
        }
    }
    if !out.is_empty() {
        return Ok(out);
    }
    Err(match (keys.jwks, kid) {
        // A key of that kid exists, but not for this algorithm: algorithm confusion.
        (Jwks::Set(_), _) if named && kid.is_some() => TokenError::AlgorithmNotAccepted,
        (Jwks::Set(_), Some(_)) => TokenError::UnknownKey,
        (Jwks::Invalid, _) => TokenError::InvalidKey,
        _ => TokenError::NoKey,
    })
}

/// A verified token: its identity, and the time during which the same token, under the same
/// keys and settings, verifies again (its `nbf` and `exp` with the leeway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub identity: Identity,
    /// `nbf`, if the token has one (Unix seconds).
    pub not_before: Option<u64>,
    /// `exp` (Unix seconds; required).
    pub expires: u64,
    pub leeway: u64,
}

impl Verified {
    /// Would the token still verify at `now` (Unix seconds)? The same comparisons as the
    /// verification's own `exp` and `nbf` checks.
    pub fn valid_at(&self, now: u64) -> bool {
        self.expires >= now.saturating_sub(self.leeway)
            && self
                .not_before
                .is_none_or(|nbf| nbf <= now.saturating_add(self.leeway))
    }
}

/// SHA-256 of a token: what a backend keeps to recognise the last token it verified (compared
/// whole, not byte by byte, and never the token itself).
pub fn digest(token: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(token.as_bytes()).into()
}

/// Verify `token` and extract the identity (`sub`, the tenant and roles claims).
pub fn verify(token: &str, keys: &KeyConfig<'_>) -> Result<Identity, TokenError> {
    verify_claims(token, keys).map(|v| v.identity)
}

/// [`verify`], with the time window in which the verdict holds.
pub fn verify_claims(token: &str, keys: &KeyConfig<'_>) -> Result<Verified, TokenError> {
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    // Claim paths first: a broken setting refuses every token, whatever the token.
    let tenant_path =
        ClaimPath::parse(non_empty(keys.claim_tenant).unwrap_or(DEFAULT_CLAIM_TENANT))
            .map_err(|_| TokenError::BadClaimPath)?;
    let roles_path = ClaimPath::parse(non_empty(keys.claim_roles).unwrap_or(DEFAULT_CLAIM_ROLES))
        .map_err(|_| TokenError::BadClaimPath)?;
    let (raw, claims) = raw_parts(token)?;
    // RFC 7515 §4.1.11: a recipient that does not understand every listed extension must reject
    // the token. We understand none, so any `crit` (even empty, which the RFC forbids) is refused.
    if raw.get("crit").is_some() {
        return Err(TokenError::CriticalHeader);
    }
    if KEY_HEADERS.iter().any(|h| raw.get(*h).is_some()) {
        return Err(TokenError::KeyInHeader);
    }
    let kid = match raw.get("kid") {
        None => None,
        Some(Value::String(k)) => Some(k.as_str()),
        Some(_) => return Err(TokenError::Malformed),
    };
    // `decode_header` fails for `alg: none` and unknown algorithms: jsonwebtoken has no such variant.
    let header = decode_header(token).map_err(|_| header_error(token))?;
    let candidates = candidate_keys(header.alg, kid, keys)?;

    let mut validation = Validation::new(header.alg);
    validation.leeway = keys.leeway_secs;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.required_spec_claims = HashSet::from(["exp".to_string()]);
    let audiences = non_empty(keys.audience)
        .map(list_setting)
        .unwrap_or_default();
    if audiences.is_empty() {
        validation.validate_aud = false;
    } else {
        validation.set_audience(&audiences);
        validation.required_spec_claims.insert("aud".into());
    }
    if let Some(iss) = non_empty(keys.issuer) {
        validation.set_issuer(&[iss]);
        validation.required_spec_claims.insert("iss".into());
    }

    // The claims are read from the strict parse above; jsonwebtoken checks the signature and the
    // registered claims of the same bytes, which hold no repeated member, so both read alike.
    let mut last = TokenError::BadSignature;
    let mut verified = false;
    for key in &candidates {
        match decode::<serde::de::IgnoredAny>(token, key, &validation) {
            Ok(_) => {
                verified = true;
                break;
            }
            Err(e) => {
                last = decode_error(&e);
                // Only a bad signature lets the next key try; any other error is about the token.
                if last != TokenError::BadSignature {
                    return Err(last);
                }
            }
        }
    }
    if !verified {
        return Err(last);
    }
    let claims = Value::Object(claims);
    let user_id = id_claim(claims.get("sub"), "sub")?;
    let tenant_id = id_claim(tenant_path.lookup(&claims), "tenant_id")?;
    let roles = roles_claim(roles_path.lookup(&claims))?;
    Ok(Verified {
        identity: Identity {
            user_id,
            tenant_id,
            roles,
        },
        not_before: claims.get("nbf").and_then(Value::as_u64),
        // Validation required `exp` and parsed it as a u64.
        expires: claims
            .get("exp")
            .and_then(Value::as_u64)
            .ok_or(TokenError::BadClaim("exp"))?,
        leeway: keys.leeway_secs,
    })
}

fn decode_error(e: &jsonwebtoken::errors::Error) -> TokenError {
    match e.kind() {
        ErrorKind::InvalidSignature => TokenError::BadSignature,
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::ImmatureSignature => TokenError::NotYetValid,
        ErrorKind::InvalidAudience => TokenError::WrongAudience,
        ErrorKind::InvalidIssuer => TokenError::WrongIssuer,
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => TokenError::WrongAudience,
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => TokenError::WrongIssuer,
        ErrorKind::MissingRequiredClaim(_) => TokenError::BadClaim("exp"),
        ErrorKind::InvalidAlgorithm => TokenError::AlgorithmNotAccepted,
        ErrorKind::InvalidKeyFormat
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_) => TokenError::InvalidKey,
        _ => TokenError::Malformed,
    }
}

type JsonObject = serde_json::Map<String, Value>;

/// One segment of a token: base64url JSON, parsed strictly into an object.
fn segment(part: &str) -> Result<JsonObject, TokenError> {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| TokenError::Malformed)?;
    json::parse_object(&raw).map_err(|e| match e {
        JsonError::Duplicate => TokenError::DuplicateMember,
        JsonError::Syntax | JsonError::TooDeep => TokenError::Malformed,
    })
}

/// The token's JOSE header and claims as JSON objects, each parsed strictly: a token of three
/// segments whose first two are base64url JSON objects repeating no member, or an error.
fn raw_parts(token: &str) -> Result<(JsonObject, JsonObject), TokenError> {
    let mut parts = token.split('.');
    let (Some(head), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    Ok((segment(head)?, segment(payload)?))
}

/// Distinguish "well-formed header naming an algorithm we do not accept" (e.g. `none`) from garbage.
fn header_error(token: &str) -> TokenError {
    let head = token.split('.').next().unwrap_or_default();
    let alg = segment(head)
        .ok()
        .and_then(|h| h.get("alg").map(Value::is_string));
    if alg == Some(true) {
        TokenError::AlgorithmNotAccepted
    } else {
        TokenError::Malformed
    }
}

fn id_claim(v: Option<&Value>, name: &'static str) -> Result<String, TokenError> {
    match v {
        Some(Value::String(s)) if is_valid_id(s) => Ok(s.clone()),
        _ => Err(TokenError::BadClaim(name)),
    }
}

/// Roles: absent or null (none), an array of labels, or one string of labels separated by
/// spaces (`scope`-style). Any entry that is not a label refuses the token; duplicates collapse.
fn roles_claim(v: Option<&Value>) -> Result<Vec<String>, TokenError> {
    let bad = TokenError::BadClaim("roles");
    let items: Vec<&str> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) if items.len() <= MAX_ROLES => items
            .iter()
            .map(|i| i.as_str().ok_or(bad.clone()))
            .collect::<Result<_, _>>()?,
        Some(Value::String(s)) => s.split(' ').filter(|r| !r.is_empty()).collect(),
        Some(_) => return Err(bad),
    };
    if items.len() > MAX_ROLES {
        return Err(bad);
    }
    let mut roles: Vec<String> = Vec::with_capacity(items.len());
    for r in items {
        if !is_valid_label(r) {
            return Err(bad);
        }
        if !roles.iter().any(|x| x == r) {
            roles.push(r.to_string());
        }
    }
    Ok(roles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &str = "unit-test-secret-unit-test-secret-0123";

    // RFC 8032 test vector 1 (well-known test key, never used outside tests).
    const ED_PKCS8_DER_HEX: &str = "302e020100300506032b6570042204209d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const ED_PUB_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn hs(claims: serde_json::Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap()
    }

    /// An HS256 token from the header's and the claims' JSON text exactly as written (members
    /// repeated or escaped as the test wants), correctly signed.
    fn hs_text(header: &str, claims: &str) -> String {
        let message = format!("{}.{}", B64.encode(header), B64.encode(claims));
        let sig = jsonwebtoken::crypto::sign(
            message.as_bytes(),
            &EncodingKey::from_secret(SECRET.as_bytes()),
            Algorithm::HS256,
        )
        .unwrap();
        format!("{message}.{sig}")
    }

    fn ed(claims: serde_json::Value) -> String {
        let der: Vec<u8> = (0..ED_PKCS8_DER_HEX.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&ED_PKCS8_DER_HEX[i..i + 2], 16).unwrap())
            .collect();
        encode(
            &Header::new(Algorithm::EdDSA),
            &claims,
            &EncodingKey::from_ed_der(&der),
        )
        .unwrap()
    }

    fn keys() -> KeyConfig<'static> {
        KeyConfig {
            hs256_secret: Some(SECRET),
            ed25519_public_key: Some(ED_PUB_X),
            leeway_secs: 5,
            ..KeyConfig::default()
        }
    }

    fn good() -> serde_json::Value {
        json!({"sub": "u1", "tenant_id": "acme", "roles": ["ap_clerk"], "exp": now() + 60})
    }

    #[test]
    fn hs256_and_eddsa_verify() {
        let want = Identity {
            user_id: "u1".into(),
            tenant_id: "acme".into(),
            roles: vec!["ap_clerk".into()],
        };
        assert_eq!(verify(&hs(good()), &keys()).unwrap(), want);
        assert_eq!(verify(&ed(good()), &keys()).unwrap(), want);
    }

    #[test]
    fn the_window_of_a_verdict_is_the_verifications_own() {
        let t = now();
        let mut claims = good();
        claims["exp"] = json!(t + 30);
        claims["nbf"] = json!(t - 1);
        let v = verify_claims(&hs(claims), &keys()).unwrap();
        assert_eq!(
            (v.not_before, v.expires, v.leeway),
            (Some(t - 1), t + 30, 5)
        );
        assert!(v.valid_at(t));
        // exp + leeway is the last second that verifies, as in the verification itself.
        assert!(v.valid_at(t + 35));
        assert!(!v.valid_at(t + 36));
        // nbf - leeway is the first.
        assert!(v.valid_at(t - 6));
        assert!(!v.valid_at(t - 7));
        // Checked against the verification: a token past its window is refused.
        let mut expired = good();
        expired["exp"] = json!(t - 6);
        assert_eq!(verify(&hs(expired), &keys()), Err(TokenError::Expired));
        let mut early = good();
        early["nbf"] = json!(t + 6);
        assert_eq!(verify(&hs(early), &keys()), Err(TokenError::NotYetValid));
    }

    const HS_HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

    #[test]
    fn negative_cases() {
        let exp = now() + 60;
        // The hand-written tokens below verify when nothing is repeated: each refusal is for the
        // repeat alone.
        let plain = hs_text(
            HS_HEADER,
            &format!(
                r#"{{"sub":"u1","tenant_id":"acme","tenant\u005fi":"x","exp":{exp},"app_metadata":{{"tenant_id":"acme"}}}}"#
            ),
        );
        assert_eq!(
            verify(&plain, &keys()).map(|w| w.tenant_id),
            Ok("acme".into())
        );
        assert!(verify(
            &hs_text(r#"{"alg":"HS256","kid":"a"}"#, &good().to_string()),
            &keys()
        )
        .is_ok());
        let unsigned = format!(
            "{}.{}.",
            B64.encode(br#"{"alg":"none","typ":"JWT"}"#),
            B64.encode(serde_json::to_vec(&good()).unwrap())
        );
        // HS256 token whose HMAC key is the Ed25519 public key: classic algorithm confusion.
        let confused = encode(
            &Header::new(Algorithm::HS256),
            &good(),
            &EncodingKey::from_secret(ED_PUB_X.as_bytes()),
        )
        .unwrap();
        let hs384 = encode(
            &Header::new(Algorithm::HS384),
            &good(),
            &EncodingKey::from_secret(SECRET.as_bytes()),
        )
        .unwrap();
        let mut tampered = hs(good());
        tampered.insert(tampered.len() - 2, 'A');
        let no_ed = KeyConfig {
            ed25519_public_key: None,
            ..keys()
        };
        let no_hs = KeyConfig {
            hs256_secret: None,
            ..keys()
        };
        let short = KeyConfig {
            hs256_secret: Some("short"),
            ..keys()
        };
        let aud = KeyConfig {
            audience: Some("ctxguard"),
            ..keys()
        };
        let mut with_aud = good();
        with_aud["aud"] = json!("other");
        let cases: Vec<(&str, String, KeyConfig, TokenError)> = vec![
            (
                "alg none",
                unsigned,
                keys(),
                TokenError::AlgorithmNotAccepted,
            ),
            ("confusion", confused, keys(), TokenError::BadSignature),
            ("hs384", hs384, keys(), TokenError::AlgorithmNotAccepted),
            ("tampered", tampered, keys(), TokenError::BadSignature),
            ("garbage", "abc".into(), keys(), TokenError::Malformed),
            ("empty", "".into(), keys(), TokenError::Malformed),
            (
                "huge",
                "a".repeat(MAX_TOKEN_LEN + 1),
                keys(),
                TokenError::Malformed,
            ),
            (
                "expired",
                hs(json!({"sub":"u1","tenant_id":"t","exp": now() - 120})),
                keys(),
                TokenError::Expired,
            ),
            (
                "no exp",
                hs(json!({"sub":"u1","tenant_id":"t"})),
                keys(),
                TokenError::BadClaim("exp"),
            ),
            (
                "nbf",
                hs(json!({"sub":"u1","tenant_id":"t","exp": now()+60, "nbf": now()+600})),
                keys(),
                TokenError::NotYetValid,
            ),
            ("eddsa without key", ed(good()), no_ed, TokenError::NoKey),
            ("hs without key", hs(good()), no_hs, TokenError::NoKey),
            ("short secret", hs(good()), short, TokenError::InvalidKey),
            (
                "aud missing",
                hs(good()),
                aud.clone(),
                TokenError::WrongAudience,
            ),
            ("aud wrong", hs(with_aud), aud, TokenError::WrongAudience),
            (
                "no tenant",
                hs(json!({"sub":"u1","exp": now()+60})),
                keys(),
                TokenError::BadClaim("tenant_id"),
            ),
            (
                "numeric sub",
                hs(json!({"sub":1,"tenant_id":"t","exp": now()+60})),
                keys(),
                TokenError::BadClaim("sub"),
            ),
            (
                "padded tenant",
                hs(json!({"sub":"u","tenant_id":" t","exp": now()+60})),
                keys(),
                TokenError::BadClaim("tenant_id"),
            ),
            (
                "roles a number",
                hs(json!({"sub":"u","tenant_id":"t","roles":7,"exp": now()+60})),
                keys(),
                TokenError::BadClaim("roles"),
            ),
            (
                "roles string with an invalid label",
                hs(json!({"sub":"u","tenant_id":"t","roles":"admin a/b","exp": now()+60})),
                keys(),
                TokenError::BadClaim("roles"),
            ),
            (
                "role invalid",
                hs(json!({"sub":"u","tenant_id":"t","roles":["a b"],"exp": now()+60})),
                keys(),
                TokenError::BadClaim("roles"),
            ),
            (
                "duplicate claim",
                hs_text(
                    HS_HEADER,
                    &format!(
                        r#"{{"sub":"u1","tenant_id":"acme","tenant_id":"globex","exp":{exp}}}"#
                    ),
                ),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate claim, escaped differently",
                hs_text(
                    HS_HEADER,
                    &format!(
                        r#"{{"sub":"u1","tenant_id":"acme","tenant\u005fid":"globex","exp":{exp}}}"#
                    ),
                ),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate sub",
                hs_text(
                    HS_HEADER,
                    &format!(r#"{{"sub":"u1","tenant_id":"acme","exp":{exp},"sub":"root"}}"#),
                ),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate exp",
                hs_text(
                    HS_HEADER,
                    &format!(r#"{{"sub":"u1","tenant_id":"acme","exp":1,"exp":{exp}}}"#),
                ),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate nested claim",
                hs_text(
                    HS_HEADER,
                    &format!(
                        r#"{{"sub":"u1","tenant_id":"acme","exp":{exp},"app_metadata":{{"tenant_id":"acme","tenant_id":"globex"}}}}"#
                    ),
                ),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate deep in an unused claim",
                hs_text(
                    HS_HEADER,
                    &format!(
                        r#"{{"sub":"u1","tenant_id":"acme","exp":{exp},"x":[{{"y":[{{"z":1,"z":2}}]}}]}}"#
                    ),
                ),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate header alg",
                hs_text(
                    r#"{"alg":"HS256","typ":"JWT","alg":"HS256"}"#,
                    &good().to_string(),
                ),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate header alg, none last",
                hs_text(r#"{"alg":"HS256","alg":"none"}"#, &good().to_string()),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate header kid",
                hs_text(
                    r#"{"alg":"HS256","kid":"a","kid":"b"}"#,
                    &good().to_string(),
                ),
                keys(),
                TokenError::DuplicateMember,
            ),
            (
                "claims nested too deeply",
                hs_text(
                    HS_HEADER,
                    &format!(
                        r#"{{"sub":"u1","tenant_id":"acme","exp":{exp},"x":{}1{}}}"#,
                        "[".repeat(300),
                        "]".repeat(300)
                    ),
                ),
                keys(),
                TokenError::Malformed,
            ),
            (
                "claims not an object",
                hs_text(HS_HEADER, "[1]"),
                keys(),
                TokenError::Malformed,
            ),
            (
                "four segments",
                format!("{}.x", hs(good())),
                keys(),
                TokenError::Malformed,
            ),
        ];
        for (label, token, keys, want) in cases {
            assert_eq!(verify(&token, &keys), Err(want), "{label}");
        }
    }

    #[test]
    fn leeway_and_audience_accept() {
        let mut c = good();
        c["exp"] = json!(now() - 2);
        assert!(verify(&hs(c), &keys()).is_ok(), "within leeway");
        let mut c = good();
        c["aud"] = json!(["x", "ctxguard"]);
        assert!(verify(
            &hs(c),
            &KeyConfig {
                audience: Some("ctxguard"),
                ..keys()
            }
        )
        .is_ok());
    }

    #[test]
    fn pem_public_key() {
        // SubjectPublicKeyInfo for the RFC 8032 key above.
        let pem = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\n-----END PUBLIC KEY-----\n";
        let k = KeyConfig {
            ed25519_public_key: Some(pem),
            ..keys()
        };
        assert!(verify(&ed(good()), &k).is_ok());
        let bad = KeyConfig {
            ed25519_public_key: Some("not-a-key!"),
            ..keys()
        };
        assert_eq!(verify(&ed(good()), &bad), Err(TokenError::InvalidKey));
    }

    #[test]
    fn a_signed_token_with_crit_is_refused() {
        let header = B64.encode(br#"{"alg":"HS256","typ":"JWT","crit":["exp"]}"#);
        let claims = json!({"sub": "u1", "tenant_id": "t1", "exp": now() + 60});
        let payload = B64.encode(claims.to_string());
        let message = format!("{header}.{payload}");
        let signature = jsonwebtoken::crypto::sign(
            message.as_bytes(),
            &EncodingKey::from_secret(SECRET.as_bytes()),
            Algorithm::HS256,
        )
        .unwrap();
        let token = format!("{message}.{signature}");
        assert_eq!(verify(&token, &keys()), Err(TokenError::CriticalHeader));
        // The same claims without crit verify: the refusal is for crit alone.
        assert!(verify(&hs(claims), &keys()).is_ok());
    }

    // --- JWKS keys (RS*, PS256, ES256/384, EdDSA), kid selection, issuer, audiences, claim paths.

    const RSA_A: &str = include_str!("../testdata/rsa2048.pem");
    const RSA_B: &str = include_str!("../testdata/rsa2048b.pem");
    const RSA_WEAK: &str = include_str!("../testdata/rsa1024.pem");
    const P256: &str = include_str!("../testdata/p256.pem");
    const P384: &str = include_str!("../testdata/p384.pem");

    fn enc(alg: Algorithm) -> (EncodingKey, &'static str) {
        match alg {
            Algorithm::ES256 => (EncodingKey::from_ec_pem(P256.as_bytes()).unwrap(), "ec"),
            Algorithm::ES384 => (EncodingKey::from_ec_pem(P384.as_bytes()).unwrap(), "ec384"),
            Algorithm::EdDSA => {
                let der: Vec<u8> = (0..ED_PKCS8_DER_HEX.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&ED_PKCS8_DER_HEX[i..i + 2], 16).unwrap())
                    .collect();
                (EncodingKey::from_ed_der(&der), "ed")
            }
            _ => (
                EncodingKey::from_rsa_pem(RSA_A.as_bytes()).unwrap(),
                "rsa-a",
            ),
        }
    }

    /// The public JWK of a private key, with a kid.
    fn jwk(key: &EncodingKey, alg: Algorithm, kid: &str) -> serde_json::Value {
        let mut j =
            serde_json::to_value(jsonwebtoken::jwk::Jwk::from_encoding_key(key, alg).unwrap())
                .unwrap();
        let obj = j.as_object_mut().unwrap();
        obj.remove("alg");
        obj.insert("kid".into(), json!(kid));
        j
    }

    fn key_set() -> KeySet {
        let rsa_b = EncodingKey::from_rsa_pem(RSA_B.as_bytes()).unwrap();
        let doc = json!({"keys": [
            jwk(&enc(Algorithm::RS256).0, Algorithm::RS256, "rsa-a"),
            jwk(&rsa_b, Algorithm::RS256, "rsa-b"),
            jwk(&enc(Algorithm::ES256).0, Algorithm::ES256, "ec"),
            jwk(&enc(Algorithm::ES384).0, Algorithm::ES384, "ec384"),
            {"kty": "OKP", "crv": "Ed25519", "x": ED_PUB_X, "kid": "ed"},
        ]});
        KeySet::parse(&doc.to_string()).unwrap()
    }

    fn signed(alg: Algorithm, kid: Option<&str>, claims: serde_json::Value) -> String {
        let mut h = Header::new(alg);
        h.kid = kid.map(String::from);
        encode(&h, &claims, &enc(alg).0).unwrap()
    }

    fn with_jwks(set: &KeySet) -> KeyConfig<'_> {
        KeyConfig {
            jwks: Jwks::Set(set),
            ed25519_public_key: None,
            ..keys()
        }
    }

    /// A token with this header (JSON) and claims, signed by `key` for `alg`.
    fn raw_signed(
        header: serde_json::Value,
        claims: &serde_json::Value,
        alg: Algorithm,
        key: &EncodingKey,
    ) -> String {
        raw_signed_text(&header.to_string(), &claims.to_string(), alg, key)
    }

    /// [`raw_signed`] from the JSON text exactly as written.
    fn raw_signed_text(header: &str, claims: &str, alg: Algorithm, key: &EncodingKey) -> String {
        let message = format!("{}.{}", B64.encode(header), B64.encode(claims));
        let sig = jsonwebtoken::crypto::sign(message.as_bytes(), key, alg).unwrap();
        format!("{message}.{sig}")
    }

    #[test]
    fn every_jwks_algorithm_verifies_with_and_without_kid() {
        let set = key_set();
        let k = with_jwks(&set);
        for alg in [
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::ES256,
            Algorithm::ES384,
            Algorithm::EdDSA,
        ] {
            let kid = enc(alg).1;
            let who = verify(&signed(alg, Some(kid), good()), &k);
            assert_eq!(who.map(|w| w.tenant_id), Ok("acme".into()), "{alg:?} kid");
            // Without kid, every key that fits the algorithm is tried (rsa-b first fails).
            assert!(
                verify(&signed(alg, None, good()), &k).is_ok(),
                "{alg:?} no kid"
            );
        }
    }

    #[test]
    fn jwks_refusals() {
        let set = key_set();
        let k = with_jwks(&set);
        let (rsa, _) = enc(Algorithm::RS256);
        // HS256 signed with the RSA public key's JWK text, and with its PEM: algorithm confusion.
        let pub_jwk = jwk(&rsa, Algorithm::RS256, "rsa-a").to_string();
        let confused = encode(
            &Header::new(Algorithm::HS256),
            &good(),
            &EncodingKey::from_secret(pub_jwk.as_bytes()),
        )
        .unwrap();
        let weak = EncodingKey::from_rsa_pem(RSA_WEAK.as_bytes()).unwrap();
        let weak_set = KeySet::parse(
            &json!({"keys": [jwk(&weak, Algorithm::RS256, "weak"), {"kty":"OKP","crv":"Ed25519","x":ED_PUB_X}]})
                .to_string(),
        )
        .unwrap();
        assert_eq!(weak_set.skipped[0].reason, "RSA key shorter than 2048 bits");
        let mut h = Header::new(Algorithm::RS256);
        h.kid = Some("weak".into());
        let weak_token = encode(&h, &good(), &weak).unwrap();
        let cases: Vec<(&str, String, KeyConfig, TokenError)> = vec![
            (
                "unknown kid",
                signed(Algorithm::RS256, Some("gone"), good()),
                k.clone(),
                TokenError::UnknownKey,
            ),
            // ES256 header naming the RSA key's kid: the key does not fit the algorithm.
            (
                "alg/key mismatch",
                raw_signed(
                    json!({"alg":"ES256","kid":"rsa-a"}),
                    &good(),
                    Algorithm::ES256,
                    &enc(Algorithm::ES256).0,
                ),
                k.clone(),
                TokenError::AlgorithmNotAccepted,
            ),
            (
                "signed by another key",
                raw_signed(
                    json!({"alg":"RS256","kid":"rsa-b"}),
                    &good(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::BadSignature,
            ),
            (
                "hs256 with the public key",
                confused,
                k.clone(),
                TokenError::BadSignature,
            ),
            (
                "weak key",
                weak_token,
                with_jwks(&weak_set),
                TokenError::UnknownKey,
            ),
            (
                "jku",
                raw_signed(
                    json!({"alg":"RS256","kid":"rsa-a","jku":"https://evil.example/jwks"}),
                    &good(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::KeyInHeader,
            ),
            (
                "x5u",
                raw_signed(
                    json!({"alg":"RS256","kid":"rsa-a","x5u":"https://evil.example/c"}),
                    &good(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::KeyInHeader,
            ),
            (
                "x5c",
                raw_signed(
                    json!({"alg":"RS256","kid":"rsa-a","x5c":["MIIB"]}),
                    &good(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::KeyInHeader,
            ),
            (
                "jwk",
                raw_signed(
                    json!({"alg":"RS256","jwk":jwk(&rsa, Algorithm::RS256, "x")}),
                    &good(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::KeyInHeader,
            ),
            (
                "crit",
                raw_signed(
                    json!({"alg":"RS256","kid":"rsa-a","crit":["b64"],"b64":true}),
                    &good(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::CriticalHeader,
            ),
            // Read with the last value, this header names the key that signed the token.
            (
                "duplicate kid",
                raw_signed_text(
                    r#"{"alg":"RS256","kid":"rsa-b","kid":"rsa-a"}"#,
                    &good().to_string(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate alg",
                raw_signed_text(
                    r#"{"alg":"ES256","kid":"rsa-a","alg":"RS256"}"#,
                    &good().to_string(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::DuplicateMember,
            ),
            (
                "duplicate claim",
                raw_signed_text(
                    r#"{"alg":"RS256","kid":"rsa-a"}"#,
                    &format!(
                        r#"{{"sub":"u1","tenant_id":"acme","exp":{},"tenant_id":"globex"}}"#,
                        now() + 60
                    ),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::DuplicateMember,
            ),
            (
                "kid not a string",
                raw_signed(
                    json!({"alg":"RS256","kid":5}),
                    &good(),
                    Algorithm::RS256,
                    &rsa,
                ),
                k.clone(),
                TokenError::Malformed,
            ),
            (
                "no jwks configured",
                signed(Algorithm::RS256, Some("rsa-a"), good()),
                keys(),
                TokenError::NoKey,
            ),
            (
                "jwks invalid",
                signed(Algorithm::RS256, Some("rsa-a"), good()),
                KeyConfig {
                    jwks: Jwks::Invalid,
                    ..keys()
                },
                TokenError::InvalidKey,
            ),
            (
                "hs384",
                encode(
                    &Header::new(Algorithm::HS384),
                    &good(),
                    &EncodingKey::from_secret(SECRET.as_bytes()),
                )
                .unwrap(),
                k.clone(),
                TokenError::AlgorithmNotAccepted,
            ),
        ];
        for (label, token, keys, want) in cases {
            assert_eq!(verify(&token, &keys), Err(want), "{label}");
        }
    }

    #[test]
    fn issuer_and_audiences() {
        let set = key_set();
        let k = KeyConfig {
            issuer: Some("https://id.example/"),
            audience: Some("https://api.example/mcp, other"),
            ..with_jwks(&set)
        };
        let claims = |iss: Option<&str>, aud: serde_json::Value| {
            let mut c = good();
            if let Some(iss) = iss {
                c["iss"] = json!(iss);
            }
            if !aud.is_null() {
                c["aud"] = aud;
            }
            signed(Algorithm::ES256, Some("ec"), c)
        };
        let iss = Some("https://id.example/");
        assert!(verify(&claims(iss, json!("https://api.example/mcp")), &k).is_ok());
        assert!(verify(&claims(iss, json!("other")), &k).is_ok());
        assert!(verify(&claims(iss, json!(["x", "other"])), &k).is_ok());
        assert_eq!(
            verify(&claims(iss, json!("x")), &k),
            Err(TokenError::WrongAudience)
        );
        assert_eq!(
            verify(&claims(iss, json!(["x", "y"])), &k),
            Err(TokenError::WrongAudience)
        );
        assert_eq!(
            verify(&claims(iss, json!(null)), &k),
            Err(TokenError::WrongAudience)
        );
        assert_eq!(
            verify(&claims(Some("https://id.example"), json!("other")), &k),
            Err(TokenError::WrongIssuer)
        );
        assert_eq!(
            verify(&claims(Some("https://evil.example/"), json!("other")), &k),
            Err(TokenError::WrongIssuer)
        );
        assert_eq!(
            verify(&claims(None, json!("other")), &k),
            Err(TokenError::WrongIssuer)
        );
        assert_eq!(list_setting(" a, b  c,,d "), ["a", "b", "c", "d"]);
    }

    #[test]
    fn claim_paths() {
        let set = key_set();
        let base = with_jwks(&set);
        let token = |c: serde_json::Value| signed(Algorithm::ES256, Some("ec"), c);
        let exp = now() + 60;
        let keycloak = KeyConfig {
            claim_tenant: Some("org.id"),
            claim_roles: Some("realm_access.roles"),
            ..base.clone()
        };
        let who = verify(&token(json!({"sub":"u","exp":exp,"org":{"id":"acme"},"realm_access":{"roles":["a","b","a"]}})), &keycloak).unwrap();
        assert_eq!(
            (who.tenant_id.as_str(), who.roles),
            ("acme", vec!["a".to_string(), "b".into()])
        );
        let auth0 = KeyConfig {
            claim_tenant: Some(r#""https://acme.example/tenant""#),
            claim_roles: Some(r#""https://acme.example/roles""#),
            ..base.clone()
        };
        let who = verify(&token(json!({"sub":"u","exp":exp,"https://acme.example/tenant":"globex","https://acme.example/roles":["ap_clerk"]})), &auth0).unwrap();
        assert_eq!(
            (who.tenant_id.as_str(), who.roles),
            ("globex", vec!["ap_clerk".to_string()])
        );
        let scope = KeyConfig {
            claim_roles: Some("scope"),
            ..base.clone()
        };
        let who = verify(
            &token(
                json!({"sub":"u","exp":exp,"tenant_id":"t","scope":"openid  read:docs ap_clerk"}),
            ),
            &scope,
        )
        .unwrap();
        assert_eq!(who.roles, ["openid", "read:docs", "ap_clerk"]);
        let who = verify(&token(json!({"sub":"u","exp":exp,"tenant_id":"t"})), &scope).unwrap();
        assert!(who.roles.is_empty(), "no roles claim: no roles");
        let supabase = KeyConfig {
            claim_tenant: Some("app_metadata.tenant_id"),
            ..base.clone()
        };
        for (label, claims) in [
            ("missing", json!({"sub":"u","exp":exp})),
            (
                "top level only",
                json!({"sub":"u","exp":exp,"tenant_id":"t"}),
            ),
            (
                "empty",
                json!({"sub":"u","exp":exp,"app_metadata":{"tenant_id":""}}),
            ),
            (
                "number",
                json!({"sub":"u","exp":exp,"app_metadata":{"tenant_id":7}}),
            ),
            (
                "object",
                json!({"sub":"u","exp":exp,"app_metadata":{"tenant_id":{}}}),
            ),
            (
                "not an id",
                json!({"sub":"u","exp":exp,"app_metadata":{"tenant_id":"a b"}}),
            ),
        ] {
            assert_eq!(
                verify(&token(claims), &supabase),
                Err(TokenError::BadClaim("tenant_id")),
                "{label}"
            );
        }
        let too_many: Vec<String> = (0..=MAX_ROLES).map(|i| format!("r{i}")).collect();
        assert_eq!(
            verify(
                &token(json!({"sub":"u","exp":exp,"tenant_id":"t","roles":too_many.join(" ")})),
                &base
            ),
            Err(TokenError::BadClaim("roles"))
        );
        let broken = KeyConfig {
            claim_roles: Some("a..b"),
            ..base.clone()
        };
        assert_eq!(
            verify(&token(good()), &broken),
            Err(TokenError::BadClaimPath)
        );
    }
}
