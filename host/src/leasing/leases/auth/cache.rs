//! A small map whose entries expire, holding at most `capacity` of them: when full, the oldest
//! entries go first, so a flood of distinct tokens costs a bounded amount of memory (and only
//! pushes older decisions out, which are then reviewed again).

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Entry<V> {
    value: V,
    expires: Instant,
    /// Which insertion made it, to tell its place in `order` from a stale one.
    seq: u64,
}

struct Inner<K, V> {
    map: HashMap<K, Entry<V>, foldhash::fast::RandomState>,
    /// Keys by insertion, oldest first; a key inserted again leaves a stale place behind.
    order: VecDeque<(u64, K)>,
    next: u64,
}

pub(super) struct BoundedCache<K, V> {
    inner: Mutex<Inner<K, V>>,
    capacity: usize,
}

impl<K: Clone + Eq + Hash, V: Clone> BoundedCache<K, V> {
    pub(super) fn new(capacity: usize) -> Self {
        BoundedCache {
            inner: Mutex::new(Inner {
                map: HashMap::default(),
                order: VecDeque::new(),
                next: 0,
            }),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K, V>> {
        // Every step leaves the maps consistent, so a poisoned lock is safe to keep using.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value of `key` unless it has expired.
    pub(super) fn get(&self, key: &K, now: Instant) -> Option<V> {
        let inner = self.lock();
        inner
            .map
            .get(key)
            .filter(|e| e.expires > now)
            .map(|e| e.value.clone())
    }

    /// Keeps `value` for `ttl` (a zero `ttl` keeps nothing).
    pub(super) fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        let mut inner = self.lock();
        let seq = inner.next;
        inner.next += 1;
        inner.order.push_back((seq, key.clone()));
        inner.map.insert(
            key,
            Entry {
                value,
                expires: now + ttl,
                seq,
            },
        );
        // Drop expired entries at the front, then the oldest while over capacity; stale places
        // are dropped too, so `order` stays within twice the capacity.
        while let Some((seq, key)) = inner.order.front() {
            let live = inner.map.get(key).is_some_and(|e| e.seq == *seq);
            let expired = live && inner.map[key].expires <= now;
            let over = inner.map.len() > self.capacity || inner.order.len() > 2 * self.capacity;
            if live && !expired && !over {
                break;
            }
            let (_, key) = inner.order.pop_front().expect("checked above");
            if live {
                inner.map.remove(&key);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.lock().map.len()
    }

    #[cfg(test)]
    pub(super) fn order_len(&self) -> usize {
        self.lock().order.len()
    }
}
