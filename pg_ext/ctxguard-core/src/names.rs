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

/// Longest catalog description (of a tool, page type or namespace), in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 4000;
/// Longest title (of a tool or namespace), in characters.
pub const MAX_TITLE_CHARS: usize = 128;

/// A catalog description: not blank, at most [`MAX_DESCRIPTION_BYTES`] (its size is checked
/// first, so a huge one is refused without being read). The error is the message (never the text).
pub fn check_description(d: &str) -> Result<(), &'static str> {
    if d.len() > MAX_DESCRIPTION_BYTES || d.trim().is_empty() {
        return Err("description must be non-empty and at most 4000 bytes");
    }
    Ok(())
}

/// A title: 1-[`MAX_TITLE_CHARS`] characters, not blank, without control characters (its size in
/// bytes is checked first: more than four bytes a character cannot be within the limit).
pub fn check_title(t: &str) -> Result<(), &'static str> {
    if t.len() > 4 * MAX_TITLE_CHARS
        || t.trim().is_empty()
        || t.chars().count() > MAX_TITLE_CHARS
        || t.chars().any(char::is_control)
    {
        return Err("title must be 1-128 characters without control characters");
    }
    Ok(())
}

/// Characters that change how text around them displays or reads without being visible: control
/// characters (C0, DEL, C1), format characters (bidi embeddings, overrides and isolates, zero-width
/// space/joiners, word joiner, BOM, soft hyphen, tag characters, ...), line and paragraph
/// separators, variation selectors and the blank fillers that render as nothing.
pub fn is_invisible(c: char) -> bool {
    c.is_control()
        || matches!(
            c as u32,
            0x00AD
                | 0x034F
                | 0x0600..=0x0605
                | 0x061C
                | 0x06DD
                | 0x070F
                | 0x0890..=0x0891
                | 0x08E2
                | 0x115F..=0x1160
                | 0x17B4..=0x17B5
                | 0x180B..=0x180F
                | 0x200B..=0x200F
                | 0x2028..=0x202E
                | 0x2060..=0x206F
                | 0x3164
                | 0xFE00..=0xFE0F
                | 0xFEFF
                | 0xFFA0
                | 0xFFF9..=0xFFFB
                | 0x110BD
                | 0x110CD
                | 0x13430..=0x1343F
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0000..=0xE0FFF
        )
}

/// Free text (a filter value) without invisible characters (see [`is_invisible`]).
pub fn is_visible_text(s: &str) -> bool {
    !s.chars().any(is_invisible)
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
    fn catalog_text_is_bounded_and_printable() {
        assert!(check_description("Invoices: read and pay.").is_ok());
        assert!(check_description(&"é".repeat(2000)).is_ok());
        for bad in ["", "   ", "\n\t"] {
            assert!(check_description(bad).is_err(), "{bad:?}");
        }
        assert!(check_description(&"x".repeat(MAX_DESCRIPTION_BYTES + 1)).is_err());
        assert!(check_description(&"é".repeat(2001)).is_err());
        for ok in ["Invoices", "Rechnungen & Zahlungen", &"日".repeat(128)] {
            assert!(check_title(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "",
            "  ",
            "a\nb",
            "a\u{7}b",
            "a\u{85}b",
            &"x".repeat(129),
            &"日".repeat(129),
        ] {
            assert!(check_title(bad).is_err(), "{bad:?}");
        }
        // Refused by its size alone.
        assert!(check_title(&"x".repeat(1 << 20)).is_err());
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

    #[test]
    fn visible_text_refuses_control_bidi_and_zero_width_characters() {
        for ok in [
            "open",
            "Настройка LDAP",
            "日本語",
            "a b",
            "émoji 🙂",
            "x\u{00A0}y",
        ] {
            assert!(is_visible_text(ok), "{ok:?}");
        }
        for bad in [
            "a\u{0}b",
            "a\tb",
            "a\nb",
            "a\u{7f}b",
            "a\u{85}b",
            "a\u{200b}b",
            "a\u{200c}b",
            "a\u{200d}b",
            "a\u{200e}b",
            "a\u{200f}b",
            "a\u{202a}b",
            "a\u{202e}b",
            "a\u{2066}b",
            "a\u{2069}b",
            "a\u{2060}b",
            "a\u{feff}b",
            "a\u{00ad}b",
            "a\u{061c}b",
            "a\u{2028}b",
            "a\u{2029}b",
            "a\u{180e}b",
            "a\u{fe0f}b",
            "a\u{e0041}b",
            "a\u{3164}b",
        ] {
            assert!(!is_visible_text(bad), "{bad:?}");
        }
    }
}
