//! Host names and origins as the settings name them (`CTXGUARD_LINK_ALLOWLIST`,
//! `CTXGUARD_MCP_ALLOWED_ORIGINS`): parsed here so that the configuration can refuse bad entries at
//! startup; answer hygiene (`chat::hygiene`) and the `/mcp` guard (`http::origin`) judge by them.

use url::Url;

/// The host a browser would use for `entry` (IDNA-mapped, lower-cased, without a trailing dot), or
/// `None` if it is not a host name or address.
pub fn normalise_host(entry: &str) -> Option<String> {
    let entry = entry.trim();
    if entry.is_empty() || entry.contains(['/', '\\', '@', '?', '#']) {
        return None;
    }
    let url = Url::parse(&format!("http://{entry}/")).ok()?;
    url.host_str()
        .map(|h| h.trim_end_matches('.').to_string())
        .filter(|h| !h.is_empty())
}

/// An allowed origin: `null`, or (scheme, host, port) where port `None` is any port (`:*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    Null,
    Tuple {
        scheme: String,
        host: String,
        port: Option<u16>,
    },
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// `(scheme, host, port)` of an origin serialization (RFC 6454), the port filled in from the scheme.
fn parse_origin(value: &str) -> Option<(String, String, Option<u16>)> {
    let uri: axum::http::Uri = value.trim().parse().ok()?;
    // An origin has no path beyond `/`, no query.
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return None;
    }
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    if authority.as_str().contains('@') {
        return None;
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    if host.is_empty() {
        return None;
    }
    let port = authority.port_u16().or_else(|| default_port(&scheme));
    Some((scheme, host, port))
}

/// Parse an entry of `CTXGUARD_MCP_ALLOWED_ORIGINS`: `null`, `scheme://host:*`, or
/// `scheme://host[:port]` (without a port: the scheme's default port).
pub fn parse_allowed(entry: &str) -> Option<Allowed> {
    let entry = entry.trim();
    if entry.eq_ignore_ascii_case("null") {
        return Some(Allowed::Null);
    }
    if let Some(base) = entry.strip_suffix(":*") {
        let (scheme, host, _) = parse_origin(base)?;
        if base
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            return None;
        }
        return Some(Allowed::Tuple {
            scheme,
            host,
            port: None,
        });
    }
    let (scheme, host, port) = parse_origin(entry)?;
    port?;
    Some(Allowed::Tuple { scheme, host, port })
}

/// Whether an `Origin` header value is one of `allowed`.
pub fn origin_allowed(value: &str, allowed: &[Allowed]) -> bool {
    if value.trim().eq_ignore_ascii_case("null") {
        return allowed.contains(&Allowed::Null);
    }
    let Some((scheme, host, port)) = parse_origin(value) else {
        return false;
    };
    allowed.iter().any(|a| match a {
        Allowed::Null => false,
        Allowed::Tuple {
            scheme: s,
            host: h,
            port: p,
        } => *s == scheme && *h == host && (p.is_none() || *p == port),
    })
}
