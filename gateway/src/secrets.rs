//! **Floor** (uses no other room).
//!
//! Secrets stay in the gateway.
//!
//! The gateway holds the database URLs (with their passwords), the model provider's key and every
//! upstream server's bearer token. Upstream stdio servers are programs the gateway starts, so they
//! run as the gateway's own OS user unless told otherwise, and a process of the same user may read
//! another's `/proc/<pid>/environ`, `mem` and `cmdline` or attach to it. So:
//!
//! - **Files.** Each secret can be given as a file: `CTXGUARD_DATABASE_URL_FILE`,
//!   `CTXGUARD_DISCOVERY_DATABASE_URL_FILE`, `CTXGUARD_NOTIFY_DATABASE_URL_FILE`,
//!   `CTXGUARD_DEMO_DATABASE_URL_FILE`,
//!   `CTXGUARD_LLM_API_KEY_FILE`, and for an upstream token named `NAME` by the registry
//!   (`bearer_token_env`), `NAME_FILE`. A file's content never passes through the environment a
//!   child could inherit.
//! - **Sealed at start** ([`seal`]), before any thread or child exists: every variable that is not
//!   one of the gateway's own non-secret settings or a well-known harmless one (`PATH`, locale, TLS
//!   and proxy settings, ...) moves into the gateway's memory and out of its environment, and its
//!   value is overwritten in the process's original environment block (what `/proc/<pid>/environ`
//!   shows). Secrets given on the command line are overwritten in the argument block (what
//!   `/proc/<pid>/cmdline`, readable by every user, shows). Then the process makes itself
//!   non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`): processes of its user can no longer read its
//!   `/proc` files or memory, nor `ptrace` it, and it leaves no core dump.
//! - **Stdio servers** ([`isolate`]) get a clean environment (done by the caller), their own
//!   process group (so the gateway ends the whole group, and a terminal's signals do not reach them
//!   first), the parent-death signal `SIGKILL` (a gateway that dies takes them along), none of the
//!   gateway's ambient capabilities, and optionally another OS user (`CTXGUARD_MCP_STDIO_USER`).

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::OnceLock;

/// The gateway's own secrets; each may instead be given as a file named by `<NAME>_FILE`.
pub const SECRET_VARS: [&str; 5] = [
    "CTXGUARD_DATABASE_URL",
    "CTXGUARD_DISCOVERY_DATABASE_URL",
    "CTXGUARD_NOTIFY_DATABASE_URL",
    "CTXGUARD_DEMO_DATABASE_URL",
    "CTXGUARD_LLM_API_KEY",
];

/// Variables that stay in the environment: the gateway's non-secret settings (`CTXGUARD_*` but
/// [`SECRET_VARS`]), `LC_*`, and these.
const KEPT: [&str; 27] = [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "PWD",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "NOTIFY_SOCKET",
    "CREDENTIALS_DIRECTORY",
    "SYSTEMD_EXEC_PID",
];

/// Does `name` stay in the environment?
fn kept(name: &str) -> bool {
    KEPT.contains(&name)
        || name.starts_with("LC_")
        || (name.starts_with("CTXGUARD_") && !SECRET_VARS.contains(&name))
}

/// Variables moved out of the environment by [`seal`].
static VAULT: OnceLock<HashMap<String, String>> = OnceLock::new();

/// A secret file's content: trailing line breaks and spaces removed; empty is an error.
pub fn read_secret_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read secret file {}: {e}", path.display()))?;
    let value = text.trim_end_matches(['\n', '\r', ' ', '\t']);
    if value.is_empty() {
        return Err(format!("secret file {} is empty", path.display()));
    }
    Ok(value.to_string())
}

/// For each of [`SECRET_VARS`] given as `<NAME>_FILE`, read the file into `<NAME>` (for the
/// configuration parser; [`seal`] moves it out again). Both set is an error. Called by
/// `Config::load` once the optional configuration file is read, before any thread exists.
pub fn files_to_env() -> Result<(), String> {
    for name in SECRET_VARS {
        let file_var = format!("{name}_FILE");
        let Some(path) = std::env::var_os(&file_var).filter(|p| !p.is_empty()) else {
            continue;
        };
        if std::env::var_os(name).is_some_and(|v| !v.is_empty()) {
            return Err(format!("set either {name} or {file_var}, not both"));
        }
        let value = read_secret_file(Path::new(&path))?;
        std::env::set_var(name, value);
    }
    Ok(())
}

/// A variable of the gateway's start-up environment (moved into memory by [`seal`], or, before
/// that or in tests, still in the environment).
pub fn var(name: &str) -> Option<String> {
    match VAULT.get() {
        Some(vault) => vault
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok()),
        None => std::env::var(name).ok(),
    }
}

/// An upstream server's bearer token named `name` by the registry: the variable `name`, or the
/// file named by `<name>_FILE`.
pub fn token(name: &str) -> Result<String, String> {
    if let Some(v) = var(name).filter(|v| !v.is_empty()) {
        return Ok(v);
    }
    match var(&format!("{name}_FILE")).filter(|p| !p.is_empty()) {
        Some(path) => read_secret_file(Path::new(&path)),
        None => Err(format!("neither {name} nor {name}_FILE is set")),
    }
}

/// What [`seal`] did, for the log.
#[derive(Debug, Default)]
pub struct Sealed {
    /// Names of the variables moved out of the environment.
    pub moved: Vec<String>,
    /// Overwriting the original environment and argument blocks failed (why).
    pub scrub_failed: Option<String>,
    /// `prctl(PR_SET_DUMPABLE, 0)` failed (why).
    pub dumpable_failed: Option<String>,
}

/// Move every variable not [`kept`] into the gateway's memory, overwrite the values of those
/// variables in the original environment block and `argv_secrets` (secret values that came in as
/// command-line arguments) in the argument block, then make the process non-dumpable. Call once,
/// after the configuration is parsed and before any thread or child starts.
pub fn seal(argv_secrets: &[&str]) -> Sealed {
    let mut sealed = Sealed::default();
    let mut vault = HashMap::new();
    for (name, value) in std::env::vars_os() {
        let (Ok(name), Ok(value)) = (name.into_string(), value.into_string()) else {
            continue;
        };
        if kept(&name) {
            continue;
        }
        std::env::remove_var(&name);
        sealed.moved.push(name.clone());
        vault.insert(name, value);
    }
    sealed.moved.sort();
    let moved: HashSet<&str> = sealed.moved.iter().map(String::as_str).collect();
    if let Err(e) = scrub(&moved, argv_secrets) {
        sealed.scrub_failed = Some(e.to_string());
    }
    let _ = VAULT.set(vault);
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        sealed.dumpable_failed = Some(e.to_string());
    }
    sealed
}

/// Overwrite with NUL bytes, in this process's original environment block, the values of the
/// `moved` variables and, in its argument block, every occurrence of `argv_secrets` (8 bytes or
/// more). Through `/proc/self/mem`: no unsafe code, and the kernel's view (`/proc/<pid>/environ`,
/// `/proc/<pid>/cmdline`) is what changes.
fn scrub(moved: &HashSet<&str>, argv_secrets: &[&str]) -> io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let fields: Vec<u64> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // proc(5): arg_start, arg_end, env_start, env_end are fields 48-51; `fields[0]` is field 3.
    let [arg_start, arg_end, env_start, env_end] = match fields.get(45..49) {
        Some(&[a, b, c, d]) if a < b && c <= d => [a, b, c, d],
        _ => return Err(io::Error::other("unexpected /proc/self/stat")),
    };
    let mem = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;

    let mut env = vec![0u8; (env_end - env_start) as usize];
    mem.read_exact_at(&mut env, env_start)?;
    let mut changed = false;
    let mut offset = 0;
    for entry in env.clone().split(|b| *b == 0) {
        if let Some(eq) = entry.iter().position(|b| *b == b'=') {
            let name = std::str::from_utf8(&entry[..eq]).unwrap_or_default();
            if moved.contains(name) && eq + 1 < entry.len() {
                env[offset + eq + 1..offset + entry.len()].fill(0);
                changed = true;
            }
        }
        offset += entry.len() + 1;
    }
    if changed {
        mem.write_all_at(&env, env_start)?;
    }

    let mut args = vec![0u8; (arg_end - arg_start) as usize];
    mem.read_exact_at(&mut args, arg_start)?;
    let mut changed = false;
    for secret in argv_secrets.iter().map(|s| s.as_bytes()) {
        if secret.len() < 8 {
            continue;
        }
        let mut i = 0;
        while i + secret.len() <= args.len() {
            if &args[i..i + secret.len()] == secret {
                args[i..i + secret.len()].fill(0);
                changed = true;
                i += secret.len();
            } else {
                i += 1;
            }
        }
    }
    if changed {
        mem.write_all_at(&args, arg_start)?;
    }
    Ok(())
}

/// The OS user stdio upstream servers run as (`CTXGUARD_MCP_STDIO_USER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StdioUser {
    pub uid: u32,
    pub gid: u32,
}

/// Capability bits (capability.h).
const CAP_KILL: u32 = 5;
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

/// This process's effective capability set (`CapEff` of `/proc/self/status`), if readable.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

impl StdioUser {
    /// Resolve a user name or uid. Refuses root, an unknown user, and a switch the gateway may not
    /// make (it needs to be root or hold `CAP_SETUID` and `CAP_SETGID`). `None` when the user is
    /// the gateway's own (nothing to switch).
    pub fn resolve(spec: &str) -> Result<Option<StdioUser>, String> {
        use nix::unistd::{Uid, User};
        let user = match spec.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)),
            Err(_) => User::from_name(spec),
        }
        .map_err(|e| format!("CTXGUARD_MCP_STDIO_USER: cannot look up {spec}: {e}"))?
        .ok_or_else(|| format!("CTXGUARD_MCP_STDIO_USER: no such user: {spec}"))?;
        if user.uid.is_root() {
            return Err("CTXGUARD_MCP_STDIO_USER must not be root".into());
        }
        if user.uid == Uid::effective() {
            return Ok(None);
        }
        if !Uid::effective().is_root() {
            let caps = effective_caps().unwrap_or(0);
            let has = |cap: u32| caps & (1 << cap) != 0;
            if !(has(CAP_SETUID) && has(CAP_SETGID)) {
                return Err(format!(
                    "CTXGUARD_MCP_STDIO_USER={spec}: the gateway needs CAP_SETUID and CAP_SETGID to run stdio servers as another user (see the README's systemd example)"
                ));
            }
            if !has(CAP_KILL) {
                tracing::warn!(
                    "CTXGUARD_MCP_STDIO_USER without CAP_KILL: the gateway cannot signal its stdio servers; they end when their input closes or the gateway exits"
                );
            }
        }
        Ok(Some(StdioUser {
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
        }))
    }
}

/// `struct __user_cap_header_struct` and `__user_cap_data_struct` of `capget(2)`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Prepare a stdio server's command (its environment is the caller's business): optionally
/// another user (no supplementary groups), none of the gateway's capabilities, and `SIGKILL` when
/// the gateway dies. The process group is set by the caller's process wrapper.
pub fn isolate(cmd: &mut tokio::process::Command, user: Option<StdioUser>) {
    if let Some(u) = user {
        cmd.uid(u.uid).gid(u.gid);
    }
    let parent = nix::unistd::getpid();
    let group = user.map(|u| nix::unistd::Gid::from_raw(u.gid));
    // SAFETY: the closure runs in the child between fork and exec; it only makes system calls
    // (capget, capset, prctl, setgroups, getppid) on its own stack data and allocates nothing, as
    // `pre_exec` requires.
    #[expect(
        unsafe_code,
        reason = "pre_exec is the only way to set the parent-death signal and drop ambient capabilities in the child"
    )]
    unsafe {
        cmd.pre_exec(move || {
            // Capabilities the gateway holds (e.g. CAP_SETUID granted by systemd) must not reach
            // the server: empty its inheritable set (which also empties the ambient set, whose
            // members survive exec), then the ambient set explicitly. EINVAL: an old kernel.
            let mut header = CapHeader {
                version: LINUX_CAPABILITY_VERSION_3,
                pid: 0,
            };
            let mut data = [CapData::default(); 2];
            if nix::libc::syscall(nix::libc::SYS_capget, &mut header, data.as_mut_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            data[0].inheritable = 0;
            data[1].inheritable = 0;
            if nix::libc::syscall(nix::libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if nix::libc::prctl(
                nix::libc::PR_CAP_AMBIENT,
                nix::libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ) != 0
                && nix::errno::Errno::last() != nix::errno::Errno::EINVAL
            {
                return Err(io::Error::last_os_error());
            }
            // std drops supplementary groups only when the parent is root.
            if let Some(gid) = group {
                nix::unistd::setgroups(&[gid]).map_err(io::Error::from)?;
            }
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(io::Error::from)?;
            // The gateway died before the death signal was armed.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// End a stdio server's process group: `SIGTERM`, then `SIGKILL` for what is left after `grace`.
pub async fn end_group(pgid: u32, grace: std::time::Duration) {
    use nix::sys::signal::{killpg, Signal};
    let Ok(raw) = i32::try_from(pgid) else { return };
    let group = nix::unistd::Pid::from_raw(raw);
    if killpg(group, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        // Signal 0: does any member of the group still exist?
        if killpg(group, None).is_err() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = killpg(group, Signal::SIGKILL);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateways_secrets_and_unknown_variables_leave_the_environment() {
        for name in SECRET_VARS {
            assert!(!kept(name), "{name}");
        }
        for name in [
            "SCANS_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "PGPASSWORD",
            "SHLVL",
        ] {
            assert!(!kept(name), "{name}");
        }
        for name in [
            "PATH",
            "LC_ALL",
            "RUST_LOG",
            "CTXGUARD_LISTEN",
            "CTXGUARD_LLM_API_KEY_FILE",
        ] {
            assert!(kept(name), "{name}");
        }
    }

    #[test]
    fn secret_files_are_trimmed_and_must_not_be_empty() {
        let dir = std::env::temp_dir().join(format!("ctxguard-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, "sk-test-123\n").unwrap();
        assert_eq!(read_secret_file(&file).unwrap(), "sk-test-123");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_secret_file(&file).unwrap_err().contains("empty"));
        let missing = read_secret_file(&dir.join("nope")).unwrap_err();
        assert!(missing.contains("cannot read"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn root_is_never_the_stdio_user() {
        assert!(StdioUser::resolve("root").unwrap_err().contains("root"));
        assert!(StdioUser::resolve("0").unwrap_err().contains("root"));
        assert!(StdioUser::resolve("no-such-user-ctxguard")
            .unwrap_err()
            .contains("no such user"));
    }
}
