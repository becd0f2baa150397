//! The reconciler's decisions, without I/O: from a Proxy (and what the provider answered) to the
//! status to write, the events to publish and when to look again. `reconcile.rs` only executes
//! them, so every branch of the lifecycle is table-tested here.

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::conditions::{self, Reason};
use crate::api::{Phase, PlacementRecord, Proxy, ProxyStatus};
use crate::provider::plugins::CallError;
use crate::provider::plugins::types::{Instance, InstanceState, ProviderError};

use crate::api::labels::SKIP_CLEANUP_ANNOTATION;
/// How often a provisioning instance is polled for its address.
pub const POLL_PROVISIONING: Duration = Duration::from_secs(5);
/// How often a Ready instance is looked at again.
pub const RESYNC: Duration = Duration::from_secs(300);
/// A Proxy waiting for its plugin, or naming an unknown provider instance, is reconciled again at
/// every provider-set swap (`Controller::reconcile_all_on`); this is only the safety net.
const WAIT_FOR_PLUGIN: Duration = Duration::from_secs(300);
/// The same safety net for a Proxy naming a provider instance not in the providers config
/// (public for the test that holds docs/architecture.md to it).
pub const WAIT_FOR_PROVIDER: Duration = Duration::from_secs(300);
/// How often a failure caused outside the spec (credentials, grants, the providers config) is
/// tried again, so it recovers once that is fixed; a provider swap retries at once.
pub const RECHECK_OUTSIDE_SPEC: Duration = Duration::from_secs(300);

/// Whether a permanent failure comes from outside the Proxy's spec: a credential, a grant, the
/// provider instance's config. Such a failure is not the spec's to fix, so it is retried.
pub fn caused_outside_spec(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::Unauthorized | Reason::Denied | Reason::InvalidConfig
    )
}

/// Where the Proxy's provider instance stands in the providers config.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderLookup {
    /// Loaded: calls can be made.
    Loaded { name: String },
    /// Configured, but its plugin is not loaded (removed, or a bad upload).
    NotLoaded {
        provider_type: String,
        reason: String,
    },
    /// Not in the providers config; `configured` lists what is.
    Unknown { configured: Vec<String> },
}

/// An event to publish on the Proxy.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyEvent {
    pub type_: EventType,
    pub reason: &'static str,
    pub message: String,
}

impl ProxyEvent {
    fn normal(reason: &'static str, message: String) -> Self {
        ProxyEvent {
            type_: EventType::Normal,
            reason,
            message,
        }
    }

    pub(super) fn warning(reason: &'static str, message: String) -> Self {
        ProxyEvent {
            type_: EventType::Warning,
            reason,
            message,
        }
    }
}

/// What the controller does after this reconcile.
#[derive(Debug, Clone, PartialEq)]
pub enum NextReconcile {
    Requeue(Duration),
    /// Nothing to do until the Proxy changes.
    AwaitChange,
    /// An error the controller retries with backoff (`after`: the provider's own wish).
    Retry {
        message: String,
        after: Option<Duration>,
    },
}

/// The outcome of a decision: the status to write (only when it changed), events, what next.
#[derive(Debug, Clone, PartialEq)]
pub struct Effects {
    pub status: ProxyStatus,
    pub events: Vec<ProxyEvent>,
    pub next: NextReconcile,
}

/// The first step of an apply.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// No provider call: write this and stop.
    Done(Effects),
    /// Create the instance `name` in `zone` (`None`: the provider chooses); `status` carries the
    /// placement record and is written before the call when it differs from the Proxy's, then
    /// built on afterwards.
    Create {
        name: String,
        zone: Option<String>,
        status: ProxyStatus,
    },
    /// Look at the recorded instance.
    Get {
        provider_id: String,
        status: ProxyStatus,
    },
}

/// The first step of reconciling a live Proxy.
pub fn decide(proxy: &Proxy, lookup: &ProviderLookup, instance_name: &str) -> Decision {
    let generation = proxy.metadata.generation;
    let mut status = proxy.status.clone().unwrap_or_default();
    match lookup {
        ProviderLookup::NotLoaded {
            provider_type,
            reason,
        } => {
            let message = format!(
                "the `{provider_type}` plugin of provider instance `{}` is not loaded: {reason}",
                proxy.spec.provider
            );
            let mut events = Vec::new();
            if status.last_error.as_deref() != Some(&message) {
                events.push(ProxyEvent::warning("PluginNotLoaded", message.clone()));
            }
            if status.phase.is_none() {
                status.phase = Some(Phase::Pending);
                conditions::not_provisioned(
                    &mut status.conditions,
                    Reason::PluginNotLoaded,
                    &message,
                    generation,
                );
            }
            status.last_error = Some(message);
            Decision::Done(Effects {
                status,
                events,
                next: NextReconcile::Requeue(WAIT_FOR_PLUGIN),
            })
        }
        ProviderLookup::Unknown { configured } => {
            let mut known = configured.clone();
            known.sort();
            let message = format!(
                "no provider instance `{provider}` in the providers config (configured: {}); add `{provider}` to the providers config, or recreate the Proxy with another spec.provider (it is immutable)",
                known.join(", "),
                provider = proxy.spec.provider,
            );
            let mut events = Vec::new();
            if status.phase != Some(Phase::Pending)
                || status.last_error.as_deref() != Some(&message)
            {
                events.push(ProxyEvent::warning("UnknownProvider", message.clone()));
            }
            status.phase = Some(Phase::Pending);
            status.last_error = Some(message.clone());
            status.observed_generation = generation;
            conditions::not_provisioned(
                &mut status.conditions,
                Reason::UnknownProvider,
                &message,
                generation,
            );
            Decision::Done(Effects {
                status,
                events,
                next: NextReconcile::Requeue(WAIT_FOR_PROVIDER),
            })
        }
        ProviderLookup::Loaded { .. } => {
            let failed_for_this_spec =
                status.phase == Some(Phase::Failed) && status.observed_generation == generation;
            // A failure from outside the spec is tried again (slowly, see `call_failed`).
            let outside_spec = Reason::of(&status.conditions, conditions::Type::Ready)
                .is_some_and(caused_outside_spec);
            if failed_for_this_spec && !outside_spec {
                // Permanent failure: no hot loop until the spec changes (a new generation).
                return Decision::Done(Effects {
                    status,
                    events: Vec::new(),
                    next: NextReconcile::AwaitChange,
                });
            }
            match status.provider_id.clone() {
                None => {
                    if status.phase.is_none() {
                        status.phase = Some(Phase::Pending);
                    }
                    let record = placement(proxy, status.placement.as_ref());
                    let zone = record.zone.clone();
                    status.placement = Some(record);
                    Decision::Create {
                        name: instance_name.to_string(),
                        zone,
                        status,
                    }
                }
                Some(provider_id) => Decision::Get {
                    provider_id,
                    status,
                },
            }
        }
    }
}

/// What a create asks for: the placement an earlier try recorded for this provider, so that a
/// retry asks for the same zone even if the providers config changed in between; otherwise (the
/// first try) the spec's zone. With no zone anywhere the provider chooses, and keeps the create
/// contract by finding an earlier try's instance by name wherever it may have put it.
pub fn placement(proxy: &Proxy, recorded: Option<&PlacementRecord>) -> PlacementRecord {
    let spec_zone = proxy.spec.placement.as_ref().and_then(|p| p.zone.clone());
    match recorded {
        Some(record) if record.provider == proxy.spec.provider => PlacementRecord {
            provider: record.provider.clone(),
            zone: record.zone.clone().or(spec_zone),
        },
        // None, or written for another provider (a status edited by hand: `spec.provider` is
        // immutable): decided afresh.
        _ => PlacementRecord {
            provider: proxy.spec.provider.clone(),
            zone: spec_zone,
        },
    }
}

/// Whether an earlier reconcile already asked the provider to create this Proxy's instance (the
/// placement is recorded, no instance is): its answer may be on the way to the cache.
pub fn asked_before(proxy: &Proxy) -> bool {
    proxy
        .status
        .as_ref()
        .is_some_and(|s| s.placement.is_some() && s.provider_id.is_none())
}

/// The instance was just created: say so, then record it as observed.
pub fn created(
    proxy: &Proxy,
    status: ProxyStatus,
    provider: &str,
    instance: &Instance,
    probing: bool,
) -> Effects {
    let mut effects = observed(proxy, status, instance, probing);
    effects.events.insert(
        0,
        ProxyEvent::normal(
            "Created",
            format!(
                "instance {} created by provider {provider}",
                instance.provider_id
            ),
        ),
    );
    effects
}

/// What the provider says of the instance, recorded in the status: Ready (judged by the health
/// engine's `Healthy`) once it runs with an address, Provisioning until then.
pub fn observed(
    proxy: &Proxy,
    mut status: ProxyStatus,
    instance: &Instance,
    probing: bool,
) -> Effects {
    let generation = proxy.metadata.generation;
    status.provider_id = Some(instance.provider_id.clone());
    status.zone = instance.zone.clone().or(status.zone);
    status.observed_generation = generation;
    status.last_error = None;
    let mut events = Vec::new();
    let running = instance.state == InstanceState::Running;
    let requeue = match (&instance.address, running) {
        (Some(address), true) => {
            status.address = Some(address.clone());
            status.port = Some(instance.port);
            if status.phase != Some(Phase::Ready) && status.phase != Some(Phase::Unhealthy) {
                events.push(ProxyEvent::normal(
                    "Provisioned",
                    format!("running at {address}:{}", instance.port),
                ));
            }
            let message = format!(
                "instance {} running at {address}:{}",
                instance.provider_id, instance.port
            );
            conditions::set(
                &mut status.conditions,
                conditions::Type::Provisioned,
                true,
                Reason::InstanceRunning,
                &message,
                generation,
            );
            conditions::readiness(&mut status, generation, probing);
            RESYNC
        }
        _ => {
            status.phase = Some(Phase::Provisioning);
            // The provider's own words on why (a VM booting, its guest agent silent for
            // minutes, what to check) are its last answer: kept, so `kubectl describe` and
            // `kubectl px why` can say them.
            let message = format!(
                "instance {} is {:?}{}{}",
                instance.provider_id,
                instance.state,
                if instance.address.is_none() {
                    ", waiting for an address"
                } else {
                    ""
                },
                instance
                    .message
                    .as_deref()
                    .filter(|m| !m.trim().is_empty())
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            );
            conditions::not_provisioned(
                &mut status.conditions,
                Reason::Provisioning,
                &message,
                generation,
            );
            POLL_PROVISIONING
        }
    };
    Effects {
        status,
        events,
        next: NextReconcile::Requeue(requeue),
    }
}

/// How a failed provider call shows in the status, and whether to retry.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    Retry {
        reason: Reason,
        message: String,
        after: Option<Duration>,
    },
    Permanent {
        reason: Reason,
        message: String,
    },
}

/// Which provider answers are worth retrying.
pub fn classify(error: &CallError) -> Failure {
    let permanent = |reason, message: &String| Failure::Permanent {
        reason,
        message: message.clone(),
    };
    match error {
        CallError::Provider { error, .. } => match error {
            ProviderError::Transient {
                message,
                retry_after,
            } => Failure::Retry {
                reason: Reason::Retrying,
                message: message.clone(),
                after: *retry_after,
            },
            ProviderError::Quota(m) => Failure::Retry {
                reason: Reason::Quota,
                message: format!("quota: {m}"),
                after: Some(Duration::from_secs(60)),
            },
            ProviderError::NotFound(m) => permanent(Reason::NotFound, m),
            ProviderError::Permanent(m) => permanent(Reason::ProviderError, m),
            ProviderError::InvalidConfig(m) => permanent(Reason::InvalidConfig, m),
            ProviderError::Unauthorized(m) => permanent(Reason::Unauthorized, m),
            ProviderError::Denied(m) => permanent(Reason::Denied, m),
        },
        // Over its own memory limit, the same call runs out again (a list of 190 MiB does not
        // shrink): failed, not retried as transient; the message names the flag that raises it.
        // A panic of the host's is a bug that the same input reaches again.
        CallError::OutOfMemory { .. } | CallError::HostPanic { .. } => {
            permanent(Reason::ProviderError, &error.to_string())
        }
        // The sandbox stopped the plugin (CPU, the shared memory total, time): retry, a later
        // call may behave.
        other => Failure::Retry {
            reason: Reason::Retrying,
            message: other.to_string(),
            after: None,
        },
    }
}

/// A `create` or `get` (`action`) failed: retried with backoff, or `Failed` until the spec changes.
pub fn call_failed(
    proxy: &Proxy,
    mut status: ProxyStatus,
    provider: &str,
    action: &str,
    error: &CallError,
) -> Effects {
    let generation = proxy.metadata.generation;
    match classify(error) {
        Failure::Retry {
            reason,
            message,
            after,
        } => {
            let last_error = format!("{action}: {message}");
            // One event per new answer, not one per retry of the same answer.
            let new_answer = status.last_error.as_deref() != Some(last_error.as_str());
            status.last_error = Some(last_error);
            let said = format!("{action} at provider {provider}: {message}; retrying");
            if action == "Create" {
                // Not made yet: the conditions say why (a quota, an outage), not only lastError.
                conditions::not_provisioned(&mut status.conditions, reason, &said, generation);
            }
            let events = if new_answer {
                vec![ProxyEvent::warning(reason.as_str(), said)]
            } else {
                Vec::new()
            };
            Effects {
                status,
                events,
                next: NextReconcile::Retry {
                    message: format!("{provider} {action}: {message}"),
                    after,
                },
            }
        }
        Failure::Permanent {
            reason,
            message: answer,
        } => {
            let message = format!("{action} failed at provider {provider}: {answer}");
            let new_answer = status.last_error.as_deref() != Some(message.as_str());
            status.phase = Some(Phase::Failed);
            status.last_error = Some(message.clone());
            status.observed_generation = generation;
            conditions::not_provisioned(&mut status.conditions, reason, &message, generation);
            let next = if caused_outside_spec(reason) {
                // Fixed outside the spec (a Secret, a grant, the providers config): try again.
                NextReconcile::Retry {
                    message: format!("{provider} {action}: {answer}"),
                    after: Some(RECHECK_OUTSIDE_SPEC),
                }
            } else {
                NextReconcile::AwaitChange
            };
            let events = if new_answer {
                vec![ProxyEvent::warning(reason.as_str(), message)]
            } else {
                Vec::new()
            };
            Effects {
                status,
                events,
                next,
            }
        }
    }
}

/// The recorded instance is gone at the provider. Re-created only when the spec asks for it: a
/// vanished VM may have been removed on purpose, and a new one costs money.
pub fn lost(
    proxy: &Proxy,
    mut status: ProxyStatus,
    provider: &str,
    id: &str,
    detail: &str,
) -> Effects {
    let generation = proxy.metadata.generation;
    let message = format!("instance {id} no longer exists at provider {provider}: {detail}");
    status.address = None;
    conditions::not_provisioned(
        &mut status.conditions,
        Reason::InstanceLost,
        &message,
        generation,
    );
    if proxy.spec.recreate_on_loss {
        status.provider_id = None;
        // A new instance is a new decision: the old one's zone may have left the config.
        status.placement = None;
        status.phase = Some(Phase::Pending);
        return Effects {
            status,
            events: vec![ProxyEvent::warning(
                "InstanceLost",
                format!("{message}; creating a new one (recreateOnLoss)"),
            )],
            next: NextReconcile::Requeue(Duration::from_millis(100)),
        };
    }
    status.phase = Some(Phase::Failed);
    status.last_error = Some(message.clone());
    status.observed_generation = generation;
    Effects {
        status,
        events: vec![ProxyEvent::warning(
            "InstanceLost",
            format!("{message}; set spec.recreateOnLoss to make a new one"),
        )],
        next: NextReconcile::AwaitChange,
    }
}

/// The first step of cleaning up a deleted Proxy.
#[derive(Debug, Clone, PartialEq)]
pub enum CleanupStep {
    /// Leave the instance (if any) and let the Proxy go, saying why.
    Abandon(ProxyEvent),
    /// `skip-cleanup`: leave the instance running on purpose, recorded so the GC leaves it too.
    LeaveRunning(ProxyEvent),
    /// The instance may well exist: wait for the plugin rather than abandon it.
    WaitForPlugin { message: String },
    /// Delete the recorded instance, or (none recorded: a create may have happened just before a
    /// restart) every instance carrying this Proxy's UID. `deleting`: the status to write first.
    Delete {
        recorded: Option<String>,
        deleting: Option<Box<ProxyStatus>>,
    },
}

/// Whether to delete at the provider, and what to say.
pub fn decide_cleanup(proxy: &Proxy, lookup: &ProviderLookup) -> CleanupStep {
    let recorded = proxy.status.as_ref().and_then(|s| s.provider_id.clone());
    let recorded_text = recorded.as_deref().unwrap_or("(none recorded)").to_string();
    let skip = proxy
        .annotations()
        .get(SKIP_CLEANUP_ANNOTATION)
        .is_some_and(|v| v == "true");
    if skip {
        let message = format!(
            "{SKIP_CLEANUP_ANNOTATION} is set: instance {recorded_text} of {}/{} left running",
            proxy.namespace().unwrap_or_default(),
            proxy.name_any()
        );
        return CleanupStep::LeaveRunning(ProxyEvent::normal("Abandoned", message));
    }
    match lookup {
        ProviderLookup::NotLoaded {
            provider_type,
            reason,
        } => CleanupStep::WaitForPlugin {
            message: format!("cannot delete: the `{provider_type}` plugin is not loaded: {reason}"),
        },
        ProviderLookup::Unknown { .. } => CleanupStep::Abandon(ProxyEvent::warning(
            "Abandoned",
            format!(
                "provider instance `{}` is not in the providers config: instance {recorded_text} abandoned",
                proxy.spec.provider
            ),
        )),
        ProviderLookup::Loaded { .. } => {
            let status = proxy.status.clone().unwrap_or_default();
            let deleting = (status.phase != Some(Phase::Deleting)).then(|| {
                Box::new(ProxyStatus {
                    phase: Some(Phase::Deleting),
                    ..status
                })
            });
            CleanupStep::Delete { recorded, deleting }
        }
    }
}

/// Whether the recorded instance may be deleted for the Proxy with `uid`: not when the provider
/// lists another Proxy as its owner (a `providerID` edited to point at somebody else's instance).
/// `None`: go ahead; `Some(note)`: the refusal to publish, and nothing is deleted.
pub fn refuse_foreign_delete(proxy: &Proxy, instance: &Instance) -> Option<ProxyEvent> {
    let uid = proxy.uid().unwrap_or_default();
    let owner = instance.owner.as_ref()?;
    (owner.uid != uid).then(|| {
        ProxyEvent::warning(
            "DeleteRefused",
            format!(
                "instance {} belongs to Proxy {}/{} (uid {}), not to this one: not deleted; status.providerID was changed by hand?",
                instance.provider_id, owner.namespace, owner.name, owner.uid
            ),
        )
    })
}

/// The instances of a provider's `list` that belong to the Proxy with `uid`.
pub fn owned_by(instances: Vec<Instance>, uid: &str) -> Vec<String> {
    instances
        .into_iter()
        .filter(|i| i.owner.as_ref().is_some_and(|o| o.uid == uid))
        .map(|i| i.provider_id)
        .collect()
}

/// A delete the provider answered `not-found`: nothing of this Proxy's is at that id (gone
/// already, or not the operator's to delete, e.g. a `providerID` edited to point at somebody's
/// own VM), so the Proxy may go; the event says what the provider found.
pub fn delete_found_nothing(id: &str, provider: &str, detail: &str) -> ProxyEvent {
    ProxyEvent {
        type_: EventType::Normal,
        reason: "NothingDeleted",
        message: format!("provider {provider} deleted nothing at {id}: {detail}"),
    }
}

/// A failed delete: the event, and the retry (a permanent answer is retried slowly, since the
/// Proxy cannot go until its instance is gone).
pub fn delete_failed(id: &str, error: &CallError) -> (ProxyEvent, NextReconcile) {
    let (message, after) = match classify(error) {
        Failure::Retry { message, after, .. } => (message, after),
        Failure::Permanent { message, .. } => (message, Some(Duration::from_secs(60))),
    };
    (
        ProxyEvent::warning("DeleteFailed", format!("deleting instance {id}: {message}")),
        NextReconcile::Retry {
            message: format!("delete {id}: {message}"),
            after,
        },
    )
}

#[cfg(test)]
mod cleanup_tests;
#[cfg(test)]
mod provisioning_tests;
#[cfg(test)]
mod tests;
