//! DNS-rebinding and cross-origin protection of `/mcp`: the `Host` must be an allowed one
//! (`CTXGUARD_MCP_ALLOWED_HOSTS` and the public URL's host), and a present `Origin` must be one of
//! `CTXGUARD_MCP_ALLOWED_ORIGINS` (a request without `Origin` comes from a non-browser client and
//! passes). Refusals are 403 with the API's JSON error (`HOST_NOT_ALLOWED`, `ORIGIN_NOT_ALLOWED`),
//! before authentication or any database work.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::http::AppState;

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

/// What `/mcp` accepts: hosts and origins, parsed once.
pub struct Guard {
    hosts: Vec<String>,
    origins: Vec<Allowed>,
}

impl Guard {
    pub fn new(
        config: &crate::config::Config,
        public: &crate::config::public_url::PublicUrl,
    ) -> Guard {
        let mut hosts = config.mcp_allowed_hosts();
        hosts.push(public.authority().to_string());
        Guard {
            hosts,
            origins: config
                .mcp_allowed_origins()
                .iter()
                .filter_map(|o| parse_allowed(o))
                .collect(),
        }
    }

    /// The hosts `/mcp` answers to.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// `None` if the request may go on, else the refusal.
    pub fn check(&self, headers: &HeaderMap) -> Option<ApiError> {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if !crate::http::demo::host_allowed(host, &self.hosts) {
            return Some(ApiError::HostNotAllowed);
        }
        let mut origins = headers.get_all(header::ORIGIN).iter();
        match (origins.next(), origins.next()) {
            (None, _) => None,
            (Some(o), None) if o.to_str().is_ok_and(|o| origin_allowed(o, &self.origins)) => None,
            _ => Some(ApiError::OriginNotAllowed),
        }
    }
}

/// Middleware on `/mcp` (outermost): Host and Origin before anything else.
pub async fn guard(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    match state.mcp_guard.check(req.headers()) {
        None => next.run(req).await,
        Some(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(list: &[&str]) -> Vec<Allowed> {
        list.iter().map(|o| parse_allowed(o).unwrap()).collect()
    }

    #[test]
    fn origins_match_by_scheme_host_and_port() {
        let a = allowed(&["https://app.example.com", "http://localhost:*", "null"]);
        for ok in [
            "https://app.example.com",
            "https://APP.example.com:443",
            "http://localhost:3000",
            "http://localhost",
            "null",
        ] {
            assert!(origin_allowed(ok, &a), "{ok}");
        }
        for bad in [
            "http://evil.example.com",
            "http://app.example.com",
            "https://app.example.com:8443",
            "https://app.example.com.evil.example",
            "https://localhost:3000",
            "https://user@app.example.com",
            "https://app.example.com/path",
            "",
            "garbage",
        ] {
            assert!(!origin_allowed(bad, &a), "{bad}");
        }
        assert!(!origin_allowed("null", &allowed(&["http://localhost:*"])));
        assert!(!origin_allowed("http://localhost", &[]));
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in [
            "localhost",
            "https://x.example:443:*",
            "*",
            "https://x.example/p",
        ] {
            assert_eq!(parse_allowed(bad), None, "{bad}");
        }
    }
}
