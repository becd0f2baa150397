//! The usage book: what each team (namespace) used, per pool and provider instance, since the
//! book began and over the last hour and day — what `kubectl px usage` prints. Kept by the
//! leader, persisted every minute (`persist.rs`) so a failover loses at most that minute.
//! Pure: figures are added with [`UsageBook::add`] and read with [`UsageBook::rows`].
//!
//! Windows are sums of buckets (5-minute buckets for the last hour, hourly ones for the last
//! day), not a sample per series: a bucket holds only the rows that used something in it, so an
//! idle fleet persists almost nothing.

use std::collections::{BTreeMap, VecDeque};
use std::ops::AddAssign;

use serde::{Deserialize, Serialize};

/// One row of the book: a team's pool on one provider instance. `pool` is the pool's name, or
/// `none` for Proxies of no pool; `provider` is `-` for gateway bytes (counted per pool).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RowKey {
    pub namespace: String,
    pub pool: String,
    pub provider: String,
}

impl RowKey {
    pub fn new(namespace: &str, pool: &str, provider: &str) -> Self {
        RowKey {
            namespace: namespace.into(),
            pool: pool.into(),
            provider: provider.into(),
        }
    }
}

/// Whom an instance is billed to: the Proxy's namespace (its label, bounded), its pool (`none`),
/// provider instance and zone.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Billed {
    pub namespace: String,
    pub pool: String,
    pub provider: String,
    pub zone: String,
}

/// The `provider` of rows that count gateway bytes (the gateway knows the pool, not the
/// instance behind each byte).
pub const ANY_PROVIDER: &str = "-";

/// What a row used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub instance_seconds: f64,
    /// `instance_seconds` at the provider instance's stated `limits.pricePerHour`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spend: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub leases_granted: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gateway_bytes_sent: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gateway_bytes_received: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl Figures {
    fn is_empty(&self) -> bool {
        *self == Figures::default()
    }
}

impl AddAssign for Figures {
    fn add_assign(&mut self, other: Figures) {
        self.instance_seconds += other.instance_seconds;
        self.spend += other.spend;
        self.leases_granted += other.leases_granted;
        self.gateway_bytes_sent += other.gateway_bytes_sent;
        self.gateway_bytes_received += other.gateway_bytes_received;
    }
}

/// The figures added from `start_ms` for one bucket's length.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bucket {
    pub start_ms: u64,
    pub rows: Vec<(RowKey, Figures)>,
}

const MINUTE_MS: u64 = 60_000;
/// The last hour's buckets: 5 minutes each.
pub const SHORT_BUCKET_MS: u64 = 5 * MINUTE_MS;
/// The last day's buckets: an hour each.
pub const LONG_BUCKET_MS: u64 = 60 * MINUTE_MS;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;

/// Rows the book keeps at most: the rest are added to one `other` row, so a hostile number of
/// pools cannot grow the persisted book past a ConfigMap (1 MiB).
pub const MAX_ROWS: usize = 1000;
/// The namespace, pool and provider of the row past [`MAX_ROWS`].
pub const OTHER: &str = "other";

/// The book itself (what is persisted).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageBook {
    /// When the book began: the first leader's first add.
    pub since_ms: u64,
    pub totals: Vec<(RowKey, Figures)>,
    /// 5-minute buckets, oldest first, the last hour's and the current one.
    pub short: VecDeque<Bucket>,
    /// Hourly buckets, oldest first, the last day's and the current one.
    pub long: VecDeque<Bucket>,
}

/// One row as read: its totals and its last hour and day.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    #[serde(flatten)]
    pub key: RowKey,
    pub total: Figures,
    pub last_hour: Figures,
    pub last_day: Figures,
}

impl UsageBook {
    /// Adds what the rows used up to `now_ms`.
    pub fn add(&mut self, now_ms: u64, used: impl IntoIterator<Item = (RowKey, Figures)>) {
        if self.since_ms == 0 {
            self.since_ms = now_ms;
        }
        let mut totals: BTreeMap<RowKey, Figures> = self.totals.drain(..).collect();
        let mut added: BTreeMap<RowKey, Figures> = BTreeMap::new();
        for (key, figures) in used {
            if figures.is_empty() {
                continue;
            }
            let key = if totals.contains_key(&key) || totals.len() < MAX_ROWS {
                key
            } else {
                RowKey::new(OTHER, OTHER, OTHER)
            };
            *totals.entry(key.clone()).or_default() += figures;
            *added.entry(key).or_default() += figures;
        }
        self.totals = totals.into_iter().collect();
        add_to_buckets(&mut self.short, now_ms, SHORT_BUCKET_MS, HOUR_MS, &added);
        add_to_buckets(&mut self.long, now_ms, LONG_BUCKET_MS, DAY_MS, &added);
    }

    /// Every row: its totals, its last hour and its last day (to a bucket's length: the oldest
    /// bucket of a window counts whole).
    pub fn rows(&self, now_ms: u64) -> Vec<UsageRow> {
        let last_hour = window(&self.short, now_ms, HOUR_MS, SHORT_BUCKET_MS);
        let last_day = window(&self.long, now_ms, DAY_MS, LONG_BUCKET_MS);
        self.totals
            .iter()
            .map(|(key, total)| UsageRow {
                key: key.clone(),
                total: *total,
                last_hour: last_hour.get(key).copied().unwrap_or_default(),
                last_day: last_day.get(key).copied().unwrap_or_default(),
            })
            .collect()
    }
}

/// Adds `added` to the bucket of `now_ms` (a new one when the last has ended) and drops the
/// buckets that ended more than `keep_ms` ago.
fn add_to_buckets(
    buckets: &mut VecDeque<Bucket>,
    now_ms: u64,
    bucket_ms: u64,
    keep_ms: u64,
    added: &BTreeMap<RowKey, Figures>,
) {
    let start_ms = now_ms - now_ms % bucket_ms;
    if buckets.back().is_none_or(|b| b.start_ms < start_ms) {
        buckets.push_back(Bucket {
            start_ms,
            rows: Vec::new(),
        });
    }
    let current = buckets.back_mut().expect("pushed above");
    let mut rows: BTreeMap<RowKey, Figures> = current.rows.drain(..).collect();
    for (key, figures) in added {
        *rows.entry(key.clone()).or_default() += *figures;
    }
    current.rows = rows.into_iter().collect();
    while buckets
        .front()
        .is_some_and(|b| b.start_ms + bucket_ms + keep_ms <= now_ms)
    {
        buckets.pop_front();
    }
}

/// The sums per row of the buckets that end within `window_ms` of `now_ms`.
fn window(
    buckets: &VecDeque<Bucket>,
    now_ms: u64,
    window_ms: u64,
    bucket_ms: u64,
) -> BTreeMap<RowKey, Figures> {
    let mut sums: BTreeMap<RowKey, Figures> = BTreeMap::new();
    for bucket in buckets
        .iter()
        .filter(|b| b.start_ms + bucket_ms > now_ms.saturating_sub(window_ms))
    {
        for (key, figures) in &bucket.rows {
            *sums.entry(key.clone()).or_default() += *figures;
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seconds(s: f64) -> Figures {
        Figures {
            instance_seconds: s,
            ..Default::default()
        }
    }

    fn row<'a>(rows: &'a [UsageRow], namespace: &str) -> &'a UsageRow {
        rows.iter().find(|r| r.key.namespace == namespace).unwrap()
    }

    #[test]
    fn totals_keep_everything_and_windows_only_their_hour_and_day() {
        let a = RowKey::new("team-a", "pool", "gcp");
        let b = RowKey::new("team-b", "pool", "gcp");
        let mut book = UsageBook::default();
        let start = 10 * DAY_MS;
        // (ms after start, team a's seconds, team b's seconds)
        let steps = [
            (0, 10.0, 0.0),
            (30 * MINUTE_MS, 20.0, 5.0),
            (2 * HOUR_MS, 40.0, 0.0),
        ];
        for (at, sa, sb) in steps {
            book.add(
                start + at,
                [(a.clone(), seconds(sa)), (b.clone(), seconds(sb))],
            );
        }
        let now = start + 2 * HOUR_MS;
        let rows = book.rows(now);
        assert_eq!(book.since_ms, start);
        assert_eq!(row(&rows, "team-a").total.instance_seconds, 70.0);
        assert_eq!(row(&rows, "team-a").last_hour.instance_seconds, 40.0);
        assert_eq!(row(&rows, "team-a").last_day.instance_seconds, 70.0);
        assert_eq!(row(&rows, "team-b").last_hour.instance_seconds, 0.0);
        assert_eq!(row(&rows, "team-b").last_day.instance_seconds, 5.0);
        // A day and more later, with nothing used: only the totals remain.
        let later = now + DAY_MS + 2 * HOUR_MS;
        book.add(later, []);
        let rows = book.rows(later);
        assert_eq!(row(&rows, "team-a").total.instance_seconds, 70.0);
        assert_eq!(row(&rows, "team-a").last_day, Figures::default());
        assert!(book.short.len() <= 13 && book.long.len() <= 25);
    }

    #[test]
    fn rows_past_the_bound_are_added_to_one_other_row() {
        let mut book = UsageBook::default();
        let used =
            (0..MAX_ROWS + 50).map(|i| (RowKey::new(&format!("ns-{i}"), "p", "x"), seconds(1.0)));
        book.add(DAY_MS, used);
        let rows = book.rows(DAY_MS);
        assert_eq!(rows.len(), MAX_ROWS + 1);
        assert_eq!(row(&rows, OTHER).total.instance_seconds, 50.0);
        let sum: f64 = rows.iter().map(|r| r.total.instance_seconds).sum();
        assert_eq!(sum, (MAX_ROWS + 50) as f64);
    }

    #[test]
    fn the_book_survives_its_json_and_idle_rows_are_not_written() {
        let mut book = UsageBook::default();
        book.add(DAY_MS, [(RowKey::new("a", "p", "x"), seconds(3.0))]);
        book.add(
            DAY_MS + 1,
            [(RowKey::new("b", "p", "x"), Figures::default())],
        );
        let json = serde_json::to_string(&book).unwrap();
        assert!(!json.contains("\"b\""), "{json}");
        let back: UsageBook = serde_json::from_str(&json).unwrap();
        assert_eq!(back, book);
    }
}
