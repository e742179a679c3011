//! Verification keys: from the superuser-only settings, or from files named by
//! `ctxguard.jwt_secret_file` / `ctxguard.jwt_public_key_file` (read by the server process, so the
//! key never sits in a setting that `SHOW`, `pg_settings` or `pg_db_role_setting` could reveal).
//!
//! A file is re-read when its modification time or size changes, so rotating a key is: write the
//! new file, then `SELECT pg_reload_conf()` if the path changed. The pure verification lives in
//! `ctxguard_core::token`.

use std::cell::RefCell;
use std::time::SystemTime;

use ctxguard_core::token::{self, KeyConfig};

use crate::gucs;

/// Largest key file read (a PEM public key or a secret is far smaller).
const MAX_KEY_FILE: u64 = 16 * 1024;

#[derive(Default)]
struct Cached {
    path: String,
    stamp: Option<(SystemTime, u64)>,
    value: Option<String>,
}

thread_local! {
    static SECRET_FILE: RefCell<Cached> = RefCell::new(Cached::default());
    static PUBLIC_KEY_FILE: RefCell<Cached> = RefCell::new(Cached::default());
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

/// Verify a context token against the configured keys.
pub fn verify(token: Option<&str>) -> Result<token::Identity, token::TokenError> {
    let secret = key(&gucs::JWT_SECRET_FILE, &SECRET_FILE, &gucs::JWT_SECRET);
    let public_key = key(
        &gucs::JWT_PUBLIC_KEY_FILE,
        &PUBLIC_KEY_FILE,
        &gucs::JWT_PUBLIC_KEY,
    );
    let audience = gucs::get(&gucs::JWT_AUDIENCE);
    let keys = KeyConfig {
        hs256_secret: secret.as_deref(),
        ed25519_public_key: public_key.as_deref(),
        audience: audience.as_deref(),
        leeway_secs: gucs::JWT_LEEWAY.get().max(0) as u64,
    };
    token::verify(token.unwrap_or_default(), &keys)
}
