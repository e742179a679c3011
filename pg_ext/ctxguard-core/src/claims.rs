//! Claim paths: where in a token's claims the tenant and the roles are
//! (`ctxguard.claim_tenant`, `ctxguard.claim_roles`).
//!
//! A path is one or more segments separated by `.`, each naming a member of a JSON object:
//! `tenant_id`, `app_metadata.tenant_id`, `realm_access.roles`. A segment that itself contains a
//! `.` (a namespaced claim such as `https://acme.example/roles`) is written in double quotes, as
//! in SQL identifiers and PostgreSQL's jsonpath: `"https://acme.example/roles"`,
//! `"https://acme.example/app".tenant`. Inside quotes, `""` stands for one `"`. Array indexes
//! are not supported: a path names object members only.

use serde_json::Value;

/// Longest path setting accepted, in bytes.
pub const MAX_PATH_LEN: usize = 256;
/// Most segments in a path.
pub const MAX_SEGMENTS: usize = 8;

/// A parsed claim path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPath(Vec<String>);

/// Why a claim path setting was refused (the setting, never a token, is at fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("claim path is invalid")]
pub struct BadPath;

impl ClaimPath {
    /// Parse a path setting (see the module documentation for the syntax).
    pub fn parse(text: &str) -> Result<ClaimPath, BadPath> {
        if text.is_empty() || text.len() > MAX_PATH_LEN || text.chars().any(char::is_control) {
            return Err(BadPath);
        }
        let mut segments = Vec::new();
        let mut chars = text.chars().peekable();
        loop {
            let mut seg = String::new();
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        Some('"') if chars.peek() == Some(&'"') => {
                            chars.next();
                            seg.push('"');
                        }
                        Some('"') => break,
                        Some(c) => seg.push(c),
                        None => return Err(BadPath), // unterminated quote
                    }
                }
                // After a closing quote: the end, or a separator.
                if !matches!(chars.peek(), None | Some('.')) {
                    return Err(BadPath);
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == '.' {
                        break;
                    }
                    if c == '"' {
                        return Err(BadPath); // a quote inside a bare segment
                    }
                    seg.push(c);
                    chars.next();
                }
            }
            if seg.is_empty() || seg.trim() != seg {
                return Err(BadPath);
            }
            segments.push(seg);
            if segments.len() > MAX_SEGMENTS {
                return Err(BadPath);
            }
            match chars.next() {
                None => break,
                Some('.') => continue,
                Some(_) => return Err(BadPath),
            }
        }
        Ok(ClaimPath(segments))
    }

    /// The value at this path in `claims`, if every segment names a member of an object.
    pub fn lookup<'a>(&self, claims: &'a Value) -> Option<&'a Value> {
        self.0
            .iter()
            .try_fold(claims, |v, seg| v.as_object()?.get(seg.as_str()))
    }

    /// The segments, unquoted.
    pub fn segments(&self) -> &[String] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn segs(p: &str) -> Vec<String> {
        ClaimPath::parse(p).unwrap().0
    }

    #[test]
    fn syntax() {
        assert_eq!(segs("tenant_id"), ["tenant_id"]);
        assert_eq!(segs("realm_access.roles"), ["realm_access", "roles"]);
        assert_eq!(
            segs(r#""https://acme.example/roles""#),
            ["https://acme.example/roles"]
        );
        assert_eq!(
            segs(r#""https://acme.example/app".tenant"#),
            ["https://acme.example/app", "tenant"]
        );
        assert_eq!(segs(r#"a."b.c".d"#), ["a", "b.c", "d"]);
        assert_eq!(segs(r#""say ""hi""""#), [r#"say "hi""#]);
        assert_eq!(segs("org:id"), ["org:id"]);
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a..b",
            r#""unterminated"#,
            r#"a"b"#,
            r#""a"b"#,
            r#""""#,
            " a",
            "a ",
            "a.\u{1}",
            "a.b.c.d.e.f.g.h.i",
        ] {
            assert_eq!(ClaimPath::parse(bad), Err(BadPath), "{bad:?}");
        }
        assert_eq!(
            ClaimPath::parse(&"a".repeat(MAX_PATH_LEN + 1)),
            Err(BadPath)
        );
        assert!(ClaimPath::parse("a.b.c.d.e.f.g.h").is_ok());
    }

    #[test]
    fn lookup() {
        let claims = json!({
            "tenant_id": "t0",
            "app_metadata": {"tenant_id": "t1"},
            "realm_access": {"roles": ["a", "b"]},
            "https://acme.example/roles": ["c"],
            "https://acme.example/app": {"tenant": "t2"},
            "list": [{"x": 1}],
        });
        let get = |p: &str| ClaimPath::parse(p).unwrap().lookup(&claims).cloned();
        assert_eq!(get("tenant_id"), Some(json!("t0")));
        assert_eq!(get("app_metadata.tenant_id"), Some(json!("t1")));
        assert_eq!(get("realm_access.roles"), Some(json!(["a", "b"])));
        assert_eq!(get(r#""https://acme.example/roles""#), Some(json!(["c"])));
        assert_eq!(
            get(r#""https://acme.example/app".tenant"#),
            Some(json!("t2"))
        );
        // Unquoted, the URL is split at its dots and names nothing.
        assert_eq!(get("https://acme.example/roles"), None);
        assert_eq!(get("missing"), None);
        assert_eq!(get("tenant_id.deeper"), None);
        assert_eq!(get("list.0"), None, "no array indexes");
    }
}
