//! A pool's spec, checked against the providers config and resolved to what `decide::plan`
//! needs: counts, places and the template's hash. No I/O.

use sha2::{Digest, Sha256};

use super::decide::{self, Desired, Slot};
use crate::api::{MAX_POOL_REPLICAS, ProxyPool};

/// Why a pool cannot be acted on: the condition's reason and a message naming the field.
#[derive(Debug, PartialEq)]
pub struct Invalid {
    pub reason: &'static str,
    pub message: String,
}

/// The pool's spec, checked against the providers config and resolved to counts and slots.
pub fn resolve(
    pool: &ProxyPool,
    providers: &crate::provider::providers::Providers,
) -> Result<Desired, Invalid> {
    let spec = &pool.spec;
    let invalid_spec = |message: String| Invalid {
        reason: "InvalidSpec",
        message,
    };
    if !(0..=MAX_POOL_REPLICAS).contains(&spec.replicas) {
        return Err(invalid_spec(format!(
            "spec.replicas: {} is outside 0..={MAX_POOL_REPLICAS}",
            spec.replicas
        )));
    }
    let replicas = spec.replicas as usize;
    let slots = slots_of(spec).map_err(invalid_spec)?;
    let expire_after = spec
        .expire_after
        .as_deref()
        .map(|text| {
            crate::support::durations::parse(text)
                .map_err(|e| invalid_spec(format!("spec.expireAfter: {e}")))
        })
        .transpose()?;
    let (max_surge, max_unavailable) = decide::budget(
        spec.max_surge.as_ref(),
        spec.max_unavailable.as_ref(),
        replicas,
    )
    .map_err(invalid_spec)?;
    for (field, slot) in &slots {
        if !providers.is_configured(&slot.provider) {
            return Err(Invalid {
                reason: "UnknownProvider",
                message: format!(
                    "{field}: `{}` is not a provider of the operator's providers config (configured: {}); name one of them",
                    slot.provider,
                    providers.configured_names().join(", ")
                ),
            });
        }
    }
    // A spec error first (the user's to fix), then what the operator's config is missing.
    for (field, slot) in &slots {
        if providers.get(&slot.provider).is_none() {
            let why = providers
                .not_loaded(&slot.provider)
                .map_or("its plugin is not loaded", |n| n.reason.as_str());
            return Err(Invalid {
                reason: "ProviderNotLoaded",
                message: format!(
                    "{field}: provider `{}` cannot make Proxies: {why}; the pool makes none until it loads",
                    slot.provider
                ),
            });
        }
    }
    Ok(Desired {
        replicas,
        template_hash: template_hash(pool),
        slots: slots.into_iter().map(|(_, slot)| slot).collect(),
        expire_after,
        recycle_after: spec.recycle_after,
        max_surge,
        max_unavailable,
    })
}

/// A short digest of the template: a Proxy made from another one is replaced.
pub fn template_hash(pool: &ProxyPool) -> String {
    let bytes = serde_json::to_vec(&pool.spec.template).expect("a template always serializes");
    hex::encode(&Sha256::digest(&bytes)[..5])
}

/// Where the pool's Proxies may run, each with the field that names its provider: the spread's
/// entries (over the template), or the template alone.
fn slots_of(spec: &crate::api::ProxyPoolSpec) -> Result<Vec<(String, Slot)>, String> {
    let template = &spec.template.spec;
    let template_zone = template.placement.as_ref().and_then(|p| p.zone.clone());
    let mut slots: Vec<(String, Slot)> = Vec::new();
    if spec.spread.is_empty() {
        slots.push((
            "spec.template.spec.provider".into(),
            Slot {
                provider: template.provider.clone(),
                zone: template_zone,
            },
        ));
    } else {
        for (index, target) in spec.spread.iter().enumerate() {
            let slot = Slot {
                provider: target
                    .provider
                    .clone()
                    .unwrap_or_else(|| template.provider.clone()),
                zone: target.zone.clone().or_else(|| template_zone.clone()),
            };
            let field = if target.provider.is_some() {
                format!("spec.spread[{index}].provider")
            } else {
                "spec.template.spec.provider".into()
            };
            if slots.iter().any(|(_, s)| *s == slot) {
                return Err(format!(
                    "spec.spread[{index}]: the same provider and zone as an earlier entry; list each place once"
                ));
            }
            slots.push((field, slot));
        }
    }
    Ok(slots)
}
