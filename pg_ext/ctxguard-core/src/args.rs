//! Tool-argument checks before any handler runs: shape and size limits, unknown keys, JSON Schema.
//! Messages name the argument path and the failed rule, never the argument value.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Limits applied to every call (configurable through `ctxguard.max_arg_bytes`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_bytes: usize,
    pub max_depth: usize,
    pub max_string_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 16 * 1024,
            max_depth: 8,
            max_string_len: 4096,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArgError(pub String);

fn depth_and_strings(v: &Value, depth: usize, limits: &Limits) -> Result<(), ArgError> {
    if depth > limits.max_depth {
        return Err(ArgError(format!(
            "arguments are nested deeper than {}",
            limits.max_depth
        )));
    }
    match v {
        Value::String(s) if s.len() > limits.max_string_len => Err(ArgError(format!(
            "a string argument exceeds {} bytes",
            limits.max_string_len
        ))),
        Value::Array(a) => a
            .iter()
            .try_for_each(|x| depth_and_strings(x, depth + 1, limits)),
        Value::Object(o) => o
            .values()
            .try_for_each(|x| depth_and_strings(x, depth + 1, limits)),
        _ => Ok(()),
    }
}

/// Check size, depth and that `args` is an object whose keys are all declared in `schema.properties`.
/// `encoded_len` is the size of the arguments as received.
pub fn check_shape<'a>(
    args: &'a Value,
    encoded_len: usize,
    schema: &Value,
    limits: &Limits,
) -> Result<&'a Map<String, Value>, ArgError> {
    if encoded_len > limits.max_bytes {
        return Err(ArgError(format!(
            "arguments exceed {} bytes",
            limits.max_bytes
        )));
    }
    let obj = match args {
        Value::Object(o) => o,
        _ => return Err(ArgError("arguments must be a JSON object".into())),
    };
    depth_and_strings(args, 0, limits)?;
    let props = schema.get("properties").and_then(Value::as_object);
    let unknown = obj
        .keys()
        .filter(|k| !props.is_some_and(|p| p.contains_key(*k)))
        .count();
    if unknown > 0 {
        let allowed: Vec<&str> = props
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        return Err(ArgError(format!(
            "{unknown} unknown argument key(s) (allowed: {})",
            if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed.join(", ")
            }
        )));
    }
    Ok(obj)
}

/// A compiled input schema.
pub struct Schema(jsonschema::Validator);

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Schema")
    }
}

/// Compile a tool input schema. It must describe an object.
pub fn compile(schema: &Value) -> Result<Schema, ArgError> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(ArgError(
            "input schema must have \"type\": \"object\"".into(),
        ));
    }
    match schema.get("properties") {
        None | Some(Value::Object(_)) => {}
        Some(_) => {
            return Err(ArgError(
                "input schema \"properties\" must be an object".into(),
            ))
        }
    }
    jsonschema::validator_for(schema).map(Schema).map_err(|e| {
        ArgError(format!(
            "input schema is not a valid JSON Schema ({})",
            e.kind().keyword()
        ))
    })
}

impl Schema {
    /// Validate arguments; the message names the path and keyword, not the value.
    pub fn validate(&self, args: &Value) -> Result<(), ArgError> {
        match self.0.iter_errors(args).next() {
            None => Ok(()),
            Some(e) => {
                let path = e.instance_path().to_string();
                let path = if path.is_empty() {
                    "/".to_string()
                } else {
                    path
                };
                Err(ArgError(format!(
                    "argument {path} fails the \"{}\" rule of the input schema",
                    e.kind().keyword()
                )))
            }
        }
    }
}

/// Hex SHA-256 of the canonical (sorted-key) JSON encoding, for audit rows.
pub fn args_hash(args: &Value) -> String {
    let canon = serde_json::to_vec(args).unwrap_or_default();
    crate::hex(&Sha256::digest(&canon))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"invoice_id": {"type": "string", "maxLength": 64}, "limit": {"type": "integer", "minimum": 1, "maximum": 100}}, "required": ["invoice_id"]})
    }

    #[test]
    fn shape_limits() {
        let l = Limits::default();
        let s = schema();
        assert!(check_shape(&json!({"invoice_id": "a"}), 10, &s, &l).is_ok());
        let secret = "DROP TABLE x; --secret";
        for (args, len) in [
            (json!([]), 2),
            (json!({"tenant_id": secret}), 20),
            (json!({"page": 1}), 10),
            (json!({"invoice_id": "a"}), l.max_bytes + 1),
            (json!({"invoice_id": "x".repeat(l.max_string_len + 1)}), 100),
            (json!({"invoice_id": [[[[[[[[[[1]]]]]]]]]]}), 30),
        ] {
            let e = check_shape(&args, len, &s, &l).unwrap_err();
            assert!(!e.0.contains(secret), "{e}");
        }
    }

    #[test]
    fn schema_validation_messages_hide_values() {
        let c = compile(&schema()).unwrap();
        assert!(c
            .validate(&json!({"invoice_id": "inv_1", "limit": 5}))
            .is_ok());
        let e = c
            .validate(&json!({"invoice_id": "inv_1", "limit": "'; DROP TABLE"}))
            .unwrap_err();
        assert_eq!(
            e.0,
            "argument /limit fails the \"type\" rule of the input schema"
        );
        assert!(c.validate(&json!({})).unwrap_err().0.contains("required"));
        assert!(compile(&json!({"type": "array"})).is_err());
        assert!(compile(&json!({"type": "object", "properties": {"a": {"type": 5}}})).is_err());
    }

    #[test]
    fn hash_is_canonical() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":2,"b":1}"#).unwrap();
        assert_eq!(args_hash(&a), args_hash(&b));
        assert_eq!(args_hash(&a).len(), 64);
        // SHA-256 of `{}`, as `encode(sha256('{}'), 'hex')` gives it.
        assert_eq!(
            args_hash(&serde_json::json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
