//! A JSON value written as block-style YAML, for Kubernetes manifests: the value is built
//! with `serde_json` (so its structure is the API's), and written in the form operators read
//! and diff (keys in serde_json's sorted order). Strings are written as JSON strings, which YAML reads as double-quoted scalars
//! with the same escapes; keys made only of letters, digits and `_./-` are written plain.
#![deny(unsafe_code)]

use serde_json::Value;

/// `value` as a YAML document (no `---` marker).
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(_) | Value::Array(_) => block(value, 0, &mut out),
        scalar => {
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
    out
}

fn key(k: &str) -> String {
    let plain = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        && !k.starts_with(['-', '.']);
    if plain {
        k.to_string()
    } else {
        Value::String(k.to_string()).to_string()
    }
}

/// A scalar or an empty collection on one line.
fn inline(v: &Value) -> String {
    match v {
        Value::Object(m) if m.is_empty() => "{}".into(),
        Value::Array(a) if a.is_empty() => "[]".into(),
        other => other.to_string(),
    }
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

/// A non-empty map or list, each line at `indent` spaces.
fn block(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if is_block(v) {
                    out.push_str(&format!("{pad}{}:\n", key(k)));
                    // A list under a key sits at the key's own indentation (YAML allows it).
                    let inner = if v.is_array() { indent } else { indent + 2 };
                    block(v, inner, out);
                } else {
                    out.push_str(&format!("{pad}{}: {}\n", key(k), inline(v)));
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                if is_block(item) {
                    // The item's first line takes the dash in place of its indentation.
                    let mut sub = String::new();
                    block(item, indent + 2, &mut sub);
                    out.push_str(&pad);
                    out.push_str("- ");
                    out.push_str(&sub[indent + 2..]);
                } else {
                    out.push_str(&format!("{pad}- {}\n", inline(item)));
                }
            }
        }
        scalar => out.push_str(&format!("{pad}{}\n", inline(scalar))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written forms checked by hand against the YAML 1.2 block syntax.
    #[test]
    fn writes_block_yaml() {
        let v = serde_json::json!({
            "kind": "Pod",
            "metadata": {"labels": {"app.kubernetes.io/name": "cbf"}, "annotations": {}},
            "spec": {"containers": [{"name": "f", "command": ["cbf", "a b", "x\"y"], "ports": []}]},
            "n": 1,
            "odd key": true
        });
        // serde_json's maps are sorted by key.
        let want = "\
kind: \"Pod\"
metadata:
  annotations: {}
  labels:
    app.kubernetes.io/name: \"cbf\"
n: 1
\"odd key\": true
spec:
  containers:
  - command:
    - \"cbf\"
    - \"a b\"
    - \"x\\\"y\"
    name: \"f\"
    ports: []
";
        assert_eq!(to_yaml(&v), want);
    }
}
