//! Leader election with a Kubernetes Lease (kube-lease-manager): of several replicas only the
//! leader reconciles and grants leases; a standby takes over within a lease duration of the
//! leader's loss.
//!
//! kube-lease-manager learns that it lost the Lease only from an answer of the API server, so a
//! leader cut off from the API server (a partition, a request that never returns) would go on
//! believing it leads while a standby takes over. The fence here closes that gap: the leader
//! reads its Lease every second and steps down on its own clock when the last renewal it saw
//! is about to expire, before any standby can see the Lease as free.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use kube_lease_manager::LeaseManagerBuilder;
use tokio_util::sync::CancellationToken;

/// Which Lease, who we are, and how long a leader's claim lasts.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    pub namespace: String,
    pub lease_name: String,
    /// Unique per replica (the Pod name in a Deployment).
    pub identity: String,
    /// A leader that stops renewing loses the lease after this long.
    pub lease_seconds: u64,
    /// The leader renews this long before its lease expires.
    pub renew_before_seconds: u64,
}

impl LeaderElection {
    /// How long before the Lease expires (as a standby sees it) the leader stops: a sixth of
    /// the lease (2.5 s of 15 s), never under 0.5 s. It does not depend on when renewals start,
    /// so renewing early (`LeaderArgs::election`: after a third of the lease) leaves a throttled renewal
    /// more time to get through without moving the point where a cut-off leader stops.
    fn margin(&self) -> Duration {
        Duration::from_millis(self.lease_seconds * 1000 / 6).max(Duration::from_millis(500))
    }
}

/// What this replica knows of the leadership, shared by the probes, the discovery API and the
/// election: whether this replica serves (leads with its lease table restored) and who holds the
/// Lease as last read. Every replica reads the Lease ([`follow`]), so a standby can name the
/// leader to a crawler that reached it, and says it is unhealthy when it cannot read it.
#[derive(Debug, Clone, Default)]
pub struct LeaderView(Arc<ViewState>);

#[derive(Debug, Default)]
struct ViewState {
    serving: AtomicBool,
    /// The Lease's holder at the last successful read, and when that was.
    seen: Mutex<Option<(Option<String>, Instant)>>,
}

impl LeaderView {
    /// A view of a replica that serves from the start (no leader election).
    pub fn always_serving() -> Self {
        let view = LeaderView::default();
        view.set_serving(true);
        view
    }

    pub fn set_serving(&self, serving: bool) {
        self.0.serving.store(serving, Ordering::Relaxed);
    }

    /// Leads with its lease table restored: grants are answered here.
    pub fn is_serving(&self) -> bool {
        self.0.serving.load(Ordering::Relaxed)
    }

    /// The holder at the last read, and how long ago that read was; `None` before the first.
    pub fn last_seen(&self) -> Option<(Option<String>, Duration)> {
        let seen = self.0.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.as_ref()
            .map(|(holder, at)| (holder.clone(), at.elapsed()))
    }

    fn saw(&self, holder: Option<String>) {
        *self.0.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some((holder, Instant::now()));
    }
}

/// How often every replica reads the Lease for its [`LeaderView`].
pub const FOLLOW_INTERVAL: Duration = Duration::from_secs(2);

/// Reads the Lease every [`FOLLOW_INTERVAL`] into `view` until dropped. A read that fails or
/// takes longer than a second leaves the last sighting as it was (it grows old).
pub async fn follow(client: Client, election: LeaderElection, view: LeaderView) {
    let api: Api<Lease> = Api::namespaced(client, &election.namespace);
    loop {
        match tokio::time::timeout(Duration::from_secs(1), api.get_opt(&election.lease_name)).await
        {
            Ok(Ok(lease)) => view.saw(
                lease
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity)
                    .filter(|h| !h.is_empty()),
            ),
            Ok(Err(e)) => tracing::debug!(error = %e, "following the leader Lease"),
            Err(_) => tracing::debug!("following the leader Lease: no answer"),
        }
        tokio::time::sleep(FOLLOW_INTERVAL).await;
    }
}

/// How a leadership term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// `stop` was cancelled (SIGTERM): the work finished and the Lease was released.
    Shutdown,
    /// The Lease was lost or could not be renewed in time: the caller serves as a standby and
    /// may lead again.
    Lost,
}

/// Waits to become the leader, then runs `work` while leading. `step_down` runs the moment the
/// leadership is lost, before anything else (it must stop granting and turn not-ready).
pub async fn lead<F, Fut>(
    client: Client,
    election: &LeaderElection,
    stop: &CancellationToken,
    step_down: impl FnOnce(),
    work: F,
) -> anyhow::Result<Term>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let manager = LeaseManagerBuilder::new(client.clone(), &election.lease_name)
        .with_namespace(&election.namespace)
        .with_identity(&election.identity)
        .with_duration(election.lease_seconds)
        .with_grace(election.renew_before_seconds)
        .build()
        .await
        .with_context(|| {
            format!(
                "setting up leader election on Lease {}/{}",
                election.namespace, election.lease_name
            )
        })?;
    let (mut leading, task) = manager.watch().await;
    tracing::info!(identity = %election.identity, lease = %election.lease_name, "waiting to become the leader");
    let became_leader = async {
        while !*leading.borrow_and_update() {
            if leading.changed().await.is_err() {
                return false;
            }
        }
        true
    };
    let term = tokio::select! {
        () = stop.cancelled() => None,
        leads = became_leader => {
            anyhow::ensure!(leads, "the leader election task stopped");
            Some(())
        }
    };
    let term = match term {
        None => Term::Shutdown,
        Some(()) => {
            let api: Api<Lease> = Api::namespaced(client, &election.namespace);
            match renewed(&api, election).await {
                Err(why) => {
                    tracing::warn!(identity = %election.identity, reason = why, "not leading after all");
                    Term::Lost
                }
                Ok(()) => lead_term(&api, election, &mut leading, step_down, work).await,
            }
        }
    };
    drop(leading);
    // Closing the channel makes the task release the Lease, so a standby takes over at once. A
    // cut-off API server would hold that forever: give it a moment, then leave it.
    let mut task = task;
    match tokio::time::timeout(Duration::from_secs(2), &mut task).await {
        Ok(Ok(Ok(_))) => {}
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "releasing the Lease"),
        Ok(Err(e)) => tracing::warn!(error = %e, "leader election task"),
        Err(_) => {
            task.abort();
            tracing::warn!("the Lease was not released (no answer from the API server)");
        }
    }
    Ok(term)
}

/// One term, from a confirmed renewal: `work` until it ends (Shutdown) or the leadership is
/// lost, when `step_down` runs first.
async fn lead_term<F, Fut>(
    api: &Api<Lease>,
    election: &LeaderElection,
    leading: &mut tokio::sync::watch::Receiver<bool>,
    step_down: impl FnOnce(),
    work: F,
) -> Term
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    tracing::info!(identity = %election.identity, "became the leader");
    let lost = async {
        let why = tokio::select! {
            why = fence(api, election) => why,
            () = flipped_off(leading) => TAKEN,
        };
        // First of all: no grant and no readiness past this point.
        step_down();
        why
    };
    tokio::select! {
        () = work() => Term::Shutdown,
        why = lost => {
            tracing::error!(identity = %election.identity, reason = why, "lost the leadership; serving as a standby");
            Term::Lost
        }
    }
}

/// kube-lease-manager reports leading as soon as the Lease names us, even when our last renewal
/// has expired (a restart after an outage): lead only once the Lease shows a renewal that is
/// still valid, or give up after a lease duration.
async fn renewed(api: &Api<Lease>, election: &LeaderElection) -> Result<(), &'static str> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(election.lease_seconds);
    while tokio::time::Instant::now() < deadline {
        match look(api, election, Duration::from_secs(1)).await? {
            Sighting::OursUntil(until) if until > SystemTime::now() => return Ok(()),
            Sighting::Taken => return Err(TAKEN),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err("the Lease was not renewed within a lease duration")
}

async fn flipped_off(leading: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if leading.changed().await.is_err() || !*leading.borrow_and_update() {
            return;
        }
    }
}

const TAKEN: &str = "another replica holds the Lease";

/// What the leader's last read of its Lease means for its fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sighting {
    /// Still ours: lead until this instant.
    OursUntil(SystemTime),
    /// Held by another identity.
    Taken,
    /// Not telling (no spec, no renew time): keep the last deadline.
    Unclear,
}

/// The pure decision behind the fence.
fn sighting(lease: &Lease, election: &LeaderElection) -> Sighting {
    let Some(spec) = &lease.spec else {
        return Sighting::Unclear;
    };
    match (&spec.holder_identity, &spec.renew_time) {
        (Some(holder), _) if holder != &election.identity => Sighting::Taken,
        (Some(_), Some(renewed)) => {
            let renewed = SystemTime::from(renewed.0);
            let duration = spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(s.max(0) as u64))
                .unwrap_or(Duration::from_secs(election.lease_seconds));
            Sighting::OursUntil(renewed + duration.saturating_sub(election.margin()))
        }
        _ => Sighting::Unclear,
    }
}

/// Returns when the leader must stop: its Lease is about to expire without a renewal it saw,
/// or it is held by someone else. Each read has a short deadline, so a request that never
/// returns cannot keep the fence from firing.
/// One read of the Lease within `timeout`; an error or no answer tells nothing (`Unclear`), a
/// deleted Lease ends the leadership.
async fn look(
    api: &Api<Lease>,
    election: &LeaderElection,
    timeout: Duration,
) -> Result<Sighting, &'static str> {
    match tokio::time::timeout(timeout, api.get_opt(&election.lease_name)).await {
        Ok(Ok(Some(lease))) => Ok(sighting(&lease, election)),
        Ok(Ok(None)) => Err("the Lease was deleted"),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "reading the leader Lease");
            Ok(Sighting::Unclear)
        }
        Err(_) => {
            tracing::debug!("reading the leader Lease: no answer");
            Ok(Sighting::Unclear)
        }
    }
}

async fn fence(api: &Api<Lease>, election: &LeaderElection) -> &'static str {
    // Until the first read: the Lease was renewed no earlier than a moment before we heard.
    let mut until = SystemTime::now()
        + Duration::from_secs(election.lease_seconds)
            .saturating_sub(election.margin() + Duration::from_secs(2));
    loop {
        let left = until
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        if left.is_zero() {
            return "the Lease could not be renewed before it expires (API server unreachable)";
        }
        // A read may take all the time the fence has left: one refused by a throttling API
        // server (429) is retried by the client after `Retry-After`, and a renewal read late
        // still moves the fence (it is dated by the Lease). With a 1 s cap, throttled reads were
        // dropped and a leader renewing on time stepped down.
        match look(api, election, left).await {
            Ok(Sighting::OursUntil(at)) => until = at,
            Ok(Sighting::Taken) => return TAKEN,
            Ok(Sighting::Unclear) => {}
            Err(why) => return why,
        }
        let left = until
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn election() -> LeaderElection {
        LeaderElection {
            namespace: "ops".into(),
            lease_name: "op-leader".into(),
            identity: "me".into(),
            lease_seconds: 15,
            renew_before_seconds: 5,
        }
    }

    fn lease(holder: Option<&str>, renewed: Option<SystemTime>, seconds: Option<i32>) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed.map(|t| MicroTime(t.try_into().unwrap())),
                lease_duration_seconds: seconds,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_fence_stops_the_leader_before_a_standby_sees_the_lease_expire() {
        let renewed = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let cases = [
            (
                lease(Some("me"), Some(renewed), Some(15)),
                Sighting::OursUntil(renewed + Duration::from_millis(12_500)),
            ),
            // The Lease's own duration wins over the flag (another version may have set it).
            (
                lease(Some("me"), Some(renewed), Some(30)),
                Sighting::OursUntil(renewed + Duration::from_millis(27_500)),
            ),
            (
                lease(Some("me"), Some(renewed), None),
                Sighting::OursUntil(renewed + Duration::from_millis(12_500)),
            ),
            (
                lease(Some("other"), Some(renewed), Some(15)),
                Sighting::Taken,
            ),
            (lease(Some("me"), None, Some(15)), Sighting::Unclear),
            (lease(None, Some(renewed), Some(15)), Sighting::Unclear),
            (Lease::default(), Sighting::Unclear),
        ];
        for (lease, expected) in cases {
            assert_eq!(sighting(&lease, &election()), expected, "{lease:?}");
        }
    }

    #[test]
    fn the_margin_is_a_sixth_of_the_lease_and_never_under_half_a_second() {
        let mut e = election();
        assert_eq!(e.margin(), Duration::from_millis(2500));
        // When renewals start does not move it.
        e.renew_before_seconds = 10;
        assert_eq!(e.margin(), Duration::from_millis(2500));
        e.lease_seconds = 2;
        assert_eq!(e.margin(), Duration::from_millis(500));
    }
}
