//! A hostile provider for the sandbox tests (`host/tests/sandbox.rs`); never shipped. Its config
//! names one `attempt`, and every function tries it: each is something a provider written by
//! somebody else could do to the operator that runs it. The host must bound or refuse all of
//! them.

use proxy_operator_sdk::capabilities::{self, Level, kube, libvirt};
use proxy_operator_sdk::{
    Capability, CheckTarget, Instance, InstanceSpec, InstanceState, PluginInfo, Provider,
    ProviderError, export_provider, transient,
};
use serde::Deserialize;

/// The provider instance config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// What to try (see [`attempt`]).
    pub attempt: String,
    /// A size or count for the attempts that take one.
    #[serde(default)]
    pub n: u64,
    /// The request of the `http` attempt.
    #[serde(default)]
    pub method: String,
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
}

struct Hostile;

fn instance(i: u64, message: Option<String>) -> Instance {
    Instance {
        provider_id: format!("hostile-{i}"),
        name: format!("px-{i}"),
        state: InstanceState::Running,
        address: Some("127.0.0.1".into()),
        port: 3128,
        zone: None,
        created_at: None,
        owner: None,
        message,
    }
}

/// The attempt, as the answer of any function that returns an instance.
fn attempt(config: &Config) -> Result<Instance, ProviderError> {
    match config.attempt.as_str() {
        // A retry hint of zero would make the controller call again at once, forever.
        "retry-after-zero" => Err(transient("try again", Some(0))),
        // A retry hint of ~292 million years overflows the scheduler's deadline arithmetic.
        "retry-after-huge" => Err(transient("try again much later", Some(u64::MAX))),
        // Megabytes of message would go into status, events and logs.
        "long-error" => Err(ProviderError::Permanent("x".repeat(config.n as usize))),
        "long-instance-message" => Ok(instance(0, Some("y".repeat(config.n as usize)))),
        // Floods the operator's log.
        "log-flood" => {
            for i in 0..config.n {
                capabilities::log(Level::Error, &format!("flood line {i}"), &[]);
            }
            Ok(instance(0, None))
        }
        // A request chosen by the test: a `Host` header naming another virtual host, TRACE, …
        "http" => {
            let request = capabilities::Request {
                method: config.method.clone(),
                url: config.url.clone(),
                headers: config.headers.clone(),
                body: Vec::new(),
                timeout_ms: None,
            };
            match capabilities::http_send(&request) {
                Ok(response) => Ok(instance(0, Some(format!("HTTP {}", response.status)))),
                Err(e) => Err(ProviderError::Denied(format!("{e:?}"))),
            }
        }
        // A call into a capability it did not declare (granted or not).
        "undeclared-kube" => match kube::list("v1", "ConfigMap", None) {
            Ok(_) => Ok(instance(0, Some("listed".into()))),
            Err(e) => Err(ProviderError::Denied(format!("{e:?}"))),
        },
        "undeclared-libvirt" => match libvirt::Hypervisor::open("hv1") {
            Ok(_) => Ok(instance(0, Some("opened".into()))),
            Err(e) => Err(ProviderError::Denied(format!("{e:?}"))),
        },
        _ => Ok(instance(0, None)),
    }
}

impl Provider for Hostile {
    type Config = Config;

    fn info() -> PluginInfo {
        PluginInfo {
            name: "hostile".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Tries to escape the sandbox (tests only)".into(),
            // Not `kube` or `libvirt`: the tests check that calls into them are refused.
            capabilities: vec![Capability::Log, Capability::Http],
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
        match config.attempt.as_str() {
            // More instances than the host takes in one answer.
            "huge-list" => Ok((0..config.n).map(|i| instance(i, None)).collect()),
            _ => attempt(&config).map(|i| vec![i]),
        }
    }

    fn check(config: Config) -> Result<Vec<CheckTarget>, ProviderError> {
        match config.attempt.as_str() {
            // Many targets, each with 64 KiB of message.
            "huge-check" => Ok((0..config.n)
                .map(|i| CheckTarget {
                    target: format!("target-{i}"),
                    ok: false,
                    reason: "Unreachable".into(),
                    message: "w".repeat(1 << 16),
                    latency_ms: 0,
                })
                .collect()),
            // A "reason" (a bounded label in conditions and metrics) of 4 KiB.
            "long-check-reason" => Ok(vec![CheckTarget {
                target: "api".into(),
                ok: false,
                reason: "z".repeat(4096),
                message: String::new(),
                latency_ms: 0,
            }]),
            _ => attempt(&config).map(|_| Vec::new()),
        }
    }
}

export_provider!(Hostile);
