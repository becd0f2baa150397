//! What each kind of object a plugin applies may select, and what its templates carry: the kind
//! allow-list of `grants.kube.kinds` (`grants::KNOWN_KINDS`) names one [`KindPolicy`] per kind,
//! and this module applies it. Every template inside an object (a workload's, a Job's or a
//! ReplicationController's Pod template, a CronJob's Job template and its Pod template, a
//! PodTemplate's) carries the provider instance's label, and every selector (a workload's,
//! a Job's, a ReplicationController's, a PodDisruptionBudget's, a Service's, a NetworkPolicy's)
//! selects only Pods with it: an object of one provider instance never adopts, deletes, joins or
//! shields another's Pods. Pure: no I/O, the object is rewritten in place or refused naming the
//! field.

use serde_json::{Map, Value, json};

use super::traffic_policy::{self, OwnLabel, json_kind};
pub use crate::provider::capabilities::grants::KindPolicy;

/// Confines `data` (the object without its metadata, which the caller labels) by its kind's
/// policy. Exhaustive over the kinds the host knows: a new kind must say how it is confined.
pub fn confine(policy: KindPolicy, data: &mut Value, own: OwnLabel) -> Result<(), String> {
    match policy {
        KindPolicy::Data | KindPolicy::Pod => Ok(()),
        KindPolicy::Service => traffic_policy::confine_service(data, own),
        KindPolicy::NetworkPolicy => traffic_policy::confine_network_policy(data, own),
        KindPolicy::Workload => {
            // A StatefulSet's claim templates make PersistentVolumeClaims (storage no quota of
            // the grant counts, volumes no Pod allow-list sees).
            if data
                .pointer("/spec/volumeClaimTemplates")
                .is_some_and(|v| !v.is_null())
            {
                return Err(
                    "spec.volumeClaimTemplates is not allowed (a plugin's Pods use emptyDir, downwardAPI and its own ConfigMaps)"
                        .into(),
                );
            }
            label_selector(data, &["spec", "selector"], Presence::Required, own)?;
            template(data, &["spec", "template"], own)
        }
        KindPolicy::ReplicationController => {
            // Without a selector the API server takes the template's labels, which carry the
            // instance's label; a selector given is confined to it.
            if let Some(selector) = map_at(data, &["spec", "selector"], false)? {
                confine_labels(selector, "spec.selector", own)?;
            }
            template(data, &["spec", "template"], own)
        }
        KindPolicy::Job => {
            label_selector(data, &["spec", "selector"], Presence::Optional, own)?;
            template(data, &["spec", "template"], own)
        }
        KindPolicy::CronJob => {
            template(data, &["spec", "jobTemplate"], own)?;
            label_selector(
                data,
                &["spec", "jobTemplate", "spec", "selector"],
                Presence::Optional,
                own,
            )?;
            template(data, &["spec", "jobTemplate", "spec", "template"], own)
        }
        KindPolicy::PodTemplate => template(data, &["template"], own),
        KindPolicy::PodDisruptionBudget => {
            label_selector(data, &["spec", "selector"], Presence::Required, own)
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Presence {
    /// Made (selecting the instance's Pods) when missing: an empty selector selects every Pod.
    Required,
    /// Confined when given; when missing, the API server derives one from the template.
    Optional,
}

/// A template's `metadata.labels` carry the instance's label (made when missing).
fn template(data: &mut Value, path: &[&str], own: OwnLabel) -> Result<(), String> {
    let mut at = path.to_vec();
    at.extend(["metadata", "labels"]);
    let labels = map_at(data, &at, true)?.expect("made when missing");
    confine_labels(labels, &at.join("."), own)
}

/// A label selector (`matchLabels`, `matchExpressions`) selects only the instance's Pods: its
/// `matchLabels` get the instance's label (ANDed with whatever else it says).
fn label_selector(
    data: &mut Value,
    path: &[&str],
    presence: Presence,
    own: OwnLabel,
) -> Result<(), String> {
    if presence == Presence::Optional && map_at(data, path, false)?.is_none() {
        return Ok(());
    }
    let mut at = path.to_vec();
    at.push("matchLabels");
    let labels = map_at(data, &at, true)?.expect("made when missing");
    confine_labels(labels, &at.join("."), own)
}

/// Adds the instance's label to a map of labels; another value under its key is refused.
fn confine_labels(
    labels: &mut Map<String, Value>,
    field: &str,
    (key, own): OwnLabel,
) -> Result<(), String> {
    match labels.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::String(value)) if value == own => {}
        Some(other) => {
            return Err(format!(
                "{field}.{key} {other} selects or labels another provider instance's Pods; the host sets it to `{own}`"
            ));
        }
    }
    labels.insert(key.into(), json!(own));
    Ok(())
}

/// The map at `path` inside `data`, every step checked to be a map (a plugin's JSON is never
/// indexed as what it does not claim to be). Missing or null steps are made when `make`, else
/// `None`.
fn map_at<'a>(
    data: &'a mut Value,
    path: &[&str],
    make: bool,
) -> Result<Option<&'a mut Map<String, Value>>, String> {
    if !data.is_object() {
        return Err(format!("the object must be a map, not {}", json_kind(data)));
    }
    let mut here = data;
    for (depth, key) in path.iter().enumerate() {
        let field = path[..=depth].join(".");
        let Value::Object(map) = here else {
            unreachable!("each step is checked to be a map");
        };
        let missing = map.get(*key).is_none_or(Value::is_null);
        if missing && !make {
            return Ok(None);
        }
        let next = map.entry(*key).or_insert(Value::Null);
        if next.is_null() {
            *next = json!({});
        }
        if !next.is_object() {
            return Err(format!("{field} must be a map, not {}", json_kind(next)));
        }
        here = next;
    }
    Ok(here.as_object_mut())
}

#[cfg(test)]
mod tests;
