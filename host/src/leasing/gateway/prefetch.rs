//! Routes asked of the leader one request ahead, for the clients that send many: a client's
//! next request or tunnel (same token, same username, same site) finds its route ready instead
//! of waiting for the leader's round trip, which is most of what the gateway adds to a
//! `CONNECT` (docs/performance.md).
//!
//! Each spare route is still the leader's own choice under the lease rules, asked a moment
//! early: requests without a session still rotate (one route per request), a session still
//! gets its proxy. A spare is at most [`SPARE_TTL`] old when used, so a block reported
//! through another replica, a revoked token or a moved session show within that; a block this
//! replica reports drops its spares on that proxy at once. Only a key asked for twice within
//! [`HOT_WINDOW`] gets a spare, so a crawler visiting many sites once costs the leader nothing
//! more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Destination, Report, Route, RouteError, RouteRequest, Routes, Routing, SessionReport};

/// The oldest a spare route may be when a request takes it.
pub const SPARE_TTL: Duration = Duration::from_secs(1);
/// A key asked for again within this gets a spare.
pub const HOT_WINDOW: Duration = Duration::from_secs(1);
/// Keys remembered at most (a client inventing usernames or sites must not grow the gateway).
pub const MAX_KEYS: usize = 10_000;

/// Who asks for what: only the same client (token), the same username and the same site
/// share a spare.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    token: String,
    routing: Routing,
    host: String,
}

struct Slot {
    spare: Option<(Route, Instant)>,
    last_asked: Instant,
    fetching: bool,
    /// Bumped by a report that may concern the route being fetched: that answer, asked before
    /// the report, is dropped.
    epoch: u64,
}

/// [`Routes`] that keeps one spare route per busy key.
pub struct Prefetching<R> {
    inner: Arc<R>,
    slots: Arc<Mutex<HashMap<Key, Slot>>>,
    /// Off: every route is asked when needed (`--route-prefetch=false`).
    enabled: bool,
}

impl<R> Prefetching<R> {
    pub fn new(inner: Arc<R>, enabled: bool) -> Self {
        Prefetching {
            inner,
            slots: Arc::default(),
            enabled,
        }
    }
}

/// What one request does with the slots: the spare it takes, and whether to ask for the next
/// (as of `epoch`).
struct Take {
    spare: Option<Route>,
    fetch_next: bool,
    epoch: u64,
}

/// The decision for a request of `key` at `now` (pure, under the slots' lock).
fn take(slots: &mut HashMap<Key, Slot>, key: &Key, now: Instant) -> Take {
    if !slots.contains_key(key) && slots.len() >= MAX_KEYS {
        slots.retain(|_, s| now.duration_since(s.last_asked) < HOT_WINDOW || s.fetching);
        if slots.len() >= MAX_KEYS {
            return Take {
                spare: None,
                fetch_next: false,
                epoch: 0,
            };
        }
    }
    // The key (the client's token, username and site) is copied only the first time it comes.
    if !slots.contains_key(key) {
        let never_asked = Slot {
            spare: None,
            // Not hot.
            last_asked: now.checked_sub(HOT_WINDOW).unwrap_or(now),
            fetching: false,
            epoch: 0,
        };
        slots.insert(key.clone(), never_asked);
    }
    let slot = slots.get_mut(key).expect("inserted above");
    let hot = now.duration_since(slot.last_asked) < HOT_WINDOW;
    slot.last_asked = now;
    let spare = slot
        .spare
        .take()
        .filter(|(_, at)| now.duration_since(*at) < SPARE_TTL)
        .map(|(route, _)| route);
    let fetch_next = (hot || spare.is_some()) && !slot.fetching;
    slot.fetching |= fetch_next;
    Take {
        spare,
        fetch_next,
        epoch: slot.epoch,
    }
}

impl<R: Routes> Prefetching<R> {
    /// Asks the leader for `key`'s next route in the background.
    fn fetch_next(&self, key: Key, request: RouteRequest, epoch: u64) {
        let (inner, slots) = (self.inner.clone(), self.slots.clone());
        tokio::spawn(async move {
            let answer = inner.route(&request).await;
            let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = slots.get_mut(&key) {
                slot.fetching = false;
                if slot.epoch == epoch {
                    slot.spare = answer.ok().map(|route| (route, Instant::now()));
                }
            }
        });
    }

    /// Drops the spares on `proxy` (for `host` only, when given), and the answers being
    /// fetched for that host (they may be on it).
    fn forget(&self, proxy: &str, host: Option<&str>) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for (key, slot) in slots.iter_mut() {
            if host.is_some_and(|h| key.host != h) {
                continue;
            }
            if slot.spare.as_ref().is_some_and(|(r, _)| r.proxy == proxy) {
                slot.spare = None;
            }
            if slot.fetching {
                slot.epoch += 1;
            }
        }
    }
}

impl<R: Routes> Routes for Prefetching<R> {
    async fn route(&self, request: &RouteRequest) -> Result<Route, RouteError> {
        // A retry after a failure wants a fresh choice without the failed proxy.
        if request.avoid.is_some() || !self.enabled {
            return self.inner.route(request).await;
        }
        let key = Key {
            token: request.token.clone(),
            routing: request.routing.clone(),
            host: request.destination.host.clone(),
        };
        let taken = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            take(&mut slots, &key, Instant::now())
        };
        if taken.fetch_next {
            self.fetch_next(key, request.clone(), taken.epoch);
        }
        match taken.spare {
            Some(route) => Ok(route),
            None => self.inner.route(request).await,
        }
    }

    async fn report(&self, route: &Route, destination: &Destination, report: Report) {
        let host = match report {
            Report::Blocked => Some(destination.host.as_str()),
            Report::Failure => None,
        };
        self.forget(&route.proxy, host);
        self.inner.report(route, destination, report).await
    }

    async fn report_session(&self, report: &SessionReport) -> Result<String, RouteError> {
        let proxy = self.inner.report_session(report).await?;
        let host = match report.report {
            Report::Blocked => Some(report.target.as_str()),
            Report::Failure => None,
        };
        self.forget(&proxy, host);
        Ok(proxy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts the leader's routes; each is a new proxy (`p1`, `p2`, …), as rotation gives.
    #[derive(Default)]
    struct Counting {
        asked: AtomicUsize,
        reports: AtomicUsize,
    }

    impl Routes for Counting {
        async fn route(&self, _: &RouteRequest) -> Result<Route, RouteError> {
            let n = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Route {
                proxy: format!("ns/p{n}"),
                pool: None,
                address: "127.0.0.1".into(),
                port: 3128,
                login: None,
                protocol: Default::default(),
                block_statuses: vec![],
                block_body_patterns: vec![],
            })
        }

        async fn report(&self, _: &Route, _: &Destination, _: Report) {
            self.reports.fetch_add(1, Ordering::SeqCst);
        }

        async fn report_session(&self, _: &SessionReport) -> Result<String, RouteError> {
            Ok("ns/p2".into())
        }
    }

    fn request(token: &str, host: &str) -> RouteRequest {
        RouteRequest {
            routing: Routing::default(),
            token: token.into(),
            destination: Destination {
                host: host.into(),
                port: 443,
            },
            avoid: None,
        }
    }

    fn key(token: &str, host: &str) -> Key {
        Key {
            token: token.into(),
            routing: Routing::default(),
            host: host.into(),
        }
    }

    #[test]
    fn a_key_gets_a_spare_only_once_hot_and_only_a_fresh_one_is_taken() {
        let mut slots = HashMap::new();
        let t0 = Instant::now();
        let k = key("t", "a.example");
        let first = take(&mut slots, &k, t0);
        assert!(
            first.spare.is_none() && !first.fetch_next,
            "asked once: not hot"
        );
        let second = take(&mut slots, &k, t0 + Duration::from_millis(10));
        assert!(second.fetch_next, "asked twice within the window");
        // While one is being fetched, no second fetch.
        assert!(!take(&mut slots, &k, t0 + Duration::from_millis(20)).fetch_next);
        let slot = slots.get_mut(&k).unwrap();
        slot.fetching = false;
        slot.spare = Some((route("ns/p1"), t0 + Duration::from_millis(30)));
        let hit = take(&mut slots, &k, t0 + Duration::from_millis(40));
        assert_eq!(hit.spare.unwrap().proxy, "ns/p1");
        assert!(hit.fetch_next, "a taken spare asks for the next");
        // A stale spare is never handed out.
        let slot = slots.get_mut(&k).unwrap();
        slot.fetching = false;
        slot.spare = Some((route("ns/p2"), t0));
        assert!(
            take(&mut slots, &k, t0 + SPARE_TTL + Duration::from_millis(1))
                .spare
                .is_none()
        );
        // Another token or site never takes it.
        slots.get_mut(&k).unwrap().spare = Some((route("ns/p3"), t0 + SPARE_TTL));
        let now = t0 + SPARE_TTL + Duration::from_millis(2);
        assert!(
            take(&mut slots, &key("other", "a.example"), now)
                .spare
                .is_none()
        );
        assert!(
            take(&mut slots, &key("t", "b.example"), now)
                .spare
                .is_none()
        );
    }

    #[test]
    fn the_keys_are_bounded() {
        let mut slots = HashMap::new();
        let t0 = Instant::now();
        for i in 0..MAX_KEYS {
            take(&mut slots, &key("t", &format!("{i}.example")), t0);
        }
        let full = take(&mut slots, &key("t", "new.example"), t0);
        assert!(full.spare.is_none() && !full.fetch_next);
        assert_eq!(slots.len(), MAX_KEYS);
        // Once the old ones are cold they make room.
        take(&mut slots, &key("t", "new.example"), t0 + HOT_WINDOW);
        assert_eq!(slots.len(), 1);
    }

    fn route(proxy: &str) -> Route {
        Route {
            proxy: proxy.into(),
            pool: None,
            address: "127.0.0.1".into(),
            port: 3128,
            login: None,
            protocol: Default::default(),
            block_statuses: vec![],
            block_body_patterns: vec![],
        }
    }

    #[tokio::test]
    async fn busy_clients_rotate_through_spares_and_a_block_drops_the_spare_on_that_proxy() {
        let leader = Arc::new(Counting::default());
        let routes = Prefetching::new(leader.clone(), true);
        let req = request("t", "a.example");
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(routes.route(&req).await.unwrap().proxy);
            // Let the background fetch land, as the time between two requests does.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        let mut distinct = seen.clone();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            seen.len(),
            "every request a new route: {seen:?}"
        );
        let asked = leader.asked.load(Ordering::SeqCst);
        assert!(
            asked <= seen.len() + 2,
            "{asked} leader routes for {seen:?}"
        );
        // The spare now waiting is dropped when its proxy is reported blocked for the site.
        let spare = {
            let slots = routes.slots.lock().unwrap();
            slots[&key("t", "a.example")].spare.clone().unwrap().0
        };
        let site = req.destination.clone();
        routes.report(&spare, &site, Report::Blocked).await;
        assert!(
            routes.slots.lock().unwrap()[&key("t", "a.example")]
                .spare
                .is_none()
        );
        // An answer asked before a report on its site is dropped when it lands.
        routes.route(&req).await.unwrap();
        assert!(routes.slots.lock().unwrap()[&key("t", "a.example")].fetching);
        routes.report(&spare, &site, Report::Blocked).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        {
            let slots = routes.slots.lock().unwrap();
            let slot = &slots[&key("t", "a.example")];
            assert!(!slot.fetching && slot.spare.is_none());
        }
        assert_eq!(leader.reports.load(Ordering::SeqCst), 2);
        // A retry never takes a spare.
        let retry = RouteRequest {
            avoid: Some("ns/p1".into()),
            ..req.clone()
        };
        let before = leader.asked.load(Ordering::SeqCst);
        routes.route(&retry).await.unwrap();
        assert_eq!(leader.asked.load(Ordering::SeqCst), before + 1);
    }
}
