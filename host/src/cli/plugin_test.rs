//! `proxy-operator plugin test COMPONENT --config ENTRY`: the conformance suite
//! (`crate::conformance`) against a component, with the capabilities the entry grants.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};

use super::plugin::{InstanceFile, SshFiles, engine, read_yaml};
use crate::conformance::{self, Report, Subject};
use crate::plugins::types::InstanceSpec;
use crate::plugins::{EngineOptions, PluginEngine};

/// Loads `file`, binds it to the entry in `instance_file` and runs every check; `spec_file`
/// replaces the default spec (a provider that needs a zone, an image or options).
pub async fn test(
    file: &Path,
    instance_file: &Path,
    spec_file: Option<&Path>,
    ssh: SshFiles<'_>,
) -> anyhow::Result<Report> {
    let entry: InstanceFile = read_yaml(instance_file, "provider instance file")?;
    let engine = match &entry.grants.kube {
        Some(_) => engine_with_kube(instance_file, ssh).await?,
        None => engine(ssh).await?,
    };
    let plugin = engine.load_file(file).await?;
    if let Some(t) = &entry.provider_type
        && t != &plugin.info.name
    {
        bail!(
            "{}: type `{t}` does not match the plugin, which describes itself as `{}`",
            instance_file.display(),
            plugin.info.name
        );
    }
    let grants = entry
        .grants
        .validate()
        .with_context(|| format!("{}: grants", instance_file.display()))?;
    let spec: InstanceSpec = match spec_file {
        Some(path) => read_yaml(path, "instance spec file")?,
        None => conformance::default_spec(),
    };
    let subject = Subject {
        engine,
        name: entry.name.unwrap_or_else(|| plugin.info.name.clone()),
        plugin,
        config: entry.config,
        grants,
    };
    Ok(conformance::run(&subject, spec).await)
}

/// An engine whose `kube` capability uses the cluster of `$KUBECONFIG` (or the in-cluster
/// account): the lifecycle checks of a provider granted `kube` need a real API server.
async fn engine_with_kube(
    instance_file: &Path,
    ssh: SshFiles<'_>,
) -> anyhow::Result<std::sync::Arc<PluginEngine>> {
    if ssh.is_some() {
        bail!(
            "{}: grants.kube with --ssh-key: plugin test binds one capability with a shared resource at a time; test the libvirt part with an entry without grants.kube",
            instance_file.display()
        );
    }
    let client = kube::Client::try_default().await.with_context(|| {
        format!(
            "{}: grants.kube needs a cluster: set KUBECONFIG to its kubeconfig",
            instance_file.display()
        )
    })?;
    // Tooling runs once: no pool to reserve, no cache to write.
    let options = EngineOptions {
        pool_instances: 0,
        kube: Some(client),
        ..EngineOptions::default()
    };
    PluginEngine::new(options, &prometheus::Registry::new())
}

/// `plugin test` as a command: the report as lines (or JSON with `json`); exit 0 only when every
/// check passed, 1 when one did not, 2 when the suite could not run at all.
pub async fn command(
    file: &Path,
    instance_file: &Path,
    spec_file: Option<&Path>,
    ssh: SshFiles<'_>,
    json: bool,
) -> ExitCode {
    let report = match test(file, instance_file, spec_file, ssh).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("error: printing the report: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        for line in report.lines() {
            println!("{line}");
        }
    }
    if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
