//! One reconcile of one Proxy, executing what `decide.rs` decides: finalizer, provider lookup,
//! create (with a deterministic name), poll for an address, status; on deletion, delete at the
//! provider unless told to abandon.

use std::sync::Arc;
use std::time::Duration;

use crate::support::events::{EventType, Recorder};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use super::ReconcileMetrics;
use super::access;
use super::capped;
use super::credentials;
use super::decide::{
    self, CleanupStep, Decision, Effects, NextReconcile, ProviderLookup, ProxyEvent,
};
use crate::api::conditions;
use crate::api::{Proxy, ProxyKey, ProxyStatus};
use crate::lifecycle::abandoned::AbandonedRecord;
use crate::provider::credentials::CredentialsBook;
use crate::provider::plugins::types::{InstanceSpec, Owner, ProviderError};
use crate::provider::plugins::{CallError, Deletion, ProviderInstance};
use crate::provider::providers::{ProviderSet, Providers};
use crate::support::digest::sha256_hex;
use crate::support::events;
use crate::support::retry::{self, Backoffs, Wait};

use crate::api::labels::FINALIZER;
/// The field manager of the controller's status writes: the only writer of `phase` and `Ready`.
pub const FIELD_MANAGER: &str = "proxy-operator";

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
    /// Where a `skip-cleanup` Proxy records the instance it leaves, so the GC leaves it too.
    pub abandoned: Option<AbandonedRecord>,
    /// The credentials each proxy requires, for the health engine and the lease API.
    pub credentials: CredentialsBook,
    /// The credentials Secrets, as the running controller's watch keeps them: read without a
    /// request per reconcile. Each run starts its own watch into a new store (a leader that
    /// loses and regains leadership runs the controller again).
    secrets: std::sync::RwLock<Store<Secret>>,
    /// The Proxies, as the running controller's watch keeps them: what counts against a
    /// provider instance's cap, without a list per reconcile.
    proxies: std::sync::RwLock<Store<Proxy>>,
    /// Each Proxy's backoff after failed requests to the API server.
    backoffs: Backoffs<ProxyKey>,
    /// The namespaces' ProxyQuotas and Proxies, as the operator's caches keep them (`quota.rs`);
    /// none until [`Context::use_quotas`].
    quotas: std::sync::RwLock<crate::lifecycle::quota::QuotaView>,
}

impl Context {
    /// `credentials` is the book the health engine and the lease API read the proxies' logins
    /// from: the one shared with them, never a fresh one.
    pub fn new(
        client: Client,
        providers: impl Into<ProviderSet>,
        operator_id: &str,
        credentials: CredentialsBook,
    ) -> Self {
        let recorder = events::recorder(client.clone());
        Context {
            secrets: std::sync::RwLock::new(reflector::store().0),
            proxies: std::sync::RwLock::new(reflector::store().0),
            client,
            providers: providers.into(),
            recorder,
            operator_id: operator_id.to_string(),
            metrics: None,
            health_probing: true,
            abandoned: None,
            credentials,
            backoffs: Backoffs::default(),
            quotas: Default::default(),
        }
    }

    /// Provisions Proxies only within the namespaces' ProxyQuotas, as `view` shows them (set
    /// by each leadership term, with the caches it runs on).
    pub fn use_quotas(&self, view: crate::lifecycle::quota::QuotaView) {
        *self.quotas.write().expect("not poisoned") = view;
    }

    /// Whether health probes run (`false` for `--health-interval 0s`).
    pub fn with_health_probing(mut self, probing: bool) -> Self {
        self.health_probing = probing;
        self
    }

    /// Records the instances `skip-cleanup` Proxies leave, for the GC.
    pub fn with_abandoned(mut self, record: AbandonedRecord) -> Self {
        self.abandoned = Some(record);
        self
    }

    /// The credentials Secrets as the running controller's watch keeps them.
    fn cached_secrets(&self) -> Store<Secret> {
        self.secrets.read().expect("not poisoned").clone()
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
    /// A provider call failed in a way worth retrying; `retry_after` is the provider's own wish.
    #[error("{message}")]
    Provider {
        message: String,
        retry_after: Option<Duration>,
    },
}

/// The deterministic instance name of a Proxy: the same after any restart, so a create that was
/// interrupted is found again instead of made twice.
pub fn instance_name(uid: &str) -> String {
    let digest = sha256_hex(uid.as_bytes());
    format!("px-{}", &digest[..16])
}

/// Runs the controller until SIGTERM or Ctrl-C.
pub async fn run(ctx: Arc<Context>, namespace: Option<&str>) {
    let controller = watch_proxies(&ctx, namespace).shutdown_on_signal();
    drive(controller, ctx).await;
}

/// Runs the controller until `shutdown` completes; reconciles in flight finish first.
pub async fn run_until(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let controller = watch_proxies(&ctx, namespace).graceful_shutdown_on(shutdown);
    drive(controller, ctx).await;
}

fn watch_proxies(ctx: &Context, namespace: Option<&str>) -> Controller<Proxy> {
    let proxies = crate::api::proxies(ctx.client.clone(), namespace);
    // Controller::new's own watch, with the cached Proxies trimmed of what no reconcile reads
    // (their managedFields were ~70 % of the cache at fleet size: docs/performance.md).
    let (reader, writer) = reflector::store();
    let watch = watcher(proxies, watcher::Config::default().any_semantic())
        .modify(crate::support::kubeclient::trim_for_cache);
    *ctx.proxies.write().expect("not poisoned") = reader.clone();
    let controller = Controller::for_stream(
        reflector::reflector(writer, watch).applied_objects(),
        reader,
    )
    // A plugin loaded or a providers config changed: every Proxy waiting for it goes on
    // at once.
    .reconcile_all_on(ctx.providers.swaps());
    let (secrets, writer) = reflector::store();
    *ctx.secrets.write().expect("not poisoned") = secrets;
    controller.reconcile_on(changed_credentials(ctx, namespace, writer))
}

/// A changed credentials Secret is rotated at once: the Secrets the operator made (by their
/// label) are watched into the context's store, and each change reconciles the Proxy owning it,
/// after the store has it.
fn changed_credentials(
    ctx: &Context,
    namespace: Option<&str>,
    writer: Writer<Secret>,
) -> impl futures_util::Stream<Item = ObjectRef<Proxy>> + Send + 'static {
    let secrets: Api<Secret> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let config = watcher::Config::default().labels(crate::api::labels::SECRET_LABEL);
    reflector::reflector(
        writer,
        watcher(secrets, config).modify(crate::support::kubeclient::trim_for_cache),
    )
    .default_backoff()
    .applied_objects()
    .filter_map(|secret| async move {
        let secret = secret.ok()?;
        let owner = secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Proxy")?;
        Some(ObjectRef::new(&owner.name).within(&secret.namespace()?))
    })
}

async fn drive(controller: Controller<Proxy>, ctx: Arc<Context>) {
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
        })
        .await;
}

fn error_policy(
    proxy: Arc<Proxy>,
    error: &kube::runtime::finalizer::Error<Error>,
    ctx: Arc<Context>,
) -> Action {
    let after = ctx
        .backoffs
        .after_failure(ProxyKey::of(&*proxy), wait_after(error));
    tracing::warn!(proxy = %proxy.name_any(), namespace = ?proxy.namespace(), error = %error, retry_in = ?after, "reconcile error");
    Action::requeue(after)
}

/// What a failed reconcile asks for: the provider's wish, or a backoff after the API server's
/// refusal (adding or removing the finalizer, reading or writing the Proxy).
fn wait_after(error: &kube::runtime::finalizer::Error<Error>) -> Wait {
    use kube::runtime::finalizer::Error as F;
    match error {
        F::ApplyFailed(Error::Provider { retry_after, .. })
        | F::CleanupFailed(Error::Provider { retry_after, .. }) => Wait::Provider(*retry_after),
        F::ApplyFailed(Error::Kube(e))
        | F::CleanupFailed(Error::Kube(e))
        | F::AddFinalizer(e)
        | F::RemoveFinalizer(e) => retry::after_api_error(e),
        F::UnnamedObject | F::InvalidFinalizer => Wait::Backoff { at_least: None },
    }
}

#[tracing::instrument(skip_all, fields(proxy = %proxy.name_any(), namespace = ?proxy.namespace()))]
async fn reconcile(
    proxy: Arc<Proxy>,
    ctx: Arc<Context>,
) -> Result<Action, kube::runtime::finalizer::Error<Error>> {
    let started = std::time::Instant::now();
    let key = ProxyKey::of(&*proxy);
    let api: Api<Proxy> = Api::namespaced(ctx.client.clone(), &key.namespace);
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
    if result.is_ok() {
        ctx.backoffs.succeeded(&key);
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

async fn publish(ctx: &Context, proxy: &Proxy, events: Vec<ProxyEvent>) {
    let reference = proxy.object_ref(&());
    for note in events {
        events::publish(
            &ctx.recorder,
            &reference,
            note.type_,
            note.reason,
            "Reconcile",
            note.message,
        )
        .await;
    }
}

/// Carries out a decision: the status (when it changed), its events, then what the controller
/// does. A decision made from an out-of-date view is dropped whole (no status, no events) and
/// made again from the newer one.
async fn execute(
    ctx: &Context,
    api: &Api<Proxy>,
    proxy: &Proxy,
    effects: Effects,
) -> Result<Action, Error> {
    if let StatusWrite::Stale = write_status(api, proxy, effects.status).await? {
        return Ok(Action::requeue(AFTER_STALE_VIEW));
    }
    publish(ctx, proxy, effects.events).await;
    action_for(effects.next)
}

/// How soon a reconcile whose view was out of date runs again (the newer version's own watch
/// event usually comes first).
const AFTER_STALE_VIEW: Duration = Duration::from_millis(500);

/// The controller's action for what a decision says comes next.
fn action_for(next: NextReconcile) -> Result<Action, Error> {
    match next {
        NextReconcile::Requeue(after) => Ok(Action::requeue(after)),
        NextReconcile::AwaitChange => Ok(Action::await_change()),
        NextReconcile::Retry { message, after } => Err(Error::Provider {
            message,
            retry_after: after,
        }),
    }
}

/// Where `name` stands in the providers config now.
fn lookup(providers: &Providers, name: &str) -> ProviderLookup {
    if let Some(missing) = providers.not_loaded(name) {
        return ProviderLookup::NotLoaded {
            provider_type: missing.provider_type.clone(),
            reason: missing.reason.clone(),
        };
    }
    match providers.get(name) {
        Some(instance) => ProviderLookup::Loaded {
            name: instance.name().to_string(),
        },
        None => ProviderLookup::Unknown {
            configured: providers.configured_names(),
        },
    }
}

/// What became of a status write.
pub enum StatusWrite {
    /// Stored; the Proxy as it is now.
    Stored(Box<Proxy>),
    /// The status was already so: nothing sent.
    Unchanged,
    /// Refused: the Proxy changed since `proxy` was read (the health engine wrote `Healthy`,
    /// say). Writing it anyway would put back what that change replaced.
    Stale,
}

/// Writes the status decided from `proxy`, only if the Proxy has not changed since: the
/// resourceVersion it was read at is the write's precondition (409 otherwise).
pub async fn write_status(
    api: &Api<Proxy>,
    proxy: &Proxy,
    status: ProxyStatus,
) -> Result<StatusWrite, Error> {
    if proxy.status.as_ref() == Some(&status) {
        return Ok(StatusWrite::Unchanged);
    }
    let patch = serde_json::json!({
        "apiVersion": "proxy-operator.dev/v1alpha1",
        "kind": "Proxy",
        "metadata": { "resourceVersion": proxy.resource_version() },
        "status": conditions::controller_owned(&status),
    });
    match api
        .patch_status(
            &proxy.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
    {
        Ok(stored) => Ok(StatusWrite::Stored(Box::new(stored))),
        // Forced, an apply has no field-manager conflicts: a 409 is the precondition.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::debug!(resource_version = ?proxy.resource_version(), "the Proxy changed since it was read; deciding again");
            Ok(StatusWrite::Stale)
        }
        Err(e) => Err(e.into()),
    }
}

fn spec_for(proxy: &Proxy, ctx: &Context, name: &str, zone: Option<String>) -> InstanceSpec {
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
        zone,
        image: placement.image,
        machine_type: placement.machine_type,
        user_data: spec.cloud_init.clone().unwrap_or_default().into_bytes(),
        vendor_data: spec.vendor_data.clone().unwrap_or_default().into_bytes(),
        install_guest_agent: spec.install_guest_agent,
        port: spec.port,
        // The Proxy's own labels reach what the provider makes (the kubernetes provider's Pod).
        labels: proxy
            .labels()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        options: spec
            .provider_options
            .clone()
            .unwrap_or_else(|| serde_json::Value::Object(Default::default())),
        // Given by `apply` when the provider takes credentials.
        credentials: None,
    }
}

async fn apply(cached: &Proxy, api: &Api<Proxy>, ctx: &Context) -> Result<Action, Error> {
    let providers = ctx.providers.current();
    let name = instance_name(&cached.uid().unwrap_or_default());
    let found = lookup(&providers, &cached.spec.provider);
    let mut step = decide::decide(cached, &found, &name);
    // The placement written before a create wakes the controller again, and the cache may not
    // show that create's result yet: without the live object, some creates were asked twice
    // (1 in 10 Proxies in `the_placement_written_before_a_create_does_not_make_a_second_create_call`).
    let live;
    let proxy = if matches!(step, Decision::Create { .. }) && decide::asked_before(cached) {
        live = api.get_status(&cached.name_any()).await?;
        if live.uid() != cached.uid() || live.meta().deletion_timestamp.is_some() {
            // Replaced or being deleted since the cache saw it: its own event comes next.
            return Ok(Action::await_change());
        }
        step = decide::decide(&live, &found, &name);
        &live
    } else {
        cached
    };
    let provider = providers.get(&proxy.spec.provider);
    // The instance's `access` (docs/tenancy.md): no create it refuses; a condition otherwise.
    let refused = access::refusal(&ctx.client, &providers, proxy, &found).await?;
    if let (Decision::Create { .. }, Some(refusal)) = (&step, &refused) {
        return execute(ctx, api, proxy, access::refused_create(proxy, refusal)).await;
    }
    let mut effects = match (step, provider) {
        (Decision::Done(effects), _) => effects,
        (Decision::Create { name, zone, status }, Some(provider)) => {
            let view = ctx.quotas.read().expect("not poisoned").clone();
            if let Some(effects) = super::quota::beyond_quota(&view, proxy) {
                return execute(ctx, api, proxy, effects).await;
            }
            let mut status = status;
            let cache = ctx.proxies.read().expect("not poisoned").clone();
            if let Some(held) = capped::hold(&cache, provider, proxy, &mut status).await {
                return execute(ctx, api, proxy, held).await;
            }
            let mut spec = spec_for(proxy, ctx, &name, zone);
            match credentials::login_for(&ctx.client, &ctx.cached_secrets(), provider, proxy)
                .await?
            {
                Ok(None) => {}
                Ok(Some(login)) => {
                    // An upstream's login is the host's alone: its plugin gets not even a hash.
                    if provider.upstream().is_none() {
                        spec.credentials = Some(login.hashed());
                    }
                    status.credentials = Some(credentials::applied_for(provider, proxy, &login));
                    let uid = proxy.uid().unwrap_or_default();
                    ctx.credentials.set(ProxyKey::of(proxy), &uid, login);
                }
                Err(invalid) => {
                    let effects = credentials::invalid_secret(proxy, status, &invalid);
                    return execute(ctx, api, proxy, effects).await;
                }
            }
            // Recorded before the call: a retry after a crash, a timeout or a kill asks for the
            // same placement (see `decide::placement`). The create's outcome is written over
            // the Proxy as this write left it.
            let stored;
            let placed = match write_status(api, proxy, status.clone()).await? {
                StatusWrite::Stored(placed) => {
                    stored = placed;
                    &*stored
                }
                StatusWrite::Unchanged => proxy,
                StatusWrite::Stale => return Ok(Action::requeue(AFTER_STALE_VIEW)),
            };
            let effects = create_instance(ctx, provider, placed, status, spec).await;
            return execute(ctx, api, placed, effects).await;
        }
        (
            Decision::Get {
                provider_id,
                status,
            },
            Some(provider),
        ) => match provider.get(&provider_id).await {
            Ok(instance) => {
                let mut effects = decide::observed(proxy, status, &instance, ctx.health_probing);
                let (client, book) = (&ctx.client, &ctx.credentials);
                let cached = &ctx.cached_secrets();
                credentials::keep_current(client, cached, book, provider, proxy, &mut effects)
                    .await?;
                effects
            }
            Err(CallError::Provider {
                error: ProviderError::NotFound(detail),
                ..
            }) => decide::lost(proxy, status, provider.name(), &provider_id, &detail),
            Err(e) => decide::call_failed(proxy, status, provider.name(), "Get", &e),
        },
        (Decision::Create { .. } | Decision::Get { .. }, None) => {
            unreachable!("decide asks for a provider call only when the provider is loaded")
        }
    };
    access::mark(proxy, &mut effects, refused.as_ref());
    execute(ctx, api, proxy, effects).await
}

/// The provider's create, and what its outcome makes of the status (the caller writes it): a
/// create given the login says `CredentialsCurrent` in the same write.
async fn create_instance(
    ctx: &Context,
    provider: &ProviderInstance,
    placed: &Proxy,
    status: ProxyStatus,
    spec: InstanceSpec,
) -> Effects {
    match provider.create(spec).await {
        Ok(instance) => {
            ReconcileMetrics::created(&ctx.metrics, provider.name());
            let mut effects = decide::created(
                placed,
                status,
                provider.name(),
                &instance,
                ctx.health_probing,
            );
            credentials::created_with_login(&mut effects.status, placed.metadata.generation);
            effects
        }
        Err(e) => decide::call_failed(placed, status, provider.name(), "Create", &e),
    }
}

async fn cleanup(proxy: &Proxy, api: &Api<Proxy>, ctx: &Context) -> Result<Action, Error> {
    // Its Secret goes with it (owned by the Proxy); its credentials are of no more use here.
    ctx.credentials.remove(&ProxyKey::of(proxy));
    let providers = ctx.providers.current();
    let (recorded, deleting) =
        match decide::decide_cleanup(proxy, &lookup(&providers, &proxy.spec.provider)) {
            CleanupStep::Abandon(note) => {
                publish(ctx, proxy, vec![note]).await;
                return Ok(Action::await_change());
            }
            CleanupStep::LeaveRunning(note) => {
                // Recorded before the Proxy goes, or the GC would delete the instance later.
                if let Some(record) = &ctx.abandoned {
                    let uid = proxy.uid().unwrap_or_default();
                    record.record(&ctx.client, &uid, &note.message).await?;
                }
                publish(ctx, proxy, vec![note]).await;
                return Ok(Action::await_change());
            }
            CleanupStep::WaitForPlugin { message } => {
                return Err(Error::Provider {
                    message,
                    retry_after: Some(Duration::from_secs(15)),
                });
            }
            CleanupStep::Delete { recorded, deleting } => (recorded, deleting),
        };
    let provider = providers
        .get(&proxy.spec.provider)
        .expect("decide_cleanup deletes only through a loaded provider");
    if let Some(status) = deleting {
        // The Proxy may already be half gone; a failed status write must not block deletion.
        if let Err(e) = write_status(api, proxy, *status).await {
            tracing::debug!(error = %e, "cannot mark the proxy Deleting");
        }
    }
    let ids = match recorded {
        Some(id) => match provider.get(&id).await {
            // The owner the provider lists decides, not the (editable) status.
            Ok(instance) => match decide::refuse_foreign_delete(proxy, &instance) {
                Some(refusal) => {
                    publish(ctx, proxy, vec![refusal]).await;
                    return Ok(Action::await_change());
                }
                None => vec![id],
            },
            Err(CallError::Provider {
                error: ProviderError::NotFound(_),
                ..
            }) => Vec::new(),
            // The owner cannot be checked; a provider that cannot `get` must still let the Proxy
            // go, so the delete is tried as before.
            Err(e) => {
                tracing::debug!(error = %e, instance = %id, "cannot check the instance's owner before deleting");
                vec![id]
            }
        },
        None => match provider.list().await {
            Ok(instances) => decide::owned_by(instances, &proxy.uid().unwrap_or_default()),
            Err(e) => {
                let message = format!("listing instances to find this proxy's: {e}");
                return Err(Error::Provider {
                    message,
                    retry_after: None,
                });
            }
        },
    };
    let mut events = Vec::new();
    for id in ids {
        match provider.delete(&id).await {
            Ok(Deletion::Deleted) => ReconcileMetrics::deleted(&ctx.metrics, provider.name()),
            Ok(Deletion::NothingThere(detail)) => {
                events.push(decide::delete_found_nothing(&id, provider.name(), &detail))
            }
            Err(e) => {
                let (note, retry) = decide::delete_failed(&id, &e);
                publish(ctx, proxy, vec![note]).await;
                return action_for(retry);
            }
        }
    }
    if events.is_empty() {
        events.push(ProxyEvent {
            type_: EventType::Normal,
            reason: "Deleted",
            message: format!("instance deleted at provider {}", provider.name()),
        });
    }
    publish(ctx, proxy, events).await;
    Ok(Action::await_change())
}
