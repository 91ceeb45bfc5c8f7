//! JSON Schema normalization to the Go reflector's shape (wire spec §8), so services in different
//! languages with the same types hash alike: nested types inlined (every `$ref` resolved, `$defs` /
//! `definitions` dropped), nullable values as `{"type": ["T", "null"]}` (never `anyOf` with null),
//! `required` and `additionalProperties` kept. What `schemars` adds and a Go reflector does not is
//! removed: `$schema`, `title`, integer `format`s (`int64`, `uint32`, ...), and the `minimum: 0` that
//! comes with an unsigned format. Key order does not matter: the hash sorts keys.

use serde_json::{Map, Value};

/// How deep `$ref`s are followed before giving up (a recursive type cannot be inlined).
const MAX_DEPTH: usize = 32;

const INT_FORMATS: &[&str] = &[
    "int8", "int16", "int32", "int64", "int", "uint8", "uint16", "uint32", "uint64", "uint",
];

/// `schema` in the canonical shape. Errors: a `$ref` that names no definition, or one that recurses
/// (such a type has no inlined form).
pub fn normalize(schema: &Value) -> Result<Value, String> {
    let mut defs = Map::new();
    if let Some(o) = schema.as_object() {
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(d)) = o.get(key) {
                for (k, v) in d {
                    defs.insert(format!("#/{key}/{k}"), v.clone());
                }
            }
        }
    }
    walk(schema, &defs, 0)
}

fn walk(v: &Value, defs: &Map<String, Value>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err("a $ref recurses: a recursive type cannot be inlined".into());
    }
    let Some(o) = v.as_object() else {
        return Ok(match v {
            Value::Array(a) => Value::Array(
                a.iter()
                    .map(|x| walk(x, defs, depth))
                    .collect::<Result<_, _>>()?,
            ),
            other => other.clone(),
        });
    };
    if let Some(Value::String(r)) = o.get("$ref") {
        let target = defs
            .get(r)
            .ok_or_else(|| format!("$ref {r:?} names no definition"))?;
        // Sibling keywords of a $ref (e.g. a description) are kept over the definition's.
        let mut merged = target.as_object().cloned().unwrap_or_default();
        for (k, val) in o {
            if k != "$ref" {
                merged.insert(k.clone(), val.clone());
            }
        }
        return walk(&Value::Object(merged), defs, depth + 1);
    }
    let mut out = Map::new();
    for (k, val) in o {
        match k.as_str() {
            "$schema" | "$defs" | "definitions" | "title" => {}
            _ => {
                out.insert(k.clone(), walk(val, defs, depth)?);
            }
        }
    }
    // anyOf [T, null] -> T with "null" added to its type.
    if let Some(Value::Array(any)) = out.get("anyOf") {
        let is_null = |s: &Value| {
            s.get("type") == Some(&Value::String("null".into()))
                && s.as_object().is_some_and(|m| m.len() == 1)
        };
        if any.len() == 2 && any.iter().filter(|s| is_null(s)).count() == 1 {
            let inner = any
                .iter()
                .find(|s| !is_null(s))
                .cloned()
                .unwrap_or_default();
            if let Some(mut m) = inner.as_object().cloned() {
                if let Some(t) = m.get("type").cloned() {
                    let mut types = match t {
                        Value::Array(a) => a,
                        other => vec![other],
                    };
                    if !types.contains(&Value::String("null".into())) {
                        types.push("null".into());
                    }
                    m.insert("type".into(), Value::Array(types));
                    out.remove("anyOf");
                    for (k, val) in m {
                        out.entry(k).or_insert(val);
                    }
                }
            }
        }
    }
    // Integer formats and the unsigned minimum schemars adds.
    if let Some(Value::String(f)) = out.get("format") {
        if INT_FORMATS.contains(&f.as_str()) {
            let unsigned = f.starts_with('u');
            out.remove("format");
            if unsigned && out.get("minimum").and_then(Value::as_f64) == Some(0.0) {
                out.remove("minimum");
            }
        }
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemars_output_becomes_the_go_shape() {
        // What schemars 1.x writes for
        //   struct Order { id: u32, note: Option<String>, line: Line, tags: HashMap<String, String> }
        let schemars = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Order",
            "type": "object",
            "properties": {
                "id": {"type": "integer", "format": "uint32", "minimum": 0},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "free text"},
                "line": {"$ref": "#/$defs/Line"},
                "tags": {"type": "object", "additionalProperties": {"type": "string"}}
            },
            "required": ["id", "line", "tags"],
            "$defs": {"Line": {"title": "Line", "type": "object",
                "properties": {"qty": {"type": "integer", "format": "int64"}}, "required": ["qty"]}}
        });
        assert_eq!(
            normalize(&schemars).unwrap(),
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "note": {"type": ["string", "null"], "description": "free text"},
                    "line": {"type": "object", "properties": {"qty": {"type": "integer"}}, "required": ["qty"]},
                    "tags": {"type": "object", "additionalProperties": {"type": "string"}}
                },
                "required": ["id", "line", "tags"]
            })
        );
    }

    #[test]
    fn a_signed_minimum_is_kept_and_bad_refs_are_refused() {
        let s = json!({"type": "integer", "format": "int32", "minimum": 0});
        assert_eq!(
            normalize(&s).unwrap(),
            json!({"type": "integer", "minimum": 0})
        );
        assert!(normalize(&json!({"$ref": "#/$defs/Nope"}))
            .unwrap_err()
            .contains("no definition"));
        let recursive = json!({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
            "properties": {"next": {"$ref": "#/$defs/Node"}}}}});
        assert!(normalize(&recursive).unwrap_err().contains("recurses"));
    }
}
