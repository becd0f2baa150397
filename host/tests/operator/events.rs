//! The operator's event recorder against the real API server: repeats of an event count in one
//! Event's `series` (whatever the object's resourceVersion in between), another reason is
//! another Event, a forgotten or deleted series starts a new Event.

use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use proxy_operator::support::events::{EventType, Recorder, publish};

use super::control_plane;

/// The events regarding `name`, as `kubectl describe` would list them: (reason, series count,
/// note).
async fn events_of(api: &Api<Event>, name: &str) -> Vec<(String, Option<i32>, String)> {
    let mut found: Vec<_> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.reason.unwrap_or_default(),
                e.series.map(|s| s.count),
                e.note.unwrap_or_default(),
            )
        })
        .collect();
    found.sort();
    found
}

async fn config_map(api: &Api<ConfigMap>, name: &str) -> ObjectReference {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    api.create(&PostParams::default(), &cm)
        .await
        .unwrap()
        .object_ref(&())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_count_in_one_event_and_a_forgotten_series_starts_anew() {
    let cp = control_plane().await;
    let ns = cp.namespace("px-events").await.unwrap();
    let maps: Api<ConfigMap> = ns.api();
    let events: Api<Event> = ns.api();
    let recorder = Recorder::new(ns.client(), 2);
    let warn = |recorder: &Recorder, reference: &ObjectReference, reason: &str, note: &str| {
        let (recorder, reference, reason, note) = (
            recorder.clone(),
            reference.clone(),
            reason.to_string(),
            note.to_string(),
        );
        async move {
            publish(
                &recorder,
                &reference,
                EventType::Warning,
                &reason,
                "Reconcile",
                note,
            )
            .await
        }
    };

    let a = config_map(&maps, "a").await;
    warn(&recorder, &a, "ProviderError", "first").await;
    // The object changed between the repeats: still one series.
    let mut newer = a.clone();
    newer.resource_version = Some("999999".into());
    warn(&recorder, &newer, "ProviderError", "second").await;
    warn(&recorder, &a, "ProviderError", "third").await;
    warn(&recorder, &a, "Quota", "full").await;
    assert_eq!(
        events_of(&events, "a").await,
        [
            ("ProviderError".into(), Some(3), "first".into()),
            ("Quota".into(), None, "full".into()),
        ]
    );
    assert_eq!(recorder.series_remembered(), 2);

    // Two more series push `a`'s out of a memory of two: its next repeat is a new Event.
    let b = config_map(&maps, "b").await;
    warn(&recorder, &b, "ProviderError", "b").await;
    warn(&recorder, &b, "Quota", "b").await;
    assert_eq!(recorder.series_remembered(), 2);
    warn(&recorder, &a, "ProviderError", "after").await;
    let a_events = events_of(&events, "a").await;
    assert_eq!(
        a_events
            .iter()
            .filter(|(reason, ..)| reason == "ProviderError")
            .count(),
        2,
        "{a_events:?}"
    );

    // An Event deleted by the API server's TTL (here by hand): the repeat creates another.
    let b_events: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("b")
                && e.reason.as_deref() == Some("Quota")
        })
        .collect();
    assert_eq!(b_events.len(), 1);
    events
        .delete(
            b_events[0].metadata.name.as_deref().unwrap(),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    warn(&recorder, &b, "Quota", "again").await;
    assert_eq!(
        events_of(&events, "b").await,
        [
            ("ProviderError".into(), None, "b".into()),
            ("Quota".into(), None, "again".into()),
        ]
    );
}
