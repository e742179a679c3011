//! **Floor** (uses no other room): a command of its own, run by `main.rs`.
//!
//! `ctxguard-gateway jwks-sync`: keep the file named by `ctxguard.jwks_file` current from an
//! identity provider's `jwks_uri`.
//!
//! Fetches the JWKS (or first the provider's OpenID configuration, with `--issuer`), checks it
//! exactly as the extension will (`ctxguard_core::jwks`: size, key types, RSA sizes, curves, no
//! private keys, at least one usable key), and only then replaces the file atomically (a
//! temporary file in the same directory, fsync, rename, fsync of the directory), so PostgreSQL
//! never reads half a file and a bad download never replaces good keys. Plain `http://` is
//! accepted only for loopback addresses. Nothing here talks to the database: run
//! `SELECT pg_reload_conf()` afterwards (each backend also notices the new file by itself).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use ctxguard_core::jwks::{KeySet, MAX_JWKS_BYTES};

/// Fetch an identity provider's JWKS, check it, and write it atomically for ctxguard.jwks_file.
#[derive(Debug, Clone, Parser)]
#[command(name = "ctxguard-gateway jwks-sync")]
pub struct SyncArgs {
    /// The provider's jwks_uri (e.g. https://id.example.com/.well-known/jwks.json).
    #[arg(long, conflicts_with = "issuer", required_unless_present = "issuer")]
    pub url: Option<String>,
    /// The provider's issuer: its jwks_uri is read from <issuer>/.well-known/openid-configuration.
    #[arg(long)]
    pub issuer: Option<String>,
    /// The file to write (the path ctxguard.jwks_file names).
    #[arg(long)]
    pub out: PathBuf,
    /// Deadline for each request, in seconds.
    #[arg(long, default_value_t = 10)]
    pub timeout_secs: u64,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Updated {
        keys: Vec<String>,
        skipped: Vec<String>,
    },
    Unchanged {
        keys: Vec<String>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("{0}: only https:// (or http:// to a loopback address) is accepted")]
    Insecure(&'static str),
    #[error("fetching the {0} failed: {1}")]
    Fetch(&'static str, String),
    #[error("the {0} is larger than 64 KiB")]
    TooLarge(&'static str),
    #[error("the provider's OpenID configuration names no https jwks_uri")]
    NoJwksUri,
    #[error("the fetched JWKS is not usable, the file is left as it was: {0}")]
    Invalid(#[from] ctxguard_core::jwks::JwksError),
    #[error("writing {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

/// Whether `url` may be fetched: https, or http to a loopback host.
fn allowed(url: &url::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => match url.host() {
            Some(url::Host::Domain(d)) => d == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        },
        _ => false,
    }
}

async fn fetch(
    client: &reqwest::Client,
    what: &'static str,
    url: &str,
) -> Result<String, SyncError> {
    let parsed = url::Url::parse(url).map_err(|_| SyncError::Insecure(what))?;
    if !allowed(&parsed) {
        return Err(SyncError::Insecure(what));
    }
    let mut resp = client
        .get(parsed)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| SyncError::Fetch(what, e.without_url().to_string()))?;
    if !resp.status().is_success() {
        return Err(SyncError::Fetch(what, format!("HTTP {}", resp.status())));
    }
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
    {
        return Err(SyncError::TooLarge(what));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| SyncError::Fetch(what, e.without_url().to_string()))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_JWKS_BYTES {
            return Err(SyncError::TooLarge(what));
        }
    }
    String::from_utf8(body).map_err(|_| SyncError::Fetch(what, "not UTF-8".into()))
}

/// `kid:kind` of each usable key, for the report.
fn describe(set: &KeySet) -> (Vec<String>, Vec<String>) {
    let keys = set
        .keys
        .iter()
        .map(|k| format!("{}:{}", k.kid.as_deref().unwrap_or("-"), k.kind.label()))
        .collect();
    let skipped = set
        .skipped
        .iter()
        .map(|s| format!("{}: {}", s.kid.as_deref().unwrap_or("-"), s.reason))
        .collect();
    (keys, skipped)
}

/// Write `text` to `out` atomically, keeping an existing file's permissions (else 0644: public
/// keys, readable by the PostgreSQL server).
fn write_atomically(out: &Path, text: &str) -> Result<(), SyncError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |e| SyncError::Write(out.to_path_buf(), e);
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out.file_name().ok_or_else(|| {
        err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a file path",
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mode = std::fs::metadata(out).map_or(0o644, |m| m.permissions().mode() & 0o777);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, out)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// Fetch, check, and (when it changed) write the JWKS.
pub async fn sync(args: &SyncArgs) -> Result<Outcome, SyncError> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout_secs.max(1)))
        // A redirect could leave https: none are followed.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| SyncError::Fetch("JWKS", e.to_string()))?;
    let jwks_uri = match (&args.url, &args.issuer) {
        (Some(url), _) => url.clone(),
        (None, Some(issuer)) => {
            let conf_url = format!(
                "{}/.well-known/openid-configuration",
                issuer.trim_end_matches('/')
            );
            let conf = fetch(&client, "OpenID configuration", &conf_url).await?;
            let conf: serde_json::Value = serde_json::from_str(&conf)
                .map_err(|_| SyncError::Fetch("OpenID configuration", "not JSON".into()))?;
            conf.get("jwks_uri")
                .and_then(|u| u.as_str())
                .ok_or(SyncError::NoJwksUri)?
                .to_string()
        }
        (None, None) => return Err(SyncError::NoJwksUri),
    };
    let text = fetch(&client, "JWKS", &jwks_uri).await?;
    let set = KeySet::parse(&text)?;
    let (keys, skipped) = describe(&set);
    if std::fs::read_to_string(&args.out).is_ok_and(|old| old == text) {
        return Ok(Outcome::Unchanged { keys });
    }
    write_atomically(&args.out, &text)?;
    Ok(Outcome::Updated { keys, skipped })
}

/// The subcommand: exit 0 when the file is current (updated or unchanged), 1 on any failure (the
/// file is then left as it was).
pub fn main(args: impl IntoIterator<Item = String>) -> i32 {
    let args = SyncArgs::parse_from(args);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ctxguard-gateway jwks-sync: cannot start the runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(sync(&args)) {
        Ok(Outcome::Updated { keys, skipped }) => {
            println!(
                "updated {}: {} key(s) [{}]",
                args.out.display(),
                keys.len(),
                keys.join(", ")
            );
            for s in skipped {
                println!("skipped key {s}");
            }
            0
        }
        Ok(Outcome::Unchanged { keys }) => {
            println!(
                "unchanged {}: {} key(s) [{}]",
                args.out.display(),
                keys.len(),
                keys.join(", ")
            );
            0
        }
        Err(e) => {
            eprintln!("ctxguard-gateway jwks-sync: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_http() {
        for (url, ok) in [
            ("https://id.example.com/jwks", true),
            ("http://127.0.0.1:8080/jwks", true),
            ("http://localhost/jwks", true),
            ("http://[::1]/jwks", true),
            ("http://id.example.com/jwks", false),
            ("http://10.0.0.1/jwks", false),
            ("file:///etc/passwd", false),
            ("ftp://id.example.com/jwks", false),
        ] {
            assert_eq!(allowed(&url::Url::parse(url).unwrap()), ok, "{url}");
        }
    }

    #[test]
    fn atomic_write_replaces_and_keeps_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ctxguard-jwks-sync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("jwks.json");
        write_atomically(&out, "one").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "one");
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o644
        );
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomically(&out, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "two");
        assert_eq!(
            std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o640
        );
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
