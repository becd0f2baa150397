//! The plugin registry: where each provider instance's component comes from (a URL pinned by
//! sha256, the watched plugins ConfigMap, the built-in plugins directory — in that order), and
//! how plugins and the providers config change while the operator runs: validate and precompile
//! off the async runtime, then swap the whole provider set at once. Calls in flight keep the
//! instance (and plugin version) they started with. A bad update keeps what served before.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use prometheus::{IntCounterVec, Opts, Registry};
use sha2::{Digest, Sha256};

use crate::config::{
    NotLoaded, ProviderEntry, ProviderSet, Providers, ProvidersConfig, bind_entry,
};
use crate::events;
use crate::plugins::{LoadedPlugin, PluginEngine, ProviderInstance};

/// Largest component accepted from any source (decompressed).
pub const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// Where plugins come from.
#[derive(Clone, Debug)]
pub struct RegistryOptions {
    /// Built-in plugins, `<type>.wasm`.
    pub plugins_dir: PathBuf,
    /// The watched plugins ConfigMap (namespace, name), binaryData `<type>.wasm[.gz]`.
    pub configmap: Option<(String, String)>,
    /// Where URL plugins are kept after download (by digest); none: kept in memory only.
    pub download_dir: Option<PathBuf>,
}

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

struct State {
    config: ProvidersConfig,
    config_text: String,
    /// `<type>` → component bytes, from the ConfigMap.
    configmap: BTreeMap<String, Vec<u8>>,
    /// Loaded components by digest: swapping back and forth never compiles twice.
    loaded: HashMap<String, Arc<LoadedPlugin>>,
    /// What serves each provider instance now, with the entry it was bound from.
    serving: HashMap<String, (ProviderEntry, Arc<ProviderInstance>)>,
}

/// The plugin registry. Share it with `Arc`.
pub struct PluginRegistry {
    engine: Arc<PluginEngine>,
    options: RegistryOptions,
    providers: ProviderSet,
    state: tokio::sync::Mutex<State>,
    metrics: RegistryMetrics,
    http: reqwest::Client,
    config_file: PathBuf,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn short(sha: &str) -> &str {
    &sha[..12.min(sha.len())]
}

/// Where an entry's component comes from, and its bytes.
struct Resolved {
    source: String,
    bytes: Arc<Vec<u8>>,
    from_configmap: bool,
}

impl PluginRegistry {
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
        let mut configmap = BTreeMap::new();
        if let (Some((namespace, name)), Some(client)) = (&options.configmap, &client) {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(Some(map)) => configmap = decode_configmap(&map).0,
                Ok(None) => tracing::warn!(
                    configmap = %format!("{namespace}/{name}"),
                    "the plugins ConfigMap does not exist yet; built-in plugins only until it does"
                ),
                Err(e) => anyhow::bail!(
                    "reading the plugins ConfigMap {namespace}/{name} (--plugins-configmap): {e}"
                ),
            }
        }
        let registry = Arc::new(PluginRegistry {
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
            http: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(300))
                .build()?,
            config_file: config_file.to_path_buf(),
            options,
        });
        let strict = registry.options.configmap.is_none();
        let mut state = registry.state.lock().await;
        let config = state.config.clone();
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
    pub async fn apply_configmap(&self, content: BTreeMap<String, Vec<u8>>) -> Vec<Change> {
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
        let mut out = Assembly::default();
        for (index, entry) in config.providers.iter().enumerate() {
            let at = format!("providers[{index}] ({})", entry.name);
            let previous = state
                .serving
                .get(&entry.name)
                .filter(|(old, _)| old.provider_type == entry.provider_type)
                .cloned();
            // `keep`: the previous binding keeps serving (a refused update, not a removal); only
            // refusals count as load errors, a plugin that is simply absent does not.
            let refuse = |out: &mut Assembly, reason: String, from_configmap: bool, keep: bool| {
                if keep {
                    self.metrics
                        .load_errors
                        .with_label_values(&[&entry.provider_type])
                        .inc();
                }
                out.refuse(
                    entry,
                    previous.clone().filter(|_| keep),
                    reason,
                    from_configmap,
                );
            };
            let resolved = match self.resolve(state, entry).await {
                Ok(resolved) => resolved,
                Err(Unresolved::Missing(reason)) => {
                    if let Mode::Start { strict: true } = mode {
                        return Err(format!("{at}.type: {reason}"));
                    }
                    // Gone from every source: the instance is not served any more.
                    refuse(&mut out, reason, false, false);
                    continue;
                }
                Err(Unresolved::Refused(reason, from_configmap)) => {
                    if let Mode::Start { strict: true } = mode {
                        return Err(format!("{at}.plugin: {reason}"));
                    }
                    refuse(&mut out, reason, from_configmap, true);
                    continue;
                }
            };
            let sha = sha256_hex(&resolved.bytes);
            let plugin = match state.loaded.get(&sha) {
                Some(plugin) => plugin.clone(),
                None => match self
                    .engine
                    .load(&resolved.source, resolved.bytes.to_vec())
                    .await
                {
                    Ok(plugin) => {
                        state.loaded.insert(sha.clone(), plugin.clone());
                        plugin
                    }
                    Err(e) => {
                        if let Mode::Start { strict: true } = mode {
                            return Err(format!("{at}.type: {e}"));
                        }
                        refuse(&mut out, e.to_string(), resolved.from_configmap, true);
                        continue;
                    }
                },
            };
            if let Some((old_entry, old)) = &previous
                && old_entry == entry
                && old.plugin().sha256 == sha
            {
                out.serve(entry, old.clone());
                continue;
            }
            match bind_entry(&self.engine, &at, entry, plugin).await {
                Ok(instance) => {
                    let instance = Arc::new(instance);
                    out.changes.push(Change::Loaded {
                        provider: entry.name.clone(),
                        plugin_type: entry.provider_type.clone(),
                        sha256: sha.clone(),
                        source: resolved.source.clone(),
                    });
                    out.serve(entry, instance);
                }
                Err(reason) => match mode {
                    // A config edit that a plugin rejects is refused as a whole.
                    Mode::Start { .. } | Mode::ConfigReload => return Err(reason),
                    Mode::Update => refuse(
                        &mut out,
                        format!("the new plugin version rejected the config: {reason}"),
                        resolved.from_configmap,
                        true,
                    ),
                },
            }
        }
        // Forget compiled plugins nothing uses any more.
        let in_use: std::collections::HashSet<String> = out
            .serving
            .values()
            .map(|(_, i)| i.plugin().sha256.clone())
            .collect();
        state.loaded.retain(|sha, _| in_use.contains(sha));
        state.serving = out.serving;
        Ok((
            Providers::from_parts(out.instances, out.not_loaded, out.problems),
            out.changes,
        ))
    }

    async fn resolve(&self, state: &State, entry: &ProviderEntry) -> Result<Resolved, Unresolved> {
        let pin = entry.plugin.as_ref().and_then(|p| p.sha256.clone());
        let resolved = if let Some(url) = entry.plugin.as_ref().and_then(|p| p.url.clone()) {
            let sha = pin.clone().expect("checked by the config parser");
            let bytes = self
                .download(&url, &sha)
                .await
                .map_err(|e| Unresolved::Refused(e, false))?;
            Resolved {
                source: url,
                bytes: Arc::new(bytes),
                from_configmap: false,
            }
        } else if let Some(bytes) = state.configmap.get(&entry.provider_type) {
            let (namespace, name) = self.options.configmap.clone().unwrap_or_default();
            Resolved {
                source: format!(
                    "configmap {namespace}/{name} key {}.wasm",
                    entry.provider_type
                ),
                bytes: Arc::new(bytes.clone()),
                from_configmap: true,
            }
        } else {
            let path = self
                .options
                .plugins_dir
                .join(format!("{}.wasm", entry.provider_type));
            match tokio::fs::read(&path).await {
                Ok(bytes) => Resolved {
                    source: path.display().to_string(),
                    bytes: Arc::new(bytes),
                    from_configmap: false,
                },
                Err(_) => {
                    let mut places = vec![format!(
                        "the plugins directory {}",
                        self.options.plugins_dir.display()
                    )];
                    if let Some((namespace, name)) = &self.options.configmap {
                        places.insert(0, format!("the plugins ConfigMap {namespace}/{name}"));
                    }
                    return Err(Unresolved::Missing(format!(
                        "no plugin `{}` in {}; add `{}.wasm` or fix the type",
                        entry.provider_type,
                        places.join(" or "),
                        entry.provider_type
                    )));
                }
            }
        };
        if let Some(pin) = pin {
            let found = sha256_hex(&resolved.bytes);
            if found != pin {
                return Err(Unresolved::Refused(
                    format!(
                        "{} has sha256 {found}, but plugin.sha256 pins {pin}; refusing to load it",
                        resolved.source
                    ),
                    resolved.from_configmap,
                ));
            }
        }
        Ok(resolved)
    }

    /// A URL plugin: from the download directory if it is there with the right digest, else
    /// downloaded once, verified, and kept.
    async fn download(&self, url: &str, sha: &str) -> Result<Vec<u8>, String> {
        let cached = self
            .options
            .download_dir
            .as_ref()
            .map(|d| d.join(format!("{sha}.wasm")));
        if let Some(path) = &cached
            && let Ok(bytes) = tokio::fs::read(path).await
            && sha256_hex(&bytes) == sha
        {
            return Ok(bytes);
        }
        let started = std::time::Instant::now();
        tracing::info!(%url, "downloading plugin");
        let mut response = self
            .http
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| format!("downloading {url}: {e}"))?;
        let mut bytes = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("downloading {url}: {e}"))?
        {
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > MAX_PLUGIN_BYTES {
                return Err(format!(
                    "downloading {url}: larger than {} MiB",
                    MAX_PLUGIN_BYTES >> 20
                ));
            }
        }
        let found = sha256_hex(&bytes);
        if found != sha {
            return Err(format!(
                "{url} has sha256 {found}, but plugin.sha256 pins {sha}; refusing to load it"
            ));
        }
        tracing::info!(%url, bytes = bytes.len(), elapsed_ms = started.elapsed().as_millis() as u64, "downloaded plugin");
        if let Some(path) = cached {
            // Written whole then renamed: a crash never leaves a partial file under the digest.
            let write = || -> std::io::Result<()> {
                std::fs::create_dir_all(path.parent().expect("a file in a directory"))?;
                let tmp = path.with_extension("part");
                std::fs::write(&tmp, &bytes)?;
                std::fs::rename(&tmp, &path)
            };
            if let Err(e) = write() {
                tracing::warn!(path = %path.display(), "cannot keep the downloaded plugin: {e}");
            }
        }
        Ok(bytes)
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
                    tracing::error!(%provider, plugin = %plugin_type, "plugin not loaded: {reason}");
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
        leading: Arc<std::sync::atomic::AtomicBool>,
    ) {
        let Some((namespace, name)) = self.options.configmap.clone() else {
            return;
        };
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
                    tracing::warn!(configmap = %name, "watching the plugins ConfigMap: {e}");
                    continue;
                }
            };
            let changes = self.apply_configmap(content).await;
            let gate = leading.load(std::sync::atomic::Ordering::Relaxed);
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
                    tracing::error!("providers config not reloaded, the previous one stays: {e}");
                }
            }
        }
    }
}

/// The provider set being built by `assemble`.
#[derive(Default)]
struct Assembly {
    instances: HashMap<String, Arc<ProviderInstance>>,
    not_loaded: HashMap<String, NotLoaded>,
    problems: HashMap<String, String>,
    serving: HashMap<String, (ProviderEntry, Arc<ProviderInstance>)>,
    changes: Vec<Change>,
}

impl Assembly {
    fn serve(&mut self, entry: &ProviderEntry, instance: Arc<ProviderInstance>) {
        self.serving
            .insert(entry.name.clone(), (entry.clone(), instance.clone()));
        self.instances.insert(entry.name.clone(), instance);
    }

    /// Records a refused plugin; `previous` (the same instance's last good binding) keeps serving.
    fn refuse(
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
enum Mode {
    /// At start; `strict` fails on a missing or broken plugin (no ConfigMap to bring it later).
    Start { strict: bool },
    /// Plugins changed: each instance keeps its previous plugin when the new one is refused.
    Update,
    /// The providers config changed: a config error refuses the new config as a whole.
    ConfigReload,
}

enum Unresolved {
    /// In no source.
    Missing(String),
    /// Found but refused (digest mismatch, download failed); bool: from the ConfigMap.
    Refused(String, bool),
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

/// Plugin components by type.
pub type PluginFiles = BTreeMap<String, Vec<u8>>;

/// `<type>.wasm` and `<type>.wasm.gz` keys of `binaryData` (gzip decoded); what was skipped
/// (key, why).
pub fn decode_configmap(map: &ConfigMap) -> (PluginFiles, Vec<(String, String)>) {
    let mut content = BTreeMap::new();
    let mut skipped = Vec::new();
    for (key, value) in map.binary_data.iter().flatten() {
        let (plugin_type, gzipped) = if let Some(t) = key.strip_suffix(".wasm.gz") {
            (t, true)
        } else if let Some(t) = key.strip_suffix(".wasm") {
            (t, false)
        } else {
            skipped.push((key.clone(), "not `<type>.wasm` or `<type>.wasm.gz`".into()));
            continue;
        };
        if !crate::config::is_plugin_name(plugin_type) {
            skipped.push((
                key.clone(),
                "the type must be lowercase letters, digits and `-`".into(),
            ));
            continue;
        }
        let bytes = if gzipped {
            let mut out = Vec::new();
            let decoder = flate2::read::GzDecoder::new(value.0.as_slice());
            match decoder.take(MAX_PLUGIN_BYTES + 1).read_to_end(&mut out) {
                Ok(_) if out.len() as u64 <= MAX_PLUGIN_BYTES => out,
                Ok(_) => {
                    skipped.push((key.clone(), "larger than 256 MiB decompressed".into()));
                    continue;
                }
                Err(e) => {
                    // Keep the (broken) bytes: loading them fails and is reported like any bad plugin.
                    tracing::warn!(%key, "not valid gzip: {e}");
                    value.0.clone()
                }
            }
        } else {
            value.0.clone()
        };
        content.insert(plugin_type.to_string(), bytes);
    }
    for key in map.data.iter().flatten().map(|(k, _)| k) {
        if key.ends_with(".wasm") || key.ends_with(".wasm.gz") {
            skipped.push((
                key.clone(),
                "plugins go in binaryData (kubectl create configmap --from-file does that)".into(),
            ));
        }
    }
    (content, skipped)
}
