//! JWKS documents (RFC 7517): the public keys of an identity provider, parsed and checked once
//! (per change of `ctxguard.jwks_file` / `ctxguard.jwks`, or once by `ctxguard-gateway
//! jwks-sync`), then used by [`crate::token::verify`] to choose a key by `kid`.
//!
//! Accepted: RSA keys of 2048 to 4096 bits (RS256/384/512, PS256/384/512), EC P-256 (ES256) and
//! P-384 (ES384) points on their curve, Ed25519 (EdDSA). Keys that are not for signing
//! (`use` other than `sig`, `key_ops` without `verify`), symmetric keys (`oct`: HS256 comes only
//! from the secret settings), other key types and curves, and weak RSA keys are skipped, with the
//! reason recorded. A document holding private key material is refused as a whole, and so is one
//! that repeats a member anywhere (a key read as RSA by one parser and as another key by the next:
//! [`crate::json`]).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

/// Largest JWKS document accepted, in bytes (checked before parsing).
pub const MAX_JWKS_BYTES: usize = 64 * 1024;
/// Most keys in one document (providers publish a handful).
pub const MAX_KEYS: usize = 32;
/// Smallest RSA modulus accepted.
pub const MIN_RSA_BITS: usize = 2048;
/// Largest RSA modulus accepted (the RSA implementation's limit).
pub const MAX_RSA_BITS: usize = 4096;
/// Longest `kid` accepted.
pub const MAX_KID_LEN: usize = 256;

/// What a key is, which decides the algorithms it can verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Rsa { bits: usize },
    P256,
    P384,
    Ed25519,
}

impl KeyKind {
    /// Whether a token signed with `alg` may be verified with a key of this kind.
    pub fn fits(self, alg: Algorithm) -> bool {
        use Algorithm::*;
        match self {
            KeyKind::Rsa { .. } => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            KeyKind::P256 => alg == ES256,
            KeyKind::P384 => alg == ES384,
            KeyKind::Ed25519 => alg == EdDSA,
        }
    }

    pub fn label(self) -> String {
        match self {
            KeyKind::Rsa { bits } => format!("RSA-{bits}"),
            KeyKind::P256 => "EC P-256".into(),
            KeyKind::P384 => "EC P-384".into(),
            KeyKind::Ed25519 => "Ed25519".into(),
        }
    }
}

/// One usable verification key.
#[derive(Clone)]
pub struct Key {
    pub kid: Option<String>,
    pub kind: KeyKind,
    /// The key's own `alg`, when the document names one: then only that algorithm.
    pub alg: Option<Algorithm>,
    pub decoding: DecodingKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("kind", &self.kind)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl Key {
    /// Whether this key may verify a token signed with `alg`.
    pub fn fits(&self, alg: Algorithm) -> bool {
        self.kind.fits(alg) && self.alg.is_none_or(|a| a == alg)
    }
}

/// A key the document holds but that will never be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub kid: Option<String>,
    pub reason: &'static str,
}

/// The usable keys of a JWKS document.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    pub keys: Vec<Key>,
    pub skipped: Vec<Skipped>,
}

/// Why a whole document was refused. Messages name the rule, never key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwksError {
    #[error("JWKS document is larger than 64 KiB")]
    TooLarge,
    #[error("JWKS document is not a JSON object with a keys array")]
    Malformed,
    #[error("JWKS document holds more than 32 keys")]
    TooManyKeys,
    #[error("JWKS document holds private key material")]
    PrivateKey,
    #[error("JWKS document holds no usable signing key")]
    NoUsableKey,
    #[error("JWKS document repeats a member")]
    DuplicateMember,
}

/// Members that only private (or symmetric) keys have.
const PRIVATE_MEMBERS: [&str; 7] = ["d", "p", "q", "dp", "dq", "qi", "oth"];

impl KeySet {
    /// Parse and check a JWKS document (`{"keys": [...]}`).
    pub fn parse(text: &str) -> Result<KeySet, JwksError> {
        if text.len() > MAX_JWKS_BYTES {
            return Err(JwksError::TooLarge);
        }
        let doc = crate::json::parse(text.as_bytes()).map_err(|e| match e {
            crate::json::JsonError::Duplicate => JwksError::DuplicateMember,
            crate::json::JsonError::Syntax | crate::json::JsonError::TooDeep => {
                JwksError::Malformed
            }
        })?;
        let items = doc
            .get("keys")
            .and_then(Value::as_array)
            .ok_or(JwksError::Malformed)?;
        if items.len() > MAX_KEYS {
            return Err(JwksError::TooManyKeys);
        }
        let mut set = KeySet::default();
        for item in items {
            let obj = item.as_object().ok_or(JwksError::Malformed)?;
            if PRIVATE_MEMBERS.iter().any(|m| obj.contains_key(*m)) {
                return Err(JwksError::PrivateKey);
            }
            let kid = match obj.get("kid") {
                None => None,
                Some(Value::String(k)) if !k.is_empty() && k.len() <= MAX_KID_LEN => {
                    Some(k.clone())
                }
                Some(_) => {
                    set.skipped.push(Skipped {
                        kid: None,
                        reason: "kid is not a short string",
                    });
                    continue;
                }
            };
            match parse_key(obj) {
                Ok((kind, alg, decoding)) => set.keys.push(Key {
                    kid,
                    kind,
                    alg,
                    decoding,
                }),
                Err(reason) => set.skipped.push(Skipped { kid, reason }),
            }
        }
        if set.keys.is_empty() {
            return Err(JwksError::NoUsableKey);
        }
        Ok(set)
    }

    /// The keys that could have signed a token with this header: with a `kid`, the keys of that
    /// `kid` (whatever their kind: the caller refuses one that does not fit); without, every key.
    pub fn with_kid<'a>(&'a self, kid: Option<&'a str>) -> impl Iterator<Item = &'a Key> + 'a {
        self.keys
            .iter()
            .filter(move |k| kid.is_none() || k.kid.as_deref() == kid)
    }
}

type Parsed = (KeyKind, Option<Algorithm>, DecodingKey);

fn string<'a>(obj: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a str> {
    obj.get(name).and_then(Value::as_str)
}

fn b64(obj: &serde_json::Map<String, Value>, name: &str) -> Result<Vec<u8>, &'static str> {
    let s = string(obj, name).ok_or("a key member is missing")?;
    URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| "a key member is not base64url")
}

fn parse_key(obj: &serde_json::Map<String, Value>) -> Result<Parsed, &'static str> {
    match obj.get("use") {
        None => {}
        Some(Value::String(u)) if u == "sig" => {}
        Some(_) => return Err("not a signing key (use)"),
    }
    if let Some(ops) = obj.get("key_ops") {
        let verify = ops
            .as_array()
            .is_some_and(|ops| ops.iter().any(|o| o.as_str() == Some("verify")));
        if !verify {
            return Err("not a verification key (key_ops)");
        }
    }
    let alg = match obj.get("alg") {
        None => None,
        Some(Value::String(a)) => Some(match a.as_str() {
            "RS256" => Algorithm::RS256,
            "RS384" => Algorithm::RS384,
            "RS512" => Algorithm::RS512,
            "PS256" => Algorithm::PS256,
            "PS384" => Algorithm::PS384,
            "PS512" => Algorithm::PS512,
            "ES256" => Algorithm::ES256,
            "ES384" => Algorithm::ES384,
            "EdDSA" | "Ed25519" => Algorithm::EdDSA,
            _ => return Err("algorithm not accepted"),
        }),
        Some(_) => return Err("alg is not a string"),
    };
    let (kind, decoding) = match string(obj, "kty") {
        Some("RSA") => rsa_key(obj)?,
        Some("EC") => ec_key(obj)?,
        Some("OKP") => ed_key(obj)?,
        Some("oct") => return Err("symmetric key (HS256 comes only from ctxguard.jwt_secret)"),
        _ => return Err("key type not accepted"),
    };
    if alg.is_some_and(|a| !kind.fits(a)) {
        return Err("alg does not fit the key");
    }
    Ok((kind, alg, decoding))
}

fn rsa_key(obj: &serde_json::Map<String, Value>) -> Result<(KeyKind, DecodingKey), &'static str> {
    let n = b64(obj, "n")?;
    let e = b64(obj, "e")?;
    let n = strip_zeros(&n);
    let e = strip_zeros(&e);
    let bits = n
        .first()
        .map_or(0, |b| n.len() * 8 - b.leading_zeros() as usize);
    if bits < MIN_RSA_BITS {
        return Err("RSA key shorter than 2048 bits");
    }
    if bits > MAX_RSA_BITS {
        return Err("RSA key longer than 4096 bits");
    }
    if n.last().is_some_and(|b| b & 1 == 0) {
        return Err("RSA modulus is even");
    }
    // e: odd, at least 3, at most 2^32 - 1.
    let e_ok = !e.is_empty()
        && e.len() <= 4
        && e.last().is_some_and(|b| b & 1 == 1)
        && (e.len() > 1 || e[0] >= 3);
    if !e_ok {
        return Err("RSA exponent not accepted");
    }
    Ok((
        KeyKind::Rsa { bits },
        DecodingKey::from_rsa_raw_components(n, e),
    ))
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    &b[start..]
}

/// A key the verifier cannot build (a point off its curve, a malformed Ed25519 key) fails when
/// asked to verify anything; a good key merely reports a bad signature.
fn probe(key: &DecodingKey, alg: Algorithm) -> bool {
    jsonwebtoken::crypto::verify("AAAA", b"probe", key, alg).is_ok()
}

fn ec_key(obj: &serde_json::Map<String, Value>) -> Result<(KeyKind, DecodingKey), &'static str> {
    let (kind, len, alg) = match string(obj, "crv") {
        Some("P-256") => (KeyKind::P256, 32, Algorithm::ES256),
        Some("P-384") => (KeyKind::P384, 48, Algorithm::ES384),
        _ => return Err("EC curve not accepted"),
    };
    let x = b64(obj, "x")?;
    let y = b64(obj, "y")?;
    if x.len() != len || y.len() != len {
        return Err("EC point has the wrong length");
    }
    let mut sec1 = Vec::with_capacity(1 + 2 * len);
    sec1.push(0x04);
    sec1.extend_from_slice(&x);
    sec1.extend_from_slice(&y);
    let key = DecodingKey::from_ec_der(&sec1);
    if !probe(&key, alg) {
        return Err("EC point is not on its curve");
    }
    Ok((kind, key))
}

fn ed_key(obj: &serde_json::Map<String, Value>) -> Result<(KeyKind, DecodingKey), &'static str> {
    if string(obj, "crv") != Some("Ed25519") {
        return Err("OKP curve not accepted");
    }
    let x = b64(obj, "x")?;
    if x.len() != 32 {
        return Err("Ed25519 key has the wrong length");
    }
    let key = DecodingKey::from_ed_der(&x);
    if !probe(&key, Algorithm::EdDSA) {
        return Err("Ed25519 key is not a valid point");
    }
    Ok((KeyKind::Ed25519, key))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// RFC 8037 A.2's Ed25519 public key (the RFC 8032 test vector 1).
    pub const ED_X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    /// RFC 7517 A.1's P-256 public key.
    pub const P256_X: &str = "MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4";
    pub const P256_Y: &str = "4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM";

    pub fn rsa_n(bits: usize) -> String {
        // An odd modulus of exactly `bits` bits (not a real RSA key: parsing checks shape only).
        let mut n = vec![0xABu8; bits / 8];
        n[0] = 0xC1;
        *n.last_mut().unwrap() = 0x01;
        URL_SAFE_NO_PAD.encode(n)
    }

    fn parse(keys: Value) -> Result<KeySet, JwksError> {
        KeySet::parse(&json!({ "keys": keys }).to_string())
    }

    fn skipped(key: Value) -> &'static str {
        let set = parse(json!([key, {"kty":"OKP","crv":"Ed25519","x":ED_X}])).unwrap();
        assert_eq!(set.keys.len(), 1);
        set.skipped[0].reason
    }

    #[test]
    fn accepted_keys() {
        let set = parse(json!([
            {"kty":"RSA","kid":"r","n":rsa_n(2048),"e":"AQAB","alg":"RS256","use":"sig","x5c":["MII..."]},
            {"kty":"RSA","kid":"r4","n":rsa_n(4096),"e":"AQAB"},
            {"kty":"EC","kid":"e","crv":"P-256","x":P256_X,"y":P256_Y,"key_ops":["verify"]},
            {"kty":"OKP","kid":"o","crv":"Ed25519","x":ED_X,"alg":"EdDSA"},
        ]))
        .unwrap();
        let kinds: Vec<_> = set.keys.iter().map(|k| k.kind).collect();
        assert_eq!(
            kinds,
            [
                KeyKind::Rsa { bits: 2048 },
                KeyKind::Rsa { bits: 4096 },
                KeyKind::P256,
                KeyKind::Ed25519
            ]
        );
        assert!(set.skipped.is_empty());
        assert!(set.keys[0].fits(Algorithm::RS256));
        assert!(!set.keys[0].fits(Algorithm::PS256), "its alg pins RS256");
        assert!(set.keys[1].fits(Algorithm::PS256));
        assert!(!set.keys[1].fits(Algorithm::ES256));
        assert!(!set.keys[2].fits(Algorithm::ES384));
        assert_eq!(set.with_kid(Some("e")).count(), 1);
        assert_eq!(set.with_kid(Some("nope")).count(), 0);
        assert_eq!(set.with_kid(None).count(), 4);
    }

    #[test]
    fn skipped_keys() {
        let cases = [
            (
                json!({"kty":"RSA","n":rsa_n(1024),"e":"AQAB"}),
                "RSA key shorter than 2048 bits",
            ),
            (
                json!({"kty":"RSA","n":rsa_n(2040),"e":"AQAB"}),
                "RSA key shorter than 2048 bits",
            ),
            (
                json!({"kty":"RSA","n":rsa_n(8192),"e":"AQAB"}),
                "RSA key longer than 4096 bits",
            ),
            (
                json!({"kty":"RSA","n":rsa_n(2048),"e":"AQ"}),
                "RSA exponent not accepted",
            ),
            (
                json!({"kty":"RSA","n":rsa_n(2048),"e":"Ag"}),
                "RSA exponent not accepted",
            ),
            (
                json!({"kty":"RSA","n":rsa_n(2048),"e":"AQAB","use":"enc"}),
                "not a signing key (use)",
            ),
            (
                json!({"kty":"RSA","n":rsa_n(2048),"e":"AQAB","key_ops":["encrypt"]}),
                "not a verification key (key_ops)",
            ),
            (
                json!({"kty":"RSA","n":rsa_n(2048),"e":"AQAB","alg":"RSA-OAEP"}),
                "algorithm not accepted",
            ),
            (
                json!({"kty":"RSA","n":rsa_n(2048),"e":"AQAB","alg":"ES256"}),
                "alg does not fit the key",
            ),
            (
                json!({"kty":"EC","crv":"P-256","x":P256_X,"y":P256_Y,"alg":"ES384"}),
                "alg does not fit the key",
            ),
            (
                json!({"kty":"EC","crv":"P-521","x":P256_X,"y":P256_Y}),
                "EC curve not accepted",
            ),
            (
                json!({"kty":"EC","crv":"P-256","x":P256_X,"y":P256_X}),
                "EC point is not on its curve",
            ),
            (
                json!({"kty":"EC","crv":"P-384","x":P256_X,"y":P256_Y}),
                "EC point has the wrong length",
            ),
            (
                json!({"kty":"OKP","crv":"X25519","x":ED_X}),
                "OKP curve not accepted",
            ),
            (
                json!({"kty":"OKP","crv":"Ed25519","x":"AAAA"}),
                "Ed25519 key has the wrong length",
            ),
            (
                json!({"kty":"oct","k":"c2VjcmV0"}),
                "symmetric key (HS256 comes only from ctxguard.jwt_secret)",
            ),
            (json!({"kty":"XYZ"}), "key type not accepted"),
            (
                json!({"kty":"RSA","n":"!!","e":"AQAB"}),
                "a key member is not base64url",
            ),
            (json!({"kty":"RSA","e":"AQAB"}), "a key member is missing"),
            (
                json!({"kty":"OKP","crv":"Ed25519","x":ED_X,"kid":7}),
                "kid is not a short string",
            ),
        ];
        for (key, reason) in cases {
            assert_eq!(skipped(key.clone()), reason, "{key}");
        }
    }

    #[test]
    fn refused_documents() {
        assert_eq!(KeySet::parse("[]").unwrap_err(), JwksError::Malformed);
        assert_eq!(KeySet::parse("{}").unwrap_err(), JwksError::Malformed);
        assert_eq!(KeySet::parse("nope").unwrap_err(), JwksError::Malformed);
        assert_eq!(
            KeySet::parse(&" ".repeat(MAX_JWKS_BYTES + 1)).unwrap_err(),
            JwksError::TooLarge
        );
        assert_eq!(
            parse(json!(["x"])).unwrap_err(),
            JwksError::Malformed,
            "a key that is not an object"
        );
        assert_eq!(parse(json!([])).unwrap_err(), JwksError::NoUsableKey);
        assert_eq!(
            parse(json!([{"kty":"RSA","n":rsa_n(1024),"e":"AQAB"}])).unwrap_err(),
            JwksError::NoUsableKey
        );
        let many: Vec<Value> = (0..=MAX_KEYS)
            .map(|_| json!({"kty":"OKP","crv":"Ed25519","x":ED_X}))
            .collect();
        assert_eq!(parse(json!(many)).unwrap_err(), JwksError::TooManyKeys);
        assert_eq!(
            parse(json!([{"kty":"RSA","n":rsa_n(2048),"e":"AQAB","d":"AQAB"}])).unwrap_err(),
            JwksError::PrivateKey
        );
        // A repeated member anywhere refuses the whole document (the same key text read by a
        // parser keeping the first value is another key). Each also parses without the repeat.
        let ed = format!(r#"{{"kty":"OKP","crv":"Ed25519","x":"{ED_X}"}}"#);
        let rsa = format!(r#"{{"kty":"RSA","n":"{}","e":"AQAB"}}"#, rsa_n(2048));
        let key =
            |members: &str| format!(r#"{{"kty":"OKP","crv":"Ed25519","x":"{ED_X}"{members}}}"#);
        for (label, repeated, once) in [
            (
                "kid twice",
                key(r#","kid":"a","kid":"b""#),
                key(r#","kid":"b""#),
            ),
            ("x twice", key(&format!(r#","x":"{ED_X}""#)), key("")),
            ("kty twice", key(r#","kty":"RSA""#), key("")),
            (
                "alg twice, escaped",
                key(r#","alg":"EdDSA","\u0061lg":"EdDSA""#),
                key(r#","alg":"EdDSA""#),
            ),
            (
                "nested",
                key(r#","ext":{"a":1,"a":2}"#),
                key(r#","ext":{"a":2}"#),
            ),
        ] {
            let doc = format!(r#"{{"keys":[{rsa},{repeated}]}}"#);
            assert_eq!(
                KeySet::parse(&doc).unwrap_err(),
                JwksError::DuplicateMember,
                "{label}"
            );
            let doc = format!(r#"{{"keys":[{rsa},{once}]}}"#);
            assert_eq!(KeySet::parse(&doc).map(|s| s.keys.len()), Ok(2), "{label}");
        }
        let doc = format!(r#"{{"keys":[{ed}],"keys":[{rsa}]}}"#);
        assert_eq!(
            KeySet::parse(&doc).unwrap_err(),
            JwksError::DuplicateMember,
            "keys twice"
        );
        let deep = format!(
            r#"{{"keys":[{ed}],"x":{}1{}}}"#,
            "[".repeat(300),
            "]".repeat(300)
        );
        assert_eq!(
            KeySet::parse(&deep).unwrap_err(),
            JwksError::Malformed,
            "too deep"
        );
    }
}
