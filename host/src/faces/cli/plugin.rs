//! `proxy-operator plugin …`: tooling for plugin authors. Loads a component in the real runtime,
//! with real capabilities, so a provider can be tried without a cluster.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::provider::capabilities::Grants;
use crate::provider::capabilities::libvirt::tunnel::SshMaterial;
use crate::provider::capabilities::libvirt::{LibvirtHub, MaterialSource};
use crate::provider::config::ProvidersConfig;
use crate::provider::plugins::{
    EngineOptions, LoadedPlugin, PluginEngine, ProviderInstance, ProviderInstanceOptions,
    inspect_component,
    types::{Capability, InstanceSpec},
};
use crate::provider::providers::check_schema;

/// A provider instance for trying a plugin: one entry of the providers config, where `name` and
/// `type` may be left out.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceFile {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, rename = "type")]
    pub provider_type: Option<String>,
    #[serde(default = "empty_object")]
    pub config: serde_json::Value,
    #[serde(default)]
    pub grants: Grants,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// What `plugin run` calls.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RunFunction {
    /// Create an instance from a spec file (YAML or JSON; see docs/plugin-authoring.md).
    Create {
        #[arg(long)]
        spec: PathBuf,
    },
    /// Get an instance by provider id.
    Get { provider_id: String },
    /// Delete an instance by provider id.
    Delete { provider_id: String },
    /// List the instances carrying an owner identity.
    List,
    /// Run the provider's health check.
    Check,
}

pub(crate) fn read_yaml<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &str,
) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {what} {}", path.display()))?;
    crate::support::yaml::from_str(&text)
        .with_context(|| format!("parsing {what} {}", path.display()))
}

/// The SSH key and known_hosts files of `plugin run --ssh-key … --known-hosts …`.
pub type SshFiles<'a> = Option<(&'a Path, &'a Path)>;

/// What `plugin run` may reach besides HTTP: hypervisors over SSH, and a cluster.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunAccess<'a> {
    pub ssh: SshFiles<'a>,
    /// The kubeconfig of `--kubeconfig` (else `KUBECONFIG`, else `~/.kube/config`), used only
    /// when the entry grants `kube`.
    pub kubeconfig: Option<&'a Path>,
}

/// The cluster client of `plugin run`, as the operator's: from the kubeconfig.
async fn kube_client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("using the kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("grants.kube needs a cluster: pass --kubeconfig FILE or set KUBECONFIG")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

pub(crate) async fn engine(ssh: SshFiles<'_>) -> anyhow::Result<Arc<PluginEngine>> {
    engine_with_kube(ssh, None).await
}

async fn engine_with_kube(
    ssh: SshFiles<'_>,
    kube: Option<kube::Client>,
) -> anyhow::Result<Arc<PluginEngine>> {
    let mut libvirt = None;
    if let Some((key, known_hosts)) = ssh {
        let read = |path: &Path, what: &str| {
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the {what} {}", path.display()))
        };
        let material = SshMaterial {
            private_key: read(key, "SSH key")?,
            known_hosts: read(known_hosts, "known_hosts file")?,
        };
        libvirt = Some(LibvirtHub::new(
            MaterialSource::Static(material),
            std::env::temp_dir(),
        ));
    }
    // Tooling runs once: no pool to reserve, no cache to write.
    let options = EngineOptions {
        pool_instances: 0,
        libvirt,
        kube,
        ..EngineOptions::default()
    };
    PluginEngine::new(options, &prometheus::Registry::new())
}

async fn load(engine: &Arc<PluginEngine>, file: &Path) -> anyhow::Result<Arc<LoadedPlugin>> {
    Ok(engine.load_file(file).await?)
}

/// `plugin inspect FILE`: what the file is and, if it loads, what it declares.
pub async fn inspect(file: &Path, config: Option<&Path>) -> anyhow::Result<serde_json::Value> {
    let engine = engine(None).await?;
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let summary = inspect_component(&engine, &bytes)?;
    let mut out = serde_json::to_value(&summary)?;
    match engine.load(&file.display().to_string(), bytes).await {
        Ok(plugin) => {
            out["loads"] = true.into();
            out["describe"] = serde_json::to_value(&plugin.info)?;
            if let Some(config) = config {
                let entry: InstanceFile = read_yaml(config, "provider instance file")?;
                out["capabilities"] =
                    declared_and_granted(&plugin.info.capabilities, &entry.grants);
            }
            if let Ok(schema) =
                serde_json::from_str::<serde_json::Value>(&plugin.info.config_schema)
            {
                out["describe"]["configSchema"] = schema;
            }
        }
        Err(e) => {
            out["loads"] = false.into();
            out["error"] = e.to_string().into();
        }
    }
    Ok(out)
}

/// Per capability: declared by the plugin, granted by the entry, and whether calls get through
/// (both), e.g. `{"http": {"declared": true, "granted": false, "usable": false}}`.
fn declared_and_granted(declared: &[Capability], grants: &Grants) -> serde_json::Value {
    let granted = [
        (Capability::Log, true),
        (Capability::Http, grants.http.is_some()),
        (Capability::Kube, grants.kube.is_some()),
        (Capability::Libvirt, grants.libvirt.is_some()),
    ];
    granted
        .into_iter()
        .map(|(capability, granted)| {
            let declared = declared.contains(&capability);
            let name = serde_json::to_value(capability).expect("a capability serializes");
            let name = name.as_str().unwrap_or_default().to_string();
            let usable = declared && granted;
            (
                name,
                serde_json::json!({ "declared": declared, "granted": granted, "usable": usable }),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A providers-config entry read and its component loaded into an engine with what the entry
/// grants (a cluster from the kubeconfig when it grants `kube`): what `plugin run`, `validate`
/// and `test` start from.
pub(crate) struct LoadedEntry {
    pub engine: Arc<PluginEngine>,
    pub plugin: Arc<LoadedPlugin>,
    pub entry: InstanceFile,
    /// The entry's name, else the plugin's.
    pub name: String,
}

pub(crate) async fn load_entry(
    file: &Path,
    instance_file: &Path,
    access: RunAccess<'_>,
) -> anyhow::Result<LoadedEntry> {
    let entry: InstanceFile = read_yaml(instance_file, "provider instance file")?;
    let kube = match entry.grants.kube {
        Some(_) => Some(
            kube_client(access.kubeconfig)
                .await
                .with_context(|| instance_file.display().to_string())?,
        ),
        None => None,
    };
    let engine = engine_with_kube(access.ssh, kube).await?;
    let plugin = load(&engine, file).await?;
    if let Some(t) = &entry.provider_type
        && t != &plugin.info.name
    {
        bail!(
            "{}: type `{t}` does not match the plugin, which describes itself as `{}`",
            instance_file.display(),
            plugin.info.name
        );
    }
    let name = entry
        .name
        .clone()
        .unwrap_or_else(|| plugin.info.name.clone());
    Ok(LoadedEntry {
        engine,
        plugin,
        entry,
        name,
    })
}

async fn instance(
    file: &Path,
    instance_file: &Path,
    access: RunAccess<'_>,
) -> anyhow::Result<ProviderInstance> {
    let LoadedEntry {
        engine,
        plugin,
        entry,
        name,
    } = load_entry(file, instance_file, access).await?;
    // As the operator does: the plugin's JSON Schema first, then its own validate-config.
    check_schema(&plugin, &entry.config).map_err(|message| {
        anyhow::anyhow!(
            "{}: {message} (the JSON Schema of the `{}` plugin; `proxy-operator plugin inspect` shows it)",
            instance_file.display(),
            plugin.info.name
        )
    })?;
    let grants = entry
        .grants
        .validate()
        .with_context(|| format!("{}: grants", instance_file.display()))?;
    ProviderInstance::new(
        engine,
        &name,
        plugin,
        &entry.config,
        &grants,
        ProviderInstanceOptions::default(),
    )
    .with_context(|| format!("{}: grants", instance_file.display()))
}

/// `plugin validate FILE --config FILE`: load the plugin, check the config against its schema
/// and run `validate-config`.
pub async fn validate(file: &Path, instance_file: &Path) -> anyhow::Result<serde_json::Value> {
    let instance = instance(file, instance_file, RunAccess::default()).await?;
    instance.validate_config().await?;
    Ok(serde_json::json!({
        "valid": true,
        "plugin": instance.plugin().info.name,
        "witVersion": instance.plugin().wit_version,
    }))
}

/// `plugin run FILE --config FILE <function>`: call one function against real capabilities.
pub async fn run(
    file: &Path,
    instance_file: &Path,
    access: RunAccess<'_>,
    function: &RunFunction,
) -> anyhow::Result<serde_json::Value> {
    let instance = instance(file, instance_file, access).await?;
    // As the operator does before it binds a config: a plugin may rely on a validated config.
    instance.validate_config().await?;
    Ok(match function {
        RunFunction::Create { spec } => {
            let spec: InstanceSpec = read_yaml(spec, "instance spec file")?;
            serde_json::to_value(instance.create(spec).await?)?
        }
        RunFunction::Get { provider_id } => serde_json::to_value(instance.get(provider_id).await?)?,
        RunFunction::Delete { provider_id } => {
            instance.delete(provider_id).await?;
            serde_json::json!({ "deleted": provider_id })
        }
        RunFunction::List => serde_json::to_value(instance.list().await?)?,
        RunFunction::Check => serde_json::to_value(instance.check().await?)?,
    })
}

/// `plugin validate --providers-config FILE`: every entry bound as the operator binds it at start
/// (its plugin from the plugins directory or its URL with the pinned digest, the JSON Schema,
/// the grants, `validate-config`), each reported on its own; `valid` only if all are.
pub async fn validate_providers_config(
    providers_config: &Path,
    plugins_dir: &Path,
) -> anyhow::Result<serde_json::Value> {
    let config = ProvidersConfig::load(providers_config)?;
    let engine = engine(None).await?;
    let mut entries = Vec::new();
    for (index, entry) in config.providers.iter().enumerate() {
        // One entry at a time, so each is reported; its index keeps the operator's wording.
        let mut alone = config.clone();
        alone.providers = vec![entry.clone()];
        let bound = crate::provider::registry::load_providers(
            &engine,
            plugins_dir,
            &alone,
            providers_config,
        )
        .await;
        let mut report = serde_json::json!({"name": entry.name, "type": entry.provider_type});
        match bound {
            Ok(_) => report["valid"] = true.into(),
            Err(e) => {
                report["valid"] = false.into();
                let message = e
                    .message
                    .replacen("providers[0]", &format!("providers[{index}]"), 1);
                report["error"] = format!("{}: {message}", e.file).into();
            }
        }
        entries.push(report);
    }
    let valid = entries.iter().all(|e| e["valid"] == true);
    Ok(serde_json::json!({ "valid": valid, "providers": entries }))
}
