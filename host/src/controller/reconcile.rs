//! One reconcile of one Proxy. Reads like the lifecycle: finalizer, provider lookup, create (with a
//! deterministic name), poll for an address, status; on deletion, delete at the provider unless
//! told to abandon.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use sha2::{Digest, Sha256};

use super::conditions;
use crate::api::{Phase, Proxy, ProxyStatus};
use crate::events;
use crate::metrics::ReconcileMetrics;
use crate::plugins::types::{InstanceSpec, InstanceState, Owner, ProviderError};
use crate::plugins::{CallError, ProviderInstance};
use crate::providers::ProviderSet;

/// The finalizer that keeps a Proxy until its instance is deleted.
pub const FINALIZER: &str = "crawl.example.com/cleanup";
/// `"true"` on a Proxy: delete the Proxy but leave its instance running.
pub const SKIP_CLEANUP_ANNOTATION: &str = "crawl.example.com/skip-cleanup";
const FIELD_MANAGER: &str = "proxy-operator";
/// How often a provisioning instance is polled for its address.
const POLL_PROVISIONING: Duration = Duration::from_secs(5);
/// How often a Ready instance is looked at again.
const RESYNC: Duration = Duration::from_secs(300);

/// What every reconcile needs.
pub struct Context {
    pub client: Client,
    pub providers: ProviderSet,
    pub recorder: Recorder,
    /// Identifies this operator installation on the instances it makes.
    pub operator_id: String,
    pub metrics: Option<ReconcileMetrics>,
    /// Whether the health engine probes proxies (`--health-interval` not `0s`): decides what the
    /// `Ready` condition of an unprobed proxy says.
    pub health_probing: bool,
}

impl Context {
    pub fn new(client: Client, providers: impl Into<ProviderSet>, operator_id: &str) -> Self {
        let recorder = events::recorder(client.clone());
        Context {
            client,
            providers: providers.into(),
            recorder,
            operator_id: operator_id.to_string(),
            metrics: None,
            health_probing: true,
        }
    }

    /// Whether health probes run (`false` for `--health-interval 0s`).
    pub fn with_health_probing(mut self, probing: bool) -> Self {
        self.health_probing = probing;
        self
    }

    /// Counts and times every reconcile.
    pub fn with_metrics(mut self, metrics: ReconcileMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

/// Errors that make the controller retry with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Provider(String, Option<Duration>),
}

/// The deterministic instance name of a Proxy: the same after any restart, so a create that was
/// interrupted is found again instead of made twice.
pub fn instance_name(uid: &str) -> String {
    let digest = hex::encode(Sha256::digest(uid.as_bytes()));
    format!("px-{}", &digest[..16])
}

/// Runs the controller until the stream ends (shutdown signal).
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    let proxies: Api<Proxy> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    Controller::new(proxies, watcher::Config::default().any_semantic())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!("reconcile failed: {e}");
            }
        })
        .await;
}

fn error_policy(
    proxy: Arc<Proxy>,
    error: &kube::runtime::finalizer::Error<Error>,
    _: Arc<Context>,
) -> Action {
    let retry_after = match error {
        kube::runtime::finalizer::Error::ApplyFailed(Error::Provider(_, Some(after)))
        | kube::runtime::finalizer::Error::CleanupFailed(Error::Provider(_, Some(after))) => *after,
        _ => Duration::from_secs(5),
    };
    tracing::warn!(proxy = %proxy.name_any(), namespace = ?proxy.namespace(), "reconcile error: {error}");
    Action::requeue(retry_after)
}

#[tracing::instrument(skip_all, fields(proxy = %proxy.name_any(), namespace = ?proxy.namespace()))]
async fn reconcile(
    proxy: Arc<Proxy>,
    ctx: Arc<Context>,
) -> Result<Action, kube::runtime::finalizer::Error<Error>> {
    let started = std::time::Instant::now();
    let namespace = proxy.namespace().unwrap_or_default();
    let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = match live_for_cleanup(&api, proxy).await {
        Ok(Some(proxy)) => finalizer(&api, FINALIZER, proxy, |event| async {
            match event {
                Finalizer::Apply(proxy) => apply(&proxy, &api, &ctx).await,
                Finalizer::Cleanup(proxy) => cleanup(&proxy, &api, &ctx).await,
            }
        })
        .await
        .or_else(finalizer_already_gone),
        Ok(None) => Ok(Action::await_change()),
        Err(e) => Err(kube::runtime::finalizer::Error::CleanupFailed(e.into())),
    };
    if let Some(metrics) = &ctx.metrics {
        metrics.observe(started.elapsed(), result.is_ok());
    }
    result
}

/// The Proxy to reconcile. For a Proxy being deleted, the live object rather than the cached one:
/// the cleanup's own status write wakes the controller again, and the cache may still show the
/// finalizer that cleanup has just removed. Without this, every deletion called the provider's
/// `delete` twice. `None`: nothing left to clean up (gone, or our finalizer already removed).
async fn live_for_cleanup(
    api: &Api<Proxy>,
    cached: Arc<Proxy>,
) -> Result<Option<Arc<Proxy>>, kube::Error> {
    if cached.meta().deletion_timestamp.is_none() {
        return Ok(Some(cached));
    }
    let Some(live) = api.get_opt(&cached.name_any()).await? else {
        return Ok(None);
    };
    let ours = live.uid() == cached.uid() && live.finalizers().iter().any(|f| f == FINALIZER);
    Ok(ours.then(|| Arc::new(live)))
}

/// Removing the finalizer of a Proxy that is already gone is success: the deletion finished.
fn finalizer_already_gone(
    error: kube::runtime::finalizer::Error<Error>,
) -> Result<Action, kube::runtime::finalizer::Error<Error>> {
    match error {
        kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(status))
            if status.is_not_found() =>
        {
            Ok(Action::await_change())
        }
        other => Err(other),
    }
}

async fn event(ctx: &Context, proxy: &Proxy, type_: EventType, reason: &str, note: String) {
    let reference = proxy.object_ref(&());
    events::publish(&ctx.recorder, &reference, type_, reason, "Reconcile", note).await;
}

async fn write_status(api: &Api<Proxy>, proxy: &Proxy, status: ProxyStatus) -> Result<(), Error> {
    if proxy.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "crawl.example.com/v1alpha1",
        "kind": "Proxy",
        "status": status,
    });
    api.patch_status(
        &proxy.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await?;
    Ok(())
}

fn spec_for(proxy: &Proxy, ctx: &Context, name: &str) -> InstanceSpec {
    let spec = &proxy.spec;
    let placement = spec.placement.clone().unwrap_or_default();
    InstanceSpec {
        name: name.to_string(),
        owner: Owner {
            namespace: proxy.namespace().unwrap_or_default(),
            name: proxy.name_any(),
            uid: proxy.uid().unwrap_or_default(),
            operator_id: ctx.operator_id.clone(),
        },
        zone: placement.zone,
        image: placement.image,
        machine_type: placement.machine_type,
        user_data: spec.cloud_init.clone().unwrap_or_default().into_bytes(),
        vendor_data: spec.vendor_data.clone().unwrap_or_default().into_bytes(),
        install_guest_agent: spec.install_guest_agent,
        port: spec.port,
        labels: Vec::new(),
        options: spec
            .provider_options
            .clone()
            .unwrap_or_else(|| serde_json::Value::Object(Default::default())),
    }
}

/// How a failed provider call shows in the status, and whether to retry.
enum Failure {
    Retry {
        message: String,
        after: Option<Duration>,
    },
    Permanent {
        reason: &'static str,
        message: String,
    },
}

fn classify(error: &CallError) -> Failure {
    match error {
        CallError::Provider { error, .. } => match error {
            ProviderError::Transient {
                message,
                retry_after,
            } => Failure::Retry {
                message: message.clone(),
                after: *retry_after,
            },
            ProviderError::Quota(m) => Failure::Retry {
                message: format!("quota: {m}"),
                after: Some(Duration::from_secs(60)),
            },
            ProviderError::NotFound(m) => Failure::Permanent {
                reason: "NotFound",
                message: m.clone(),
            },
            ProviderError::Permanent(m) => Failure::Permanent {
                reason: "ProviderError",
                message: m.clone(),
            },
            ProviderError::InvalidConfig(m) => Failure::Permanent {
                reason: "InvalidConfig",
                message: m.clone(),
            },
            ProviderError::Unauthorized(m) => Failure::Permanent {
                reason: "Unauthorized",
                message: m.clone(),
            },
            ProviderError::Denied(m) => Failure::Permanent {
                reason: "Denied",
                message: m.clone(),
            },
        },
        // The sandbox stopped the plugin: retry, a later call may behave.
        other => Failure::Retry {
            message: other.to_string(),
            after: None,
        },
    }
}

async fn apply(proxy: &Proxy, api: &Api<Proxy>, ctx: &Context) -> Result<Action, Error> {
    let generation = proxy.metadata.generation;
    let mut status = proxy.status.clone().unwrap_or_default();
    let failed_for_this_spec =
        status.phase == Some(Phase::Failed) && status.observed_generation == generation;

    let providers = ctx.providers.current();
    if let Some(missing) = providers.not_loaded(&proxy.spec.provider) {
        // Configured, but its plugin is not loaded (removed, or a bad upload): wait for it.
        let message = format!(
            "the `{}` plugin of provider instance `{}` is not loaded: {}",
            missing.provider_type, proxy.spec.provider, missing.reason
        );
        if status.last_error.as_deref() != Some(&message) {
            event(
                ctx,
                proxy,
                EventType::Warning,
                "PluginNotLoaded",
                message.clone(),
            )
            .await;
        }
        if status.phase.is_none() {
            status.phase = Some(Phase::Pending);
            conditions::not_provisioned(
                &mut status.conditions,
                "PluginNotLoaded",
                &message,
                generation,
            );
        }
        status.last_error = Some(message);
        write_status(api, proxy, status).await?;
        return Ok(Action::requeue(Duration::from_secs(15)));
    }
    let Some(provider) = providers.get(&proxy.spec.provider) else {
        let mut known = providers.configured_names();
        known.sort();
        let message = format!(
            "no provider instance `{provider}` in the providers config (configured: {}); add `{provider}` to the providers config, or recreate the Proxy with another spec.provider (it is immutable)",
            known.join(", "),
            provider = proxy.spec.provider,
        );
        if status.phase != Some(Phase::Pending) || status.last_error.as_deref() != Some(&message) {
            event(
                ctx,
                proxy,
                EventType::Warning,
                "UnknownProvider",
                message.clone(),
            )
            .await;
        }
        status.phase = Some(Phase::Pending);
        status.last_error = Some(message.clone());
        status.observed_generation = generation;
        conditions::not_provisioned(
            &mut status.conditions,
            "UnknownProvider",
            &message,
            generation,
        );
        write_status(api, proxy, status).await?;
        // The providers config may be fixed (reload or restart): look again later.
        return Ok(Action::requeue(Duration::from_secs(30)));
    };

    if failed_for_this_spec {
        // Permanent failure: no hot loop until the spec changes (a new generation).
        return Ok(Action::await_change());
    }

    let instance = match status.provider_id.clone() {
        None => {
            let name = instance_name(&proxy.uid().unwrap_or_default());
            if status.phase.is_none() {
                status.phase = Some(Phase::Pending);
            }
            match provider.create(spec_for(proxy, ctx, &name)).await {
                Ok(instance) => {
                    event(
                        ctx,
                        proxy,
                        EventType::Normal,
                        "Created",
                        format!(
                            "instance {} created by provider {}",
                            instance.provider_id,
                            provider.name()
                        ),
                    )
                    .await;
                    instance
                }
                Err(e) => return fail(proxy, api, ctx, provider, status, &e, "Create").await,
            }
        }
        Some(id) => match provider.get(&id).await {
            Ok(instance) => instance,
            Err(CallError::Provider {
                error: ProviderError::NotFound(detail),
                ..
            }) => return lost(proxy, api, ctx, provider, status, &id, &detail).await,
            Err(e) => return fail(proxy, api, ctx, provider, status, &e, "Get").await,
        },
    };

    status.provider_id = Some(instance.provider_id.clone());
    status.zone = instance.zone.clone().or(status.zone);
    status.observed_generation = generation;
    status.last_error = None;
    let running = instance.state == InstanceState::Running;
    let requeue = match (&instance.address, running) {
        (Some(address), true) => {
            status.address = Some(address.clone());
            status.port = Some(instance.port);
            if status.phase != Some(Phase::Ready) && status.phase != Some(Phase::Unhealthy) {
                event(
                    ctx,
                    proxy,
                    EventType::Normal,
                    "Provisioned",
                    format!("running at {address}:{}", instance.port),
                )
                .await;
            }
            let message = format!(
                "instance {} running at {address}:{}",
                instance.provider_id, instance.port
            );
            conditions::set(
                &mut status.conditions,
                "Provisioned",
                true,
                "InstanceRunning",
                &message,
                generation,
            );
            conditions::readiness(&mut status, generation, ctx.health_probing);
            RESYNC
        }
        _ => {
            status.phase = Some(Phase::Provisioning);
            let message = format!(
                "instance {} is {:?}{}",
                instance.provider_id,
                instance.state,
                if instance.address.is_none() {
                    ", waiting for an address"
                } else {
                    ""
                }
            );
            conditions::not_provisioned(
                &mut status.conditions,
                "Provisioning",
                &message,
                generation,
            );
            POLL_PROVISIONING
        }
    };
    write_status(api, proxy, status).await?;
    Ok(Action::requeue(requeue))
}

async fn fail(
    proxy: &Proxy,
    api: &Api<Proxy>,
    ctx: &Context,
    provider: &ProviderInstance,
    mut status: ProxyStatus,
    error: &CallError,
    action: &str,
) -> Result<Action, Error> {
    let generation = proxy.metadata.generation;
    match classify(error) {
        Failure::Retry { message, after } => {
            status.last_error = Some(format!("{action}: {message}"));
            write_status(api, proxy, status).await?;
            Err(Error::Provider(
                format!("{} {action}: {message}", provider.name()),
                after,
            ))
        }
        Failure::Permanent { reason, message } => {
            let message = format!("{action} failed at provider {}: {message}", provider.name());
            event(ctx, proxy, EventType::Warning, reason, message.clone()).await;
            status.phase = Some(Phase::Failed);
            status.last_error = Some(message.clone());
            status.observed_generation = generation;
            conditions::not_provisioned(&mut status.conditions, reason, &message, generation);
            write_status(api, proxy, status).await?;
            Ok(Action::await_change())
        }
    }
}

/// The recorded instance is gone at the provider. Re-created only when the spec asks for it: a
/// vanished VM may have been removed on purpose, and a new one costs money.
async fn lost(
    proxy: &Proxy,
    api: &Api<Proxy>,
    ctx: &Context,
    provider: &ProviderInstance,
    mut status: ProxyStatus,
    id: &str,
    detail: &str,
) -> Result<Action, Error> {
    let generation = proxy.metadata.generation;
    let message = format!(
        "instance {id} no longer exists at provider {}: {detail}",
        provider.name()
    );
    status.address = None;
    if proxy.spec.recreate_on_loss {
        event(
            ctx,
            proxy,
            EventType::Warning,
            "InstanceLost",
            format!("{message}; creating a new one (recreateOnLoss)"),
        )
        .await;
        status.provider_id = None;
        status.phase = Some(Phase::Pending);
        conditions::not_provisioned(&mut status.conditions, "InstanceLost", &message, generation);
        write_status(api, proxy, status).await?;
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    event(
        ctx,
        proxy,
        EventType::Warning,
        "InstanceLost",
        format!("{message}; set spec.recreateOnLoss to make a new one"),
    )
    .await;
    status.phase = Some(Phase::Failed);
    status.last_error = Some(message.clone());
    status.observed_generation = generation;
    conditions::not_provisioned(&mut status.conditions, "InstanceLost", &message, generation);
    write_status(api, proxy, status).await?;
    Ok(Action::await_change())
}

async fn cleanup(proxy: &Proxy, api: &Api<Proxy>, ctx: &Context) -> Result<Action, Error> {
    let recorded = proxy.status.as_ref().and_then(|s| s.provider_id.clone());
    if proxy
        .annotations()
        .get(SKIP_CLEANUP_ANNOTATION)
        .map(String::as_str)
        == Some("true")
    {
        event(
            ctx,
            proxy,
            EventType::Normal,
            "Abandoned",
            format!(
                "{SKIP_CLEANUP_ANNOTATION} is set: instance {} left running",
                recorded.as_deref().unwrap_or("(none recorded)")
            ),
        )
        .await;
        return Ok(Action::await_change());
    }
    let providers = ctx.providers.current();
    if let Some(missing) = providers.not_loaded(&proxy.spec.provider) {
        // The instance may well exist: wait for the plugin rather than abandon it.
        return Err(Error::Provider(
            format!(
                "cannot delete: the `{}` plugin is not loaded: {}",
                missing.provider_type, missing.reason
            ),
            Some(Duration::from_secs(15)),
        ));
    }
    let Some(provider) = providers.get(&proxy.spec.provider) else {
        event(
            ctx,
            proxy,
            EventType::Warning,
            "Abandoned",
            format!(
                "provider instance `{}` is not in the providers config: instance {} abandoned",
                proxy.spec.provider,
                recorded.as_deref().unwrap_or("(none recorded)")
            ),
        )
        .await;
        return Ok(Action::await_change());
    };

    let mut status = proxy.status.clone().unwrap_or_default();
    if status.phase != Some(Phase::Deleting) {
        status.phase = Some(Phase::Deleting);
        // The Proxy may already be half gone; a failed status write must not block deletion.
        if let Err(e) = write_status(api, proxy, status).await {
            tracing::debug!("cannot mark the proxy Deleting: {e}");
        }
    }
    // Delete the recorded instance. Without one, a create may still have happened just before a
    // restart: find instances carrying this Proxy's UID.
    let ids: Vec<String> = match recorded {
        Some(id) => vec![id],
        None => {
            let uid = proxy.uid().unwrap_or_default();
            match provider.list().await {
                Ok(instances) => instances
                    .into_iter()
                    .filter(|i| i.owner.as_ref().is_some_and(|o| o.uid == uid))
                    .map(|i| i.provider_id)
                    .collect(),
                Err(e) => {
                    let message = format!("listing instances to find this proxy's: {e}");
                    return Err(Error::Provider(message, None));
                }
            }
        }
    };
    for id in ids {
        if let Err(e) = provider.delete(&id).await {
            let (message, after) = match classify(&e) {
                Failure::Retry { message, after } => (message, after),
                Failure::Permanent { message, .. } => (message, Some(Duration::from_secs(60))),
            };
            event(
                ctx,
                proxy,
                EventType::Warning,
                "DeleteFailed",
                format!("deleting instance {id}: {message}"),
            )
            .await;
            return Err(Error::Provider(format!("delete {id}: {message}"), after));
        }
    }
    event(
        ctx,
        proxy,
        EventType::Normal,
        "Deleted",
        format!("instance deleted at provider {}", provider.name()),
    )
    .await;
    Ok(Action::await_change())
}
