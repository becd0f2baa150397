//! The providers config (`--providers-config FILE`): which provider instances exist, which plugin
//! serves each, its config and its grants. Parsed and checked at start; every error names the
//! file, the provider instance, the field and the fix.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::capabilities::{CallContext, Grants};
use crate::plugins::{
    CallError, LoadedPlugin, PluginEngine, ProviderInstance, ProviderInstanceOptions,
    types::ProviderError,
};

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

pub(crate) fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
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
        let deserializer = serde_yaml_ng::Deserializer::from_str(text);
        let config: ProvidersConfig =
            serde_path_to_error::deserialize(deserializer).map_err(|e| {
                let path = e.path().to_string();
                let inner = e.into_inner();
                if path == "." {
                    format!("{inner}")
                } else {
                    format!("{path}: {inner}")
                }
            })?;
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
            CallContext::new(&entry.name, &entry.provider_type, &entry.grants)
                .map_err(|e| format!("{at}.{e}"))?;
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

/// The provider instances of a config, bound to their plugins and validated by them. Instances
/// whose plugin is not loaded (yet) are listed with the reason.
#[derive(Default)]
pub struct Providers {
    instances: HashMap<String, Arc<ProviderInstance>>,
    not_loaded: HashMap<String, NotLoaded>,
    problems: HashMap<String, String>,
}

/// A provider instance whose plugin is not loaded, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct NotLoaded {
    pub provider_type: String,
    pub reason: String,
}

/// The providers in use, replaced as a whole when plugins or the providers config change. Calls
/// already running keep the `Arc<ProviderInstance>` (and plugin version) they started with.
#[derive(Clone)]
pub struct ProviderSet(Arc<std::sync::RwLock<Arc<Providers>>>);

impl ProviderSet {
    pub fn new(providers: Providers) -> Self {
        ProviderSet(Arc::new(std::sync::RwLock::new(Arc::new(providers))))
    }

    /// The providers now.
    pub fn current(&self) -> Arc<Providers> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn replace(&self, providers: Providers) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(providers);
    }
}

impl From<Providers> for ProviderSet {
    fn from(providers: Providers) -> Self {
        ProviderSet::new(providers)
    }
}

/// Binds one entry to its plugin: JSON Schema check, grants, then the plugin's `validate-config`.
pub(crate) async fn bind_entry(
    engine: &Arc<PluginEngine>,
    at: &str,
    entry: &ProviderEntry,
    plugin: Arc<LoadedPlugin>,
) -> Result<ProviderInstance, String> {
    check_schema(&plugin, &entry.config).map_err(|message| {
        format!(
            "{at}.{message} (the JSON Schema of the `{}` plugin; `proxy-operator plugin inspect` shows it)",
            entry.provider_type
        )
    })?;
    let instance = ProviderInstance::new(
        engine.clone(),
        &entry.name,
        plugin,
        &entry.config,
        &entry.grants,
        ProviderInstanceOptions {
            max_concurrent_calls: entry.max_concurrent_calls.unwrap_or(8),
        },
    )
    .map_err(|e| format!("{at}.{e}"))?;
    match instance.validate_config().await {
        Ok(()) => Ok(instance),
        Err(CallError::Provider {
            error: ProviderError::InvalidConfig(message),
            ..
        }) => Err(format!(
            "{at}: the `{}` plugin rejected its config: {message}",
            entry.provider_type
        )),
        Err(e) => Err(format!("{at}: validate-config failed: {e}")),
    }
}

impl Providers {
    /// Loads every plugin the config uses from `plugins_dir` and runs each instance's
    /// `validate-config`.
    pub async fn build(
        engine: &Arc<PluginEngine>,
        plugins_dir: &Path,
        config: &ProvidersConfig,
        config_file: &Path,
    ) -> Result<Self, ConfigError> {
        let file = config_file.display().to_string();
        let err = |message: String| ConfigError {
            file: file.clone(),
            message,
        };
        let mut plugins: HashMap<String, Arc<LoadedPlugin>> = HashMap::new();
        let mut instances = HashMap::new();
        for (index, entry) in config.providers.iter().enumerate() {
            let at = format!("providers[{index}] ({})", entry.name);
            let plugin = match plugins.get(&entry.provider_type) {
                Some(p) => p.clone(),
                None => {
                    let path: PathBuf = plugins_dir.join(format!("{}.wasm", entry.provider_type));
                    if !path.exists() {
                        return Err(err(format!(
                            "{at}.type: no plugin `{}` in the plugins directory {} (available: {}); check the type or add `{}.wasm`",
                            entry.provider_type,
                            plugins_dir.display(),
                            available(plugins_dir),
                            entry.provider_type
                        )));
                    }
                    let plugin = engine
                        .load_file(&path)
                        .await
                        .map_err(|e| err(format!("{at}.type: {e}")))?;
                    plugins.insert(entry.provider_type.clone(), plugin.clone());
                    plugin
                }
            };
            let instance = bind_entry(engine, &at, entry, plugin).await.map_err(err)?;
            instances.insert(entry.name.clone(), Arc::new(instance));
        }
        Ok(Providers {
            instances,
            ..Default::default()
        })
    }

    pub(crate) fn from_parts(
        instances: HashMap<String, Arc<ProviderInstance>>,
        not_loaded: HashMap<String, NotLoaded>,
        problems: HashMap<String, String>,
    ) -> Self {
        Providers {
            instances,
            not_loaded,
            problems,
        }
    }

    /// The provider instance named in a Proxy's `spec.provider`, if its plugin is loaded.
    pub fn get(&self, name: &str) -> Option<&Arc<ProviderInstance>> {
        self.instances.get(name)
    }

    /// Names of the provider instances whose plugin is loaded.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.instances.keys().map(String::as_str)
    }

    /// A configured provider instance whose plugin is not loaded, and why.
    pub fn not_loaded(&self, name: &str) -> Option<&NotLoaded> {
        self.not_loaded.get(name)
    }

    /// Every configured provider instance whose plugin is not loaded.
    pub fn not_loaded_all(&self) -> impl Iterator<Item = (&str, &NotLoaded)> {
        self.not_loaded.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Is `name` in the providers config (loaded or not)?
    pub fn is_configured(&self, name: &str) -> bool {
        self.instances.contains_key(name) || self.not_loaded.contains_key(name)
    }

    /// Names of every configured provider instance, loaded or not.
    pub fn configured_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .instances
            .keys()
            .chain(self.not_loaded.keys())
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// The latest plugin update an instance did not take (it still serves the previous one).
    pub fn problem(&self, name: &str) -> Option<&str> {
        self.problems.get(name).map(String::as_str)
    }
}

/// Checks a config against the JSON Schema the plugin describes, before the plugin sees it. The
/// message names the field path, e.g. `config.hosts[0].zone: 7 is not of type "string"`.
fn check_schema(plugin: &LoadedPlugin, config: &serde_json::Value) -> Result<(), String> {
    if plugin.info.config_schema.trim().is_empty() {
        return Ok(());
    }
    let schema: serde_json::Value = serde_json::from_str(&plugin.info.config_schema)
        .map_err(|e| format!("config: the plugin's config schema is not JSON: {e}"))?;
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| format!("config: the plugin's config schema is invalid: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(config)
        .take(5)
        .map(|e| format!("{}: {e}", field_path(e.instance_path().as_str())))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// `/hosts/0/zone` → `config.hosts[0].zone`.
fn field_path(pointer: &str) -> String {
    let mut path = String::from("config");
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if segment.chars().all(|c| c.is_ascii_digit()) && !segment.is_empty() {
            path.push_str(&format!("[{segment}]"));
        } else {
            path.push('.');
            path.push_str(&segment);
        }
    }
    path
}

fn available(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.path()
                        .file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.strip_suffix(".wasm"))
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::yaml_syntax("providers: [", "did not find expected")]
    #[case::missing_list("{}", "missing field `providers`")]
    #[case::empty("providers: []", "providers: the list is empty")]
    #[case::unknown_top("providers: []\nextra: 1", "unknown field `extra`")]
    #[case::unknown_entry_field(
        "providers:\n- name: a\n  type: test\n  confg: {}",
        "providers[0]: unknown field `confg`, expected one of"
    )]
    #[case::missing_type("providers:\n- name: a", "providers[0]: missing field `type`")]
    #[case::bad_name(
        "providers:\n- name: Kvm_Home\n  type: kvm",
        "providers[0].name: `Kvm_Home` is not a valid name"
    )]
    #[case::duplicate(
        "providers:\n- {name: a, type: test}\n- {name: a, type: test}",
        "providers[1].name: `a` is already the name of providers[0]"
    )]
    #[case::bad_type(
        "providers:\n- {name: a, type: ../kvm}",
        "providers[0] (a).type: `../kvm` is not a plugin name"
    )]
    #[case::config_not_mapping(
        "providers:\n- {name: a, type: test, config: [1]}",
        "providers[0] (a).config: must be a mapping (the provider's settings), found a list"
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
        "providers[0].grants: unknown field `ssh`"
    )]
    #[case::zero_concurrency(
        "providers:\n- {name: a, type: test, maxConcurrentCalls: 0}",
        "providers[0] (a).maxConcurrentCalls: must be at least 1"
    )]
    fn each_mistake_has_its_message(#[case] text: &str, #[case] expected: &str) {
        let message = ProvidersConfig::parse(text).unwrap_err();
        assert!(
            message.contains(expected),
            "got: {message}\nexpected: {expected}"
        );
    }

    #[test]
    fn json_pointers_become_field_paths() {
        assert_eq!(field_path(""), "config");
        assert_eq!(field_path("/hosts/0/zone"), "config.hosts[0].zone");
        assert_eq!(field_path("/a~1b"), "config.a/b");
    }

    #[test]
    fn a_valid_config_parses() {
        let config = ProvidersConfig::parse(
            "providers:\n- name: kvm-home\n  type: kvm\n  config: {hosts: []}\n  grants:\n    http: {allow: [\"http://127.0.0.1:*\"]}\n",
        )
        .unwrap();
        assert_eq!(config.providers[0].name, "kvm-home");
        assert_eq!(config.providers[0].provider_type, "kvm");
    }
}
