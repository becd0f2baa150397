//! [`Routes`] as the operator runs them: every route is the leader's choice, asked through the
//! discovery API's gateway door (`/v1/gateway/…`, leases/api/gateway.rs), so every gateway
//! replica agrees on sessions, cooldowns and load without talking to the others, and the
//! client's token is checked and authorized by the same code as a lease grant.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde::Deserialize;

use super::{
    Destination, Report, Route, RouteError, RouteRequest, Routes, SessionReport, UpstreamLogin,
};
use crate::leasing::leases::api::GATEWAY_TOKEN_HEADER;

/// Deadline of one call to the leader; a route past it is the client's 503.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The leader's discovery API, as the gateway calls it.
pub struct LeaderRoutes {
    http: reqwest::Client,
    base: reqwest::Url,
    gateway_token: String,
    replica: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RouteAnswer {
    proxy: RoutedProxy,
    /// The proxy's ProxyPool, `namespace/name`.
    #[serde(default)]
    pool: Option<String>,
    login: Option<Login>,
    /// How to speak to the proxy (absent from a leader before SOCKS5 upstreams: HTTP).
    #[serde(default)]
    protocol: crate::support::socks::ProxyProtocol,
    #[serde(default)]
    block_statuses: Vec<u16>,
    #[serde(default)]
    block_body_patterns: Vec<String>,
}

#[derive(Deserialize)]
struct RoutedProxy {
    namespace: String,
    name: String,
    address: String,
    port: u16,
}

#[derive(Deserialize)]
struct Login {
    username: String,
    password: String,
}

/// The parts of a problem document the gateway acts on.
#[derive(Deserialize, Default)]
struct Problem {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    detail: String,
}

impl Problem {
    /// The last part of the stable `type` URI (`urn:proxy-operator:problem:no-proxy-available`).
    fn kind(&self) -> &str {
        self.kind.rsplit(':').next().unwrap_or_default()
    }
}

/// What the discovery API's certificate is checked against.
pub enum LeaderTrust {
    /// Only these CA certificates (`--discovery-ca-file`).
    Ca(Vec<reqwest::Certificate>),
    /// The system's roots (a publicly trusted certificate).
    SystemRoots,
    /// No TLS (`--discovery-plain-http`).
    PlainHttp,
}

impl LeaderRoutes {
    /// `base`: the discovery API (its Service), e.g. `http://proxy-operator-discovery:8090`.
    pub fn new(
        base: &str,
        gateway_token: &str,
        replica: &str,
        trust: LeaderTrust,
    ) -> anyhow::Result<Self> {
        let base = reqwest::Url::parse(base)
            .map_err(|e| anyhow::anyhow!("--discovery-url `{base}`: {e}"))?;
        anyhow::ensure!(
            matches!(base.scheme(), "http" | "https") && base.host().is_some(),
            "--discovery-url `{base}` must be an http(s) URL with a host (the discovery Service)"
        );
        anyhow::ensure!(
            !gateway_token.trim().is_empty(),
            "the gateway token is empty; set GATEWAY_TOKEN from the Secret the operator reads too"
        );
        let builder = match trust {
            LeaderTrust::Ca(certs) => reqwest::Client::builder().tls_certs_only(certs),
            LeaderTrust::SystemRoots | LeaderTrust::PlainHttp => reqwest::Client::builder(),
        };
        let http = builder
            .timeout(CALL_TIMEOUT)
            // Routes are many and small: keep connections to the leader warm.
            .pool_idle_timeout(Duration::from_secs(90))
            .build()?;
        Ok(LeaderRoutes {
            http,
            base,
            gateway_token: gateway_token.trim().to_string(),
            replica: replica.to_string(),
        })
    }

    fn url(&self, path: &str) -> reqwest::Url {
        self.base.join(path).expect("a fixed relative path joins")
    }

    /// POSTs `body` to the leader on behalf of a client: the gateway's token and the client's.
    async fn post_for_client(
        &self,
        path: &str,
        client_token: &str,
        body: &serde_json::Value,
    ) -> Result<reqwest::Response, RouteError> {
        self.http
            .post(self.url(path))
            .bearer_auth(client_token)
            .header(GATEWAY_TOKEN_HEADER, &self.gateway_token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| RouteError::Unavailable(format!("the leader did not answer: {e}")))
    }

    /// Tells the leader this replica's open upstream connections per proxy, and the bytes it
    /// carried per pool since its last report that the leader took: (sent, received).
    pub async fn push_load(
        &self,
        connections: &[(String, u32)],
        bytes: &BTreeMap<String, (u64, u64)>,
    ) -> anyhow::Result<()> {
        let bytes: BTreeMap<&String, serde_json::Value> = bytes
            .iter()
            .map(|(pool, (sent, received))| {
                (
                    pool,
                    serde_json::json!({"sent": sent, "received": received}),
                )
            })
            .collect();
        let body = serde_json::json!({
            "connections": connections.iter().cloned().collect::<BTreeMap<_, _>>(),
            "bytes": bytes,
        });
        let mut url = self.url("v1/gateway/replicas/");
        url.path_segments_mut()
            .map_err(|_| anyhow::anyhow!("the discovery URL cannot have a path"))?
            .pop_if_empty()
            .push(&self.replica);
        let response = self
            .http
            .put(url)
            .header(GATEWAY_TOKEN_HEADER, &self.gateway_token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await?;
        if !response.status().is_success() {
            let status = response.status();
            let problem = problem_of(response).await;
            anyhow::bail!("{status}: {}", problem.detail);
        }
        Ok(())
    }
}

/// A 200's JSON body (reqwest's `json` feature is not built: serde_json over the bytes does the
/// same); one that does not read is the leader being unavailable.
async fn answer_of<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
    what: &str,
) -> Result<T, RouteError> {
    response
        .bytes()
        .await
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| RouteError::Unavailable(format!("{what}: {e}")))
}

/// The problem document of a refusal (empty when it is none).
async fn problem_of(response: reqwest::Response) -> Problem {
    match response.bytes().await {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
        Err(_) => Problem::default(),
    }
}

/// The client's error for a refused route.
fn refusal(status: StatusCode, retry_after: Option<Duration>, problem: Problem) -> RouteError {
    match (status, problem.kind()) {
        (StatusCode::UNAUTHORIZED, _) => RouteError::Unauthenticated,
        // The leader refused the gateway itself: the operator's side is misconfigured, not the
        // client's request.
        (StatusCode::FORBIDDEN, "not-the-gateway")
        | (StatusCode::NOT_FOUND, "gateway-disabled") => RouteError::Unavailable(format!(
            "the leader refused the gateway: {}",
            problem.detail
        )),
        (StatusCode::FORBIDDEN, _) => RouteError::Forbidden(problem.detail),
        (StatusCode::SERVICE_UNAVAILABLE, "no-proxy-available") => RouteError::NoProxy {
            retry_after: retry_after.unwrap_or(Duration::from_secs(5)),
        },
        (StatusCode::TOO_MANY_REQUESTS, "quota-exceeded") => {
            RouteError::QuotaExceeded(problem.detail)
        }
        (StatusCode::BAD_REQUEST | StatusCode::NOT_FOUND | StatusCode::UNPROCESSABLE_ENTITY, _) => {
            RouteError::Invalid(problem.detail)
        }
        (status, kind) => RouteError::Unavailable(format!("{status} {kind}: {}", problem.detail)),
    }
}

impl Routes for LeaderRoutes {
    async fn route(&self, request: &RouteRequest) -> Result<Route, RouteError> {
        let routing = &request.routing;
        let body = serde_json::json!({
            "replica": self.replica,
            "pool": routing.pool.as_ref().map(|(ns, name)| format!("{ns}/{name}")),
            "provider": routing.provider,
            "zone": routing.zone,
            "session": routing.session,
            "target": request.destination.host,
            "avoid": request.avoid,
        });
        let response = self
            .post_for_client("v1/gateway/routes", &request.token, &body)
            .await?;
        let status = response.status();
        if status != StatusCode::OK {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .map(Duration::from_secs);
            let problem = problem_of(response).await;
            return Err(refusal(status, retry_after, problem));
        }
        let answer: RouteAnswer = answer_of(response, "the leader's route").await?;
        Ok(Route {
            proxy: format!("{}/{}", answer.proxy.namespace, answer.proxy.name),
            pool: answer.pool,
            address: answer.proxy.address,
            port: answer.proxy.port,
            login: answer.login.map(|l| UpstreamLogin {
                username: l.username,
                password: l.password,
            }),
            protocol: answer.protocol,
            block_statuses: answer.block_statuses,
            block_body_patterns: answer.block_body_patterns,
        })
    }

    async fn report(&self, route: &Route, destination: &Destination, report: Report) {
        let outcome = report.as_str();
        let body = serde_json::json!({
            "proxy": route.proxy,
            "outcome": outcome,
            "target": destination.host,
        });
        let sent = self
            .http
            .post(self.url("v1/gateway/reports"))
            .header(GATEWAY_TOKEN_HEADER, &self.gateway_token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await;
        match sent {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => tracing::warn!(
                proxy = %route.proxy,
                outcome,
                status = %r.status(),
                "the leader refused a gateway report"
            ),
            Err(e) => {
                tracing::warn!(proxy = %route.proxy, outcome, "gateway report not delivered: {e}")
            }
        }
    }

    async fn report_session(&self, report: &SessionReport) -> Result<String, RouteError> {
        let body = serde_json::json!({
            "session": report.routing.session,
            "outcome": report.report.as_str(),
            "target": report.target,
        });
        let response = self
            .post_for_client("v1/gateway/session-reports", &report.token, &body)
            .await?;
        let status = response.status();
        if status != StatusCode::OK {
            return Err(refusal(status, None, problem_of(response).await));
        }
        #[derive(Deserialize)]
        struct Landed {
            proxy: String,
        }
        let landed: Landed = answer_of(response, "the leader's answer").await?;
        Ok(landed.proxy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader's problem becomes the client's refusal: a namespace at its ProxyQuota is the
    /// client's 429 with the quota's words, not the fleet being unavailable.
    #[test]
    fn a_quota_refusal_reaches_the_client_with_its_words() {
        let problem = |kind: &str, detail: &str| Problem {
            kind: format!("urn:proxy-operator:problem:{kind}"),
            detail: detail.into(),
        };
        let words = "ProxyQuota team-a/q1: gatewayConnections 2/2 in use";
        assert_eq!(
            refusal(
                StatusCode::TOO_MANY_REQUESTS,
                None,
                problem("quota-exceeded", words)
            ),
            RouteError::QuotaExceeded(words.into())
        );
        assert!(matches!(
            refusal(
                StatusCode::TOO_MANY_REQUESTS,
                None,
                problem("too-many-gateway-replicas", "x")
            ),
            RouteError::Unavailable(_)
        ));
    }
}
