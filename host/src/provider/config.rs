//! The providers config (`--providers-config FILE`) as data: which provider instances exist,
//! which plugin serves each, its config and its grants. Parsed and checked without I/O; every
//! error names the file, the provider instance, the field and the fix. Binding it to plugins is
//! `providers.rs`.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::provider::capabilities::Grants;
use crate::support::names::is_dns_label;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersConfig {
    /// The provider instances.
    pub providers: Vec<ProviderEntry>,
}

/// One provider instance.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderEntry {
    /// What Proxies name in `spec.provider`.
    pub name: String,
    /// The plugin serving it: `<type>.wasm` in the plugins directory.
    #[serde(rename = "type")]
    pub provider_type: String,
    /// Handed to the plugin on every call; checked by its `validate-config`.
    #[serde(default = "empty_object")]
    pub config: serde_json::Value,
    /// What the host lets the plugin reach.
    #[serde(default)]
    pub grants: Grants,
    /// Calls into this provider instance that may run at once.
    #[serde(default)]
    pub max_concurrent_calls: Option<usize>,
    /// Where the plugin comes from, when not (only) by its type: a pinned digest, a URL.
    #[serde(default)]
    pub plugin: Option<PluginRef>,
    /// For a provider of proxies that exist already: their login and whether leases hand it out.
    #[serde(default)]
    pub upstream: Option<crate::provider::upstream::UpstreamSettings>,
    /// Which namespaces may use the instance and what their Proxies may set (absent: every
    /// namespace, everything; see docs/tenancy.md).
    #[serde(default)]
    pub access: Option<crate::provider::access::Access>,
    /// The platform's budget for this instance: Proxies at most, a spend per hour at most.
    #[serde(default)]
    pub limits: Option<crate::provider::limits::Limits>,
}

impl ProviderEntry {
    /// The entry's `upstream` section: as written, or the defaults for the `upstream` plugin;
    /// with the SOCKS5 upstreams its `config.upstreams` lists (how the operator speaks to them).
    pub fn upstream_settings(&self) -> Option<crate::provider::upstream::UpstreamSettings> {
        self.upstream
            .clone()
            .or_else(|| {
                (self.provider_type == crate::provider::upstream::UPSTREAM_TYPE)
                    .then(Default::default)
            })
            .map(|settings| settings.with_listed(&self.config))
    }
}

impl ProviderEntry {
    /// The entry's `access` rules, its kube grant namespace included; `None` without an
    /// `access` section (every namespace may use it and set everything, as before it existed).
    pub fn access_rules(&self) -> Option<crate::provider::access::Rules> {
        let home = self.grants.kube.as_ref().map(|k| k.namespace.as_str());
        Some(self.access.as_ref()?.rules(&self.name, home))
    }
}

/// A plugin pinned by digest, optionally downloaded from a URL.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PluginRef {
    /// sha256 of the component (64 hex digits): any other bytes are refused.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Download the component from here (once; it is cached by digest). Needs `sha256`.
    #[serde(default)]
    pub url: Option<String>,
}

/// Where an entry's component comes from, once checked: exactly one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// `<type>.wasm` from the plugins ConfigMap or the plugins directory, any digest.
    ByType,
    /// The same places, but only the component with this sha256.
    Pinned { sha256: String },
    /// Downloaded from `url` (once; kept by digest), only with this sha256.
    Download { url: String, sha256: String },
}

impl ProviderEntry {
    /// The entry's plugin source (the parser has refused a `url` without a `sha256`).
    pub fn plugin_source(&self) -> PluginSource {
        match self.plugin.as_ref().map(|p| (&p.url, &p.sha256)) {
            Some((Some(url), Some(sha256))) => PluginSource::Download {
                url: url.clone(),
                sha256: sha256.clone(),
            },
            Some((_, Some(sha256))) => PluginSource::Pinned {
                sha256: sha256.clone(),
            },
            _ => PluginSource::ByType,
        }
    }
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// A providers config that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub message: String,
}

/// Whether `name` can be a plugin type (it becomes a file name and a ConfigMap key).
pub fn is_plugin_name(name: &str) -> bool {
    is_dns_label(name)
}

impl ProvidersConfig {
    /// Reads and statically checks a providers config.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let err = |message: String| ConfigError {
            file: file.clone(),
            message,
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(format!("cannot read the providers config: {e}")))?;
        Self::parse(&text).map_err(err)
    }

    /// Parses and statically checks the text of a providers config.
    pub fn parse(text: &str) -> Result<Self, String> {
        // An empty file (or `~`) has no document: say which field it lacks.
        let config: ProvidersConfig = crate::support::yaml::from_str::<Option<_>>(text)
            .map_err(|e| e.to_string())?
            .ok_or(
                "missing field `providers`: the file is empty; list the provider instances under `providers:` (name, type, config, grants)",
            )?;
        if config.providers.is_empty() {
            return Err(
                "providers: the list is empty; add at least one provider instance (name, type, config, grants)"
                    .into(),
            );
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (index, entry) in config.providers.iter().enumerate() {
            let at = format!("providers[{index}]");
            if !is_dns_label(&entry.name) {
                return Err(format!(
                    "{at}.name: `{}` is not a valid name; use lowercase letters, digits and `-` (at most 63, like a Kubernetes name), e.g. `kvm-home`",
                    entry.name
                ));
            }
            if let Some(first) = seen.insert(&entry.name, index) {
                return Err(format!(
                    "{at}.name: `{}` is already the name of providers[{first}]; provider instance names must be unique",
                    entry.name
                ));
            }
            let at = format!("{at} ({})", entry.name);
            if !is_dns_label(&entry.provider_type) {
                return Err(format!(
                    "{at}.type: `{}` is not a plugin name; it names the plugin file `<type>.wasm`, e.g. `kvm`",
                    entry.provider_type
                ));
            }
            if !entry.config.is_object() {
                return Err(format!(
                    "{at}.config: must be a mapping (the provider's settings), found {}",
                    kind_of(&entry.config)
                ));
            }
            if entry.max_concurrent_calls == Some(0) {
                return Err(format!("{at}.maxConcurrentCalls: must be at least 1"));
            }
            entry.grants.validate().map_err(|e| format!("{at}.{e}"))?;
            if let Some(limits) = &entry.limits {
                limits.validate().map_err(|e| format!("{at}.{e}"))?;
            }
            if let Some(upstream) = &entry.upstream {
                upstream.validate().map_err(|e| format!("{at}.{e}"))?;
            }
            if let Some(access) = &entry.access {
                let home = entry.grants.kube.as_ref().map(|k| k.namespace.as_str());
                access.validate(home).map_err(|e| format!("{at}.{e}"))?;
            }
            if let Some(plugin) = &entry.plugin {
                if let Some(sha) = &plugin.sha256
                    && (sha.len() != 64
                        || !sha
                            .chars()
                            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
                {
                    return Err(format!(
                        "{at}.plugin.sha256: `{sha}` is not a sha256 digest; give 64 lowercase hex digits (`sha256sum plugin.wasm`)"
                    ));
                }
                match (&plugin.url, &plugin.sha256) {
                    (Some(url), None) => {
                        return Err(format!(
                            "{at}.plugin.sha256: required with plugin.url ({url}), so that only the component you checked is ever run"
                        ));
                    }
                    (Some(url), Some(_))
                        if !(url.starts_with("https://") || url.starts_with("http://")) =>
                    {
                        return Err(format!(
                            "{at}.plugin.url: `{url}` must be an http:// or https:// URL"
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(config)
    }
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "nothing",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::yaml_syntax("providers: [", "providers: unclosed bracket '[' at line 1, column 12")]
    #[case::missing_list("{}", "missing field `providers`")]
    #[case::empty_file("# nothing yet\n", "missing field `providers`: the file is empty")]
    #[case::two_documents(
        "providers: []\n---\nproviders: []",
        "more than one YAML document (`---`)"
    )]
    #[case::empty("providers: []", "providers: the list is empty")]
    #[case::unknown_top(
        "providers: []\nextra: 1",
        "extra: unknown field `extra`, expected `providers` at line 2, column 1"
    )]
    #[case::unknown_entry_field(
        "providers:\n- name: a\n  type: test\n  confg: {}",
        "providers[0].confg: unknown field `confg`, expected one of `name`, `type`, `config`"
    )]
    #[case::missing_type("providers:\n- name: a", "providers[0]: missing field `type`")]
    #[case::path_said_once(
        r#"{"providers": [{"name": "a"}]}"#,
        "providers[0]: missing field `type`"
    )]
    #[case::bad_name(
        "providers:\n- name: Kvm_Home\n  type: kvm",
        "providers[0].name: `Kvm_Home` is not a valid name"
    )]
    #[case::duplicate(
        "providers:\n- {name: a, type: test}\n- {name: a, type: test}",
        "providers[1].name: `a` is already the name of providers[0]"
    )]
    #[case::upstream_username(
        "providers:\n- {name: v, type: upstream, upstream: {credentials: {username: 'a:b', passwordFrom: {file: /p}}}}",
        "providers[0] (v).upstream.credentials.username: must be printable ASCII"
    )]
    #[case::upstream_password_source(
        "providers:\n- {name: v, type: upstream, upstream: {credentials: {username: c, passwordFrom: {}}}}",
        "providers[0] (v).upstream.credentials.passwordFrom: valueFrom: set exactly one"
    )]
    #[case::field_twice(
        "providers:\n- {name: a, type: test, name: b}",
        "providers[0]: duplicate field `name`"
    )]
    #[case::merge_key_not_expanded(
        "base: &base {type: test}\nproviders:\n- {<<: *base, name: a}",
        "base: unknown field `base`"
    )]
    #[case::merge_key_is_a_field(
        "providers:\n- {name: a, type: test}\n- {<<: {type: test}, name: b}",
        "providers[1].<<: unknown field `<<`"
    )]
    #[case::yaml_1_1_boolean(
        "providers:\n- {name: v, type: upstream, upstream: {handOutCredentials: yes}}",
        "providers[0].upstream.handOutCredentials: invalid boolean (true or false expected)"
    )]
    #[case::upstream_unknown_field(
        "providers:\n- {name: v, type: upstream, upstream: {handOut: true}}",
        "providers[0].upstream.handOut: unknown field `handOut`"
    )]
    #[case::bad_type(
        "providers:\n- {name: a, type: ../kvm}",
        "providers[0] (a).type: `../kvm` is not a plugin name"
    )]
    #[case::config_not_mapping(
        "providers:\n- {name: a, type: test, config: [1]}",
        "providers[0] (a).config: must be a mapping (the provider's settings), found a list"
    )]
    #[case::kind_without_a_policy(
        "providers:\n- name: a\n  type: test\n  grants: {kube: {namespace: p, kinds: [v1/Pod, rbac.authorization.k8s.io/v1/RoleBinding]}}",
        "providers[0] (a).grants.kube.kinds[1]: `rbac.authorization.k8s.io/v1/RoleBinding` is not a kind the host has a policy for"
    )]
    #[case::image_without_a_tag(
        "providers:\n- name: a\n  type: test\n  grants: {kube: {namespace: p, kinds: [v1/Pod], images: [docker.io/ubuntu/squid]}}",
        "providers[0] (a).grants.kube.images[0]: `docker.io/ubuntu/squid` names no tag or digest"
    )]
    #[case::bad_grant_pattern(
        "providers:\n- name: a\n  type: test\n  grants: {http: {allow: [\"ftp://x\"]}}",
        "providers[0] (a).grants.http.allow[0]: `ftp://x`: scheme must be http or https"
    )]
    #[case::credential_outside_allow(
        "providers:\n- name: a\n  type: test\n  grants:\n    http:\n      allow: [\"https://a.example\"]\n      credentials: [{url: \"https://b.example\", header: Authorization, valueFrom: {env: T}}]",
        "providers[0] (a).grants.http.credentials[0]: url `https://b.example` is not covered"
    )]
    #[case::credential_two_sources(
        "providers:\n- name: a\n  type: test\n  grants:\n    http:\n      allow: [\"https://a.example\"]\n      credentials: [{url: \"https://a.example\", header: Authorization, valueFrom: {env: T, file: /t}}]",
        "providers[0] (a).grants.http.credentials[0]: valueFrom: set exactly one of `env`"
    )]
    #[case::unknown_grant(
        "providers:\n- name: a\n  type: test\n  grants: {ssh: {}}",
        "providers[0].grants.ssh: unknown field `ssh`"
    )]
    #[case::zero_concurrency(
        "providers:\n- {name: a, type: test, maxConcurrentCalls: 0}",
        "providers[0] (a).maxConcurrentCalls: must be at least 1"
    )]
    #[case::access_unknown_field(
        "providers:\n- {name: kvm, type: test, access: {namespace: [a]}}",
        "providers[0].access.namespace: unknown field `namespace`"
    )]
    #[case::access_unknown_allow(
        "providers:\n- {name: kvm, type: test, access: {namespaces: [a], allow: {cloudInit: true}}}",
        "providers[0].access.allow.cloudInit: unknown field `cloudInit`"
    )]
    #[case::access_match_expressions(
        "providers:\n- {name: kvm, type: test, access: {namespaceSelector: {matchExpressions: []}}}",
        "providers[0].access.namespaceSelector.matchExpressions: unknown field `matchExpressions`"
    )]
    #[case::access_bad_namespace(
        "providers:\n- {name: kvm, type: test, access: {namespaces: [Team_A]}}",
        "providers[0] (kvm).access.namespaces[0]: `Team_A` is not a namespace name"
    )]
    #[case::access_bad_service_type(
        "providers:\n- {name: kvm, type: test, access: {namespaces: [a], allow: {serviceTypes: [Ingress]}}}",
        "providers[0] (kvm).access.allow.serviceTypes[0]: `Ingress` is not a Service type; use ClusterIP, NodePort or LoadBalancer"
    )]
    #[case::access_negative_replicas(
        "providers:\n- {name: kvm, type: test, access: {namespaces: [a], allow: {maxPoolReplicas: -1}}}",
        "providers[0] (kvm).access.allow.maxPoolReplicas: -1 is outside 0..=10000"
    )]
    #[case::access_no_namespace(
        "providers:\n- {name: kvm, type: test, access: {}}",
        "providers[0] (kvm).access: no namespace may use this instance; list them in access.namespaces"
    )]
    #[case::spend_without_price(
        "providers:\n- {name: gcp-eu, type: test, limits: {maxSpendPerHour: 0.20}}",
        "providers[0] (gcp-eu).limits.maxSpendPerHour: needs limits.pricePerHour (what one instance costs per hour) to become a number of Proxies; add pricePerHour"
    )]
    #[case::spend_at_no_price(
        "providers:\n- {name: gcp-eu, type: test, limits: {pricePerHour: 0, maxSpendPerHour: 0.20}}",
        "providers[0] (gcp-eu).limits.pricePerHour: 0 makes maxSpendPerHour no bound at all"
    )]
    #[case::negative_price(
        "providers:\n- {name: gcp-eu, type: test, limits: {pricePerHour: -0.5}}",
        "providers[0] (gcp-eu).limits.pricePerHour: -0.5 is not an amount; give 0 or more"
    )]
    #[case::negative_count(
        "providers:\n- {name: gcp-eu, type: test, limits: {maxProxies: -1}}",
        "providers[0] (gcp-eu).limits.maxProxies: -1 is below 0; give the most Proxies of this instance"
    )]
    #[case::limits_unknown_field(
        "providers:\n- {name: gcp-eu, type: test, limits: {maxInstances: 3}}",
        "providers[0].limits.maxInstances: unknown field `maxInstances`, expected one of `maxProxies`, `pricePerHour`, `maxSpendPerHour`"
    )]
    fn each_mistake_has_its_message(#[case] text: &str, #[case] expected: &str) {
        let message = ProvidersConfig::parse(text).unwrap_err();
        assert!(
            message.contains(expected),
            "got: {message}\nexpected: {expected}"
        );
        assert!(
            !message.contains("]: providers["),
            "the path said twice: {message}"
        );
    }

    #[test]
    fn the_plugin_source_is_one_of_three() {
        let sha = "a".repeat(64);
        let source = |plugin: &str| {
            let text = format!("providers:\n- {{name: a, type: test{plugin}}}");
            ProvidersConfig::parse(&text).unwrap().providers[0].plugin_source()
        };
        assert_eq!(source(""), PluginSource::ByType);
        assert_eq!(
            source(&format!(", plugin: {{sha256: {sha}}}")),
            PluginSource::Pinned {
                sha256: sha.clone()
            }
        );
        assert_eq!(
            source(&format!(
                ", plugin: {{sha256: {sha}, url: \"https://x.example/t.wasm\"}}"
            )),
            PluginSource::Download {
                url: "https://x.example/t.wasm".into(),
                sha256: sha.clone()
            }
        );
    }

    /// The provider's `config` reaches the plugin as YAML 1.2 reads it: `yes`, `on`, `0755`,
    /// `1_000` are strings (a plugin's schema decides), `true` and `0o755` are not; an alias is
    /// its anchor's value.
    #[test]
    fn a_config_reaches_the_plugin_as_yaml_1_2_reads_it() {
        let config = ProvidersConfig::parse(
            "providers:\n- name: a\n  type: test\n  config: {a: yes, b: on, c: 0755, d: true, e: 0o755, f: ~, g: 1_000, h: &h [x], i: *h}\n",
        )
        .unwrap();
        assert_eq!(
            config.providers[0].config,
            serde_json::json!({"a": "yes", "b": "on", "c": "0755", "d": true, "e": 493, "f": null, "g": "1_000", "h": ["x"], "i": ["x"]})
        );
    }

    #[test]
    fn limits_parse_and_give_the_cap() {
        let config = ProvidersConfig::parse(
            "providers:\n- name: gcp-eu\n  type: test\n  limits: {maxProxies: 20, pricePerHour: 0.012, maxSpendPerHour: 0.20}\n- {name: priced, type: test, limits: {pricePerHour: 0.012}}\n- {name: free, type: test}\n",
        )
        .unwrap();
        let caps: Vec<_> = config
            .providers
            .iter()
            .map(|entry| {
                entry
                    .limits
                    .as_ref()
                    .and_then(|l| l.cap())
                    .map(|c| c.proxies)
            })
            .collect();
        assert_eq!(caps, [Some(16), None, None]);
    }

    #[test]
    fn a_valid_config_parses() {
        let config = ProvidersConfig::parse(
            "providers:\n- name: kvm-home\n  type: kvm\n  config: {hosts: []}\n  grants:\n    http: {allow: [\"http://127.0.0.1:*\"]}\n",
        )
        .unwrap();
        assert_eq!(config.providers[0].name, "kvm-home");
        assert_eq!(config.providers[0].provider_type, "kvm");
        assert_eq!(config.providers[0].access_rules(), None);
    }

    #[test]
    fn access_includes_the_kube_grant_namespace() {
        let config = ProvidersConfig::parse(
            "providers:\n- name: k\n  type: kubernetes\n  grants: {kube: {namespace: platform, kinds: [v1/Pod]}}\n  access: {namespaces: [team-a]}\n",
        )
        .unwrap();
        let rules = config.providers[0].access_rules().unwrap();
        assert_eq!(rules.provider, "k");
        assert_eq!(
            rules.namespaces.into_iter().collect::<Vec<_>>(),
            ["platform", "team-a"]
        );
    }
}
