//! The page-context contract of seed 000, validated strictly.
//!
//! ```json
//! {"pageType": "invoice_detail",
//!  "entity": {"type": "invoice", "id": "inv_1"} | null,
//!  (a document may also name what it lies within: {"type": "document", "id": "d1",
//!   "within": {"type": "matter", "id": "m1"}}; the database checks it is the document's own)
//!  "pageState": {"visibleIds": [..], "filters": {..}, "tab": "..", "counts": {..}},
//!  "states": ["..."]}
//! ```
//! Error messages name the rule that failed, never the offending value.

use serde_json::{Map, Value};

use crate::names::{is_valid_id, is_valid_label, is_valid_name, is_visible_text};

pub const MAX_VISIBLE_IDS: usize = 500;
pub const MAX_FILTERS: usize = 32;
pub const MAX_COUNTS: usize = 32;
pub const MAX_STATES: usize = 32;
pub const MAX_FILTER_VALUE_LEN: usize = 256;

/// What the page-type catalog says about one page type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageTypeInfo {
    /// `None` for list pages; `Some(type)` for detail pages.
    pub entity_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entity {
    pub kind: String,
    pub id: String,
}

/// A validated page context.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub page_type: String,
    pub entity: Option<Entity>,
    /// The entity the page's entity lies within (`entity.within`), e.g. a document's matter.
    pub within: Option<Entity>,
    /// Normalised `pageState` (always an object with the four keys).
    pub page_state: Value,
    pub states: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid page context: {0}")]
pub struct PageError(pub &'static str);

fn only_keys(
    obj: &Map<String, Value>,
    allowed: &[&str],
    err: &'static str,
) -> Result<(), PageError> {
    if obj.keys().all(|k| allowed.contains(&k.as_str())) {
        Ok(())
    } else {
        Err(PageError(err))
    }
}

fn scalar_ok(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => true,
        Value::String(s) => s.len() <= MAX_FILTER_VALUE_LEN,
        _ => false,
    }
}

/// Every string in a filter value is free of control, bidi and zero-width characters (page
/// state reaches the model's system prompt).
fn filter_text_ok(v: &Value) -> bool {
    match v {
        Value::String(s) => is_visible_text(s),
        Value::Array(a) => a.iter().all(filter_text_ok),
        _ => true,
    }
}

fn parse_page_state(v: Option<&Value>) -> Result<Value, PageError> {
    let mut out = Map::new();
    let obj = match v {
        None | Some(Value::Null) => &Map::new(),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(PageError("pageState must be an object")),
    };
    only_keys(
        obj,
        &["visibleIds", "filters", "tab", "counts"],
        "unknown key in pageState (allowed: visibleIds, filters, tab, counts)",
    )?;
    let ids = match obj.get("visibleIds") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) if a.len() <= MAX_VISIBLE_IDS => a
            .iter()
            .map(|id| match id {
                Value::String(s) if is_valid_id(s) => Ok(Value::String(s.clone())),
                Value::Number(n) if n.is_u64() || n.is_i64() => Ok(Value::String(n.to_string())),
                _ => Err(PageError("pageState.visibleIds must hold valid ids")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(PageError(
                "pageState.visibleIds must be an array of at most 500 ids",
            ))
        }
    };
    out.insert("visibleIds".into(), Value::Array(ids));
    let filters = match obj.get("filters") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(f))
            if f.len() <= MAX_FILTERS && f.iter().all(|(k, v)| {
                is_valid_label(k)
                    && (scalar_ok(v)
                        || matches!(v, Value::Array(a) if a.len() <= 50 && a.iter().all(scalar_ok)))
            }) =>
        {
            f.clone()
        }
        Some(_) => {
            return Err(PageError(
                "pageState.filters must map names to scalar values",
            ))
        }
    };
    if !filters.values().all(filter_text_ok) {
        return Err(PageError(
            "pageState.filters values must not contain control, bidi or zero-width characters",
        ));
    }
    out.insert("filters".into(), Value::Object(filters));
    let tab = match obj.get("tab") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(t)) if is_valid_label(t) => Value::String(t.clone()),
        Some(_) => return Err(PageError("pageState.tab must be a short name")),
    };
    out.insert("tab".into(), tab);
    let counts = match obj.get("counts") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(c))
            if c.len() <= MAX_COUNTS && c.iter().all(|(k, v)| is_valid_label(k) && v.is_u64()) =>
        {
            c.clone()
        }
        Some(_) => {
            return Err(PageError(
                "pageState.counts must map names to non-negative integers",
            ))
        }
    };
    out.insert("counts".into(), Value::Object(counts));
    Ok(Value::Object(out))
}

/// `type` and `id` of an entity object (its other keys are the caller's business).
fn parse_entity(e: &Map<String, Value>) -> Result<Entity, PageError> {
    let kind = match e.get("type") {
        Some(Value::String(t)) if is_valid_name(t) => t.clone(),
        _ => return Err(PageError("entity.type must be an entity type name")),
    };
    let id = match e.get("id") {
        Some(Value::String(id)) if is_valid_id(id) => id.clone(),
        _ => {
            return Err(PageError(
                "entity.id must be 1-128 printable ASCII characters",
            ))
        }
    };
    Ok(Entity { kind, id })
}

/// Validate `v` against the contract. `lookup` answers from `ctxguard.page_types`.
pub fn parse_page(
    v: &Value,
    lookup: impl Fn(&str) -> Option<PageTypeInfo>,
) -> Result<Page, PageError> {
    let obj = v
        .as_object()
        .ok_or(PageError("page must be a JSON object"))?;
    only_keys(
        obj,
        &["pageType", "entity", "pageState", "states"],
        "unknown key (allowed: pageType, entity, pageState, states)",
    )?;
    let page_type = match obj.get("pageType") {
        Some(Value::String(s)) if is_valid_name(s) => s.clone(),
        Some(Value::String(_)) => return Err(PageError("unknown page type")),
        _ => return Err(PageError("pageType is required and must be a string")),
    };
    let info = lookup(&page_type).ok_or(PageError("unknown page type"))?;
    let (entity, within) = match obj.get("entity") {
        None | Some(Value::Null) => (None, None),
        Some(Value::Object(e)) => {
            only_keys(
                e,
                &["type", "id", "within"],
                "unknown key in entity (allowed: type, id, within)",
            )?;
            let within = match e.get("within") {
                None | Some(Value::Null) => None,
                Some(Value::Object(w)) => {
                    only_keys(
                        w,
                        &["type", "id"],
                        "unknown key in entity.within (allowed: type, id)",
                    )?;
                    Some(parse_entity(w)?)
                }
                Some(_) => return Err(PageError("entity.within must be an object or null")),
            };
            (Some(parse_entity(e)?), within)
        }
        Some(_) => return Err(PageError("entity must be an object or null")),
    };
    match (&info.entity_type, &entity) {
        (None, Some(_)) => return Err(PageError("a list page cannot carry an entity")),
        (Some(_), None) => return Err(PageError("a detail page requires an entity")),
        (Some(want), Some(e)) if *want != e.kind => {
            return Err(PageError("entity type does not match the page type"))
        }
        _ => {}
    }
    let page_state = parse_page_state(obj.get("pageState"))?;
    let states = match obj.get("states") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) if a.len() <= MAX_STATES => {
            let mut states: Vec<String> = Vec::with_capacity(a.len());
            for s in a {
                match s {
                    Value::String(s) if is_valid_label(s) => {
                        if !states.contains(s) {
                            states.push(s.clone())
                        }
                    }
                    _ => return Err(PageError("states must be an array of state names")),
                }
            }
            states
        }
        Some(_) => {
            return Err(PageError(
                "states must be an array of at most 32 state names",
            ))
        }
    };
    Ok(Page {
        page_type,
        entity,
        within,
        page_state,
        states,
    })
}

impl Page {
    /// The page as stored in `ctxguard.context()` (contract field names).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "pageType": self.page_type,
            "entity": self.entity_json(),
            "pageState": self.page_state,
            "states": self.states,
        })
    }

    /// The entity as stored in the context: `{type, id}`, with `within` when the page names it.
    pub fn entity_json(&self) -> Value {
        match &self.entity {
            None => Value::Null,
            Some(e) => {
                let mut v = serde_json::json!({"type": e.kind, "id": e.id});
                if let Some(w) = &self.within {
                    v["within"] = serde_json::json!({"type": w.kind, "id": w.id});
                }
                v
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lookup(name: &str) -> Option<PageTypeInfo> {
        match name {
            "invoice_table" | "vendor_table" => Some(PageTypeInfo { entity_type: None }),
            "invoice_detail" => Some(PageTypeInfo {
                entity_type: Some("invoice".into()),
            }),
            _ => None,
        }
    }

    #[test]
    fn accepts_the_contract() {
        let p = parse_page(
            &json!({"pageType": "invoice_table", "entity": null,
                    "pageState": {"visibleIds": ["inv_1", 2], "filters": {"status": "open"}, "tab": "open", "counts": {"open": 3}},
                    "states": ["authenticated", "authenticated"]}),
            lookup,
        )
        .unwrap();
        assert_eq!(p.page_state["visibleIds"], json!(["inv_1", "2"]));
        assert_eq!(p.states, vec!["authenticated"]);
        let d = parse_page(
            &json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "inv_1"}}),
            lookup,
        )
        .unwrap();
        assert_eq!(
            d.entity,
            Some(Entity {
                kind: "invoice".into(),
                id: "inv_1".into()
            })
        );
        assert_eq!(d.to_json()["pageState"]["filters"], json!({}));
        assert_eq!(d.within, None);
        let w = parse_page(
            &json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "inv_1",
                    "within": {"type": "vendor", "id": "v1"}}}),
            lookup,
        )
        .unwrap();
        assert_eq!(
            w.within,
            Some(Entity {
                kind: "vendor".into(),
                id: "v1".into()
            })
        );
        assert_eq!(
            w.to_json()["entity"],
            json!({"type": "invoice", "id": "inv_1", "within": {"type": "vendor", "id": "v1"}})
        );
    }

    #[test]
    fn rejects_violations_without_echoing_values() {
        let secret = "s3cr3t-value";
        let cases = [
            json!([]),
            json!({"pageType": "invoice_table", "tenant_id": secret}),
            json!({"pageType": secret}),
            json!({"pageType": "nope"}),
            json!({"pageType": 3}),
            json!({}),
            json!({"pageType": "invoice_table", "entity": {"type": "invoice", "id": "inv_1"}}),
            json!({"pageType": "invoice_detail"}),
            json!({"pageType": "invoice_detail", "entity": null}),
            json!({"pageType": "invoice_detail", "entity": {"type": "vendor", "id": "v1"}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "x".repeat(129)}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "inv\u{200b}1"}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "inv\u{0007}1"}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": 5}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "i", "x": secret}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "i", "within": secret}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "i", "within": {"type": "v", "id": "x".repeat(129)}}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "i", "within": {"type": "v", "id": "1", "within": {"type": "w", "id": "2"}}}}),
            json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": "i", "within": {"type": format!("{secret} x"), "id": "1"}}}),
            json!({"pageType": "invoice_table", "pageState": {"secret": secret}}),
            json!({"pageType": "invoice_table", "pageState": {"visibleIds": [{"a": 1}]}}),
            json!({"pageType": "invoice_table", "pageState": {"filters": {"a": {"b": 1}}}}),
            json!({"pageType": "invoice_table", "pageState": {"counts": {"a": -1}}}),
            json!({"pageType": "invoice_table", "states": "x"}),
            json!({"pageType": "invoice_table", "states": ["a b"]}),
            json!({"pageType": "invoice_table", "pageState": {"tab": "open\u{200b}"}}),
            json!({"pageType": "invoice_table", "pageState": {"visibleIds": ["inv\u{202e}1"]}}),
            json!({"pageType": "invoice_table", "pageState": {"counts": {"open\u{200d}": 1}}}),
            json!({"pageType": "invoice_table", "pageState": {"filters": {"st\u{2066}atus": "open"}}}),
        ];
        for c in cases {
            let err = parse_page(&c, lookup).expect_err(&c.to_string());
            assert!(!err.to_string().contains(secret));
        }
    }

    #[test]
    fn page_state_text_with_invisible_characters_is_refused() {
        let want = "invalid page context: pageState.filters values must not contain control, bidi or zero-width characters";
        for value in [
            json!("open\u{202e}"),
            json!("a\u{200b}b"),
            json!("a\u{2066}b\u{2069}"),
            json!("\u{feff}x"),
            json!("line\nbreak"),
            json!("tab\there"),
            json!(["ok", "no\u{200d}"]),
        ] {
            let page = json!({"pageType": "invoice_table", "pageState": {"filters": {"q": value}}});
            let err = parse_page(&page, lookup).expect_err(&page.to_string());
            assert_eq!(err.to_string(), want, "{page}");
        }
        let ok = json!({"pageType": "invoice_table",
                        "pageState": {"filters": {"q": "Настройка LDAP", "tags": ["a b", "日本"], "n": 3}, "tab": "open"}});
        assert!(parse_page(&ok, lookup).is_ok());
    }
}
