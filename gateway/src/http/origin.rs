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

use crate::config::hosts::{origin_allowed, parse_allowed, Allowed};
use crate::error::ApiError;
use crate::http::AppState;

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
