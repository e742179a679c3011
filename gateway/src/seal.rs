//! **Floor** (uses no other room): `db` stores what it seals, `upstream` opens it.
//!
//! Sealing credentials for storage: XChaCha20-Poly1305 under a key the database never sees.
//!
//! The key file (`CTXGUARD_CREDENTIAL_KEY_FILE`) holds one key per line, `key_id:base64` (32 bytes,
//! standard base64), `#` comments and blank lines ignored. The first key seals; every key listed
//! opens what it sealed (its id is stored beside each ciphertext). Rotation: put a new key first,
//! keep the old ones below it, restart the gateway; credentials written from then on use the new
//! key, and each old one is re-sealed when it is next written (a refresh, a reconnect, an admin's
//! new secret); once `ctxguard.upstream_credentials` holds no row of an old `key_id`, drop its line.
//!
//! The associated data binds a sealed value to where it belongs: tenant, user (empty for a tenant
//! secret), server, mode and which field it is (`access`, `refresh`). A row copied or moved to
//! another user, tenant, server or field does not open; neither does one whose bytes were changed.
//! Nonces are random (24 bytes: no coordination between gateways is needed).

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

/// Most bytes of a credential in clear (the database allows its ciphertext, 16 bytes more).
pub const MAX_PLAINTEXT_BYTES: usize = 16_384;

/// Where a sealed value belongs: its associated data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding<'a> {
    pub tenant: &'a str,
    /// The user, or `""` for a tenant's secret.
    pub user: &'a str,
    pub server: &'a str,
    pub mode: &'a str,
    /// `access` or `refresh`.
    pub field: &'a str,
}

impl Binding<'_> {
    fn aad(&self) -> Vec<u8> {
        // Each part is length-prefixed: no two bindings share an encoding.
        let mut out = b"ctxguard-credential-v1".to_vec();
        for part in [self.tenant, self.user, self.server, self.mode, self.field] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out
    }
}

/// A value as stored: the key's id, the ciphertext (with its tag) and the nonce.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub ciphertext: Vec<u8>,
    pub nonce: Vec<u8>,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealed")
            .field("key_id", &self.key_id)
            .field(
                "ciphertext",
                &format_args!("{} bytes", self.ciphertext.len()),
            )
            .finish()
    }
}

/// Why a value could not be sealed or opened. Fixed messages: no value, no key material.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("no credential key is configured (CTXGUARD_CREDENTIAL_KEY_FILE)")]
    NoKey,
    #[error("the credential was sealed with a key this gateway does not have")]
    UnknownKey,
    #[error("the credential does not open here (another owner, or changed)")]
    Open,
    #[error("the credential is larger than 16384 bytes")]
    TooLarge,
}

/// The gateway's credential keys: the first seals, all open.
pub struct KeyRing {
    current: Option<String>,
    keys: HashMap<String, XChaCha20Poly1305>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing")
            .field("current", &self.current)
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl KeyRing {
    /// No keys: sealing and opening fail (`NoKey`).
    pub fn empty() -> KeyRing {
        KeyRing {
            current: None,
            keys: HashMap::new(),
        }
    }

    /// Read the key file (see the module's documentation). Errors name the line, never its key.
    pub fn from_file(path: &Path) -> Result<KeyRing, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read the credential key file {}: {e}",
                path.display()
            )
        })?;
        if text.len() > 64 * 1024 {
            return Err("the credential key file is larger than 64 KiB".into());
        }
        KeyRing::parse(&text)
    }

    pub fn parse(text: &str) -> Result<KeyRing, String> {
        let mut ring = KeyRing::empty();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("credential key file, line {}: {why}", n + 1);
            let (id, b64) = line
                .split_once(':')
                .ok_or_else(|| bad("expected key_id:base64"))?;
            if id.is_empty()
                || id.len() > 64
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(bad("the key id must be 1-64 letters, digits, _ or -"));
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|_| bad("the key is not base64"))?;
            if bytes.len() != 32 {
                return Err(bad("the key must be 32 bytes"));
            }
            let cipher = XChaCha20Poly1305::new_from_slice(&bytes)
                .map_err(|_| bad("the key must be 32 bytes"))?;
            if ring.keys.insert(id.to_string(), cipher).is_some() {
                return Err(bad("the key id is listed twice"));
            }
            ring.current.get_or_insert_with(|| id.to_string());
        }
        if ring.current.is_none() {
            return Err("the credential key file lists no key".into());
        }
        Ok(ring)
    }

    pub fn is_configured(&self) -> bool {
        self.current.is_some()
    }

    /// Seal `secret` for `binding` with the current key.
    pub fn seal(&self, secret: &str, binding: Binding<'_>) -> Result<Sealed, SealError> {
        if secret.len() > MAX_PLAINTEXT_BYTES {
            return Err(SealError::TooLarge);
        }
        let id = self.current.as_ref().ok_or(SealError::NoKey)?;
        let cipher = self.keys.get(id).ok_or(SealError::NoKey)?;
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = binding.aad();
        let ciphertext = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: secret.as_bytes(),
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Open)?;
        Ok(Sealed {
            key_id: id.clone(),
            ciphertext,
            nonce: nonce.to_vec(),
        })
    }

    /// Open a value sealed for `binding`.
    pub fn open(&self, sealed: &Sealed, binding: Binding<'_>) -> Result<String, SealError> {
        if !self.is_configured() {
            return Err(SealError::NoKey);
        }
        let cipher = self.keys.get(&sealed.key_id).ok_or(SealError::UnknownKey)?;
        if sealed.nonce.len() != 24 {
            return Err(SealError::Open);
        }
        let aad = binding.aad();
        let mut nonce = XNonce::default();
        nonce.copy_from_slice(&sealed.nonce);
        let clear = cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: &sealed.ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Open)?;
        String::from_utf8(clear).map_err(|_| SealError::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const K2: &str = "k2:HxwdHh8AAQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRo=";

    fn alice() -> Binding<'static> {
        Binding {
            tenant: "acme",
            user: "alice",
            server: "drive",
            mode: "user_oauth",
            field: "access",
        }
    }

    #[test]
    fn a_sealed_credential_opens_for_its_owner_only() {
        let ring = KeyRing::parse(K1).unwrap();
        let sealed = ring.seal("tok-alice", alice()).unwrap();
        assert_eq!(sealed.key_id, "k1");
        assert!(!sealed.ciphertext.windows(9).any(|w| w == b"tok-alice"));
        assert_eq!(ring.open(&sealed, alice()).unwrap(), "tok-alice");
        // Moved to another user, tenant, server, mode or field: does not open.
        for moved in [
            Binding {
                user: "bob",
                ..alice()
            },
            Binding {
                tenant: "globex",
                ..alice()
            },
            Binding {
                server: "vault",
                ..alice()
            },
            Binding {
                mode: "tenant_secret",
                ..alice()
            },
            Binding {
                field: "refresh",
                ..alice()
            },
            Binding {
                tenant: "acmealice",
                user: "",
                ..alice()
            },
        ] {
            assert_eq!(ring.open(&sealed, moved), Err(SealError::Open), "{moved:?}");
        }
    }

    #[test]
    fn a_changed_ciphertext_or_nonce_does_not_open() {
        let ring = KeyRing::parse(K1).unwrap();
        let sealed = ring.seal("tok", alice()).unwrap();
        let mut c = sealed.clone();
        c.ciphertext[0] ^= 1;
        assert_eq!(ring.open(&c, alice()), Err(SealError::Open));
        let mut n = sealed.clone();
        n.nonce[0] ^= 1;
        assert_eq!(ring.open(&n, alice()), Err(SealError::Open));
        n.nonce.truncate(12);
        assert_eq!(ring.open(&n, alice()), Err(SealError::Open));
        // Two seals of one value differ (random nonces).
        assert_ne!(ring.seal("tok", alice()).unwrap(), sealed);
    }

    #[test]
    fn rotation_seals_with_the_first_key_and_opens_with_any() {
        let old = KeyRing::parse(K1).unwrap();
        let sealed_old = old.seal("tok", alice()).unwrap();
        let rotated = KeyRing::parse(&format!("# new first\n{K2}\n{K1}\n")).unwrap();
        assert_eq!(rotated.open(&sealed_old, alice()).unwrap(), "tok");
        assert_eq!(rotated.seal("tok", alice()).unwrap().key_id, "k2");
        let dropped = KeyRing::parse(K2).unwrap();
        assert_eq!(
            dropped.open(&sealed_old, alice()),
            Err(SealError::UnknownKey)
        );
        assert_eq!(KeyRing::empty().seal("tok", alice()), Err(SealError::NoKey));
    }

    #[test]
    fn bad_key_files_are_refused_without_echoing_keys() {
        for (text, want) in [
            ("", "lists no key"),
            ("k1", "line 1: expected key_id:base64"),
            ("k 1:AAAA", "line 1: the key id"),
            ("k1:not base64!", "line 1: the key is not base64"),
            ("k1:AAAA", "line 1: the key must be 32 bytes"),
            (&format!("{K1}\n{K1}"), "line 2: the key id is listed twice"),
        ] {
            let e = KeyRing::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains("AAEC"), "{e}");
        }
        let ring = KeyRing::parse(K1).unwrap();
        assert!(!format!("{ring:?}").contains("AAEC"));
        assert_eq!(
            ring.seal(&"x".repeat(MAX_PLAINTEXT_BYTES + 1), alice()),
            Err(SealError::TooLarge)
        );
    }
}
