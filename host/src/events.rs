//! Kubernetes events, as the reconciler and the plugin registry publish them: one reporter
//! identity, notes cut to the API's limit, a failed publish logged and never fatal.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The recorder of this operator replica.
pub fn recorder(client: Client) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: "proxy-operator".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    )
}

/// Publishes one event on `reference`.
pub async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, reference).await {
        tracing::warn!(%reason, error = %e, "cannot publish event");
    }
}
