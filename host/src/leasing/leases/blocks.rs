//! Blocks per target host, for whoever pays for the fleet: which sites block its proxies, over
//! the last hour (the status page) and as a Prometheus counter. Crawlers name any host they
//! like, so both are bounded: the last hour is kept for at most [`TRACKED_TARGETS`] hosts, and
//! only the [`TARGET_LABELS`] hosts blocking most in the last hour get a series of their own
//! (`proxy_operator_target_blocks_total{target}`); every other block counts under `other`, and
//! reports naming no host under `none`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus::{IntCounterVec, Opts, Registry};

/// Hosts with a series of their own in `proxy_operator_target_blocks_total`.
pub const TARGET_LABELS: usize = 20;
/// Hosts whose blocks of the last hour are kept (about 0.5 KiB each).
pub const TRACKED_TARGETS: usize = 1000;
/// The `target` label of the blocks of every other host.
pub const OTHER_TARGET: &str = "other";
/// The `target` label of a `blocked` report that named no target.
pub const NO_TARGET: &str = "none";

const MINUTE_MS: u64 = 60_000;
const MINUTES: usize = 60;

/// One host's blocks per minute of the last hour: a ring of (minute, count).
#[derive(Clone)]
struct Window([(u32, u32); MINUTES]);

impl Default for Window {
    fn default() -> Self {
        Window([(0, 0); MINUTES])
    }
}

impl Window {
    fn add(&mut self, minute: u64) {
        let slot = &mut self.0[minute as usize % MINUTES];
        if slot.0 as u64 != minute {
            *slot = (minute as u32, 0);
        }
        slot.1 = slot.1.saturating_add(1);
    }

    /// Blocks in the hour ending with `minute`.
    fn last_hour(&self, minute: u64) -> u64 {
        self.0
            .iter()
            .filter(|(m, _)| {
                minute.saturating_sub(*m as u64) < MINUTES as u64 && *m as u64 <= minute
            })
            .map(|(_, n)| *n as u64)
            .sum()
    }
}

/// Where one block is counted.
#[derive(Debug, PartialEq, Eq)]
pub struct Counted {
    /// The `target` label it counts under (the host, or [`OTHER_TARGET`]).
    pub label: String,
    /// A host that lost its own series to this one (its series is removed).
    pub evicted: Option<String>,
}

/// The bounded book of blocks per host (no I/O: table-tested).
pub struct TargetBlocks {
    windows: HashMap<String, Window>,
    labelled: HashSet<String>,
    /// Blocks of hosts not tracked (the book was full).
    untracked: Window,
    /// Blocks naming no host (always a series of its own).
    untargeted: Window,
    max_labels: usize,
    max_tracked: usize,
    /// The last minute hosts with no block in the last hour were forgotten.
    swept_minute: u64,
}

impl TargetBlocks {
    pub fn new(max_labels: usize, max_tracked: usize) -> Self {
        TargetBlocks {
            windows: HashMap::new(),
            labelled: HashSet::new(),
            untracked: Window::default(),
            untargeted: Window::default(),
            max_labels,
            max_tracked: max_tracked.max(max_labels),
            swept_minute: 0,
        }
    }

    /// Counts one block of `target` at `now_ms`: where it counts, and which host lost its series.
    pub fn record(&mut self, target: &str, now_ms: u64) -> Counted {
        let minute = now_ms / MINUTE_MS;
        if target == NO_TARGET {
            self.untargeted.add(minute);
            return own(NO_TARGET, None);
        }
        if target == OTHER_TARGET || !self.track(target, minute) {
            self.untracked.add(minute);
            return Counted {
                label: OTHER_TARGET.into(),
                evicted: None,
            };
        }
        if self.labelled.contains(target) {
            return own(target, None);
        }
        if self.labelled.len() < self.max_labels {
            self.labelled.insert(target.to_string());
            return own(target, None);
        }
        // Full: this host takes the series of the labelled host that blocked least in the last
        // hour, once it has blocked more than that one.
        let count = self.windows[target].last_hour(minute);
        let weakest = self
            .labelled
            .iter()
            .map(|host| {
                (
                    self.windows.get(host).map_or(0, |w| w.last_hour(minute)),
                    host,
                )
            })
            .min();
        match weakest {
            Some((least, host)) if count > least => {
                let evicted = host.clone();
                self.labelled.remove(&evicted);
                self.labelled.insert(target.to_string());
                own(target, Some(evicted))
            }
            _ => Counted {
                label: OTHER_TARGET.into(),
                evicted: None,
            },
        }
    }

    /// Adds the block to `target`'s window; false when the book is full and keeps it out.
    fn track(&mut self, target: &str, minute: u64) -> bool {
        if let Some(window) = self.windows.get_mut(target) {
            window.add(minute);
            return true;
        }
        if self.windows.len() >= self.max_tracked && self.swept_minute != minute {
            // At most once a minute: forget unlabelled hosts with no block in the last hour.
            self.swept_minute = minute;
            let labelled = &self.labelled;
            self.windows
                .retain(|host, w| labelled.contains(host) || w.last_hour(minute) > 0);
        }
        if self.windows.len() >= self.max_tracked {
            return false;
        }
        let mut window = Window::default();
        window.add(minute);
        self.windows.insert(target.to_string(), window);
        true
    }

    /// Blocks per host in the last hour, most first, at most `top` hosts, then the rest as one
    /// [`OTHER_TARGET`] row (when there is any).
    pub fn last_hour(&self, now_ms: u64, top: usize) -> Vec<(String, u64)> {
        let minute = now_ms / MINUTE_MS;
        let mut rows: Vec<(String, u64)> = self
            .windows
            .iter()
            .map(|(host, w)| (host.clone(), w.last_hour(minute)))
            .chain([(NO_TARGET.to_string(), self.untargeted.last_hour(minute))])
            .filter(|(_, n)| *n > 0)
            .collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let rest: u64 =
            rows.iter().skip(top).map(|(_, n)| n).sum::<u64>() + self.untracked.last_hour(minute);
        rows.truncate(top);
        if rest > 0 {
            rows.push((OTHER_TARGET.into(), rest));
        }
        rows
    }

    /// Hosts whose last hour is kept.
    pub fn tracked(&self) -> usize {
        self.windows.len()
    }
}

fn own(target: &str, evicted: Option<String>) -> Counted {
    Counted {
        label: target.to_string(),
        evicted,
    }
}

/// The counter and the book behind it, shared by the lease table and the status page.
#[derive(Clone)]
pub struct BlockMetrics {
    pub(crate) total: IntCounterVec,
    book: Arc<Mutex<TargetBlocks>>,
}

impl BlockMetrics {
    pub fn unregistered() -> prometheus::Result<Self> {
        Ok(BlockMetrics {
            total: IntCounterVec::new(
                Opts::new(
                    "proxy_operator_target_blocks_total",
                    "`blocked` reports (crawlers' and the gateway's) by target host: the 20 hosts blocking most in the last hour, `other` for the rest, `none` for a report naming no host.",
                ),
                &["target"],
            )?,
            book: Arc::new(Mutex::new(TargetBlocks::new(
                TARGET_LABELS,
                TRACKED_TARGETS,
            ))),
        })
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.total.clone()))
    }

    /// Counts one block of `target` (normalized; `None`: the report named none).
    pub fn record(&self, target: Option<&str>, now_ms: u64) {
        let counted = self.lock().record(target.unwrap_or(NO_TARGET), now_ms);
        if let Some(evicted) = &counted.evicted {
            let _ = self.total.remove_label_values(&[evicted]);
        }
        self.total.with_label_values(&[&counted.label]).inc();
    }

    /// [`TargetBlocks::last_hour`] now.
    pub fn last_hour(&self, now_ms: u64, top: usize) -> Vec<(String, u64)> {
        self.lock().last_hour(now_ms, top)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TargetBlocks> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_000 * MINUTE_MS;

    #[test]
    fn the_hosts_blocking_most_get_their_own_series_and_the_rest_count_as_other() {
        // (blocks in order, labels they count under, host evicted by the last one)
        let mut book = TargetBlocks::new(2, 10);
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("a.example", "a.example", None),
            ("b.example", "b.example", None),
            // Labels full; c has 1 block, not more than the least labelled host's 1.
            ("c.example", "other", None),
            // Now 2 > 1: c takes the series of a (1 block; the least, first by name).
            ("c.example", "c.example", Some("a.example")),
            // a has 2 against b's 1: it takes b's series.
            ("a.example", "a.example", Some("b.example")),
        ];
        for (i, (host, label, evicted)) in cases.iter().enumerate() {
            let counted = book.record(host, T0);
            assert_eq!(counted.label, *label, "case {i}: {host}");
            assert_eq!(counted.evicted.as_deref(), *evicted, "case {i}: {host}");
        }
        // A host literally named like the overflow row counts in it.
        assert_eq!(book.record(OTHER_TARGET, T0).label, OTHER_TARGET);
        assert_eq!(
            book.last_hour(T0, 2),
            vec![
                ("a.example".to_string(), 2),
                ("c.example".to_string(), 2),
                ("other".to_string(), 2),
            ]
        );
    }

    #[test]
    fn the_last_hour_forgets_older_blocks() {
        let mut book = TargetBlocks::new(5, 10);
        book.record("a.example", T0);
        book.record("a.example", T0 + 30 * MINUTE_MS);
        book.record("b.example", T0 + 59 * MINUTE_MS);
        let at = |m: u64| book.last_hour(T0 + m * MINUTE_MS, 5);
        assert_eq!(
            at(59),
            vec![("a.example".to_string(), 2), ("b.example".to_string(), 1)]
        );
        assert_eq!(
            at(60),
            vec![("a.example".to_string(), 1), ("b.example".to_string(), 1)]
        );
        assert_eq!(at(200), vec![]);
    }

    #[test]
    fn a_hostile_number_of_hosts_keeps_the_series_and_the_book_bounded() {
        let metrics = BlockMetrics::unregistered().unwrap();
        let registry = Registry::new();
        metrics.register(&registry).unwrap();
        // One site blocking a lot, drowned in 200 000 hosts named once each.
        for i in 0..200_000u64 {
            metrics.record(Some(&format!("h{i}.flood.example")), T0 + i);
            if i % 1000 == 0 {
                metrics.record(Some("shop.example"), T0 + i);
            }
        }
        metrics.record(None, T0);
        let families = registry.gather();
        let series = families[0].get_metric();
        assert!(series.len() <= TARGET_LABELS + 2, "{} series", series.len());
        let value = |target: &str| {
            series
                .iter()
                .find(|m| m.get_label()[0].value() == target)
                .map(|m| m.get_counter().get_value())
        };
        // Every block is counted once, under its host or `other`.
        let sum: f64 = series.iter().map(|m| m.get_counter().get_value()).sum();
        assert_eq!(sum, 200_000.0 + 200.0 + 1.0);
        assert!(value("shop.example").unwrap() > 150.0, "{series:?}");
        assert!(value(OTHER_TARGET).unwrap() > 190_000.0);
        assert_eq!(value(NO_TARGET), Some(1.0));
        assert!(metrics.lock().tracked() <= TRACKED_TARGETS);
        let top = metrics.last_hour(T0 + 200_000, 3);
        assert_eq!(top[0], ("shop.example".to_string(), 200));
        assert_eq!(top.len(), 4);
        assert_eq!(top.iter().map(|(_, n)| n).sum::<u64>(), 200_201);
    }
}
