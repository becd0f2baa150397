//! The pool controller's I/O: reads a pool and its Proxies, asks `decide::plan` what to do, and
//! does it (creates, drain annotations, deletes, the status), one pool at a time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::events::{EventType, Recorder};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use super::access;
use super::capped;
use super::decide::{self, Desired, DrainReason, Member, Plan, Slot};
use super::member;
#[cfg(test)]
use super::spec::template_hash;
use super::spec::{Invalid, resolve};
use crate::api::conditions::set_named;
use crate::api::{PoolGatewaySpec, Proxy, ProxyPool, ProxyPoolStatus};
use crate::leasing::leases::store::PoolGateway;
use crate::leasing::leases::{LeaseStore, ProxyKey};
use crate::provider::providers::ProviderSet;
use crate::support::events;
use crate::support::retry::{self, Backoffs, Wait};

use crate::api::labels::{
    DRAIN_REASON_ANNOTATION, DRAINING_ANNOTATION, POOL_FINALIZER, POOL_LABEL, TEMPLATE_LABEL,
};
/// Proxies made or changed at once: enough to make a 1000-Proxy pool in seconds, few enough to
/// stay inside the API server's default in-flight limits.
const CONCURRENT_WRITES: usize = 16;

/// What every pool reconcile shares.
pub struct PoolContext {
    pub client: Client,
    pub providers: ProviderSet,
    pub recorder: Recorder,
    /// Lease ends and `blocked` counts of the pool's proxies; told which pools exist.
    pub leases: Arc<LeaseStore>,
    /// Each pool's backoff after failed requests to the API server.
    backoffs: Backoffs<ProxyKey>,
    /// Every Proxy the operator watches, as its cache keeps them: what counts against a provider
    /// instance's cap, without a list per reconcile.
    proxies: Store<Proxy>,
    /// Whether each pool was held back by a cap when last announced (one Event per turn).
    announced: capped::Announced,
    /// One pool on capped instances counts and creates at a time.
    cap_turns: capped::Turns,
    /// The namespaces' ProxyQuotas and Proxies the creates stay within (`quota.rs`); none by
    /// default.
    pub quotas: crate::lifecycle::quota::QuotaView,
}

impl PoolContext {
    pub fn new(
        client: Client,
        providers: ProviderSet,
        leases: Arc<LeaseStore>,
        proxies: Store<Proxy>,
    ) -> Self {
        PoolContext {
            recorder: events::recorder(client.clone()),
            client,
            providers,
            leases,
            backoffs: Backoffs::default(),
            proxies,
            announced: Default::default(),
            cap_turns: Default::default(),
            quotas: Default::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Runs the pool controller until `shutdown`; a pool is reconciled when it or one of its
/// Proxies changes, when a plugin or the providers config changes, and when its plan asks.
pub async fn run_until(
    ctx: Arc<PoolContext>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (pools, proxies): (Api<ProxyPool>, Api<Proxy>) = match namespace {
        Some(ns) => (
            Api::namespaced(ctx.client.clone(), ns),
            Api::namespaced(ctx.client.clone(), ns),
        ),
        None => (Api::all(ctx.client.clone()), Api::all(ctx.client.clone())),
    };
    let controller = Controller::new(pools, watcher::Config::default().any_semantic());
    let known = tell_known_pools(controller.store(), ctx.leases.clone());
    let run = controller
        .owns(
            proxies,
            watcher::Config::default().labels(POOL_LABEL).any_semantic(),
        )
        .reconcile_all_on(ctx.providers.swaps())
        .reconcile_on(blocked_pools(&ctx.leases))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "pool reconcile failed");
            }
        });
    // The controller ends on shutdown; the pool list with it.
    tokio::select! {
        () = run => {}
        () = known => {}
    }
}

/// The pools whose proxies crawlers report blocked, as they are reported: `recycleAfter` acts at
/// once rather than at the pool's next periodic look.
fn blocked_pools(
    leases: &LeaseStore,
) -> impl futures_util::Stream<Item = kube::runtime::reflector::ObjectRef<ProxyPool>> + Send + 'static
{
    futures_util::stream::unfold(leases.blocked_pools(), |mut rx| async move {
        let pool = rx.recv().await?;
        Some((
            kube::runtime::reflector::ObjectRef::new(&pool.name).within(&pool.namespace),
            rx,
        ))
    })
}

/// Keeps the lease table's list of pools and their gateway settings current (every 2 s, from
/// the controller's cache): a crawler asking for a pool that does not exist gets a 404, one
/// scaling from zero a 503.
async fn tell_known_pools(
    pools: kube::runtime::reflector::Store<ProxyPool>,
    leases: Arc<LeaseStore>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        let state = pools.state();
        let key = |pool: &ProxyPool| ProxyKey {
            namespace: pool.namespace().unwrap_or_default().into(),
            name: pool.name_any().into(),
        };
        let gateways = state
            .iter()
            .filter_map(|pool| Some((key(pool), pool_gateway(pool.spec.gateway.as_ref()?))))
            .collect();
        leases.set_known_pools(state.iter().map(|pool| key(pool)));
        leases.set_pool_gateways(gateways);
    }
}

/// What the lease table keeps of a pool's `spec.gateway`.
fn pool_gateway(spec: &PoolGatewaySpec) -> PoolGateway {
    PoolGateway {
        max_connections_per_proxy: spec.max_connections_per_proxy,
        block_statuses: spec.block_statuses.clone(),
        block_body_patterns: spec.block_body_patterns.clone(),
    }
}

fn error_policy(
    pool: Arc<ProxyPool>,
    error: &kube::runtime::finalizer::Error<Error>,
    ctx: Arc<PoolContext>,
) -> Action {
    use kube::runtime::finalizer::Error as F;
    let wait = match error {
        F::ApplyFailed(Error::Kube(e))
        | F::CleanupFailed(Error::Kube(e))
        | F::AddFinalizer(e)
        | F::RemoveFinalizer(e) => retry::after_api_error(e),
        F::UnnamedObject | F::InvalidFinalizer => Wait::Backoff { at_least: None },
    };
    let after = ctx.backoffs.after_failure(ProxyKey::of(&*pool), wait);
    tracing::warn!(pool = %pool.name_any(), namespace = ?pool.namespace(), error = %error, retry_in = ?after, "pool reconcile error");
    Action::requeue(after)
}

#[tracing::instrument(skip_all, fields(pool = %pool.name_any(), namespace = ?pool.namespace()))]
async fn reconcile(
    pool: Arc<ProxyPool>,
    ctx: Arc<PoolContext>,
) -> Result<Action, kube::runtime::finalizer::Error<Error>> {
    let key = ProxyKey::of(&*pool);
    let api: Api<ProxyPool> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let result = finalizer(&api, POOL_FINALIZER, pool, |event| async {
        match event {
            Finalizer::Apply(pool) => apply(&pool, &ctx).await,
            Finalizer::Cleanup(pool) => cleanup(&pool, &ctx).await,
        }
    })
    .await;
    if result.is_ok() {
        ctx.backoffs.succeeded(&key);
    }
    result
}

/// One step towards the pool's spec.
async fn apply(pool: &ProxyPool, ctx: &PoolContext) -> Result<Action, Error> {
    let namespace = pool.namespace().unwrap_or_default();
    // Crawlers may ask for it from now on (503 until it has a proxy, not 404).
    ctx.leases.add_known_pool(ProxyKey {
        namespace: namespace.clone().into(),
        name: pool.name_any().into(),
    });
    let proxies: Api<Proxy> = Api::namespaced(ctx.client.clone(), &namespace);
    let providers = ctx.providers.current();
    let desired = match resolve(pool, &providers) {
        Ok(desired) => desired,
        Err(invalid) => {
            write_invalid(pool, ctx, &invalid).await?;
            // A providers config or plugin change reconciles every pool again.
            return Ok(Action::await_change());
        }
    };
    if let Some(invalid) = access::refusal(pool, &ctx.client, &ctx.providers).await? {
        write_invalid(pool, ctx, &invalid).await?;
        // A namespace's labels may change without a providers-config change: look again.
        return Ok(Action::requeue(access::RECHECK));
    }
    let members = members(pool, &proxies, &ctx.leases).await?;
    let cache = (&ctx.proxies, &ctx.cap_turns);
    let caps = capped::caps_for(pool, &desired, &members, &providers, cache).await;
    let now = crate::leasing::leases::store::now_ms();
    let mut plan = decide::plan(&desired, &members, &caps.uses, now);
    let stopped = super::quota::clip_to_quota(&ctx.quotas, pool, &members, &mut plan);
    carry_out(pool, &proxies, ctx, &desired, &plan).await?;
    capped::settle(&caps, &ctx.proxies, pool, &members, &plan).await;
    write_status(pool, ctx, &desired, &plan, &caps, stopped.as_ref()).await?;
    Ok(match plan.requeue_after {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// Deleting a pool deletes its Proxies; each goes through its own finalizer (the instance is
/// deleted at the provider), and their leases end.
async fn cleanup(pool: &ProxyPool, ctx: &PoolContext) -> Result<Action, Error> {
    ctx.announced.forget(&ProxyKey::of(pool));
    let namespace = pool.namespace().unwrap_or_default();
    let proxies: Api<Proxy> = Api::namespaced(ctx.client.clone(), &namespace);
    let owned = owned_proxies(pool, &proxies, |proxy| {
        let deleting = proxy.metadata.deletion_timestamp.is_some();
        (proxy.name_any(), deleting)
    })
    .await?;
    let count = owned.len();
    for (name, deleting) in owned {
        if !deleting {
            delete_proxy(&proxies, &name).await?;
        }
    }
    if count > 0 {
        publish(
            pool,
            ctx,
            EventType::Normal,
            "Deleting",
            "Delete",
            format!("the pool is deleted: deleting its {count} Proxies"),
        )
        .await;
    }
    Ok(Action::await_change())
}

/// The pool's Proxies: labelled with its name and owned by it (not a same-named pool's from
/// before, nor a hand-made Proxy carrying the label). A fresh list, not a cache: a create or a
/// drain of the step before is always seen, so nothing is made or drained twice.
/// What `keep` makes of each, page by page (a pool of 10 000 is never held whole).
async fn owned_proxies<T>(
    pool: &ProxyPool,
    proxies: &Api<Proxy>,
    mut keep: impl FnMut(Proxy) -> T,
) -> Result<Vec<T>, Error> {
    let uid = pool.uid().unwrap_or_default();
    let selector = format!("{POOL_LABEL}={}", pool.name_any());
    let params = ListParams::default().labels(&selector);
    let kept = crate::support::kubeclient::list_all_kept(proxies, &params, |proxy| {
        let owned = proxy
            .owner_references()
            .iter()
            .any(|owner| owner.controller == Some(true) && owner.uid == uid);
        owned.then(|| keep(proxy))
    })
    .await?;
    Ok(kept)
}

async fn members(
    pool: &ProxyPool,
    proxies: &Api<Proxy>,
    leases: &LeaseStore,
) -> Result<Vec<Member>, Error> {
    let usage = leases.usage();
    owned_proxies(pool, proxies, |proxy| member::of(&proxy, &usage)).await
}

async fn carry_out(
    pool: &ProxyPool,
    proxies: &Api<Proxy>,
    ctx: &PoolContext,
    desired: &Desired,
    plan: &Plan,
) -> Result<(), Error> {
    // Owned values in the streams: borrowed items make the future not provably `Send`
    // (rust-lang/rust#102211).
    let creates: Vec<Proxy> = plan
        .create
        .iter()
        .map(|slot| new_proxy(pool, desired, slot))
        .collect();
    let made: Vec<Result<String, kube::Error>> = futures_util::stream::iter(creates)
        .map(|proxy| async move { create_member(proxies, pool, proxy).await })
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    let made_count = made.iter().filter(|r| r.is_ok()).count();
    if made_count > 0 {
        publish(
            pool,
            ctx,
            EventType::Normal,
            "Created",
            "Create",
            format!("made {made_count} Proxies ({} wanted)", desired.replicas),
        )
        .await;
    }
    if let Some(Err(e)) = made.into_iter().find(Result::is_err) {
        publish(
            pool,
            ctx,
            EventType::Warning,
            "CreateFailed",
            "Create",
            format!("cannot make a Proxy: {e}"),
        )
        .await;
        return Err(e.into());
    }

    let drained: Vec<Result<(), kube::Error>> = futures_util::stream::iter(plan.drain.clone())
        .map(|(name, reason)| async move { drain(proxies, &name, reason).await })
        .buffer_unordered(CONCURRENT_WRITES)
        .collect()
        .await;
    for (name, reason) in &plan.drain {
        tracing::info!(proxy = %name, reason = reason.as_str(), "draining");
    }
    if !plan.drain.is_empty() {
        publish(
            pool,
            ctx,
            EventType::Normal,
            "Draining",
            "Drain",
            drain_note(&plan.drain),
        )
        .await;
    }
    drained.into_iter().collect::<Result<Vec<()>, _>>()?;

    for name in &plan.delete {
        delete_proxy(proxies, name).await?;
    }
    if !plan.delete.is_empty() {
        publish(
            pool,
            ctx,
            EventType::Normal,
            "Deleted",
            "Delete",
            format!(
                "deleted {} drained Proxies that hold no lease: {}",
                plan.delete.len(),
                plan.delete.join(", ")
            ),
        )
        .await;
    }
    Ok(())
}

fn drain_note(drain: &[(String, DrainReason)]) -> String {
    let mut by_reason: BTreeMap<DrainReason, Vec<&str>> = BTreeMap::new();
    for (name, reason) in drain {
        by_reason.entry(*reason).or_default().push(name);
    }
    by_reason
        .iter()
        .map(|(reason, names)| {
            format!(
                "{} ({}): {}",
                reason.as_str(),
                names.len(),
                names.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A Proxy of the pool: the template, placed in `slot`, labelled, owned by the pool. Its name
/// is new (a random suffix), never a deleted member's: the lease table keeps what it knows of
/// a proxy (blocked reports, sessions) by name.
fn new_proxy(pool: &ProxyPool, desired: &Desired, slot: &Slot) -> Proxy {
    let template = &pool.spec.template;
    let metadata = template.metadata.clone().unwrap_or_default();
    let mut labels = metadata.labels;
    labels.insert(POOL_LABEL.into(), pool.name_any());
    labels.insert(TEMPLATE_LABEL.into(), desired.template_hash.clone());
    let mut spec = template.spec.clone();
    spec.provider = slot.provider.clone();
    if slot.zone.is_some() || spec.placement.is_some() {
        spec.placement.get_or_insert_with(Default::default).zone = slot.zone.clone();
    }
    Proxy {
        metadata: ObjectMeta {
            name: Some(member_name(&pool.name_any())),
            namespace: pool.namespace(),
            labels: Some(labels),
            annotations: (!metadata.annotations.is_empty()).then_some(metadata.annotations),
            owner_references: pool.controller_owner_ref(&()).map(|owner| vec![owner]),
            // The Proxy controller's finalizer from the start: it would otherwise add it by a
            // patch of every member as its first step (10 000 requests in a scale-up to 10 000).
            finalizers: Some(vec![crate::api::labels::FINALIZER.to_string()]),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

/// Creates a member; a name another Proxy already has (27⁵ suffixes: at 10 000 members a new
/// name collides about once in 1 400) is drawn again, a few times.
async fn create_member(
    proxies: &Api<Proxy>,
    pool: &ProxyPool,
    mut proxy: Proxy,
) -> Result<String, kube::Error> {
    const ATTEMPTS: usize = 5;
    let mut attempt = 1;
    loop {
        match proxies.create(&PostParams::default(), &proxy).await {
            Ok(_) => return Ok(proxy.name_any()),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < ATTEMPTS => {
                tracing::debug!(pool = %pool.name_any(), name = %proxy.name_any(), "a member's name is taken, drawing another");
                proxy.metadata.name = Some(member_name(&pool.name_any()));
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `<pool>-<5 random characters>`, the pool's part cut so the whole stays a short DNS label
/// (instance names at providers are derived from it).
fn member_name(pool: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let prefix: String = pool.chars().take(40).collect();
    let prefix = prefix.trim_end_matches('-');
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}-{suffix}")
}

async fn drain(proxies: &Api<Proxy>, name: &str, reason: DrainReason) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "metadata": {"annotations": {
            DRAINING_ANNOTATION: "true",
            DRAIN_REASON_ANNOTATION: reason.as_str(),
        }}
    });
    match proxies
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

async fn delete_proxy(proxies: &Api<Proxy>, name: &str) -> Result<(), kube::Error> {
    match proxies.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

async fn write_status(
    pool: &ProxyPool,
    ctx: &PoolContext,
    desired: &Desired,
    plan: &Plan,
    caps: &capped::PoolCaps,
    stopped: Option<&crate::lifecycle::quota::decide::Stopped>,
) -> Result<(), Error> {
    let generation = pool.metadata.generation;
    let mut status = pool.status.clone().unwrap_or_default();
    let counts = &plan.counts;
    status.replicas = counts.replicas as i32;
    status.ready_replicas = counts.ready as i32;
    status.leased_replicas = counts.leased as i32;
    status.updated_replicas = counts.updated as i32;
    status.draining_replicas = counts.draining as i32;
    status.selector = Some(format!("{POOL_LABEL}={}", pool.name_any()));
    status.observed_generation = generation;
    let ready = counts.ready >= desired.replicas;
    let (reason, message) = if ready {
        (
            "PoolReady",
            format!("{} of {} Proxies are Ready", counts.ready, desired.replicas),
        )
    } else {
        let others = if plan.capped.is_empty() {
            "the others are being made or probed"
        } else {
            "a provider instance's cap holds back the others (see CapReached)"
        };
        (
            "ScalingUp",
            format!(
                "{} of {} Proxies are Ready; {others}",
                counts.ready, desired.replicas
            ),
        )
    };
    set_named(
        &mut status.conditions,
        "Ready",
        ready,
        reason,
        &message,
        generation,
    );
    let (reason, message) = if !plan.progressing {
        (
            "Settled",
            "every Proxy is made from the current template".to_string(),
        )
    } else if counts.updated < counts.replicas || !plan.drain.is_empty() {
        (
            "Rolling",
            format!(
                "{} of {} Proxies are up to date; {} draining",
                counts.updated, counts.replicas, counts.draining
            ),
        )
    } else {
        (
            "Scaling",
            format!("{} of {} Proxies are Ready", counts.ready, desired.replicas),
        )
    };
    set_named(
        &mut status.conditions,
        "Progressing",
        plan.progressing,
        reason,
        &message,
        generation,
    );
    super::quota::note(pool, &ctx.recorder, &mut status, stopped, desired.replicas).await;
    let key = ProxyKey::of(pool);
    let announced = ctx.announced.get(&key);
    let conditions = &mut status.conditions;
    let turned = capped::set_condition(conditions, plan, desired, caps, announced, generation);
    patch_status(pool, ctx, status).await?;
    ctx.announced.set(key, !plan.capped.is_empty());
    if let Some((type_, reason, note)) = turned {
        publish(pool, ctx, type_, reason, "Create", note).await;
    }
    Ok(())
}

async fn write_invalid(
    pool: &ProxyPool,
    ctx: &PoolContext,
    invalid: &Invalid,
) -> Result<(), Error> {
    let generation = pool.metadata.generation;
    let mut status = pool.status.clone().unwrap_or_default();
    let already = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == invalid.reason && c.message == invalid.message);
    status.selector = Some(format!("{POOL_LABEL}={}", pool.name_any()));
    status.observed_generation = generation;
    set_named(
        &mut status.conditions,
        "Ready",
        false,
        invalid.reason,
        &invalid.message,
        generation,
    );
    set_named(
        &mut status.conditions,
        "Progressing",
        false,
        invalid.reason,
        "nothing is made or removed until the spec or the providers config is fixed",
        generation,
    );
    if !already {
        tracing::warn!(pool = %pool.name_any(), reason = invalid.reason, message = %invalid.message, "pool cannot be acted on");
        publish(
            pool,
            ctx,
            EventType::Warning,
            invalid.reason,
            "Validate",
            invalid.message.clone(),
        )
        .await;
    }
    patch_status(pool, ctx, status).await
}

async fn patch_status(
    pool: &ProxyPool,
    ctx: &PoolContext,
    status: ProxyPoolStatus,
) -> Result<(), Error> {
    if pool.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<ProxyPool> =
        Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    api.patch_status(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await?;
    Ok(())
}

async fn publish(
    pool: &ProxyPool,
    ctx: &PoolContext,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let reference: ObjectReference = pool.object_ref(&());
    events::publish(&ctx.recorder, &reference, type_, reason, action, note).await;
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::provider::providers::{NotLoaded, Providers};

    fn pool(spec: serde_json::Value) -> ProxyPool {
        let mut full = serde_json::json!({
            "apiVersion": "proxy-operator.dev/v1alpha1",
            "kind": "ProxyPool",
            "metadata": {"name": "web", "namespace": "crawl"},
            "spec": {"replicas": 4, "template": {"spec": {"provider": "store"}}},
        });
        for (key, value) in spec.as_object().unwrap() {
            full["spec"][key] = value.clone();
        }
        serde_json::from_value(full).unwrap()
    }

    /// `store` configured but not loaded; nothing else configured.
    fn providers() -> Providers {
        let not_loaded = HashMap::from([(
            "store".to_string(),
            NotLoaded {
                provider_type: "test".into(),
                reason: "the plugin test.wasm is not in the plugins directory".into(),
            },
        )]);
        Providers::from_parts(HashMap::new(), not_loaded, HashMap::new())
    }

    #[test]
    fn a_pool_that_cannot_be_acted_on_says_which_field_and_why() {
        let cases = [
            (
                serde_json::json!({"template": {"spec": {"provider": "nowhere"}}}),
                "UnknownProvider",
                "spec.template.spec.provider: `nowhere` is not a provider of the operator's providers config (configured: store)",
            ),
            (
                serde_json::json!({"spread": [{"zone": "a"}, {"provider": "elsewhere"}]}),
                "UnknownProvider",
                "spec.spread[1].provider: `elsewhere`",
            ),
            (
                serde_json::json!({}),
                "ProviderNotLoaded",
                "spec.template.spec.provider: provider `store` cannot make Proxies: the plugin test.wasm is not in the plugins directory",
            ),
            (
                serde_json::json!({"maxSurge": "lots"}),
                "InvalidSpec",
                "spec.maxSurge: `lots` is neither a count nor a percentage",
            ),
            (
                serde_json::json!({"expireAfter": "soon"}),
                "InvalidSpec",
                "spec.expireAfter: `soon` is not a duration",
            ),
            (
                serde_json::json!({"spread": [{"zone": "a"}, {"zone": "a"}]}),
                "InvalidSpec",
                "spec.spread[1]: the same provider and zone",
            ),
            (
                serde_json::json!({"replicas": 10001}),
                "InvalidSpec",
                "spec.replicas: 10001 is outside 0..=10000",
            ),
        ];
        for (spec, reason, message) in cases {
            let invalid = resolve(&pool(spec.clone()), &providers()).unwrap_err();
            assert_eq!(invalid.reason, reason, "{spec}: {invalid:?}");
            assert!(
                invalid.message.starts_with(message),
                "{spec}: {}",
                invalid.message
            );
        }
    }

    #[test]
    fn durations_read_as_kubernetes_writes_them() {
        for (text, seconds) in [("90m", 5400), ("1h30m", 5400), ("24h", 86400), ("45s", 45)] {
            assert_eq!(
                crate::support::durations::parse(text).unwrap(),
                Duration::from_secs(seconds),
                "{text}"
            );
        }
    }

    #[test]
    fn a_new_member_is_the_template_in_its_slot_owned_and_labelled() {
        let mut pool = pool(serde_json::json!({
            "template": {
                "metadata": {"labels": {"team": "crawl"}},
                "spec": {"provider": "store", "placement": {"zone": "a", "machineType": "small"}},
            },
        }));
        pool.metadata.uid = Some("uid-1".into());
        let desired = Desired {
            replicas: 1,
            template_hash: template_hash(&pool),
            slots: vec![],
            expire_after: None,
            recycle_after: None,
            max_surge: 1,
            max_unavailable: 0,
        };
        let slot = Slot {
            provider: "other".into(),
            zone: Some("b".into()),
        };
        let proxy = new_proxy(&pool, &desired, &slot);
        let name = proxy.name_any();
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
        assert_eq!(proxy.spec.provider, "other");
        let placement = proxy.spec.placement.unwrap();
        assert_eq!(placement.zone.as_deref(), Some("b"));
        assert_eq!(placement.machine_type.as_deref(), Some("small"));
        let labels = proxy.metadata.labels.unwrap();
        assert_eq!(labels["team"], "crawl");
        assert_eq!(labels[POOL_LABEL], "web");
        assert_eq!(labels[TEMPLATE_LABEL], desired.template_hash);
        let owner = &proxy.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            ("uid-1", Some(true))
        );
        // Made with the Proxy controller's finalizer: no patch adds it afterwards.
        assert_eq!(
            proxy.metadata.finalizers.as_deref(),
            Some(&[crate::api::labels::FINALIZER.to_string()][..])
        );
        assert_ne!(
            member_name("web"),
            member_name("web"),
            "names are never reused"
        );
    }
}
