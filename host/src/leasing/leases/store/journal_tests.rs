//! The lease table's persisted side: what the writer takes (the journal's changes, bounded),
//! what a checkpoint keeps, and what a restore rebuilds.

use std::time::Duration;

use super::sessions::digest;
use super::tests::{entry, key, store_of, with_session};
use super::*;
use crate::leasing::leases::journal::Change;

/// Sessions and per-target cooldowns are held in memory by the hundred thousand; a checkpoint
/// keeps no sessions and only the newest target cooldowns, so it stays a few parts whatever
/// the memory holds.
#[test]
fn a_checkpoint_stays_small_whatever_sessions_and_target_cooldowns_are_held() {
    let names: Vec<String> = (0..1000).map(|i| format!("proxy-{i:04}")).collect();
    let store = store_of(
        names
            .iter()
            .map(|n| entry(n, Some("a-pool-with-a-long-name")))
            .collect(),
    );
    let mut inner = store.lock();
    for i in 0..100_000 {
        let proxy = key(&names[i % names.len()]);
        inner
            .sessions
            .bind(digest(format!("session-{i}").as_bytes()), &proxy);
        assert!(inner.targets.insert(
            &proxy,
            digest(format!("t{i}").as_bytes()),
            now_ms() + 600_000 + i as u64,
        ));
    }
    assert_eq!(inner.sessions.len(), 100_000);
    assert_eq!(inner.targets.len(), 100_000);
    drop(inner);
    let snapshot = store.snapshot().unwrap();
    assert!(snapshot.sessions.is_empty());
    assert_eq!(
        snapshot
            .target_cooldowns
            .values()
            .map(BTreeMap::len)
            .sum::<usize>(),
        CHECKPOINTED_TARGET_COOLDOWNS
    );
    let size = serde_json::to_string(&snapshot).unwrap().len();
    assert!(size < 2 * 1024 * 1024, "{size} bytes");
}

/// What the writer takes from the table, replayed onto the checkpoint it started from, is the
/// table: nothing a grant, renewal, release, block or deletion changed is missing.
#[test]
fn the_changes_replayed_onto_the_last_checkpoint_are_the_table() {
    use crate::leasing::leases::journal::Replay;
    let store = store_of(vec![
        entry("a1", Some("a")),
        entry("a2", Some("a")),
        entry("a3", None),
        entry("a4", None),
    ]);
    let (kept, _) = store.grant(&with_session("jar")).unwrap();
    let checkpoint = store.snapshot().unwrap();
    let _ = store.take_changes();

    let (renewed, _) = store.grant(&LeaseRequest::default()).unwrap();
    store
        .renew(&renewed.id, Some(Duration::from_secs(900)))
        .unwrap();
    let (released, _) = store.grant(&LeaseRequest::default()).unwrap();
    store.release(&released.id).unwrap();
    let (blocked, _) = store.grant(&LeaseRequest::default()).unwrap();
    store
        .report_for(&blocked.id, Outcome::Blocked, Some("shop.example"))
        .unwrap();
    store.release(&kept.id).unwrap();
    let (again, _) = store.grant(&LeaseRequest::default()).unwrap();
    store.report(&again.id, Outcome::Blocked).unwrap();

    let pending = store.take_changes().unwrap();
    let mut replay = Replay::from_checkpoint(checkpoint);
    for change in pending.changes {
        replay.apply(change);
    }
    let mut replayed = replay.into_snapshot();
    let mut table = store.snapshot().unwrap();
    for snapshot in [&mut replayed, &mut table] {
        snapshot.leases.sort_by(|a, b| a.id.cmp(&b.id));
    }
    assert_eq!(replayed, table);
    assert_eq!(table.leases.len(), 1, "{table:?}");
    assert!(table.leases[0].expires_at_ms - now_ms() > 800_000);
}

/// With no write for a long while, the changes held for the writer stay bounded: past the bound
/// they are dropped and the next write is the whole table (which holds them all).
#[test]
fn changes_held_for_the_writer_are_bounded_and_then_the_whole_table_is_written() {
    let store = store_of(vec![entry("a1", None)]);
    for _ in 0..MAX_PENDING_CHANGES {
        let (lease, _) = store.grant(&LeaseRequest::default()).unwrap();
        store.release(&lease.id).unwrap();
    }
    let pending = store.take_changes().unwrap();
    assert!(pending.whole);
    assert!(pending.changes.is_empty());
    assert_eq!(pending.version, store.version());
    // A failed whole write stays whole; after it, lines again.
    store.requeue_changes(pending);
    assert!(store.take_changes().unwrap().whole);
    let (lease, _) = store.grant(&LeaseRequest::default()).unwrap();
    let pending = store.take_changes().unwrap();
    assert!(!pending.whole);
    assert!(matches!(&pending.changes[..], [Change::Granted(l)] if l.id == lease.id));
}

/// Sessions are not persisted: a restore binds again the sessions of the leases it restores,
/// so crawlers holding a lease keep their proxy across a failover.
#[test]
fn a_restore_binds_the_sessions_of_its_leases_again() {
    let store = store_of(vec![entry("a1", None), entry("a2", None)]);
    let (lease, _) = store.grant(&with_session("jar")).unwrap();
    let snapshot = store.snapshot().unwrap();
    let after = store_of(vec![]);
    after.close();
    after.restore(snapshot);
    after.set_provisioned(vec![entry("a1", None), entry("a2", None)]);
    after.release(&lease.id).unwrap();
    let (again, _) = after.grant(&with_session("jar")).unwrap();
    assert_eq!(again.proxy, lease.proxy);
}
