//! The one wasmtime `Engine` of the operator: component model, pooling allocator with an
//! on-demand fallback, copy-on-write memory images, and epoch interruption driven by a ticker.

use crate::provider::capabilities::kube::OperatorObjects;
use crate::provider::capabilities::libvirt::LibvirtHub;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings;
use super::cache::CompileCache;
use super::memory::MemoryTotal;
use super::metrics::PluginMetrics;
use super::state::HostState;

/// One epoch tick. 10 ms keeps the check cheap (measured +1–11 % in wasm-notes) while a runaway
/// plugin is still stopped within a tick of its budget.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// How the engine is sized and what every call may use.
#[derive(Clone)]
pub struct EngineOptions {
    /// Component instances the pooling allocator keeps ready; 0 selects on-demand allocation.
    /// Must cover the sum of the provider instances' concurrency bounds.
    pub pool_instances: u32,
    /// Memory (every linear memory and table of its store) one plugin call may hold.
    pub memory_limit: usize,
    /// Memory all plugin calls in flight may hold together.
    pub memory_total: usize,
    /// CPU time (in wasm) a call may use before it is stopped.
    pub cpu_budget: Duration,
    /// Wall-clock limit of a whole call, including waits in host capabilities.
    pub call_timeout: Duration,
    /// Where compiled components are cached; `None` disables the cache.
    pub cache_dir: Option<PathBuf>,
    /// The process's hypervisor connections and SSH material (the `libvirt` capability);
    /// `None` without SSH material (every libvirt call is then denied).
    pub libvirt: Option<Arc<LibvirtHub>>,
    /// The operator's Kubernetes client (the `kube` capability); `None` without a cluster.
    pub kube: Option<kube::Client>,
    /// The operator's own objects, out of every plugin's reach.
    pub operator_objects: Arc<OperatorObjects>,
}

// By hand: `kube::Client` has no Debug.
impl std::fmt::Debug for EngineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineOptions")
            .field("pool_instances", &self.pool_instances)
            .field("memory_limit", &self.memory_limit)
            .field("memory_total", &self.memory_total)
            .field("cpu_budget", &self.cpu_budget)
            .field("call_timeout", &self.call_timeout)
            .field("cache_dir", &self.cache_dir)
            .field("libvirt", &self.libvirt)
            .field("kube", &self.kube.is_some())
            .field("operator_objects", &self.operator_objects)
            .finish()
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            pool_instances: 64,
            memory_limit: 128 << 20,
            memory_total: 384 << 20,
            cpu_budget: Duration::from_secs(2),
            call_timeout: Duration::from_secs(60),
            cache_dir: None,
            libvirt: None,
            kube: None,
            operator_objects: Arc::default(),
        }
    }
}

/// Which instance allocator the engine ended up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocatorKind {
    Pooling {
        instances: u32,
    },
    /// On-demand, with the reason the pool could not be used (none when asked for).
    OnDemand {
        reason: Option<String>,
    },
}

/// The engine, its linker with every supported WIT version's imports, and the epoch ticker.
pub struct PluginEngine {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) options: EngineOptions,
    pub(crate) cache: Option<CompileCache>,
    pub(crate) metrics: PluginMetrics,
    /// What the calls in flight hold, against `memory_total`.
    pub(crate) memory_total: Arc<MemoryTotal>,
    allocator: AllocatorKind,
    ticker_stop: Arc<AtomicBool>,
}

impl PluginEngine {
    /// Builds the engine. A pool that does not fit the address space falls back to on-demand
    /// allocation with a warning instead of failing the operator.
    pub fn new(
        options: EngineOptions,
        registry: &prometheus::Registry,
    ) -> anyhow::Result<Arc<Self>> {
        check_memory_options(&options)?;
        let (engine, allocator) = if options.pool_instances == 0 {
            (
                build_engine(&options, None)?,
                AllocatorKind::OnDemand { reason: None },
            )
        } else {
            match build_engine(&options, Some(options.pool_instances)) {
                Ok(engine) => (
                    engine,
                    AllocatorKind::Pooling {
                        instances: options.pool_instances,
                    },
                ),
                Err(err) => {
                    let reason = format!("{err:#}");
                    tracing::warn!(
                        pool_instances = options.pool_instances,
                        "pooling allocator unavailable, using on-demand allocation: {reason}"
                    );
                    (
                        build_engine(&options, None)?,
                        AllocatorKind::OnDemand {
                            reason: Some(reason),
                        },
                    )
                }
            }
        };

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking WASI: {e}"))?;
        bindings::add_to_linker(&mut linker)?;

        let cache = options.cache_dir.as_ref().and_then(|dir| {
            CompileCache::open(dir, &engine)
                .map_err(
                    |e| tracing::warn!(dir = %dir.display(), error = %e, "compile cache disabled"),
                )
                .ok()
        });

        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone());

        Ok(Arc::new(PluginEngine {
            engine,
            linker,
            cache,
            metrics: PluginMetrics::register(registry)?,
            memory_total: MemoryTotal::new(options.memory_total),
            options,
            allocator,
            ticker_stop,
        }))
    }

    /// The allocator in use (and why, if the pool was refused).
    pub fn allocator(&self) -> &AllocatorKind {
        &self.allocator
    }

    /// The options the engine was built with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    pub(crate) fn cpu_ticks(&self) -> u64 {
        (self.options.cpu_budget.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
    }
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// A call budget above the total could never be reached: refuse it at start, naming both flags.
fn check_memory_options(options: &EngineOptions) -> anyhow::Result<()> {
    if options.memory_limit > options.memory_total {
        anyhow::bail!(
            "--plugin-memory-limit-mib ({} MiB per call) is more than --plugin-memory-total-mib \
             ({} MiB for all calls together); raise the total (PLUGIN_MEMORY_TOTAL_MIB, within \
             the container's memory limit) or lower the per-call limit (PLUGIN_MEMORY_LIMIT_MIB)",
            options.memory_limit >> 20,
            options.memory_total >> 20
        );
    }
    Ok(())
}

fn build_engine(options: &EngineOptions, pool: Option<u32>) -> anyhow::Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.memory_init_cow(true);
    if let Some(instances) = pool {
        let mut pooling = PoolingAllocationConfig::default();
        pooling.total_component_instances(instances);
        // Components from other languages use many core instances each (Python: ~10).
        pooling.total_core_instances(instances.saturating_mul(16));
        pooling.total_memories(instances.saturating_mul(4));
        pooling.total_tables(instances.saturating_mul(16));
        pooling.max_core_instances_per_component(32);
        pooling.max_memories_per_component(8);
        pooling.max_tables_per_component(32);
        pooling.max_memory_size(options.memory_limit);
        pooling.max_component_instance_size(1 << 20);
        pooling.max_core_instance_size(1 << 20);
        // Reset a freed slot by memset instead of madvise, and (PAGEMAP_SCAN, Linux ≥ 6.7) only
        // the pages the call dirtied: no page faults on the next call, no TLB shootdowns across
        // the runtime's threads. A Rust guest's stack alone is its first MiB.
        pooling.pagemap_scan(wasmtime::Enabled::Auto);
        pooling.linear_memory_keep_resident(2 << 20);
        pooling.table_keep_resident(64 << 10);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    }
    Engine::new(&config).map_err(|e| anyhow::anyhow!("{e:#}"))
}

/// Advances the epoch every tick on a plain thread, so the deadline keeps counting even when the
/// async runtime is saturated by the plugin calls it should interrupt.
fn spawn_epoch_ticker(engine: Engine, stop: Arc<AtomicBool>) {
    std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })
        .expect("spawning the epoch ticker thread");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_budget_above_the_total_is_refused_at_start() {
        let options = EngineOptions {
            pool_instances: 0,
            memory_limit: 512 << 20,
            memory_total: 384 << 20,
            ..EngineOptions::default()
        };
        let error = PluginEngine::new(options, &prometheus::Registry::new())
            .err()
            .expect("refused")
            .to_string();
        for says in [
            "--plugin-memory-limit-mib (512 MiB per call)",
            "--plugin-memory-total-mib (384 MiB",
            "PLUGIN_MEMORY_TOTAL_MIB",
        ] {
            assert!(error.contains(says), "{error}");
        }
    }
}
