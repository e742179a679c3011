//! Identifier rules shared by every input: catalog names and entity ids.
//!
//! Catalog names (page types, entity types, tools, roles, states, tool argument names) are lower-case
//! ASCII words joined by `_`, `-` or `.` namespaces. Entity ids are 1..=128 printable ASCII characters
//! without spaces, which rules out control, invisible (zero-width, bidi) and look-alike (fullwidth)
//! characters by construction.

pub const MAX_NAME_LEN: usize = 64;
pub const MAX_ID_LEN: usize = 128;

/// `^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*$`, at most [`MAX_NAME_LEN`] bytes.
pub fn is_valid_name(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_NAME_LEN {
        return false;
    }
    s.split('.').all(|seg| {
        let mut chars = seg.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_lowercase())
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    })
}

/// Like [`is_valid_name`] but also allows upper case and `:` (role and state names such as
/// `ORG_ADMIN` or `project-loaded` come from identity providers and UIs).
pub fn is_valid_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// Entity and identity ids: 1..=[`MAX_ID_LEN`] bytes of printable ASCII (`!`..=`~`).
pub fn is_valid_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_ID_LEN && s.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "invoice_detail",
            "vendor.list",
            "a",
            "crm.contacts.search",
            "x-1",
        ] {
            assert!(is_valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Invoice",
            "1abc",
            "a..b",
            ".a",
            "a.",
            "a b",
            "a;drop",
            &"a".repeat(65),
        ] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn ids_reject_invisible_and_lookalike_characters() {
        for ok in ["inv_1", "25e70284-6124-4a2b-9c89-abc123def456", "42", "a@b"] {
            assert!(is_valid_id(ok), "{ok}");
        }
        for bad in [
            "",
            " inv_1",
            "inv_1 ",
            "inv\u{200b}_1",
            "inv_\u{ff11}",
            "inv\t1",
            "inv\n1",
            "\u{202e}1vni",
            "in\u{0}v",
            &"x".repeat(129),
        ] {
            assert!(!is_valid_id(bad), "{bad:?}");
        }
    }
}
