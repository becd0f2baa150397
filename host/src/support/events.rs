//! Kubernetes events, as the reconcilers and the plugin registry publish them: one reporter
//! identity, notes cut to the API's limit, repeats of an event counted as its series, a failed
//! publish logged and never fatal.
//!
//! The recorder is this crate's rather than kube-runtime's: kube's keeps every event it
//! published for 6 minutes, whole, in one map it scans at every publish (~55 MB at 10 000
//! Proxies, docs/performance.md), and its key compares the object's resourceVersion, so a Proxy
//! whose status changed between two identical events starts a new Event instead of a series.
//! This one remembers about 200 bytes per series, for the same 6 minutes, at most
//! [`MAX_SERIES`] of them (the oldest forgotten first: its next repeat starts a new Event).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
pub use kube::runtime::events::EventType;
use sha2::{Digest, Sha256};

/// How long after an event a repeat of it counts in its series (client-go's and kube-runtime's
/// window).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Series remembered at most (about 200 bytes each with their map and queue entries).
pub const MAX_SERIES: usize = 10_000;
/// The name of the reporting controller.
const CONTROLLER: &str = "proxy-operator";

/// Publishes events of this operator replica; clones share one series memory.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    instance: String,
    series: Arc<Mutex<SeriesMemory>>,
}

/// The recorder of this operator replica.
pub fn recorder(client: Client) -> Recorder {
    Recorder::new(client, MAX_SERIES)
}

impl Recorder {
    /// A recorder remembering at most `max_series` series.
    pub fn new(client: Client, max_series: usize) -> Recorder {
        Recorder {
            client,
            instance: std::env::var("POD_NAME").unwrap_or_else(|_| CONTROLLER.to_string()),
            series: Arc::new(Mutex::new(SeriesMemory::new(max_series))),
        }
    }

    /// Series remembered now.
    pub fn series_remembered(&self) -> usize {
        self.series.lock().expect("not poisoned").len()
    }

    async fn publish(&self, what: &What<'_>, reference: &ObjectReference) -> kube::Result<()> {
        let key = SeriesKey::of(reference, what);
        let namespace = reference.namespace.as_deref().unwrap_or("default");
        let events: Api<KubeEvent> = Api::namespaced(self.client.clone(), namespace);
        let repeat = self
            .series
            .lock()
            .expect("not poisoned")
            .repeat_of(key, Instant::now());
        if let Some(Repeat { name, count }) = repeat {
            let patch = serde_json::json!({
                "series": {"count": count, "lastObservedTime": MicroTime(Timestamp::now())},
            });
            match events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.remember(key, name, count);
                    return Ok(());
                }
                // Gone (the API server's event TTL): the repeat starts a new Event.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.new_event(what, reference);
        let name = event.metadata.name.clone().unwrap_or_default();
        events.create(&PostParams::default(), &event).await?;
        self.remember(key, name, 1);
        Ok(())
    }

    fn remember(&self, key: SeriesKey, name: String, count: i32) {
        self.series
            .lock()
            .expect("not poisoned")
            .record(key, name, count, Instant::now());
    }

    fn new_event(&self, what: &What<'_>, reference: &ObjectReference) -> KubeEvent {
        let now = Timestamp::now();
        KubeEvent {
            action: Some(what.action.to_string()),
            reason: Some(what.reason.to_string()),
            note: Some(what.note.chars().take(1000).collect()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            metadata: ObjectMeta {
                namespace: reference.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or(CONTROLLER),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(CONTROLLER.to_string()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match what.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            ..Default::default()
        }
    }
}

/// One event to publish.
struct What<'a> {
    type_: EventType,
    reason: &'a str,
    action: &'a str,
    note: &'a str,
}

/// Publishes one event on `reference`; a repeat within [`SERIES_WINDOW`] (same object, type,
/// reason and action) counts in the first one's series instead.
pub async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let what = What {
        type_,
        reason,
        action,
        note: &note,
    };
    if let Err(e) = recorder.publish(&what, reference).await {
        tracing::warn!(%reason, error = %e, "cannot publish event");
    }
}

/// A series' identity: a digest of the object (its UID, else kind/namespace/name), the type,
/// reason and action — 16 bytes instead of the strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SeriesKey([u8; 16]);

impl SeriesKey {
    fn of(reference: &ObjectReference, what: &What<'_>) -> SeriesKey {
        let mut hash = Sha256::new();
        let object = match &reference.uid {
            Some(uid) => uid.clone(),
            None => format!(
                "{}/{}/{}",
                reference.kind.as_deref().unwrap_or_default(),
                reference.namespace.as_deref().unwrap_or_default(),
                reference.name.as_deref().unwrap_or_default()
            ),
        };
        let type_ = matches!(what.type_, EventType::Warning).to_string();
        for part in [&object, &type_, what.reason, what.action] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
        let mut key = [0; 16];
        key.copy_from_slice(&hash.finalize()[..16]);
        SeriesKey(key)
    }
}

/// A repeat of a remembered event: its Event's name and the count to write.
#[derive(Debug, PartialEq)]
struct Repeat {
    name: String,
    count: i32,
}

struct Series {
    name: String,
    count: i32,
    /// Which record of `by_age` is this series' latest.
    record: u64,
}

/// The series published in the last [`SERIES_WINDOW`], at most `max` of them. Pure: the clock is
/// an argument.
struct SeriesMemory {
    series: HashMap<SeriesKey, Series>,
    /// (when, record number, key) of every record, oldest first; an entry whose series was
    /// recorded again since is dropped when it comes up.
    by_age: VecDeque<(Instant, u64, SeriesKey)>,
    records: u64,
    max: usize,
}

impl SeriesMemory {
    fn new(max: usize) -> SeriesMemory {
        SeriesMemory {
            series: HashMap::new(),
            by_age: VecDeque::new(),
            records: 0,
            max,
        }
    }

    fn len(&self) -> usize {
        self.series.len()
    }

    /// The repeat `key` would be at `now`, if its series is remembered.
    fn repeat_of(&mut self, key: SeriesKey, now: Instant) -> Option<Repeat> {
        self.forget_old(now);
        self.series.get(&key).map(|s| Repeat {
            name: s.name.clone(),
            count: s.count.saturating_add(1),
        })
    }

    /// `key`'s Event `name` has `count` events, the last at `now`.
    fn record(&mut self, key: SeriesKey, name: String, count: i32, now: Instant) {
        self.records += 1;
        let record = self.records;
        self.series.insert(
            key,
            Series {
                name,
                count,
                record,
            },
        );
        self.by_age.push_back((now, record, key));
        self.forget_old(now);
    }

    /// Forgets the series last seen before the window, then the oldest past `max`; drops queue
    /// entries of series recorded again since (the queue stays under twice `max` + the window's
    /// records).
    fn forget_old(&mut self, now: Instant) {
        while let Some(&(at, record, key)) = self.by_age.front() {
            let expired = now.saturating_duration_since(at) >= SERIES_WINDOW;
            let latest = self.series.get(&key).is_some_and(|s| s.record == record);
            let too_many = self.series.len() > self.max || self.by_age.len() > 2 * self.max;
            if !(expired || too_many || !latest) {
                break;
            }
            self.by_age.pop_front();
            if latest {
                self.series.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SeriesKey {
        SeriesKey([n; 16])
    }

    fn what<'a>(reason: &'a str, type_: EventType) -> What<'a> {
        What {
            type_,
            reason,
            action: "Reconcile",
            note: "n",
        }
    }

    fn reference(uid: &str, resource_version: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Proxy".into()),
            namespace: Some("crawl".into()),
            name: Some("p1".into()),
            uid: Some(uid.into()),
            resource_version: Some(resource_version.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_series_is_the_object_type_reason_and_action_whatever_its_version() {
        let normal =
            |r| SeriesKey::of(&reference("u1", r), &what("Provisioned", EventType::Normal));
        assert_eq!(normal("1"), normal("2"), "a status write between repeats");
        let other = [
            SeriesKey::of(
                &reference("u2", "1"),
                &what("Provisioned", EventType::Normal),
            ),
            SeriesKey::of(
                &reference("u1", "1"),
                &what("Provisioned", EventType::Warning),
            ),
            SeriesKey::of(&reference("u1", "1"), &what("Deleted", EventType::Normal)),
        ];
        for key in other {
            assert_ne!(key, normal("1"));
        }
    }

    #[test]
    fn a_repeat_within_the_window_counts_in_the_series() {
        let t0 = Instant::now();
        let mut memory = SeriesMemory::new(10);
        assert_eq!(memory.repeat_of(key(1), t0), None);
        memory.record(key(1), "p1.a".into(), 1, t0);
        let second = t0 + Duration::from_secs(60);
        assert_eq!(
            memory.repeat_of(key(1), second),
            Some(Repeat {
                name: "p1.a".into(),
                count: 2
            })
        );
        memory.record(key(1), "p1.a".into(), 2, second);
        // The window runs from the last repeat, not the first event.
        let later = second + SERIES_WINDOW - Duration::from_secs(1);
        assert_eq!(memory.repeat_of(key(1), later).map(|r| r.count), Some(3));
        assert_eq!(memory.repeat_of(key(1), second + SERIES_WINDOW), None);
        assert_eq!(memory.len(), 0);
        assert!(memory.by_age.is_empty());
    }

    #[test]
    fn past_the_bound_the_oldest_series_is_forgotten_first() {
        let t0 = Instant::now();
        let mut memory = SeriesMemory::new(3);
        for n in 0..3 {
            memory.record(
                key(n),
                format!("e{n}"),
                1,
                t0 + Duration::from_secs(n.into()),
            );
        }
        // Series 0 repeats: now the youngest.
        let t3 = t0 + Duration::from_secs(3);
        memory.record(key(0), "e0".into(), 2, t3);
        memory.record(key(9), "e9".into(), 1, t3);
        assert_eq!(memory.len(), 3);
        assert_eq!(memory.repeat_of(key(1), t3), None, "the oldest went");
        assert!(memory.repeat_of(key(0), t3).is_some());
        assert!(memory.repeat_of(key(2), t3).is_some());
    }

    /// Hostile rates: one series repeated without end, or a new series per event, keep the
    /// memory within its bound.
    #[test]
    fn the_memory_stays_bounded_under_any_rate() {
        let t0 = Instant::now();
        let mut memory = SeriesMemory::new(100);
        for i in 0..100_000u32 {
            memory.record(key(7), "same".into(), i as i32, t0);
        }
        assert_eq!(memory.len(), 1);
        assert!(memory.by_age.len() <= 201, "{}", memory.by_age.len());
        for i in 0..100_000u32 {
            let mut k = [0; 16];
            k[..4].copy_from_slice(&i.to_le_bytes());
            memory.record(SeriesKey(k), "new".into(), 1, t0);
        }
        assert_eq!(memory.len(), 100);
        assert!(memory.by_age.len() <= 201, "{}", memory.by_age.len());
    }
}
