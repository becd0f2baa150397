//! The metric series the table keeps: one per pool label and provider (dropped when nothing
//! uses it), the refusals' label sets (pruned when their pool or provider goes) and the gauges.

use std::collections::HashMap;
use std::sync::Arc;

use super::{GrantError, Inner, LeaseRequest, LeaseStore, ProxyKey};
use crate::leasing::leases::metrics::{
    ANY_PROVIDER, LeaseMetrics, NO_POOL, Series, SeriesKey, UNKNOWN,
};

/// The series of a label set, made once.
pub(super) fn series_for(
    cache: &mut HashMap<SeriesKey, Arc<Series>>,
    key: SeriesKey,
    metrics: &LeaseMetrics,
) -> Arc<Series> {
    cache
        .entry(key)
        .or_insert_with_key(|key| Arc::new(metrics.series(key)))
        .clone()
}

impl LeaseStore {
    pub(super) fn update_gauges(&self, inner: &Inner) {
        self.metrics.cooling_down.set(inner.cooldowns.len() as i64);
        self.metrics
            .target_cooldowns
            .set(inner.targets.len() as i64);
        self.metrics.sessions.set(inner.sessions.len() as i64);
    }

    /// Drops the rejection series of pools and providers that are gone.
    pub(super) fn prune_rejected(&self, inner: &mut Inner) {
        let Inner {
            rejected_labels,
            known_pools,
            pooled,
            providers,
            ..
        } = inner;
        rejected_labels.retain(|(reason, pool, provider)| {
            let pool_ok = pool == NO_POOL
                || pool == UNKNOWN
                || ProxyKey::parse(pool)
                    .is_some_and(|k| known_pools.contains(&k) || pooled.contains_key(&k));
            let provider_ok =
                provider == ANY_PROVIDER || provider == UNKNOWN || providers.contains(provider);
            if !(pool_ok && provider_ok) {
                let _ = self.metrics.rejected.remove_label_values(&[
                    *reason,
                    pool.as_str(),
                    provider.as_str(),
                ]);
            }
            pool_ok && provider_ok
        });
    }

    /// Counts a refusal, labelled by what was asked for: a pool or provider the table does not
    /// know is `unknown`, so requests cannot make new series.
    pub(super) fn reject(&self, inner: &mut Inner, request: &LeaseRequest, error: &GrantError) {
        let pool = match &request.pool {
            None => NO_POOL.to_string(),
            Some(p) if inner.is_known(p) => p.to_string(),
            Some(_) => UNKNOWN.to_string(),
        };
        let provider = match &request.provider {
            None => ANY_PROVIDER,
            Some(p) if inner.providers.contains(p) => p.as_str(),
            Some(_) => UNKNOWN,
        };
        let reason = error.reason();
        self.metrics
            .rejected
            .with_label_values(&[reason, pool.as_str(), provider])
            .inc();
        if pool != NO_POOL || provider != ANY_PROVIDER {
            let labels = (reason, pool, provider.to_string());
            if !inner.rejected_labels.contains(&labels) {
                inner.rejected_labels.insert(labels);
            }
        }
    }
}
