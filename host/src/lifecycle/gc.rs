//! Orphan GC: deletes provider instances that carry this operator's identity but whose Proxy no
//! longer exists, once they are older than a minimum age. It also deletes duplicates: an
//! instance of a live Proxy that is not the one the Proxy recorded (`status.providerID`), left by
//! a create that was cut off and asked again somewhere else.
//!
//! Order matters: each pass lists the provider's instances *before* listing Proxies. An instance in
//! the first list was created before it, and so was its Proxy (which is created first), so the
//! Proxy is in the second list: a Proxy created during a pass is never mistaken for missing.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::ListParams;
use kube::{Client, ResourceExt};
use prometheus::{IntCounterVec, Opts, Registry};

use crate::lifecycle::abandoned::AbandonedRecord;
use crate::provider::plugins::types::Instance;
use crate::provider::plugins::{CallError, ProviderInstance};
use crate::provider::providers::{ProviderSet, Providers};

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
    duplicates_found: IntCounterVec,
    duplicates_deleted: IntCounterVec,
    duplicates_failed: IntCounterVec,
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
            duplicates_found: counter(
                "proxy_operator_gc_duplicates_found_total",
                "Instances of a live Proxy other than the one it recorded, found (in dry-run too).",
            )?,
            duplicates_deleted: counter(
                "proxy_operator_gc_duplicates_deleted_total",
                "Duplicate instances of a live Proxy deleted.",
            )?,
            duplicates_failed: counter(
                "proxy_operator_gc_duplicates_failed_total",
                "Duplicate instances of a live Proxy whose deletion failed.",
            )?,
        })
    }
}

/// What one pass did, per provider instance: the orphans and duplicates it found, and every
/// instance (of either kind) it deleted or failed to delete.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    pub found: Vec<String>,
    pub duplicates: Vec<String>,
    pub deleted: Vec<String>,
    pub failed: Vec<String>,
}

/// The instance a live Proxy recorded: its provider instance (`spec.provider`) and
/// `status.providerID`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Recorded {
    provider: String,
    provider_id: String,
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

/// Whether `instance`, of provider instance `provider`, is a duplicate: made by this operator for
/// a live Proxy that recorded another instance of the same provider, which `listed` shows is
/// there and is that Proxy's, and old enough at `now` to be collected.
///
/// Each condition keeps a live proxy safe: a Proxy that has recorded nothing yet may still be
/// creating; a recorded instance that is not listed (or is listed as somebody else's: a
/// `providerID` edited by hand) cannot tell which of the two is the real one; and two listed
/// instances created at the same second are taken for one VM seen under two names (two config
/// entries reaching one hypervisor), never for a VM and its copy.
fn is_duplicate(
    instance: &Instance,
    provider: &str,
    operator_id: &str,
    recorded: &HashMap<String, Recorded>,
    listed: &[Instance],
    options: &GcOptions,
    now: i64,
) -> bool {
    let Some(owner) = &instance.owner else {
        return false;
    };
    if owner.operator_id != operator_id {
        return false;
    }
    let Some(recorded) = recorded.get(&owner.uid) else {
        return false;
    };
    if recorded.provider != provider || recorded.provider_id == instance.provider_id {
        return false;
    }
    let Some(kept) = listed
        .iter()
        .find(|i| i.provider_id == recorded.provider_id)
    else {
        return false;
    };
    if kept.owner.as_ref().map(|o| o.uid.as_str()) != Some(owner.uid.as_str())
        || kept.created_at == instance.created_at
    {
        return false;
    }
    match instance.created_at {
        Some(created) => now.saturating_sub(created) >= options.min_age.as_secs() as i64,
        None => false,
    }
}

/// The duplicates among `instances`, in their order (see [`is_duplicate`]).
fn duplicates(
    instances: &[Instance],
    provider: &str,
    operator_id: &str,
    recorded: &HashMap<String, Recorded>,
    options: &GcOptions,
    now: i64,
) -> Vec<Instance> {
    instances
        .iter()
        .filter(|i| is_duplicate(i, provider, operator_id, recorded, instances, options, now))
        .cloned()
        .collect()
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
    let (mut live, recorded) = live_proxies(client, options).await?;
    if let Some(abandoned) = &options.abandoned {
        live.extend(abandoned.owners(client).await?);
    }
    let now = now_seconds();
    let duplicates = duplicates(&instances, name, operator_id, &recorded, options, now);
    let orphans = orphans(instances, operator_id, &live, options, now);
    let mut report = GcReport::default();
    for duplicate in &duplicates {
        let owner = duplicate.owner.as_ref().expect("duplicates have owners");
        let kept = &recorded[&owner.uid].provider_id;
        tracing::info!(
            provider = name,
            instance = %duplicate.provider_id,
            kept = %kept,
            owner = %format!("{}/{} ({})", owner.namespace, owner.name, owner.uid),
            dry_run = options.dry_run,
            "gc: duplicate instance of a live proxy (its status.providerID names another)"
        );
        metrics.duplicates_found.with_label_values(&[name]).inc();
        report.duplicates.push(duplicate.provider_id.clone());
    }
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
    let duplicate_ids: HashSet<String> = duplicates.iter().map(|d| d.provider_id.clone()).collect();
    let condemned = duplicates.into_iter().chain(orphans).collect();
    for (id, result) in delete_all(provider, condemned, options.parallelism).await {
        let duplicate = duplicate_ids.contains(&id);
        match result {
            Ok(()) => {
                let counter = if duplicate {
                    &metrics.duplicates_deleted
                } else {
                    &metrics.deleted
                };
                counter.with_label_values(&[name]).inc();
                report.deleted.push(id);
            }
            Err(e) => {
                tracing::warn!(provider = name, instance = %id, error = %e, "gc: delete failed");
                let counter = if duplicate {
                    &metrics.duplicates_failed
                } else {
                    &metrics.failed
                };
                counter.with_label_values(&[name]).inc();
                report.failed.push(id);
            }
        }
    }
    Ok(Some(report))
}

/// The UIDs of the Proxies that exist (in the watched namespace, or all), and the instance each
/// one recorded, by UID.
async fn live_proxies(
    client: &Client,
    options: &GcOptions,
) -> kube::Result<(HashSet<String>, HashMap<String, Recorded>)> {
    let proxies = crate::api::proxies(client.clone(), options.namespace.as_deref());
    let items = crate::support::kubeclient::list_all(&proxies, &ListParams::default()).await?;
    let live = items.iter().filter_map(|p| p.uid()).collect();
    let recorded = items
        .iter()
        .filter_map(|p| {
            let provider_id = p.status.as_ref()?.provider_id.clone()?;
            let recorded = Recorded {
                provider: p.spec.provider.clone(),
                provider_id,
            };
            Some((p.uid()?, recorded))
        })
        .collect();
    Ok((live, recorded))
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
    use crate::provider::plugins::types::{InstanceState, Owner};

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

    /// Instance `id` of Proxy `uid`, `age` seconds old, as the provider lists it.
    fn of(id: &str, uid: &str, operator: &str, age: Option<i64>) -> Instance {
        Instance {
            provider_id: id.into(),
            ..instance(Some(operator), "crawl", uid, age)
        }
    }

    /// Proxy `live` recorded `z1/px` at provider `gcp-eu`; the provider lists that one (an hour
    /// old) and `candidate`.
    /// Proxy `live` recorded instance `z1/px` of provider instance `gcp-eu`.
    fn live_proxy_recorded_z1() -> HashMap<String, Recorded> {
        [(
            "live".to_string(),
            Recorded {
                provider: "gcp-eu".into(),
                provider_id: "z1/px".into(),
            },
        )]
        .into()
    }

    #[rstest]
    #[case::another_instance_of_a_live_proxy(of("z2/px", "live", OPERATOR, Some(900)), true)]
    #[case::exactly_min_age(of("z2/px", "live", OPERATOR, Some(600)), true)]
    #[case::too_young(of("z2/px", "live", OPERATOR, Some(599)), false)]
    #[case::unknown_age(of("z2/px", "live", OPERATOR, None), false)]
    #[case::the_recorded_one(of("z1/px", "live", OPERATOR, Some(3600)), false)]
    #[case::the_recorded_one_under_another_name(of("hv2/px", "live", OPERATOR, Some(3600)), false)]
    #[case::a_proxy_that_recorded_nothing_yet(of("z2/px", "creating", OPERATOR, Some(900)), false)]
    #[case::an_orphan_is_not_a_duplicate(of("z2/px", "gone", OPERATOR, Some(900)), false)]
    #[case::another_operators(of("z2/px", "live", "op-2", Some(900)), false)]
    #[case::made_by_hand(Instance { owner: None, ..of("z2/px", "live", OPERATOR, Some(900)) }, false)]
    fn which_instances_are_duplicates(#[case] candidate: Instance, #[case] duplicate: bool) {
        let recorded = live_proxy_recorded_z1();
        let listed = [of("z1/px", "live", OPERATOR, Some(3600)), candidate.clone()];
        let options = options(None, false);
        assert_eq!(
            is_duplicate(
                &candidate, "gcp-eu", OPERATOR, &recorded, &listed, &options, NOW
            ),
            duplicate
        );
    }

    /// The recorded instance must be listed, as the same Proxy's, at the same provider instance.
    #[rstest]
    #[case::recorded_and_listed("gcp-eu", of("z1/px", "live", OPERATOR, Some(3600)), true)]
    #[case::listed_at_another_provider("gcp-us", of("z1/px", "live", OPERATOR, Some(3600)), false)]
    #[case::recorded_not_listed("gcp-eu", of("z9/other", "live", OPERATOR, Some(3600)), false)]
    #[case::recorded_is_another_proxys("gcp-eu", of("z1/px", "other", OPERATOR, Some(3600)), false)]
    fn a_duplicate_needs_the_recorded_instance_listed_as_the_proxys(
        #[case] provider: &str,
        #[case] listed_as_recorded: Instance,
        #[case] duplicate: bool,
    ) {
        let recorded = live_proxy_recorded_z1();
        let candidate = of("z2/px", "live", OPERATOR, Some(900));
        let listed = [listed_as_recorded, candidate.clone()];
        assert_eq!(
            is_duplicate(
                &candidate,
                provider,
                OPERATOR,
                &recorded,
                &listed,
                &options(None, false),
                NOW
            ),
            duplicate
        );
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
