//! `kubectl px lease`, `release` and `report`: the discovery API (docs/discovery-api.md) from a
//! shell. The bodies are the server's own wire types; its answers are shown as people read
//! them, or as they came (`-o json`). The requests are the only I/O here.

use std::time::Duration;

use serde_json::Value;

use super::exit::{Exit, Failure};
use super::table::{bold, relative};
use crate::leasing::leases::Outcome;
use crate::leasing::leases::api::{GrantBody, ReportBody};

/// Where a token came from, for the message when it is refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub value: String,
    pub from: String,
}

/// An answer of the discovery API: status, JSON body (`Null` when none), `Retry-After`.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub retry_after: Option<u64>,
}

/// `NAME` in `namespace`, or `NAMESPACE/NAME` as given.
pub fn qualified(name: &str, namespace: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    }
}

/// What `lease` asks for, as the server reads it. `selector`: `key=value` items.
#[allow(clippy::too_many_arguments)]
pub fn grant_body(
    namespace: &str,
    pool: Option<&str>,
    proxy: Option<&str>,
    session: Option<String>,
    target: Option<String>,
    provider: Option<String>,
    zone: Option<String>,
    selector: &[String],
    ttl: Option<Duration>,
) -> Result<GrantBody, Failure> {
    let mut labels = std::collections::BTreeMap::new();
    for item in selector {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| Failure::usage(format!("--selector `{item}`: write it as key=value")))?;
        labels.insert(key.trim().to_string(), value.trim().to_string());
    }
    Ok(GrantBody {
        provider,
        zone,
        selector: (!labels.is_empty()).then_some(labels),
        proxy: proxy.map(|p| qualified(p, namespace)),
        pool: pool.map(|p| qualified(p, namespace)),
        session,
        target,
        ttl_seconds: ttl.map(|t| t.as_secs().max(1)),
    })
}

pub fn report_body(outcome: Outcome, target: Option<String>) -> ReportBody {
    ReportBody {
        outcome: Some(outcome),
        target,
    }
}

/// A problem document as a failure: its type and detail, and exit 4 when the server asks to
/// try again (`Retry-After`), else 1. `token_from`: said with a 401.
pub fn problem(answer: &Answer, token_from: &str) -> Failure {
    let kind = answer
        .body
        .get("type")
        .and_then(Value::as_str)
        .map(|t| t.trim_start_matches("urn:proxy-operator:problem:"))
        .unwrap_or("error");
    let detail = answer
        .body
        .get("detail")
        .and_then(Value::as_str)
        .or_else(|| answer.body.get("title").and_then(Value::as_str))
        .unwrap_or("no detail");
    let mut message = format!(
        "the discovery API answered {} {kind}: {detail}",
        answer.status
    );
    if answer.status == 401 {
        message.push_str(&format!(
            " (the token was {token_from}; pass --token or --token-file, or set DISCOVERY_TOKEN)"
        ));
    }
    match answer.retry_after {
        Some(seconds) => {
            message.push_str(&format!("; try again in {seconds} s"));
            Failure {
                exit: Exit::RetryLater,
                message,
            }
        }
        None => Failure::error(message),
    }
}

/// `proxyUrl` with its password masked: what a terminal (and its scrollback) may show.
pub fn masked(proxy_url: &str) -> String {
    match url::Url::parse(proxy_url) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("xxxxx"));
            url.to_string().trim_end_matches('/').to_string()
        }
        _ => proxy_url.to_string(),
    }
}

fn text<'a>(value: &'a Value, field: &str) -> &'a str {
    value.get(field).and_then(Value::as_str).unwrap_or("-")
}

fn line(out: &mut String, label: &str, value: &str, colour: bool) {
    out.push_str(&format!(
        "{}{}{value}\n",
        bold(&format!("{label}:"), colour),
        " ".repeat(12usize.saturating_sub(label.len() + 1))
    ));
}

/// A lease (the answer to a grant) for people: the proxy URL without its password.
pub fn render_lease(status: u16, lease: &Value, now_ms: u64, colour: bool) -> String {
    let proxy = &lease["proxy"];
    let mut out = String::new();
    out.push_str(if status == 200 {
        "The session's lease (it already held one on this proxy):\n"
    } else {
        "Leased:\n"
    });
    line(&mut out, "Lease", text(lease, "id"), colour);
    let mut about = format!("provider {}", text(proxy, "provider"));
    if let Some(zone) = proxy.get("zone").and_then(Value::as_str) {
        about.push_str(&format!(", zone {zone}"));
    }
    if let Some(pool) = lease.get("pool").and_then(Value::as_str) {
        about.push_str(&format!(", pool {pool}"));
    }
    line(
        &mut out,
        "Proxy",
        &format!(
            "{}/{} ({about})",
            text(proxy, "namespace"),
            text(proxy, "name")
        ),
        colour,
    );
    line(
        &mut out,
        "Proxy URL",
        &format!(
            "{} (with its password: -o json)",
            masked(text(lease, "proxyUrl"))
        ),
        colour,
    );
    line(&mut out, "Exit IP", text(proxy, "exitIP"), colour);
    if let Some(session) = lease.get("session").and_then(Value::as_str) {
        line(&mut out, "Session", session, colour);
    }
    let expires = text(lease, "expiresAt");
    let when = expires
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| format!(" ({})", relative(t.as_millisecond().max(0) as u64, now_ms)))
        .unwrap_or_default();
    line(&mut out, "Expires", &format!("{expires}{when}"), colour);
    out
}

/// The answer to a report, in words.
pub fn render_report(id: &str, outcome: Outcome, target: Option<&str>, answer: &Value) -> String {
    match outcome {
        Outcome::Blocked => match target {
            Some(host) => format!(
                "Reported lease {id} blocked by {host}: the lease ended; the proxy cools down for {host} only.\n"
            ),
            None => format!(
                "Reported lease {id} blocked: the lease ended; the proxy cools down for every target.\n"
            ),
        },
        other => format!(
            "Reported {} on lease {id}; the lease stays active until {}.\n",
            match other {
                Outcome::Success => "success",
                _ => "failure",
            },
            text(answer, "expiresAt")
        ),
    }
}

/// The discovery API at `url`, with the tokens to try in order: the next one is tried only
/// after a `401` (nothing was done with a refused token).
pub struct Discovery {
    url: String,
    http: reqwest::Client,
}

impl Discovery {
    /// `ca`: trust only the CA certificates in this file (`--discovery-ca-file`).
    pub fn new(url: &str, ca: Option<&std::path::Path>) -> Result<Self, Failure> {
        let parsed = url::Url::parse(url).map_err(|e| {
            Failure::usage(format!(
                "--discovery-url `{url}`: {e} (e.g. https://localhost:8090)"
            ))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Failure::usage(format!(
                "--discovery-url `{url}`: use http:// or https://"
            )));
        }
        let mut builder = reqwest::Client::builder();
        if let Some(ca) = ca {
            let certs = crate::support::tls::ca_certificates(ca, "--discovery-ca-file")
                .map_err(|e| Failure::usage(format!("{e:#}")))?;
            builder = builder.tls_certs_only(certs);
        }
        let http = builder
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Failure::error(format!("an HTTP client: {e}")))?;
        Ok(Discovery {
            url: url.trim_end_matches('/').to_string(),
            http,
        })
    }

    /// One request with `token`.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        token: &str,
    ) -> Result<Answer, Failure> {
        let url = format!("{}{path}", self.url);
        let mut request = self.http.request(method.clone(), &url).bearer_auth(token);
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::error(format!("{method} {url}: {e}")))?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Failure::error(format!("{method} {url}: reading the answer: {e}")))?;
        Ok(Answer {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            retry_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_grant_names_pools_and_proxies_in_the_namespace_and_leaves_out_the_rest() {
        let body = grant_body(
            "crawl",
            Some("egress"),
            Some("other/px-1"),
            Some("jar-1".into()),
            Some("shop.example".into()),
            None,
            None,
            &["tier=cheap".into(), " zone = a ".into()],
            Some(Duration::from_secs(600)),
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({"pool": "crawl/egress", "proxy": "other/px-1", "session": "jar-1",
                   "target": "shop.example", "selector": {"tier": "cheap", "zone": "a"},
                   "ttlSeconds": 600})
        );
        let empty = grant_body("crawl", None, None, None, None, None, None, &[], None).unwrap();
        assert_eq!(serde_json::to_string(&empty).unwrap(), "{}");
        let bad = grant_body(
            "crawl",
            None,
            None,
            None,
            None,
            None,
            None,
            &["tier".into()],
            None,
        )
        .unwrap_err();
        assert_eq!(bad.exit, Exit::Usage);
        assert_eq!(
            serde_json::to_value(report_body(Outcome::Blocked, Some("a.example".into()))).unwrap(),
            json!({"outcome": "blocked", "target": "a.example"})
        );
    }

    /// The body the server reads is the body the client wrote: the same type both ways.
    #[test]
    fn what_the_client_writes_the_server_reads() {
        let body = grant_body("c", Some("p"), None, None, None, None, None, &[], None).unwrap();
        let text = serde_json::to_string(&body).unwrap();
        let read: GrantBody = serde_json::from_str(&text).unwrap();
        assert_eq!(read, body);
    }

    #[test]
    fn problems_say_their_type_and_whether_to_try_again() {
        let busy = Answer {
            status: 503,
            body: json!({"type": "urn:proxy-operator:problem:no-proxy-available",
                         "title": "No proxy available", "detail": "every matching proxy is leased"}),
            retry_after: Some(5),
        };
        let failure = problem(&busy, "from the flag");
        assert_eq!(failure.exit, Exit::RetryLater);
        assert_eq!(
            failure.message,
            "the discovery API answered 503 no-proxy-available: every matching proxy is leased; try again in 5 s"
        );
        let refused = Answer {
            status: 401,
            body: json!({"type": "urn:proxy-operator:problem:unauthorized", "detail": "wrong"}),
            retry_after: None,
        };
        let failure = problem(&refused, "the kubeconfig user's");
        assert_eq!(failure.exit, Exit::Error);
        assert!(
            failure
                .message
                .contains("the token was the kubeconfig user's"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn a_lease_shows_its_url_without_the_password() {
        assert_eq!(
            masked("http://egress-a:S3cr3t%2F@10.0.0.7:3128"),
            "http://egress-a:xxxxx@10.0.0.7:3128"
        );
        assert_eq!(masked("http://10.0.0.7:3128"), "http://10.0.0.7:3128");
        let lease = json!({
            "id": "3f9c2d7e1a6b4c08d5e2f1a09b7c6d34",
            "proxy": {"namespace": "crawl", "name": "egress-a", "provider": "store",
                      "zone": "zone-a", "address": "10.0.0.7", "port": 3128, "exitIP": "198.51.100.23"},
            "proxyUrl": "http://egress-a:S3cr3t@10.0.0.7:3128",
            "grantedAt": "2027-01-15T08:00:00Z",
            "expiresAt": "2027-01-15T08:10:00Z",
            "ttlSeconds": 600,
            "pool": "crawl/egress",
        });
        let now = "2027-01-15T08:00:00Z"
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap()
            .as_millisecond() as u64;
        let text = render_lease(201, &lease, now, false);
        assert_eq!(
            text,
            "Leased:
Lease:      3f9c2d7e1a6b4c08d5e2f1a09b7c6d34
Proxy:      crawl/egress-a (provider store, zone zone-a, pool crawl/egress)
Proxy URL:  http://egress-a:xxxxx@10.0.0.7:3128 (with its password: -o json)
Exit IP:    198.51.100.23
Expires:    2027-01-15T08:10:00Z (in 10m)
"
        );
        assert!(!text.contains("S3cr3t"));
    }
}
