//! Where the gateway is, as its clients see it (`CTXGUARD_PUBLIC_URL`), and everything it
//! advertises from that: the MCP resource, its RFC 9728 protected-resource metadata and the
//! `WWW-Authenticate` challenge that points at it. Nothing here is built from request headers: behind
//! TLS or a proxy the request's `Host` and scheme are not the public ones, and a `Host` is not trusted
//! before the allow-list has judged it.

use serde_json::{json, Value};

/// The well-known path of protected-resource metadata (RFC 9728 §3).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The gateway's public base URL: `scheme://host[:port]` and an optional path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    /// `scheme://host[:port]`, no trailing slash.
    origin: String,
    /// `""` or `/a/b` (no trailing slash): where a reverse proxy mounts the gateway.
    prefix: String,
    /// `host[:port]` as a `Host` header names it (for the allow-list).
    authority: String,
    /// Documentation of the resource (`resource_documentation`).
    documentation: String,
}

impl PublicUrl {
    /// Parse `CTXGUARD_PUBLIC_URL` (`http(s)://host[:port][/prefix]`, nothing else); unset: the
    /// listen address over `http`.
    pub fn new(
        configured: Option<&str>,
        listen: std::net::SocketAddr,
        documentation: Option<&str>,
    ) -> Result<PublicUrl, String> {
        let raw = match configured.map(str::trim).filter(|s| !s.is_empty()) {
            Some(s) => s.to_string(),
            None => format!("http://{listen}"),
        };
        let bad = || {
            "CTXGUARD_PUBLIC_URL must be http(s)://host[:port][/path], without user, query or fragment"
                .to_string()
        };
        let url = url::Url::parse(&raw).map_err(|_| bad())?;
        if !matches!(url.scheme(), "http" | "https")
            || url.host_str().is_none_or(str::is_empty)
            || !url.username().is_empty()
            || url.password().is_some()
            || url.query().is_some()
            || url.fragment().is_some()
        {
            return Err(bad());
        }
        let host = url.host_str().unwrap_or_default();
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let origin = format!("{}://{authority}", url.scheme());
        let prefix = url.path().trim_end_matches('/').to_string();
        let documentation = match documentation.map(str::trim).filter(|s| !s.is_empty()) {
            Some(d) => {
                let d = url::Url::parse(d).map_err(|_| {
                    "CTXGUARD_MCP_DOCUMENTATION_URL must be an http(s) URL".to_string()
                })?;
                if !matches!(d.scheme(), "http" | "https") {
                    return Err("CTXGUARD_MCP_DOCUMENTATION_URL must be an http(s) URL".into());
                }
                d.to_string()
            }
            None => format!("{}#mcp", env!("CARGO_PKG_REPOSITORY")),
        };
        Ok(PublicUrl {
            origin,
            prefix,
            authority,
            documentation,
        })
    }

    /// The public URL of a path of the gateway (`/mcp` → `https://example.com/prefix/mcp`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}{path}", self.origin, self.prefix)
    }

    /// `host[:port]` of the public URL, which `/mcp` always answers to.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The MCP resource: the URL clients connect to.
    pub fn mcp_resource(&self) -> String {
        self.url("/mcp")
    }

    /// Where the metadata of the MCP resource is (RFC 9728 §3.1: the well-known path goes between
    /// the host and the resource's path).
    pub fn mcp_metadata_url(&self) -> String {
        format!("{}{METADATA_PATH}{}/mcp", self.origin, self.prefix)
    }

    /// The gateway's own paths the metadata is served at, each with the resource it describes:
    /// `{METADATA_PATH}{p}` describes `{origin}{p}` (RFC 9728 §3.3: `resource` must be the URL the
    /// metadata's address was derived from). A proxy may forward the well-known path with or without
    /// the prefix, so both are served.
    pub fn metadata_routes(&self) -> Vec<(String, String)> {
        let mut routes = vec![
            (METADATA_PATH.to_string(), self.origin.clone()),
            (
                format!("{METADATA_PATH}/mcp"),
                format!("{}/mcp", self.origin),
            ),
        ];
        if !self.prefix.is_empty() {
            routes[1].1 = self.mcp_resource();
            routes.push((format!("{METADATA_PATH}{}", self.prefix), self.url("")));
            routes.push((
                format!("{METADATA_PATH}{}/mcp", self.prefix),
                self.mcp_resource(),
            ));
        }
        routes
    }

    /// RFC 9728 protected-resource metadata for `resource`.
    pub fn metadata(&self, resource: &str) -> Value {
        json!({
            "resource": resource,
            "bearer_methods_supported": ["header"],
            "authorization_servers": [],
            "resource_name": "ctxguard",
            "resource_documentation": self.documentation,
        })
    }

    /// The `WWW-Authenticate` value of a 401 from `/mcp` (RFC 6750 §3, RFC 9728 §5.1):
    /// `error="invalid_token"` only when a token was sent.
    pub fn challenge(&self, token_sent: bool) -> String {
        let error = if token_sent {
            ", error=\"invalid_token\""
        } else {
            ""
        };
        format!(
            "Bearer realm=\"ctxguard\"{error}, resource_metadata=\"{}\"",
            self.mcp_metadata_url()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen() -> std::net::SocketAddr {
        "127.0.0.1:8088".parse().unwrap()
    }

    #[test]
    fn unset_is_the_listen_address_over_http() {
        let p = PublicUrl::new(None, listen(), None).unwrap();
        assert_eq!(p.mcp_resource(), "http://127.0.0.1:8088/mcp");
        assert_eq!(
            p.mcp_metadata_url(),
            "http://127.0.0.1:8088/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(p.authority(), "127.0.0.1:8088");
        assert!(p.metadata("x")["resource_documentation"]
            .as_str()
            .unwrap()
            .starts_with("http"));
    }

    #[test]
    fn a_prefix_goes_after_the_well_known_path_and_resources_match_their_address() {
        let p = PublicUrl::new(Some("https://ai.example.com/ctxguard/"), listen(), None).unwrap();
        assert_eq!(p.mcp_resource(), "https://ai.example.com/ctxguard/mcp");
        assert_eq!(
            p.mcp_metadata_url(),
            "https://ai.example.com/.well-known/oauth-protected-resource/ctxguard/mcp"
        );
        assert_eq!(p.authority(), "ai.example.com");
        let routes = p.metadata_routes();
        assert!(routes.contains(&(
            "/.well-known/oauth-protected-resource/ctxguard/mcp".into(),
            "https://ai.example.com/ctxguard/mcp".into()
        )));
        assert!(routes.contains(&(
            "/.well-known/oauth-protected-resource".into(),
            "https://ai.example.com".into()
        )));
        assert!(p.challenge(true).contains("error=\"invalid_token\""));
        assert!(!p.challenge(false).contains("error="));
        assert!(p
            .challenge(false)
            .contains("resource_metadata=\"https://ai.example.com/.well-known/oauth-protected-resource/ctxguard/mcp\""));
    }

    #[test]
    fn anything_but_a_plain_http_url_is_refused() {
        for bad in [
            "ftp://x.example",
            "https://user:pw@x.example",
            "https://x.example/?q=1",
            "https://x.example/#f",
            "not a url",
            "https://",
        ] {
            assert!(PublicUrl::new(Some(bad), listen(), None).is_err(), "{bad}");
        }
        assert!(PublicUrl::new(None, listen(), Some("javascript:alert(1)")).is_err());
    }
}
