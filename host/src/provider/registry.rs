//! The plugin registry: where each provider instance's component comes from (a URL pinned by
//! sha256, the watched plugins ConfigMap, the built-in plugins directory — in that order), and
//! how plugins and the providers config change while the operator runs: validate and precompile
//! off the async runtime, then swap the whole provider set at once. Calls in flight keep the
//! instance (and plugin version) they started with. A bad update keeps what served before.

mod assembly;
mod sources;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::Instrument;

use crate::support::events::{EventType, Recorder};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use prometheus::{IntCounterVec, Opts, Registry};

pub use assembly::Change;
use assembly::{Assembly, Mode};
pub use sources::{MAX_PLUGIN_BYTES, PackedPlugin, PluginFiles, RegistryOptions, decode_configmap};
use sources::{Sources, Unresolved};

use crate::provider::config::{ConfigError, ProviderEntry, ProvidersConfig};
use crate::provider::plugins::{LoadedPlugin, PluginEngine, ProviderInstance};
use crate::provider::providers::{ProviderSet, Providers, bind_entry};
use crate::support::digest::{sha256_hex, short};
use crate::support::events;

/// Counts plugins that could not be (re)loaded.
#[derive(Clone)]
pub struct RegistryMetrics {
    load_errors: IntCounterVec,
}

impl RegistryMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.load_errors.clone()))?;
        Ok(metrics)
    }

    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(RegistryMetrics {
            load_errors: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_plugin_load_errors_total",
                    "Plugins (of types the providers config uses) that failed to load or were refused, by plugin type.",
                ),
                &["plugin"],
            )?,
        })
    }
}

struct State {
    config: ProvidersConfig,
    config_text: String,
    /// `<type>` → component bytes, from the ConfigMap.
    configmap: PluginFiles,
    /// Loaded components by digest: swapping back and forth never compiles twice.
    loaded: HashMap<String, Arc<LoadedPlugin>>,
    /// What serves each provider instance now, with the entry it was bound from.
    serving: HashMap<String, (ProviderEntry, Arc<ProviderInstance>)>,
}

/// The plugin registry. Share it with `Arc`.
pub struct PluginRegistry {
    engine: Arc<PluginEngine>,
    sources: Sources,
    providers: ProviderSet,
    state: tokio::sync::Mutex<State>,
    metrics: RegistryMetrics,
    config_file: PathBuf,
}

/// The providers of a config bound from the plugins directory alone, exactly as the operator
/// binds them at start without a plugins ConfigMap (pins checked, schema, `validate-config`).
pub async fn load_providers(
    engine: &Arc<PluginEngine>,
    plugins_dir: &Path,
    config: &ProvidersConfig,
    config_file: &Path,
) -> Result<Providers, ConfigError> {
    let err = |message: String| ConfigError {
        file: config_file.display().to_string(),
        message,
    };
    let options = RegistryOptions {
        plugins_dir: plugins_dir.to_path_buf(),
        configmap: None,
        download_dir: None,
    };
    let metrics = RegistryMetrics::unregistered().map_err(|e| err(e.to_string()))?;
    let registry = PluginRegistry::new(
        engine.clone(),
        options,
        config.clone(),
        String::new(),
        BTreeMap::new(),
        config_file,
        metrics,
    )
    .map_err(|e| err(e.to_string()))?;
    let mut state = registry.state.lock().await;
    let (providers, _) = registry
        .assemble(&mut state, config, Mode::Start { strict: true })
        .await
        .map_err(err)?;
    Ok(providers)
}

impl PluginRegistry {
    fn new(
        engine: Arc<PluginEngine>,
        options: RegistryOptions,
        config: ProvidersConfig,
        config_text: String,
        configmap: PluginFiles,
        config_file: &Path,
        metrics: RegistryMetrics,
    ) -> reqwest::Result<Self> {
        Ok(PluginRegistry {
            providers: ProviderSet::new(Providers::default()),
            state: tokio::sync::Mutex::new(State {
                config,
                config_text,
                configmap,
                loaded: HashMap::new(),
                serving: HashMap::new(),
            }),
            engine,
            metrics,
            sources: Sources {
                options,
                http: reqwest::Client::builder()
                    .timeout(std::time::Duration::from_secs(300))
                    .build()?,
            },
            config_file: config_file.to_path_buf(),
        })
    }

    /// Loads the providers config and every plugin it uses. With a plugins ConfigMap, its content
    /// is read first and a plugin missing everywhere is only `PluginNotLoaded` (it may be uploaded
    /// later); without one, a missing or broken plugin fails the start, as do config errors.
    pub async fn start(
        engine: Arc<PluginEngine>,
        options: RegistryOptions,
        config_file: &Path,
        client: Option<Client>,
        metrics: RegistryMetrics,
    ) -> anyhow::Result<Arc<Self>> {
        let config_text = std::fs::read_to_string(config_file).map_err(|e| {
            anyhow::anyhow!(
                "{}: cannot read the providers config: {e}",
                config_file.display()
            )
        })?;
        let config = ProvidersConfig::parse(&config_text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", config_file.display()))?;
        let configmap = match (&options.configmap, &client) {
            (Some((namespace, name)), Some(client)) => {
                read_configmap(client, namespace, name).await?
            }
            _ => BTreeMap::new(),
        };
        let strict = options.configmap.is_none();
        let registry = Arc::new(Self::new(
            engine,
            options,
            config.clone(),
            config_text,
            configmap,
            config_file,
            metrics,
        )?);
        let mut state = registry.state.lock().await;
        let (providers, changes) = registry
            .assemble(&mut state, &config, Mode::Start { strict })
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e}", config_file.display()))?;
        drop(state);
        registry.providers.replace(providers);
        registry.report(&changes, None).await;
        Ok(registry)
    }

    /// The providers in use (follows every swap).
    pub fn providers(&self) -> ProviderSet {
        self.providers.clone()
    }

    /// Applies new ConfigMap content: changed plugins are loaded and swapped in, removed ones
    /// fall back to the built-in directory or become `PluginNotLoaded`.
    #[tracing::instrument(name = "registry_reload", skip_all, fields(source = "plugins-configmap", files = content.len()))]
    pub async fn apply_configmap(&self, content: PluginFiles) -> Vec<Change> {
        let mut state = self.state.lock().await;
        if state.configmap == content {
            return Vec::new();
        }
        state.configmap = content;
        let config = state.config.clone();
        let (providers, changes) = self
            .assemble(&mut state, &config, Mode::Update)
            .await
            .expect("updates never fail as a whole");
        self.providers.replace(providers);
        changes
    }

    /// Re-reads the providers config file; a changed, valid one replaces the old as a whole. An
    /// invalid one (syntax, schema, a plugin's `validate-config`) is refused and the old one stays.
    #[tracing::instrument(name = "registry_reload", skip_all, fields(source = "providers-config", config = %self.config_file.display()))]
    pub async fn reload_config(&self) -> Result<Vec<Change>, String> {
        let text = std::fs::read_to_string(&self.config_file).map_err(|e| {
            format!(
                "{}: cannot read the providers config: {e}",
                self.config_file.display()
            )
        })?;
        let mut state = self.state.lock().await;
        if text == state.config_text {
            return Ok(Vec::new());
        }
        let config = ProvidersConfig::parse(&text)
            .map_err(|e| format!("{}: {e}", self.config_file.display()))?;
        let (providers, changes) = self
            .assemble(&mut state, &config, Mode::ConfigReload)
            .await
            .map_err(|e| format!("{}: {e}", self.config_file.display()))?;
        state.config = config;
        state.config_text = text;
        self.providers.replace(providers);
        Ok(changes)
    }

    /// Binds every entry of `config` to its plugin, reusing what serves when nothing changed.
    async fn assemble(
        &self,
        state: &mut State,
        config: &ProvidersConfig,
        mode: Mode,
    ) -> Result<(Providers, Vec<Change>), String> {
        let strict = matches!(mode, Mode::Start { strict: true });
        let mut out = Assembly::default();
        // An upload swaps for every instance of its type or for none (see `keep_types_whole`).
        let mut swapped = Vec::new();
        let mut rejected = HashMap::new();
        for (index, entry) in config.providers.iter().enumerate() {
            let at = format!("providers[{index}] ({})", entry.name);
            let previous = state
                .serving
                .get(&entry.name)
                .filter(|(old, _)| old.provider_type == entry.provider_type)
                .cloned();
            let (plugin, resolved) = match self.plugin_for(state, entry).await {
                Ok(found) => found,
                Err(NoPlugin { field, reason, .. }) if strict => {
                    return Err(format!("{at}.{field}: {reason}"));
                }
                Err(NoPlugin {
                    reason,
                    from_configmap,
                    refused,
                    ..
                }) => {
                    // Gone from every source: the instance is not served any more. Refused: the
                    // previous binding keeps serving.
                    self.refuse(&mut out, entry, previous, reason, from_configmap, refused);
                    continue;
                }
            };
            if let Some(reason) = &resolved.refused_upload {
                self.report_refused_upload(&mut out, entry, reason);
            }
            if let Some((old_entry, old)) = &previous
                && old_entry == entry
                && old.plugin().sha256 == plugin.sha256
            {
                out.serve(entry, old.clone());
                continue;
            }
            let span = tracing::info_span!(
                "bind",
                provider = %entry.name,
                plugin_type = %entry.provider_type,
                sha256 = %plugin.sha256
            );
            match bind_entry(&self.engine, &at, entry, plugin.clone())
                .instrument(span)
                .await
            {
                Ok(instance) => {
                    swapped.push((entry.clone(), previous.clone()));
                    out.changes.push(Change::Loaded {
                        provider: entry.name.clone(),
                        plugin_type: entry.provider_type.clone(),
                        sha256: plugin.sha256.clone(),
                        source: resolved.source.clone(),
                    });
                    out.serve(entry, Arc::new(instance));
                }
                // A config edit that a plugin rejects is refused as a whole.
                Err(reason) if !matches!(mode, Mode::Update) => return Err(reason),
                Err(reason) => {
                    rejected
                        .entry(entry.provider_type.clone())
                        .or_insert_with(|| {
                            format!("provider instance {} refused it: {reason}", entry.name)
                        });
                    self.refuse(
                        &mut out,
                        entry,
                        previous,
                        format!("the new plugin version rejected the config: {reason}"),
                        resolved.from_configmap,
                        true,
                    )
                }
            }
        }
        if matches!(mode, Mode::Update) {
            out.keep_types_whole(&rejected, swapped);
        }
        // Forget compiled plugins nothing uses any more.
        let in_use: std::collections::HashSet<String> = out
            .serving
            .values()
            .map(|(_, i)| i.plugin().sha256.clone())
            .collect();
        state.loaded.retain(|sha, _| in_use.contains(sha));
        state.serving = std::mem::take(&mut out.serving);
        Ok((out.providers(access_rules(config, &mode)), out.changes))
    }

    /// An upload over a built-in that the config did not pin: reported as a bad upload is
    /// (event, metric, log, the instance's problem) while the built-in serves.
    fn report_refused_upload(&self, out: &mut Assembly, entry: &ProviderEntry, reason: &str) {
        self.metrics
            .load_errors
            .with_label_values(&[&entry.provider_type])
            .inc();
        out.changes.push(Change::Refused {
            provider: entry.name.clone(),
            plugin_type: entry.provider_type.clone(),
            reason: reason.to_string(),
            from_configmap: true,
        });
        out.problems.insert(entry.name.clone(), reason.to_string());
    }

    /// The component an entry names, resolved, digest-checked and loaded (compiled once per
    /// digest).
    async fn plugin_for(
        &self,
        state: &mut State,
        entry: &ProviderEntry,
    ) -> Result<(Arc<LoadedPlugin>, sources::Resolved), NoPlugin> {
        let resolved = match self.sources.resolve(&state.configmap, entry).await {
            Ok(resolved) => resolved,
            Err(Unresolved::Missing(reason)) => {
                return Err(NoPlugin {
                    field: "type",
                    reason,
                    from_configmap: false,
                    refused: false,
                });
            }
            Err(Unresolved::Refused(reason, from_configmap)) => {
                return Err(NoPlugin {
                    field: "plugin",
                    reason,
                    from_configmap,
                    refused: true,
                });
            }
        };
        let sha = sha256_hex(&resolved.bytes);
        if let Some(plugin) = state.loaded.get(&sha) {
            return Ok((plugin.clone(), resolved));
        }
        match self
            .engine
            .load(&resolved.source, resolved.bytes.to_vec())
            .await
        {
            Ok(plugin) => {
                state.loaded.insert(sha, plugin.clone());
                Ok((plugin, resolved))
            }
            Err(e) => Err(NoPlugin {
                field: "type",
                reason: e.to_string(),
                from_configmap: resolved.from_configmap,
                refused: true,
            }),
        }
    }

    /// Records an entry without a (new) plugin. `refused` (not simply absent): the previous
    /// binding keeps serving, and it counts as a load error.
    fn refuse(
        &self,
        out: &mut Assembly,
        entry: &ProviderEntry,
        previous: Option<(ProviderEntry, Arc<ProviderInstance>)>,
        reason: String,
        from_configmap: bool,
        refused: bool,
    ) {
        if refused {
            self.metrics
                .load_errors
                .with_label_values(&[&entry.provider_type])
                .inc();
        }
        out.refuse(entry, previous.filter(|_| refused), reason, from_configmap);
    }

    /// Logs every change, and publishes events on the plugins ConfigMap for its own plugins.
    pub async fn report(&self, changes: &[Change], events: Option<(&Recorder, &ConfigMap)>) {
        for change in changes {
            match change {
                Change::Loaded {
                    provider,
                    plugin_type,
                    sha256,
                    source,
                } => {
                    tracing::info!(%provider, plugin = %plugin_type, sha256 = %short(sha256), %source, "plugin serving");
                    if let Some((recorder, map)) = events
                        && source.starts_with("configmap ")
                    {
                        publish(
                            recorder,
                            map,
                            EventType::Normal,
                            "PluginLoaded",
                            format!("{plugin_type}.wasm (sha256 {}) now serves provider instance {provider}", short(sha256)),
                        )
                        .await;
                    }
                }
                Change::Refused {
                    provider,
                    plugin_type,
                    reason,
                    from_configmap,
                } => {
                    tracing::error!(%provider, plugin = %plugin_type, %reason, "plugin not loaded");
                    if let (Some((recorder, map)), true) = (events, *from_configmap) {
                        publish(
                            recorder,
                            map,
                            EventType::Warning,
                            "PluginLoadFailed",
                            format!(
                                "{plugin_type}.wasm for provider instance {provider}: {reason}"
                            ),
                        )
                        .await;
                    }
                }
            }
        }
    }

    /// Follows the plugins ConfigMap until aborted. `leading` gates events (one replica reports).
    pub async fn watch_configmap(
        self: Arc<Self>,
        client: Client,
        leading: crate::support::leader::LeaderView,
    ) {
        let Some((namespace, name)) = self.sources.options.configmap.clone() else {
            return;
        };
        // Said at start, where a plugin author looks first (outside a cluster it is `default`).
        tracing::info!(%namespace, configmap = %name, "watching the plugins ConfigMap (set POD_NAMESPACE to change the namespace)");
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let recorder = events::recorder(client);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher(api, config).default_backoff().boxed();
        // A re-list that finds no ConfigMap (deleted while the watch was down) has no event of
        // its own: `InitDone` without an `InitApply` since `Init` means it is gone.
        let mut seen_in_init = false;
        while let Some(event) = events.next().await {
            let (map, content) = match event {
                Ok(watcher::Event::Init) => {
                    seen_in_init = false;
                    continue;
                }
                Ok(watcher::Event::InitDone) if seen_in_init => continue,
                Ok(watcher::Event::InitDone) => (None, BTreeMap::new()),
                Ok(watcher::Event::Apply(map)) | Ok(watcher::Event::InitApply(map)) => {
                    seen_in_init = true;
                    let (content, skipped) = decode_configmap(&map);
                    for (key, why) in skipped {
                        tracing::warn!(configmap = %name, %key, "ignoring key: {why}");
                    }
                    (Some(map), content)
                }
                Ok(watcher::Event::Delete(_)) => (None, BTreeMap::new()),
                Err(e) => {
                    tracing::warn!(configmap = %name, error = %e, "watching the plugins ConfigMap");
                    continue;
                }
            };
            let changes = self.apply_configmap(content).await;
            let gate = leading.is_serving();
            let events = map.as_ref().filter(|_| gate).map(|m| (&recorder, m));
            self.report(&changes, events).await;
        }
    }

    /// Re-reads the providers config file every `interval` until aborted.
    pub async fn watch_config_file(self: Arc<Self>, interval: std::time::Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            match self.reload_config().await {
                Ok(changes) if changes.is_empty() => {}
                Ok(changes) => {
                    tracing::info!("providers config reloaded");
                    self.report(&changes, None).await;
                }
                Err(e) => {
                    self.metrics
                        .load_errors
                        .with_label_values(&["providers-config"])
                        .inc();
                    tracing::error!(error = %e, "providers config not reloaded, the previous one stays");
                }
            }
        }
    }
}

/// Why an entry got no (new) plugin: the field to blame at start, and whether it was refused
/// (found but bad) rather than absent.
struct NoPlugin {
    field: &'static str,
    reason: String,
    from_configmap: bool,
    refused: bool,
}

/// The plugins ConfigMap's content at start; one that does not exist yet is empty.
async fn read_configmap(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<PluginFiles> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(map)) => Ok(decode_configmap(&map).0),
        Ok(None) => {
            tracing::warn!(
                configmap = %format!("{namespace}/{name}"),
                "the plugins ConfigMap does not exist yet; built-in plugins only until it does"
            );
            Ok(BTreeMap::new())
        }
        Err(e) => anyhow::bail!(
            "reading the plugins ConfigMap {namespace}/{name} (--plugins-configmap): {e}"
        ),
    }
}

async fn publish(
    recorder: &Recorder,
    map: &ConfigMap,
    type_: EventType,
    reason: &str,
    note: String,
) {
    events::publish(
        recorder,
        &map.object_ref(&()),
        type_,
        reason,
        "LoadPlugin",
        note,
    )
    .await;
}

/// The `access` rules of the config's instances; at start and at a config change, a line for
/// each instance without (open to every namespace, as before `access` existed).
fn access_rules(config: &ProvidersConfig, mode: &Mode) -> Vec<crate::provider::access::Rules> {
    if !matches!(mode, Mode::Update) {
        for entry in config.providers.iter().filter(|e| e.access.is_none()) {
            tracing::info!(provider = %entry.name, "provider instance has no `access` section: every namespace may use it and set user cloud-init, vendor data, unmanaged squid and any Service type (docs/tenancy.md)");
        }
    }
    config
        .providers
        .iter()
        .filter_map(ProviderEntry::access_rules)
        .collect()
}
