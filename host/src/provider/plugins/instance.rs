//! A provider instance: a loaded plugin, its config and its grants, with a concurrency bound.
//! Every call runs in a fresh store under the engine's CPU, memory and wall-clock limits.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tracing::Instrument;
use wasmtime::{Store, UpdateDeadline};

use super::bindings;
use super::call::{Call, CallFailure, Output};
use super::engine::PluginEngine;
use super::error::CallError;
use super::load::LoadedPlugin;
use super::memory::{MemoryBound, MemoryLimiter};
use super::state::HostState;
use super::types::Capability;
use super::types::{CheckTarget, Instance, InstanceSpec, ProviderError, ProxyCredentials};
use crate::provider::capabilities::{
    CallContext, Declared, GrantError, HostResources, ValidGrants,
};

/// Per-provider-instance settings.
#[derive(Debug, Clone)]
pub struct ProviderInstanceOptions {
    /// Calls that may run at once; more wait for a slot.
    pub max_concurrent_calls: usize,
    /// Set for a provider of proxies that exist already (`crate::provider::upstream`).
    pub upstream: Option<crate::provider::upstream::UpstreamSettings>,
}

impl Default for ProviderInstanceOptions {
    fn default() -> Self {
        ProviderInstanceOptions {
            max_concurrent_calls: 8,
            upstream: None,
        }
    }
}

/// One entry of the providers config, bound to its plugin.
pub struct ProviderInstance {
    name: String,
    plugin: Arc<LoadedPlugin>,
    config: String,
    context: Arc<CallContext>,
    permits: Arc<Semaphore>,
    /// Health checks have their own slot, so a slow check never takes one from a reconcile.
    check_permit: Arc<Semaphore>,
    engine: Arc<PluginEngine>,
    upstream: Option<crate::provider::upstream::UpstreamSettings>,
    /// Its `limits` in the providers config: the controllers make no Proxy beyond the cap.
    limits: crate::provider::limits::Limits,
}

impl std::fmt::Debug for ProviderInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderInstance")
            .field("name", &self.name)
            .field("plugin", &self.plugin.info.name)
            .finish()
    }
}

/// What a successful delete did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    Deleted,
    /// The provider answered `not-found`: nothing (of the operator's) is at that id; why.
    NothingThere(String),
}

macro_rules! expect_output {
    ($result:expr, $variant:ident) => {
        match $result? {
            Output::$variant(v) => Ok(v),
            _ => unreachable!(concat!("the call returns ", stringify!($variant))),
        }
    };
}

impl ProviderInstance {
    /// Binds a plugin to a provider instance's config, and its capabilities to the valid grants.
    pub fn new(
        engine: Arc<PluginEngine>,
        name: &str,
        plugin: Arc<LoadedPlugin>,
        config: &serde_json::Value,
        grants: &ValidGrants,
        options: ProviderInstanceOptions,
    ) -> Result<Self, GrantError> {
        let resources = HostResources {
            libvirt: engine.options.libvirt.clone(),
            kube: engine.options.kube.clone(),
            operator_objects: engine.options.operator_objects.clone(),
        };
        let declares = |c: Capability| plugin.info.capabilities.contains(&c);
        let declared = Declared {
            log: declares(Capability::Log),
            http: declares(Capability::Http),
            kube: declares(Capability::Kube),
            libvirt: declares(Capability::Libvirt),
        };
        let mut context = CallContext::bind(name, &plugin.info.name, declared, grants, &resources)?;
        context.kube = context.kube.with_memory_limit(engine.options.memory_limit);
        let context = Arc::new(context);
        Ok(ProviderInstance {
            name: name.to_string(),
            plugin,
            config: config.to_string(),
            context,
            permits: Arc::new(Semaphore::new(options.max_concurrent_calls.max(1))),
            check_permit: Arc::new(Semaphore::new(1)),
            engine,
            upstream: options.upstream,
            limits: Default::default(),
        })
    }

    /// With the `limits` of its providers config entry.
    pub fn with_limits(mut self, limits: crate::provider::limits::Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The most Proxies it may have (its `limits`), if it has a cap.
    pub fn cap(&self) -> Option<crate::provider::limits::ProxyCap> {
        self.limits.cap()
    }

    /// Its `limits` as written (`pricePerHour` is the price cost figures may use).
    pub fn limits(&self) -> &crate::provider::limits::Limits {
        &self.limits
    }

    /// The provider instance's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its `upstream` section, when it fronts proxies that exist already: their login is the
    /// host's, never given to the plugin.
    pub fn upstream(&self) -> Option<&crate::provider::upstream::UpstreamSettings> {
        self.upstream.as_ref()
    }

    /// The plugin serving it.
    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.plugin
    }

    async fn call(&self, call: Call) -> Result<Output, CallError> {
        let permits = match call {
            Call::Check => &self.check_permit,
            _ => &self.permits,
        };
        // Waiting for a slot is cancellable: dropping the future gives up the wait.
        let _permit = permits
            .acquire()
            .await
            .expect("the semaphore is never closed");
        self.engine
            .invoke(&self.plugin, self.context.clone(), &self.config, call)
            .await
    }

    /// Runs the plugin's `validate-config` on this instance's config.
    pub async fn validate_config(&self) -> Result<(), CallError> {
        expect_output!(self.call(Call::ValidateConfig).await, Unit)
    }

    /// Creates (or finds, by `spec.name`) an instance.
    pub async fn create(&self, spec: InstanceSpec) -> Result<Instance, CallError> {
        expect_output!(self.call(Call::Create(Box::new(spec))).await, Instance)
    }

    pub async fn get(&self, provider_id: &str) -> Result<Instance, CallError> {
        expect_output!(
            self.call(Call::Get(provider_id.to_string())).await,
            Instance
        )
    }

    /// Deletes an instance; one that is already gone counts as deleted.
    /// Deletes an instance; `not-found` is success (nothing is left at that id), with the
    /// provider's reason kept for the events.
    pub async fn delete(&self, provider_id: &str) -> Result<Deletion, CallError> {
        match self.call(Call::Delete(provider_id.to_string())).await {
            Ok(_) => Ok(Deletion::Deleted),
            Err(CallError::Provider {
                error: ProviderError::NotFound(detail),
                ..
            }) => Ok(Deletion::NothingThere(detail)),
            Err(e) => Err(e),
        }
    }

    /// Makes a running instance's squid require `credentials` (WIT 0.2.0 on; a 0.1.0 plugin
    /// answers `permanent`).
    pub async fn set_credentials(
        &self,
        provider_id: &str,
        credentials: ProxyCredentials,
    ) -> Result<(), CallError> {
        let call = Call::SetCredentials(provider_id.to_string(), Box::new(credentials));
        expect_output!(self.call(call).await, Unit)
    }

    pub async fn list(&self) -> Result<Vec<Instance>, CallError> {
        expect_output!(self.call(Call::List).await, Instances)
    }

    /// Runs the provider's health check, in its own concurrency slot (one at a time), apart from
    /// the slots of the other calls.
    pub async fn check(&self) -> Result<Vec<CheckTarget>, CallError> {
        expect_output!(self.call(Call::Check).await, Checks)
    }
}

impl PluginEngine {
    /// One sandboxed call: fresh store and instance, CPU budget, memory cap, wall-clock timeout.
    pub(crate) async fn invoke(
        &self,
        plugin: &LoadedPlugin,
        context: Arc<CallContext>,
        config: &str,
        call: Call,
    ) -> Result<Output, CallError> {
        let function = call.name();
        let provider = context.provider.clone();
        let plugin_name = if plugin.info.name.is_empty() {
            plugin.source_name.clone()
        } else {
            plugin.info.name.clone()
        };
        let started = Instant::now();
        let timeout = self.options.call_timeout;
        // Everything the call logs (the plugin's own lines, host capabilities) carries these.
        let span = tracing::info_span!("plugin_call", plugin = %plugin_name, %provider, function);
        let run = self.run_in_store(plugin, &plugin_name, context, config, call);
        let result = match tokio::time::timeout(timeout, run).instrument(span).await {
            Ok(result) => result,
            Err(_) => Err(CallError::Timeout {
                plugin: plugin_name.clone(),
                function,
                timeout,
            }),
        };
        self.metrics.observe(
            &plugin_name,
            &provider,
            function,
            started.elapsed(),
            result.as_ref().err(),
        );
        if let Err(e) = &result {
            tracing::debug!(plugin = %plugin_name, provider = %provider, function, kind = e.kind(), error = %e, "plugin call failed");
        }
        result
    }

    async fn run_in_store(
        &self,
        plugin: &LoadedPlugin,
        plugin_name: &str,
        context: Arc<CallContext>,
        config: &str,
        call: Call,
    ) -> Result<Output, CallError> {
        let function = call.name();
        let provider = context.provider.clone();
        let mut store = Store::new(
            &self.engine,
            HostState::new(
                context,
                MemoryLimiter::new(self.options.memory_limit, self.memory_total.clone()),
                self.cpu_ticks(),
            ),
        );
        store.limiter(|state| &mut state.limiter);
        // Each tick spent in wasm costs one unit of the budget; yielding on every tick keeps a busy
        // plugin from holding a runtime thread.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            if state.cpu_ticks_left == 0 {
                state.cpu_exhausted = true;
                return Ok(UpdateDeadline::Interrupt);
            }
            state.cpu_ticks_left -= 1;
            Ok(UpdateDeadline::Yield(1))
        });

        // A panic in a host function (or in the bindings) is a bug of the host's, triggered by
        // what this plugin sent: it fails this call, never the process (#36).
        let answer = CatchPanic(Box::pin(bindings::call(
            &mut store,
            &plugin.pre,
            config,
            call,
        )))
        .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(panic) => {
                tracing::error!(plugin = %plugin_name, %provider, function, panic = %panic, "the host panicked serving a plugin call; the call fails, the operator goes on");
                return Err(CallError::HostPanic {
                    plugin: plugin_name.to_string(),
                    function,
                    reason: panic,
                });
            }
        };
        let outcome = match answer {
            Ok(outcome) => Ok(outcome),
            Err(CallFailure::Instantiate(e)) => {
                return Err(self.classify_failure(e, store.data(), plugin_name, function, true));
            }
            Err(CallFailure::Run(e)) => Err(e),
        };
        match outcome {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(error)) => Err(CallError::Provider {
                provider,
                function,
                error,
            }),
            Err(e) => Err(self.classify_failure(e, store.data(), plugin_name, function, false)),
        }
    }

    fn classify_failure(
        &self,
        error: wasmtime::Error,
        state: &HostState,
        plugin: &str,
        function: &'static str,
        instantiating: bool,
    ) -> CallError {
        let plugin = plugin.to_string();
        if state.cpu_exhausted {
            return CallError::CpuDeadline {
                plugin,
                function,
                budget: Duration::from_millis(
                    self.cpu_ticks() * super::engine::EPOCH_TICK.as_millis() as u64,
                ),
            };
        }
        match state.limiter.hit {
            Some(MemoryBound::Call) => {
                return CallError::OutOfMemory {
                    plugin,
                    function,
                    limit: state.limiter.limit,
                };
            }
            Some(MemoryBound::Total) => {
                return CallError::MemoryTotal {
                    plugin,
                    function,
                    total: state.limiter.total().ceiling(),
                };
            }
            None => {}
        }
        let mut reason = match error.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::UnreachableCodeReached) => {
                "the plugin panicked (wasm `unreachable` executed)".to_string()
            }
            Some(trap) => trap.to_string(),
            None => format!("{error:#}"),
        };
        let stderr = state.stderr.tail();
        if !stderr.is_empty() {
            reason.push_str("; plugin stderr: ");
            reason.push_str(&stderr);
        }
        if instantiating {
            CallError::Instantiate {
                plugin,
                function,
                reason,
            }
        } else {
            CallError::Trap {
                plugin,
                function,
                reason,
            }
        }
    }
}

/// A future whose panic, while polled, becomes `Err` with the panic's message.
struct CatchPanic<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic_message(panic.as_ref()))),
        }
    }
}

/// What a panic said (`panic!` gives a `&str` or a `String`).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_while_polled_is_an_error_with_its_message() {
        let panics = CatchPanic(Box::pin(async {
            tokio::task::yield_now().await;
            let shapes: Vec<u8> = Vec::new();
            shapes[3]
        }));
        let message = panics.await.unwrap_err();
        assert!(message.contains("index out of bounds"), "{message}");
        assert_eq!(CatchPanic(Box::pin(async { 7 })).await, Ok(7));
    }
}
