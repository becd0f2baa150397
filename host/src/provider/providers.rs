//! The provider instances in use: each entry of the providers config bound to its plugin (JSON
//! Schema check, capabilities bound from the valid grants, the plugin's `validate-config`), and
//! the set that is swapped as a whole when plugins or the config change.

use std::collections::HashMap;
use std::sync::Arc;

use crate::provider::config::ProviderEntry;
use crate::provider::plugins::{
    CallError, LoadedPlugin, PluginEngine, ProviderInstance, ProviderInstanceOptions,
    types::ProviderError,
};

/// The provider instances of a config, bound to their plugins and validated by them. Instances
/// whose plugin is not loaded (yet) are listed with the reason.
#[derive(Default)]
pub struct Providers {
    instances: HashMap<String, Arc<ProviderInstance>>,
    not_loaded: HashMap<String, NotLoaded>,
    problems: HashMap<String, String>,
    /// The `access` rules of the instances that have them (the others: every namespace).
    access: HashMap<String, crate::provider::access::Rules>,
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
pub struct ProviderSet(Arc<SetInner>);

struct SetInner {
    current: std::sync::RwLock<Arc<Providers>>,
    /// Bumped at every replacement, so controllers reconcile again at once.
    swaps: tokio::sync::watch::Sender<u64>,
}

impl ProviderSet {
    pub fn new(providers: Providers) -> Self {
        ProviderSet(Arc::new(SetInner {
            current: std::sync::RwLock::new(Arc::new(providers)),
            swaps: tokio::sync::watch::Sender::new(0),
        }))
    }

    /// The providers now.
    pub fn current(&self) -> Arc<Providers> {
        self.0
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn replace(&self, providers: Providers) {
        *self.0.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(providers);
        self.0.swaps.send_modify(|n| *n += 1);
    }

    /// A stream with an item after every replacement (for `Controller::reconcile_all_on`).
    pub fn swaps(&self) -> impl futures_util::Stream<Item = ()> + Send + Sync + 'static {
        let receiver = self.0.swaps.subscribe();
        futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.changed().await.ok()?;
            Some(((), receiver))
        })
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
    let grants = entry.grants.validate().map_err(|e| format!("{at}.{e}"))?;
    let instance = ProviderInstance::new(
        engine.clone(),
        &entry.name,
        plugin,
        &entry.config,
        &grants,
        ProviderInstanceOptions {
            max_concurrent_calls: entry.max_concurrent_calls.unwrap_or(8),
            upstream: entry.upstream_settings(),
        },
    )
    .map_err(|e| format!("{at}.{e}"))?
    .with_limits(entry.limits.clone().unwrap_or_default());
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
    pub(crate) fn from_parts(
        instances: HashMap<String, Arc<ProviderInstance>>,
        not_loaded: HashMap<String, NotLoaded>,
        problems: HashMap<String, String>,
    ) -> Self {
        Providers {
            instances,
            not_loaded,
            problems,
            access: HashMap::new(),
        }
    }

    /// The same providers, with the `access` rules of the instances that have them.
    pub fn with_access(
        mut self,
        rules: impl IntoIterator<Item = crate::provider::access::Rules>,
    ) -> Self {
        self.access = rules.into_iter().map(|r| (r.provider.clone(), r)).collect();
        self
    }

    /// The `access` rules of the instance `name`; `None`: every namespace may use it.
    pub fn access(&self, name: &str) -> Option<&crate::provider::access::Rules> {
        self.access.get(name)
    }

    /// Every instance's `access` rules, by instance name (for the admission policy).
    pub fn access_rules(&self) -> Vec<crate::provider::access::Rules> {
        let mut rules: Vec<_> = self.access.values().cloned().collect();
        rules.sort_by(|a, b| a.provider.cmp(&b.provider));
        rules
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
pub fn check_schema(plugin: &LoadedPlugin, config: &serde_json::Value) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_pointers_become_field_paths() {
        assert_eq!(field_path(""), "config");
        assert_eq!(field_path("/hosts/0/zone"), "config.hosts[0].zone");
        assert_eq!(field_path("/a~1b"), "config.a/b");
    }
}
