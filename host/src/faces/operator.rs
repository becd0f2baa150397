//! The composition root: [`Operator::build`] wires every part from the flags (and fails fast on
//! anything wrong before serving), [`Operator::run`] runs them until SIGTERM or Ctrl-C and stops
//! them through one cancellation token.

pub mod args;
mod term;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::CustomResourceExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::args::{RunArgs, Transport};
use crate::api::{Proxy, ProxyPool};
use crate::faces::fleet::Fleet;
use crate::faces::leader_label::LeaderLabel;
use crate::faces::metrics::Metrics;
use crate::faces::probes::{self, ProbeState};
use crate::faces::{status_page, usage};
use crate::leasing::leases::auth::{CredentialBook, team_watch};
use crate::leasing::leases::{self, Auth, Discovery, Durability, KubeReviewer, LeaseStore};
use crate::lifecycle::abandoned::AbandonedRecord;
use crate::lifecycle::controller::{self, Context};
use crate::lifecycle::gc;
use crate::lifecycle::health::{HealthEngine, HealthOptions};
use crate::lifecycle::pool::{self, PoolContext};
use crate::lifecycle::quota::{self, QuotaView};
use crate::provider::capabilities::kube::OperatorObjects;
use crate::provider::capabilities::libvirt::{LibvirtHub, MaterialSource};
use crate::provider::config::ProvidersConfig;
use crate::provider::credentials::CredentialsBook;
use crate::provider::plugins::{EngineOptions, PluginEngine};
use crate::provider::providerhealth;
use crate::provider::registry::{PluginRegistry, RegistryOptions};
use crate::support::kubeclient;
use crate::support::leader::{self, LeaderView};
use crate::support::tls::ReloadingCert;

/// The operator, built and ready to run.
pub struct Operator {
    args: RunArgs,
    client: kube::Client,
    metrics: Metrics,
    registry: Arc<PluginRegistry>,
    leases: Arc<LeaseStore>,
    health_options: HealthOptions,
    ctx: Arc<Context>,
    /// The leader's usage book (`kubectl px usage`); the process's, across terms.
    usage: usage::UsageLedger,
    /// Teams' gateway credentials, as the watch of their Secrets keeps them.
    credentials: Arc<CredentialBook>,
}

impl Operator {
    /// Checks the flags and the providers config, connects to the cluster, loads every plugin
    /// and checks that the CRD is installed.
    pub async fn build(args: RunArgs) -> anyhow::Result<Self> {
        let lease_options = args.lease.options()?;
        // Fail fast on bad discovery auth flags (the Auth itself is made when serving).
        args.discovery_auth.token_pools()?;
        args.discovery_auth.kube_options()?;
        let health_options = args.health.options()?;
        let metrics = Metrics::register()?;
        // Fail fast on a broken providers config before anything else (no cluster needed).
        let providers_config = ProvidersConfig::load(&args.plugin.providers_config)?;
        let client = kubeclient::connect()
            .await
            .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
        let namespace = args.leader.operator_namespace.clone();
        let engine = PluginEngine::new(engine_options(&args, &client), &metrics.registry)?;
        tracing::info!(allocator = ?engine.allocator(), "plugin engine ready");
        warn_about_missing_ssh_secrets(&client, &namespace, &providers_config).await;
        let registry = PluginRegistry::start(
            engine,
            RegistryOptions {
                plugins_dir: args.plugin.plugins_dir.clone(),
                configmap: args
                    .plugin
                    .plugins_configmap
                    .clone()
                    .map(|name| (namespace.clone(), name)),
                download_dir: args
                    .plugin
                    .plugin_cache_dir
                    .as_ref()
                    .map(|d| d.join("downloads")),
            },
            &args.plugin.providers_config,
            Some(client.clone()),
            metrics.plugins.clone(),
        )
        .await?;
        let providers = registry.providers();
        tracing::info!(providers = ?providers.current().configured_names(), "providers configured");
        check_crd_installed(&client).await?;
        let leases = Arc::new(LeaseStore::new(lease_options, metrics.leases.clone(), None));
        let ctx = Arc::new(
            Context::new(
                client.clone(),
                providers,
                &args.operator_id,
                CredentialsBook::default(),
            )
            .with_abandoned(AbandonedRecord::new(&namespace, &args.operator_id))
            .with_metrics(metrics.reconcile.clone())
            .with_health_probing(args.health.probing()),
        );
        Ok(Operator {
            args,
            client,
            metrics,
            registry,
            leases,
            health_options,
            ctx,
            usage: usage::UsageLedger::default(),
            credentials: Arc::default(),
        })
    }

    /// Serves probes, metrics and the discovery API, follows plugin and config changes, and
    /// reconciles (on the leader) until SIGTERM or Ctrl-C. A replica that loses the leadership
    /// stays up as a standby and leads again when it wins the Lease back.
    pub async fn run(self) -> anyhow::Result<()> {
        let stop = CancellationToken::new();
        tokio::spawn(cancel_on_signal(stop.clone()));
        let election = self
            .args
            .leader
            .leader_election
            .then(|| self.args.leader.election(&self.args.operator_id));
        let view = match election {
            Some(_) => LeaderView::default(),
            None => LeaderView::always_serving(),
        };
        let sync = self.args.lease.lease_durability == Durability::Sync;
        let transport = self.args.lease.transport()?;
        let metrics_auth = self.args.metrics_auth.auth(&self.client);
        let bounds = self.args.listener.bounds()?;
        // Every replica keeps the fleet's caches: its status page, and the leader's meter.
        let (fleet, watches) = self.watch_fleet(&view);
        let status = self.status_sources(&fleet, &view);
        let mut tasks = vec![
            spawn_until(&stop, watches),
            probes::serve(
                &stop,
                self.args.metrics_addr,
                self.metrics.registry.clone(),
                ProbeState {
                    view: view.clone(),
                    leases: self.leases.clone(),
                    grants_wait_for_writes: sync,
                },
                status_page::router(status),
                &metrics_auth,
                bounds,
            )
            .await?,
        ];
        let auth = self.discovery_auth()?;
        if auth.accepts_anyone() {
            let mut discovery = Discovery::with_auth(self.leases.clone(), auth);
            if sync {
                discovery =
                    discovery.answer_grants_once_stored(self.args.lease.lease_commit_timeout);
            }
            if let Some(election) = &election {
                discovery = discovery.naming_the_leader(view.clone(), &election.identity);
            }
            if let Some(access) = self.args.gateway.access() {
                discovery = discovery.serving_the_gateway(access);
            }
            tasks.push(
                serve_discovery(
                    &stop,
                    self.args.lease.discovery_addr,
                    Arc::new(discovery),
                    transport,
                    bounds,
                )
                .await?,
            );
        } else {
            tracing::warn!(
                "DISCOVERY_TOKEN is not set and --discovery-kubernetes-auth=false: the discovery API is off; set either to serve leases"
            );
        }
        // Plugins and config follow their sources on every replica, so a standby takes over warm.
        let registry = self.registry.clone();
        tasks.push(spawn_until(
            &stop,
            registry
                .clone()
                .watch_configmap(self.client.clone(), view.clone()),
        ));
        let reload = self.args.plugin.providers_config_reload_interval;
        if !reload.is_zero() {
            tasks.push(spawn_until(&stop, registry.watch_config_file(reload)));
        }
        let result = if let Some(election) = &election {
            tasks.push(spawn_until(
                &stop,
                leader::follow(self.client.clone(), election.clone(), view.clone()),
            ));
            self.lead_while_elected(&stop, election, &view, &fleet)
                .await
        } else {
            self.lead(&stop, &view, &fleet).await;
            Ok(())
        };
        tracing::info!("shutting down");
        stop.cancel();
        for task in tasks {
            let _ = task.await;
        }
        result
    }

    /// The fleet's caches and the watches that fill them; from here on /metrics reads from them
    /// (and `view`) whether this replica leads and the pools it sees; teams' gateway
    /// credentials are watched beside them.
    fn watch_fleet(
        &self,
        view: &LeaderView,
    ) -> (
        Fleet,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let (fleet, watches) = Fleet::watch(&self.client, self.args.proxy_namespace.as_deref());
        self.metrics.fleet.attach(&fleet, view);
        let credentials = (self.args.discovery_auth.discovery_team_credentials)
            .then(|| self.watch_credentials(view));
        let watches = async move {
            match credentials {
                Some(credentials) => drop(tokio::join!(watches, credentials)),
                None => watches.await,
            }
        };
        (fleet, watches)
    }

    /// Terms of leadership until shutdown: after a lost one, a standby again.
    async fn lead_while_elected(
        &self,
        stop: &CancellationToken,
        election: &leader::LeaderElection,
        view: &LeaderView,
        fleet: &Fleet,
    ) -> anyhow::Result<()> {
        let mut lost_once = false;
        loop {
            let step_down = || {
                view.set_serving(false);
                self.leases.close();
                if let Some(label) = self.leader_label() {
                    tokio::spawn(async move { label.unmark().await });
                }
            };
            let work = || self.lead(stop, view, fleet);
            match leader::lead(self.client.clone(), election, stop, step_down, work).await {
                Ok(leader::Term::Shutdown) => return Ok(()),
                Ok(leader::Term::Lost) if stop.is_cancelled() => return Ok(()),
                Ok(leader::Term::Lost) => lost_once = true,
                // At start a broken election (RBAC, no API server) fails the process, which
                // says why; after a lost term the API server is likely away: wait for it.
                Err(e) if !lost_once => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "cannot rejoin the leader election yet; retrying in 2 s");
                    tokio::select! {
                        () = stop.cancelled() => return Ok(()),
                        () = tokio::time::sleep(Duration::from_secs(2)) => {}
                    }
                }
            }
        }
    }

    /// Who may call the discovery API: the static token (maybe limited to pools) and, unless
    /// turned off, ServiceAccount tokens reviewed with the operator's own identity.
    fn discovery_auth(&self) -> anyhow::Result<Auth> {
        let flags = &self.args.discovery_auth;
        let pools = flags.token_pools()?;
        let mut auth = Auth::none();
        if let Some(token) = self.args.lease.token() {
            auth = auth.with_static_token(token, pools.clone());
        } else if pools.is_some() {
            tracing::warn!(
                "--discovery-token-pools is set but DISCOVERY_TOKEN is not: it limits nothing"
            );
        }
        if let Some(options) = flags.kube_options()? {
            tracing::info!(
                audience = %options.audience,
                cache_ttl = ?options.allow_ttl,
                "the discovery API accepts ServiceAccount tokens; RBAC decides who leases from which pool"
            );
            let reviewer = KubeReviewer::new(self.client.clone(), &options.audience);
            auth = auth.with_kubernetes(Arc::new(reviewer), options);
        }
        if flags.discovery_team_credentials {
            auth = auth.with_credentials(self.credentials.clone());
        }
        Ok(auth)
    }

    /// The watch on teams' gateway credential Secrets that keeps [`Operator::credentials`]
    /// (on every replica, so a standby takes over with them; only the serving one publishes
    /// Events about refused Secrets).
    fn watch_credentials(&self, view: &LeaderView) -> impl Future<Output = ()> + Send + 'static {
        let view = view.clone();
        let refusals = team_watch::Refusals {
            recorder: crate::support::events::recorder(self.client.clone()),
            publish: Arc::new(move || view.is_serving()),
        };
        team_watch::watch(
            self.client.clone(),
            self.args.proxy_namespace.clone(),
            self.credentials.clone(),
            Some(refusals),
        )
    }

    /// The label on this replica's Pod that routes the discovery Service to the leader; `None`
    /// outside a Pod (no `POD_NAME`).
    fn leader_label(&self) -> Option<LeaderLabel> {
        let leader = &self.args.leader;
        let pod = leader
            .pod_name
            .as_deref()
            .filter(|_| leader.leader_election)?;
        Some(LeaderLabel::new(
            self.client.clone(),
            &leader.operator_namespace,
            pod,
        ))
    }

    /// The leader's work: the lease table restored first, then probes, GC, provider checks and
    /// the controller, until `stop`; on the way out the lease table is flushed. Dropped halfway
    /// (leadership lost), everything it started stops and nothing more is written.
    async fn lead(&self, stop: &CancellationToken, view: &LeaderView, fleet: &Fleet) {
        let Operator {
            args,
            client,
            metrics,
            leases,
            health_options,
            ctx,
            ..
        } = self;
        let work = stop.child_token();
        let _stop_work_if_dropped = work.clone().drop_guard();
        let kept = term::restore(client, args, leases, &ctx.credentials, &self.usage).await;
        view.set_serving(true);
        let label = self.leader_label();
        let providers = ctx.providers.clone();
        let namespace = args.proxy_namespace.clone();
        let abandoned = AbandonedRecord::new(&args.leader.operator_namespace, &args.operator_id);
        let mut tasks = vec![
            spawn_until(
                &work,
                usage::persist::maintain(self.usage.clone(), kept.usage.clone()),
            ),
            spawn_until(
                &work,
                leases::persist::maintain(
                    leases.clone(),
                    kept.leases.clone(),
                    args.lease.lease_durability,
                    args.lease.lease_persist_interval,
                ),
            ),
            spawn_until(
                &work,
                HealthEngine::new(
                    client.clone(),
                    providers.clone(),
                    leases.clone(),
                    health_options.clone(),
                    metrics.probes.clone(),
                    ctx.credentials.clone(),
                )
                .run(namespace.clone(), leases.suspects()),
            ),
            spawn_until(
                &work,
                gc::run(
                    client.clone(),
                    providers.clone(),
                    args.operator_id.clone(),
                    args.gc.options(namespace.clone(), Some(abandoned.clone())),
                    metrics.gc.clone(),
                ),
            ),
            spawn_until(
                &work,
                providerhealth::run(
                    client.clone(),
                    providers,
                    args.operator_id.clone(),
                    args.provider_check.provider_check_interval,
                    args.provider_check.timeout(),
                    metrics.provider_checks.clone(),
                ),
            ),
            // Provider access refused at `kubectl apply` (the controllers refuse it anyway).
            spawn_until(&work, controller::keep_access_policy(ctx.clone())),
        ];
        if let Some(label) = label.clone() {
            tasks.push(spawn_until(&work, label.keep()));
        }

        tracing::info!(namespace = ?namespace, "reconciling Proxies and ProxyPools");
        self.reconcile_until(stop, fleet).await;
        // Crawlers go to the next leader from here on; grants still in flight finish.
        view.set_serving(false);
        if let Some(label) = &label {
            label.unmark().await;
        }
        work.cancel();
        for task in tasks {
            let _ = task.await;
        }
        term::persist_at_end(&kept, leases, &self.usage).await;
        leases.close();
    }

    /// What the replica's status page and `/status/*.json` read.
    fn status_sources(&self, fleet: &Fleet, view: &LeaderView) -> status_page::Sources {
        status_page::Sources {
            fleet: fleet.clone(),
            leases: self.leases.clone(),
            providers: self.ctx.providers.clone(),
            view: view.clone(),
            registry: self.metrics.registry.clone(),
            usage: self.usage.clone(),
        }
    }
}

impl Operator {
    /// The Proxy and ProxyPool controllers (and the usage meter beside them), until `stop`;
    /// reconciles in flight finish first.
    async fn reconcile_until(&self, stop: &CancellationToken, fleet: &Fleet) {
        let namespace = self.args.proxy_namespace.as_deref();
        // ProxyQuotas: counted against the fleet's Proxy cache, enforced by both controllers
        // and the lease table, their use written by this leader.
        let (quotas, quota_watch) = quota::watch(&self.client, namespace);
        let view = QuotaView {
            quotas,
            proxies: fleet.proxies.clone(),
        };
        self.ctx.use_quotas(view.clone());
        let quota_work = quota::run(self.client.clone(), view.clone(), self.leases.clone());
        let mut pools = PoolContext::new(
            self.client.clone(),
            self.ctx.providers.clone(),
            self.leases.clone(),
            fleet.proxies.clone(),
        );
        pools.quotas = view;
        let pools = Arc::new(pools);
        let providers = self.ctx.providers.clone();
        let meter = usage::run(
            fleet.proxies.clone(),
            self.leases.clone(),
            self.leases.first_blocks(),
            self.metrics.usage.clone(),
            self.usage.clone(),
            move |name: &str| providers.current().get(name)?.limits().price_per_hour,
        );
        let controllers = async {
            tokio::join!(
                controller::run_until(self.ctx.clone(), namespace, stop.clone().cancelled_owned()),
                pool::run_until(pools, namespace, stop.clone().cancelled_owned()),
            )
        };
        tokio::select! {
            _ = controllers => {}
            () = meter => {}
            () = quota_watch => {}
            () = quota_work => {}
        }
    }
}

/// SIGTERM (Kubernetes stopping the Pod) or Ctrl-C cancels `stop`.
pub(crate) async fn cancel_on_signal(stop: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("stop signal received");
    stop.cancel();
}

/// Runs `work` until it ends or `stop` is cancelled, whichever comes first.
fn spawn_until(
    stop: &CancellationToken,
    work: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let stop = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            () = work => {}
        }
    })
}

fn engine_options(args: &RunArgs, client: &kube::Client) -> EngineOptions {
    let plugin = &args.plugin;
    EngineOptions {
        pool_instances: plugin.plugin_pool_instances,
        memory_limit: plugin.plugin_memory_limit_mib << 20,
        memory_total: plugin.plugin_memory_total_mib << 20,
        cpu_budget: Duration::from_millis(plugin.plugin_cpu_budget_ms),
        call_timeout: Duration::from_secs(plugin.plugin_call_timeout_seconds),
        cache_dir: plugin.plugin_cache_dir.clone(),
        // SSH material for kvm hypervisors: Secrets in the operator's namespace, read on first
        // use; tunnel sockets in private directories under the scratch /tmp.
        libvirt: Some(LibvirtHub::for_operator(
            &args.operator_id,
            MaterialSource::Secrets {
                client: client.clone(),
                namespace: args.leader.operator_namespace.clone(),
            },
            std::env::temp_dir(),
        )),
        kube: Some(client.clone()),
        operator_objects: Arc::new(operator_objects(args)),
    }
}

/// The objects of this operator that no plugin may touch.
fn operator_objects(args: &RunArgs) -> OperatorObjects {
    let namespace = &args.leader.operator_namespace;
    OperatorObjects::of(
        &args.operator_id,
        namespace,
        &args.plugin.providers_configmap,
        args.plugin
            .plugins_configmap
            .as_deref()
            .map(|name| (namespace.as_str(), name)),
    )
}

async fn check_crd_installed(client: &kube::Client) -> anyhow::Result<()> {
    let crds: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(client.clone());
    for name in [Proxy::crd_name(), ProxyPool::crd_name()] {
        crds.get(name).await.with_context(|| {
            format!("the CRD {name} is not installed: kubectl apply -f deploy/crds/")
        })?;
    }
    Ok(())
}

/// A kvm provider instance without its SSH Secret still starts: only its calls fail (and recover
/// when the Secret appears). Say so once at start, where an operator reads first.
async fn warn_about_missing_ssh_secrets(
    client: &kube::Client,
    namespace: &str,
    config: &ProvidersConfig,
) {
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), namespace);
    for entry in &config.providers {
        let Some(grant) = &entry.grants.libvirt else {
            continue;
        };
        let secret = format!("{namespace}/{}", grant.ssh_secret);
        match secrets.get_opt(&grant.ssh_secret).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::warn!(
                provider = %entry.name,
                %secret,
                "the SSH Secret for this provider's hypervisors does not exist; its Proxies wait until it is created (see docs/providers/kvm.md)"
            ),
            Err(e) => tracing::warn!(
                provider = %entry.name,
                %secret,
                error = %e,
                "cannot read the SSH Secret for this provider's hypervisors"
            ),
        }
    }
}

/// The discovery API on `addr` until `stop`: over TLS with a certificate that follows its files
/// (read again every [`crate::support::tls::RELOAD_EVERY`]), or plain HTTP when asked.
async fn serve_discovery(
    stop: &CancellationToken,
    addr: std::net::SocketAddr,
    discovery: Arc<Discovery>,
    transport: Transport,
    bounds: crate::support::listener::ListenerBounds,
) -> anyhow::Result<JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --discovery-addr {addr}"))?;
    let router = leases::router(discovery);
    let tls = match transport {
        Transport::PlainHttp => {
            tracing::warn!(%addr, "serving the discovery API over plain HTTP (--discovery-plain-http): tokens cross the network in clear");
            None
        }
        Transport::Tls(files) => {
            tracing::info!(%addr, cert = %files.cert.display(), "serving the discovery API over TLS");
            let cert = ReloadingCert::new(files);
            let acceptor = cert.acceptor()?;
            // Dropped with the server: the task below ends both.
            let watch = cert.watch(crate::support::tls::RELOAD_EVERY);
            let serve = leases::serve_tls(listener, router, Some(acceptor), bounds);
            return Ok(spawn_until(stop, async move {
                tokio::join!(watch, serve);
            }));
        }
    };
    Ok(spawn_until(
        stop,
        leases::serve_tls(listener, router, tls, bounds),
    ))
}
