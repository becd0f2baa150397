use crate::ProviderError;

/// Parses a provider config from JSON. The error names the path of the offending field, so a
/// platform engineer can find it in the providers config.
pub fn parse_config<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, ProviderError> {
    // Every call parses the config: take the fast path, and track the path only to explain a
    // failure.
    if let Ok(config) = serde_json::from_str(json) {
        return Ok(config);
    }
    let mut deserializer = serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = without_position(&err.into_inner());
        let location = if path == "." || path.is_empty() {
            "config".to_string()
        } else {
            format!("config.{path}")
        };
        ProviderError::InvalidConfig(format!("{location}: {inner}"))
    })
}

/// serde_json's message without its "at line 1 column 45": a position in the JSON the host made
/// from the providers config, which means nothing to the person who wrote the YAML.
fn without_position(error: &serde_json::Error) -> String {
    let message = error.to_string();
    let suffix = format!(" at line {} column {}", error.line(), error.column());
    message
        .strip_suffix(&suffix)
        .map(str::to_string)
        .unwrap_or(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Host {
        name: String,
        port: u16,
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Config {
        hosts: Vec<Host>,
    }

    fn message(err: ProviderError) -> String {
        match err {
            ProviderError::InvalidConfig(m) => m,
            other => panic!("expected invalid-config, got {other:?}"),
        }
    }

    #[test]
    fn names_the_path_of_a_wrong_type() {
        let err = parse_config::<Config>(r#"{"hosts":[{"name":"a","port":"x"}]}"#).unwrap_err();
        let msg = message(err);
        assert!(
            msg.starts_with("config.hosts[0].port: invalid type"),
            "{msg}"
        );
        assert!(!msg.contains("column"), "{msg}");
    }

    #[test]
    fn names_a_missing_field() {
        let msg = message(parse_config::<Config>(r#"{"hosts":[{"name":"a"}]}"#).unwrap_err());
        assert!(
            msg.contains("config.hosts[0]") && msg.contains("missing field `port`"),
            "{msg}"
        );
    }

    #[test]
    fn names_an_unknown_field() {
        let msg = message(
            parse_config::<Config>(r#"{"hosts":[{"name":"a","port":1,"prot":2}]}"#).unwrap_err(),
        );
        assert!(msg.contains("unknown field `prot`"), "{msg}");
        assert!(
            !msg.contains("line 1"),
            "no position in host-made JSON: {msg}"
        );
    }

    #[test]
    fn accepts_a_valid_config() {
        let cfg = parse_config::<Config>(r#"{"hosts":[{"name":"a","port":22}]}"#).unwrap();
        assert_eq!(cfg.hosts.len(), 1);
    }
}
