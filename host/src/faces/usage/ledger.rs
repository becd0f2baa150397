//! The leader's usage book and how figures reach it: instance-seconds from the meter, leases
//! granted and gateway bytes as the increase of their counters since the last look. One per
//! process: the counters' last values outlive a leadership term, so a replica that leads again
//! counts only what was granted since (its counters are the process's), while the book itself
//! is the one persisted by whoever led last.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::book::{ANY_PROVIDER, Billed, Figures, RowKey, UsageBook, UsageRow};

/// Leases granted so far per row, as the lease counters read: (row, count).
pub type GrantedCounts = Vec<(RowKey, f64)>;
/// Gateway bytes so far per pool (`namespace/name`): (pool, sent, received).
pub type PoolBytes = Vec<(String, u64, u64)>;

/// Shared handle (cheap to clone).
#[derive(Clone, Default)]
pub struct UsageLedger(Arc<Mutex<Ledger>>);

#[derive(Default)]
struct Ledger {
    book: UsageBook,
    granted_seen: HashMap<RowKey, f64>,
    bytes_seen: HashMap<String, (u64, u64)>,
}

/// How much a counter rose since it was last seen at `last` (a counter that went down was
/// reset, or its series dropped and made again: all of it is new).
fn rise(now: f64, last: Option<f64>) -> f64 {
    match last {
        Some(last) if now >= last => now - last,
        _ => now,
    }
}

impl UsageLedger {
    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new term starts from the book as the last leader persisted it.
    pub fn restore(&self, book: UsageBook) {
        self.lock().book = book;
    }

    /// The book as it is now (to persist).
    pub fn book(&self) -> UsageBook {
        self.lock().book.clone()
    }

    /// When the book began, and its rows at `now_ms`.
    pub fn rows(&self, now_ms: u64) -> (u64, Vec<UsageRow>) {
        let ledger = self.lock();
        (ledger.book.since_ms, ledger.book.rows(now_ms))
    }

    /// Adds one look's figures: the instance-seconds metered since the last look (priced at
    /// `price_per_hour` of their provider instance), and the lease and byte counters as they read
    /// now (their rise since the last look is added).
    pub fn record(
        &self,
        now_ms: u64,
        instances: &BTreeMap<Billed, f64>,
        price_per_hour: impl Fn(&str) -> Option<f64>,
        granted: GrantedCounts,
        bytes: PoolBytes,
    ) {
        let mut ledger = self.lock();
        let mut used: BTreeMap<RowKey, Figures> = BTreeMap::new();
        for (billed, seconds) in instances {
            let row = used
                .entry(RowKey::new(
                    &billed.namespace,
                    &billed.pool,
                    &billed.provider,
                ))
                .or_default();
            row.instance_seconds += seconds;
            row.spend += price_per_hour(&billed.provider).unwrap_or(0.0) * seconds / 3600.0;
        }
        for (key, count) in granted {
            let last = ledger.granted_seen.insert(key.clone(), count);
            used.entry(key).or_default().leases_granted += rise(count, last);
        }
        for (pool, sent, received) in bytes {
            let last = ledger.bytes_seen.insert(pool.clone(), (sent, received));
            // Bytes through proxies of no pool have no team to bill.
            let Some((namespace, name)) = pool.split_once('/') else {
                continue;
            };
            let row = used
                .entry(RowKey::new(namespace, name, ANY_PROVIDER))
                .or_default();
            row.gateway_bytes_sent += rise(sent as f64, last.map(|l| l.0 as f64));
            row.gateway_bytes_received += rise(received as f64, last.map(|l| l.1 as f64));
        }
        ledger.book.add(now_ms, used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn billed(namespace: &str, pool: &str, provider: &str) -> Billed {
        Billed {
            namespace: namespace.into(),
            pool: pool.into(),
            provider: provider.into(),
            zone: "z".into(),
        }
    }

    #[test]
    fn counters_add_their_rise_and_instances_their_price() {
        let ledger = UsageLedger::default();
        let price = |provider: &str| (provider == "gcp").then_some(0.36);
        let a = RowKey::new("team-a", "crawl", "gcp");
        let instances: BTreeMap<Billed, f64> = [
            (billed("team-a", "crawl", "gcp"), 100.0),
            (billed("team-b", "none", "kvm"), 50.0),
        ]
        .into();
        // (granted counter of team-a's row, team-a's bytes sent, leases added, bytes added)
        let looks = [
            (3.0, 100, 3.0, 100.0),
            (5.0, 150, 2.0, 50.0),
            (1.0, 10, 1.0, 10.0),
        ];
        let mut leases = 0.0;
        let mut sent = 0.0;
        for (i, (counter, bytes, added_leases, added_bytes)) in looks.into_iter().enumerate() {
            ledger.record(
                86_400_000 + i as u64 * 5000,
                &instances,
                price,
                vec![(a.clone(), counter)],
                vec![("team-a/crawl".into(), bytes, 0), ("none".into(), 7, 7)],
            );
            leases += added_leases;
            sent += added_bytes;
            let (_, rows) = ledger.rows(86_400_000 + i as u64 * 5000);
            let row = |k: &RowKey| rows.iter().find(|r| &r.key == k).unwrap().total;
            assert_eq!(row(&a).leases_granted, leases, "look {i}");
            let bytes_row = RowKey::new("team-a", "crawl", ANY_PROVIDER);
            assert_eq!(row(&bytes_row).gateway_bytes_sent, sent, "look {i}");
        }
        let (_, rows) = ledger.rows(86_400_000 + 10_000);
        let total = |ns: &str| -> Figures {
            let mut f = Figures::default();
            for r in rows.iter().filter(|r| r.key.namespace == ns) {
                f += r.total;
            }
            f
        };
        assert_eq!(total("team-a").instance_seconds, 300.0);
        assert!(
            (total("team-a").spend - 0.03).abs() < 1e-9,
            "{:?}",
            total("team-a")
        );
        assert_eq!(total("team-b").spend, 0.0, "no price stated for kvm");
        assert!(rows.iter().all(|r| r.key.namespace != "none"));
    }
}
