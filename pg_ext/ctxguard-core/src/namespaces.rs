//! Tool namespaces (issue 31): which namespace a tool is in, and what a namespace and a tool search
//! may be given.
//!
//! A tool's namespace is the first segment of its name (`invoice.mark_paid` is in `invoice`); an
//! upstream MCP server's tool is in its server's namespace (which is the same segment: discovery
//! names them `server.tool`). A name without a dot (`read_doc_metadata`) is a namespace of its own.
//! The DBA may describe a namespace (`ctxguard.register_namespace`); nothing here decides what is
//! visible: namespaces are counted and searched over Gate A's tools only.

use crate::names::is_valid_name;

/// The namespace of the tool called `name`, of upstream server `server` if it has one.
pub fn namespace_of<'a>(name: &'a str, server: Option<&'a str>) -> &'a str {
    match server {
        Some(s) => s,
        None => name.split('.').next().unwrap_or(name),
    }
}

/// A namespace name: one segment of a tool name (`[a-z][a-z0-9_-]*`, at most 64 bytes, no dot).
pub fn is_valid_namespace(s: &str) -> bool {
    !s.contains('.') && is_valid_name(s)
}

/// Most bytes of a `find_tools` query (checked before it is read; SQLSTATE 54000 beyond).
pub const MAX_QUERY_BYTES: usize = 4096;
/// Most tools one `find_tools` call returns (`top_k` 1 ..= this; SQLSTATE 22023 beyond).
pub const MAX_FIND_TOP_K: i32 = 100;

/// Why a `find_tools` request is refused (never quoting the query).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    #[error("query is longer than 4096 bytes")]
    QueryTooLong,
    #[error("top_k must be between 1 and 100")]
    TopK,
}

/// Check a `find_tools` request: the query's size (before anything reads it) and `top_k`.
/// Returns the query's words as an OR text-search query (see [`crate::ranking::or_query`]);
/// `None` when it has no word to search for (then nothing matches).
pub fn check_find(query: Option<&str>, top_k: i32) -> Result<Option<String>, FindError> {
    if query.is_some_and(|q| q.len() > MAX_QUERY_BYTES) {
        return Err(FindError::QueryTooLong);
    }
    if !(1..=MAX_FIND_TOP_K).contains(&top_k) {
        return Err(FindError::TopK);
    }
    Ok(query.and_then(crate::ranking::or_query))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_namespace_is_its_first_segment_or_its_server() {
        assert_eq!(namespace_of("invoice.mark_paid", None), "invoice");
        assert_eq!(namespace_of("crm.contacts.search", None), "crm");
        assert_eq!(namespace_of("read_doc_metadata", None), "read_doc_metadata");
        assert_eq!(namespace_of("scans.read_scan", Some("scans")), "scans");
        // The server decides for an upstream tool, whatever its name says.
        assert_eq!(namespace_of("invoice.fake", Some("evil")), "evil");
    }

    #[test]
    fn namespace_names_are_one_name_segment() {
        for ok in ["invoice", "crm", "read_doc_metadata", "x-1", "a"] {
            assert!(is_valid_namespace(ok), "{ok}");
        }
        for bad in [
            "",
            "invoice.get",
            "Invoice",
            "1abc",
            ".a",
            "a.",
            "a b",
            "ïnvoice",
            "in\u{200b}voice",
            &"a".repeat(65),
        ] {
            assert!(!is_valid_namespace(bad), "{bad:?}");
        }
    }

    #[test]
    fn find_requests_are_bounded_before_they_are_read() {
        assert_eq!(
            check_find(Some("mark the invoice paid"), 5),
            Ok(Some("mark | the | invoice | paid".to_string()))
        );
        assert_eq!(check_find(None, 5), Ok(None));
        assert_eq!(check_find(Some("  !? "), 5), Ok(None));
        let long = "a".repeat(MAX_QUERY_BYTES + 1);
        assert_eq!(check_find(Some(&long), 5), Err(FindError::QueryTooLong));
        // The limit is in bytes: 1366 three-byte characters are over it.
        let wide = "€".repeat(1366);
        assert_eq!(check_find(Some(&wide), 5), Err(FindError::QueryTooLong));
        assert!(check_find(Some(&"a ".repeat(MAX_QUERY_BYTES / 2)), 5).is_ok());
        for k in [0, -1, MAX_FIND_TOP_K + 1, i32::MIN, i32::MAX] {
            assert_eq!(check_find(Some("x"), k), Err(FindError::TopK), "{k}");
        }
        assert!(check_find(Some("x"), MAX_FIND_TOP_K).is_ok());
    }
}
