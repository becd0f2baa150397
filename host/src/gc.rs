//! Orphan GC: deletes provider instances that carry this operator's identity but whose Proxy no
//! longer exists, once they are older than a minimum age.
//!
//! Order matters: each pass lists the provider's instances *before* listing Proxies. An instance in
//! the first list was created before it, and so was its Proxy (which is created first), so the
//! Proxy is in the second list: a Proxy created during a pass is never mistaken for missing.

use std::collections::HashSet;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::ListParams;
use kube::{Client, ResourceExt};
use prometheus::{IntCounterVec, Opts, Registry};

use crate::abandoned::AbandonedRecord;
use crate::plugins::types::Instance;
use crate::plugins::{CallError, ProviderInstance};
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
    /// Where Proxies that left their instance running (`skip-cleanup`) are recorded: those
    /// instances are never collected.
    pub abandoned: Option<AbandonedRecord>,
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

/// Whether `instance` is this operator's and its Proxy is gone (not in `live`), and it is old
/// enough at `now` (seconds since the epoch) to be collected.
fn is_orphan(
    instance: &Instance,
    operator_id: &str,
    live: &HashSet<String>,
    options: &GcOptions,
    now: i64,
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
        Some(created) => now.saturating_sub(created) >= options.min_age.as_secs() as i64,
        None => false,
    }
}

/// The orphans among `instances`, in their order (see [`is_orphan`]).
fn orphans(
    instances: Vec<Instance>,
    operator_id: &str,
    live: &HashSet<String>,
    options: &GcOptions,
    now: i64,
) -> Vec<Instance> {
    instances
        .into_iter()
        .filter(|i| is_orphan(i, operator_id, live, options, now))
        .collect()
}

/// One pass over every provider instance.
#[tracing::instrument(name = "gc_pass", skip_all)]
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
        let provider = providers.get(name).expect("listed names exist");
        if let Some(report) = collect(client, name, provider, operator_id, options, metrics).await?
        {
            reports.push((name.to_string(), report));
        }
    }
    Ok(reports)
}

/// Collects the orphans of one provider instance; `None` when its instances cannot be listed
/// (the next pass tries again).
#[tracing::instrument(name = "gc_provider", skip_all, fields(provider = %name))]
async fn collect(
    client: &Client,
    name: &str,
    provider: &ProviderInstance,
    operator_id: &str,
    options: &GcOptions,
    metrics: &GcMetrics,
) -> anyhow::Result<Option<GcReport>> {
    // Instances first, Proxies second (see the module comment).
    let instances = match provider.list().await {
        Ok(instances) => instances,
        Err(e) => {
            tracing::warn!(provider = name, error = %e, "gc: cannot list instances");
            return Ok(None);
        }
    };
    let mut live = live_proxy_uids(client, options).await?;
    if let Some(abandoned) = &options.abandoned {
        live.extend(abandoned.owners(client).await?);
    }
    let orphans = orphans(instances, operator_id, &live, options, now_seconds());
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
    if options.dry_run {
        return Ok(Some(report));
    }
    for (id, result) in delete_all(provider, orphans, options.parallelism).await {
        match result {
            Ok(()) => {
                metrics.deleted.with_label_values(&[name]).inc();
                report.deleted.push(id);
            }
            Err(e) => {
                tracing::warn!(provider = name, instance = %id, error = %e, "gc: delete failed");
                metrics.failed.with_label_values(&[name]).inc();
                report.failed.push(id);
            }
        }
    }
    Ok(Some(report))
}

/// The UIDs of the Proxies that exist (in the watched namespace, or all).
async fn live_proxy_uids(client: &Client, options: &GcOptions) -> kube::Result<HashSet<String>> {
    let proxies = crate::api::proxies(client.clone(), options.namespace.as_deref());
    Ok(proxies
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|p| p.uid())
        .collect())
}

/// Deletes `orphans`, `parallelism` at a time: each one's provider ID and result.
async fn delete_all(
    provider: &ProviderInstance,
    orphans: Vec<Instance>,
    parallelism: usize,
) -> Vec<(String, Result<(), CallError>)> {
    futures_util::stream::iter(orphans)
        .map(|orphan| async move {
            let result = provider.delete(&orphan.provider_id).await.map(drop);
            (orphan.provider_id, result)
        })
        .buffer_unordered(parallelism.max(1))
        .collect()
        .await
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
            tracing::warn!(error = %format_args!("{e:#}"), "gc pass failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;
    use crate::plugins::types::{InstanceState, Owner};

    const NOW: i64 = 1_700_000_000;
    const OPERATOR: &str = "op-1";

    fn options(namespace: Option<&str>, allow_namespaced: bool) -> GcOptions {
        GcOptions {
            interval: Duration::from_secs(60),
            min_age: Duration::from_secs(600),
            dry_run: false,
            namespace: namespace.map(String::from),
            allow_namespaced,
            parallelism: 4,
            abandoned: None,
        }
    }

    /// An instance `age` seconds old (`None`: of unknown age) owned by Proxy `uid` in
    /// `namespace` of operator `operator` (`None`: not made by an operator).
    fn instance(operator: Option<&str>, namespace: &str, uid: &str, age: Option<i64>) -> Instance {
        Instance {
            provider_id: format!("vm-{uid}"),
            name: format!("proxy-{uid}"),
            state: InstanceState::Running,
            address: None,
            port: 3128,
            zone: None,
            created_at: age.map(|a| NOW - a),
            owner: operator.map(|operator_id| Owner {
                namespace: namespace.into(),
                name: format!("p-{uid}"),
                uid: uid.into(),
                operator_id: operator_id.into(),
            }),
            message: None,
        }
    }

    #[rstest]
    #[case::its_proxy_is_gone(
        instance(Some(OPERATOR), "crawl", "gone", Some(3600)),
        options(None, false),
        true
    )]
    #[case::its_proxy_exists(
        instance(Some(OPERATOR), "crawl", "live", Some(3600)),
        options(None, false),
        false
    )]
    #[case::exactly_min_age(
        instance(Some(OPERATOR), "crawl", "gone", Some(600)),
        options(None, false),
        true
    )]
    #[case::too_young(
        instance(Some(OPERATOR), "crawl", "gone", Some(599)),
        options(None, false),
        false
    )]
    #[case::unknown_age(
        instance(Some(OPERATOR), "crawl", "gone", None),
        options(None, false),
        false
    )]
    #[case::made_by_hand(
        instance(None, "crawl", "gone", Some(3600)),
        options(None, false),
        false
    )]
    #[case::another_operators(
        instance(Some("op-2"), "crawl", "gone", Some(3600)),
        options(None, false),
        false
    )]
    #[case::in_the_watched_namespace(
        instance(Some(OPERATOR), "crawl", "gone", Some(3600)),
        options(Some("crawl"), false),
        true
    )]
    #[case::of_an_unwatched_namespace(
        instance(Some(OPERATOR), "other", "gone", Some(3600)),
        options(Some("crawl"), false),
        false
    )]
    #[case::of_an_unwatched_namespace_allowed(
        instance(Some(OPERATOR), "other", "gone", Some(3600)),
        options(Some("crawl"), true),
        true
    )]
    fn which_instances_are_orphans(
        #[case] instance: Instance,
        #[case] options: GcOptions,
        #[case] orphan: bool,
    ) {
        let live: HashSet<String> = ["live".to_string()].into();
        assert_eq!(is_orphan(&instance, OPERATOR, &live, &options, NOW), orphan);
    }

    #[test]
    fn only_the_orphans_are_kept_for_deletion_in_their_order() {
        let live: HashSet<String> = ["b".to_string()].into();
        let instances = vec![
            instance(Some(OPERATOR), "crawl", "c", Some(3600)),
            instance(Some(OPERATOR), "crawl", "b", Some(3600)),
            instance(None, "crawl", "x", Some(3600)),
            instance(Some(OPERATOR), "crawl", "a", Some(3600)),
            instance(Some(OPERATOR), "crawl", "young", Some(10)),
        ];
        let found: Vec<String> = orphans(instances, OPERATOR, &live, &options(None, false), NOW)
            .into_iter()
            .map(|i| i.provider_id)
            .collect();
        assert_eq!(found, ["vm-c", "vm-a"]);
    }
}
