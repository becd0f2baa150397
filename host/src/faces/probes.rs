//! `/healthz`, `/readyz`, `/leaderz` and `/metrics` on `--metrics-addr` (and the status page,
//! `crate::faces::status_page`).
//!
//! Every healthy replica is ready, so a Deployment's rolling update can finish and a
//! PodDisruptionBudget counts both replicas: the leader once it serves leases, a standby while it
//! can read the leader's Lease (it knows whom to name to a crawler that reaches it, and it could
//! take over). Crawlers reach only the leader: the discovery Service selects the label the
//! leader puts on its own Pod ([`crate::faces::leader_label`]). `/leaderz` answers 200 only on the
//! replica that serves leases.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::faces::metrics_auth::MetricsAuth;
use crate::leasing::leases::LeaseStore;
use crate::support::leader::LeaderView;

/// A standby that has not read the Lease for this long is not ready: it cannot reach the API
/// server, so it could neither take over nor name the leader.
pub const STANDBY_STALE_AFTER: Duration = Duration::from_secs(10);
/// A leader whose grants wait for their write is not ready once writes fail for this long.
const UNSTORED_NOT_READY_AFTER: Duration = Duration::from_secs(5);

/// What the probes read on each request.
#[derive(Clone)]
pub struct ProbeState {
    pub view: LeaderView,
    pub leases: Arc<LeaseStore>,
    /// `--lease-durability sync`: a leader that cannot store grants none.
    pub grants_wait_for_writes: bool,
}

/// The facts a readiness answer is decided from (plain values, so the decision is table-tested).
#[derive(Debug, Clone)]
pub struct Facts {
    pub serving: bool,
    /// The Lease's holder at the last read and how long ago; `None` before the first read.
    pub lease_seen: Option<(Option<String>, Duration)>,
    pub table_ready: bool,
    pub unstored_for: Option<Duration>,
    pub grants_wait_for_writes: bool,
}

impl ProbeState {
    fn facts(&self) -> Facts {
        Facts {
            serving: self.view.is_serving(),
            lease_seen: self.view.last_seen(),
            table_ready: self.leases.is_ready(),
            unstored_for: self.leases.unstored_for(),
            grants_wait_for_writes: self.grants_wait_for_writes,
        }
    }
}

/// `/readyz`: `Ok(why)` when ready, `Err(why not)` otherwise.
pub fn readiness(facts: &Facts) -> Result<String, String> {
    if facts.serving {
        return serving(facts);
    }
    match &facts.lease_seen {
        None => Err("not the leader: starting (the leader Lease was not read yet)".into()),
        Some((_, ago)) if *ago > STANDBY_STALE_AFTER => Err(format!(
            "not the leader, and the leader Lease could not be read for {} s (is the API server reachable?)",
            ago.as_secs()
        )),
        Some((Some(holder), _)) => Ok(format!("ready: a standby; the leader is {holder}")),
        Some((None, _)) => Ok("ready: a standby; no replica leads yet".into()),
    }
}

/// `/leaderz`: `Ok` only on the replica that serves leases.
pub fn leadership(facts: &Facts) -> Result<String, String> {
    if facts.serving {
        serving(facts)
    } else {
        Err(readiness(facts).map_or_else(|why| why, |_| "not the leader".into()))
    }
}

fn serving(facts: &Facts) -> Result<String, String> {
    if !facts.table_ready {
        return Err("restoring the lease table".into());
    }
    match facts.unstored_for {
        Some(failing) if facts.grants_wait_for_writes && failing > UNSTORED_NOT_READY_AFTER => {
            Err(format!(
                "the lease table cannot be stored for {} s (is the API server reachable?): no lease can be granted",
                failing.as_secs()
            ))
        }
        _ => Ok("ready: the leader, serving leases".into()),
    }
}

fn answer(decision: Result<String, String>) -> (StatusCode, String) {
    match decision {
        Ok(why) => (StatusCode::OK, why),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// Serves the probes and metrics, and `pages` (the status page) beside them, until `stop`;
/// `/metrics` and the pages behind `auth`.
pub async fn serve(
    stop: &CancellationToken,
    addr: std::net::SocketAddr,
    registry: prometheus::Registry,
    state: ProbeState,
    pages: axum::Router,
    auth: &Arc<MetricsAuth>,
) -> anyhow::Result<JoinHandle<()>> {
    let (ready_state, leader_state) = (state.clone(), state);
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let facts = ready_state.facts();
                async move { answer(readiness(&facts)) }
            }),
        )
        .route(
            "/leaderz",
            get(move || {
                let facts = leader_state.facts();
                async move { answer(leadership(&facts)) }
            }),
        )
        .merge(auth.guard(metrics_router(registry).merge(pages)));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --metrics-addr {addr}"))?;
    tracing::info!(%addr, "serving /metrics, /status, /healthz, /readyz, /leaderz");
    let stop = stop.clone();
    Ok(tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            result = axum::serve(listener, app).into_future() => {
                if let Err(e) = result {
                    tracing::error!(error = %e, "probe server failed");
                }
            }
        }
    }))
}

/// `/metrics` of `registry` (the operator's and the gateway's), to put behind a check.
pub fn metrics_router(registry: prometheus::Registry) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        get(move || {
            let answer = metrics_text(&registry);
            async move { answer }
        }),
    )
}

/// `/metrics`: `registry` in the Prometheus text format (the operator's and the gateway's).
pub fn metrics_text(registry: &prometheus::Registry) -> (StatusCode, String) {
    let mut text = String::new();
    match prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut text) {
        Ok(()) => (StatusCode::OK, text),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            serving: false,
            lease_seen: None,
            table_ready: false,
            unstored_for: None,
            grants_wait_for_writes: true,
        }
    }

    #[test]
    fn every_healthy_replica_is_ready_and_only_the_serving_one_leads() {
        let secs = Duration::from_secs;
        let leader = |f: Facts| Facts {
            serving: true,
            table_ready: true,
            lease_seen: Some((Some("a".into()), secs(1))),
            ..f
        };
        let standby = |holder: Option<&str>, ago: u64| Facts {
            lease_seen: Some((holder.map(str::to_string), secs(ago))),
            ..facts()
        };
        // (facts, ready?, leads?, words the answer has)
        let cases = [
            (leader(facts()), true, true, "serving leases"),
            (
                Facts {
                    table_ready: false,
                    ..leader(facts())
                },
                false,
                false,
                "restoring",
            ),
            (
                Facts {
                    unstored_for: Some(secs(6)),
                    ..leader(facts())
                },
                false,
                false,
                "cannot be stored for 6 s",
            ),
            (
                Facts {
                    unstored_for: Some(secs(6)),
                    grants_wait_for_writes: false,
                    ..leader(facts())
                },
                true,
                true,
                "serving",
            ),
            (
                standby(Some("replica-a"), 1),
                true,
                false,
                "the leader is replica-a",
            ),
            (standby(None, 1), true, false, "no replica leads"),
            (
                standby(Some("replica-a"), 11),
                false,
                false,
                "could not be read for 11 s",
            ),
            (facts(), false, false, "not the leader: starting"),
        ];
        for (facts, ready, leads, words) in cases {
            let r = readiness(&facts);
            let l = leadership(&facts);
            assert_eq!(r.is_ok(), ready, "{facts:?}: {r:?}");
            assert_eq!(l.is_ok(), leads, "{facts:?}: {l:?}");
            let said = if ready { r.unwrap() } else { r.unwrap_err() };
            assert!(said.contains(words), "{facts:?}: {said}");
        }
    }
}
