//! What the benches that run plugins or the operator binary share. Each bench includes this
//! module and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The built providers (`make plugins`), or `PROXY_OPERATOR_PLUGINS_DIR`.
pub fn plugins_dir() -> PathBuf {
    std::env::var_os("PROXY_OPERATOR_PLUGINS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"))
}

/// `operator` made `proxy-operator run` for a bench: plain HTTP and open metrics on loopback
/// (metrics on a free port, the discovery API at `discovery_addr`: never the default
/// `0.0.0.0:8090`), the providers config at `providers`, the built plugins, Proxies of
/// `namespace` only. The caller adds what its bench needs.
pub fn operator_run<'c>(
    operator: &'c mut tokio::process::Command,
    providers: &Path,
    namespace: &str,
    discovery_addr: &str,
) -> &'c mut tokio::process::Command {
    operator
        .args(["run", "--discovery-plain-http", "--metrics-insecure"])
        .args(["--discovery-addr", discovery_addr])
        .arg("--providers-config")
        .arg(providers)
        .arg("--plugins-dir")
        .arg(plugins_dir())
        .args([
            "--proxy-namespace",
            namespace,
            "--metrics-addr",
            "127.0.0.1:0",
        ])
}

/// A million sessions (each bound by a grant) and a million per-target cooldowns (each from a
/// `blocked` report naming a target), as crawlers' traffic makes them, put into `store`.
pub fn hold_state(
    store: &proxy_operator::leasing::leases::LeaseStore,
    sessions: usize,
    cooldowns: usize,
) {
    use proxy_operator::leasing::leases::{LeaseRequest, Outcome};
    for i in 0..sessions {
        let (lease, _) = store
            .grant(&LeaseRequest {
                session: Some(format!("held-session-{i}")),
                ..Default::default()
            })
            .unwrap();
        store.release(&lease.id).unwrap();
    }
    let _ = store.take_changes();
    for i in 0..cooldowns {
        let (lease, _) = store.grant(&LeaseRequest::default()).unwrap();
        store
            .report_for(
                &lease.id,
                Outcome::Blocked,
                Some(&format!("held-{i}.example")),
            )
            .unwrap();
    }
}

/// A ProxyPool `name` of `replicas` Proxies of `provider`, nothing else set.
pub fn pool_of(
    name: &str,
    replicas: usize,
    provider: &str,
) -> anyhow::Result<proxy_operator::api::ProxyPool> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "ProxyPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"spec": {"provider": provider}}},
    }))?)
}
