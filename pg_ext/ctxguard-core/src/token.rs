//! JWT verification for `ctxguard.set_context`.
//!
//! Accepted algorithms are chosen by configuration, never by the token: HS256 only when a shared
//! secret is configured, EdDSA (Ed25519) only when a public key is configured. `alg: none`, other
//! algorithms and HS/EdDSA confusion are rejected before any signature work.

use std::collections::HashSet;

use jsonwebtoken::{decode, decode_header, errors::ErrorKind, Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::names::{is_valid_id, is_valid_label};

/// Tokens longer than this are rejected unparsed.
pub const MAX_TOKEN_LEN: usize = 8192;
/// HS256 secrets shorter than this are treated as not configured.
pub const MIN_SECRET_LEN: usize = 32;
/// At most this many roles per token.
pub const MAX_ROLES: usize = 32;

/// Verification keys and options, read from the superuser-only `ctxguard.jwt_*` settings.
#[derive(Debug, Default, Clone)]
pub struct KeyConfig<'a> {
    pub hs256_secret: Option<&'a str>,
    /// PEM (`-----BEGIN PUBLIC KEY-----`) or the base64url raw 32-byte key (JWK `x`).
    pub ed25519_public_key: Option<&'a str>,
    /// When set, `aud` must be present and contain this value.
    pub audience: Option<&'a str>,
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
    #[error("token claim {0} is missing or invalid")]
    BadClaim(&'static str),
    #[error("token header names critical extensions, none of which are understood")]
    CriticalHeader,
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
            TokenError::BadClaim(_) => "claim",
            TokenError::CriticalHeader => "crit",
        }
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<serde_json::Value>,
    tenant_id: Option<serde_json::Value>,
    #[serde(default)]
    roles: Option<serde_json::Value>,
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

/// Verify `token` and extract the identity claims (`sub`, `tenant_id`, `roles`).
pub fn verify(token: &str, keys: &KeyConfig<'_>) -> Result<Identity, TokenError> {
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed);
    }
    // `decode_header` fails for `alg: none` and unknown algorithms: jsonwebtoken has no such variant.
    let header = decode_header(token).map_err(|_| header_error(token))?;
    // RFC 7515 §4.1.11: a recipient that does not understand every listed extension must reject
    // the token. We understand none, so any `crit` (even empty, which the RFC forbids) is refused.
    if raw_header(token).is_some_and(|h| h.get("crit").is_some()) {
        return Err(TokenError::CriticalHeader);
    }
    let key = match header.alg {
        Algorithm::HS256 => {
            let secret = non_empty(keys.hs256_secret).ok_or(TokenError::NoKey)?;
            if secret.len() < MIN_SECRET_LEN {
                return Err(TokenError::InvalidKey);
            }
            DecodingKey::from_secret(secret.as_bytes())
        }
        Algorithm::EdDSA => {
            ed25519_key(non_empty(keys.ed25519_public_key).ok_or(TokenError::NoKey)?)?
        }
        _ => return Err(TokenError::AlgorithmNotAccepted),
    };

    let mut validation = Validation::new(header.alg);
    validation.leeway = keys.leeway_secs;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.required_spec_claims = HashSet::from(["exp".to_string()]);
    match non_empty(keys.audience) {
        Some(aud) => {
            validation.set_audience(&[aud]);
            validation.required_spec_claims.insert("aud".into());
        }
        None => validation.validate_aud = false,
    }

    let data = decode::<Claims>(token, &key, &validation).map_err(|e| match e.kind() {
        ErrorKind::InvalidSignature => TokenError::BadSignature,
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::ImmatureSignature => TokenError::NotYetValid,
        ErrorKind::InvalidAudience => TokenError::WrongAudience,
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => TokenError::WrongAudience,
        ErrorKind::MissingRequiredClaim(_) => TokenError::BadClaim("exp"),
        ErrorKind::InvalidAlgorithm => TokenError::AlgorithmNotAccepted,
        ErrorKind::InvalidKeyFormat | ErrorKind::InvalidEcdsaKey => TokenError::InvalidKey,
        _ => TokenError::Malformed,
    })?;

    let claims = data.claims;
    let user_id = id_claim(claims.sub, "sub")?;
    let tenant_id = id_claim(claims.tenant_id, "tenant_id")?;
    let roles = match claims.roles {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(items)) if items.len() <= MAX_ROLES => {
            let mut roles = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    serde_json::Value::String(r) if is_valid_label(&r) => {
                        if !roles.contains(&r) {
                            roles.push(r)
                        }
                    }
                    _ => return Err(TokenError::BadClaim("roles")),
                }
            }
            roles
        }
        Some(_) => return Err(TokenError::BadClaim("roles")),
    };
    Ok(Identity {
        user_id,
        tenant_id,
        roles,
    })
}

/// The token's JOSE header as JSON (None if it is not base64url JSON).
fn raw_header(token: &str) -> Option<serde_json::Value> {
    use base64::Engine;
    let head = token.split('.').next().unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head.trim_end_matches('='))
        .ok()
        .and_then(|raw| serde_json::from_slice::<serde_json::Value>(&raw).ok())
}

/// Distinguish "well-formed header naming an algorithm we do not accept" (e.g. `none`) from garbage.
fn header_error(token: &str) -> TokenError {
    let alg = raw_header(token).and_then(|h| h.get("alg").map(serde_json::Value::is_string));
    if alg == Some(true) {
        TokenError::AlgorithmNotAccepted
    } else {
        TokenError::Malformed
    }
}

fn id_claim(v: Option<serde_json::Value>, name: &'static str) -> Result<String, TokenError> {
    match v {
        Some(serde_json::Value::String(s)) if is_valid_id(&s) => Ok(s),
        _ => Err(TokenError::BadClaim(name)),
    }
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
            audience: None,
            leeway_secs: 5,
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
    fn negative_cases() {
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
                "roles not array",
                hs(json!({"sub":"u","tenant_id":"t","roles":"admin","exp": now()+60})),
                keys(),
                TokenError::BadClaim("roles"),
            ),
            (
                "role invalid",
                hs(json!({"sub":"u","tenant_id":"t","roles":["a b"],"exp": now()+60})),
                keys(),
                TokenError::BadClaim("roles"),
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
}
