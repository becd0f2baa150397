use super::*;

fn store_of_one() -> LeaseStore {
    let store = LeaseStore::new(
        LeaseOptions::default(),
        LeaseMetrics::unregistered().unwrap(),
        None,
    );
    store.restore(Snapshot::default());
    store.set_pool(vec![PoolEntry {
        key: ProxyKey {
            namespace: "ns".into(),
            name: "only".into(),
        },
        provider: "p".into(),
        zone: None,
        labels: BTreeMap::new(),
        address: "127.0.0.1".into(),
        exit_ip: None,
        port: 3128,
        healthy: true,
    }]);
    store
}

#[tokio::test]
async fn a_grant_is_confirmed_only_by_a_write_that_holds_it() {
    let store = store_of_one();
    let before = store.version();
    store.grant(&LeaseRequest::default()).unwrap();
    let granted = store.version();
    assert!(granted > before);
    let wait = Duration::from_millis(50);
    assert_eq!(
        store.wait_stored(granted, wait).await,
        Err(NotStored::TimedOut)
    );
    // A write of an older table confirms nothing newer.
    let (_, version) = store.snapshot_versioned().unwrap();
    assert_eq!(version, granted);
    store.mark_stored(before);
    assert_eq!(
        store.wait_stored(granted, wait).await,
        Err(NotStored::TimedOut)
    );
    store.mark_stored(version);
    assert_eq!(store.wait_stored(granted, wait).await, Ok(()));
}

#[tokio::test]
async fn closing_the_store_ends_every_wait_at_once_and_versions_go_on() {
    let store = Arc::new(store_of_one());
    store.grant(&LeaseRequest::default()).unwrap();
    let granted = store.version();
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.wait_stored(granted, Duration::from_secs(3600)).await })
    };
    tokio::task::yield_now().await;
    store.close();
    assert_eq!(waiting.await.unwrap(), Err(NotStored::Closed));
    // The next term restores what the cluster has; its changes get new versions.
    store.restore(Snapshot::default());
    assert_eq!(store.wait_stored(granted, Duration::ZERO).await, Ok(()));
    store.set_pool(vec![]);
    assert!(store.version() >= granted);
}

#[test]
fn ended_ids_are_remembered_in_bounded_memory() {
    let store = store_of_one();
    let mut first = None;
    for _ in 0..MAX_ENDED + 10 {
        let (lease, _) = store.grant(&LeaseRequest::default()).unwrap();
        store.release(&lease.id).unwrap();
        first.get_or_insert(lease.id);
    }
    let inner = store.lock();
    assert_eq!(inner.ended.len(), MAX_ENDED);
    assert_eq!(inner.ended_order.len(), MAX_ENDED);
    drop(inner);
    // The oldest were forgotten (404), the newest are still known (410).
    assert_eq!(
        store.report(first.as_deref().unwrap(), Outcome::Success),
        Err(LeaseError::NotFound)
    );
}
