//! Orphan GC: deletes provider instances that carry this operator's identity but whose Proxy no
//! longer exists, once they are older than a minimum age.
//!
//! Order matters: each pass lists the provider's instances *before* listing Proxies. An instance in
//! the first list was created before it, and so was its Proxy (which is created first), so the
//! Proxy is in the second list: a Proxy created during a pass is never mistaken for missing.

use std::collections::HashSet;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use prometheus::{IntCounterVec, Opts, Registry};

use crate::api::Proxy;
use crate::plugins::types::Instance;
use crate::providers::{ProviderSet, Providers};

/// How the collector behaves.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Time between passes.
    pub interval: Duration,
    /// Instances younger than this are never collected (their Proxy may not be visible yet).
    pub min_age: Duration,
    /// Log and count orphans without deleting them.
    pub dry_run: bool,
    /// The namespace the operator watches, if only one; instances owned by Proxies of other
    /// namespaces are then left alone unless `allow_namespaced` is set.
    pub namespace: Option<String>,
    /// With a single watched namespace, also collect instances owned by other namespaces' Proxies
    /// (their Proxies are not listed, so every such instance is taken for an orphan).
    pub allow_namespaced: bool,
    /// Deletions running at once.
    pub parallelism: usize,
}

/// Counters of the collector, by provider instance.
#[derive(Clone)]
pub struct GcMetrics {
    found: IntCounterVec,
    deleted: IntCounterVec,
    failed: IntCounterVec,
}

impl GcMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str| -> prometheus::Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(name, help), &["provider"])?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        Ok(GcMetrics {
            found: counter(
                "proxy_operator_gc_orphans_found_total",
                "Orphaned instances found (in dry-run too).",
            )?,
            deleted: counter(
                "proxy_operator_gc_orphans_deleted_total",
                "Orphaned instances deleted.",
            )?,
            failed: counter(
                "proxy_operator_gc_orphans_failed_total",
                "Orphaned instances whose deletion failed.",
            )?,
        })
    }
}

/// What one pass did, per provider instance.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    pub found: Vec<String>,
    pub deleted: Vec<String>,
    pub failed: Vec<String>,
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn is_orphan(
    instance: &Instance,
    operator_id: &str,
    live: &HashSet<String>,
    options: &GcOptions,
) -> bool {
    let Some(owner) = &instance.owner else {
        return false; // not made by an operator: never touched
    };
    if owner.operator_id != operator_id || live.contains(&owner.uid) {
        return false;
    }
    if let Some(ns) = &options.namespace
        && &owner.namespace != ns
        && !options.allow_namespaced
    {
        return false;
    }
    // An instance of unknown age is not known to be old enough.
    match instance.created_at {
        Some(created) => now_seconds().saturating_sub(created) >= options.min_age.as_secs() as i64,
        None => false,
    }
}

/// One pass over every provider instance.
pub async fn pass(
    client: &Client,
    providers: &Providers,
    operator_id: &str,
    options: &GcOptions,
    metrics: &GcMetrics,
) -> anyhow::Result<Vec<(String, GcReport)>> {
    let mut reports = Vec::new();
    let mut names: Vec<&str> = providers.names().collect();
    names.sort();
    for name in names {
        let provider = providers.get(name).expect("listed names exist").clone();
        // Instances first, Proxies second (see the module comment).
        let instances = match provider.list().await {
            Ok(instances) => instances,
            Err(e) => {
                tracing::warn!(provider = name, "gc: cannot list instances: {e}");
                continue;
            }
        };
        let proxies: Api<Proxy> = match &options.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let live: HashSet<String> = proxies
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|p| p.uid())
            .collect();

        let orphans: Vec<Instance> = instances
            .into_iter()
            .filter(|i| is_orphan(i, operator_id, &live, options))
            .collect();
        let mut report = GcReport::default();
        for orphan in &orphans {
            let owner = orphan.owner.as_ref().expect("orphans have owners");
            tracing::info!(
                provider = name,
                instance = %orphan.provider_id,
                owner = %format!("{}/{} ({})", owner.namespace, owner.name, owner.uid),
                dry_run = options.dry_run,
                "gc: orphaned instance"
            );
            metrics.found.with_label_values(&[name]).inc();
            report.found.push(orphan.provider_id.clone());
        }
        if !options.dry_run {
            let results: Vec<(String, Result<(), String>)> = futures_util::stream::iter(orphans)
                .map(|orphan| {
                    let provider = provider.clone();
                    async move {
                        let result = provider
                            .delete(&orphan.provider_id)
                            .await
                            .map_err(|e| e.to_string());
                        (orphan.provider_id, result)
                    }
                })
                .buffer_unordered(options.parallelism.max(1))
                .collect()
                .await;
            for (id, result) in results {
                match result {
                    Ok(()) => {
                        metrics.deleted.with_label_values(&[name]).inc();
                        report.deleted.push(id);
                    }
                    Err(e) => {
                        tracing::warn!(provider = name, instance = %id, "gc: delete failed: {e}");
                        metrics.failed.with_label_values(&[name]).inc();
                        report.failed.push(id);
                    }
                }
            }
        }
        reports.push((name.to_string(), report));
    }
    Ok(reports)
}

/// Runs passes every `options.interval` until the task is dropped.
pub async fn run(
    client: Client,
    providers: ProviderSet,
    operator_id: String,
    options: GcOptions,
    metrics: GcMetrics,
) {
    let mut ticker = tokio::time::interval(options.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(e) = pass(
            &client,
            &providers.current(),
            &operator_id,
            &options,
            &metrics,
        )
        .await
        {
            tracing::warn!("gc pass failed: {e:#}");
        }
    }
}
