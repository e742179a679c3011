//! Seed 004's legacy context message, parsed strictly into the page-context contract:
//!
//! ```text
//! [CONTEXT] The user has selected matter "Smith v. Jones" (matter_id: 25e70284-…).
//! The user is currently viewing document "Service Agreement.pdf" (document_id: f47ac10b-…).
//! ```
//! Matter only → `matter_overview` with entity `matter`; with a document → `document_viewer` with entity
//! `document` within the `matter` (`entity.within`). Anything after the block is the user's question.
//!
//! Every id is checked by the database, not here: `set_context` refuses a matter outside the user's
//! tenant, and a document that is not that matter's own, with the same refusal as a foreign matter.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{json, Value};

static BLOCK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?s)\A\[CONTEXT\] The user has selected matter "[^"\n]{1,200}" \(matter_id: ([0-9a-fA-F-]{36})\)\.(?:\nThe user is currently viewing document "[^"\n]{1,200}" \(document_id: ([0-9A-Za-z_-]{1,128})\)\.)?(?:\n+(.*))?\z"#,
    )
    .expect("regex")
});

/// `Ok(None)`: not a legacy context message. `Err`: it starts like one but is malformed.
pub fn parse(message: &str) -> Result<Option<(Value, String)>, String> {
    if !message.starts_with("[CONTEXT]") {
        return Ok(None);
    }
    let c = BLOCK
        .captures(message)
        .ok_or("malformed [CONTEXT] message")?;
    let matter = &c[1];
    if uuid::Uuid::parse_str(matter).is_err() {
        return Err("matter_id must be a UUID".into());
    }
    let question = c
        .get(3)
        .map(|m| m.as_str().trim().to_string())
        .unwrap_or_default();
    let matter = matter.to_ascii_lowercase();
    let page = match c.get(2) {
        Some(doc) => json!({"pageType": "document_viewer", "entity": {
            "type": "document", "id": doc.as_str(), "within": {"type": "matter", "id": matter}}}),
        None => json!({"pageType": "matter_overview", "entity": {"type": "matter", "id": matter}}),
    };
    Ok(Some((page, question)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms_strictly() {
        let (p, q) = parse("[CONTEXT] The user has selected matter \"Smith v. Jones\" (matter_id: 25e70284-6124-4a2b-9c89-abc123def456).\nsummarize the matter").unwrap().unwrap();
        assert_eq!(
            p,
            json!({"pageType": "matter_overview", "entity": {"type": "matter", "id": "25e70284-6124-4a2b-9c89-abc123def456"}})
        );
        assert_eq!(q, "summarize the matter");
        let (p, _) = parse("[CONTEXT] The user has selected matter \"Smith v. Jones\" (matter_id: 25e70284-6124-4a2b-9c89-abc123def456).\nThe user is currently viewing document \"Service Agreement.pdf\" (document_id: smith_agreement).").unwrap().unwrap();
        assert_eq!(
            p["entity"],
            json!({"type": "document", "id": "smith_agreement",
                   "within": {"type": "matter", "id": "25e70284-6124-4a2b-9c89-abc123def456"}})
        );
        assert_eq!(parse("hello").unwrap(), None);
        for bad in [
            "[CONTEXT] The user has selected matter \"X\" (matter_id: 1; DROP TABLE x).",
            "[CONTEXT] The user has selected matter \"X\" (matter_id: zzzzzzzz-6124-4a2b-9c89-abc123def456).",
            "[CONTEXT] something else",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
