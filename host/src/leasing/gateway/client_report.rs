//! A client's own report, sent to the gateway itself: for what the gateway cannot read (the
//! TLS inside a CONNECT tunnel), a client that saw a block tells the gateway, as a lease
//! holder would report through the lease API:
//!
//! ```text
//! curl -x http://session-abc:$TOKEN@gateway:8080 -X POST \
//!   'http://gateway.proxy-operator.invalid/report?outcome=blocked&target=shop.example'
//! ```
//!
//! The host is under `.invalid` (RFC 2606: never a real name), so no site's URL is taken; the
//! report lands on the upstream the client's session is on (the username's `session-<id>`).

use url::Url;

use super::Report;

/// The gateway's own host name for client requests.
pub const GATEWAY_HOST: &str = "gateway.proxy-operator.invalid";

/// A report a client sent: what it saw, for which site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientReport {
    pub report: Report,
    pub target: String,
}

/// Why a request to [`GATEWAY_HOST`] is refused: its status and the reason.
pub type Refused = (u16, String);

/// Reads `POST http://gateway.proxy-operator.invalid/report?outcome=…&target=…`.
pub fn parse(method: &str, url: &Url) -> Result<ClientReport, Refused> {
    let usage = format!(
        "POST http://{GATEWAY_HOST}/report?outcome=blocked|failure&target=<host>, with the session's proxy username"
    );
    if url.path() != "/report" {
        return Err((404, format!("nothing at {}: {usage}", url.path())));
    }
    if method != "POST" {
        return Err((405, format!("{method}: a report is a POST: {usage}")));
    }
    let (mut outcome, mut target) = (None, None);
    for (name, value) in url.query_pairs() {
        match &*name {
            "outcome" => outcome = Some(value.into_owned()),
            "target" => target = Some(value.into_owned()),
            other => return Err((400, format!("unknown parameter `{other}`: {usage}"))),
        }
    }
    let report = match outcome.as_deref() {
        Some("blocked") => Report::Blocked,
        Some("failure") => Report::Failure,
        Some(other) => {
            return Err((400, format!("outcome `{other}`: one of blocked, failure")));
        }
        None => return Err((400, format!("outcome: missing: {usage}"))),
    };
    match target {
        Some(target) if !target.is_empty() => Ok(ClientReport { report, target }),
        _ => Err((400, format!("target: missing, the site's host: {usage}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_read_and_anything_else_is_refused_with_the_usage() {
        let url = |s: &str| Url::parse(&format!("http://{GATEWAY_HOST}{s}")).unwrap();
        assert_eq!(
            parse("POST", &url("/report?outcome=blocked&target=shop.example")),
            Ok(ClientReport {
                report: Report::Blocked,
                target: "shop.example".into()
            })
        );
        assert_eq!(
            parse("POST", &url("/report?target=a.example&outcome=failure"))
                .unwrap()
                .report,
            Report::Failure
        );
        let refusals = [
            ("GET", "/report?outcome=blocked&target=a.example", 405),
            ("POST", "/other", 404),
            ("POST", "/report?outcome=ok&target=a.example", 400),
            ("POST", "/report?target=a.example", 400),
            ("POST", "/report?outcome=blocked", 400),
            ("POST", "/report?outcome=blocked&target=", 400),
            ("POST", "/report?outcome=blocked&target=a&proxy=x", 400),
        ];
        for (method, path, status) in refusals {
            let (got, reason) = parse(method, &url(path)).unwrap_err();
            assert_eq!(got, status, "{method} {path}: {reason}");
            assert!(!reason.is_empty());
        }
    }
}
