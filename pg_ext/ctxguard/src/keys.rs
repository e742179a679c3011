//! Verification keys: from the superuser-only settings, or from files named by
//! `ctxguard.jwt_secret_file` / `ctxguard.jwt_public_key_file` / `ctxguard.jwks_file` (read by the
//! server process, so the key never sits in a setting that `SHOW`, `pg_settings` or
//! `pg_db_role_setting` could reveal).
//!
//! Each backend keeps what it read and parsed: a file is re-read (and a JWKS re-parsed) only when
//! its identity (device, inode), modification time or size changes, an inline `ctxguard.jwks`
//! only when its text changes; every other call costs one `stat`. Rotating a key is: replace the
//! file (atomically: `ctxguard-gateway jwks-sync` writes a new file and renames it), then
//! `SELECT pg_reload_conf()`. The pure verification lives in `ctxguard_core::token`, the JWKS
//! parsing in `ctxguard_core::jwks`.

use std::cell::RefCell;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::time::SystemTime;

use ctxguard_core::jwks::{KeySet, MAX_JWKS_BYTES};
use ctxguard_core::token::{self, Jwks, KeyConfig};

use crate::gucs;

/// Largest key file read (a PEM public key or a secret is far smaller).
const MAX_KEY_FILE: u64 = 16 * 1024;

/// What identifies one version of a file: device, inode, modification time, size.
type Stamp = (u64, u64, SystemTime, u64);

#[derive(Default)]
struct Cached {
    path: String,
    stamp: Option<(SystemTime, u64)>,
    value: Option<String>,
}

/// The parsed JWKS and where it came from.
#[derive(Default)]
struct CachedJwks {
    /// `Some(path)` from the file setting, `None` from the inline setting.
    source: Option<String>,
    stamp: Option<Stamp>,
    inline: String,
    keys: Option<Result<KeySet, String>>,
    /// Bumped at every (re)load, so that a remembered verdict never outlives its keys.
    generation: u64,
}

/// Everything a token's verdict depends on besides the token and the clock.
#[derive(PartialEq)]
struct Settings {
    secret: Option<String>,
    public_key: Option<String>,
    jwks: u64,
    audience: Option<String>,
    issuer: Option<String>,
    claim_tenant: Option<String>,
    claim_roles: Option<String>,
    leeway: u64,
}

/// The last token this backend verified (its SHA-256), the settings it was verified under, and
/// the verdict: a gateway sends the same token in every transaction of a turn, and a pooled
/// connection the same few. Refusals are not remembered.
struct Remembered {
    token: [u8; 32],
    settings: Settings,
    verified: token::Verified,
}

thread_local! {
    static SECRET_FILE: RefCell<Cached> = RefCell::new(Cached::default());
    static PUBLIC_KEY_FILE: RefCell<Cached> = RefCell::new(Cached::default());
    static JWKS: RefCell<CachedJwks> = RefCell::new(CachedJwks::default());
    static LAST: RefCell<Option<Remembered>> = const { RefCell::new(None) };
}

/// The trimmed contents of `path` (cached by modification time and size); None if unreadable.
fn read_file(cache: &'static std::thread::LocalKey<RefCell<Cached>>, path: &str) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_KEY_FILE {
        return None;
    }
    let stamp = (meta.modified().ok()?, meta.len());
    cache.with(|c| {
        let mut c = c.borrow_mut();
        if c.path != path || c.stamp != Some(stamp) {
            c.path = path.to_string();
            c.stamp = Some(stamp);
            c.value = std::fs::read_to_string(path)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty());
        }
        c.value.clone()
    })
}

/// A key from its file setting if one is set (an unreadable file means no key: fail closed),
/// else from its value setting.
fn key(
    file: &pgrx::GucSetting<Option<std::ffi::CString>>,
    cache: &'static std::thread::LocalKey<RefCell<Cached>>,
    value: &pgrx::GucSetting<Option<std::ffi::CString>>,
) -> Option<String> {
    match gucs::get(file) {
        Some(path) => read_file(cache, &path),
        None => gucs::get(value),
    }
}

/// The JWKS document of a file, read only up to its size limit (None: unreadable or too large).
fn read_jwks_file(path: &str) -> Result<String, String> {
    let file = std::fs::File::open(path).map_err(|_| "the JWKS file cannot be read".to_string())?;
    let mut text = String::new();
    file.take(MAX_JWKS_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(|_| "the JWKS file cannot be read as text".to_string())?;
    Ok(text)
}

/// A line for the server log only (LOG_SERVER_ONLY: never sent to the client, whatever its
/// client_min_messages), so the gateway's connection learns nothing about the key configuration.
fn server_log(message: String) {
    pgrx::pg_sys::panic::ErrorReport::new(
        pgrx::PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        message,
        "ctxguard::keys",
    )
    .report(pgrx::PgLogLevel::LOG_SERVER_ONLY);
}

/// Run `f` with the configured JWKS, parsed once per change of the file or the inline setting,
/// and the number of its load (0: no JWKS configured).
fn with_jwks<R>(f: impl FnOnce(Jwks<'_>, u64) -> R) -> R {
    let file = gucs::get(&gucs::JWKS_FILE);
    let inline = if file.is_none() {
        gucs::get(&gucs::JWKS)
    } else {
        None
    };
    if file.is_none() && inline.is_none() {
        return f(Jwks::Unset, 0);
    }
    JWKS.with(|c| {
        let mut c = c.borrow_mut();
        let fresh = match &file {
            Some(path) => {
                let stamp = std::fs::metadata(path)
                    .ok()
                    .and_then(|m| Some((m.dev(), m.ino(), m.modified().ok()?, m.len())));
                // (A missing file stays missing without a re-read or a log line per call.)
                let same = c.source.as_deref() == Some(path.as_str())
                    && c.keys.is_some()
                    && c.stamp == stamp;
                if !same {
                    c.source = Some(path.clone());
                    c.stamp = stamp;
                    c.inline.clear();
                    c.keys = Some(
                        read_jwks_file(path)
                            .and_then(|text| KeySet::parse(&text).map_err(|e| e.to_string())),
                    );
                }
                !same
            }
            None => {
                let text = inline.as_deref().unwrap_or_default();
                let same = c.source.is_none() && c.keys.is_some() && c.inline == text;
                if !same {
                    c.source = None;
                    c.stamp = None;
                    c.inline = text.to_string();
                    c.keys = Some(KeySet::parse(text).map_err(|e| e.to_string()));
                }
                !same
            }
        };
        if fresh {
            c.generation += 1;
            // Once per change and backend: what was loaded (kids and kinds, never key material).
            match &c.keys {
                Some(Ok(set)) => {
                    let kids: Vec<String> = set
                        .keys
                        .iter()
                        .map(|k| format!("{}:{}", k.kid.as_deref().unwrap_or("-"), k.kind.label()))
                        .collect();
                    server_log(format!(
                        "ctxguard: JWKS loaded: {} key(s) [{}], {} skipped",
                        set.keys.len(),
                        kids.join(", "),
                        set.skipped.len()
                    ));
                    for s in &set.skipped {
                        server_log(format!(
                            "ctxguard: JWKS key {} skipped: {}",
                            s.kid.as_deref().unwrap_or("-"),
                            s.reason
                        ));
                    }
                }
                Some(Err(e)) => server_log(format!("ctxguard: JWKS not loaded: {e}")),
                None => {}
            }
        }
        let generation = c.generation;
        match &c.keys {
            Some(Ok(set)) => f(Jwks::Set(set), generation),
            _ => f(Jwks::Invalid, generation),
        }
    })
}

/// Verify a context token against the configured keys.
pub fn verify(token: Option<&str>) -> Result<token::Identity, token::TokenError> {
    crate::log_guard::saw_token();
    let token = token.unwrap_or_default();
    // Size first: an oversized token is refused before the JWKS is even looked at.
    if token.len() > token::MAX_TOKEN_LEN {
        return Err(token::TokenError::Malformed);
    }
    with_jwks(|jwks, jwks_generation| {
        let settings = Settings {
            secret: key(&gucs::JWT_SECRET_FILE, &SECRET_FILE, &gucs::JWT_SECRET),
            public_key: key(
                &gucs::JWT_PUBLIC_KEY_FILE,
                &PUBLIC_KEY_FILE,
                &gucs::JWT_PUBLIC_KEY,
            ),
            jwks: jwks_generation,
            audience: gucs::get(&gucs::JWT_AUDIENCE),
            issuer: gucs::get(&gucs::JWT_ISSUER),
            claim_tenant: gucs::get(&gucs::CLAIM_TENANT),
            claim_roles: gucs::get(&gucs::CLAIM_ROLES),
            leeway: gucs::JWT_LEEWAY.get().max(0) as u64,
        };
        let digest = token::digest(token);
        // No clock, no remembered verdict (the verification itself then decides).
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs());
        let known = LAST.with(|l| {
            l.borrow()
                .as_ref()
                .filter(|r| {
                    r.token == digest
                        && r.settings == settings
                        && now.is_some_and(|t| r.verified.valid_at(t))
                })
                .map(|r| r.verified.identity.clone())
        });
        if let Some(identity) = known {
            return Ok(identity);
        }
        let keys = KeyConfig {
            hs256_secret: settings.secret.as_deref(),
            ed25519_public_key: settings.public_key.as_deref(),
            jwks,
            issuer: settings.issuer.as_deref(),
            audience: settings.audience.as_deref(),
            claim_tenant: settings.claim_tenant.as_deref(),
            claim_roles: settings.claim_roles.as_deref(),
            leeway_secs: settings.leeway,
        };
        let verified = token::verify_claims(token, &keys)?;
        let identity = verified.identity.clone();
        LAST.with(|l| {
            *l.borrow_mut() = Some(Remembered {
                token: digest,
                settings,
                verified,
            })
        });
        Ok(identity)
    })
}
