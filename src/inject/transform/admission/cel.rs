//! JSON values as the typed CEL literals of a MutatingAdmissionPolicy: its type checker
//! wants `Object.spec.initContainers{name: ...}` for an object of the pod's schema (a
//! plain CEL map of mixed values does not type-check), plain maps for the fields of map
//! type, and a few values that are CEL expressions already.

use serde_json::Value;

/// A string that is CEL already, not a value to quote.
pub(super) const RAW: char = '\u{1}';

pub(super) fn raw(expr: &str) -> Value {
    Value::String(format!("{RAW}{expr}"))
}

/// Fields whose value is a map of strings, not an object of a schema type.
const MAP_FIELDS: [&str; 4] = ["requests", "limits", "annotations", "labels"];

/// `v` as a typed CEL literal of type `ty` (`Object.spec.initContainers`), as
/// MutatingAdmissionPolicy's type checker wants it: objects of a schema type are
/// `Type{field: ...}`, the fields of map type plain maps.
pub fn cel(v: &Value, ty: &str) -> String {
    match v {
        Value::String(s) if s.starts_with(RAW) => s[RAW.len_utf8()..].to_string(),
        Value::String(s) => cel_string(s),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".to_string(),
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(|i| cel(i, ty))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Object(m) if MAP_FIELDS.iter().any(|f| ty.ends_with(&format!(".{f}"))) => {
            format!(
                "{{{}}}",
                m.iter()
                    .map(|(k, v)| format!("{}: {}", cel_string(k), cel(v, ty)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        Value::Object(m) => format!(
            "{ty}{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{k}: {}", cel(v, &format!("{ty}.{k}"))))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A CEL string literal: JSON's escapes are CEL's.
pub(super) fn cel_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}
