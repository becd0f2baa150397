//! Prometheus metrics. One registry for the operator, names prefixed `proxy_operator_`, labels
//! bounded: plugin and provider-instance names come from the operator's own config, functions and
//! error kinds from fixed sets.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use crate::plugins::CallError;

/// Metrics of calls into plugins.
#[derive(Clone)]
pub struct PluginMetrics {
    calls: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
}

impl PluginMetrics {
    /// Creates and registers the plugin-call metrics.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let calls = IntCounterVec::new(
            Opts::new(
                "proxy_operator_plugin_calls_total",
                "Calls into provider plugins, by result.",
            ),
            &["plugin", "provider", "function", "result"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "proxy_operator_plugin_call_errors_total",
                "Failed calls into provider plugins, by error kind.",
            ),
            &["plugin", "provider", "function", "kind"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "proxy_operator_plugin_call_duration_seconds",
                "Duration of calls into provider plugins, including host capability waits.",
            )
            .buckets(vec![
                0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
                120.0,
            ]),
            &["plugin", "function"],
        )?;
        registry.register(Box::new(calls.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(PluginMetrics {
            calls,
            errors,
            duration,
        })
    }

    pub(crate) fn observe(
        &self,
        plugin: &str,
        provider: &str,
        function: &str,
        elapsed: Duration,
        error: Option<&CallError>,
    ) {
        let result = if error.is_some() { "error" } else { "ok" };
        self.calls
            .with_label_values(&[plugin, provider, function, result])
            .inc();
        if let Some(error) = error {
            self.errors
                .with_label_values(&[plugin, provider, function, error.kind()])
                .inc();
        }
        self.duration
            .with_label_values(&[plugin, function])
            .observe(elapsed.as_secs_f64());
    }
}

/// Metrics of Proxy reconciles.
#[derive(Clone)]
pub struct ReconcileMetrics {
    total: IntCounterVec,
    duration: HistogramVec,
}

impl ReconcileMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let total = IntCounterVec::new(
            Opts::new(
                "proxy_operator_reconcile_total",
                "Proxy reconciles, by result: success or error (retried with backoff).",
            ),
            &["result"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "proxy_operator_reconcile_duration_seconds",
                "Duration of Proxy reconciles, including provider calls, by result.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0,
            ]),
            &["result"],
        )?;
        registry.register(Box::new(total.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(ReconcileMetrics { total, duration })
    }

    pub(crate) fn observe(&self, elapsed: Duration, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.total.with_label_values(&[result]).inc();
        self.duration
            .with_label_values(&[result])
            .observe(elapsed.as_secs_f64());
    }
}
