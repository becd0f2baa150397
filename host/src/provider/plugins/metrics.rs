//! Metrics of calls into plugins: calls, errors by kind, duration.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::error::CallError;

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
