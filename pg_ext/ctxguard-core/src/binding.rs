//! Entity binding: the entity id of a tool call comes from the verified context, never the model.

use serde_json::{Map, Value};

/// The entity argument was supplied and differs from the context entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the entity argument does not match the entity on this page")]
pub struct EntityMismatch;

/// Bind `param` in `args` to `context_id`.
///
/// Absent → filled from the context. Exactly equal string → kept. Anything else (other id, array,
/// number, null, object, padded or look-alike string) → [`EntityMismatch`].
pub fn bind_entity(
    args: &mut Map<String, Value>,
    param: &str,
    context_id: &str,
) -> Result<(), EntityMismatch> {
    match args.get(param) {
        None => {
            args.insert(param.to_string(), Value::String(context_id.to_string()));
            Ok(())
        }
        Some(Value::String(s)) if s == context_id => Ok(()),
        Some(_) => Err(EntityMismatch),
    }
}

/// The schema shown to models: `param` removed from `properties` and `required`.
pub fn strip_param(schema: &Value, param: &str) -> Value {
    let mut out = schema.clone();
    if let Some(obj) = out.as_object_mut() {
        if let Some(Value::Object(props)) = obj.get_mut("properties") {
            props.remove(param);
        }
        if let Some(Value::Array(req)) = obj.get_mut("required") {
            req.retain(|r| r.as_str() != Some(param));
            if req.is_empty() {
                obj.remove("required");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn binds_absent_and_equal() {
        let mut a = Map::new();
        bind_entity(&mut a, "invoice_id", "inv_1").unwrap();
        assert_eq!(a["invoice_id"], json!("inv_1"));
        bind_entity(&mut a, "invoice_id", "inv_1").unwrap();
    }

    #[test]
    fn rejects_every_other_shape() {
        for v in [
            json!("inv_2"),
            json!(" inv_1"),
            json!("inv_1 "),
            json!("inv\u{200b}_1"),
            json!("ｉｎｖ_1"),
            json!("INV_1"),
            json!(["inv_1"]),
            json!({"id": "inv_1"}),
            json!(1),
            json!(null),
            json!(true),
        ] {
            let mut a = Map::new();
            a.insert("invoice_id".into(), v.clone());
            assert_eq!(
                bind_entity(&mut a, "invoice_id", "inv_1"),
                Err(EntityMismatch),
                "{v}"
            );
        }
    }

    #[test]
    fn strips_param_from_schema() {
        let s = json!({"type": "object", "properties": {"invoice_id": {"type": "string"}, "x": {}}, "required": ["invoice_id"]});
        assert_eq!(
            strip_param(&s, "invoice_id"),
            json!({"type": "object", "properties": {"x": {}}})
        );
        let s2 = json!({"type": "object", "properties": {"invoice_id": {}, "x": {}}, "required": ["invoice_id", "x"]});
        assert_eq!(strip_param(&s2, "invoice_id")["required"], json!(["x"]));
    }
}
