//! `proxy-operator plugin test COMPONENT --config ENTRY`: the conformance suite
//! (`crate::provider::conformance`) against a component, with the capabilities the entry grants.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};

use super::plugin::{InstanceFile, LoadedEntry, RunAccess, SshFiles, load_entry, read_yaml};
use crate::provider::conformance::{self, Report, Subject};
use crate::provider::plugins::types::InstanceSpec;

/// Loads `file`, binds it to the entry in `instance_file` and runs every check; `spec_file`
/// replaces the default spec (a provider that needs a zone, an image or options).
pub async fn test(
    file: &Path,
    instance_file: &Path,
    spec_file: Option<&Path>,
    ssh: SshFiles<'_>,
) -> anyhow::Result<Report> {
    let entry: InstanceFile = read_yaml(instance_file, "provider instance file")?;
    if entry.grants.kube.is_some() && ssh.is_some() {
        bail!(
            "{}: grants.kube with --ssh-key: plugin test binds one capability with a shared resource at a time; test the libvirt part with an entry without grants.kube",
            instance_file.display()
        );
    }
    // The cluster of a `kube` grant comes from `$KUBECONFIG` (or the in-cluster account).
    let access = RunAccess {
        ssh,
        kubeconfig: None,
    };
    let LoadedEntry {
        engine,
        plugin,
        entry,
        name,
    } = load_entry(file, instance_file, access).await?;
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
        name,
        plugin,
        config: entry.config,
        grants,
    };
    Ok(conformance::run(&subject, spec).await)
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
