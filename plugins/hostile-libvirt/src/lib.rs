//! A hostile provider for the libvirt sandbox tests (`host/tests/sandbox_libvirt.rs`); never
//! shipped. It declares `libvirt` (unlike `hostile-provider`, whose undeclared calls the host
//! refuses) and its config names one libvirt call with the arguments to try: each is a way a
//! plugin could reach what is not its own on a hypervisor it is granted. Every provider function
//! makes the call; the result comes back as the instance's message, an error as `denied` with
//! the host's error in it, so the test sees exactly what the host answered.

use proxy_operator_sdk::capabilities::libvirt::{self, Hypervisor, ImageSource};
use proxy_operator_sdk::{
    Capability, CheckTarget, Instance, InstanceSpec, InstanceState, PluginInfo, Provider,
    ProviderError, export_provider,
};
use serde::Deserialize;

/// The provider instance config: the call and its arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// The WIT function of the `hypervisor` resource, e.g. `define-domain`.
    pub attempt: String,
    #[serde(default = "default_host")]
    pub host: String,
    #[serde(default)]
    pub pool: String,
    /// A domain or volume name.
    #[serde(default)]
    pub name: String,
    /// Domain or volume XML.
    #[serde(default)]
    pub xml: String,
    /// The metadata namespace to ask for, the image URL, or the bytes to upload (as text).
    #[serde(default)]
    pub arg: String,
    /// The image digest of `import-image`.
    #[serde(default)]
    pub sha256: String,
    /// Binary bytes for `upload-volume` (instead of `arg`).
    #[serde(default)]
    pub bytes: Vec<u8>,
}

fn default_host() -> String {
    "hv1".into()
}

struct HostileLibvirt;

/// Makes the call; its answer, printed.
fn call(config: &Config) -> Result<String, libvirt::LibvirtError> {
    let hv = Hypervisor::open(&config.host)?;
    let (pool, name, xml) = (
        config.pool.as_str(),
        config.name.as_str(),
        config.xml.as_str(),
    );
    let uri = Some(config.arg.as_str()).filter(|a| !a.is_empty());
    Ok(match config.attempt.as_str() {
        "define-domain" => format!("{:?}", hv.define_domain(xml)?),
        "lookup-domain" => format!("{:?}", hv.lookup_domain(name, uri)?),
        "start-domain" => format!("{:?}", hv.start_domain(name)?),
        "destroy-domain" => format!("{:?}", hv.destroy_domain(name)?),
        "undefine-domain" => format!("{:?}", hv.undefine_domain(name)?),
        "domain-addresses" => format!("{:?}", hv.domain_addresses(name)?),
        "list-domains" => {
            let names: Vec<String> = hv.list_domains(uri)?.into_iter().map(|d| d.name).collect();
            format!("domains: {}", names.join(","))
        }
        "pool-info" => format!("{:?}", hv.pool_info(pool)?),
        "refresh-pool" => format!("{:?}", hv.refresh_pool(pool)?),
        "create-volume" => format!("{:?}", hv.create_volume(pool, xml)?),
        "lookup-volume" => format!("{:?}", hv.lookup_volume(pool, name)?),
        "delete-volume" => format!("{:?}", hv.delete_volume(pool, name)?),
        "upload-volume" => {
            let data = if config.bytes.is_empty() {
                config.arg.as_bytes()
            } else {
                &config.bytes
            };
            format!("{:?}", hv.upload_volume(pool, name, data)?)
        }
        "import-image" => {
            let source = ImageSource {
                url: config.arg.clone(),
                sha256: config.sha256.clone(),
                format: "raw".into(),
            };
            format!("{:?}", hv.import_image(pool, name, &source)?)
        }
        other => format!("unknown attempt {other}"),
    })
}

fn attempt(config: &Config) -> Result<Instance, ProviderError> {
    match call(config) {
        Ok(answer) => Ok(Instance {
            provider_id: "hostile-libvirt-0".into(),
            name: "px-0".into(),
            state: InstanceState::Running,
            address: None,
            port: 3128,
            zone: None,
            created_at: None,
            owner: None,
            message: Some(answer),
        }),
        Err(e) => Err(ProviderError::Denied(format!("{e:?}"))),
    }
}

impl Provider for HostileLibvirt {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "hostile-libvirt".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Tries to escape the libvirt sandbox (tests only)".into(),
            capabilities: vec![Capability::Log, Capability::Libvirt],
            config_schema: String::new(),
        }
    }

    fn create(config: Config, _spec: InstanceSpec) -> Result<Instance, ProviderError> {
        attempt(&config)
    }

    fn get(config: Config, _provider_id: String) -> Result<Instance, ProviderError> {
        attempt(&config)
    }

    fn delete(config: Config, _provider_id: String) -> Result<(), ProviderError> {
        attempt(&config).map(|_| ())
    }

    fn list(config: Config) -> Result<Vec<Instance>, ProviderError> {
        attempt(&config).map(|i| vec![i])
    }

    fn check(config: Config) -> Result<Vec<CheckTarget>, ProviderError> {
        attempt(&config).map(|_| Vec::new())
    }
}

export_provider!(HostileLibvirt);
