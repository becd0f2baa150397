//! The provider set being assembled from a providers config, entry by entry: what serves, what
//! was refused (the previous binding keeps serving), what is not loaded.

use std::collections::HashMap;
use std::sync::Arc;

use crate::provider::config::ProviderEntry;
use crate::provider::plugins::ProviderInstance;
use crate::provider::providers::{NotLoaded, Providers};

/// What a refresh did to one provider instance's plugin, for logs, events and tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Now served by this plugin (new or changed).
    Loaded {
        provider: String,
        plugin_type: String,
        sha256: String,
        source: String,
    },
    /// The update was refused; the previous plugin (if any) keeps serving.
    Refused {
        provider: String,
        plugin_type: String,
        reason: String,
        from_configmap: bool,
    },
}

/// The provider set being built by `assemble`.
#[derive(Default)]
pub(super) struct Assembly {
    pub instances: HashMap<String, Arc<ProviderInstance>>,
    pub not_loaded: HashMap<String, NotLoaded>,
    pub problems: HashMap<String, String>,
    pub serving: HashMap<String, (ProviderEntry, Arc<ProviderInstance>)>,
    pub changes: Vec<Change>,
}

/// A provider instance bound to a changed plugin in this assembly, with what served it before.
pub(super) type Swapped = (
    ProviderEntry,
    Option<(ProviderEntry, Arc<ProviderInstance>)>,
);

impl Assembly {
    /// The providers assembled, with the config's `access` rules (the instances and their
    /// problems are taken; `changes` stay).
    pub fn providers(&mut self, access: Vec<crate::provider::access::Rules>) -> Providers {
        let (instances, not_loaded, problems) = (
            std::mem::take(&mut self.instances),
            std::mem::take(&mut self.not_loaded),
            std::mem::take(&mut self.problems),
        );
        Providers::from_parts(instances, not_loaded, problems).with_access(access)
    }

    /// One upload swaps for every instance of its plugin type or for none: where some instance
    /// refused the new version (`rejected`: type → why), the instances that took it go back to
    /// what served them before, so no type runs two versions at once.
    pub fn keep_types_whole(&mut self, rejected: &HashMap<String, String>, swapped: Vec<Swapped>) {
        for (entry, previous) in swapped {
            let Some(why) = rejected.get(&entry.provider_type) else {
                continue;
            };
            self.changes.retain(
                |change| !matches!(change, Change::Loaded { provider, .. } if *provider == entry.name),
            );
            self.serving.remove(&entry.name);
            self.instances.remove(&entry.name);
            let reason = format!(
                "the new version of plugin `{}` is not swapped in for any of its instances: {why}",
                entry.provider_type
            );
            self.refuse(&entry, previous, reason, true);
        }
    }

    pub fn serve(&mut self, entry: &ProviderEntry, instance: Arc<ProviderInstance>) {
        self.serving
            .insert(entry.name.clone(), (entry.clone(), instance.clone()));
        self.instances.insert(entry.name.clone(), instance);
    }

    /// Records a refused plugin; `previous` (the same instance's last good binding) keeps serving.
    pub fn refuse(
        &mut self,
        entry: &ProviderEntry,
        previous: Option<(ProviderEntry, Arc<ProviderInstance>)>,
        reason: String,
        from_configmap: bool,
    ) {
        self.changes.push(Change::Refused {
            provider: entry.name.clone(),
            plugin_type: entry.provider_type.clone(),
            reason: reason.clone(),
            from_configmap,
        });
        match previous {
            Some((old_entry, old)) => {
                self.problems.insert(entry.name.clone(), reason);
                self.serving
                    .insert(entry.name.clone(), (old_entry, old.clone()));
                self.instances.insert(entry.name.clone(), old);
            }
            None => {
                self.not_loaded.insert(
                    entry.name.clone(),
                    NotLoaded {
                        provider_type: entry.provider_type.clone(),
                        reason,
                    },
                );
            }
        }
    }
}

#[derive(Clone, Copy)]
pub(super) enum Mode {
    /// At start; `strict` fails on a missing or broken plugin (no ConfigMap to bring it later).
    Start { strict: bool },
    /// Plugins changed: each instance keeps its previous plugin when the new one is refused.
    Update,
    /// The providers config changed: a config error refuses the new config as a whole.
    ConfigReload,
}
