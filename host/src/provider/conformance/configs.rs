//! Configs for the "schema and `validate-config` agree" checks: the author's good config, and bad
//! ones derived from it and the plugin's own schema (pure; no plugin is called here).

use serde_json::{Value, json};

/// A field no provider has: added where the schema forbids unknown fields.
pub const UNKNOWN_FIELD: &str = "conformanceUnknownField";

/// The schema's errors for `config`, each naming the field path (`config.hosts[0].zone: …`).
pub fn schema_errors(schema: &Value, config: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| {
        format!("the config schema from describe() is not a valid JSON Schema: {e}")
    })?;
    let errors: Vec<String> = validator
        .iter_errors(config)
        .take(3)
        .map(|e| {
            format!(
                "config{}: {e}",
                e.instance_path().as_str().replace('/', ".")
            )
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Bad variants of `good`, each with a short case name: not an object, an unknown field (when
/// `additionalProperties` is false), each required field missing, each top-level field of the
/// wrong JSON type. Only variants the schema itself refuses are kept: those are the configs the
/// plugin claims are bad, so `validate-config` must refuse them too.
pub fn bad_configs(schema: &Value, good: &Value) -> Vec<(String, Value)> {
    let mut cases = Vec::new();
    if schema["type"] == "object" {
        cases.push(("not-an-object".to_string(), json!("not an object")));
    }
    let Some(fields) = good.as_object() else {
        return cases;
    };
    if schema["additionalProperties"] == false {
        let mut bad = fields.clone();
        bad.insert(UNKNOWN_FIELD.into(), json!(true));
        cases.push(("unknown-field".into(), Value::Object(bad)));
    }
    for required in schema["required"].as_array().into_iter().flatten() {
        let Some(name) = required.as_str() else {
            continue;
        };
        if fields.contains_key(name) {
            let mut bad = fields.clone();
            bad.remove(name);
            cases.push((format!("missing-{name}"), Value::Object(bad)));
        }
    }
    for name in fields.keys() {
        if let Some(wrong) = wrong_type(&schema["properties"][name]["type"]) {
            let mut bad = fields.clone();
            bad.insert(name.clone(), wrong);
            cases.push((format!("wrong-type-{name}"), Value::Object(bad)));
        }
    }
    cases.retain(|(_, config)| schema_errors(schema, config).is_err());
    cases
}

/// A value of another JSON type than the schema's `type` (one type name only).
fn wrong_type(declared: &Value) -> Option<Value> {
    Some(match declared.as_str()? {
        "string" => json!(true),
        "integer" | "number" | "boolean" | "array" | "object" | "null" => json!("wrong type"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["endpoint", "zones"],
            "additionalProperties": false,
            "properties": {
                "endpoint": {"type": "string"},
                "zones": {"type": "array", "items": {"type": "string"}},
                "retries": {"type": "integer"},
                "anything": {},
            }
        })
    }

    #[rstest::rstest]
    #[case::every_kind_of_bad_config(
        json!({"endpoint": "http://x", "zones": ["a"], "retries": 1, "anything": 1}),
        &["missing-endpoint", "missing-zones", "not-an-object", "unknown-field",
          "wrong-type-endpoint", "wrong-type-retries", "wrong-type-zones"]
    )]
    #[case::a_required_field_left_out_of_the_good_config_is_not_removed(
        json!({"endpoint": "http://x"}),
        &["missing-endpoint", "not-an-object", "unknown-field", "wrong-type-endpoint"]
    )]
    fn bad_configs_are_derived_from_the_schema(#[case] good: Value, #[case] expected: &[&str]) {
        // Sorted: the field order of a JSON object is not part of the contract.
        let mut names: Vec<String> = bad_configs(&schema(), &good)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        names.sort();
        assert_eq!(names, expected);
    }

    #[test]
    fn an_open_schema_yields_only_what_it_refuses() {
        // No type, no required, unknown fields allowed: nothing the schema would refuse.
        let open = json!({"properties": {"a": {"type": ["string", "null"]}}});
        assert!(bad_configs(&open, &json!({"a": "x"})).is_empty());
    }

    #[test]
    fn schema_errors_name_the_field() {
        let err = schema_errors(&schema(), &json!({"endpoint": 7, "zones": []})).unwrap_err();
        assert!(
            err.starts_with("config.endpoint: 7 is not of type"),
            "{err}"
        );
        assert!(
            schema_errors(&json!({"type": 7}), &json!({}))
                .unwrap_err()
                .contains("not a valid JSON Schema")
        );
    }
}
