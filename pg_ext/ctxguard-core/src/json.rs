//! Strict JSON: a document whose objects repeat a member (at any depth) is refused, and so is one
//! nested deeper than a fixed bound, with a reason the caller can map onto a stable code.
//!
//! `serde_json` keeps the last of repeated members (`{"tenant_id":"acme","tenant_id":"globex"}`
//! reads as `globex`), and so do PostgreSQL's `jsonb` and most JWT libraries; others keep the
//! first. Where two parsers may read the same text (a token minted by one library and verified by
//! another, a JWKS document served by one provider), a repeated member is a parser differential,
//! and RFC 7515 §4 and RFC 7519 §4 let a recipient refuse it. Members are compared after
//! unescaping, so `"tenant_id"` and `"tenant\u005fid"` are the same member.
//!
//! Depth is bounded by [`MAX_DEPTH`] (or a smaller bound of the caller's), below `serde_json`'s own
//! recursion limit of 128, so a deep document is a [`JsonError::TooDeep`], never a crash, and any
//! document accepted here can be read again by a plain `serde_json` parse (e.g. pgrx's `JsonB`).

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Deepest nesting of arrays and objects accepted (the top-level value is depth 1).
pub const MAX_DEPTH: usize = 100;

/// How `serde_json` (with `arbitrary_precision`, as in this workspace) hands a number to a
/// visitor: a one-member map whose key is this token and whose value is the number's text.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// Why a document was refused. Messages name the rule, never the document's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("not valid JSON")]
    Syntax,
    #[error("an object repeats a member")]
    Duplicate,
    #[error("nested too deeply")]
    TooDeep,
}

/// Parse `text` strictly (see the module documentation), nesting at most [`MAX_DEPTH`].
pub fn parse(text: &[u8]) -> Result<Value, JsonError> {
    parse_bounded(text, MAX_DEPTH)
}

/// [`parse`] with a depth bound of the caller's (at most [`MAX_DEPTH`]).
pub fn parse_bounded(text: &[u8], max_depth: usize) -> Result<Value, JsonError> {
    let fault = Cell::new(None);
    let seed = Strict {
        depth: 0,
        max: max_depth.min(MAX_DEPTH),
        fault: &fault,
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    let parsed = seed.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match parsed {
        Ok(v) => Ok(v),
        Err(e) => Err(fault.get().unwrap_or(
            // serde_json's own limit (128) cannot be reached first; kept as a safety net.
            if e.to_string().starts_with("recursion limit exceeded") {
                JsonError::TooDeep
            } else {
                JsonError::Syntax
            },
        )),
    }
}

/// Parse `text` strictly and require a JSON object at the top.
pub fn parse_object(text: &[u8]) -> Result<Map<String, Value>, JsonError> {
    match parse(text)? {
        Value::Object(m) => Ok(m),
        _ => Err(JsonError::Syntax),
    }
}

/// A value at `depth` (the number of arrays and objects around it).
#[derive(Clone, Copy)]
struct Strict<'f> {
    depth: usize,
    max: usize,
    fault: &'f Cell<Option<JsonError>>,
}

impl Strict<'_> {
    fn fail<E: serde::de::Error>(&self, why: JsonError) -> E {
        self.fault.set(Some(why));
        E::custom(why)
    }

    /// The seed for the members or elements of the container this seed is reading (itself the
    /// `depth + 1`th container from the top, which may not exceed the bound).
    fn inner(&self) -> Result<Self, JsonError> {
        if self.depth >= self.max {
            return Err(JsonError::TooDeep);
        }
        Ok(Strict {
            depth: self.depth + 1,
            ..*self
        })
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Value, E> {
        Number::from_f64(n)
            .map(Value::Number)
            .ok_or_else(|| self.fail(JsonError::Syntax))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.inner().map_err(|e| self.fail::<A::Error>(e))?;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(inner)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let Some(first) = map.next_key::<String>()? else {
            return self
                .inner()
                .map(|_| Value::Object(out))
                .map_err(|e| self.fail(e));
        };
        if first == NUMBER_TOKEN {
            // A number (its text, exactly as written), or a document naming the token itself,
            // read as serde_json's own `Value` would: a number if its value is number text.
            let text: String = map.next_value()?;
            let n: Number = text.parse().map_err(|_| self.fail(JsonError::Syntax))?;
            if map.next_key::<String>()?.is_some() {
                return Err(self.fail(JsonError::Syntax));
            }
            return Ok(Value::Number(n));
        }
        let inner = self.inner().map_err(|e| self.fail::<A::Error>(e))?;
        out.insert(first, map.next_value_seed(inner)?);
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(self.fail(JsonError::Duplicate));
            }
            let v = map.next_value_seed(inner)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(n: usize) -> String {
        format!("{}1{}", "[".repeat(n), "]".repeat(n))
    }

    fn nested_objects(n: usize) -> String {
        format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n))
    }

    #[test]
    fn reads_what_serde_json_reads() {
        for text in [
            r#"{"a": 1, "b": [true, null, "x\u00e9", 1.5e300, -0, 123456789012345678901234567890], "c": {"d": {}}, "e": []}"#,
            r#"[1, 2.50, -3]"#,
            r#""just a string""#,
            "7",
            "null",
            r#"{"a": {"b": 1}, "b": {"b": 2}}"#,
            // Numbers keep their text (arbitrary_precision), as serde_json's own Value does.
            r#"{"n": 1.000, "big": 18446744073709551616}"#,
        ] {
            let want: Value = serde_json::from_str(text).unwrap();
            let got = parse(text.as_bytes()).unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string(), want.to_string(), "{text}");
        }
    }

    #[test]
    fn repeated_members_are_refused_at_any_depth() {
        for text in [
            r#"{"tenant_id":"acme","tenant_id":"globex"}"#,
            r#"{"a":1,"b":2,"a":1}"#,
            r#"{"app":{"tenant_id":"acme","tenant_id":"globex"}}"#,
            r#"{"keys":[{"kty":"RSA"},{"kid":"a","kid":"b"}]}"#,
            r#"[[[{"x":{"y":[{"z":1,"z":1}]}}]]]"#,
            // The same member, escaped differently.
            r#"{"tenant_id":"acme","tenant\u005fid":"globex"}"#,
            r#"{"":1,"":2}"#,
        ] {
            assert_eq!(parse(text.as_bytes()), Err(JsonError::Duplicate), "{text}");
            // serde_json alone accepts it (the last value wins): the reason for this module.
            assert!(serde_json::from_str::<Value>(text).is_ok());
        }
        // Same member names in different objects are not repeats.
        assert!(parse(br#"{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}"#).is_ok());
    }

    #[test]
    fn depth_is_bounded_without_a_crash() {
        assert!(parse(nested(MAX_DEPTH).as_bytes()).is_ok());
        assert!(parse(nested_objects(MAX_DEPTH).as_bytes()).is_ok());
        for n in [MAX_DEPTH + 1, 127, 128, 129, 300, 100_000] {
            assert_eq!(parse(nested(n).as_bytes()), Err(JsonError::TooDeep), "{n}");
            assert_eq!(
                parse(nested_objects(n).as_bytes()),
                Err(JsonError::TooDeep),
                "{n}"
            );
        }
        // Empty containers count too.
        let empty = format!("{}{{}}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(parse(empty.as_bytes()), Err(JsonError::TooDeep));
        assert_eq!(parse_bounded(b"[[1]]", 1), Err(JsonError::TooDeep));
        assert_eq!(parse_bounded(br#"{"a":{}}"#, 1), Err(JsonError::TooDeep));
        assert!(parse_bounded(b"[[1]]", 2).is_ok());
        assert!(parse_bounded(br#"[{"a":[]}]"#, 3).is_ok());
        assert!(parse_bounded(b"1", 0).is_ok());
        assert_eq!(parse_bounded(b"[]", 0), Err(JsonError::TooDeep));
        // Anything accepted reads again with serde_json's own limit.
        let deepest = nested(MAX_DEPTH);
        assert!(serde_json::from_str::<Value>(&deepest).is_ok());
    }

    #[test]
    fn not_json_is_a_syntax_error() {
        for text in [
            &b""[..],
            b"{",
            b"{\"a\":1,}",
            b"[1] [2]",
            b"{\"a\":1} x",
            b"\xff",
            b"NaN",
            b"{'a':1}",
        ] {
            assert_eq!(parse(text), Err(JsonError::Syntax), "{text:?}");
        }
        assert_eq!(parse_object(b"[1]"), Err(JsonError::Syntax));
        assert_eq!(parse_object(br#"{"a":1}"#).unwrap()["a"], json!(1));
    }

    #[test]
    fn the_number_token_in_a_document_reads_as_serde_json_reads_it() {
        let key = NUMBER_TOKEN;
        let text = format!(r#"{{"{key}": "12"}}"#);
        assert_eq!(
            parse(text.as_bytes()).ok(),
            serde_json::from_str::<Value>(&text).ok()
        );
        for bad in [
            format!(r#"{{"{key}": "twelve"}}"#),
            format!(r#"{{"{key}": "1", "b": 2}}"#),
            format!(r#"{{"{key}": 1}}"#),
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
