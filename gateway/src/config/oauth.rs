//! MCP authorization (issue 19 §4): which OpenID provider(s) issue the tokens `/mcp` accepts, and
//! the scopes clients should ask for. Only advertised, never verified here: the database verifies
//! every token with the provider's keys (`ctxguard.jwks_file`), and the gateway keeps no key.
//!
//! - `CTXGUARD_OAUTH_ISSUER`: issuer URL(s), comma-separated, exactly as each provider's
//!   `issuer` reads (MCP clients compare them). Listed as `authorization_servers` in the protected
//!   resource metadata (RFC 9728), so a client sent a 401 finds where to sign the user in.
//! - `CTXGUARD_OAUTH_SCOPES`: scopes (comma- or space-separated), listed as `scopes_supported`
//!   and in the 401 challenge's `scope` (RFC 6750 §3).

use serde_json::{json, Value};

use crate::config::Config;

/// The advertised authorization servers and scopes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuth {
    pub issuers: Vec<String>,
    pub scopes: Vec<String>,
}

fn split(s: &str) -> impl Iterator<Item = &str> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|v| !v.is_empty())
}

impl OAuth {
    /// From the configuration: issuers must be https URLs (http only to a loopback host), without
    /// query or fragment; scopes must be RFC 6749 scope tokens.
    pub fn from_config(config: &Config) -> Result<OAuth, String> {
        let mut oauth = OAuth::default();
        for issuer in split(config.oauth_issuer.as_deref().unwrap_or_default()) {
            let url = url::Url::parse(issuer)
                .map_err(|_| format!("CTXGUARD_OAUTH_ISSUER: {issuer:?} is not a URL"))?;
            let loopback = match url.host() {
                Some(url::Host::Domain(d)) => d == "localhost",
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                None => false,
            };
            let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
            if !scheme_ok || url.query().is_some() || url.fragment().is_some() {
                return Err(format!(
                    "CTXGUARD_OAUTH_ISSUER: {issuer:?} must be an https URL (http only to a loopback host) without query or fragment"
                ));
            }
            oauth.issuers.push(issuer.to_string());
        }
        for scope in split(config.oauth_scopes.as_deref().unwrap_or_default()) {
            // RFC 6749 §3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E )
            if !scope
                .bytes()
                .all(|b| b == 0x21 || (0x23..=0x5B).contains(&b) || (0x5D..=0x7E).contains(&b))
            {
                return Err(format!(
                    "CTXGUARD_OAUTH_SCOPES: {scope:?} is not a scope token"
                ));
            }
            oauth.scopes.push(scope.to_string());
        }
        Ok(oauth)
    }

    /// Members of the protected resource metadata: `authorization_servers`, and
    /// `scopes_supported` when scopes are configured.
    pub fn metadata(&self, mut doc: Value) -> Value {
        doc["authorization_servers"] = json!(self.issuers);
        if !self.scopes.is_empty() {
            doc["scopes_supported"] = json!(self.scopes);
        }
        doc
    }

    /// The `scope` attribute of a bearer challenge (with its leading `, `), or nothing.
    pub fn challenge_scope(&self) -> String {
        if self.scopes.is_empty() {
            String::new()
        } else {
            format!(", scope=\"{}\"", self.scopes.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn oauth(issuer: &str, scopes: &str) -> Result<OAuth, String> {
        let config = Config::try_parse_from([
            "ctxguard-gateway",
            "--database-url",
            "host=/nonexistent",
            "--oauth-issuer",
            issuer,
            "--oauth-scopes",
            scopes,
        ])
        .unwrap();
        OAuth::from_config(&config)
    }

    #[test]
    fn issuers_and_scopes() {
        let o = oauth(
            "https://id.example.com/, https://login.example.org/realms/acme",
            "ctxguard openid",
        )
        .unwrap();
        assert_eq!(
            o.issuers,
            [
                "https://id.example.com/",
                "https://login.example.org/realms/acme"
            ]
        );
        assert_eq!(o.challenge_scope(), ", scope=\"ctxguard openid\"");
        let doc = o.metadata(json!({"resource": "https://gw.example/mcp"}));
        assert_eq!(
            doc["authorization_servers"][1],
            "https://login.example.org/realms/acme"
        );
        assert_eq!(doc["scopes_supported"], json!(["ctxguard", "openid"]));
        assert!(oauth("http://127.0.0.1:8080", "").is_ok());
        assert_eq!(oauth("", "").unwrap(), OAuth::default());
        assert_eq!(OAuth::default().challenge_scope(), "");
        for bad in [
            "http://id.example.com",
            "https://id.example.com/?x=1",
            "https://id.example.com/#f",
            "not a url",
            "ftp://id.example.com",
        ] {
            assert!(oauth(bad, "").is_err(), "{bad}");
        }
        assert!(oauth("", "a\"b").is_err());
        assert!(oauth("", "a\\b").is_err());
    }
}
